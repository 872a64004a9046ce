package client

import (
	"context"
	"sync"
	"testing"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// BenchmarkAppendPipelined appends 1 KiB entries to a (1,1,1) ledger on an in-process bookie
// with inFlight appends in flight, each callback sending the next (as bench write's closed
// loop). allocs/op counts the whole process, bookie included: the add path should not allocate
// in steady state.
func BenchmarkAppendPipelined(b *testing.B) {
	const inFlight = 256
	c := clustertest.Start(b, 1)
	var conn *transport.Conn
	cl := newClient(b, c, func(_ string, bc bookieConn) bookieConn {
		conn = bc.(transportConn).Conn
		return bc
	})
	ctx := context.Background()
	lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 1, WriteQuorum: 1, AckQuorum: 1})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 1024)
	var wg sync.WaitGroup
	var mu sync.Mutex
	left := 0
	var done func(int64, error)
	done = func(_ int64, err error) {
		if err != nil {
			b.Error(err)
		}
		mu.Lock()
		send := left > 0
		if send {
			left--
		}
		mu.Unlock()
		if send {
			lh.AppendAsync(payload, done)
			return
		}
		wg.Done()
	}
	run := func(n int) {
		left = n
		wg.Add(inFlight)
		for range inFlight {
			lh.AppendAsync(payload, done)
		}
		wg.Wait()
	}
	run(20 * inFlight) // warm the pools and caches
	before := conn.Stats()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	if after := conn.Stats(); after.Writes > before.Writes {
		b.ReportMetric(float64(after.Requests-before.Requests)/float64(after.Writes-before.Writes), "adds/write")
	}
}

// loopbackConn answers adds itself, a batch at a time, on the goroutine that calls answer: the
// client's add path (response, ordered delivery, callback, next append) without a network.
type loopbackConn struct {
	adds, answering []loopbackAdd
}

type loopbackAdd struct {
	cb  transport.AddCallback
	ctx any
}

func (l *loopbackConn) Add(_, _ int64, _ *[20]byte, _ protocol.Flags, _ [][]byte, cb transport.AddCallback, ctx any) {
	l.adds = append(l.adds, loopbackAdd{cb, ctx})
}

func (l *loopbackConn) Read(_ context.Context, _, _ int64, _ protocol.Flags, _ *[20]byte, cb transport.ReadCallback, ctx any) {
	cb(ctx, protocol.ENOENTRY, nil, nil)
}

// answer acknowledges every add queued so far (those its callbacks queue wait for the next call).
func (l *loopbackConn) answer() int {
	batch := l.adds
	l.adds = l.answering[:0]
	for _, a := range batch {
		a.cb(a.ctx, protocol.EOK, nil)
	}
	clear(batch)
	l.answering = batch
	return len(batch)
}

// BenchmarkLedgerAddPath is the client's own CPU per add at (1,1,1) with 1000 in flight: the
// ledger's part of what a transport reader runs per response (the acknowledgement, ordered
// delivery, the callback's next append with its digest), without the transport. At (1,1,1)
// the reader's time per response bounds the client's throughput: see BENCHMARKS.md.
func BenchmarkLedgerAddPath(b *testing.B) {
	const inFlight = 1000
	c := clustertest.Start(b, 1)
	conn := &loopbackConn{}
	cl := newClient(b, c, func(string, bookieConn) bookieConn { return conn })
	lh, err := cl.CreateLedger(context.Background(), CreateOptions{EnsembleSize: 1, WriteQuorum: 1, AckQuorum: 1})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 1024)
	left := 0
	var done func(int64, error)
	done = func(_ int64, err error) {
		if err != nil {
			b.Fatal(err)
		}
		if left > 0 {
			left--
			lh.AppendAsync(payload, done)
		}
	}
	run := func(n int) {
		left = n
		for range inFlight {
			lh.AppendAsync(payload, done)
		}
		for conn.answer() > 0 {
		}
	}
	run(20 * inFlight)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	run(b.N)
}
