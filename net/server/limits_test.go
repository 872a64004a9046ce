package server

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

func recvCodes(t *testing.T, c *servertest.Client, n int) map[protocol.ReturnCode][]int64 {
	t.Helper()
	got := make(map[protocol.ReturnCode][]int64)
	for range n {
		resp, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		switch resp.Header.Op {
		case protocol.OpAddEntry:
			got[resp.Add.RC] = append(got[resp.Add.RC], resp.Add.EntryID)
		case protocol.OpReadEntry:
			got[resp.Read.RC] = append(got[resp.Read.RC], resp.Read.EntryID)
		default:
			t.Fatalf("unexpected response %v", resp.Header.Op)
		}
	}
	return got
}

func TestPerConnectionAddLimit(t *testing.T) {
	opts := []envOption{withConfig(func(c *Config) { c.MaxPendingAddRequestsPerThread = 4 })}
	transports(t, opts, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c, other := dial(), dial()
		env.storage.Hold()
		for i := range int64(10) {
			_ = c.SendAdd(keyA, entry(1, i, "x"), 0)
		}
		_ = c.Flush()
		// The six over the limit are answered at once, while four wait in storage.
		got := recvCodes(t, c, 6)
		if len(got[protocol.ETOOMANYREQUESTS]) != 6 {
			t.Fatalf("first responses: %v, want 6 ETOOMANYREQUESTS", got)
		}
		for _, id := range got[protocol.ETOOMANYREQUESTS] {
			if id < 4 {
				t.Fatalf("entry %d rejected; the first four should be in flight", id)
			}
		}
		// Another connection has its own budget.
		_ = other.SendAdd(keyA, entry(2, 0, "y"), 0)
		_ = other.Flush()
		env.storage.Release()
		if got := recvCodes(t, c, 4); len(got[protocol.EOK]) != 4 {
			t.Fatalf("held adds: %v, want 4 EOK", got)
		}
		if got := recvCodes(t, other, 1); len(got[protocol.EOK]) != 1 {
			t.Fatalf("other connection: %v", got)
		}
		if st := env.srv.Stats(); st.Rejected != 6 || st.AddsInFlight != 0 {
			t.Fatalf("Rejected %d AddsInFlight %d", st.Rejected, st.AddsInFlight)
		}
	})
}

func TestGlobalAddLimit(t *testing.T) {
	env := startEnv(t, withConfig(func(c *Config) { c.MaxAddsInProgressLimit = 3 }))
	c1, c2 := env.dial(t), env.dial(t)
	env.storage.Hold()
	_ = c1.SendAdd(keyA, entry(1, 0, "x"), 0)
	_ = c1.SendAdd(keyA, entry(1, 1, "x"), 0)
	_ = c1.Flush()
	eventually(t, 5*time.Second, "two adds in flight", func() bool { return env.srv.Stats().AddsInFlight == 2 })
	_ = c2.SendAdd(keyA, entry(2, 0, "x"), 0)
	_ = c2.SendAdd(keyA, entry(2, 1, "x"), 0)
	_ = c2.Flush()
	if got := recvCodes(t, c2, 1); len(got[protocol.ETOOMANYREQUESTS]) != 1 || got[protocol.ETOOMANYREQUESTS][0] != 1 {
		t.Fatalf("over the global limit: %v", got)
	}
	env.storage.Release()
	if got := recvCodes(t, c1, 2); len(got[protocol.EOK]) != 2 {
		t.Fatalf("c1: %v", got)
	}
	if got := recvCodes(t, c2, 1); len(got[protocol.EOK]) != 1 {
		t.Fatalf("c2: %v", got)
	}
}

// blockReads makes the storage's reads wait until the returned release function is called;
// entered receives once per read that started.
func blockReads(st *servertest.MemStorage) (entered chan struct{}, release func()) {
	gate := make(chan struct{})
	entered = make(chan struct{}, 100)
	st.SetReadHook(func(int64, int64) {
		entered <- struct{}{}
		<-gate
	})
	var once sync.Once
	return entered, func() { once.Do(func() { close(gate) }) }
}

func TestReadLimits(t *testing.T) {
	cases := []struct {
		name string
		cfg  func(*Config)
	}{
		{"worker queue", func(c *Config) { c.NumReadWorkerThreads = 1; c.ReadWorkerQueueSize = 1 }},
		{"per connection", func(c *Config) { c.MaxPendingReadRequestsPerThread = 2 }},
		{"global", func(c *Config) { c.MaxReadsInProgressLimit = 2 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := startEnv(t, withConfig(tc.cfg), withStorage(func(st *servertest.MemStorage) { st.DisableCache = true }))
			c := env.dial(t)
			mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
			entered, release := blockReads(env.storage)
			defer release()
			_ = c.SendRead(1, 0, 0, nil)
			_ = c.Flush()
			<-entered
			for range 4 {
				_ = c.SendRead(1, 0, 0, nil)
			}
			_ = c.Flush()
			got := recvCodes(t, c, 3)
			if len(got[protocol.ETOOMANYREQUESTS]) != 3 {
				t.Fatalf("%v, want 3 ETOOMANYREQUESTS while two reads are held", got)
			}
			release()
			if got := recvCodes(t, c, 2); len(got[protocol.EOK]) != 2 {
				t.Fatalf("held reads: %v", got)
			}
			eventually(t, 5*time.Second, "reads drained", func() bool { return env.srv.Stats().ReadsInFlight == 0 })
		})
	}
}

// TestSlowClientDisconnected: a client that pipelines adds but never reads its responses.
// Once its responses back up past MaxOutboundBytesPerConnection the server stops decoding; gnet
// keeps reading the socket, and when the unprocessed bytes pass MaxInboundBytesPerConnection
// the connection is closed. Meanwhile the outbound backlog stays near its limit and other
// clients are served.
func TestSlowClientDisconnected(t *testing.T) {
	const (
		outLimit   = 64 << 10
		inLimit    = 1 << 20
		maxPending = 1000
	)
	env := startEnv(t, withConfig(func(c *Config) {
		c.MaxOutboundBytesPerConnection = outLimit
		c.MaxInboundBytesPerConnection = inLimit
		c.MaxFrameSize = 256 << 10
		c.ReadBufferCap = 64 << 10
		c.MaxPendingAddRequestsPerThread = maxPending
		c.SocketSendBufferBytes = 16 << 10 // less kernel buffering of responses: a faster test
	}), withStorage(func(st *servertest.MemStorage) { st.DropPayloads = true }))

	nc, err := net.Dial("tcp", env.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	good := env.dial(t)

	// Write adds (never reading) until the server hangs up.
	var chunk []byte
	for i := range int64(64) {
		b, err := protocol.AppendAddRequest(nil, protocol.AddRequest{Header: protocol.Header{Version: 2},
			MasterKey: keyA, Entry: entry(1, i, string(make([]byte, 1024)))})
		if err != nil {
			t.Fatal(err)
		}
		chunk = append(chunk, b...)
	}
	var written int64
	deadline := time.Now().Add(20 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("server did not disconnect the slow client after %d bytes; stats %+v", written, env.srv.Stats())
		}
		_ = nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
		n, err := nc.Write(chunk)
		written += int64(n)
		if err != nil {
			if servertest.IsClosedErr(err) {
				break
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue // the kernel buffers are full; the server is still deciding
			}
			t.Fatalf("write: %v", err)
		}
		// Every so often, check the well-behaved client is still served.
		if written%(4<<20) < int64(len(chunk)) {
			mustAdd(t, good, keyA, entry(2, written, "ok"), 0, protocol.EOK)
		}
	}
	st := env.srv.Stats()
	t.Logf("slow client wrote %d bytes before being closed; stats %+v", written, st)
	if st.SlowClientCloses != 1 || st.Pauses < 1 {
		t.Fatalf("SlowClientCloses %d Pauses %d, want 1 and ≥ 1", st.SlowClientCloses, st.Pauses)
	}
	// The backlog can pass the limit by the responses of adds already in flight and one
	// immediate response.
	if bound := int64(outLimit + maxPending*(protocol.LengthPrefixSize+protocol.ResponseHeaderSize) + 64<<10); st.MaxOutbound > bound {
		t.Fatalf("MaxOutbound %d > %d", st.MaxOutbound, bound)
	}
	mustAdd(t, good, keyA, entry(2, 1, "still ok"), 0, protocol.EOK)
}

// TestSlowClientTLS: on the TLS path the reader stops reading while responses back up, so the
// client's writes block (TCP backpressure) instead of growing the server's memory.
func TestSlowClientTLS(t *testing.T) {
	env := startEnv(t, withTLS(), withConfig(func(c *Config) {
		c.MaxOutboundBytesPerConnection = 64 << 10
	}), withStorage(func(st *servertest.MemStorage) { st.DropPayloads = true }))
	c := env.dialTLS(t)
	var written atomic.Int64
	payload := string(make([]byte, 1024))
	c.Timeout = -1
	_ = c.Conn().SetWriteDeadline(time.Now().Add(20 * time.Second))
	done := make(chan error, 1)
	go func() {
		for i := int64(0); ; i++ {
			if err := c.SendAdd(keyA, entry(1, i, payload), 0); err != nil {
				done <- err
				return
			}
			written.Add(1)
		}
	}()
	// Wait until the writer makes no progress for a while: it is blocked by TCP.
	var last int64 = -1
	for {
		time.Sleep(300 * time.Millisecond)
		n := written.Load()
		if n == last {
			break
		}
		last = n
		if n > 200_000 {
			t.Fatalf("client wrote %d adds without being slowed down", n)
		}
	}
	st := env.srv.Stats()
	t.Logf("TLS client blocked after %d adds; stats %+v", last, st)
	if st.PausedNow != 1 || st.ResponsesQueued*(protocol.LengthPrefixSize+protocol.ResponseHeaderSize) < 64<<10 {
		t.Errorf("the reader is not paused by its outbound backlog: %+v", st)
	}
	_ = c.Close()
	if err := <-done; err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writer ended with %v; it should have been blocked until the close", err)
	}
}
