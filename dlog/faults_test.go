package dlog

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// clientWith opens a client on the cluster at uri, with its config changed by change.
func clientWith(t *testing.T, uri string, change func(*client.Config)) *client.Client {
	t.Helper()
	cfg := client.DefaultConfig(uri)
	change(&cfg)
	cl, err := client.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// readAcked reads l from its head until txID last and checks that every acknowledged record is
// read, once, at the DLSN it was acknowledged at.
func readAcked(t *testing.T, ctx context.Context, l *Log, a *acks, last int64) {
	t.Helper()
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	seen := map[int64]bool{}
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rec, err := r.Next(rctx)
		cancel()
		if err != nil {
			t.Fatalf("reader after %d records: %v", len(seen), err)
		}
		if want, ok := a.byTx[rec.TxID]; ok && want != rec.DLSN {
			t.Fatalf("tx %d read at %s, acknowledged at %s", rec.TxID, rec.DLSN.Text(), want.Text())
		}
		if seen[rec.TxID] {
			t.Fatalf("tx %d read twice", rec.TxID)
		}
		seen[rec.TxID] = true
		if rec.TxID == last {
			break
		}
	}
	for tx := range a.byTx {
		if !seen[tx] {
			t.Fatalf("acknowledged tx %d not read", tx)
		}
	}
}

// TestEntryRefusedByTheClient: a batch the client refuses at once (here: over its frame limit)
// takes no entry id. The batches after it must not take its place with a header that counts its
// records: the writer fails cleanly, and the log stays readable to its end after failover.
func TestEntryRefusedByTheClient(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := clientWith(t, c.MetadataURI(), func(cfg *client.Config) { cfg.Transport.MaxFrameSize = 64 << 10 })
	ncfg := testConfig()
	ncfg.ImmediateFlush = true
	ns := newNamespace(t, cl, ncfg)
	ctx := ctxFor(t, 60*time.Second)
	l, w := createWriting(t, ctx, ns, "refused")
	a := newAcks()
	for tx := int64(1); tx <= 200; tx++ {
		p := payloadFor(tx, 100)
		if tx == 100 {
			p = make([]byte, 100<<10) // under MaxRecordSize, over the client's entry limit
		}
		w.WriteAsync(ctx, Record{TxID: tx, Payload: p}, a.callback(tx))
	}
	a.wg.Wait()
	if !errors.Is(a.failed[100], client.ErrEntryTooLarge) {
		t.Fatalf("tx 100: %v, want ErrEntryTooLarge", a.failed[100])
	}
	w.Close(ctx)
	w2, err := l.OpenWriter(ctx) // recovers the segment
	if err != nil {
		t.Fatal(err)
	}
	d, err := w2.Write(ctx, Record{TxID: 1000, Payload: payloadFor(1000, 100)})
	if err != nil {
		t.Fatal(err)
	}
	a.byTx[1000] = d
	if err := w2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	readAcked(t, ctx, l, a, 1000)
}

// TestAppendsOverTheClientsBoundAreRetried: the client's bound on adds in flight (shared by
// every log of a namespace) refuses some of a writer's entries; the writer sends them again
// later, so every record is acknowledged and read back in place.
func TestAppendsOverTheClientsBoundAreRetried(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := clientWith(t, c.MetadataURI(), func(cfg *client.Config) { cfg.MaxPendingAdds = 4 })
	ncfg := testConfig()
	ncfg.ImmediateFlush = true
	ncfg.MaxInFlightEntries = 8 // more than the client admits
	ns := newNamespace(t, cl, ncfg)
	ctx := ctxFor(t, 60*time.Second)
	l, w := createWriting(t, ctx, ns, "bounded")
	a := newAcks()
	const n = 300
	for tx := int64(1); tx <= n; tx++ {
		w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, 100)}, a.callback(tx))
	}
	a.wg.Wait()
	for tx, err := range a.failed {
		t.Fatalf("%d records failed, e.g. tx %d: %v", len(a.failed), tx, err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	readAcked(t, ctx, l, a, n)
}

// TestTruncateBeyondTheWritersEnd: a truncation point past what the writer has written in its
// segment is refused; it would hide the records written after it from readers.
func TestTruncateBeyondTheWritersEnd(t *testing.T) {
	c := clustertest.Start(t, 3)
	ns := newNamespace(t, newClient(t, c), testConfig())
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "tbe")
	defer w.Close(ctx)
	if _, err := w.Write(ctx, Record{TxID: 1, Payload: payloadFor(1, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Truncate(ctx, DLSN{SegmentSeqNo: 1, EntryID: 1000}); !errors.Is(err, ErrTruncateBeyondEnd) {
		t.Fatalf("truncate at 1/1000/0 with the writer near entry 1: %v, want ErrTruncateBeyondEnd", err)
	}
	d, err := w.Write(ctx, Record{TxID: 2, Payload: payloadFor(2, 10)})
	if err != nil {
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
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for want := int64(1); want <= 2; want++ {
		if rec, err := r.Next(rctx); err != nil || rec.TxID != want {
			t.Fatalf("record %d (the last at %s) from the head: tx %d, %v", want, d.Text(), rec.TxID, err)
		}
	}
}

// TestReaderReturnsRecordsBeforeAFailingEntry: records decoded before an entry that fails
// (here: entries that are not envelopes, appended to the in-progress segment's ledger behind
// the writer's back) are returned first; the error comes when the reader reaches that entry.
func TestReaderReturnsRecordsBeforeAFailingEntry(t *testing.T) {
	// The second carries the first in its LAC.
	ctx, r := readerPastRecords(t, "nexterr", 5, 100, []byte("not an envelope"), []byte("not an envelope"))
	if _, err := r.Next(ctx); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("the entry that is not an envelope: %v, want ErrCorrupt", err)
	}
}

// readerPastRecords writes records 1..n (payloads of size bytes) to a new log through a writer
// that flushes at once, appends raw entries to the in-progress segment's ledger behind the
// writer's back, and returns a reader from the head that has returned records 1..n.
func readerPastRecords(t *testing.T, name string, n int64, size int, raw ...[]byte) (context.Context, *Reader) {
	t.Helper()
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	ncfg := testConfig()
	ncfg.ImmediateFlush = true
	ns := newNamespace(t, cl, ncfg)
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, name)
	t.Cleanup(func() { w.Close(ctx) })
	for tx := int64(1); tx <= n; tx++ {
		if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, size)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	segs, err := l.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lh, err := cl.ReopenLedgerForWrite(ctx, segs[len(segs)-1].LedgerID, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range raw {
		if _, err := lh.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	for tx := int64(1); tx <= n; tx++ {
		if rec, err := r.Next(ctx); err != nil || rec.TxID != tx {
			t.Fatalf("record %d: tx %d, %v", tx, rec.TxID, err)
		}
	}
	return ctx, r
}

// appliedButFailedKV applies the next commit that creates a segment key, then reports it failed,
// as a commit whose answer was lost (a timeout) does.
type appliedButFailedKV struct {
	metadata.KV
	armed atomic.Bool
}

var errLostAnswer = errors.New("test: the commit's answer was lost")

func (k *appliedButFailedKV) Commit(ctx context.Context, guard metadata.Lock, ops ...metadata.KVOp) (metadata.Version, error) {
	v, err := k.KV.Commit(ctx, guard, ops...)
	for _, op := range ops {
		if err == nil && op.Expected == metadata.NoVersion && strings.HasPrefix(op.Key, segmentsPrefix) && k.armed.CompareAndSwap(true, false) {
			return 0, errLostAnswer
		}
	}
	return v, err
}

// TestSegmentCommitThatAppliedKeepsItsLedger: a segment commit that applied although it
// reported an error must not have its ledger deleted (the segment would name a ledger that is
// gone, and every later writer and reader of the log would stop there).
func TestSegmentCommitThatAppliedKeepsItsLedger(t *testing.T) {
	kv := &appliedButFailedKV{}
	checkLostSegmentCommit(t, "lost", "with the segment commit's answer lost", kv, &kv.KV, &kv.armed, nil)
}

// checkLostSegmentCommit opens the first writer of a new log through kv, whose inner KV it
// sets (inner) and whose next segment-creating commit it arms: that OpenWriter must fail with
// errLostAnswer; check, if set, then looks at the log; the next writer must recover it and
// write.
func checkLostSegmentCommit(t *testing.T, name, what string, kv metadata.KV, inner *metadata.KV, armed *atomic.Bool,
	check func(ctx context.Context, cl *client.Client, l *Log)) {
	t.Helper()
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	ns := newNamespace(t, cl, testConfig())
	*inner = ns.kv
	ns.kv = kv
	ctx := ctxFor(t, 30*time.Second)
	l, err := ns.CreateLog(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	if w, err := l.OpenWriter(ctx); !errors.Is(err, errLostAnswer) {
		if err == nil {
			w.Close(ctx)
		}
		t.Fatalf("OpenWriter %s: %v", what, err)
	}
	if check != nil {
		check(ctx, cl, l)
	}
	w, err := l.OpenWriter(ctx) // recovers the segment the first one started, if any
	if err != nil {
		t.Fatalf("the next writer: %v", err)
	}
	if _, err := w.Write(ctx, Record{TxID: 1, Payload: payloadFor(1, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// lateAppliedKV reports the next commit that creates a segment key failed without applying it,
// and applies it right after the writer's next Get or Commit, as a request that reached etcd
// after its answer was given up on does (its own version checks still apply).
type lateAppliedKV struct {
	metadata.KV
	armed atomic.Bool
	mu    sync.Mutex
	late  func()
}

func (k *lateAppliedKV) applyLate() {
	k.mu.Lock()
	late := k.late
	k.late = nil
	k.mu.Unlock()
	if late != nil {
		late()
	}
}

func (k *lateAppliedKV) Get(ctx context.Context, key string) (metadata.KeyValue, error) {
	defer k.applyLate()
	return k.KV.Get(ctx, key)
}

func (k *lateAppliedKV) Commit(ctx context.Context, guard metadata.Lock, ops ...metadata.KVOp) (metadata.Version, error) {
	for _, op := range ops {
		if op.Expected == metadata.NoVersion && strings.HasPrefix(op.Key, segmentsPrefix) && k.armed.CompareAndSwap(true, false) {
			k.mu.Lock()
			k.late = func() { _, _ = k.KV.Commit(context.Background(), guard, ops...) }
			k.mu.Unlock()
			return 0, errLostAnswer
		}
	}
	defer k.applyLate()
	return k.KV.Commit(ctx, guard, ops...)
}

// TestSegmentCommitAppliedLateLeavesNoSegmentWithoutItsLedger: a segment commit reported
// failed that reaches etcd later must not leave a segment naming a ledger that was deleted:
// the writer settles the commit's fate before deleting the ledger (a read could not: it
// found no segment, then the commit applied).
func TestSegmentCommitAppliedLateLeavesNoSegmentWithoutItsLedger(t *testing.T) {
	kv := &lateAppliedKV{}
	checkLostSegmentCommit(t, "late", "with the segment commit applied late", kv, &kv.KV, &kv.armed,
		func(ctx context.Context, cl *client.Client, l *Log) {
			segs, err := l.Segments(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range segs {
				if _, err := cl.OpenLedger(ctx, s.LedgerID, nil, false); err != nil {
					t.Fatalf("segment %d names ledger %d: %v", s.SeqNo, s.LedgerID, err)
				}
			}
		})
}
