package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// readBufferSize is a connection's initial receive buffer. It grows to the largest frame in
// progress (at most MaxFrameSize) and keeps that size while the connection lives.
const readBufferSize = 64 << 10

// run is the goroutine of connection attempt gen: it connects, then writes until the
// connection fails or closes.
func (c *Conn) run(gen uint64) {
	defer c.p.wg.Done()
	nc, fr, kind, err := c.connect(gen)
	if err != nil {
		if nc != nil {
			_ = nc.Close()
		}
		c.fail(gen, false, kind, err)
		return
	}
	c.mu.Lock()
	if c.gen != gen || c.state != stateConnecting {
		c.mu.Unlock()
		_ = nc.Close()
		return
	}
	c.state, c.readyAt = stateReady, monotime.Now()
	c.lastRecv.Store(monotime.Now())
	c.p.wg.Add(1)
	go c.readLoop(gen, nc, fr)
	c.mu.Unlock()
	c.stats.connects.Add(1)
	c.p.log.Debug("transport: connected", "addr", c.addr, "tls", c.p.tls != nil, "auth", c.p.cfg.AuthPlugin)
	c.writeLoop(gen, nc)
}

// connect dials (TLS included) and runs the AUTH exchange, all within DialTimeout. The
// returned frameReader holds anything the bookie sent after its AUTH response. On error nc
// may be non-nil (the caller closes it) and kind says which sentinel the failure is.
func (c *Conn) connect(gen uint64) (nc net.Conn, fr *frameReader, kind, err error) {
	cfg := &c.p.cfg
	ctx, cancel := context.WithTimeout(c.p.ctx, cfg.DialTimeout)
	defer cancel()
	start := time.Now()
	d := &net.Dialer{}
	if c.p.tls != nil {
		nc, err = (&tls.Dialer{NetDialer: d, Config: c.p.tls}).DialContext(ctx, "tcp", c.addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", c.addr)
	}
	if err != nil {
		return nil, nil, ErrConnection, err
	}
	// Publish the socket so that Pool.Close can interrupt the AUTH exchange.
	c.mu.Lock()
	if c.gen != gen || c.state != stateConnecting {
		c.mu.Unlock()
		return nc, nil, ErrClosed, ErrClosed
	}
	c.nc = nc
	c.mu.Unlock()

	fr = &frameReader{buf: make([]byte, readBufferSize), max: cfg.MaxFrameSize}
	if cfg.AuthPlugin == "" {
		return nc, fr, nil, nil
	}
	_ = nc.SetDeadline(start.Add(cfg.DialTimeout))
	if err := c.authenticate(nc, fr); err != nil {
		return nc, nil, ErrAuth, err
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, fr, nil, nil
}

// authenticate sends one AUTH request and waits for the bookie's AUTH response. A bookie
// that refuses closes the connection.
func (c *Conn) authenticate(nc net.Conn, fr *frameReader) error {
	cfg := &c.p.cfg
	req, err := protocol.AppendAuthRequest(nil, protocol.AuthRequest{
		Header:  protocol.Header{Version: protocol.CurrentVersion, Op: protocol.OpAuth},
		Message: protocol.AuthMessage{PluginName: []byte(cfg.AuthPlugin), Payload: cfg.AuthPayload}})
	if err != nil {
		return err
	}
	if _, err := nc.Write(req); err != nil {
		return err
	}
	for {
		frame, err := fr.next()
		if err != nil {
			return err
		}
		if frame == nil {
			if err := fr.fill(nc); err != nil {
				return fmt.Errorf("waiting for the AUTH response: %w", err)
			}
			continue
		}
		var resp protocol.Response
		if err := protocol.DecodeResponse(frame, &resp); err != nil {
			return err
		}
		if resp.Header.Op != protocol.OpAuth {
			return fmt.Errorf("bookie answered AUTH with %v", resp.Header.Op)
		}
		if got := string(resp.Auth.Message.PluginName); got != cfg.AuthPlugin {
			return fmt.Errorf("AUTH response from plugin %q, sent %q", got, cfg.AuthPlugin)
		}
		return nil
	}
}

// writeLoop writes everything queued since the last write in one Write: while a write is in
// progress, callers append to the other buffer, so requests batch naturally under load.
func (c *Conn) writeLoop(gen uint64, nc net.Conn) {
	var out []byte
	for {
		c.mu.Lock()
		if out != nil && c.spare == nil {
			c.spare = out[:0]
		}
		for c.gen == gen && len(c.wbuf) == 0 {
			c.writerCond.Wait()
		}
		if c.gen != gen {
			c.mu.Unlock()
			return
		}
		out, c.wbuf, c.spare = c.wbuf, c.spare, nil
		c.signalSpaceLocked()
		c.mu.Unlock()
		c.stats.writes.Add(1)
		if _, err := nc.Write(out); err != nil {
			c.fail(gen, true, ErrConnection, err)
			return
		}
	}
}

// completion is one decoded response, matched (r != nil) or not.
type completion struct {
	r     *request
	key   reqKey
	rc    protocol.ReturnCode
	entry []byte
}

// readLoop decodes responses, matches them to pending requests and runs their callbacks, on
// this goroutine. It handles every complete frame of one socket read under one lock, then
// runs the callbacks unlocked (their entries alias fr's buffer, which is not touched until
// they have returned).
func (c *Conn) readLoop(gen uint64, nc net.Conn, fr *frameReader) {
	defer c.p.wg.Done()
	var resp protocol.Response
	batch := make([]completion, 0, 64)
	for {
		var ferr error
		c.mu.Lock()
		if c.gen != gen {
			c.mu.Unlock()
			return
		}
		for {
			frame, err := fr.next()
			if err != nil {
				ferr = err
				break
			}
			if frame == nil {
				break
			}
			if err := protocol.DecodeResponse(frame, &resp); err != nil {
				ferr = err
				break
			}
			batch = append(batch, c.matchLocked(&resp))
		}
		c.mu.Unlock()

		for i := range batch {
			cp := &batch[i]
			if cp.r != nil {
				cp.r.finish(cp.rc, cp.entry, nil)
			} else {
				c.stats.unmatched.Add(1)
				c.p.log.Debug("transport: dropped a response that answers no pending request", "addr", c.addr,
					"op", cp.key.op, "ledger", cp.key.ledgerID, "entry", cp.key.entryID, "rc", cp.rc)
			}
			*cp = completion{}
		}
		batch = batch[:0]
		if ferr != nil {
			c.fail(gen, true, ErrConnection, fmt.Errorf("bad response: %w", ferr))
			return
		}
		if err := fr.fill(nc); err != nil {
			c.fail(gen, true, ErrConnection, err)
			return
		}
		c.lastRecv.Store(monotime.Now())
	}
}

// matchLocked takes the pending request a decoded response answers, if any.
func (c *Conn) matchLocked(resp *protocol.Response) completion {
	var cp completion
	switch resp.Header.Op {
	case protocol.OpAddEntry:
		cp.key = reqKey{ledgerID: resp.Add.LedgerID, entryID: resp.Add.EntryID, op: protocol.OpAddEntry}
		cp.rc = resp.Add.RC
	case protocol.OpReadEntry:
		cp.key = reqKey{ledgerID: resp.Read.LedgerID, entryID: resp.Read.EntryID, op: protocol.OpReadEntry}
		cp.rc, cp.entry = resp.Read.RC, resp.Read.Entry
	default: // AUTH or batch read: never asked for on an established connection
		cp.key = reqKey{op: resp.Header.Op}
		return cp
	}
	cp.r = c.pending.pop(cp.key)
	if cp.r != nil && cp.r.ghost { // the late answer to a request that timed out: dropped
		*cp.r = request{}
		requestPool.Put(cp.r)
		cp.r = nil
	}
	return cp
}

// frameReader splits a byte stream into frames in one reusable buffer.
type frameReader struct {
	buf        []byte
	start, end int // unconsumed bytes are buf[start:end]
	need       int // size of the incomplete frame at start (at least the length prefix)
	max        int // MaxFrameSize
}

// next returns the next complete frame (after its length prefix), or nil when more bytes
// are needed. The frame aliases the buffer until the next fill. A bad or oversize length
// prefix is an error: the stream cannot be resynchronised.
func (fr *frameReader) next() ([]byte, error) {
	size, complete, err := protocol.SplitFrame(fr.buf[fr.start:fr.end], fr.max)
	if err != nil {
		return nil, err
	}
	if !complete {
		fr.need = max(size, protocol.LengthPrefixSize)
		return nil, nil
	}
	f := fr.buf[fr.start+protocol.LengthPrefixSize : fr.start+size]
	fr.start += size
	return f, nil
}

// fill makes room for the incomplete frame (moving it to the front, growing the buffer up to
// its size) and reads once from nc.
func (fr *frameReader) fill(nc net.Conn) error {
	if fr.start == fr.end {
		fr.start, fr.end = 0, 0
	}
	if need := max(fr.need, protocol.LengthPrefixSize); fr.start+need > len(fr.buf) {
		buf := fr.buf
		if need > len(buf) {
			buf = make([]byte, min(max(need, 2*len(buf)), max(fr.max, need)))
		}
		fr.end = copy(buf, fr.buf[fr.start:fr.end])
		fr.buf, fr.start = buf, 0
	}
	n, err := nc.Read(fr.buf[fr.end:])
	fr.end += n
	if n > 0 {
		return nil
	}
	if err == nil {
		return errors.New("transport: empty read")
	}
	return err
}
