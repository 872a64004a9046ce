package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	gnetErrors "github.com/panjf2000/gnet/v2/pkg/errors"
	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// maxIOV bounds the buffers passed to one gnet Writev: gnet hands them to writev(2) as they
// are, and Linux refuses more than IOV_MAX (1024), which gnet treats as a fatal write error.
const maxIOV = 512

// gnetConn is a plaintext connection: its reader and writer are both its event loop.
type gnetConn struct {
	cc   connState
	c    gnet.Conn
	iov  [][]byte
	dead bool // a gnet write failed: gnet has closed the connection under us
}

func (g *gnetConn) wake()  { _ = g.c.Wake(nil) }
func (g *gnetConn) close() { _ = g.c.Close() }

// gnetHandler is the gnet event handler shared by all event loops; it holds no per-loop state.
type gnetHandler struct {
	gnet.BuiltinEventEngine
	s      *Server
	booted chan booted
}

type booted struct {
	eng  gnet.Engine
	addr net.Addr
	// listener is a dup of the listening socket's fd, taken at boot (a dup taken while gnet
	// stops would race with its close of the original), for stopGnet to shut.
	listener int
}

func (s *Server) startGnet() error {
	addr := s.cfg.Addr
	if s.cfg.ReusePort {
		// With SO_REUSEPORT gnet binds one listener per event loop to the configured address,
		// so port 0 would give each loop a different port: pick one port first.
		a, err := pickPort(addr)
		if err != nil {
			return err
		}
		addr = a
	}
	h := &gnetHandler{s: s, booted: make(chan booted, 1)}
	done := make(chan error, 1)
	opts := []gnet.Option{
		gnet.WithMulticore(true),
		gnet.WithNumEventLoop(s.cfg.NumEventLoops),
		gnet.WithReusePort(s.cfg.ReusePort),
		gnet.WithReuseAddr(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithReadBufferCap(s.cfg.ReadBufferCap),
		gnet.WithLoadBalancing(gnet.LeastConnections),
		gnet.WithLogger(gnetLogger{l: s.log, quiet: &s.gnetStopping}),
	}
	if s.cfg.SocketSendBufferBytes > 0 {
		opts = append(opts, gnet.WithSocketSendBuffer(s.cfg.SocketSendBufferBytes))
	}
	if s.cfg.SocketRecvBufferBytes > 0 {
		opts = append(opts, gnet.WithSocketRecvBuffer(s.cfg.SocketRecvBufferBytes))
	}
	go func() { done <- gnet.Run(h, "tcp://"+addr, opts...) }()
	select {
	case b := <-h.booted:
		s.engine, s.addr, s.gnetDone, s.listenerFD = b.eng, b.addr, done, b.listener
		return nil
	case err := <-done:
		if err == nil {
			err = errNotListening
		}
		return fmt.Errorf("server: listen on %s: %w", s.cfg.Addr, err)
	}
}

// pickPort resolves port 0 in addr to a currently free port.
func pickPort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port != "0" {
		return addr, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("server: pick a port for %s: %w", addr, err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// stopGnet shuts the engine down (closing every plaintext connection) and waits for gnet.Run
// to return, bounded by ctx.
func (s *Server) stopGnet(ctx context.Context) error {
	s.mu.Lock()
	done := s.gnetDone
	eng := s.engine
	listener := s.listenerFD
	s.listenerFD = -1
	s.mu.Unlock()
	if done == nil {
		return nil
	}
	// Take the listener out of LISTEN first (shutdown on a dup of it: the socket is shared),
	// which resets the connections in its accept queue and makes gnet's acceptor fail, and
	// gnet then shuts itself down from the acceptor. Stopping it from outside instead lets
	// the acceptor hand a connection accepted meanwhile to an event loop that has already
	// exited: that socket stays open and unserved forever, and a client connected to it
	// waits out its timeouts instead of seeing the connection fail.
	s.gnetStopping.Store(true) // the acceptor's failure is expected: not an error to log
	if listener >= 0 {
		_ = unix.Shutdown(listener, unix.SHUT_RD)
		_ = unix.Close(listener)
		select {
		case err := <-done:
			return gnetStopped(err)
		case <-time.After(gnetSelfStopWait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Engine.Stop polls for completion every 500 ms; trigger the shutdown with a canceled
	// context and wait for Run to return instead.
	_ = eng.Stop(canceledContext())
	select {
	case err := <-done:
		return gnetStopped(err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gnetSelfStopWait bounds the wait for gnet to shut itself down once its listener is shut.
const gnetSelfStopWait = 2 * time.Second

// gnetStopped is the result of a stop from gnet.Run's: the acceptor's failure on the shut
// listener is how the stop was made, not an error.
func gnetStopped(err error) error {
	if err == nil || errors.Is(err, gnetErrors.ErrAcceptSocket) {
		return nil
	}
	return fmt.Errorf("server: gnet: %w", err)
}

// OnBoot records the engine and the listener's bound address.
func (h *gnetHandler) OnBoot(eng gnet.Engine) gnet.Action {
	fd, err := eng.Dup()
	if err != nil {
		h.s.log.Error("server: cannot duplicate the listener", "err", err)
		return gnet.Shutdown
	}
	addr, err := listenerAddr(fd)
	if err != nil {
		_ = unix.Close(fd)
		h.s.log.Error("server: cannot read the listener's address", "err", err)
		return gnet.Shutdown
	}
	h.booted <- booted{eng, addr, fd}
	return gnet.None
}

func listenerAddr(fd int) (net.Addr, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil, err
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port}, nil
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}, nil
	}
	return nil, fmt.Errorf("server: listener address of type %T", sa)
}

func (h *gnetHandler) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	s := h.s
	if s.draining.Load() {
		return nil, gnet.Close
	}
	g := &gnetConn{c: c}
	remote := ""
	if a := c.RemoteAddr(); a != nil {
		remote = a.String()
	}
	g.cc.init(s, g, remote)
	g.cc.refused = s.cfg.PlaintextRefused
	c.SetContext(g)
	s.register(&g.cc)
	return nil, gnet.None
}

func (h *gnetHandler) OnClose(c gnet.Conn, err error) gnet.Action {
	g, _ := c.Context().(*gnetConn)
	if g == nil {
		return gnet.None
	}
	if g.cc.markClosed() {
		h.s.unregister(&g.cc)
		if err != nil && !errors.Is(err, unix.ECONNRESET) && !errors.Is(err, io.EOF) {
			h.s.log.Debug("server: connection closed", "remote", g.cc.remote, "err", err)
		}
	}
	return gnet.None
}

// OnTraffic runs on the connection's event loop when bytes arrived or when the connection was
// woken (responses queued, or a paused connection's periodic check). It decodes and
// dispatches every complete frame, then writes all queued and immediate responses in one
// writev. It never blocks.
func (h *gnetHandler) OnTraffic(c gnet.Conn) gnet.Action {
	g, _ := c.Context().(*gnetConn)
	if g == nil {
		return gnet.Close
	}
	s := h.s
	if g.cc.unflushed && !g.dead {
		g.settle(0) // the socket may have taken what gnet held: let the reads decoded now see it
	}
	closeConn := g.decode()
	if !closeConn && !g.dead && c.InboundBuffered() > s.cfg.MaxInboundBytesPerConnection {
		s.closeFor(&g.cc, closeSlowClient, fmt.Errorf("server: %d unprocessed request bytes while %d response bytes wait",
			c.InboundBuffered(), int64(c.OutboundBuffered())+g.cc.queuedBytes.Load()))
		closeConn = true
	}
	if !g.dead {
		g.flush()
	}
	if closeConn || g.dead {
		return gnet.Close
	}
	return gnet.None
}

// decode dispatches the complete frames in the inbound buffer, in place, until it runs out,
// the connection is paused by its outbound backlog, or the server is draining.
func (g *gnetConn) decode() (closeConn bool) {
	cc, c := &g.cc, g.c
	s := cc.srv
	defer func() {
		if r := recover(); r != nil {
			s.recovered(cc, r)
			closeConn = true
		}
	}()
	limit := s.cfg.MaxOutboundBytesPerConnection
	for !s.draining.Load() {
		if c.OutboundBuffered()+int(cc.queuedBytes.Load())+len(cc.immediate) > limit {
			s.setPaused(cc, true)
			return false
		}
		n := c.InboundBuffered()
		if cc.skip > 0 { // the rest of an oversize add answered already
			if n == 0 {
				break
			}
			d, _ := c.Discard(min(cc.skip, n))
			cc.skip -= d
			continue
		}
		if n < protocol.LengthPrefixSize {
			break
		}
		prefix, err := c.Peek(protocol.LengthPrefixSize)
		if err != nil {
			break
		}
		size, _, err := protocol.SplitFrame(prefix, s.cfg.MaxFrameSize)
		if errors.Is(err, protocol.ErrFrameTooLarge) {
			head, _ := c.Peek(min(n, oversizeAddHead))
			skip, wait := cc.oversize(head)
			if wait {
				break
			}
			if skip > 0 {
				cc.skip = skip
				continue
			}
		}
		if err != nil {
			s.closeFor(cc, closeProtocol, err)
			return true
		}
		if size > n {
			break
		}
		frame, err := c.Peek(size)
		if err != nil {
			break
		}
		if cc.handleFrame(frame[protocol.LengthPrefixSize:]) {
			return true
		}
		_, _ = c.Discard(size)
		if len(cc.immediate) >= immediateFlushBytes {
			if g.flush(); g.dead {
				return true
			}
		}
	}
	s.setPaused(cc, false)
	return false
}

// flush writes the queued responses and the immediate ones with one gnet write: gnet sends
// what the socket takes and keeps the rest in its outbound buffer.
func (g *gnetConn) flush() {
	cc, c := &g.cc, g.c
	s := cc.srv
	small, bufs := cc.take()
	iov := g.iov[:0]
	if len(small) > 0 {
		iov = append(iov, small)
	}
	for _, b := range bufs {
		iov = append(iov, b.B)
	}
	if len(cc.immediate) > 0 {
		iov = append(iov, cc.immediate)
	}
	if len(iov) > 0 {
		for rest := iov; len(rest) > 0 && !g.dead; {
			k := min(len(rest), maxIOV)
			var err error
			if k == 1 {
				_, err = c.Write(rest[0])
			} else {
				_, err = c.Writev(rest[:k])
			}
			g.dead = err != nil
			rest = rest[k:]
		}
		s.stats.flushes.Add(1)
		s.metrics.flushed()
	}
	clear(iov)
	g.iov = iov[:0]
	cc.recycle(small, bufs)
	// Cached read responses in the immediate buffer count from now on, with the read bytes
	// taken from the queue (already counted).
	imm := int64(cc.immediateRead)
	cc.resetImmediate()
	if g.dead {
		cc.transitBytes.Store(0)
		s.unwrittenReads.Add(-cc.readTransit.Swap(0))
		return
	}
	g.settle(imm)
	s.updateMaxOutbound(cc.transitBytes.Load() + cc.queuedBytes.Load())
}

// settle records what gnet still holds of the connection's written responses, imm being read
// bytes just written that are not counted yet. Read workers see transitBytes until the next
// settle: gnet drains its buffer without telling us, so it can only overstate the backlog;
// while gnet holds anything the connection is polled (setUnflushed) and settles again then.
func (g *gnetConn) settle(imm int64) {
	cc := &g.cc
	out := int64(g.c.OutboundBuffered())
	if cc.transitBytes.Load() != out {
		cc.transitBytes.Store(out)
	}
	// Of the read bytes written, gnet can hold at most what it holds in all.
	taken := cc.readTransit.Load() // only this loop changes it while the connection is open
	if held := min(taken+imm, out); held != taken {
		cc.readTransit.Store(held)
		cc.srv.unwrittenReads.Add(held - taken)
	}
	cc.srv.setUnflushed(cc, out > 0)
}

// gnetLogger sends gnet's printf-style log lines to slog (its Fatalf does not exit here).
// While the server stops gnet, gnet's errors (the acceptor failing on the shut listener) are
// logged at debug level.
type gnetLogger struct {
	l     *slog.Logger
	quiet *atomic.Bool
}

func (g gnetLogger) Debugf(format string, args ...any) { g.log(slog.LevelDebug, format, args) }
func (g gnetLogger) Infof(format string, args ...any)  { g.log(slog.LevelDebug, format, args) }
func (g gnetLogger) Warnf(format string, args ...any)  { g.log(slog.LevelWarn, format, args) }
func (g gnetLogger) Errorf(format string, args ...any) { g.log(g.errorLevel(), format, args) }
func (g gnetLogger) Fatalf(format string, args ...any) { g.log(slog.LevelError, format, args) }

func (g gnetLogger) errorLevel() slog.Level {
	if g.quiet.Load() {
		return slog.LevelDebug
	}
	return slog.LevelError
}

func (g gnetLogger) log(level slog.Level, format string, args []any) {
	ctx := context.Background()
	if g.l.Enabled(ctx, level) {
		g.l.Log(ctx, level, "gnet: "+fmt.Sprintf(format, args...))
	}
}
