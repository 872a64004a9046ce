package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// appendRange appends entries first..last (payload(ledger, id)) and checks their ids.
func appendRange(t *testing.T, lh *Ledger, first, last int64) {
	t.Helper()
	for i := first; i <= last; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		id, err := lh.Append(ctx, payload(lh.ID(), i))
		cancel()
		if err != nil || id != i {
			t.Fatalf("append %d: id %d, %v", i, id, err)
		}
	}
}

// TestTailingReaderAfterEnsembleChanges: a reader opened (without recovery) before the writer
// changed its ensemble twice learns a LAC from the old ensemble's bookies, then reads the
// entries up to it. Every entry up to that LAC was acknowledged and must be readable; a stale
// ensemble must not turn them into ErrNoSuchEntry.
func TestTailingReaderAfterEnsembleChanges(t *testing.T) {
	c := clustertest.Start(t, 5)
	ctx := context.Background()
	var failing sync.Map
	w := newClient(t, c, failWhileListed(&failing))
	lh := createLedger(t, w, 3, 2, 2)
	appendRange(t, lh, 0, 9)

	rh, err := newClient(t, c, nil).OpenLedger(ctx, lh.ID(), password, false)
	if err != nil {
		t.Fatal(err)
	}

	ens := lh.Metadata().Ensembles[0].Bookies
	failing.Store(ens[0], true)
	appendRange(t, lh, 10, 19)
	failing.Store(ens[1], true)
	appendRange(t, lh, 20, 39)
	if n := len(lh.Metadata().Ensembles); n != 3 {
		t.Fatalf("writer has %d ensembles, want 3", n)
	}

	// Entry 21 is the first whose write set (positions 0 and 1) holds neither old bookie. A LAC
	// read may finish before the bookie that knows the highest LAC answers: ask again.
	var lac int64
	for range 50 {
		if lac, err = rh.ReadLastAddConfirmed(ctx); err != nil {
			t.Fatal(err)
		}
		if lac >= 21 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lac < 21 {
		t.Fatalf("tailing reader stuck at LAC %d; the writer is at %d", lac, lh.LastAddConfirmed())
	}
	t.Logf("reader LAC %d (writer LAC %d)", lac, lh.LastAddConfirmed())
	entries, err := rh.Read(ctx, 0, lac)
	if err != nil {
		t.Fatalf("read 0..%d (all acknowledged, all <= LAC): %v", lac, err)
	}
	if int64(len(entries)) != lac+1 {
		t.Fatalf("read %d entries, want %d", len(entries), lac+1)
	}
}

// corruptReader writes entries 0..6 to a (1,1,1) ledger and opens it on a second client whose
// reads come back damaged; it returns the read handle and the bookie.
func corruptReader(t *testing.T) (rh *Ledger, bookie string) {
	t.Helper()
	c := clustertest.Start(t, 1)
	lh := createLedger(t, newClient(t, c, nil), 1, 1, 1)
	appendRange(t, lh, 0, 6) // entry 6 is long enough for faultConn to corrupt
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		return &faultConn{inner: conn, addr: addr, corruptReads: true}
	})
	rh, err := r.OpenLedger(context.Background(), lh.ID(), password, false)
	if err != nil {
		t.Fatal(err)
	}
	return rh, lh.Metadata().Ensembles[0].Bookies[0]
}

// TestDigestMismatchNamesTheBookie: a read whose only replica returns damaged bytes fails
// with ErrDigestMismatch naming the bookie that returned them.
func TestDigestMismatchNamesTheBookie(t *testing.T) {
	rh, bad := corruptReader(t)
	rh.mu.Lock() // the LAC read fails on the corrupt entry too (see TestLACDigestMismatchIsReported)
	rh.lac = 6
	rh.mu.Unlock()
	_, err := rh.Read(context.Background(), 6, 6)
	if !errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrNoSuchEntry) {
		t.Fatalf("read of a corrupt entry: %v, want ErrDigestMismatch", err)
	}
	if !strings.Contains(err.Error(), bad) {
		t.Fatalf("digest mismatch error %q does not name the bookie %s", err, bad)
	}
}

// TestLACDigestMismatchIsReported: a LAC read whose only bookie returns a damaged last entry
// fails with an error that matches ErrDigestMismatch and names the bookie.
func TestLACDigestMismatchIsReported(t *testing.T) {
	rh, bad := corruptReader(t)
	_, err := rh.ReadLastAddConfirmed(context.Background())
	if !errors.Is(err, ErrDigestMismatch) || !strings.Contains(fmt.Sprint(err), bad) {
		t.Fatalf("LAC read of a corrupt last entry: %v; want an error matching ErrDigestMismatch naming %s", err, bad)
	}
}

// TestTailingReaderFollowsANewEnsemble: the writer's only bookie is replaced after a reader
// opened the ledger. The old bookie keeps answering LAC reads with its last entry, so only the
// metadata tells the reader where later entries went: its LAC must still catch up.
func TestTailingReaderFollowsANewEnsemble(t *testing.T) {
	c := clustertest.Start(t, 2)
	ctx := context.Background()
	var failing sync.Map
	w := newClient(t, c, failWhileListed(&failing))
	waitWritable(t, w, 2)
	lh := createLedger(t, w, 1, 1, 1)
	appendRange(t, lh, 0, 4)
	rh, err := newClient(t, c, nil).OpenLedger(ctx, lh.ID(), password, false)
	if err != nil {
		t.Fatal(err)
	}
	failing.Store(lh.Metadata().Ensembles[0].Bookies[0], true)
	appendRange(t, lh, 5, 9)
	if n := len(lh.Metadata().Ensembles); n != 2 {
		t.Fatalf("writer has %d ensembles, want 2", n)
	}
	var lac int64
	for deadline := time.Now().Add(10 * time.Second); lac < 8; time.Sleep(20 * time.Millisecond) {
		if lac, err = rh.ReadLastAddConfirmed(ctx); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("tailing reader stuck at LAC %d; the writer is at %d", lac, lh.LastAddConfirmed())
		}
	}
	if entries, err := rh.Read(ctx, 0, lac); err != nil || int64(len(entries)) != lac+1 {
		t.Fatalf("read 0..%d: %d entries, %v", lac, len(entries), err)
	}
}

// misdirectedReads answers reads with another stored entry, intact (its digest is valid), as
// a bookie with a damaged index or a misdirected disk read would.
type misdirectedReads struct {
	bookieConn
	to func(ledgerID, entryID int64) (int64, int64)
}

func (m *misdirectedReads) Read(rctx context.Context, ledgerID, entryID int64, flags protocol.Flags, key *[20]byte, cb transport.ReadCallback, ctx any) {
	if entryID >= 0 {
		ledgerID, entryID = m.to(ledgerID, entryID)
	}
	m.bookieConn.Read(rctx, ledgerID, entryID, flags, key, cb, ctx)
}

// TestMisdirectedEntriesAreRejected: of a (3,3,2) ledger's bookies, one answers with the
// same entry of another ledger (swapped ledger id), another with the previous entry (swapped
// entry id). Both are digest-valid, so only the ids in the header tell them apart: every read
// must still return the right entry, from the third replica.
func TestMisdirectedEntriesAreRejected(t *testing.T) {
	c := clustertest.Start(t, 3)
	w := newClient(t, c, nil)
	lh, other := createLedger(t, w, 3, 3, 2), createLedger(t, w, 3, 3, 2)
	appendN(t, lh, 10)
	appendN(t, other, 10)
	for _, l := range []*Ledger{lh, other} {
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ens := lh.Metadata().Ensembles[0].Bookies
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		switch addr {
		case ens[0]:
			return &misdirectedReads{conn, func(_, e int64) (int64, int64) { return other.ID(), e }}
		case ens[1]:
			return &misdirectedReads{conn, func(l, e int64) (int64, int64) { return l, (e + 9) % 10 }}
		}
		return conn
	})
	rh, err := r.OpenLedger(context.Background(), lh.ID(), password, false)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, rh, 9)
}
