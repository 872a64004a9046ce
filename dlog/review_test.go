package dlog

import (
	"errors"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestTruncateInsideTheWritersNextEntry: a truncation point at a slot past 0 of the entry the
// writer sends next is past what it has written too: the records of that entry, written and
// acknowledged after the truncation, would lie before the point and be hidden from readers.
func TestTruncateInsideTheWritersNextEntry(t *testing.T) {
	c := clustertest.Start(t, 3)
	ns := newNamespace(t, newClient(t, c), testConfig())
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "tnext")
	defer w.Close(ctx)
	if _, err := w.Write(ctx, Record{TxID: 1, Payload: payloadFor(1, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil { // the control entry is acknowledged: nothing in flight
		t.Fatal(err)
	}
	w.mu.Lock()
	seq, next := w.seg.meta.SeqNo, w.seg.nextEntry
	w.mu.Unlock()
	point := DLSN{SegmentSeqNo: seq, EntryID: next, SlotID: 1}
	if err := w.Truncate(ctx, point); !errors.Is(err, ErrTruncateBeyondEnd) {
		t.Errorf("truncate at %s with the writer's next entry %d: %v, want ErrTruncateBeyondEnd", point.Text(), next, err)
	}
	d2, err := w.Write(ctx, Record{TxID: 2, Payload: payloadFor(2, 10)})
	if err != nil {
		t.Fatal(err)
	}
	if d2 != (DLSN{SegmentSeqNo: seq, EntryID: next}) {
		t.Fatalf("tx 2 at %s, want %d/%d/0", d2.Text(), seq, next)
	}
	if _, err := w.Write(ctx, Record{TxID: 3, Payload: payloadFor(3, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rec, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec.TxID > 2 {
		t.Fatalf("the head reader starts at tx %d (%s): acknowledged tx 2 at %s is hidden", rec.TxID, rec.DLSN.Text(), d2.Text())
	}
	if r2, err := l.OpenReader(ctx, AtDLSN(d2)); err != nil {
		t.Fatalf("a reader at acknowledged tx 2's %s: %v", d2.Text(), err)
	} else {
		r2.Close()
	}
}
