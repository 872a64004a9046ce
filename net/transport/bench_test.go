package transport

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// benchSlot is one in-flight add of a benchmark: its own header buffer (the entry parts must
// stay unchanged until the callback), reused once its callback has run.
type benchSlot struct {
	hdr   [protocol.StoredEntryHeaderSize]byte
	parts [][]byte
}

// BenchmarkAddPipelined measures adds of 1 KiB entries through one connection to a
// server.Server over a MemStorage (no fsync, payloads dropped) on loopback, with a fixed
// number of adds in flight. allocs/op is the transport's steady-state allocation per add
// (plus whatever the in-process server allocates).
func BenchmarkAddPipelined(b *testing.B) {
	for _, inflight := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("inflight=%d", inflight), func(b *testing.B) {
			bk := startBookie(b, func(_ *server.Config, st *servertest.MemStorage) { st.DropPayloads = true })
			p := newPool(b, Config{})
			conn := p.Conn(bk.addr)
			payload := make([]byte, 1024)
			free := make(chan *benchSlot, inflight)
			for range inflight {
				s := &benchSlot{}
				s.parts = [][]byte{s.hdr[:], payload}
				free <- s
			}
			var failures atomic.Int64
			cb := func(ctx any, rc protocol.ReturnCode, err error) {
				if err != nil || rc != protocol.EOK {
					failures.Add(1)
				}
				free <- ctx.(*benchSlot)
			}
			const ledger = 1
			add := func(entryID int64) {
				s := <-free
				protocol.AppendEntryHeader(s.hdr[:0], protocol.EntryHeader{LedgerID: ledger, EntryID: entryID,
					LastAddConfirmed: entryID - 1, Length: (entryID + 1) * int64(len(payload))})
				conn.Add(ledger, entryID, &keyA, 0, s.parts, cb, s)
			}
			// Warm up: connect, grow the buffers and the pending map.
			for e := range int64(2 * inflight) {
				add(e)
			}
			next := int64(2 * inflight)
			before := conn.Stats()
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				add(next)
				next++
			}
			for range inflight { // wait for the adds in flight
				<-free
			}
			b.StopTimer()
			if n := failures.Load(); n > 0 {
				b.Fatalf("%d adds failed", n)
			}
			after := conn.Stats()
			if w := after.Writes - before.Writes; w > 0 {
				b.ReportMetric(float64(after.Requests-before.Requests)/float64(w), "adds/write")
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "adds/s")
		})
	}
}

// BenchmarkReadPipelined measures reads of 1 KiB entries answered from the bookie's cache
// (MemStorage), with 1000 in flight.
func BenchmarkReadPipelined(b *testing.B) {
	const (
		inflight = 1000
		entries  = 4096
	)
	bk := startBookie(b)
	p := newPool(b, Config{})
	conn := p.Conn(bk.addr)
	col := newCollector(entries)
	for e := range int64(entries) {
		conn.Add(1, e, &keyA, 0, parts(1, e, make([]byte, 1024)), col.onAdd, nil)
	}
	col.wait(b, entries)
	sem := make(chan struct{}, inflight)
	var failures atomic.Int64
	cb := func(_ any, rc protocol.ReturnCode, entry []byte, err error) {
		if err != nil || rc != protocol.EOK || len(entry) != 1024+protocol.StoredEntryHeaderSize {
			failures.Add(1)
		}
		<-sem
	}
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		sem <- struct{}{}
		conn.Read(1, int64(i%entries), 0, nil, cb, nil)
	}
	for range inflight {
		sem <- struct{}{}
	}
	b.StopTimer()
	if n := failures.Load(); n > 0 {
		b.Fatalf("%d reads failed", n)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reads/s")
}

// BenchmarkRawAddSerial is the baseline for BenchmarkAddPipelined/inflight=1: the blocking
// servertest.Client (no transport) doing one add at a time against the same server.
func BenchmarkRawAddSerial(b *testing.B) {
	bk := startBookie(b, func(_ *server.Config, st *servertest.MemStorage) { st.DropPayloads = true })
	c, err := servertest.Dial(bk.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	e := servertest.Entry(1, 0, -1, make([]byte, 1024))
	b.SetBytes(1024)
	b.ReportAllocs()
	for i := range b.N {
		protocol.AppendEntryHeader(e[:0], protocol.EntryHeader{LedgerID: 1, EntryID: int64(i)})
		if rc, err := c.Add(keyA, e, 0); err != nil || rc != protocol.EOK {
			b.Fatal(rc, err)
		}
	}
}
