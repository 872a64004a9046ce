package transport

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

func TestConfig(t *testing.T) {
	var c Config
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.DialTimeout != 10*time.Second || c.AddTimeout != 5*time.Second || c.ReadTimeout != 5*time.Second ||
		c.MaxFrameSize != protocol.DefaultMaxFrameSize || c.ReconnectMin != 100*time.Millisecond ||
		c.ReconnectMax != 5*time.Second || c.MaxPendingPerConn != 100000 || c.MaxQueuedBytesPerConn != 16<<20 {
		t.Fatalf("defaults: %+v", c)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"DialTimeout", func(c *Config) { c.DialTimeout = -1 }},
		{"AddTimeout", func(c *Config) { c.AddTimeout = -1 }},
		{"ReadTimeout", func(c *Config) { c.ReadTimeout = -1 }},
		{"MaxFrameSize", func(c *Config) { c.MaxFrameSize = 100 }},
		{"ReconnectMin", func(c *Config) { c.ReconnectMin = -1 }},
		{"ReconnectMax", func(c *Config) { c.ReconnectMin, c.ReconnectMax = time.Second, time.Millisecond }},
		{"MaxPendingPerConn", func(c *Config) { c.MaxPendingPerConn = -1 }},
		{"MaxQueuedBytesPerConn", func(c *Config) { c.MaxQueuedBytesPerConn = c.MaxFrameSize - 1 }},
		{"AuthPayload", func(c *Config) { c.AuthPayload = []byte("x") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			c.EnsureDefaults()
			tc.mod(&c)
			if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
				t.Fatalf("Validate: %v, want ErrBadConfig", err)
			}
			if _, err := NewPool(c); !errors.Is(err, ErrBadConfig) {
				t.Fatalf("NewPool: %v, want ErrBadConfig", err)
			}
		})
	}
	if err := (&Config{}).Validate(); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("zero config without defaults: %v", err)
	}
}

func TestAddReadRoundTrip(t *testing.T) {
	b := startBookie(t)
	p := newPool(t, Config{})
	conn := p.Conn(b.addr)
	if conn != p.Conn(b.addr) {
		t.Fatal("Conn returned two connections for one address")
	}
	if conn.Addr() != b.addr || !conn.Healthy() {
		t.Fatalf("Addr %q Healthy %v", conn.Addr(), conn.Healthy())
	}
	col := newCollector(64)
	for e := range int64(3) {
		conn.Add(1, e, &keyA, 0, parts(1, e, payloadOf(1, e, 100)), col.onAdd, e)
	}
	conn.Add(2, 0, &keyB, 0, parts(2, 0, []byte("other ledger")), col.onAdd, "l2")
	for _, r := range col.wait(t, 4) {
		if r.err != nil || r.rc != protocol.EOK {
			t.Fatalf("add %v: rc %v err %v", r.ctx, r.rc, r.err)
		}
	}

	check := func(ledgerID, entryID int64, flags protocol.Flags, key *[protocol.MasterKeyLength]byte,
		wantRC protocol.ReturnCode, want []byte) {
		t.Helper()
		conn.Read(ledgerID, entryID, flags, key, col.onRead, nil)
		r := col.one(t)
		if r.err != nil || r.rc != wantRC {
			t.Fatalf("read %d/%d: rc %v err %v, want %v", ledgerID, entryID, r.rc, r.err, wantRC)
		}
		if want != nil && !bytes.Equal(r.entry, want) {
			t.Fatalf("read %d/%d: wrong entry", ledgerID, entryID)
		}
	}
	for e := range int64(3) {
		check(1, e, 0, nil, protocol.EOK, servertest.Entry(1, e, e-1, payloadOf(1, e, 100)))
	}
	check(1, protocol.LastAddConfirmedEntryID, 0, nil, protocol.EOK, servertest.Entry(1, 2, 1, payloadOf(1, 2, 100)))
	check(1, 7, 0, nil, protocol.ENOENTRY, nil)
	check(9, 0, 0, nil, protocol.ENOLEDGER, nil)

	// Return codes from the bookie are passed through with err == nil.
	conn.Add(1, 3, &keyB, 0, parts(1, 3, []byte("wrong key")), col.onAdd, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EUA {
		t.Fatalf("add with the wrong key: rc %v err %v", r.rc, r.err)
	}
	// A fencing read, then a normal add is fenced and a recovery add goes through.
	check(2, protocol.LastAddConfirmedEntryID, protocol.FlagDoFencing, &keyB, protocol.EOK, nil)
	conn.Add(2, 1, &keyB, 0, parts(2, 1, []byte("late")), col.onAdd, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EFENCED {
		t.Fatalf("add to a fenced ledger: rc %v err %v", r.rc, r.err)
	}
	conn.Add(2, 1, &keyB, protocol.FlagRecoveryAdd, parts(2, 1, []byte("recovered")), col.onAdd, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EOK {
		t.Fatalf("recovery add: rc %v err %v", r.rc, r.err)
	}
	st := conn.Stats()
	if st.Connects != 1 || st.Pending != 0 || st.Unmatched != 0 || st.Timeouts != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLargeEntry grows the receive buffer past its initial size.
func TestLargeEntry(t *testing.T) {
	b := startBookie(t)
	p := newPool(t, Config{})
	conn := p.Conn(b.addr)
	col := newCollector(4)
	payload := payloadOf(5, 0, 3<<20)
	conn.Add(5, 0, &keyA, 0, parts(5, 0, payload), col.onAdd, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EOK {
		t.Fatalf("add: rc %v err %v", r.rc, r.err)
	}
	conn.Read(5, 0, 0, nil, col.onRead, nil)
	r := col.one(t)
	if r.err != nil || r.rc != protocol.EOK || !bytes.Equal(r.entry, servertest.Entry(5, 0, -1, payload)) {
		t.Fatalf("read: rc %v err %v len %d", r.rc, r.err, len(r.entry))
	}
}

func TestPipelinedAdds(t *testing.T) {
	const (
		writers   = 4
		perWriter = 2500
	)
	b := startBookie(t)
	p := newPool(t, Config{})
	conn := p.Conn(b.addr)
	col := newCollector(writers * perWriter)
	conn.Read(1, 0, 0, nil, col.onRead, nil) // connect first: measure batching on a live connection
	col.one(t)
	var wg sync.WaitGroup
	for w := range int64(writers) {
		wg.Go(func() {
			for e := range int64(perWriter) {
				conn.Add(w+1, e, &keyA, 0, parts(w+1, e, payloadOf(w+1, e, 64)), col.onAdd, [2]int64{w + 1, e})
			}
		})
	}
	wg.Wait()
	next := map[int64]int64{}
	for _, r := range col.wait(t, writers*perWriter) {
		if r.err != nil || r.rc != protocol.EOK {
			t.Fatalf("add %v: rc %v err %v", r.ctx, r.rc, r.err)
		}
		// One connection, one journal order: each ledger's adds complete in order.
		id := r.ctx.([2]int64)
		if id[1] != next[id[0]] {
			t.Fatalf("ledger %d: entry %d completed, expected %d", id[0], id[1], next[id[0]])
		}
		next[id[0]]++
	}
	st := conn.Stats()
	t.Logf("%d requests in %d writes", st.Requests, st.Writes)
	if st.Writes >= st.Requests {
		t.Errorf("no batching: %d writes for %d requests", st.Writes, st.Requests)
	}

	// Read everything back, pipelined.
	for w := range int64(writers) {
		for e := range int64(perWriter) {
			conn.Read(w+1, e, 0, nil, col.onRead, [2]int64{w + 1, e})
		}
	}
	for _, r := range col.wait(t, writers*perWriter) {
		id := r.ctx.([2]int64)
		if r.err != nil || r.rc != protocol.EOK || !bytes.Equal(r.entry, servertest.Entry(id[0], id[1], id[1]-1, payloadOf(id[0], id[1], 64))) {
			t.Fatalf("read %v: rc %v err %v", id, r.rc, r.err)
		}
	}
}

// TestOutOfOrderReads: the bookie's read workers answer entry 0 last; every response still
// reaches its own request.
func TestOutOfOrderReads(t *testing.T) {
	b := startBookie(t, func(_ *server.Config, st *servertest.MemStorage) { st.DisableCache = true })
	p := newPool(t, Config{})
	conn := p.Conn(b.addr)
	col := newCollector(64)
	const n = 6
	for e := range int64(n) {
		conn.Add(1, e, &keyA, 0, parts(1, e, payloadOf(1, e, 200)), col.onAdd, nil)
	}
	col.wait(t, n)

	release := make(chan struct{})
	b.st.SetReadHook(func(_, entryID int64) {
		if entryID == 0 {
			<-release
		}
	})
	for e := range int64(n) {
		conn.Read(1, e, 0, nil, col.onRead, e)
	}
	got := col.wait(t, n-1) // everything but entry 0, which is held
	close(release)
	got = append(got, col.one(t))
	if got[len(got)-1].ctx != int64(0) {
		t.Fatalf("entry 0 answered before it was released")
	}
	for _, r := range got {
		e := r.ctx.(int64)
		if r.err != nil || r.rc != protocol.EOK || !bytes.Equal(r.entry, servertest.Entry(1, e, e-1, payloadOf(1, e, 200))) {
			t.Fatalf("read %d: rc %v err %v, wrong match", e, r.rc, r.err)
		}
	}
}

// TestMatching drives a fake bookie: responses in reverse order, duplicate keys answered
// FIFO, adds and reads with the same ids kept apart, unknown responses dropped.
func TestMatching(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{})
	conn := p.Conn(fb.addr())
	col := newCollector(16)

	conn.Read(1, 1, 0, nil, col.onRead, "r1")
	conn.Read(1, 2, 0, nil, col.onRead, "r2")
	conn.Read(1, 1, 0, nil, col.onRead, "r1-dup")
	conn.Add(1, 1, &keyA, 0, parts(1, 1, []byte("x")), col.onAdd, "a1")
	conn.Add(1, 1, &keyA, 0, parts(1, 1, []byte("x")), col.onAdd, "a1-dup")
	fc := fb.accept(t)
	for range 5 {
		fc.next(t)
	}
	// An answer nobody asked for, then the real ones out of order.
	fc.answerRead(t, 9, 9, protocol.EOK, []byte("stray"))
	fc.answerAdd(t, 1, 1, protocol.EOK)
	fc.answerRead(t, 1, 2, protocol.EOK, []byte("two"))
	fc.answerRead(t, 1, 1, protocol.EOK, []byte("first"))
	fc.answerAdd(t, 1, 1, protocol.EFENCED)
	fc.answerRead(t, 1, 1, protocol.ENOENTRY, nil)

	want := []struct {
		ctx   string
		rc    protocol.ReturnCode
		entry string
	}{
		{"a1", protocol.EOK, ""},
		{"r2", protocol.EOK, "two"},
		{"r1", protocol.EOK, "first"},
		{"a1-dup", protocol.EFENCED, ""},
		{"r1-dup", protocol.ENOENTRY, ""},
	}
	for i, r := range col.wait(t, len(want)) {
		w := want[i]
		if r.err != nil || r.ctx != w.ctx || r.rc != w.rc || string(r.entry) != w.entry {
			t.Fatalf("callback %d: ctx %v rc %v entry %q err %v, want %+v", i, r.ctx, r.rc, r.entry, r.err, w)
		}
	}
	if st := conn.Stats(); st.Unmatched != 1 || st.Pending != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTimeout(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{AddTimeout: 100 * time.Millisecond, ReadTimeout: 250 * time.Millisecond})
	conn := p.Conn(fb.addr())
	col := newCollector(16)

	start := time.Now()
	conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, "add")
	conn.Read(1, 0, 0, nil, col.onRead, "read")
	fc := fb.accept(t)
	fc.next(t)
	fc.next(t)

	r := col.one(t)
	addAt := time.Since(start)
	if r.ctx != "add" || !errors.Is(r.err, ErrTimeout) {
		t.Fatalf("first callback: ctx %v err %v, want the add's ErrTimeout", r.ctx, r.err)
	}
	r = col.one(t)
	readAt := time.Since(start)
	if r.ctx != "read" || !errors.Is(r.err, ErrTimeout) {
		t.Fatalf("second callback: ctx %v err %v, want the read's ErrTimeout", r.ctx, r.err)
	}
	if addAt < 100*time.Millisecond || readAt < 250*time.Millisecond || readAt > 2*time.Second {
		t.Fatalf("timeouts after %v and %v", addAt, readAt)
	}
	if !conn.Healthy() {
		t.Fatal("a timeout made the connection unhealthy")
	}

	// Late responses are dropped; the connection stays up and serves new requests.
	fc.answerAdd(t, 1, 0, protocol.EOK)
	fc.answerRead(t, 1, 0, protocol.EOK, []byte("late"))
	eventually(t, "late responses counted", func() bool { return conn.Stats().Unmatched == 2 })
	col.expectNone(t, 20*time.Millisecond)

	conn.Add(1, 1, &keyA, 0, parts(1, 1, []byte("y")), col.onAdd, "again")
	fc.next(t)
	fc.answerAdd(t, 1, 1, protocol.EOK)
	if r := col.one(t); r.ctx != "again" || r.err != nil || r.rc != protocol.EOK {
		t.Fatalf("after timeouts: ctx %v rc %v err %v", r.ctx, r.rc, r.err)
	}
	if st := conn.Stats(); st.Timeouts != 2 || st.Connects != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConnectRefusedBackoffAndRecovery(t *testing.T) {
	addr := freeAddr(t)
	p := newPool(t, Config{ReconnectMin: 200 * time.Millisecond, ReconnectMax: 400 * time.Millisecond})
	conn := p.Conn(addr)
	col := newCollector(16)

	conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, nil)
	if r := col.one(t); !errors.Is(r.err, ErrConnection) {
		t.Fatalf("add to a closed port: %v, want ErrConnection", r.err)
	}
	if conn.Healthy() {
		t.Fatal("healthy right after a failed connect")
	}
	// In backoff: fail fast, without dialing.
	start := time.Now()
	conn.Read(1, 0, 0, nil, col.onRead, nil)
	if r := col.one(t); !errors.Is(r.err, ErrConnection) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("read in backoff: %v after %v", r.err, time.Since(start))
	}
	if st := conn.Stats(); st.ConnectFailures != 1 {
		t.Fatalf("stats %+v: one failed attempt expected", st)
	}

	// A bookie appears on the address; after the backoff the next request reconnects.
	startBookie(t, withAddr(addr))
	eventually(t, "backoff to end", conn.Healthy)
	conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EOK {
		t.Fatalf("add after recovery: rc %v err %v", r.rc, r.err)
	}
}

func TestBackoffGrows(t *testing.T) {
	addr := freeAddr(t)
	p := newPool(t, Config{ReconnectMin: 20 * time.Millisecond, ReconnectMax: 60 * time.Millisecond})
	conn := p.Conn(addr)
	col := newCollector(16)
	var waits []time.Duration
	for range 4 {
		conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, nil)
		if r := col.one(t); !errors.Is(r.err, ErrConnection) {
			t.Fatalf("add: %v", r.err)
		}
		start := time.Now()
		eventually(t, "backoff to end", conn.Healthy)
		waits = append(waits, time.Since(start))
	}
	// 20ms, 40ms, 60ms, 60ms (each measured from just after the failure).
	if waits[1] < 30*time.Millisecond || waits[3] < 50*time.Millisecond || waits[3] > 2*time.Second {
		t.Fatalf("backoff waits %v", waits)
	}
	if st := conn.Stats(); st.ConnectFailures != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestServerKilledMidFlight(t *testing.T) {
	b := startBookie(t)
	p := newPool(t, Config{})
	conn := p.Conn(b.addr)
	col := newCollector(256)
	conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, nil)
	col.one(t)

	const n = 100
	b.st.Hold()
	for e := range int64(n) {
		conn.Add(1, e+1, &keyA, 0, parts(1, e+1, []byte("x")), col.onAdd, nil)
	}
	eventually(t, "adds to reach the storage", func() bool { return b.st.Queued() == n })
	b.stop()
	for _, r := range col.wait(t, n) {
		if !errors.Is(r.err, ErrConnection) {
			t.Fatalf("pending add: rc %v err %v, want ErrConnection", r.rc, r.err)
		}
	}
	b.st.Release()
	if st := conn.Stats(); st.Losses != 1 || st.Pending != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Losing an established connection is not a failed attempt: no backoff, the next request
	// redials at once (TestReconnectAfterLoss).
	if !conn.Healthy() {
		t.Fatal("unhealthy after losing an established connection")
	}
}

func TestReconnectAfterLoss(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{})
	conn := p.Conn(fb.addr())
	col := newCollector(16)
	conn.Read(1, 0, 0, nil, col.onRead, "first")
	fc := fb.accept(t)
	fc.next(t)
	fc.close()
	if r := col.one(t); !errors.Is(r.err, ErrConnection) {
		t.Fatalf("read on a closed connection: %v", r.err)
	}
	if !conn.Healthy() {
		t.Fatal("losing an established connection should not back off")
	}
	conn.Read(1, 0, 0, nil, col.onRead, "second")
	fc = fb.accept(t)
	req := fc.next(t)
	fc.answerRead(t, req.Read.LedgerID, req.Read.EntryID, protocol.ENOENTRY, nil)
	if r := col.one(t); r.ctx != "second" || r.err != nil || r.rc != protocol.ENOENTRY {
		t.Fatalf("after reconnect: ctx %v rc %v err %v", r.ctx, r.rc, r.err)
	}
	if st := conn.Stats(); st.Connects != 2 || st.Losses != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestConnectionsDyingYoungBackOff: a bookie that accepts connections and drops them at once
// (crash-looping, shedding load) is redialled with the backoff, not once per request.
func TestConnectionsDyingYoungBackOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = nc.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	p := newPool(t, Config{ReconnectMin: 50 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	conn := p.Conn(ln.Addr().String())
	col := newCollector(1)
	const period = 500 * time.Millisecond
	requests := 0
	for start := time.Now(); time.Since(start) < period; requests++ {
		conn.Read(1, 0, 0, nil, col.onRead, nil)
		if r := col.one(t); !errors.Is(r.err, ErrConnection) {
			t.Fatalf("read from a bookie that drops connections: rc %v err %v", r.rc, r.err)
		}
	}
	// Two connections at once (the first loss redials at once), then one per backoff
	// (50 ms, then 100 ms): about 7 in 500 ms, against one per request without the backoff.
	if n := accepted.Load(); n > 12 || requests < 20 {
		t.Fatalf("%d connections for %d requests in %v", n, requests, period)
	}
}

// TestUnresponsiveConnectionIsReplaced: a bookie that keeps the socket open but answers
// nothing (a half-open connection, a wedged process) must not hold the connection forever:
// once a request times out with nothing received since it was sent, the connection is closed
// and the next request connects afresh.
func TestUnresponsiveConnectionIsReplaced(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{AddTimeout: unresponsiveMinSilence, ReadTimeout: 5 * unresponsiveMinSilence})
	conn := p.Conn(fb.addr())
	col := newCollector(16)
	conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, "answered")
	fc := fb.accept(t)
	fc.next(t)
	fc.answerAdd(t, 1, 0, protocol.EOK)
	if r := col.one(t); r.ctx != "answered" || r.err != nil {
		t.Fatalf("first add: ctx %v err %v", r.ctx, r.err)
	}
	conn.Add(1, 1, &keyA, 0, parts(1, 1, []byte("y")), col.onAdd, "ignored")
	conn.Read(1, 0, 0, nil, col.onRead, "behind")
	fc.next(t)
	fc.next(t)
	// The add times out; the read behind it fails at once with the connection, not after its
	// own timeout.
	start := time.Now()
	for range 2 {
		r := col.one(t)
		switch {
		case r.ctx == "ignored" && errors.Is(r.err, ErrTimeout):
		case r.ctx == "behind" && errors.Is(r.err, ErrConnection) && time.Since(start) < 2*unresponsiveMinSilence:
		default:
			t.Fatalf("ctx %v err %v after %v: want the add's ErrTimeout and the read's ErrConnection", r.ctx, r.err, time.Since(start))
		}
	}
	_ = fc.nc.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := fc.nc.Read(make([]byte, 1)); err == nil {
		t.Fatal("the unresponsive connection was not closed")
	}
	conn.Add(1, 1, &keyA, 0, parts(1, 1, []byte("y")), col.onAdd, "retry")
	fc = fb.accept(t)
	fc.next(t)
	fc.answerAdd(t, 1, 1, protocol.EOK)
	if r := col.one(t); r.ctx != "retry" || r.err != nil {
		t.Fatalf("after reconnecting: ctx %v err %v", r.ctx, r.err)
	}
	if st := conn.Stats(); st.Unresponsive != 1 || st.Connects != 2 || st.Timeouts != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestBadResponseFrame: an oversize or undecodable response frame ends the connection.
func TestBadResponseFrame(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"oversize", []byte{0x7f, 0xff, 0xff, 0xff}},
		{"too short", []byte{0, 0, 0, 1, 0}},
		{"unknown op", []byte{0, 0, 0, 4, 2, 9, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFakeBookie(t)
			p := newPool(t, Config{MaxFrameSize: 4096})
			conn := p.Conn(fb.addr())
			col := newCollector(4)
			conn.Read(1, 0, 0, nil, col.onRead, nil)
			fc := fb.accept(t)
			fc.next(t)
			fc.send(t, tc.frame)
			if r := col.one(t); !errors.Is(r.err, ErrConnection) {
				t.Fatalf("read: %v, want ErrConnection", r.err)
			}
		})
	}
}

func TestTLSAndAuth(t *testing.T) {
	b := startBookie(t, withTLS(t), withAuth("s3cret"))
	t.Run("ok", func(t *testing.T) {
		p := newPool(t, Config{TLS: b.tlsClient, AuthPlugin: server.TokenAuthPluginName, AuthPayload: []byte("s3cret")})
		conn := p.Conn(b.tlsAddr)
		col := newCollector(4)
		conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("over tls")), col.onAdd, nil)
		if r := col.one(t); r.err != nil || r.rc != protocol.EOK {
			t.Fatalf("add: rc %v err %v", r.rc, r.err)
		}
		conn.Read(1, 0, 0, nil, col.onRead, nil)
		if r := col.one(t); r.err != nil || r.rc != protocol.EOK || !bytes.Equal(r.entry, servertest.Entry(1, 0, -1, []byte("over tls"))) {
			t.Fatalf("read: rc %v err %v", r.rc, r.err)
		}
	})
	t.Run("wrong token", func(t *testing.T) {
		p := newPool(t, Config{TLS: b.tlsClient, AuthPlugin: server.TokenAuthPluginName, AuthPayload: []byte("guess"),
			ReconnectMin: time.Minute, ReconnectMax: time.Minute})
		conn := p.Conn(b.tlsAddr)
		col := newCollector(4)
		conn.Add(1, 1, &keyA, 0, parts(1, 1, []byte("x")), col.onAdd, nil)
		if r := col.one(t); !errors.Is(r.err, ErrAuth) {
			t.Fatalf("add: %v, want ErrAuth", r.err)
		}
		conn.Add(1, 1, &keyA, 0, parts(1, 1, []byte("x")), col.onAdd, nil)
		if r := col.one(t); !errors.Is(r.err, ErrConnection) || !errors.Is(r.err, ErrAuth) {
			t.Fatalf("add in backoff: %v, want ErrConnection wrapping ErrAuth", r.err)
		}
	})
	t.Run("untrusted certificate", func(t *testing.T) {
		p := newPool(t, Config{TLS: &tls.Config{MinVersion: tls.VersionTLS12}, AuthPlugin: server.TokenAuthPluginName, AuthPayload: []byte("s3cret")})
		col := newCollector(4)
		p.Conn(b.tlsAddr).Read(1, 0, 0, nil, col.onRead, nil)
		if r := col.one(t); !errors.Is(r.err, ErrConnection) || errors.Is(r.err, ErrAuth) {
			t.Fatalf("read: %v, want ErrConnection", r.err)
		}
	})
	t.Run("plaintext without auth", func(t *testing.T) {
		// The bookie answers every request EUA until the connection authenticates.
		p := newPool(t, Config{})
		col := newCollector(4)
		p.Conn(b.addr).Read(1, 0, 0, nil, col.onRead, nil)
		if r := col.one(t); r.err != nil || r.rc != protocol.EUA {
			t.Fatalf("read: rc %v err %v, want EUA", r.rc, r.err)
		}
	})
	t.Run("plaintext with auth", func(t *testing.T) {
		p := newPool(t, Config{AuthPlugin: server.TokenAuthPluginName, AuthPayload: []byte("s3cret")})
		col := newCollector(4)
		p.Conn(b.addr).Read(1, 0, 0, nil, col.onRead, nil)
		if r := col.one(t); r.err != nil || r.rc != protocol.EOK {
			t.Fatalf("read: rc %v err %v", r.rc, r.err)
		}
	})
	t.Run("wrong plugin", func(t *testing.T) {
		p := newPool(t, Config{AuthPlugin: "other", AuthPayload: []byte("s3cret")})
		col := newCollector(4)
		p.Conn(b.addr).Read(1, 0, 0, nil, col.onRead, nil)
		if r := col.one(t); !errors.Is(r.err, ErrAuth) {
			t.Fatalf("read: %v, want ErrAuth", r.err)
		}
	})
}

// TestAuthIsFirst: with AUTH configured, nothing but the AUTH request goes out until the
// bookie answers it; queued requests follow.
func TestAuthIsFirst(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{AuthPlugin: "plug", AuthPayload: []byte("tok")})
	conn := p.Conn(fb.addr())
	col := newCollector(4)
	conn.Read(1, 0, 0, nil, col.onRead, nil)
	fc := fb.accept(t)
	req := fc.next(t)
	if req.Header.Op != protocol.OpAuth || string(req.Auth.Message.PluginName) != "plug" || string(req.Auth.Message.Payload) != "tok" {
		t.Fatalf("first request: %+v", req)
	}
	_ = fc.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var one [1]byte
	if n, _ := fc.nc.Read(one[:]); n != 0 {
		t.Fatal("a request was sent before the AUTH response")
	}
	b, err := protocol.AppendAuthResponse(nil, protocol.AuthResponse{
		Header:  protocol.Header{Version: protocol.CurrentVersion, Op: protocol.OpAuth},
		Message: protocol.AuthMessage{PluginName: []byte("plug")}})
	if err != nil {
		t.Fatal(err)
	}
	fc.send(t, b)
	req = fc.next(t)
	if req.Header.Op != protocol.OpReadEntry {
		t.Fatalf("after AUTH: %v", req.Header.Op)
	}
	fc.answerRead(t, 1, 0, protocol.ENOENTRY, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.ENOENTRY {
		t.Fatalf("read: rc %v err %v", r.rc, r.err)
	}
}

// TestQueueBackpressure: while the connection cannot be made (the bookie never answers AUTH),
// requests queue up to MaxQueuedBytesPerConn; the next one blocks until its timeout.
func TestQueueBackpressure(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{AuthPlugin: "plug", MaxFrameSize: 4096, MaxQueuedBytesPerConn: 4096,
		AddTimeout: 150 * time.Millisecond, DialTimeout: 400 * time.Millisecond, ReconnectMin: time.Minute, ReconnectMax: time.Minute})
	conn := p.Conn(fb.addr())
	col := newCollector(16)
	payload := make([]byte, 1000) // 1060-byte frames: three fit in 4096
	for e := range int64(3) {
		conn.Add(1, e, &keyA, 0, parts(1, e, payload), col.onAdd, e)
	}
	start := time.Now()
	conn.Add(1, 3, &keyA, 0, parts(1, 3, payload), col.onAdd, int64(3))
	blocked := time.Since(start)
	if blocked < 100*time.Millisecond {
		t.Fatalf("the fourth add returned after %v; it should have blocked until its timeout", blocked)
	}
	for _, r := range col.wait(t, 4) {
		if !errors.Is(r.err, ErrTimeout) {
			t.Fatalf("add %v: %v, want ErrTimeout", r.ctx, r.err)
		}
	}
	fb.accept(t) // the connection was made; its AUTH went unanswered
}

// TestAuthTimeout: a bookie that never answers AUTH fails the attempt after DialTimeout.
func TestAuthTimeout(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{AuthPlugin: "plug", DialTimeout: 150 * time.Millisecond})
	col := newCollector(4)
	p.Conn(fb.addr()).Read(1, 0, 0, nil, col.onRead, nil)
	if r := col.one(t); !errors.Is(r.err, ErrAuth) {
		t.Fatalf("read: %v, want ErrAuth", r.err)
	}
}

func TestEntryTooLarge(t *testing.T) {
	fb := newFakeBookie(t)
	const maxFrame = 4096
	p := newPool(t, Config{MaxFrameSize: maxFrame})
	conn := p.Conn(fb.addr())
	col := newCollector(4)
	// Frame = 4 (length) + 4 (header) + 20 (key) + 32 (entry header) + payload.
	conn.Add(1, 0, &keyA, 0, parts(1, 0, make([]byte, maxFrame-60+1)), col.onAdd, nil)
	if r := col.one(t); !errors.Is(r.err, ErrEntryTooLarge) {
		t.Fatalf("oversize add: %v, want ErrEntryTooLarge", r.err)
	}
	if st := conn.Stats(); st.Requests != 0 || st.Connects != 0 || st.ConnectFailures != 0 {
		t.Fatalf("an oversize add reached the connection: %+v", st)
	}
	if !conn.Healthy() {
		t.Fatal("an oversize entry made the connection unhealthy")
	}
	// The largest entry that fits goes out.
	conn.Add(1, 0, &keyA, 0, parts(1, 0, make([]byte, maxFrame-60)), col.onAdd, nil)
	fc := fb.accept(t)
	req := fc.next(t)
	if len(req.Add.Entry) != maxFrame-28 {
		t.Fatalf("entry of %d bytes sent", len(req.Add.Entry))
	}
	fc.answerAdd(t, 1, 0, protocol.EOK)
	if r := col.one(t); r.err != nil {
		t.Fatalf("largest add: %v", r.err)
	}
}

func TestBadRequest(t *testing.T) {
	p := newPool(t, Config{})
	conn := p.Conn(freeAddr(t))
	col := newCollector(8)
	conn.Add(1, 0, nil, 0, parts(1, 0, nil), col.onAdd, "no key")
	conn.Add(1, 0, &keyA, 0, [][]byte{make([]byte, 31)}, col.onAdd, "short entry")
	conn.Add(1, 1, &keyA, 0, parts(1, 0, nil), col.onAdd, "ids differ")
	conn.Read(1, 0, protocol.FlagDoFencing, nil, col.onRead, "fencing without key")
	for _, r := range col.wait(t, 4) {
		if !errors.Is(r.err, ErrBadRequest) {
			t.Fatalf("%v: %v, want ErrBadRequest", r.ctx, r.err)
		}
	}
	if st := conn.Stats(); st.Requests != 0 || st.ConnectFailures != 0 {
		t.Fatalf("a bad request reached the connection: %+v", st)
	}
}

// TestEntryParts: the parts of an entry go out back to back, however they are split.
func TestEntryParts(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{})
	conn := p.Conn(fb.addr())
	col := newCollector(4)
	e := servertest.Entry(3, 4, 2, []byte("payload in pieces"))
	conn.Add(3, 4, &keyB, protocol.FlagRecoveryAdd, [][]byte{e[:5], e[5:20], nil, e[20:40], e[40:]}, col.onAdd, nil)
	fc := fb.accept(t)
	req := fc.next(t)
	if req.Header.Op != protocol.OpAddEntry || req.Header.Version != protocol.CurrentVersion ||
		!req.Add.IsRecoveryAdd() || req.Add.MasterKey != keyB || !bytes.Equal(req.Add.Entry, e) {
		t.Fatalf("decoded %+v", req.Add)
	}
	conn.Read(3, protocol.LastAddConfirmedEntryID, protocol.FlagDoFencing|protocol.FlagHighPriority, &keyB, col.onRead, nil)
	req = fc.next(t)
	if req.Header.Op != protocol.OpReadEntry || !req.Read.IsFencing() || !req.Read.IsHighPriority() ||
		!req.Read.HasMasterKey || req.Read.MasterKey != keyB || req.Read.EntryID != -1 {
		t.Fatalf("decoded %+v", req.Read)
	}
	conn.Read(3, 4, 0, &keyB, col.onRead, nil)
	if req = fc.next(t); req.Read.HasMasterKey {
		t.Fatal("a non-fencing read carried the master key")
	}
}

func TestTooManyPending(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{MaxPendingPerConn: 10})
	conn := p.Conn(fb.addr())
	col := newCollector(32)
	for e := range int64(11) {
		conn.Read(1, e, 0, nil, col.onRead, e)
	}
	if r := col.one(t); r.ctx != int64(10) || !errors.Is(r.err, ErrTooManyPending) {
		t.Fatalf("11th read: ctx %v err %v, want ErrTooManyPending", r.ctx, r.err)
	}
	fc := fb.accept(t)
	for range 10 {
		req := fc.next(t)
		fc.answerRead(t, req.Read.LedgerID, req.Read.EntryID, protocol.ENOENTRY, nil)
	}
	for _, r := range col.wait(t, 10) {
		if r.err != nil {
			t.Fatalf("read %v: %v", r.ctx, r.err)
		}
	}
	conn.Read(1, 11, 0, nil, col.onRead, nil) // room again
	fc.next(t)
}

// TestCallbackNotOnCallerGoroutine: a caller may hold a lock across Add that its callback
// takes, even when the request fails at once.
func TestCallbackNotOnCallerGoroutine(t *testing.T) {
	p := newPool(t, Config{MaxFrameSize: 4096})
	conn := p.Conn(freeAddr(t))
	var mu sync.Mutex
	done := make(chan error, 2)
	cb := func(_ any, _ protocol.ReturnCode, err error) {
		mu.Lock()
		mu.Unlock() //nolint:staticcheck // the point is to take the lock
		done <- err
	}
	mu.Lock()
	conn.Add(1, 0, &keyA, 0, parts(1, 0, make([]byte, 8192)), cb, nil) // ErrEntryTooLarge
	conn.Add(1, 0, &keyA, 0, parts(1, 0, nil), cb, nil)                // ErrConnection
	mu.Unlock()
	for range 2 {
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Fatal("callback never ran")
		}
	}
}

func TestPoolClose(t *testing.T) {
	b := startBookie(t)
	p, err := NewPool(Config{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(256)
	conn := p.Conn(b.addr)
	conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, nil)
	col.one(t)

	b.st.Hold()
	defer b.st.Release()
	const n = 50
	for e := range int64(n) {
		conn.Add(1, e+1, &keyA, 0, parts(1, e+1, []byte("x")), col.onAdd, nil)
	}
	eventually(t, "adds to reach the storage", func() bool { return b.st.Queued() == n })
	// A second connection in backoff.
	p2 := p.Conn(freeAddr(t))
	p2.Read(1, 0, 0, nil, col.onRead, nil)
	if r := col.one(t); !errors.Is(r.err, ErrConnection) {
		t.Fatalf("read: %v", r.err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Every pending request has had its callback when Close returns.
	if len(col.ch) != n {
		t.Fatalf("%d callbacks after Close, want %d", len(col.ch), n)
	}
	for _, r := range col.wait(t, n) {
		if !errors.Is(r.err, ErrClosed) {
			t.Fatalf("pending add: %v, want ErrClosed", r.err)
		}
	}
	checkNoGoroutines(t)

	// After Close: requests fail with ErrClosed, Conn still returns a connection.
	conn.Add(1, 99, &keyA, 0, parts(1, 99, nil), col.onAdd, nil)
	if r := col.one(t); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("add after Close: %v", r.err)
	}
	other := p.Conn("127.0.0.1:1")
	if other == nil || other.Healthy() {
		t.Fatal("Conn after Close")
	}
	other.Read(1, 0, 0, nil, col.onRead, nil)
	if r := col.one(t); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("read after Close: %v", r.err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCloseDuringConnect: Close interrupts a connection stuck in its AUTH exchange.
func TestCloseDuringConnect(t *testing.T) {
	fb := newFakeBookie(t)
	p, err := NewPool(Config{Logger: testLogger(), AuthPlugin: "plug", DialTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(8)
	p.Conn(fb.addr()).Read(1, 0, 0, nil, col.onRead, nil)
	fb.accept(t).next(t) // the AUTH request; never answered
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("Close took %v", time.Since(start))
	}
	if r := col.one(t); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("read: %v, want ErrClosed", r.err)
	}
	checkNoGoroutines(t)
}

// TestConcurrentUse hammers one connection from several goroutines with adds, reads, and a
// pool close at the end (for the race detector).
func TestConcurrentUse(t *testing.T) {
	b := startBookie(t)
	p, err := NewPool(Config{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	counts := map[string]int{}
	cb := func(_ any, rc protocol.ReturnCode, err error) {
		mu.Lock()
		counts[fmt.Sprint(rc, err != nil)]++
		mu.Unlock()
	}
	rcb := func(ctx any, rc protocol.ReturnCode, _ []byte, err error) { cb(ctx, rc, err) }
	var wg sync.WaitGroup
	const perG = 500
	for g := range int64(4) {
		wg.Go(func() {
			conn := p.Conn(b.addr)
			for e := range int64(perG) {
				conn.Add(g+1, e, &keyA, 0, parts(g+1, e, payloadOf(g, e, 32)), cb, nil)
				conn.Read(g+1, e/2, 0, nil, rcb, nil)
				_ = conn.Healthy()
				_ = conn.Stats()
			}
		})
	}
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	total := 0
	mu.Lock()
	for _, n := range counts {
		total += n
	}
	mu.Unlock()
	if total != 4*perG*2 {
		t.Fatalf("%d callbacks for %d requests: %v", total, 4*perG*2, counts)
	}
	checkNoGoroutines(t)
}

// TestBlockedAddTimesOutOnTime: an add that blocked on a full queue joins the pending requests
// behind one made later with a later deadline; it must still time out at its own deadline.
func TestBlockedAddTimesOutOnTime(t *testing.T) {
	fb := newFakeBookie(t)
	const timeout = time.Second
	p := newPool(t, Config{AuthPlugin: "plug", MaxFrameSize: 4096, MaxQueuedBytesPerConn: 4096,
		AddTimeout: timeout, ReadTimeout: timeout})
	conn := p.Conn(fb.addr())
	col := newCollector(8)
	conn.Add(1, 0, &keyA, 0, parts(1, 0, make([]byte, 2000)), col.onAdd, "A") // queued, AUTH pending
	start := time.Now()
	done := make(chan time.Duration, 1)
	go func() {
		conn.Add(1, 1, &keyA, 0, parts(1, 1, make([]byte, 3000)), func(ctx any, rc protocol.ReturnCode, err error) {
			if !errors.Is(err, ErrTimeout) {
				t.Errorf("B: %v, want ErrTimeout", err)
			}
			done <- time.Since(start)
		}, "B") // does not fit: blocks
	}()
	fc := fb.accept(t)
	if req := fc.next(t); req.Header.Op != protocol.OpAuth {
		t.Fatalf("first request %v", req.Header.Op)
	}
	time.Sleep(600 * time.Millisecond)
	conn.Add(1, 2, &keyA, 0, parts(1, 2, nil), col.onAdd, "C") // small: fits at once, deadline ~1.6 s
	time.Sleep(200 * time.Millisecond)
	fc.answerAuth(t) // the writer takes the queue: B gets in, behind C, with deadline ~1.0 s
	select {
	case d := <-done:
		if d > timeout+300*time.Millisecond {
			t.Fatalf("B timed out %v after its call; its timeout is %v", d, timeout)
		}
	case <-time.After(waitFor):
		t.Fatal("no callback for B")
	}
}

// TestCloseRunsBlockedCallersCallbacks: callers blocked on a full queue when the pool closes
// get their ErrClosed callback before Close returns, and not on their own goroutine.
func TestCloseRunsBlockedCallersCallbacks(t *testing.T) {
	for round := range 10 {
		fb := newFakeBookie(t)
		p, err := NewPool(Config{AuthPlugin: "plug", MaxFrameSize: 4096, MaxQueuedBytesPerConn: 4096,
			AddTimeout: 10 * time.Second, Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		conn := p.Conn(fb.addr())
		conn.Add(1, 0, &keyA, 0, parts(1, 0, make([]byte, 3000)), func(any, protocol.ReturnCode, error) {}, nil)
		const callers = 16
		var onCaller, calls atomic.Int64
		var started, wg sync.WaitGroup
		for i := range callers {
			started.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				me := goroutineID()
				started.Done()
				conn.Add(2, int64(i), &keyA, 0, parts(2, int64(i), make([]byte, 3000)), func(any, protocol.ReturnCode, error) {
					calls.Add(1)
					if goroutineID() == me {
						onCaller.Add(1)
					}
				}, nil)
			}()
		}
		started.Wait()
		fb.accept(t)
		time.Sleep(50 * time.Millisecond) // all blocked
		_ = p.Close()
		atClose := calls.Load()
		wg.Wait()
		if atClose != callers || onCaller.Load() > 0 {
			t.Fatalf("round %d: Close returned with %d of %d callbacks run; %d ran on their caller's goroutine",
				round, atClose, callers, onCaller.Load())
		}
	}
}

func TestHugeTimeoutDoesNotExpireAtOnce(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{AddTimeout: math.MaxInt64, ReadTimeout: 100 * time.Millisecond})
	col := newCollector(4)
	p.Conn(fb.addr()).Add(1, 0, &keyA, 0, parts(1, 0, nil), col.onAdd, nil)
	fc := fb.accept(t)
	if req := fc.next(t); req.Header.Op != protocol.OpAddEntry {
		t.Fatalf("got %v", req.Header.Op)
	}
	col.expectNone(t, 300*time.Millisecond)
}

// TestBackoffDoesNotOverflow: after many failures with a large ReconnectMin the backoff is
// ReconnectMax, not a doubling that wrapped around.
func TestBackoffDoesNotOverflow(t *testing.T) {
	p := newPool(t, Config{ReconnectMin: 1<<34 + 1, ReconnectMax: time.Minute})
	conn := p.Conn(freeAddr(t))
	conn.mu.Lock()
	conn.failures = 40 // a bookie down for a long while
	conn.mu.Unlock()
	col := newCollector(2)
	conn.Read(1, 0, 0, nil, col.onRead, nil)
	if r := col.one(t); !errors.Is(r.err, ErrConnection) {
		t.Fatalf("read: %v", r.err)
	}
	conn.mu.Lock()
	delay := time.Duration(conn.retryAt - monotime.Now())
	conn.mu.Unlock()
	if delay < 50*time.Second {
		t.Fatalf("backoff after 41 failures is %v, want ReconnectMax (1m)", delay)
	}
}

// TestIdleConnectionForgotten: a connection that is down and unused for IdleConnectionTTL
// leaves the pool (a client whose bookies change addresses would otherwise keep one per address
// it ever used); a request on it afterwards, from a ledger that kept it, puts it back and is
// served.
func TestIdleConnectionForgotten(t *testing.T) {
	checkNoGoroutines(t)
	fb := newFakeBookie(t)
	p := newPool(t, Config{IdleConnectionTTL: 50 * time.Millisecond, AddTimeout: 100 * time.Millisecond})
	conn := p.Conn(fb.addr())
	col := newCollector(16)
	conn.Read(1, 0, 0, nil, col.onRead, nil)
	fc := fb.accept(t)
	fc.next(t)
	fc.close() // the connection is lost: down, with nothing pending
	if r := col.one(t); !errors.Is(r.err, ErrConnection) {
		t.Fatalf("read on a lost connection: %v", r.err)
	}
	pooled := func() int {
		p.mu.RLock()
		defer p.mu.RUnlock()
		return len(p.conns)
	}
	eventually(t, "the idle connection to be forgotten", func() bool { return pooled() == 0 })
	conn.Read(1, 0, 0, nil, col.onRead, nil) // a ledger that kept the *Conn
	fc = fb.accept(t)
	req := fc.next(t)
	fc.answerRead(t, req.Read.LedgerID, req.Read.EntryID, protocol.EOK, []byte("entry"))
	if r := col.one(t); r.err != nil || r.rc != protocol.EOK {
		t.Fatalf("read after the pool forgot the connection: %v %v", r.rc, r.err)
	}
	if got := p.Conn(fb.addr()); got != conn || pooled() != 1 {
		t.Fatalf("the connection is not back in the pool (%d pooled)", pooled())
	}
}

// TestCloseDuringDialFailsWithErrClosed: Close fails the requests of a connection still
// dialing (here stuck in its TLS handshake) with ErrClosed, like every other pending request.
// Close must not let the dial see its cancellation first and fail them as a connection error.
// The test holds one connection's mutex so that Close stops at that connection for a while;
// the dials of the connections it has not closed yet must not fail meanwhile.
func TestCloseDuringDialFailsWithErrClosed(t *testing.T) {
	const dialing = 8
	p, err := NewPool(Config{Logger: testLogger(), DialTimeout: time.Minute, TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	col := newCollector(dialing)
	for i := range dialing {
		fb := newFakeBookie(t) // accepts, never answers the ClientHello
		p.Conn(fb.addr()).Read(1, int64(i), 0, nil, col.onRead, i)
		fb.accept(t)
	}
	stuck := p.Conn(freeAddr(t)) // never used: Close only passes through it
	stuck.mu.Lock()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		_ = p.Close()
	}()
	time.Sleep(200 * time.Millisecond)
	stuck.mu.Unlock()
	<-closed
	for _, r := range col.wait(t, dialing) {
		if !errors.Is(r.err, ErrClosed) {
			t.Errorf("read %v: %v, want ErrClosed", r.ctx, r.err)
		}
	}
	checkNoGoroutines(t)
}

// TestFirstYoungLossIsNotABackoffStep: the first connection that dies young redials at once
// and does not count as a failed attempt, so the next one that dies young backs off for
// ReconnectMin, the first step, not twice that (doc.go: Connections, failures and backoff).
func TestFirstYoungLossIsNotABackoffStep(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			_ = nc.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	const minBackoff = 10 * time.Second
	p := newPool(t, Config{ReconnectMin: minBackoff, ReconnectMax: 8 * minBackoff})
	conn := p.Conn(ln.Addr().String())
	col := newCollector(1)
	for i := range 2 {
		conn.Read(1, 0, 0, nil, col.onRead, i)
		if r := col.one(t); !errors.Is(r.err, ErrConnection) {
			t.Fatalf("read %d: %v, want ErrConnection", i, r.err)
		}
		if st := conn.Stats(); st.Losses != int64(i+1) {
			t.Fatalf("read %d: stats %+v, want a lost connection, not a failed connect", i, st)
		}
	}
	conn.mu.Lock()
	state, left := conn.state, time.Duration(conn.retryAt-monotime.Now())
	conn.mu.Unlock()
	if state != stateBackoff || left > minBackoff {
		t.Fatalf("after two connections died young: state %d, backoff %v left, want at most ReconnectMin %v", state, left, minBackoff)
	}
}
