package dlog

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// revokeLocks revokes the leases of every lock of the cluster, as etcd does when a lease
// expires (keys per the layout in package metadata: <root>/locks/...).
func revokeLocks(t *testing.T, uri string) {
	t.Helper()
	u, err := metadata.ParseURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	var endpoints []string
	for _, h := range u.Hosts {
		endpoints = append(endpoints, "http://"+h)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := ctxFor(t, 10*time.Second)
	resp, err := cli.Get(ctx, u.Root+"/locks/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if !strings.Contains(string(kv.Key), "failover") {
			continue
		}
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
			t.Fatal(err)
		}
		t.Logf("revoked the lease of %s", kv.Key)
	}
}

// producer writes records asynchronously from its own goroutine, from txid start on, until
// stopped, remembering what it attempted and how each attempt ended.
type producer struct {
	w    *Writer
	size int
	a    *acks
	stop chan struct{}
	done chan struct{}
	// mu guards attempted and lastTx.
	mu        sync.Mutex
	attempted map[int64]bool
	lastTx    int64
}

func startProducer(ctx context.Context, w *Writer, start int64, size int, pause time.Duration) *producer {
	p := &producer{w: w, size: size, a: newAcks(), stop: make(chan struct{}), done: make(chan struct{}), attempted: map[int64]bool{}}
	go func() {
		defer close(p.done)
		for tx := start; ; tx++ {
			select {
			case <-p.stop:
				return
			default:
			}
			p.mu.Lock()
			p.attempted[tx] = true
			p.lastTx = tx
			p.mu.Unlock()
			p.w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, size)}, p.a.callback(tx))
			if pause > 0 && tx%16 == 0 {
				time.Sleep(pause)
			}
		}
	}()
	return p
}

// halt stops the producer and waits for every callback.
func (p *producer) halt() {
	close(p.stop)
	<-p.done
	p.a.wg.Wait()
}

// readAll reads the whole log from the head, once every segment is completed: as many
// records as the segments hold.
func readAll(t *testing.T, ctx context.Context, l *Log) []Record {
	t.Helper()
	segs, err := l.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := int64(0)
	for _, s := range segs {
		if s.State != Completed {
			t.Fatalf("segment %d is %v", s.SeqNo, s.State)
		}
		total += s.RecordCount
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := make([]Record, 0, total)
	for range total {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("after %d of %d records: %v", len(out), total, err)
		}
		out = append(out, rec)
	}
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if rec, err := r.Next(rctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a record past the segments' %d: tx %d, %v", total, rec.TxID, err)
	}
	return out
}

// checkLog checks a log read back against what the writers did: records strictly increasing
// in txid and DLSN (no duplicates, no reordering), each one attempted by some writer, each
// acknowledged record present at its acknowledged DLSN.
func checkLog(t *testing.T, recs []Record, size int, attempted func(int64) bool, acked ...map[int64]DLSN) {
	t.Helper()
	at := map[int64]DLSN{}
	for i, r := range recs {
		if i > 0 && (r.TxID <= recs[i-1].TxID || !recs[i-1].DLSN.Less(r.DLSN)) {
			t.Fatalf("record %d: tx %d at %s after tx %d at %s", i, r.TxID, r.DLSN.Text(), recs[i-1].TxID, recs[i-1].DLSN.Text())
		}
		if !attempted(r.TxID) {
			t.Fatalf("record tx %d was never written", r.TxID)
		}
		if err := checkPayload(r, size); err != nil {
			t.Fatal(err)
		}
		at[r.TxID] = r.DLSN
	}
	n := 0
	for _, m := range acked {
		for tx, d := range m {
			got, ok := at[tx]
			if !ok {
				t.Fatalf("acknowledged record tx %d (at %s) is missing", tx, d.Text())
			}
			if got != d {
				t.Fatalf("record tx %d read at %s, acknowledged at %s", tx, got.Text(), d.Text())
			}
			n++
		}
	}
	t.Logf("%d records read, %d acknowledged ones among them", len(recs), n)
}

// TestWriterFailover kills the first writer mid-stream and opens a second writer on another
// client. In "lock lost" the first writer's process is cut off from the metadata service (its
// driver is closed: the lock's lease is no longer kept alive and expires; its bookie
// connections stay up), and the writer notices the lost lock. In "fencing only" the lease is
// revoked under a writer that ignores the loss and keeps writing, so that only ledger fencing
// can stop it. Either way its writes after the takeover fail, and every acknowledged record of
// both writers is in the log, in order, once.
func TestWriterFailover(t *testing.T) {
	for _, ignoreLock := range []bool{false, true} {
		name := "lock lost"
		if ignoreLock {
			name = "fencing only"
		}
		t.Run(name, func(t *testing.T) { testWriterFailover(t, ignoreLock) })
	}
}

func testWriterFailover(t *testing.T, ignoreLock bool) {
	c := clustertest.Start(t, 3)
	cl1, cl2 := newClient(t, c), newClient(t, c)
	cfg := testConfig()
	cfg.MaxLogSegmentBytes = 64 << 10
	if ignoreLock {
		cfg.MaxLogSegmentBytes = 1 << 30 // no roll: the writer's next metadata write would fail on the lock
	}
	ns1, ns2 := newNamespace(t, cl1, cfg), newNamespace(t, cl2, cfg)
	ctx := ctxFor(t, 60*time.Second)
	const size = 40
	l1, err := ns1.CreateLog(ctx, "failover")
	if err != nil {
		t.Fatal(err)
	}
	ns1.ignoreLockLoss = ignoreLock
	w1, err := l1.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p1 := startProducer(ctx, w1, 1, size, time.Millisecond)
	time.Sleep(300 * time.Millisecond)

	if ignoreLock {
		revokeLocks(t, c.MetadataURI())
	} else {
		// The first writer's process is cut off from etcd.
		cl1.Metadata().Close()
		select {
		case <-w1.lock.Lost():
		case <-time.After(5 * time.Second):
			t.Fatal("lock not lost")
		}
	}
	l2, err := ns2.OpenLog(ctx, "failover")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	w2, err := l2.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// From now on the first writer gets no acknowledgement: a record written now fails.
	p1.mu.Lock()
	takeover := p1.lastTx
	p1.mu.Unlock()
	t.Logf("second writer took over after %v; the first had attempted up to tx %d", time.Since(start), takeover)
	time.Sleep(100 * time.Millisecond)
	p1.halt()
	late := 0
	for tx, err := range p1.a.failed {
		if tx <= takeover {
			continue
		}
		late++
		want := ErrLockLost
		if ignoreLock {
			want = ErrFenced
		}
		if !errors.Is(err, want) {
			t.Fatalf("first writer's tx %d failed with %v", tx, err)
		}
	}
	for tx := range p1.a.byTx {
		if tx > takeover {
			t.Fatalf("first writer's tx %d, written after the takeover, was acknowledged", tx)
		}
	}
	if _, err := w1.Write(ctx, Record{TxID: p1.lastTx + 1, Payload: payloadFor(p1.lastTx+1, size)}); err == nil {
		t.Fatal("the first writer's write after the takeover succeeded")
	} else if ignoreLock && !errors.Is(err, ErrFenced) {
		t.Fatalf("fencing only: the first writer's write failed with %v", err)
	} else {
		t.Logf("first writer after the takeover: %v", err)
	}
	t.Logf("first writer: %d acknowledged, %d failed (%d written after the takeover)", len(p1.a.byTx), len(p1.a.failed), late)
	if len(p1.a.byTx) == 0 {
		t.Fatal("the first writer had no acknowledged record")
	}

	// The second writer continues after everything recovery kept.
	if w2.LastTxID() < maxKey(p1.a.byTx) {
		t.Fatalf("second writer's last txid %d is below the first's last acknowledged %d", w2.LastTxID(), maxKey(p1.a.byTx))
	}
	p2 := startProducer(ctx, w2, w2.LastTxID()+1, size, time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	p2.halt()
	if len(p2.a.failed) > 0 || len(p2.a.byTx) == 0 {
		t.Fatalf("second writer: %d acknowledged, %d failed", len(p2.a.byTx), len(p2.a.failed))
	}
	if err := w2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Every acknowledgement of the first writer is in an earlier segment than the second's.
	first2 := minDLSN(p2.a.byTx)
	for tx, d := range p1.a.byTx {
		if d.SegmentSeqNo >= first2.SegmentSeqNo {
			t.Fatalf("first writer's tx %d acknowledged at %s, the second writer starts at %s", tx, d.Text(), first2.Text())
		}
	}
	w1.Close(ctx)

	recs := readAll(t, ctx, l2)
	attempted := func(tx int64) bool {
		return p1.attempted[tx] || p2.attempted[tx] || tx == p1.lastTx+1
	}
	checkLog(t, recs, size, attempted, p1.a.byTx, p2.a.byTx)
}

func maxKey(m map[int64]DLSN) int64 {
	best := int64(-1)
	for k := range m {
		best = max(best, k)
	}
	return best
}

func minDLSN(m map[int64]DLSN) DLSN {
	first := true
	var best DLSN
	for _, d := range m {
		if first || d.Less(best) {
			best, first = d, false
		}
	}
	return best
}
