package client

import (
	"context"
	"sync"
	"testing"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// BenchmarkAppendPipelined appends 1 KiB entries to a (1,1,1) ledger on an in-process bookie
// with inFlight appends in flight, each callback sending the next (as bench write's closed
// loop). allocs/op counts the whole process, bookie included: the add path should not allocate
// in steady state.
func BenchmarkAppendPipelined(b *testing.B) {
	const inFlight = 256
	c := clustertest.Start(b, 1)
	cl := newClient(b, c, nil)
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
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	run(b.N)
}
