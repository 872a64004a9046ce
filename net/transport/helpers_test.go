package transport

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

var (
	keyA = protocol.MasterKey([]byte("password-a"))
	keyB = protocol.MasterKey([]byte("password-b"))
)

// waitFor bounds every wait of a test for a callback or a condition.
const waitFor = 10 * time.Second

func testLogger() *slog.Logger {
	if os.Getenv("TRANSPORT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newPool starts a pool; the cleanup closes it and checks that its goroutines are gone.
func newPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		checkNoGoroutines(t)
	})
	return p
}

// checkNoGoroutines fails the test if a goroutine of a Conn or Pool is still running shortly
// after the pool was closed (Close waits for them, so there should be none at once).
func checkNoGoroutines(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := transportGoroutines()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d transport goroutines left after Close:\n%s", len(left), strings.Join(left, "\n\n"))
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func transportGoroutines() []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var left []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "net/transport.(*Conn).") || strings.Contains(g, "net/transport.(*Pool).") {
			left = append(left, g)
		}
	}
	return left
}

// testBookie is a server.Server over a MemStorage on loopback.
type testBookie struct {
	srv       *server.Server
	st        *servertest.MemStorage
	addr      string
	tlsAddr   string
	tlsClient *tls.Config // trusts the server's certificate
}

type bookieOption func(*server.Config, *servertest.MemStorage)

func withTLS(t testing.TB) bookieOption {
	return func(c *server.Config, _ *servertest.MemStorage) {
		c.TLSAddr = "127.0.0.1:0"
		c.TLSConfig = &tls.Config{Certificates: []tls.Certificate{selfSigned(t).cert}, MinVersion: tls.VersionTLS12}
	}
}

func withAuth(token string) bookieOption {
	return func(c *server.Config, _ *servertest.MemStorage) { c.Auth = server.NewTokenAuth("", []byte(token)) }
}

func withAddr(addr string) bookieOption {
	return func(c *server.Config, _ *servertest.MemStorage) { c.Addr = addr }
}

func startBookie(t testing.TB, opts ...bookieOption) *testBookie {
	t.Helper()
	st := servertest.NewMemStorage()
	cfg := server.Config{Addr: "127.0.0.1:0", NumEventLoops: 2, ErrorCode: servertest.ErrorCode, Logger: testLogger()}
	for _, o := range opts {
		o(&cfg, st)
	}
	srv, err := server.New(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
		st.Close()
	})
	b := &testBookie{srv: srv, st: st, addr: srv.Addr().String()}
	if a := srv.TLSAddr(); a != nil {
		b.tlsAddr = a.String()
		pool := x509.NewCertPool()
		pool.AddCert(selfSigned(t).leaf)
		b.tlsClient = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return b
}

// stop kills the bookie now: connections are closed even with requests in flight.
func (b *testBookie) stop() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = b.srv.Stop(ctx)
}

type testCert struct {
	cert tls.Certificate
	leaf *x509.Certificate
}

var (
	certOnce sync.Once
	cert     testCert
	certErr  error
)

// selfSigned returns a self-signed certificate for 127.0.0.1 and localhost (made once).
func selfSigned(t testing.TB) testCert {
	t.Helper()
	certOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			certErr = err
			return
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bookie"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			IsCA: true, BasicConstraintsValid: true,
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			certErr = err
			return
		}
		leaf, err := x509.ParseCertificate(der)
		if err != nil {
			certErr = err
			return
		}
		cert = testCert{cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, leaf: leaf}
	})
	if certErr != nil {
		t.Fatal(certErr)
	}
	return cert
}

// result is one callback.
type result struct {
	ctx   any
	rc    protocol.ReturnCode
	entry []byte
	err   error
	add   bool
}

// collector turns callbacks into a channel.
type collector struct{ ch chan result }

func newCollector(capacity int) *collector { return &collector{ch: make(chan result, capacity)} }

func (c *collector) onAdd(ctx any, rc protocol.ReturnCode, err error) {
	c.ch <- result{ctx: ctx, rc: rc, err: err, add: true}
}

func (c *collector) onRead(ctx any, rc protocol.ReturnCode, entry []byte, err error) {
	c.ch <- result{ctx: ctx, rc: rc, entry: bytes.Clone(entry), err: err}
}

func (c *collector) wait(t testing.TB, n int) []result {
	t.Helper()
	out := make([]result, 0, n)
	timeout := time.After(waitFor)
	for len(out) < n {
		select {
		case r := <-c.ch:
			out = append(out, r)
		case <-timeout:
			t.Fatalf("got %d of %d callbacks", len(out), n)
		}
	}
	return out
}

func (c *collector) one(t testing.TB) result {
	t.Helper()
	return c.wait(t, 1)[0]
}

// expectNone checks that no callback arrives within d.
func (c *collector) expectNone(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case r := <-c.ch:
		t.Fatalf("unexpected callback: ctx %v rc %v err %v", r.ctx, r.rc, r.err)
	case <-time.After(d):
	}
}

// parts builds a stored entry (DUMMY digest) as two parts: the 32-byte header, the payload.
func parts(ledgerID, entryID int64, payload []byte) [][]byte {
	e := servertest.Entry(ledgerID, entryID, entryID-1, payload)
	return [][]byte{e[:protocol.StoredEntryHeaderSize], e[protocol.StoredEntryHeaderSize:]}
}

func payloadOf(ledgerID, entryID int64, size int) []byte {
	p := make([]byte, size)
	for i := range p {
		p[i] = byte(int(ledgerID)*31 + int(entryID)*7 + i)
	}
	return p
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// fakeBookie is a raw listener that the test drives by hand: it decodes requests and writes
// whatever responses the test asks for (or none).
type fakeBookie struct {
	ln    net.Listener
	conns chan *fakeConn
	mu    sync.Mutex
	all   []net.Conn
}

func newFakeBookie(t testing.TB) *fakeBookie {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBookie{ln: ln, conns: make(chan *fakeConn, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.all = append(f.all, nc)
			f.mu.Unlock()
			f.conns <- &fakeConn{nc: nc}
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		f.mu.Lock()
		for _, nc := range f.all {
			_ = nc.Close()
		}
		f.mu.Unlock()
	})
	return f
}

func (f *fakeBookie) addr() string { return f.ln.Addr().String() }

func (f *fakeBookie) accept(t testing.TB) *fakeConn {
	t.Helper()
	select {
	case c := <-f.conns:
		return c
	case <-time.After(waitFor):
		t.Fatal("no connection to the fake bookie")
		return nil
	}
}

type fakeConn struct{ nc net.Conn }

// next reads and decodes one request frame.
func (c *fakeConn) next(t testing.TB) protocol.Request {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(waitFor))
	var lenBuf [4]byte
	if _, err := io.ReadFull(c.nc, lenBuf[:]); err != nil {
		t.Fatalf("fake bookie: read: %v", err)
	}
	frame := make([]byte, binary.BigEndian.Uint32(lenBuf[:]))
	if _, err := io.ReadFull(c.nc, frame); err != nil {
		t.Fatalf("fake bookie: read: %v", err)
	}
	var req protocol.Request
	if err := protocol.DecodeRequest(frame, &req); err != nil {
		t.Fatalf("fake bookie: decode: %v", err)
	}
	return req
}

func (c *fakeConn) send(t testing.TB, b []byte) {
	t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		t.Fatalf("fake bookie: write: %v", err)
	}
}

func (c *fakeConn) answerAdd(t testing.TB, ledgerID, entryID int64, rc protocol.ReturnCode) {
	t.Helper()
	c.send(t, protocol.AppendAddResponse(nil, protocol.AddResponse{
		Header: protocol.Header{Version: protocol.CurrentVersion, Op: protocol.OpAddEntry},
		RC:     rc, LedgerID: ledgerID, EntryID: entryID}))
}

func (c *fakeConn) answerRead(t testing.TB, ledgerID, entryID int64, rc protocol.ReturnCode, entry []byte) {
	t.Helper()
	b, err := protocol.AppendReadResponse(nil, protocol.ReadResponse{
		Header: protocol.Header{Version: protocol.CurrentVersion, Op: protocol.OpReadEntry},
		RC:     rc, LedgerID: ledgerID, EntryID: entryID, Entry: entry})
	if err != nil {
		t.Fatal(err)
	}
	c.send(t, b)
}

func (c *fakeConn) close() { _ = c.nc.Close() }

// freeAddr returns a loopback address nothing listens on (a port just released).
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// answerAuth answers the AUTH request with an empty message of plugin "plug".
func (c *fakeConn) answerAuth(t testing.TB) {
	t.Helper()
	b, err := protocol.AppendAuthResponse(nil, protocol.AuthResponse{
		Header:  protocol.Header{Version: protocol.CurrentVersion, Op: protocol.OpAuth},
		Message: protocol.AuthMessage{PluginName: []byte("plug")}})
	if err != nil {
		t.Fatal(err)
	}
	c.send(t, b)
}

// goroutineID is the calling goroutine's id, from its stack trace header.
func goroutineID() uint64 {
	var b [64]byte
	s := b[:runtime.Stack(b[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	s = s[:bytes.IndexByte(s, ' ')]
	id, _ := strconv.ParseUint(string(s), 10, 64)
	return id
}
