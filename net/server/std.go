package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// stdReadBufferSize is a TLS connection's initial receive buffer; it grows to the size of the
// largest frame in progress (at most MaxFrameSize) and shrinks back when empty.
const stdReadBufferSize = 64 << 10

// stdConn is a connection on the stdlib net path (the TLS listener): a reader goroutine
// decodes and dispatches, a writer goroutine writes the queued responses. Backpressure is
// natural here: while too many response bytes are queued, the reader stops reading the
// socket, and TCP's window stops the client.
type stdConn struct {
	cc       connState
	nc       net.Conn
	wakeCh   chan struct{} // capacity 1: responses were queued
	drained  chan struct{} // capacity 1: the writer wrote something
	done     chan struct{} // closed when the connection is closed
	doneOnce sync.Once
}

func (t *stdConn) wake() {
	select {
	case t.wakeCh <- struct{}{}:
	default:
	}
}

func (t *stdConn) close() {
	t.doneOnce.Do(func() {
		close(t.done)
		_ = t.nc.Close()
	})
}

// interruptRead unblocks the reader (used by Stop: the reader sees the server draining and
// stops decoding).
func (t *stdConn) interruptRead() { _ = t.nc.SetReadDeadline(time.Now()) }

func (s *Server) startTLS() error {
	ln, err := net.Listen("tcp", s.cfg.TLSAddr)
	if err != nil {
		return fmt.Errorf("server: listen on %s: %w", s.cfg.TLSAddr, err)
	}
	s.tlsLn, s.tlsAddr = ln, ln.Addr()
	s.tlsWG.Add(1)
	go s.acceptTLS(ln)
	return nil
}

func (s *Server) acceptTLS(ln net.Listener) {
	defer s.tlsWG.Done()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait and retry, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("server: TLS accept failed", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if tc, ok := nc.(*net.TCPConn); ok {
			if n := s.cfg.SocketSendBufferBytes; n > 0 {
				_ = tc.SetWriteBuffer(n)
			}
			if n := s.cfg.SocketRecvBufferBytes; n > 0 {
				_ = tc.SetReadBuffer(n)
			}
		}
		t := &stdConn{nc: tls.Server(nc, s.cfg.TLSConfig), wakeCh: make(chan struct{}, 1),
			drained: make(chan struct{}, 1), done: make(chan struct{})}
		t.cc.init(s, t, nc.RemoteAddr().String())
		s.mu.Lock()
		if s.draining.Load() {
			s.mu.Unlock()
			_ = nc.Close()
			continue
		}
		s.tlsConns[t] = struct{}{}
		s.tlsWG.Add(2)
		s.mu.Unlock()
		s.register(&t.cc)
		go t.readLoop()
		go t.writeLoop()
	}
}

// finish closes the connection and unregisters it (the reader's last act).
func (t *stdConn) finish() {
	s := t.cc.srv
	t.cc.closeAsync()
	t.cc.markClosed()
	s.mu.Lock()
	delete(s.tlsConns, t)
	s.mu.Unlock()
	s.unregister(&t.cc)
}

func (t *stdConn) readLoop() {
	s := t.cc.srv
	defer s.tlsWG.Done()
	defer t.finish()
	if tc, ok := t.nc.(*tls.Conn); ok {
		_ = tc.SetDeadline(time.Now().Add(s.cfg.TLSHandshakeTimeout))
		if err := tc.Handshake(); err != nil {
			s.log.Info("server: TLS handshake failed", "remote", t.cc.remote, "err", err)
			return
		}
		_ = tc.SetDeadline(time.Time{})
		if authz := s.cfg.AuthorizeCertificate; authz != nil {
			var cert *x509.Certificate
			if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
				cert = certs[0]
			}
			if err := authz(cert); err != nil {
				s.stats.authFailures.Add(1)
				s.log.Warn("server: client certificate not authorized: adds and reads answered EUA", "remote", t.cc.remote, "err", err)
				t.cc.refused = true
			}
		}
	}
	rb := stdReadBuffer{buf: make([]byte, stdReadBufferSize)}
	for {
		if t.decodeBuffered(&rb) {
			return
		}
		if s.draining.Load() {
			<-t.done // Stop closes the connection once its responses are written
			return
		}
		if t.cc.outbound() > int64(s.cfg.MaxOutboundBytesPerConnection) {
			if !t.waitDrained() {
				return
			}
			continue
		}
		rb.makeRoom(s.cfg.MaxFrameSize)
		n, err := t.nc.Read(rb.buf[rb.w:])
		rb.w += n
		if err != nil {
			if s.draining.Load() {
				<-t.done
				return
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("server: TLS connection read failed", "remote", t.cc.remote, "err", err)
			}
			return
		}
	}
}

// stdReadBuffer is a TLS connection's receive buffer: buf[r:w] holds bytes not yet decoded.
type stdReadBuffer struct {
	buf  []byte
	r, w int
}

// makeRoom ensures there is space to read into: it rewinds an empty buffer (shrinking one
// that grew), compacts a full one, and grows it to the size of the frame in progress.
func (b *stdReadBuffer) makeRoom(maxFrameSize int) {
	if b.r == b.w {
		b.r, b.w = 0, 0
		if len(b.buf) > stdReadBufferSize {
			b.buf = make([]byte, stdReadBufferSize)
		}
	}
	if b.w < len(b.buf) {
		return
	}
	need := len(b.buf)
	if size, _, err := protocol.SplitFrame(b.buf[b.r:b.w], maxFrameSize); err == nil && size > need {
		need = size
	}
	if need > len(b.buf) {
		nb := make([]byte, need)
		b.w = copy(nb, b.buf[b.r:b.w])
		b.buf, b.r = nb, 0
		return
	}
	b.w = copy(b.buf, b.buf[b.r:b.w])
	b.r = 0
}

// decodeBuffered dispatches the complete frames in the buffer until it runs out, the
// connection's outbound backlog is over the limit, or the server is draining; then it queues
// the responses made meanwhile. closeConn reports that the connection must be closed.
func (t *stdConn) decodeBuffered(b *stdReadBuffer) (closeConn bool) {
	s := t.cc.srv
	defer t.cc.queueImmediate()
	limit := int64(s.cfg.MaxOutboundBytesPerConnection)
	for !s.draining.Load() && t.cc.outbound()+int64(len(t.cc.immediate)) <= limit {
		if t.cc.skip > 0 { // the rest of an oversize add answered already
			d := min(t.cc.skip, b.w-b.r)
			b.r += d
			t.cc.skip -= d
			if t.cc.skip > 0 {
				return false
			}
			continue
		}
		size, complete, err := protocol.SplitFrame(b.buf[b.r:b.w], s.cfg.MaxFrameSize)
		if errors.Is(err, protocol.ErrFrameTooLarge) {
			skip, wait := t.cc.oversize(b.buf[b.r:b.w])
			if wait {
				return false
			}
			if skip > 0 {
				t.cc.skip = skip
				continue
			}
		}
		if err != nil {
			s.closeFor(&t.cc, closeProtocol, err)
			return true
		}
		if !complete {
			return false
		}
		if t.handleFrame(b.buf[b.r+protocol.LengthPrefixSize : b.r+size]) {
			return true
		}
		b.r += size
	}
	return false
}

// waitDrained blocks the reader while the connection's outbound backlog is over the limit:
// the socket is not read, so TCP stops the client. false means the connection closed.
func (t *stdConn) waitDrained() bool {
	s := t.cc.srv
	s.stats.pauses.Add(1)
	s.stats.pausedNow.Add(1)
	defer s.stats.pausedNow.Add(-1)
	for t.cc.outbound() > int64(s.cfg.MaxOutboundBytesPerConnection) {
		select {
		case <-t.drained:
		case <-t.done:
			return false
		}
	}
	return true
}

// writtenReads gives back the read bytes of a write that has returned (the socket took them,
// or the connection is failing): the TLS writer's counterpart of gnet's flush accounting.
func (cc *connState) writtenReads() {
	if n := cc.readTransit.Swap(0); n != 0 {
		cc.srv.unwrittenReads.Add(-n)
	}
}

// handleFrame is connState.handleFrame with a panic turned into closing the connection.
func (t *stdConn) handleFrame(frame []byte) (closeConn bool) {
	defer func() {
		if r := recover(); r != nil {
			t.cc.srv.recovered(&t.cc, r)
			closeConn = true
		}
	}()
	return t.cc.handleFrame(frame)
}

func (t *stdConn) writeLoop() {
	s := t.cc.srv
	defer s.tlsWG.Done()
	var iov net.Buffers
	for {
		select {
		case <-t.wakeCh:
		case <-t.done:
			return
		}
		for {
			small, bufs := t.cc.take()
			if len(small) == 0 && len(bufs) == 0 {
				t.cc.recycle(small, bufs)
				t.cc.transitBytes.Store(0)
				t.cc.writtenReads()
				break
			}
			iov = iov[:0]
			if len(small) > 0 {
				iov = append(iov, small)
			}
			for _, b := range bufs {
				iov = append(iov, b.B)
			}
			all := iov
			_, err := all.WriteTo(t.nc) // consumes all, not iov's backing array
			clear(iov)
			t.cc.recycle(small, bufs)
			t.cc.transitBytes.Store(0)
			t.cc.writtenReads()
			s.stats.flushes.Add(1)
			s.metrics.flushed()
			select {
			case t.drained <- struct{}{}:
			default:
			}
			if err != nil {
				t.cc.closeAsync()
				return
			}
		}
	}
}
