package transport

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// AddCallback receives the outcome of an add: err != nil when the request could not be
// completed (see the sentinels), else the bookie's return code. It runs on a transport
// goroutine and must not block.
type AddCallback func(ctx any, rc protocol.ReturnCode, err error)

// ReadCallback receives the outcome of a read: err != nil when the request could not be
// completed, else the bookie's return code and, for EOK, the stored entry. entry aliases the
// connection's receive buffer and is valid only during the call: copy what is kept. It runs
// on a transport goroutine and must not block.
type ReadCallback func(ctx any, rc protocol.ReturnCode, entry []byte, err error)

// Connection states.
const (
	stateIdle       = iota // no connection; the next request connects
	stateConnecting        // dial, TLS handshake, AUTH in progress; requests queue
	stateReady             // connected; the writer flushes the queue
	stateBackoff           // the last attempt failed; requests fail fast until retryAt
	stateClosed            // the pool was closed
	stateForgotten         // down and unused for IdleConnectionTTL: no longer in the pool
)

// addFrameOverhead is an add frame's size besides the stored entry: length prefix, packet
// header, master key.
const addFrameOverhead = protocol.LengthPrefixSize + protocol.HeaderSize + protocol.MasterKeyLength

// Conn is the connection to one bookie, shared by every ledger that uses the bookie. It is
// safe for concurrent use. Requests are pipelined; each gets exactly one callback, never on
// the goroutine that called Add or Read (except after Pool.Close has returned): with err !=
// nil when the request could not be completed (connect failure, connection lost, timeout,
// closed, too many pending, bad or oversize request), else with the bookie's return code.
type Conn struct {
	p    *Pool
	addr string

	stats connCounters
	// lastRecv is when the current connection was established or last received bytes
	// (monotime): a connection silent for a whole request timeout while requests time out on it
	// is closed as unresponsive.
	lastRecv atomic.Int64

	// mu protects everything below.
	mu         sync.Mutex
	writerCond sync.Cond // signalled when wbuf becomes non-empty or gen changes
	state      int
	// gen identifies the current connection attempt; goroutines of an older one exit.
	gen     uint64
	nc      net.Conn // set once dialed (so Close can interrupt the handshake)
	pending pendingSet
	wbuf    []byte // encoded requests not yet taken by the writer
	spare   []byte // the writer's other buffer, when it is not writing it
	space   chan struct{}
	// failures counts consecutive failed connection attempts, and connections that died
	// young (see stableConnectionAge) after the first; youngLoss is set by that first one;
	// readyAt is when the current connection became ready.
	failures   int
	youngLoss  bool
	readyAt    int64 // monotime
	retryAt    int64 // end of the backoff (monotime)
	backoffErr error // what requests fail with during the backoff
	lastUsed   int64 // when the last request was made (monotime)
}

type connCounters struct {
	connects        atomic.Int64
	connectFailures atomic.Int64
	losses          atomic.Int64
	timeouts        atomic.Int64
	unresponsive    atomic.Int64
	unmatched       atomic.Int64
	held            atomic.Int64
	writes          atomic.Int64
	requests        atomic.Int64
}

// ConnStats is a snapshot of a connection's counters.
type ConnStats struct {
	Pending         int   // requests sent, queued or held, and not yet answered (timed-out ones awaiting their late answer included)
	Requests        int64 // requests accepted (queued for sending)
	Writes          int64 // socket writes; Requests/Writes is the batching factor
	Connects        int64 // connections established (AUTH included)
	ConnectFailures int64 // failed connection attempts (dial, TLS, AUTH)
	Losses          int64 // established connections that failed
	Timeouts        int64 // requests failed with ErrTimeout
	Unresponsive    int64 // connections closed for receiving nothing for a whole request timeout
	Unmatched       int64 // responses that answered no pending request (late, after a timeout) and were dropped
	Held            int64 // requests held back while one for the same entry with other flags was in flight
}

func newConn(p *Pool, addr string, state int) *Conn {
	c := &Conn{p: p, addr: addr, state: state, lastUsed: monotime.Now()}
	c.writerCond.L = &c.mu
	c.pending.send = c.queueLocked
	return c
}

// Addr is the bookie's address.
func (c *Conn) Addr() string { return c.addr }

// Healthy reports whether requests can be expected to go through: the connection is up,
// being made, or was never tried, and is not in backoff after a failure.
func (c *Conn) Healthy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.state {
	case stateClosed:
		return false
	case stateBackoff:
		return monotime.Now() >= c.retryAt
	}
	return true
}

// Stats returns a snapshot of the connection's counters.
func (c *Conn) Stats() ConnStats {
	c.mu.Lock()
	n := c.pending.n
	c.mu.Unlock()
	return ConnStats{
		Pending:         n,
		Requests:        c.stats.requests.Load(),
		Writes:          c.stats.writes.Load(),
		Connects:        c.stats.connects.Load(),
		ConnectFailures: c.stats.connectFailures.Load(),
		Losses:          c.stats.losses.Load(),
		Timeouts:        c.stats.timeouts.Load(),
		Unresponsive:    c.stats.unresponsive.Load(),
		Unmatched:       c.stats.unmatched.Load(),
		Held:            c.stats.held.Load(),
	}
}

// frame describes one request to encode.
type frame struct {
	op       protocol.OpCode
	flags    protocol.Flags
	ledgerID int64
	entryID  int64
	key      *[protocol.MasterKeyLength]byte
	entry    [][]byte
	size     int // encoded size, length prefix included
}

func (f *frame) appendTo(buf []byte) []byte {
	hdr := protocol.Header{Version: protocol.CurrentVersion, Op: f.op, Flags: f.flags}
	if f.op == protocol.OpReadEntry {
		r := protocol.ReadRequest{Header: hdr, LedgerID: f.ledgerID, EntryID: f.entryID}
		if f.key != nil {
			r.MasterKey, r.HasMasterKey = *f.key, true
		}
		return protocol.AppendReadRequest(buf, r)
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(f.size-protocol.LengthPrefixSize))
	buf = binary.BigEndian.AppendUint32(buf, hdr.Uint32())
	buf = append(buf, f.key[:]...)
	for _, part := range f.entry {
		buf = append(buf, part...)
	}
	return buf
}

// Add sends an add of the stored entry given as parts (for example the 32-byte header and
// digest, then the payload), which are sent back to back. The caller keeps the parts
// unchanged until the callback. ledgerID and entryID must be the ids at the start of the
// entry (the bookie answers with those); masterKey is the ledger's key. flags may carry
// protocol.FlagRecoveryAdd and protocol.FlagHighPriority.
//
// An add whose frame would exceed MaxFrameSize fails with ErrEntryTooLarge and a malformed
// one with ErrBadRequest, before anything is sent.
func (c *Conn) Add(ledgerID, entryID int64, masterKey *[protocol.MasterKeyLength]byte, flags protocol.Flags,
	entry [][]byte, cb AddCallback, ctx any) {
	r := getRequest()
	r.key = reqKey{ledgerID: ledgerID, entryID: entryID, op: protocol.OpAddEntry}
	r.add, r.ctx, r.kind = cb, ctx, flags&kindFlags
	n := 0
	for _, part := range entry {
		n += len(part)
	}
	f := frame{op: protocol.OpAddEntry, flags: flags, ledgerID: ledgerID, entryID: entryID, key: masterKey,
		entry: entry, size: addFrameOverhead + n}
	switch {
	case f.size > c.p.cfg.MaxFrameSize:
		c.p.failAsync(r, ErrEntryTooLarge)
		return
	case masterKey == nil || n < protocol.StoredEntryHeaderSize:
		c.p.failAsync(r, ErrBadRequest)
		return
	}
	if l, e := entryIDs(entry); l != ledgerID || e != entryID {
		c.p.failAsync(r, ErrBadRequest)
		return
	}
	c.submit(context.Background(), r, &f, c.p.cfg.AddTimeout)
}

// entryIDs reads the ledger and entry ids at the start of a stored entry given as parts
// (at least 16 bytes long).
func entryIDs(parts [][]byte) (ledgerID, entryID int64) {
	var ids [16]byte
	n := 0
	for _, part := range parts {
		n += copy(ids[n:], part)
		if n == len(ids) {
			break
		}
	}
	return int64(binary.BigEndian.Uint64(ids[:8])), int64(binary.BigEndian.Uint64(ids[8:]))
}

// Read sends a read of entryID (protocol.LastAddConfirmedEntryID, -1, asks for the last
// entry). With protocol.FlagDoFencing it is a fencing read and masterKey is required; without
// it masterKey is ignored. flags may also carry protocol.FlagHighPriority.
func (c *Conn) Read(ledgerID, entryID int64, flags protocol.Flags, masterKey *[protocol.MasterKeyLength]byte,
	cb ReadCallback, ctx any) {
	c.ReadContext(context.Background(), ledgerID, entryID, flags, masterKey, cb, ctx)
}

// ReadContext is Read whose caller, if it blocks on a full queue (see
// Config.MaxQueuedBytesPerConn), also stops waiting when ctx ends: the read then fails with
// ctx.Err(), unsent. ctx bounds that wait only; a read that was queued runs to its response or
// timeout. cbCtx is passed to cb.
func (c *Conn) ReadContext(ctx context.Context, ledgerID, entryID int64, flags protocol.Flags,
	masterKey *[protocol.MasterKeyLength]byte, cb ReadCallback, cbCtx any) {
	r := getRequest()
	r.key = reqKey{ledgerID: ledgerID, entryID: entryID, op: protocol.OpReadEntry}
	r.read, r.ctx, r.kind = cb, cbCtx, flags&kindFlags
	f := frame{op: protocol.OpReadEntry, flags: flags, ledgerID: ledgerID, entryID: entryID}
	if flags.Has(protocol.FlagDoFencing) {
		if masterKey == nil {
			c.p.failAsync(r, ErrBadRequest)
			return
		}
		f.key = masterKey
	}
	f.size = protocol.LengthPrefixSize + protocol.HeaderSize + 16
	if f.key != nil {
		f.size += protocol.MasterKeyLength
	}
	c.submit(ctx, r, &f, c.p.cfg.ReadTimeout)
}

// submit queues the encoded request and registers it as pending, starting a connection if
// there is none. It may block while the queue is over MaxQueuedBytesPerConn (at most until
// the request's timeout, or until ctx ends). Held requests (see pendingSet) count as queued
// bytes.
func (c *Conn) submit(ctx context.Context, r *request, f *frame, timeout time.Duration) {
	now := monotime.Now()
	expiry := now + min(int64(timeout), math.MaxInt64-now)
	waited := false
	defer func() {
		if waited {
			c.p.blocked.Done()
		}
	}()
	for {
		c.mu.Lock()
		c.lastUsed = now
		switch c.state {
		case stateForgotten:
			// A ledger kept this connection while the pool forgot it: the pool's connection to
			// the address takes the request (this one again, if there is none).
			c.mu.Unlock()
			c.p.adopt(c).submit(ctx, r, f, timeout)
			return
		case stateClosed:
			c.mu.Unlock()
			c.p.failAsync(r, ErrClosed)
			return
		case stateBackoff:
			if now < c.retryAt {
				err := c.backoffErr
				c.mu.Unlock()
				c.p.failAsync(r, err)
				return
			}
			c.connectLocked()
		case stateIdle:
			c.connectLocked()
		}
		if c.pending.n >= c.p.cfg.MaxPendingPerConn {
			c.mu.Unlock()
			c.p.failAsync(r, ErrTooManyPending)
			return
		}
		if queued := len(c.wbuf) + c.pending.heldBytes; queued > 0 && queued+f.size > c.p.cfg.MaxQueuedBytesPerConn {
			if now >= expiry {
				c.mu.Unlock()
				c.stats.timeouts.Add(1)
				c.p.failAsync(r, ErrTimeout)
				return
			}
			if !waited {
				waited = true
				c.p.blocked.Add(1) // under c.mu, state not closed: before Close's Wait
			}
			c.waitSpaceUnlock(ctx.Done(), time.Duration(expiry-now))
			if err := ctx.Err(); err != nil {
				c.p.failAsync(r, err)
				return
			}
			now = monotime.Now()
			continue
		}
		r.expiry = expiry
		held := c.pending.insert(r)
		if held {
			c.pending.hold(r, f.appendTo(make([]byte, 0, f.size)))
		} else {
			wasEmpty := len(c.wbuf) == 0
			c.wbuf = f.appendTo(c.wbuf)
			if wasEmpty && c.state == stateReady {
				c.writerCond.Signal()
			}
		}
		c.mu.Unlock()
		if held {
			c.stats.held.Add(1)
		}
		c.stats.requests.Add(1)
		return
	}
}

// queueLocked queues a released held request's frame for the writer.
func (c *Conn) queueLocked(frame []byte) {
	wasEmpty := len(c.wbuf) == 0
	c.wbuf = append(c.wbuf, frame...)
	if wasEmpty && c.state == stateReady {
		c.writerCond.Signal()
	}
}

// forget takes an unused connection that is down out of service, reporting whether it did;
// the caller holds the pool's mu and removes it from the pool.
func (c *Conn) forget(now int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	down := c.state == stateIdle || c.state == stateBackoff
	if !down || c.pending.n > 0 || len(c.wbuf) > 0 || now-c.lastUsed < int64(c.p.cfg.IdleConnectionTTL) {
		return false
	}
	c.state = stateForgotten
	c.spare = nil
	return true
}

// waitSpaceUnlock releases the mutex and waits until the writer takes the queue, the
// connection fails or closes, d passes or done is closed. Only a blocked caller allocates
// here.
func (c *Conn) waitSpaceUnlock(done <-chan struct{}, d time.Duration) {
	if c.space == nil {
		c.space = make(chan struct{})
	}
	ch := c.space
	c.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-c.p.closing:
	case <-done:
	}
}

// signalSpaceLocked wakes the callers blocked on a full queue.
func (c *Conn) signalSpaceLocked() {
	if c.space != nil {
		close(c.space)
		c.space = nil
	}
}

// connectLocked starts a connection attempt; the goroutine becomes the writer once connected.
func (c *Conn) connectLocked() {
	c.state = stateConnecting
	c.gen++
	c.p.wg.Add(1)
	go c.run(c.gen)
}

// unresponsiveMinSilence is the least silence that closes a connection as unresponsive, so
// that sub-second test timeouts and scheduling stalls never do.
const unresponsiveMinSilence = time.Second

// expire moves the requests past their deadline to out. If the connection has received
// nothing since the oldest of them was sent, it is half-open or its bookie is wedged (a peer that
// vanished without a RST, a process frozen with its socket open): it is failed, so that the
// requests behind the expired ones do not wait out their own timeouts too, and the next
// request connects afresh.
func (c *Conn) expire(now int64, out *reqList) int {
	c.mu.Lock()
	last := c.lastRecv.Load()
	silent := c.state == stateReady && now-last >= int64(unresponsiveMinSilence) &&
		c.pending.silentSince(now, last, c.p.cfg.AddTimeout, c.p.cfg.ReadTimeout)
	held := c.pending.heldBytes
	n := c.pending.expire(now, out)
	if c.pending.heldBytes < held { // fewer bytes held: a blocked caller may fit now
		c.signalSpaceLocked()
	}
	gen := c.gen
	c.mu.Unlock()
	if n > 0 {
		c.stats.timeouts.Add(int64(n))
	}
	if silent {
		c.stats.unresponsive.Add(1)
		c.fail(gen, true, ErrConnection, errUnresponsive)
	}
	return n
}

// close is Pool.Close for one connection: pending requests go to the completer with
// ErrClosed.
func (c *Conn) close() {
	var failed reqList
	c.mu.Lock()
	c.state = stateClosed
	c.gen++
	c.pending.takeAll(&failed)
	nc := c.nc
	c.nc, c.wbuf, c.spare = nil, nil, nil
	c.writerCond.Broadcast()
	c.signalSpaceLocked()
	c.mu.Unlock()
	if nc != nil {
		_ = nc.Close()
	}
	for r := failed.head; r != nil; {
		next := r.nextAge
		c.p.failAsync(r, ErrClosed)
		r = next
	}
}

// fail ends connection attempt gen: every pending request fails with an error wrapping kind
// (ErrConnection or ErrAuth) and cause, on the calling goroutine (a connection goroutine).
// A connection that never became ready puts the Conn in backoff; losing an established one
// leaves it idle, to reconnect on the next request, unless it died young (see
// stableConnectionAge) more than once in a row: that too backs off.
func (c *Conn) fail(gen uint64, established bool, kind, cause error) {
	var failed reqList
	c.mu.Lock()
	if c.gen != gen || c.state == stateClosed {
		c.mu.Unlock()
		return
	}
	err := fmt.Errorf("%w: %s: %w", kind, c.addr, cause)
	c.pending.takeAll(&failed)
	nc := c.nc
	c.nc = nil
	c.wbuf = c.wbuf[:0]
	c.gen++
	now := monotime.Now()
	backoff := !established
	switch {
	case !established:
		c.failures++
	case now-c.readyAt >= int64(stableConnectionAge):
		c.failures, c.youngLoss = 0, false
	default:
		// Died young: a bookie that accepts and then drops connections (crash-looping,
		// shedding load) must not be redialled in a tight loop. The first such loss after a
		// connection that lived still redials at once, like any loss, and is no failed
		// attempt: the next one backs off for ReconnectMin.
		backoff = c.failures > 0 || c.youngLoss
		if backoff {
			c.failures++
		}
		c.youngLoss = true
	}
	var delay time.Duration
	if backoff {
		delay = c.p.cfg.ReconnectMin
		for i := 1; i < c.failures && delay < c.p.cfg.ReconnectMax; i++ {
			delay = min(delay, c.p.cfg.ReconnectMax/2) * 2
		}
		delay = min(delay, c.p.cfg.ReconnectMax)
		c.state = stateBackoff
		c.retryAt = now + min(int64(delay), math.MaxInt64-now)
		c.backoffErr = fmt.Errorf("%w: %s: in reconnect backoff (%v) after: %w", ErrConnection, c.addr, delay, err)
	} else {
		c.state = stateIdle
	}
	c.writerCond.Broadcast()
	c.signalSpaceLocked()
	c.mu.Unlock()

	if nc != nil {
		_ = nc.Close()
	}
	if established {
		c.stats.losses.Add(1)
		c.p.log.Warn("transport: connection lost", "addr", c.addr, "backoff", delay, "err", cause)
	} else {
		c.stats.connectFailures.Add(1)
		c.p.log.Warn("transport: connect failed", "addr", c.addr, "backoff", delay, "err", err)
	}
	failed.failAll(err)
}
