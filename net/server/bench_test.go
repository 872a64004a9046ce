package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// BenchmarkAddLoopback: N connections each pipelining 1 KiB adds (up to 256 in flight per
// connection) against MemStorage over loopback. allocs/op counts the whole process (the
// client side allocates nothing per add), so it is the server's cost per add plus the fake
// storage's.
func BenchmarkAddLoopback(b *testing.B) {
	for _, conns := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) {
			benchAdds(b, conns, 256, 1024)
		})
	}
}

// BenchmarkAddUnpipelined: one add in flight on one connection, so every add's response is
// queued on an empty queue and wakes the event loop: allocs/op is the cost of one add plus one
// wake (BenchmarkAddLoopback amortises the wake over a flush of about a hundred responses).
func BenchmarkAddUnpipelined(b *testing.B) {
	benchAdds(b, 1, 1, 1024)
}

func benchAdds(b *testing.B, conns, window, payload int) {
	st := servertest.NewMemStorage()
	st.DropPayloads = true
	srv, err := New(Config{Addr: "127.0.0.1:0", ErrorCode: servertest.ErrorCode, Logger: testLogger()}, st)
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
		st.Close()
	}()

	ncs := make([]net.Conn, conns)
	for i := range ncs {
		nc, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		ncs[i] = nc
	}
	per := make([]int, conns)
	b.ReportAllocs()
	b.SetBytes(int64(payload))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs
	b.ResetTimer()
	for i := range b.N {
		per[i%conns]++
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*conns)
	for i, nc := range ncs {
		wg.Add(2)
		tokens := make(chan struct{}, window)
		for range window {
			tokens <- struct{}{}
		}
		go func() { defer wg.Done(); errs <- benchWriter(nc, int64(i+1), per[i], payload, tokens) }()
		go func() { defer wg.Done(); errs <- benchReader(nc, per[i], tokens) }()
	}
	wg.Wait()
	b.StopTimer()
	runtime.ReadMemStats(&ms)
	// allocs/op rounds down: with a wake per flush of ~100 responses it reads 0.
	b.ReportMetric(float64(ms.Mallocs-mallocs)/float64(b.N), "mallocs/add")
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "adds/s")
	st2 := srv.Stats()
	if st2.Flushes > 0 {
		b.ReportMetric(float64(st2.ResponsesQueued)/float64(st2.Flushes), "responses/flush")
	}
}

func benchWriter(nc net.Conn, ledgerID int64, n, payload int, tokens chan struct{}) error {
	frame, err := protocol.AppendAddRequest(nil, protocol.AddRequest{Header: protocol.Header{Version: 2},
		MasterKey: keyA, Entry: servertest.Entry(ledgerID, 0, -1, make([]byte, payload))})
	if err != nil {
		return err
	}
	const entryIDOffset = protocol.LengthPrefixSize + protocol.HeaderSize + protocol.MasterKeyLength + 8
	bw := bufio.NewWriterSize(nc, 64<<10)
	for i := range n {
		select {
		case <-tokens:
		default:
			if err := bw.Flush(); err != nil {
				return err
			}
			<-tokens
		}
		binary.BigEndian.PutUint64(frame[entryIDOffset:], uint64(i))
		if _, err := bw.Write(frame); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func benchReader(nc net.Conn, n int, tokens chan struct{}) error {
	br := bufio.NewReaderSize(nc, 64<<10)
	var buf [protocol.LengthPrefixSize + protocol.ResponseHeaderSize]byte
	for range n {
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			return err
		}
		if rc := protocol.ReturnCode(binary.BigEndian.Uint32(buf[8:])); rc != protocol.EOK {
			return fmt.Errorf("add answered %v", rc)
		}
		tokens <- struct{}{}
	}
	return nil
}
