package dlog

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestDeleteLogUnderReaders: readers of a deleted log fail with ErrNoSuchLog, wherever they
// stand: one opened at the head that has not read yet (it used to wait forever), one tailing a
// crashed writer's in-progress segment (it used to get ErrTruncated), and one waiting for the
// next segment while the delete runs (it used to get ErrCorrupt: a segment missing under the
// log's last sequence number; mid-delete it may get ErrTruncated, never ErrCorrupt).
func TestDeleteLogUnderReaders(t *testing.T) {
	c := clustertest.Start(t, 3)
	cfg := testConfig()
	ns1, ns2 := newNamespace(t, newClient(t, c), cfg), newNamespace(t, newClient(t, c), cfg)
	ns1.ignoreLockLoss = true
	ctx := ctxFor(t, 60*time.Second)
	l, w := createWriting(t, ctx, ns1, "failover-del")
	for tx := int64(1); tx <= 3; tx++ {
		if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(ctx); err != nil { // segment 1
		t.Fatal(err)
	}
	w = nil
	w2, err := l.OpenWriter(ctx) // segment 2, left in progress (a crashed writer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w2.Write(ctx, Record{TxID: 4, Payload: payloadFor(4, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := w2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	head, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer head.Close()
	tail, err := l.OpenReader(ctx, AtDLSN(DLSN{SegmentSeqNo: 2}))
	if err != nil {
		t.Fatal(err)
	}
	defer tail.Close()
	readN(t, ctx, tail, 1, 10, nil)
	next, err := l.OpenReader(ctx, AtDLSN(DLSN{SegmentSeqNo: 2}))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	revokeLocks(t, c.MetadataURI())

	var during error
	ns2.afterDeleteBatch = func() {
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, during = next.Next(short)
	}
	if err := ns2.DeleteLog(ctx, "failover-del"); err != nil {
		t.Fatal(err)
	}
	if during == nil || errors.Is(during, ErrCorrupt) || errors.Is(during, context.DeadlineExceeded) {
		t.Errorf("reader mid-delete: %v; want ErrTruncated or ErrNoSuchLog", during)
	}
	for name, r := range map[string]*Reader{"head": head, "tail": tail, "next": next} {
		short, cancel := context.WithTimeout(ctx, 3*time.Second)
		rec, err := r.Next(short)
		cancel()
		if !errors.Is(err, ErrNoSuchLog) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrTruncated) {
			t.Errorf("%s reader after the delete: tx %d, %v; want ErrNoSuchLog", name, rec.TxID, err)
		}
	}
	w2.Close(ctx)
}

// TestDeleteLogFencesAbandonedWriter: DeleteLog fences the segment of a writer that lost its
// lock without noticing (a long pause), as a new writer would: its appends fail from then on.
// They used to be acknowledged, into the ledger of a deleted log.
func TestDeleteLogFencesAbandonedWriter(t *testing.T) {
	c := clustertest.Start(t, 3)
	cfg := testConfig()
	ns1, ns2 := newNamespace(t, newClient(t, c), cfg), newNamespace(t, newClient(t, c), cfg)
	ns1.ignoreLockLoss = true // the writer does not notice its lock going
	ctx := ctxFor(t, 60*time.Second)
	_, w := createWriting(t, ctx, ns1, "failover-delw")
	defer w.Close(ctx)
	if _, err := w.Write(ctx, Record{TxID: 1, Payload: payloadFor(1, 10)}); err != nil {
		t.Fatal(err)
	}
	revokeLocks(t, c.MetadataURI())
	if err := ns2.DeleteLog(ctx, "failover-delw"); err != nil {
		t.Fatal(err)
	}
	for tx := int64(2); tx <= 3; tx++ {
		if d, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}); !errors.Is(err, ErrFenced) {
			t.Fatalf("write of tx %d after the delete: at %s, %v; want ErrFenced", tx, d.Text(), err)
		}
	}
}
