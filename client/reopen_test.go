package client

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// The tests of ReopenLedgerForWrite against a writer that died with its last entry on fewer
// bookies than its write quorum. Each stages a (3,3,2) ledger whose writer appended entries
// 0-9, then entry 10 with its adds to some bookies held (never sent), and went away.

// stageDeadWriter creates a (3,3,2) ledger on c, appends entries 0-9, then entry 10 with the
// adds to the bookies at the held indexes of the ensemble never sent, and closes the writer's
// client once entry 10 is stored on the others (acknowledged, if they are an ack quorum). It
// returns the ledger id and the ensemble.
func stageDeadWriter(t *testing.T, c *cluster.Cluster, chk *Client, held ...int) (int64, []string) {
	t.Helper()
	var conns sync.Map
	w := newClient(t, c, wrapConns(&conns))
	waitWritable(t, w, c.Size())
	lh := createLedger(t, w, 3, 3, 2)
	appendN(t, lh, 10)
	ens := lh.Metadata().Ensembles[0].Bookies
	for _, i := range held {
		holdAdds(faultConnOf(t, w, &conns, ens[i]))
	}
	done := make(chan error, 1)
	lh.AppendAsync(payload(lh.ID(), 10), func(_ int64, err error) { done <- err })
	if len(ens)-len(held) >= 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("entry 10 on an ack quorum: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("entry 10 never acknowledged")
		}
	}
	for i, b := range ens {
		if slices.Contains(held, i) {
			continue
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, ok := storedOn(t, chk, lh.ID(), 10, b); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("entry 10 never reached %s", b)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return lh.ID(), ens
}

// storedOn reads entry from bookie directly (no fencing) and returns its verified payload, or
// false if the bookie says it has no such entry. Anything else fails the test.
func storedOn(t *testing.T, chk *Client, ledgerID, entry int64, bookie string) ([]byte, bool) {
	t.Helper()
	dg, err := newDigester(metadata.DigestCRC32C, password)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan readResult, 1)
	chk.cfg.dial(bookie).Read(context.Background(), ledgerID, entry, 0, nil, readResponse, &readCtx{ch: ch})
	r := <-ch
	switch {
	case r.err == nil && r.rc == protocol.EOK:
		e, err := dg.verify(r.entry, ledgerID, entry)
		if err != nil {
			t.Fatalf("entry %d on %s: %v", entry, bookie, err)
		}
		return e.Payload, true
	case r.err == nil && isMissing(r.rc):
		return nil, false
	}
	t.Fatalf("read of entry %d from %s: rc %v, %v", entry, bookie, r.rc, r.err)
	return nil, false
}

// checkReplicas checks that every bookie of entry's write set, per the ledger's metadata now,
// holds want.
func checkReplicas(t *testing.T, chk *Client, ledgerID, entry int64, want []byte) {
	t.Helper()
	for _, p := range replicaProblems(t, chk, ledgerID, entry, want) {
		t.Error(p)
	}
}

// replicaProblems lists the bookies of entry's write set, per the ledger's metadata now, that
// do not hold want.
func replicaProblems(t *testing.T, chk *Client, ledgerID, entry int64, want []byte) []string {
	t.Helper()
	md, err := chk.LedgerMetadata(context.Background(), ledgerID)
	if err != nil {
		t.Fatal(err)
	}
	set, err := writeSet(md, entry)
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	for _, b := range set {
		got, ok := storedOn(t, chk, ledgerID, entry, b)
		if !ok {
			problems = append(problems, fmt.Sprintf("entry %d is not on %s, of its write set %v: under-replicated", entry, b, set))
		} else if !bytes.Equal(got, want) {
			problems = append(problems, fmt.Sprintf("entry %d on %s is %q, want %q", entry, b, got, want))
		}
	}
	return problems
}

// delayedReads sends every read (LAC reads too) delay late.
type delayedReads struct {
	bookieConn
	delay time.Duration
}

func (d delayedReads) Read(ctx context.Context, ledgerID, entryID int64, flags protocol.Flags, key *[20]byte, cb transport.ReadCallback, cbCtx any) {
	go func() {
		time.Sleep(d.delay)
		d.bookieConn.Read(ctx, ledgerID, entryID, flags, key, cb, cbCtx)
	}()
}

// reopenAndAppend reopens the ledger on cl, appends one entry and checks that it got id want
// and reads back (with entry 10, the dead writer's).
func reopenAndAppend(t *testing.T, cl *Client, ledgerID int64, want int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := cl.ReopenLedgerForWrite(ctx, ledgerID, password)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	id, err := w.Append(ctx, []byte("after the reopen"))
	if err != nil || id != want {
		t.Fatalf("the reopened writer appended entry %d (%v), want %d", id, err, want)
	}
	es, err := w.Read(ctx, 10, want)
	if err != nil || len(es) != int(want-9) {
		t.Fatalf("read 10..%d after the reopen: %d entries, %v", want, len(es), err)
	}
	if want == 11 && !bytes.Equal(es[0].Payload, payload(ledgerID, 10)) {
		t.Fatalf("entry 10 reads %q after the reopen, want the dead writer's", es[0].Payload)
	}
}

// TestReopenRecoversAnEntryOnFewerThanQaBookies: entry 10, past the LAC, is on one bookie only
// and the others answer too late (or not at all) for it to be found missing, so the reopen
// must keep it: re-added to its whole write quorum (a replacement for a bookie that is down,
// written into the metadata before the writer goes on), and the writer goes on at 11, never
// writing another entry 10.
func TestReopenRecoversAnEntryOnFewerThanQaBookies(t *testing.T) {
	t.Run("slow bookies", func(t *testing.T) {
		c := clustertest.Start(t, 3)
		chk := newClient(t, c, nil)
		id, ens := stageDeadWriter(t, c, chk, 1, 2)
		r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
			if addr != ens[0] {
				return delayedReads{conn, 300 * time.Millisecond}
			}
			return conn
		})
		reopenAndAppend(t, r, id, 11)
		checkReplicas(t, chk, id, 10, payload(id, 10))
		if md, _ := chk.LedgerMetadata(context.Background(), id); len(md.Ensembles) != 1 || md.State != metadata.StateOpen {
			t.Fatalf("metadata after the reopen: %+v", md)
		}
	})
	t.Run("a bookie down", func(t *testing.T) {
		c := clustertest.Start(t, 4)
		chk := newClient(t, c, nil)
		id, ens := stageDeadWriter(t, c, chk, 1, 2)
		if err := c.StopBookie(context.Background(), slices.Index(c.BookieAddrs(), ens[2])); err != nil {
			t.Fatal(err)
		}
		r := newClient(t, c, nil)
		waitWritable(t, r, 3) // the spare among them
		reopenAndAppend(t, r, id, 11)
		md, err := chk.LedgerMetadata(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if set, _ := writeSet(md, 10); slices.Contains(set, ens[2]) || md.State != metadata.StateOpen {
			t.Fatalf("metadata after the reopen: %+v; entry 10's write set still names %s, which is down", md, ens[2])
		}
		checkReplicas(t, chk, id, 10, payload(id, 10))
	})
}

// TestReopenNeverCountsAnUnderReplicatedEntry: entry 10, past the LAC, is readable on one
// bookie only, every bookie up. Whether the reopen keeps it depends on which answers come
// first, but either it is on its whole write quorum before the writer goes on at 11, or it is
// dropped and the writer's own entry 10 replaces it on every bookie: one content per entry id.
// Unscripted, either may happen (a few rounds); with the bookie that has it answering last,
// it is dropped.
func TestReopenNeverCountsAnUnderReplicatedEntry(t *testing.T) {
	t.Run("unscripted", func(t *testing.T) {
		c := clustertest.Start(t, 3)
		chk := newClient(t, c, nil)
		for round := range 4 {
			id, _ := stageDeadWriter(t, c, chk, 1, 2)
			got := reopenAppendAndCheck(t, newClient(t, c, nil), chk, id)
			t.Logf("round %d: the reopened writer appended entry %d", round, got)
		}
	})
	t.Run("the holder answers last", func(t *testing.T) {
		c := clustertest.Start(t, 3)
		chk := newClient(t, c, nil)
		id, ens := stageDeadWriter(t, c, chk, 1, 2)
		r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
			if addr == ens[0] {
				return delayedReads{conn, 300 * time.Millisecond}
			}
			return conn
		})
		if got := reopenAppendAndCheck(t, r, chk, id); got != 10 {
			t.Fatalf("the reopened writer appended entry %d, want 10 (entry 10 is missing on two bookies of three)", got)
		}
	})
}

// reopenAppendAndCheck reopens the ledger staged by stageDeadWriter on cl, appends an entry
// and checks that entry 10 has one content on its whole write set: the dead writer's if the
// append got 11, the new one if it got 10. It returns the id appended.
func reopenAppendAndCheck(t *testing.T, cl, chk *Client, id int64) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := cl.ReopenLedgerForWrite(ctx, id, password)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	next := []byte("after the reopen")
	got, err := w.Append(ctx, next)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	switch got {
	case 11: // entry 10 kept: it must be on its whole write quorum
		checkReplicas(t, chk, id, 10, payload(id, 10))
	case 10: // dropped: the writer's entry 10 replaces it everywhere (its last add may lag)
		for deadline := time.Now().Add(5 * time.Second); !replicasHold(t, chk, id, 10, next) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		checkReplicas(t, chk, id, 10, next)
	default:
		t.Fatalf("the reopened writer appended entry %d, want 10 or 11", got)
	}
	return got
}

// replicasHold reports whether every bookie of entry's write set holds want.
func replicasHold(t *testing.T, chk *Client, ledgerID, entry int64, want []byte) bool {
	t.Helper()
	return len(replicaProblems(t, chk, ledgerID, entry, want)) == 0
}

// TestReopenTreatsACorruptTailAsAnError: entry 10 was acknowledged (on two bookies, not the
// third); one of the two returns it damaged. A damaged copy is never evidence that the entry
// is missing: the reopen reads it from the other copy and re-adds it to the third bookie; and
// with the other copy's bookie down, it fails instead of dropping an acknowledged entry.
func TestReopenTreatsACorruptTailAsAnError(t *testing.T) {
	t.Run("found on the other copy", func(t *testing.T) {
		c := clustertest.Start(t, 3)
		chk := newClient(t, c, nil)
		id, ens := stageDeadWriter(t, c, chk, 2)
		r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
			switch addr {
			case ens[0]: // damaged copies
				return &faultConn{inner: conn, addr: addr, corruptReads: true}
			case ens[1]: // the good copy answers last
				return delayedReads{conn, 300 * time.Millisecond}
			}
			return conn
		})
		reopenAndAppend(t, r, id, 11)
		if got, ok := storedOn(t, chk, id, 10, ens[2]); !ok || !bytes.Equal(got, payload(id, 10)) {
			t.Fatalf("entry 10 on %s after the reopen: %q (stored %v); the acknowledged entry is on one good copy", ens[2], got, ok)
		}
	})
	t.Run("the other copy down", func(t *testing.T) {
		c := clustertest.Start(t, 3)
		chk := newClient(t, c, nil)
		id, ens := stageDeadWriter(t, c, chk, 2)
		if err := c.StopBookie(context.Background(), slices.Index(c.BookieAddrs(), ens[1])); err != nil {
			t.Fatal(err)
		}
		r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
			if addr == ens[0] { // its LAC answer is sound, so the reads of entry 10 decide
				return damagedEntry{conn, 10}
			}
			return conn
		})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if w, err := r.ReopenLedgerForWrite(ctx, id, password); err == nil {
			got, aerr := w.Append(ctx, []byte("after the reopen"))
			t.Fatalf("reopened with the acknowledged entry 10 on one damaged copy and one down bookie; appended entry %d (%v)", got, aerr)
		} else {
			t.Logf("reopen: %v", err)
		}
		if got, ok := storedOn(t, chk, id, 10, ens[2]); ok {
			t.Fatalf("entry 10 on %s after a failed reopen: %q", ens[2], got)
		}
	})
}

// damagedEntry returns entry damaged (its last byte flipped) and every other read as it is.
type damagedEntry struct {
	bookieConn
	entry int64
}

func (d damagedEntry) Read(ctx context.Context, ledgerID, entryID int64, flags protocol.Flags, key *[20]byte, cb transport.ReadCallback, cbCtx any) {
	if entryID == d.entry {
		inner := cb
		cb = func(cbCtx any, rc protocol.ReturnCode, entry []byte, err error) {
			if len(entry) > 0 {
				entry = append([]byte(nil), entry...)
				entry[len(entry)-1] ^= 0xff
			}
			inner(cbCtx, rc, entry, err)
		}
	}
	d.bookieConn.Read(ctx, ledgerID, entryID, flags, key, cb, cbCtx)
}
