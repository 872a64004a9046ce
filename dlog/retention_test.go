package dlog

import (
	"errors"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestTruncateAndRetention truncates in the middle of a log: the segments wholly before the
// point go with their ledgers, the records from it on stay readable, and readers cannot start
// before it. Then retention by age deletes the expired segments and moves the truncation point
// past them.
func TestTruncateAndRetention(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	cfg := testConfig()
	cfg.MaxLogSegmentBytes = 16 << 10
	cfg.RetentionPeriod = -1 // only truncation deletes, until the second writer below
	ns := newNamespace(t, cl, cfg)
	ctx := ctxFor(t, 60*time.Second)
	l, err := ns.CreateLog(ctx, "trunc")
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 3000, 60
	a := newAcks()
	for tx := int64(1); tx <= n; tx++ {
		w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, size)}, a.callback(tx))
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a.wg.Wait()
	before, err := l.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) < 6 {
		t.Fatalf("%d segments", len(before))
	}
	// Truncate at a record in the middle of the fourth segment.
	var point DLSN
	var pointTx int64
	for tx, d := range a.byTx {
		if d.SegmentSeqNo == 4 && d.EntryID == 1 && d.SlotID == 3 {
			point, pointTx = d, tx
		}
	}
	if pointTx == 0 {
		t.Fatal("no record at 4/1/3")
	}
	if err := w.Truncate(ctx, DLSN{SegmentSeqNo: 99}); !errors.Is(err, ErrTruncateBeyondEnd) {
		t.Fatalf("truncate beyond the end: %v", err)
	}
	if err := w.Truncate(ctx, point); err != nil {
		t.Fatal(err)
	}
	after, err := l.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after[0].SeqNo != 4 || len(after) != len(before)-3 {
		t.Fatalf("after truncation the segments start at %d (%d of %d left)", after[0].SeqNo, len(after), len(before))
	}
	for _, s := range before[:3] {
		if _, err := cl.LedgerMetadata(ctx, s.LedgerID); !errors.Is(err, client.ErrNoSuchLedger) {
			t.Fatalf("segment %d's ledger %d: %v", s.SeqNo, s.LedgerID, err)
		}
	}
	if tp, _ := l.TruncationPoint(ctx); tp != point {
		t.Fatalf("truncation point %s", tp.Text())
	}
	// The truncation point never moves back.
	if err := w.Truncate(ctx, InitialDLSN); err != nil {
		t.Fatal(err)
	}
	if tp, _ := l.TruncationPoint(ctx); tp != point {
		t.Fatalf("truncation point moved back to %s", tp.Text())
	}
	// Readers: from the head, at the point; not before it.
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	got := readN(t, ctx, r, int(n-pointTx+1), size, a.byTx)
	if got[0].TxID != pointTx || got[0].DLSN != point {
		t.Fatalf("head reader starts at tx %d (%s)", got[0].TxID, got[0].DLSN.Text())
	}
	r.Close()
	if _, err := l.OpenReader(ctx, AtDLSN(DLSN{SegmentSeqNo: 2})); !errors.Is(err, ErrTruncated) {
		t.Fatalf("reader before the point: %v", err)
	}
	if r, err := l.OpenReader(ctx, AtTxID(1)); err != nil {
		t.Fatal(err)
	} else {
		got := readN(t, ctx, r, 1, size, a.byTx)
		if got[0].TxID != pointTx {
			t.Fatalf("reader at txid 1 starts at %d", got[0].TxID)
		}
		r.Close()
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Retention by age: a writer with a short retention period deletes the completed segments
	// once they are older, and the truncation point follows.
	cfg.RetentionPeriod = 200 * time.Millisecond
	ns2 := newNamespace(t, cl, cfg)
	l2, _ := ns2.OpenLog(ctx, "trunc")
	time.Sleep(300 * time.Millisecond)
	w2, err := l2.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w2.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	left, err := l2.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].State != InProgress {
		t.Fatalf("after retention: %+v", left)
	}
	for _, s := range after {
		if _, err := cl.LedgerMetadata(ctx, s.LedgerID); !errors.Is(err, client.ErrNoSuchLedger) {
			t.Fatalf("expired segment %d's ledger %d: %v", s.SeqNo, s.LedgerID, err)
		}
	}
	if tp, _ := l2.TruncationPoint(ctx); tp != (DLSN{SegmentSeqNo: left[0].SeqNo}) {
		t.Fatalf("truncation point after retention: %s", tp.Text())
	}
	// The log goes on: the next record follows the last one.
	if _, err := w2.Write(ctx, Record{TxID: n + 1, Payload: payloadFor(n+1, size)}); err != nil {
		t.Fatal(err)
	}
	r, err = l2.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := readN(t, ctx, r, 1, size, nil); got[0].TxID != n+1 {
		t.Fatalf("head after retention: tx %d", got[0].TxID)
	}
	if err := w2.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPurgeOnClosedWriter: Purge on a closed writer fails with ErrWriterClosed, as the
// writer's other methods do, whether or not there is a segment to delete. It used to return
// ErrLockLost (committing under the released lock) or nothing.
func TestPurgeOnClosedWriter(t *testing.T) {
	c := clustertest.Start(t, 3)
	cfg := testConfig()
	cfg.RetentionPeriod = 1500 * time.Millisecond
	ns := newNamespace(t, newClient(t, c), cfg)
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "purge-closed")
	for tx := int64(1); tx <= 2; tx++ {
		if tx == 2 {
			var err error
			if w, err = l.OpenWriter(ctx); err != nil { // segment 1 is not expired yet
				t.Fatal(err)
			}
		}
		if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if n, err := w.Purge(ctx); n != 0 || !errors.Is(err, ErrWriterClosed) {
			t.Fatalf("Purge on closed writer %d: %d deleted, %v; want ErrWriterClosed", tx, n, err)
		}
	}
	time.Sleep(cfg.RetentionPeriod) // segment 1 expires
	if n, err := w.Purge(ctx); n != 0 || !errors.Is(err, ErrWriterClosed) {
		t.Fatalf("Purge on a closed writer with an expired segment: %d deleted, %v; want ErrWriterClosed", n, err)
	}
	if segs, err := l.Segments(ctx); err != nil || len(segs) != 2 {
		t.Fatalf("segments %+v, %v; want both", segs, err)
	}
}
