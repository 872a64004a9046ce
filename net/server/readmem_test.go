package server

import (
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/bytebufferpool"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// dialSmallRecv connects with a small SO_RCVBUF (set before connect, so the TCP window stays
// small) and never reads: a slow reader.
func dialSmallRecv(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		}); err != nil {
			return err
		}
		return serr
	}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// heldResponseBytes is the response bytes the server holds for its connections: queued, or in
// gnet's outbound buffer as of the last flush.
func heldResponseBytes(s *Server) int64 {
	var total int64
	s.mu.Lock()
	for cc := range s.conns {
		total += cc.outbound()
	}
	s.mu.Unlock()
	return total
}

// sendReadsOneAtATime sends n reads of ledger 1 entry 0 on each connection, round robin, each
// once the previous one has been served, so that no count limit refuses anything by itself.
func sendReadsOneAtATime(t *testing.T, env *testEnv, ncs []net.Conn, n int) {
	t.Helper()
	req := protocol.AppendReadRequest(nil, protocol.ReadRequest{
		Header: protocol.Header{Version: protocol.CurrentVersion}, LedgerID: 1, EntryID: 0})
	for range n {
		for _, nc := range ncs {
			if _, err := nc.Write(req); err != nil {
				t.Fatal(err)
			}
			// Let the server decode it (a paused connection does not) and a worker serve it.
			time.Sleep(10 * time.Millisecond)
			eventually(t, 5*time.Second, "read served", func() bool { return env.srv.Stats().ReadsInFlight == 0 })
		}
	}
}

// TestUnwrittenReadBytesBoundedOverall: many connections, each a slow reader issuing reads of
// a large entry. Each connection's backlog is bounded by MaxOutboundBytesPerConnection, and the
// sum over connections by MaxUnwrittenReadBytes: reads that do not fit are answered
// ETOOMANYREQUESTS, so the server's memory does not grow with the number of connections.
func TestUnwrittenReadBytesBoundedOverall(t *testing.T) {
	const (
		entrySize    = 256 << 10
		perConnOut   = 1 << 20
		budget       = 2 << 20
		conns        = 16
		readsPerConn = 8
	)
	env := startEnv(t, withConfig(func(c *Config) {
		c.MaxFrameSize = 1 << 20
		c.MaxOutboundBytesPerConnection = perConnOut
		c.MaxUnwrittenReadBytes = budget
		c.SocketSendBufferBytes = 4 << 10
	}), withStorage(func(st *servertest.MemStorage) { st.DisableCache = true }))
	c := env.dial(t)
	mustAdd(t, c, keyA, entry(1, 0, string(make([]byte, entrySize))), 0, protocol.EOK)

	addr := env.srv.Addr().String()
	ncs := make([]net.Conn, conns)
	for i := range ncs {
		ncs[i] = dialSmallRecv(t, addr)
	}
	sendReadsOneAtATime(t, env, ncs, readsPerConn)
	time.Sleep(100 * time.Millisecond)

	total := heldResponseBytes(env.srv)
	st := env.srv.Stats()
	t.Logf("%d slow-reader connections: %d response bytes held by the server (per-connection max %d); stats %+v",
		conns, total, st.MaxOutbound, st)
	if st.UnwrittenReadBytes > budget {
		t.Fatalf("UnwrittenReadBytes %d > MaxUnwrittenReadBytes %d", st.UnwrittenReadBytes, budget)
	}
	// The read responses within the budget, and the ETOOMANYREQUESTS answers (28 bytes each).
	if bound := int64(budget + conns*readsPerConn*64); total > bound {
		t.Fatalf("server holds %d bytes of unwritten responses over %d connections (> %d): MaxUnwrittenReadBytes does not bound them",
			total, conns, bound)
	}
	if st.Rejected == 0 {
		t.Fatalf("no read refused, yet %d connections × %d reads of %d bytes exceed the budget of %d",
			conns, readsPerConn, entrySize, budget)
	}
	// Once the slow readers go away, their bytes are given back.
	for _, nc := range ncs {
		_ = nc.Close()
	}
	eventually(t, 5*time.Second, "unwritten read bytes given back", func() bool { return env.srv.Stats().UnwrittenReadBytes == 0 })
	mustRead(t, c, 1, 0, protocol.EOK)
	eventually(t, 5*time.Second, "unwritten read bytes given back", func() bool { return env.srv.Stats().UnwrittenReadBytes == 0 })
}

// TestSlowReadersLeaveUnwrittenReadBytesToOthers: slow readers with deep backlogs get only half
// of MaxUnwrittenReadBytes, so a client that reads its responses is still served. Without that
// rule six slow readers with 1 MiB backlogs would take the whole 4 MiB.
func TestSlowReadersLeaveUnwrittenReadBytesToOthers(t *testing.T) {
	const (
		entrySize = 256 << 10
		budget    = 4 << 20
		slow      = 6
	)
	for _, cached := range []bool{false, true} {
		name := map[bool]string{false: "worker", true: "cached"}[cached]
		t.Run(name, func(t *testing.T) {
			env := startEnv(t, withConfig(func(c *Config) {
				c.MaxFrameSize = 1 << 20
				c.MaxOutboundBytesPerConnection = 1 << 20
				c.MaxUnwrittenReadBytes = budget
				c.SocketSendBufferBytes = 4 << 10
			}), withStorage(func(st *servertest.MemStorage) { st.DisableCache = !cached }))
			c := env.dial(t)
			mustAdd(t, c, keyA, entry(1, 0, string(make([]byte, entrySize))), 0, protocol.EOK)
			ncs := make([]net.Conn, slow)
			for i := range ncs {
				ncs[i] = dialSmallRecv(t, env.srv.Addr().String())
			}
			// Each slow reader in turn builds its backlog.
			for _, nc := range ncs {
				sendReadsOneAtATime(t, env, []net.Conn{nc}, 6)
			}
			st := env.srv.Stats()
			t.Logf("slow readers hold %d unwritten read bytes; stats %+v", st.UnwrittenReadBytes, st)
			if st.UnwrittenReadBytes > budget {
				t.Fatalf("UnwrittenReadBytes %d > %d", st.UnwrittenReadBytes, budget)
			}
			for range 4 {
				mustRead(t, c, 1, 0, protocol.EOK)
			}
		})
	}
}

// TestBatchReadsStayWithinOutboundLimit: one slow-reader connection pipelines batch reads of
// maxSize = MaxFrameSize. Every read worker checks the connection's backlog before reading and
// then reads a whole frame's worth; the response is queued only if the backlog then stays within
// MaxOutboundBytesPerConnection, so workers reading for one connection at once cannot take it
// past the limit together. (The storage is gated so that the workers' checks all happen before
// their reads, as they do under a slow disk.)
func TestBatchReadsStayWithinOutboundLimit(t *testing.T) {
	const (
		entrySize = 256 << 10
		outLimit  = 16 << 20 // the default
		workers   = 8        // the default
	)
	env := startEnv(t, withConfig(func(c *Config) {
		c.MaxOutboundBytesPerConnection = outLimit
		c.NumReadWorkerThreads = workers
		c.SocketSendBufferBytes = 4 << 10
	}), withStorage(func(st *servertest.MemStorage) { st.DisableCache = true }))
	c := env.dial(t)
	for i := range int64(20) {
		mustAdd(t, c, keyA, entry(1, i, string(make([]byte, entrySize))), 0, protocol.EOK)
	}
	gate := make(chan struct{})
	var entered atomic.Int64
	env.storage.SetReadHook(func(int64, int64) {
		entered.Add(1)
		<-gate
	})
	var req []byte
	for i := range 64 {
		req = protocol.AppendBatchReadRequest(req, protocol.BatchReadRequest{
			Header: protocol.Header{Version: protocol.CurrentVersion}, LedgerID: 1, StartEntryID: 0,
			RequestID: int64(i), MaxCount: 100, MaxSize: DefaultMaxFrameSize})
	}
	nc := dialSmallRecv(t, env.srv.Addr().String())
	if _, err := nc.Write(req); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "every worker in a read", func() bool { return entered.Load() == workers })
	close(gate)
	eventually(t, 5*time.Second, "reads served", func() bool { return env.srv.Stats().ReadsInFlight == 0 })
	time.Sleep(50 * time.Millisecond)
	st := env.srv.Stats()
	t.Logf("MaxOutbound %d (limit %d, frame %d); stats %+v", st.MaxOutbound, outLimit, DefaultMaxFrameSize, st)
	// Only the ETOOMANYREQUESTS answers (28 bytes each) are queued without the check.
	if bound := int64(outLimit + 64*64); st.MaxOutbound > bound {
		t.Fatalf("one connection's backlog reached %d bytes, %.1f× MaxOutboundBytesPerConnection (%d)",
			st.MaxOutbound, float64(st.MaxOutbound)/outLimit, outLimit)
	}
}

// nopTransport is a transport that writes nothing, for connState unit tests.
type nopTransport struct{}

func (nopTransport) wake()  {}
func (nopTransport) close() {}

// TestTakeKeepsBytesTheTransportHolds: while the writer takes the queue, the connection's
// backlog as read workers see it (outbound) still counts what gnet held after the previous
// flush, on top of the bytes taken; it drops only when the writer learns what the socket took.
func TestTakeKeepsBytesTheTransportHolds(t *testing.T) {
	s := &Server{cfg: DefaultConfig()}
	var cc connState
	cc.init(s, nopTransport{}, "test")
	const held, queued = 1000, 100
	cc.transitBytes.Store(held) // what gnet kept of the previous flush
	b := bytebufferpool.Get()
	b.B = append(b.B[:0], make([]byte, queued)...)
	cc.queueBuf(b)
	if got := cc.outbound(); got != held+queued {
		t.Fatalf("outbound %d before take, want %d", got, held+queued)
	}
	small, bufs := cc.take()
	if got := cc.outbound(); got != held+queued {
		t.Fatalf("outbound %d while the writer writes, want %d: what gnet still holds is forgotten", got, held+queued)
	}
	cc.recycle(small, bufs)
}
