package transport

import (
	"context"
	"crypto/tls"
	"log/slog"
	"sync"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
)

// Pool holds one multiplexed connection per bookie address, shared by every ledger of a
// client (BookKeeper's numChannelsPerBookie=1). It owns the goroutines of its connections and
// one completer goroutine that times requests out and delivers the failures decided on a
// caller's goroutine.
type Pool struct {
	cfg Config
	tls *tls.Config // cfg.TLS cloned, nil for plaintext
	log *slog.Logger

	ctx     context.Context // canceled by Close: aborts dials and handshakes
	cancel  context.CancelFunc
	wg      sync.WaitGroup // connection goroutines (connect+write, read)
	blocked sync.WaitGroup // callers blocked on a full queue

	closing  chan struct{} // closed by Close once every connection is closed
	loopDone chan struct{} // closed when the completer has exited
	failKick chan struct{} // capacity 1: failed has requests

	// mu protects conns and closed.
	mu     sync.RWMutex
	conns  map[string]*Conn
	closed bool

	// failMu protects failed and loopExited.
	failMu     sync.Mutex
	failed     reqList // requests failed on a caller's goroutine, each with its err set
	loopExited bool    // the completer is gone: failures are delivered where they happen
}

// NewPool validates cfg (after filling in defaults) and returns a pool with no connections;
// each connection is made on the first request to its address.
func NewPool(cfg Config) (*Pool, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:      cfg,
		log:      cfg.Logger,
		closing:  make(chan struct{}),
		loopDone: make(chan struct{}),
		failKick: make(chan struct{}, 1),
		conns:    make(map[string]*Conn),
	}
	if cfg.TLS != nil {
		p.tls = cfg.TLS.Clone()
		if cfg.TLSHostnameVerificationDisabled && !p.tls.InsecureSkipVerify {
			verifyWithoutHostname(p.tls)
		}
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	go p.loop()
	return p, nil
}

// Conn returns the connection for addr (host:port), creating it (unconnected) on first use.
// It never returns nil; after Close it returns a closed connection whose requests fail with
// ErrClosed.
func (p *Pool) Conn(addr string) *Conn {
	p.mu.RLock()
	c := p.conns[addr]
	closed := p.closed
	p.mu.RUnlock()
	if c != nil {
		return c
	}
	if closed {
		return newConn(p, addr, stateClosed)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c = p.conns[addr]; c != nil {
		return c
	}
	if p.closed {
		return newConn(p, addr, stateClosed)
	}
	c = newConn(p, addr, stateIdle)
	p.conns[addr] = c
	return c
}

// adopt returns the pool's connection to c's address for a request made on c after the pool
// forgot it: c itself, back in service, unless the pool has made another meanwhile.
func (p *Pool) adopt(c *Conn) *Conn {
	p.mu.RLock()
	other, closed := p.conns[c.addr], p.closed
	p.mu.RUnlock()
	if other != nil && !closed { // the usual case for a ledger that kept c: no write lock
		return other
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return newConn(p, c.addr, stateClosed)
	}
	if other := p.conns[c.addr]; other != nil {
		return other
	}
	c.mu.Lock()
	if c.state == stateForgotten {
		c.state = stateIdle
	}
	c.mu.Unlock()
	p.conns[c.addr] = c
	return c
}

// forgetIdle removes the connections that are down and have had no request for
// IdleConnectionTTL (see Config.IdleConnectionTTL).
func (p *Pool) forgetIdle() {
	now := monotime.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.conns {
		if c.forget(now) {
			delete(p.conns, addr)
		}
	}
}

// Close closes every connection and fails every pending request with ErrClosed. When it
// returns, every callback has run and every goroutine of the pool has exited; requests made
// afterwards fail with ErrClosed (their callback then runs before Add or Read returns, the
// only case where it runs on the caller's goroutine). Close is idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.loopDone
		p.wg.Wait()
		return nil
	}
	p.closed = true
	conns := make([]*Conn, 0, len(p.conns))
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()

	// Close the connections before canceling the dials: a dial that saw the cancellation
	// first would fail its connection's requests with ErrConnection instead of ErrClosed.
	for _, c := range conns {
		c.close()
	}
	p.cancel()
	p.blocked.Wait() // woken by close; their ErrClosed goes to the completer
	close(p.closing)
	p.wg.Wait()
	<-p.loopDone
	return nil
}

// failAsync delivers r's failure on the completer goroutine, so that a callback never runs on
// the goroutine that called Add or Read (which may hold a lock the callback takes).
func (p *Pool) failAsync(r *request, err error) {
	r.err = err
	p.failMu.Lock()
	if p.loopExited {
		p.failMu.Unlock()
		r.finish(0, nil, err)
		return
	}
	p.failed.push(r)
	p.failMu.Unlock()
	select {
	case p.failKick <- struct{}{}:
	default:
	}
}

// loop is the completer goroutine: it expires timed-out requests every tick and delivers the
// failures queued by failAsync. It exits after Close, once no failure is left to deliver.
func (p *Pool) loop() {
	defer close(p.loopDone)
	tick := time.NewTicker(p.cfg.tickInterval())
	defer tick.Stop()
	var conns []*Conn
	closing := false
	forgetEvery := int64(min(p.cfg.IdleConnectionTTL/4, time.Minute))
	lastForget := monotime.Now()
	for {
		select {
		case <-tick.C:
			conns = p.expireAll(conns)
			if now := monotime.Now(); now-lastForget >= forgetEvery {
				p.forgetIdle()
				lastForget = now
			}
		case <-p.failKick:
		case <-p.closing:
			closing = true
		}
		p.failMu.Lock()
		failed := p.failed
		p.failed = reqList{}
		if closing && failed.head == nil {
			p.loopExited = true
			p.failMu.Unlock()
			return
		}
		p.failMu.Unlock()
		failed.failAll(nil)
	}
}

// expireAll fails every request past its deadline with ErrTimeout. conns is scratch space,
// returned for reuse.
func (p *Pool) expireAll(conns []*Conn) []*Conn {
	conns = conns[:0]
	p.mu.RLock()
	for _, c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.RUnlock()
	now := monotime.Now()
	for i, c := range conns {
		var expired reqList
		if c.expire(now, &expired) > 0 {
			expired.failAll(ErrTimeout)
		}
		conns[i] = nil
	}
	return conns[:0]
}
