package server

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// Server states.
const (
	stateNew = iota
	stateRunning
	stateStopping
	stateStopped
)

// Server is the bookie's network server: a gnet listener for plaintext connections and an
// optional crypto/tls listener, both serving BookKeeper's v2 protocol against a Storage.
type Server struct {
	cfg       Config
	storage   Storage
	log       *slog.Logger
	metrics   *Metrics
	addDone   func(ctx any, err error) // s.completeAdd, bound once so an add allocates no closure
	fenceDone func(ctx any, err error)

	addsInFlight  atomic.Int64
	readsInFlight atomic.Int64
	draining      atomic.Bool
	stats         serverStats

	// unwrittenReads: bytes of read responses made and not yet taken by a socket, over all
	// connections (queued, or held by gnet's outbound buffer or a TLS write in progress); at
	// most about MaxUnwrittenReadBytes (reserveReadBytes).
	unwrittenReads atomic.Int64

	addOps    sync.Pool // *addOp
	readTasks sync.Pool // *readTask
	pool      workerPool[*readTask]
	blocking  blockingAdds
	// gnetStopping is set when Stop shuts gnet's listener (see stopGnet).
	gnetStopping atomic.Bool
	listenerFD   int // a dup of gnet's listening socket (-1: none)

	resumeKick chan struct{} // capacity 1: a connection was paused or left bytes unflushed
	resumeQuit chan struct{}
	resumeDone chan struct{}

	// mu protects the fields below.
	mu       sync.Mutex
	state    int
	conns    map[*connState]struct{}
	polled   map[*connState]struct{} // woken every ResumeInterval: paused or unflushed
	addr     net.Addr
	tlsAddr  net.Addr
	engine   gnet.Engine
	gnetDone chan error // receives gnet.Run's result
	tlsLn    net.Listener
	tlsConns map[*stdConn]struct{}
	tlsWG    sync.WaitGroup // TLS accept loop and connection goroutines
}

// serverStats are the server's counters (see Stats).
type serverStats struct {
	connections      atomic.Int64
	flushes          atomic.Int64
	responsesQueued  atomic.Int64
	cachedReads      atomic.Int64
	rejected         atomic.Int64
	badRequests      atomic.Int64
	protocolCloses   atomic.Int64
	slowClientCloses atomic.Int64
	authFailures     atomic.Int64
	panics           atomic.Int64
	pausedNow        atomic.Int64
	pauses           atomic.Int64
	maxOutbound      atomic.Int64
}

// Stats is a snapshot of the server's counters.
type Stats struct {
	Connections      int64 // open connections
	AddsInFlight     int64 // adds handed to Storage.Add and not yet answered
	ReadsInFlight    int64 // reads queued for or running on the worker pool
	Flushes          int64 // writes of queued responses: one per connection per flush
	ResponsesQueued  int64 // responses queued by add completions and read workers
	CachedReads      int64 // reads answered on the reader from Storage.ReadCached
	Rejected         int64 // requests answered ETOOMANYREQUESTS
	BadRequests      int64 // requests answered EBADREQ or EBADVERSION
	ProtocolCloses   int64 // connections closed for undecodable or oversize frames
	SlowClientCloses int64 // connections closed for exceeding the inbound limit while paused
	AuthFailures     int64 // authentications refused
	Panics           int64 // panics recovered (each closed its connection)
	PausedNow        int64 // connections whose decoding is paused now
	Pauses           int64 // times a connection's decoding was paused
	MaxOutbound      int64 // largest outbound backlog seen on one plaintext connection, bytes
	// UnwrittenReadBytes is the read response bytes made and not yet taken by a socket, over
	// all connections (bounded by MaxUnwrittenReadBytes).
	UnwrittenReadBytes int64
}

// New validates cfg (after filling defaults) and returns a server that is not yet listening.
func New(cfg Config, storage Storage) (*Server, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if storage == nil {
		return nil, fmt.Errorf("%w: nil Storage", ErrBadConfig)
	}
	s := &Server{
		cfg:        cfg,
		storage:    storage,
		log:        cfg.Logger,
		metrics:    cfg.Metrics,
		fenceDone:  completeFence,
		resumeKick: make(chan struct{}, 1),
		resumeQuit: make(chan struct{}),
		resumeDone: make(chan struct{}),
		conns:      make(map[*connState]struct{}),
		polled:     make(map[*connState]struct{}),
		listenerFD: -1,
		tlsConns:   make(map[*stdConn]struct{}),
	}
	s.addDone = s.completeAdd
	return s, nil
}

// Start listens on the plaintext address (and the TLS address if configured) and returns once
// both accept connections; Addr and TLSAddr then report the bound addresses.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateNew {
		return fmt.Errorf("%w: Start on a server that was already started", ErrState)
	}
	s.metrics.bind(s)
	s.startReadPool()
	s.blocking.start(s, blockingAddWorkers, blockingAddQueue)
	go s.resumeLoop()
	if err := s.startGnet(); err != nil {
		s.abortStartLocked()
		return err
	}
	if s.cfg.TLSAddr != "" {
		if err := s.startTLS(); err != nil {
			s.abortStartLocked()
			return err
		}
	}
	s.state = stateRunning
	s.log.Info("server: listening", "addr", s.addr, "tls_addr", s.tlsAddr,
		"event_loops", s.cfg.NumEventLoops, "read_workers", s.cfg.NumReadWorkerThreads, "auth", s.cfg.Auth != nil)
	return nil
}

// abortStartLocked undoes a failed Start; the server cannot be started again.
func (s *Server) abortStartLocked() {
	s.state = stateStopping // Start and Stop refuse meanwhile
	if s.gnetDone != nil {
		// The event loops take mu as they open and close connections: a client that connected
		// meanwhile would deadlock a wait made with mu held.
		s.mu.Unlock()
		_ = s.engine.Stop(canceledContext())
		<-s.gnetDone
		s.mu.Lock()
	}
	if s.listenerFD >= 0 {
		_ = unix.Close(s.listenerFD)
		s.listenerFD = -1
	}
	close(s.resumeQuit)
	<-s.resumeDone
	_ = s.stopReadPool(context.Background()) // nothing ran: the workers exit at once
	_ = s.blocking.stop(context.Background(), s)
	s.state = stateStopped
}

// Addr is the plaintext listener's address (nil before Start).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// TLSAddr is the TLS listener's address (nil before Start or without TLS).
func (s *Server) TLSAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tlsAddr
}

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		Connections:      s.stats.connections.Load(),
		AddsInFlight:     s.addsInFlight.Load(),
		ReadsInFlight:    s.readsInFlight.Load(),
		Flushes:          s.stats.flushes.Load(),
		ResponsesQueued:  s.stats.responsesQueued.Load(),
		CachedReads:      s.stats.cachedReads.Load(),
		Rejected:         s.stats.rejected.Load(),
		BadRequests:      s.stats.badRequests.Load(),
		ProtocolCloses:   s.stats.protocolCloses.Load(),
		SlowClientCloses: s.stats.slowClientCloses.Load(),
		AuthFailures:     s.stats.authFailures.Load(),
		Panics:           s.stats.panics.Load(),
		PausedNow:        s.stats.pausedNow.Load(),
		Pauses:           s.stats.pauses.Load(),
		MaxOutbound:      s.stats.maxOutbound.Load(),

		UnwrittenReadBytes: s.unwrittenReads.Load(),
	}
}

// Stop shuts the server down gracefully: it stops accepting connections and decoding requests,
// waits (bounded by ctx) for in-flight adds and reads to be answered and their responses to
// be handed to the sockets, then closes every connection and stops the workers. It returns
// ctx's error if the wait was cut short; the server is stopped either way.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.state != stateRunning {
		s.mu.Unlock()
		if s.state == stateNew {
			return fmt.Errorf("%w: Stop on a server that was not started", ErrState)
		}
		return nil
	}
	s.state = stateStopping
	s.draining.Store(true)
	if s.tlsLn != nil {
		_ = s.tlsLn.Close()
	}
	for t := range s.tlsConns {
		t.interruptRead()
	}
	s.mu.Unlock()

	err := s.waitIdle(ctx)
	if err != nil {
		s.log.Warn("server: stopping with requests still in flight", "adds", s.addsInFlight.Load(),
			"reads", s.readsInFlight.Load(), "err", err)
	}

	// Close the connections: gnet closes its own (writing what is buffered, best effort).
	if gerr := s.stopGnet(ctx); gerr != nil && err == nil {
		err = gerr
	}
	s.mu.Lock()
	for t := range s.tlsConns {
		t.cc.closeAsync()
	}
	s.mu.Unlock()
	if werr := waitGroup(ctx, &s.tlsWG); werr != nil && err == nil {
		err = werr
	}
	close(s.resumeQuit)
	<-s.resumeDone
	if perr := s.stopReadPool(ctx); perr != nil && err == nil {
		err = perr
	}
	if berr := s.blocking.stop(ctx, s); berr != nil && err == nil {
		err = berr
	}

	s.mu.Lock()
	s.state = stateStopped
	s.mu.Unlock()
	s.log.Info("server: stopped", "err", err)
	return err
}

// waitIdle waits until nothing is in flight and every connection's response queue has been
// taken by its writer (for TLS connections: written).
func (s *Server) waitIdle(ctx context.Context) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if s.addsInFlight.Load() == 0 && s.readsInFlight.Load() == 0 && s.queuesEmpty() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (s *Server) queuesEmpty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for cc := range s.conns {
		if cc.queuedBytes.Load() != 0 {
			return false
		}
	}
	for t := range s.tlsConns {
		if t.cc.transitBytes.Load() != 0 {
			return false
		}
	}
	return true
}

func waitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func canceledContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func (s *Server) register(cc *connState) {
	s.mu.Lock()
	s.conns[cc] = struct{}{}
	s.mu.Unlock()
	s.stats.connections.Add(1)
}

func (s *Server) unregister(cc *connState) {
	s.mu.Lock()
	delete(s.conns, cc)
	delete(s.polled, cc)
	s.mu.Unlock()
	if cc.paused {
		cc.paused = false
		s.stats.pausedNow.Add(-1)
	}
	s.stats.connections.Add(-1)
}

// setPaused records that the connection's reader stopped (or resumed) decoding because too
// many response bytes are queued. A paused connection is woken every ResumeInterval so that
// it notices when its client has read enough (gnet reports no "outbound drained" event).
func (s *Server) setPaused(cc *connState, paused bool) {
	if cc.paused == paused {
		return
	}
	cc.paused = paused
	if paused {
		s.stats.pausedNow.Add(1)
		s.stats.pauses.Add(1)
	} else {
		s.stats.pausedNow.Add(-1)
	}
	s.updatePolled(cc)
}

// setUnflushed records (on the reader) whether gnet kept response bytes that the socket did not
// take. Such a connection is woken every ResumeInterval until they are gone, so that its
// writer learns what the socket took: gnet drains its buffer without telling, and the read
// bytes it holds count against MaxUnwrittenReadBytes until the writer sees them go.
func (s *Server) setUnflushed(cc *connState, unflushed bool) {
	if cc.unflushed == unflushed {
		return
	}
	cc.unflushed = unflushed
	s.updatePolled(cc)
}

// updatePolled puts the connection in the set resumeLoop wakes, or takes it out, as its reader
// state asks.
func (s *Server) updatePolled(cc *connState) {
	want := cc.paused || cc.unflushed
	if cc.polled == want {
		return
	}
	cc.polled = want
	s.mu.Lock()
	if want {
		s.polled[cc] = struct{}{}
	} else {
		delete(s.polled, cc)
	}
	s.mu.Unlock()
	if want {
		select {
		case s.resumeKick <- struct{}{}:
		default:
		}
	}
}

// resumeLoop wakes polled connections (paused, or with bytes gnet has not sent) every
// ResumeInterval while there are any.
func (s *Server) resumeLoop() {
	defer close(s.resumeDone)
	var batch []*connState
	for {
		select {
		case <-s.resumeKick:
		case <-s.resumeQuit:
			return
		}
		for {
			select {
			case <-time.After(s.cfg.ResumeInterval):
			case <-s.resumeQuit:
				return
			}
			s.mu.Lock()
			batch = batch[:0]
			for cc := range s.polled {
				batch = append(batch, cc)
			}
			s.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, cc := range batch {
				cc.wakeIfOpen()
			}
			clear(batch)
		}
	}
}

// reserveReadBytes counts n more unwritten read bytes if the total stays within allowance, or
// if nothing is held (a response larger than the allowance must still be able to go out).
func (s *Server) reserveReadBytes(n, allowance int64) bool {
	for {
		cur := s.unwrittenReads.Load()
		if cur > 0 && cur+n > allowance {
			return false
		}
		if s.unwrittenReads.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// updateMaxOutbound records a connection's outbound backlog high-water mark.
func (s *Server) updateMaxOutbound(n int64) {
	for {
		cur := s.stats.maxOutbound.Load()
		if n <= cur || s.stats.maxOutbound.CompareAndSwap(cur, n) {
			return
		}
	}
}

var errNotListening = errors.New("server: listener did not start")
