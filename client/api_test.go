package client

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// TestCreateLedgerRefusesBadOptions: options the metadata would reject fail with
// ErrBadArgument before a ledger id is taken.
func TestCreateLedgerRefusesBadOptions(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	for name, o := range map[string]CreateOptions{
		"quorums":             {EnsembleSize: 2, WriteQuorum: 3, AckQuorum: 2},
		"unknown digest":      {EnsembleSize: 3, WriteQuorum: 2, AckQuorum: 2, Digest: DigestType(9)},
		"password too long":   {EnsembleSize: 3, WriteQuorum: 2, AckQuorum: 2, Password: make([]byte, 2000)},
		"custom key too long": {EnsembleSize: 3, WriteQuorum: 2, AckQuorum: 2, Custom: map[string][]byte{strings.Repeat("k", 2000): nil}},
	} {
		if _, err := cl.CreateLedger(ctx, o); !errors.Is(err, ErrBadArgument) {
			t.Errorf("%s: %v, want ErrBadArgument", name, err)
		}
	}
	n := 0
	if err := cl.ListLedgers(ctx, func(int64) bool { n++; return true }); err != nil || n != 0 {
		t.Fatalf("%d ledgers (%v) after refused creates", n, err)
	}
}

// TestCreateLedgerRefusesOversizeCustomMetadata: custom metadata whose value or whole
// encoding is over the metadata's size limit (metadata.MaxEncodedSize) fails with
// ErrBadArgument, as the other options the metadata would reject do, and takes no ledger id.
func TestCreateLedgerRefusesOversizeCustomMetadata(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	first := createLedger(t, cl, 3, 2, 2)
	for name, custom := range map[string]map[string][]byte{
		"value over the limit":           {"a": make([]byte, metadata.MaxEncodedSize+1)},
		"values together over the limit": {"a": make([]byte, metadata.MaxEncodedSize/2), "b": make([]byte, metadata.MaxEncodedSize/2)},
	} {
		o := CreateOptions{EnsembleSize: 3, WriteQuorum: 2, AckQuorum: 2, Password: password, Custom: custom}
		if _, err := cl.CreateLedger(ctx, o); !errors.Is(err, ErrBadArgument) {
			t.Errorf("%s: %v, want ErrBadArgument", name, err)
		}
	}
	if next := createLedger(t, cl, 3, 2, 2); next.ID() != first.ID()+1 {
		t.Fatalf("ledger %d after ledger %d: the refused creates took ids", next.ID(), first.ID())
	}
}

// TestCreateLedgerCopiesCustomMetadata: changing the caller's map afterwards changes neither
// the handle's metadata nor what a later metadata update would write.
func TestCreateLedgerCopiesCustomMetadata(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c, nil)
	custom := map[string][]byte{"app": []byte("v1")}
	lh, err := cl.CreateLedger(context.Background(), CreateOptions{EnsembleSize: 3, WriteQuorum: 2, AckQuorum: 2, Password: password, Custom: custom})
	if err != nil {
		t.Fatal(err)
	}
	custom["app"][1] = '2'
	custom["other"] = []byte("x")
	if got := lh.Metadata().CustomMetadata; !bytes.Equal(got["app"], []byte("v1")) || got["other"] != nil {
		t.Fatalf("the handle's custom metadata follows the caller's map: %q", got)
	}
}

// TestErrorsMatchTheClientsSentinels: a closed client, a negative or unknown id and a deleted
// ledger give errors that errors.Is matches against the client's own sentinels.
func TestErrorsMatchTheClientsSentinels(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	cl := newClient(t, c, nil)
	for _, id := range []int64{-1, 1 << 40} {
		if _, err := cl.OpenLedger(ctx, id, password, false); !errors.Is(err, ErrNoSuchLedger) {
			t.Errorf("OpenLedger(%d): %v", id, err)
		}
		if err := cl.DeleteLedger(ctx, id); !errors.Is(err, ErrNoSuchLedger) {
			t.Errorf("DeleteLedger(%d): %v", id, err)
		}
		if _, err := cl.LedgerMetadata(ctx, id); !errors.Is(err, ErrNoSuchLedger) {
			t.Errorf("LedgerMetadata(%d): %v", id, err)
		}
		if _, err := cl.ReopenLedgerForWrite(ctx, id, password); !errors.Is(err, ErrNoSuchLedger) {
			t.Errorf("ReopenLedgerForWrite(%d): %v", id, err)
		}
	}
	// Deleted under its writer (allowed, as in BookKeeper): the writer's Close says so.
	lh := createLedger(t, cl, 3, 2, 2)
	appendN(t, lh, 3)
	if err := cl.DeleteLedger(ctx, lh.ID()); err != nil {
		t.Fatal(err)
	}
	if err := lh.Close(ctx); !errors.Is(err, ErrNoSuchLedger) {
		t.Errorf("Close of a deleted ledger: %v, want ErrNoSuchLedger", err)
	}
	other := createLedger(t, cl, 3, 2, 2)
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cl.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 2, AckQuorum: 2}); !errors.Is(err, ErrClosed) {
		t.Errorf("CreateLedger after Close: %v, want ErrClosed", err)
	}
	if _, err := cl.OpenLedger(ctx, other.ID(), password, false); !errors.Is(err, ErrClosed) {
		t.Errorf("OpenLedger after Close: %v, want ErrClosed", err)
	}
	if err := cl.DeleteLedger(ctx, other.ID()); !errors.Is(err, ErrClosed) {
		t.Errorf("DeleteLedger after Close: %v, want ErrClosed", err)
	}
}

// TestReopenForWrite: the password is checked before anything about the ledger is told, and a
// ledger whose last fragment is still empty (the writer changed the ensemble, then stopped)
// continues after the entries of the fragments before it.
func TestReopenForWrite(t *testing.T) {
	c := clustertest.Start(t, 4)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	closed := createLedger(t, cl, 3, 2, 2)
	if err := closed.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ReopenLedgerForWrite(ctx, closed.ID(), []byte("wrong")); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("wrong password on a closed ledger: %v, want ErrUnauthorized", err)
	}
	lh := createLedger(t, cl, 2, 2, 2)
	appendN(t, lh, 5)
	first := lh.Metadata().Ensembles[0].Bookies
	var others []string
	for _, b := range c.BookieAddrs() {
		if !containsStr(first, b) {
			others = append(others, b)
		}
	}
	if _, _, err := metadata.UpdateLedger(ctx, cl.md.Ledgers(), lh.ID(), func(m *metadata.LedgerMetadata) error {
		m.Ensembles = append(m.Ensembles, metadata.Ensemble{FirstEntryID: 5, Bookies: others[:2]})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	w, err := cl.ReopenLedgerForWrite(ctx, lh.ID(), password)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := w.Append(ctx, []byte("next")); err != nil || id != 5 {
		t.Fatalf("the reopened writer appended entry %d (%v); entries 0..4 exist (want 5)", id, err)
	}
}

// TestListLedgersPages: every id once, in order, across pages, and an early stop.
func TestListLedgersPages(t *testing.T) {
	c := clustertest.Start(t, 1)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	md := &metadata.LedgerMetadata{EnsembleSize: 1, WriteQuorumSize: 1, AckQuorumSize: 1, State: metadata.StateOpen,
		LastEntryID: metadata.NoEntry, DigestType: metadata.DigestCRC32C,
		Ensembles: []metadata.Ensemble{{FirstEntryID: 0, Bookies: []string{"127.0.0.1:1"}}}}
	var want []int64
	for i := range int64(2100) {
		id := i*3 + 1 // with gaps
		if _, err := cl.md.Ledgers().Create(ctx, id, md); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	var got []int64
	if err := cl.ListLedgers(ctx, func(id int64) bool { got = append(got, id); return true }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d ids, want %d in order", len(got), len(want))
	}
	got = got[:0]
	if err := cl.ListLedgers(ctx, func(id int64) bool { got = append(got, id); return len(got) < 1500 }); err != nil || len(got) != 1500 {
		t.Fatalf("stopped after %d ids (%v), want 1500", len(got), err)
	}
}

// TestCloseWaitsForAnEnsembleChange: Client.Close returns only once an ensemble change that
// was running has ended, so no goroutine of the client outlives it.
func TestCloseWaitsForAnEnsembleChange(t *testing.T) {
	c := clustertest.Start(t, 4)
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	gated := gatePlacement(cl)
	lh := createLedger(t, cl, 3, 3, 2)
	third := faultConnOf(t, cl, &conns, lh.Metadata().Ensembles[0].Bookies[2])
	holdAdds(third)
	result := make(chan error, 1)
	lh.AppendAsync(payload(lh.ID(), 0), func(_ int64, err error) { result <- err })
	third.failAdds()
	select {
	case <-gated.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no ensemble change")
	}
	if err := returnsAfterTheGate(t, gated, 100*time.Millisecond, "Client.Close", cl.Close); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "changeEnsemble") {
		t.Fatalf("an ensemble change outlived Client.Close:\n%s", stacks)
	}
	if err := <-result; !errors.Is(err, ErrClosed) && err != nil {
		t.Fatalf("the add during the change: %v", err)
	}
}

// TestOversizeEntryIsRefusedLocally: an entry over the frame limit fails at once with
// ErrEntryTooLarge, before anything is sent (BookKeeper #2357: it looked like a bookie failure
// and changed the ensemble): no entry id is taken, the metadata is unchanged, and the handle
// goes on with the largest entry that fits.
func TestOversizeEntryIsRefusedLocally(t *testing.T) {
	c := clustertest.Start(t, 4)
	ctx := context.Background()
	cfg := DefaultConfig(c.MetadataURI())
	cfg.Transport.MaxFrameSize = 64 << 10
	cl, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	waitWritable(t, cl, 4)
	lh := createLedger(t, cl, 3, 3, 2)
	appendN(t, lh, 2)
	before, _, err := cl.md.Ledgers().Read(ctx, lh.ID())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lh.Append(ctx, make([]byte, lh.MaxEntrySize()+1)); !errors.Is(err, ErrEntryTooLarge) {
		t.Fatalf("append over the frame limit: %v, want ErrEntryTooLarge", err)
	}
	if id, err := lh.Append(ctx, make([]byte, lh.MaxEntrySize())); err != nil || id != 2 {
		t.Fatalf("append of the largest entry after a refused one: id %d, %v; want 2", id, err)
	}
	after, _, err := cl.md.Ledgers().Read(ctx, lh.ID())
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Ensembles) != 1 || !sameEnsemble(after.Ensembles[0], before.Ensembles[0]) {
		t.Fatalf("ensembles changed by an oversize entry: %+v, were %+v", after.Ensembles, before.Ensembles)
	}
}
