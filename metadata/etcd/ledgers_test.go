package etcd_test

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/etcd"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

func TestLedgerCRUD(t *testing.T) {
	t.Parallel()
	d := open(t, metadatatest.URI(t))
	ls := d.Ledgers()
	ctx := ctxFor(t, 20*time.Second)
	md := metadatatest.Ledger()

	if _, _, err := ls.Read(ctx, 7); !errors.Is(err, metadata.ErrNoSuchLedger) {
		t.Fatalf("read missing: %v", err)
	}
	v1, err := ls.Create(ctx, 7, md)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls.Create(ctx, 7, md); !errors.Is(err, metadata.ErrLedgerExists) {
		t.Fatalf("create twice: %v", err)
	}
	got, v, err := ls.Read(ctx, 7)
	if err != nil || v != v1 || !got.Equal(md) {
		t.Fatalf("read: %v, version %d (created %d), equal %v", err, v, v1, got.Equal(md))
	}

	closed := md.Clone()
	closed.State, closed.LastEntryID, closed.Length = metadata.StateClosed, 99, 12345
	v2, err := ls.Update(ctx, 7, closed, v1)
	if err != nil || v2 == v1 {
		t.Fatalf("update: %v (version %d -> %d)", err, v1, v2)
	}
	// A stale version is refused, and the error carries what is stored.
	_, err = ls.Update(ctx, 7, md, v1)
	var bv *metadata.BadVersionError
	if !errors.Is(err, metadata.ErrBadVersion) || !errors.As(err, &bv) {
		t.Fatalf("stale update: %v", err)
	}
	if bv.Expected != v1 || bv.Current != v2 || !bv.Metadata.Equal(closed) {
		t.Fatalf("conflict carries %+v", bv)
	}
	if _, err := ls.Update(ctx, 8, md, v1); !errors.Is(err, metadata.ErrNoSuchLedger) {
		t.Fatalf("update missing: %v", err)
	}
	if _, err := ls.Update(ctx, 7, md, metadata.NoVersion); !errors.Is(err, metadata.ErrBadVersion) {
		t.Fatalf("update with NoVersion: %v", err)
	}
	bad := md.Clone()
	bad.AckQuorumSize = 9
	if _, err := ls.Update(ctx, 7, bad, v2); !errors.Is(err, metadata.ErrInvalidMetadata) {
		t.Fatalf("invalid update: %v", err)
	}
	if _, err := ls.Create(ctx, -1, md); !errors.Is(err, metadata.ErrInvalidLedgerID) {
		t.Fatalf("negative id: %v", err)
	}

	if err := ls.Delete(ctx, 7, v1); !errors.Is(err, metadata.ErrBadVersion) {
		t.Fatalf("delete stale: %v", err)
	}
	if err := ls.Delete(ctx, 7, v2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ls.Read(ctx, 7); !errors.Is(err, metadata.ErrNoSuchLedger) {
		t.Fatalf("read deleted: %v", err)
	}
	if err := ls.Delete(ctx, 7, metadata.AnyVersion); !errors.Is(err, metadata.ErrNoSuchLedger) {
		t.Fatalf("delete missing: %v", err)
	}
	if _, err := ls.Create(ctx, 8, md); err != nil {
		t.Fatal(err)
	}
	if err := ls.Delete(ctx, 8, metadata.AnyVersion); err != nil {
		t.Fatalf("delete any version: %v", err)
	}
}

// TestCASConflict: two writers read the same version; exactly one update
// wins, and the loser learns the winner's metadata.
func TestCASConflict(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	a, b := open(t, uri), open(t, uri)
	ctx := ctxFor(t, 20*time.Second)
	v0, err := a.Ledgers().Create(ctx, 1, metadatatest.Ledger())
	if err != nil {
		t.Fatal(err)
	}
	mdA, _, _ := a.Ledgers().Read(ctx, 1)
	mdB, _, _ := b.Ledgers().Read(ctx, 1)
	mdA.CustomMetadata = map[string][]byte{"writer": []byte("a")}
	mdB.CustomMetadata = map[string][]byte{"writer": []byte("b")}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, w := range []struct {
		d  metadata.Driver
		md *metadata.LedgerMetadata
	}{{a, mdA}, {b, mdB}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = w.d.Ledgers().Update(ctx, 1, w.md, v0)
		}()
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("want exactly one winner, got %v / %v", errs[0], errs[1])
	}
	winner, loserErr := "a", errs[1]
	if errs[0] != nil {
		winner, loserErr = "b", errs[0]
	}
	var bv *metadata.BadVersionError
	if !errors.As(loserErr, &bv) || string(bv.Metadata.CustomMetadata["writer"]) != winner {
		t.Fatalf("loser's error %v does not carry the winner's metadata", loserErr)
	}
}

// TestUpdateLedgerLoop: concurrent read-modify-write loops from several
// clients never lose an update.
func TestUpdateLedgerLoop(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 30*time.Second)
	drivers := []metadata.Driver{open(t, uri), open(t, uri), open(t, uri)}
	if _, err := drivers[0].Ledgers().Create(ctx, 5, metadatatest.Ledger()); err != nil {
		t.Fatal(err)
	}
	const perWorker, workers = 10, 6
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		d := drivers[w%len(drivers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				_, _, err := metadata.UpdateLedger(ctx, d.Ledgers(), 5, func(md *metadata.LedgerMetadata) error {
					if md.CustomMetadata == nil {
						md.CustomMetadata = map[string][]byte{}
					}
					n := uint64(0)
					if c := md.CustomMetadata["n"]; len(c) == 8 {
						n = binary.BigEndian.Uint64(c)
					}
					md.CustomMetadata["n"] = binary.BigEndian.AppendUint64(nil, n+1)
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	md, _, err := drivers[0].Ledgers().Read(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if n := binary.BigEndian.Uint64(md.CustomMetadata["n"]); n != perWorker*workers {
		t.Fatalf("counter %d, want %d", n, perWorker*workers)
	}
	// ErrUnchanged skips the write.
	_, v, _ := drivers[0].Ledgers().Read(ctx, 5)
	_, v2, err := metadata.UpdateLedger(ctx, drivers[0].Ledgers(), 5, func(*metadata.LedgerMetadata) error {
		return metadata.ErrUnchanged
	})
	if err != nil || v2 != v {
		t.Fatalf("unchanged: %v, version %d -> %d", err, v, v2)
	}
}

func TestCorruptStoredMetadata(t *testing.T) {
	t.Parallel()
	d := open(t, metadatatest.URI(t))
	ctx := ctxFor(t, 20*time.Second)
	if _, err := d.Ledgers().Create(ctx, 1, metadatatest.Ledger()); err != nil {
		t.Fatal(err)
	}
	if _, err := etcd.RawClient(d).Put(ctx, etcd.LedgerKey(d, 2), "RKLM\x00\x01garbage"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Ledgers().Read(ctx, 2); !errors.Is(err, metadata.ErrCorruptMetadata) {
		t.Fatalf("read: %v", err)
	}
	if _, _, err := d.Ledgers().Scan(ctx, 0, 10); !errors.Is(err, metadata.ErrCorruptMetadata) {
		t.Fatalf("scan: %v", err)
	}
	// Listing ids does not read values.
	if ids, _, err := d.Ledgers().List(ctx, 0, 10); err != nil || len(ids) != 2 {
		t.Fatalf("list: %v %v", ids, err)
	}
	// An update over corrupt bytes still reports the conflict.
	md := metadatatest.Ledger()
	if _, err := d.Ledgers().Update(ctx, 2, md, 1); !errors.Is(err, metadata.ErrBadVersion) || !errors.Is(err, metadata.ErrCorruptMetadata) {
		t.Fatalf("update: %v", err)
	}
}

func TestWatchLedger(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	w, d := open(t, uri), open(t, uri)
	ctx := ctxFor(t, 20*time.Second)
	md := metadatatest.Ledger()
	v, err := d.Ledgers().Create(ctx, 3, md)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Ledgers().Watch(ctx, 4); !errors.Is(err, metadata.ErrNoSuchLedger) {
		t.Fatalf("watch missing: %v", err)
	}
	ch, err := w.Ledgers().Watch(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	next := func() metadata.LedgerChange {
		t.Helper()
		select {
		case c, ok := <-ch:
			if !ok {
				t.Fatal("channel closed early")
			}
			return c
		case <-ctx.Done():
			t.Fatal("no change delivered")
		}
		return metadata.LedgerChange{}
	}
	if c := next(); c.Version != v || !c.Metadata.Equal(md) {
		t.Fatalf("initial state %+v", c)
	}
	closed := md.Clone()
	closed.State, closed.LastEntryID = metadata.StateClosed, 10
	v2, err := d.Ledgers().Update(ctx, 3, closed, v)
	if err != nil {
		t.Fatal(err)
	}
	if c := next(); c.Version != v2 || c.Metadata.State != metadata.StateClosed {
		t.Fatalf("after update %+v", c)
	}
	if err := d.Ledgers().Delete(ctx, 3, v2); err != nil {
		t.Fatal(err)
	}
	if c := next(); !c.Deleted {
		t.Fatalf("after delete %+v", c)
	}
	if _, ok := <-ch; ok {
		t.Fatal("channel not closed after delete")
	}

	// Cancelling the watch's context closes the channel.
	if _, err := d.Ledgers().Create(ctx, 5, md); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	ch, err = w.Ledgers().Watch(wctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	<-ch
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("value after cancel")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("channel not closed after cancel")
	}
}

// raceStore is a LedgerStore whose first Update first runs race, another
// writer's update that lands between UpdateLedger's read and its write.
type raceStore struct {
	metadata.LedgerStore
	race func()
}

func (s *raceStore) Update(ctx context.Context, id int64, md *metadata.LedgerMetadata, expected metadata.Version) (metadata.Version, error) {
	if race := s.race; race != nil {
		s.race = nil
		race()
	}
	return s.LedgerStore.Update(ctx, id, md, expected)
}

// TestUpdateLedgerRacingCloses: two recoverers close the same ledger at
// different ends, the second one's write racing the first. Exactly one close
// lands; the loser's mutate runs again on the winner's metadata (never its
// first result written over it), sees the ledger closed, and UpdateLedger
// hands it the winner's metadata and version, so that both agree on the end.
func TestUpdateLedgerRacingCloses(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	a, b := open(t, uri), open(t, uri)
	ctx := ctxFor(t, 20*time.Second)
	if _, err := a.Ledgers().Create(ctx, 9, metadatatest.Ledger()); err != nil {
		t.Fatal(err)
	}
	// closeAt is the recoverers' mutate: close at last, unless already closed.
	closeAt := func(last int64, seen *[]metadata.LedgerState) func(*metadata.LedgerMetadata) error {
		return func(m *metadata.LedgerMetadata) error {
			*seen = append(*seen, m.State)
			if m.State == metadata.StateClosed {
				return metadata.ErrUnchanged
			}
			m.State, m.LastEntryID, m.Length = metadata.StateClosed, last, 100*(last+1)
			return nil
		}
	}
	var seenA, seenB []metadata.LedgerState
	var mdB *metadata.LedgerMetadata
	var vB metadata.Version
	store := &raceStore{LedgerStore: a.Ledgers(), race: func() {
		var err error
		if mdB, vB, err = metadata.UpdateLedger(ctx, b.Ledgers(), 9, closeAt(7, &seenB)); err != nil {
			t.Error(err)
		}
	}}
	mdA, vA, err := metadata.UpdateLedger(ctx, store, 9, closeAt(5, &seenA))
	if err != nil {
		t.Fatal(err)
	}
	if mdB == nil || mdB.LastEntryID != 7 {
		t.Fatalf("the racing close did not land: %+v", mdB)
	}
	if mdA.State != metadata.StateClosed || mdA.LastEntryID != 7 || mdA.Length != 800 || vA != vB {
		t.Fatalf("the loser got last entry %d, length %d, version %d; the winner closed at 7, length 800, version %d",
			mdA.LastEntryID, mdA.Length, vA, vB)
	}
	want := []metadata.LedgerState{metadata.StateOpen, metadata.StateClosed}
	if !slices.Equal(seenA, want) {
		t.Fatalf("the loser's mutate saw states %v, want %v (once on its read, once on the winner's metadata)", seenA, want)
	}
	stored, v, err := a.Ledgers().Read(ctx, 9)
	if err != nil || v != vB || stored.LastEntryID != 7 || stored.Length != 800 {
		t.Fatalf("stored %+v at version %d (%v), want the winner's close at version %d", stored, v, err, vB)
	}
}

// TestListReportsForeignLedgerKeys: keys under the ledgers prefix that are not ledger keys do
// not hide the page's ledgers; List reports them, with the ids they name in another width.
func TestListReportsForeignLedgerKeys(t *testing.T) {
	t.Parallel()
	d := open(t, metadatatest.URI(t))
	ctx := ctxFor(t, 20*time.Second)
	for _, id := range []int64{1, 3} {
		if _, err := d.Ledgers().Create(ctx, id, metadatatest.Ledger()); err != nil {
			t.Fatal(err)
		}
	}
	prefix := strings.TrimSuffix(etcd.LedgerKey(d, 0), "0000000000000000000")
	for _, k := range []string{"2", "0000000000000000001x", "99999999999999999999"} {
		if _, err := etcd.RawClient(d).Put(ctx, prefix+k, "x"); err != nil {
			t.Fatal(err)
		}
	}
	ids, _, err := d.Ledgers().List(ctx, 0, 10)
	var foreign *metadata.ForeignLedgerKeysError
	if !errors.As(err, &foreign) || !errors.Is(err, metadata.ErrCorruptMetadata) {
		t.Fatalf("list: %v, want a ForeignLedgerKeysError", err)
	}
	if !slices.Equal(ids, []int64{1, 3}) || !slices.Equal(foreign.IDs, []int64{2}) ||
		!slices.Equal(foreign.Unnamed, []string{prefix + "0000000000000000001x"}) {
		t.Fatalf("list: ids %v, foreign %+v", ids, foreign)
	}
}
