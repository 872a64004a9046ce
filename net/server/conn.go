package server

import (
	"sync"
	"sync/atomic"

	"github.com/valyala/bytebufferpool"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

const (
	// copyResponseMax: a worker's response up to this size is copied into the connection's
	// shared response buffer; a larger one is queued as its own buffer (one iovec), so a big
	// read is not copied twice.
	copyResponseMax = 4 << 10
	// keepBufferMax: a connection's reusable buffers larger than this are dropped after use
	// instead of being kept, so one big response does not pin memory for the connection's
	// lifetime.
	keepBufferMax = 1 << 20
	// immediateFlushBytes: while decoding, responses made on the reader goroutine are handed
	// to the transport once they reach this size.
	immediateFlushBytes = 256 << 10
)

// transport is where the two network paths differ: how a connection's queued responses get
// written. The gnet path writes on the connection's event loop (wake triggers OnTraffic); the
// stdlib (TLS) path has a writer goroutine per connection. Both read requests on a single
// goroutine (the event loop, or the TLS reader goroutine), called the connection's reader
// below, which owns the fields marked "reader only" in connState.
type transport interface {
	// wake asks the transport to write the queued responses soon. It is called with connState.mu
	// held and only while the connection is open, and must not block.
	wake()
	// close closes the connection. Same calling rules as wake.
	close()
}

// connState is the protocol side of one connection, shared by both transports: decoding and
// dispatch (dispatch.go), the queue of responses made by completions, and in-flight counters.
type connState struct {
	srv    *Server
	t      transport
	remote string

	// Reader only.
	req       protocol.Request
	immediate []byte // responses made while decoding, written by the reader after the batch
	authed    bool
	authSess  AuthSession
	// refused: a plaintext connection of a server with Config.PlaintextRefused, or a TLS one
	// whose certificate Config.AuthorizeCertificate refused.
	refused   bool
	paused    bool // decoding stopped because too many response bytes are queued
	unflushed bool // the transport kept response bytes the socket did not take (gnet)
	polled    bool // in Server.polled: paused or unflushed
	// immediateRead: bytes of cached read responses in immediate, not yet counted in
	// Server.unwrittenReads (counted when the immediate buffer is handed on).
	immediateRead int
	// skip: bytes still to discard of an oversize add answered already (see oversize).
	skip int

	// Owner of the queue's spare buffers: the goroutine that writes (the event loop, or the TLS
	// writer goroutine).
	spareSmall []byte
	spareBufs  []*bytebufferpool.ByteBuffer

	addsInFlight  atomic.Int64
	readsInFlight atomic.Int64
	queuedBytes   atomic.Int64 // mirror of q.bytes, readable without the lock
	transitBytes  atomic.Int64 // bytes taken from the queue and not yet written to the socket
	// readTransit: read response bytes counted in Server.unwrittenReads that the writer took
	// and the socket may not have taken yet (at most transitBytes). Non-zero marks a slow reader.
	readTransit atomic.Int64

	// mu protects q and serialises wake/close calls with the transport going away.
	mu sync.Mutex
	q  struct {
		small     []byte                       // add responses and small worker responses, appended
		bufs      []*bytebufferpool.ByteBuffer // large worker responses, one buffer each
		bytes     int
		readBytes int // of bytes, read responses counted in Server.unwrittenReads
		closed    bool
	}
}

func (cc *connState) init(s *Server, t transport, remote string) {
	cc.srv, cc.t, cc.remote = s, t, remote
}

// outbound is the connection's response bytes not yet on the wire, as far as goroutines
// other than the writer can tell.
func (cc *connState) outbound() int64 {
	return cc.queuedBytes.Load() + cc.transitBytes.Load()
}

func (cc *connState) isClosed() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.q.closed
}

// queueAdd queues an add response; it runs on the storage's completion goroutine.
func (cc *connState) queueAdd(version uint8, rc protocol.ReturnCode, ledgerID, entryID int64) {
	cc.mu.Lock()
	if cc.q.closed {
		cc.mu.Unlock()
		return
	}
	wasEmpty := cc.q.bytes == 0
	n := len(cc.q.small)
	cc.q.small = protocol.AppendAddResponse(cc.q.small, protocol.AddResponse{
		Header: protocol.Header{Version: version, Op: protocol.OpAddEntry}, RC: rc, LedgerID: ledgerID, EntryID: entryID})
	cc.q.bytes += len(cc.q.small) - n
	cc.queuedBytes.Store(int64(cc.q.bytes))
	if wasEmpty {
		cc.t.wake()
	}
	cc.mu.Unlock()
	cc.srv.stats.responsesQueued.Add(1)
}

// queueBuf queues a response built in a pooled buffer; the queue takes ownership of b.
func (cc *connState) queueBuf(b *bytebufferpool.ByteBuffer) {
	cc.mu.Lock()
	if cc.q.closed {
		cc.mu.Unlock()
		bytebufferpool.Put(b)
		return
	}
	cc.appendLocked(b)
}

// queueRead queues a read response made by a read worker if it fits: the connection's
// response bytes not yet on the wire stay within MaxOutboundBytesPerConnection (or the
// connection has none, so that a response larger than the limit still goes out), and the
// server's unwritten read bytes within the connection's allowance (readAllowance). Checked
// here, under the lock, rather than only before the read, so that workers reading for the same
// connection at once cannot pass the limits together. The queue takes b if it returns true; on
// false b is left to the caller, to answer ETOOMANYREQUESTS. A forced response (a fencing
// read's: the fence is already durable, and refusing its answer would only make the recovery
// try again) is counted without being checked.
func (cc *connState) queueRead(b *bytebufferpool.ByteBuffer, force bool) bool {
	s := cc.srv
	n := int64(len(b.B))
	cc.mu.Lock()
	if cc.q.closed {
		cc.mu.Unlock()
		bytebufferpool.Put(b)
		return true
	}
	backlog := int64(cc.q.bytes) + cc.transitBytes.Load()
	overLimit := backlog > 0 && backlog+n > int64(s.cfg.MaxOutboundBytesPerConnection)
	switch {
	case force:
		s.unwrittenReads.Add(n)
	case overLimit || !s.reserveReadBytes(n, cc.readAllowance()):
		cc.mu.Unlock()
		return false
	}
	cc.q.readBytes += int(n)
	cc.appendLocked(b)
	return true
}

// appendLocked appends b to the queue (cc.mu held; it unlocks) and wakes the writer if the
// queue was empty.
func (cc *connState) appendLocked(b *bytebufferpool.ByteBuffer) {
	wasEmpty := cc.q.bytes == 0
	n := len(b.B)
	if n <= copyResponseMax {
		cc.q.small = append(cc.q.small, b.B...)
	} else {
		cc.q.bufs = append(cc.q.bufs, b)
		b = nil
	}
	cc.q.bytes += n
	cc.queuedBytes.Store(int64(cc.q.bytes))
	if wasEmpty {
		cc.t.wake()
	}
	cc.mu.Unlock()
	if b != nil {
		bytebufferpool.Put(b)
	}
	cc.srv.stats.responsesQueued.Add(1)
}

// readAllowance is how many unwritten read bytes (Server.unwrittenReads) the server may hold
// once it has admitted a read response for this connection: MaxUnwrittenReadBytes, or half of
// it while the connection's transport still holds read bytes its socket has not taken (a slow
// reader), so that slow readers cannot take it all from clients that keep up.
func (cc *connState) readAllowance() int64 {
	limit := int64(cc.srv.cfg.MaxUnwrittenReadBytes)
	if cc.readTransit.Load() > 0 {
		return limit / 2
	}
	return limit
}

// readBudgetSpent reports that a read for this connection would be refused for want of room:
// its outbound backlog is over MaxOutboundBytesPerConnection, or the server's unwritten read
// bytes have reached the connection's allowance. It is checked before a read is performed.
func (cc *connState) readBudgetSpent() bool {
	s := cc.srv
	return cc.outbound() > int64(s.cfg.MaxOutboundBytesPerConnection) ||
		s.unwrittenReads.Load() >= cc.readAllowance()
}

// queueImmediate moves the reader's immediate responses to the queue (the TLS path, whose
// reader does not write).
func (cc *connState) queueImmediate() {
	if len(cc.immediate) == 0 {
		return
	}
	cc.mu.Lock()
	if !cc.q.closed {
		wasEmpty := cc.q.bytes == 0
		cc.q.small = append(cc.q.small, cc.immediate...)
		cc.q.bytes += len(cc.immediate)
		cc.queuedBytes.Store(int64(cc.q.bytes))
		if cc.immediateRead > 0 {
			cc.q.readBytes += cc.immediateRead
			cc.srv.unwrittenReads.Add(int64(cc.immediateRead))
		}
		if wasEmpty {
			cc.t.wake()
		}
	}
	cc.mu.Unlock()
	cc.resetImmediate()
}

func (cc *connState) resetImmediate() {
	cc.immediateRead = 0
	if cap(cc.immediate) > keepBufferMax {
		cc.immediate = nil
		return
	}
	cc.immediate = cc.immediate[:0]
}

// take removes everything queued, for the writer to write; the writer hands the buffers back
// with recycle once written. The bytes taken are added to transitBytes, which may still count
// bytes of an earlier write that gnet holds: they stay on the connection's backlog until the
// writer learns what the socket took. (transitBytes is raised before queuedBytes is cleared, so
// outbound, which reads queuedBytes first, may overstate the backlog but never understates it.)
func (cc *connState) take() (small []byte, bufs []*bytebufferpool.ByteBuffer) {
	cc.mu.Lock()
	small, bufs = cc.q.small, cc.q.bufs
	cc.transitBytes.Add(int64(cc.q.bytes))
	if cc.q.readBytes != 0 {
		cc.readTransit.Add(int64(cc.q.readBytes))
	}
	cc.q.small, cc.q.bufs, cc.q.bytes, cc.q.readBytes = cc.spareSmall[:0], cc.spareBufs[:0], 0, 0
	cc.queuedBytes.Store(0)
	cc.mu.Unlock()
	cc.spareSmall, cc.spareBufs = nil, nil
	return small, bufs
}

// recycle returns buffers obtained from take once their bytes have been written (or copied
// into the transport's own buffer).
func (cc *connState) recycle(small []byte, bufs []*bytebufferpool.ByteBuffer) {
	for i, b := range bufs {
		bytebufferpool.Put(b)
		bufs[i] = nil
	}
	if cap(small) <= keepBufferMax {
		cc.spareSmall = small[:0]
	}
	cc.spareBufs = bufs[:0]
}

// markClosed drops the queue; later completions for this connection are discarded. It is
// called on the reader when the transport has closed (gnet OnClose) or is closing (TLS).
func (cc *connState) markClosed() (wasOpen bool) {
	cc.mu.Lock()
	wasOpen = !cc.q.closed
	cc.q.closed = true
	bufs := cc.q.bufs
	// The read bytes it held are no longer the server's to write (a TLS writer still writing
	// finds readTransit swapped to 0 and gives nothing back twice).
	cc.srv.unwrittenReads.Add(-int64(cc.q.readBytes) - cc.readTransit.Swap(0))
	cc.q.small, cc.q.bufs, cc.q.bytes, cc.q.readBytes = nil, nil, 0, 0
	cc.queuedBytes.Store(0)
	cc.immediateRead = 0
	cc.mu.Unlock()
	for _, b := range bufs {
		bytebufferpool.Put(b)
	}
	return wasOpen
}

// closeAsync closes the connection from any goroutine (a no-op once closed).
func (cc *connState) closeAsync() {
	cc.mu.Lock()
	if !cc.q.closed {
		cc.t.close()
	}
	cc.mu.Unlock()
}

// wakeIfOpen asks the transport to run the connection's reader/writer again (used to resume
// paused connections).
func (cc *connState) wakeIfOpen() {
	cc.mu.Lock()
	if !cc.q.closed {
		cc.t.wake()
	}
	cc.mu.Unlock()
}

// acquireAdd reserves an in-flight add against the connection and global limits.
func (cc *connState) acquireAdd() bool {
	s := cc.srv
	if cc.addsInFlight.Add(1) > int64(s.cfg.MaxPendingAddRequestsPerThread) {
		cc.addsInFlight.Add(-1)
		return false
	}
	if n := s.addsInFlight.Add(1); s.cfg.MaxAddsInProgressLimit > 0 && n > int64(s.cfg.MaxAddsInProgressLimit) {
		s.addsInFlight.Add(-1)
		cc.addsInFlight.Add(-1)
		return false
	}
	return true
}

func (cc *connState) releaseAdd() {
	cc.addsInFlight.Add(-1)
	cc.srv.addsInFlight.Add(-1)
}

// acquireRead reserves an in-flight worker-pool read against the connection and global limits.
func (cc *connState) acquireRead() bool {
	s := cc.srv
	if cc.readsInFlight.Add(1) > int64(s.cfg.MaxPendingReadRequestsPerThread) {
		cc.readsInFlight.Add(-1)
		return false
	}
	if n := s.readsInFlight.Add(1); s.cfg.MaxReadsInProgressLimit > 0 && n > int64(s.cfg.MaxReadsInProgressLimit) {
		s.readsInFlight.Add(-1)
		cc.readsInFlight.Add(-1)
		return false
	}
	return true
}

func (cc *connState) releaseRead() {
	cc.readsInFlight.Add(-1)
	cc.srv.readsInFlight.Add(-1)
}
