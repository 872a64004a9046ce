package dlog

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// logCommitLostKV applies the next commit that writes the log's value and no segment (a
// truncation), then reports it failed, as a commit whose answer was lost (a timeout, or the
// caller's ctx ending) does.
type logCommitLostKV struct {
	metadata.KV
	armed atomic.Bool
}

func (k *logCommitLostKV) Commit(ctx context.Context, guard metadata.Lock, ops ...metadata.KVOp) (metadata.Version, error) {
	v, err := k.KV.Commit(ctx, guard, ops...)
	if err == nil && len(ops) == 1 && strings.HasPrefix(ops[0].Key, logsPrefix) && k.armed.CompareAndSwap(true, false) {
		return 0, errLostAnswer
	}
	return v, err
}

// TestTruncateWithALostAnswerLeavesTheWriterWorking: a Truncate whose commit applied but
// reported an error (its answer lost) leaves the writer usable: the writer's later commits of
// the log's value (completing the segment at a roll or at Close) must not fail on the version
// it had before the truncation. It kept that version, so the next roll failed with a bad
// version, the writer stopped, and every record not yet acknowledged failed.
func TestTruncateWithALostAnswerLeavesTheWriterWorking(t *testing.T) {
	c := clustertest.Start(t, 3)
	ns := newNamespace(t, newClient(t, c), testConfig())
	kv := &logCommitLostKV{KV: ns.kv}
	ns.kv = kv
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "lost-trunc")
	a := newAcks()
	for tx := int64(1); tx <= 10; tx++ {
		w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}, a.callback(tx))
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a.wg.Wait()
	kv.armed.Store(true)
	point := a.byTx[5]
	// Its outcome is unknown to the commit: an error, or nil once the writer learnt it applied.
	if err := w.Truncate(ctx, point); err != nil && !errors.Is(err, errLostAnswer) {
		t.Fatalf("truncate with its answer lost: %v", err)
	}
	if tp, err := l.TruncationPoint(ctx); err != nil || tp != point {
		t.Fatalf("truncation point %s, %v; want %s (the commit applied)", tp.Text(), err, point.Text())
	}
	// The writer goes on: records, a roll, more records, Close.
	for tx := int64(11); tx <= 20; tx++ {
		w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}, a.callback(tx))
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatalf("flush after the truncation: %v", err)
	}
	w.mu.Lock()
	w.cfg.MaxLogSegmentBytes = 1 // roll before the next batch
	w.mu.Unlock()
	for tx := int64(21); tx <= 30; tx++ {
		w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}, a.callback(tx))
	}
	a.wg.Wait()
	for tx, err := range a.failed {
		t.Fatalf("%d records failed after the truncation, e.g. tx %d: %v", len(a.failed), tx, err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := readN(t, ctx, r, 26, 10, a.byTx)
	if got[0].TxID != 5 || got[25].TxID != 30 {
		t.Fatalf("read tx %d..%d, want 5..30", got[0].TxID, got[25].TxID)
	}
}

// TestNextAfterCloseFailsWithRecordsBuffered: Next after Close fails with ErrReaderClosed, as
// Close documents, also when the reader holds records it read ahead; it returned those first.
func TestNextAfterCloseFailsWithRecordsBuffered(t *testing.T) {
	c := clustertest.Start(t, 3)
	ns := newNamespace(t, newClient(t, c), testConfig())
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "closed-reader")
	defer w.Close(ctx)
	for tx := int64(1); tx <= 5; tx++ {
		w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}, func(DLSN, error) {})
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	readN(t, ctx, r, 1, 10, nil)
	if r.head >= len(r.buf) {
		t.Fatalf("the reader holds no record after the first (%d read ahead): the test needs some", len(r.buf))
	}
	r.Close()
	if rec, err := r.Next(ctx); !errors.Is(err, ErrReaderClosed) {
		t.Fatalf("Next after Close: tx %d, %v; want ErrReaderClosed", rec.TxID, err)
	}
}

// TestBatchesFitTheClientsEntryLimit: the writer gathers small records into batches no larger
// than the entries its client can send. With a client frame limit below the writer's own
// batch bound (1 MiB of records) and a large OutputBufferSize, it gathered batches past the
// client's limit, which refused them, and the writer stopped on records of 200 bytes.
func TestBatchesFitTheClientsEntryLimit(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := clientWith(t, c.MetadataURI(), func(cfg *client.Config) { cfg.Transport.MaxFrameSize = 64 << 10 })
	ncfg := testConfig()
	ncfg.OutputBufferSize = 256 << 10
	ncfg.PeriodicFlushFrequency = time.Hour // a batch fills while another is in flight
	ns := newNamespace(t, cl, ncfg)
	ctx := ctxFor(t, 60*time.Second)
	l, w := createWriting(t, ctx, ns, "batch-limit")
	a := newAcks()
	const n = 3000
	for tx := int64(1); tx <= n; tx++ {
		w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, 200)}, a.callback(tx))
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	a.wg.Wait()
	for tx, err := range a.failed {
		t.Fatalf("%d records of 200 bytes failed, e.g. tx %d: %v", len(a.failed), tx, err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	readAcked(t, ctx, l, a, n)
}

// TestTruncateAtANegativeDLSNIsRefused: a truncation point with a negative field is no
// position (DLSNFromBytes refuses one): Truncate fails with ErrInvalidDLSN and the log stays
// usable. It wrote the point into the log's value, which then no longer decoded: every reader,
// writer and TruncationPoint of the log failed with ErrCorrupt from then on.
func TestTruncateAtANegativeDLSNIsRefused(t *testing.T) {
	c := clustertest.Start(t, 3)
	ns := newNamespace(t, newClient(t, c), testConfig())
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "trunc-negative")
	defer w.Close(ctx)
	for tx := int64(1); tx <= 3; tx++ {
		if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []DLSN{{SegmentSeqNo: 1, EntryID: 1, SlotID: -1}, {SegmentSeqNo: 1, EntryID: -1, SlotID: 5}} {
		if err := w.Truncate(ctx, d); !errors.Is(err, ErrInvalidDLSN) {
			t.Errorf("truncate at %s: %v, want ErrInvalidDLSN", d.Text(), err)
		}
	}
	if tp, err := l.TruncationPoint(ctx); err != nil || tp != InitialDLSN {
		t.Fatalf("truncation point %s, %v; want %s", tp.Text(), err, InitialDLSN.Text())
	}
	// A reader there has no position either (it read from entry -1 and failed with the
	// client's ErrBadArgument after its retries).
	if r, err := l.OpenReader(ctx, AtDLSN(DLSN{SegmentSeqNo: 1, EntryID: -1, SlotID: 5})); !errors.Is(err, ErrInvalidDLSN) {
		if err == nil {
			r.Close()
		}
		t.Errorf("reader at 1/-1/5: %v, want ErrInvalidDLSN", err)
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	readN(t, ctx, r, 3, 10, nil)
}
