package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

var (
	keyA = protocol.MasterKey([]byte("password-a"))
	keyB = protocol.MasterKey([]byte("password-b"))
)

func testLogger() *slog.Logger {
	if os.Getenv("SERVER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testEnv is a running server over a MemStorage, with a TLS listener when asked.
type testEnv struct {
	srv     *Server
	storage *servertest.MemStorage
	tlsCli  *tls.Config // client config trusting the server (and presenting a client cert)
}

type envOption func(*Config, *servertest.MemStorage)

func startEnv(t testing.TB, opts ...envOption) *testEnv {
	t.Helper()
	st := servertest.NewMemStorage()
	cfg := Config{
		Addr:          "127.0.0.1:0",
		NumEventLoops: 2,
		ErrorCode:     servertest.ErrorCode,
		Logger:        testLogger(),
	}
	for _, o := range opts {
		o(&cfg, st)
	}
	env := &testEnv{storage: st}
	if cfg.TLSAddr != "" && cfg.TLSConfig == nil {
		pki := newTestPKI(t)
		cfg.TLSConfig, env.tlsCli = pki.serverConfig(false), pki.clientConfig(true)
	}
	srv := mustStart(t, cfg, st)
	env.srv = srv
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		} else {
			// Every connection is closed, and gives back the read bytes it held. After a Stop
			// that timed out (this one is then a no-op), gnet closes them in the background and
			// a read stuck meanwhile may still complete: the count settles, it must not stay.
			deadline := time.Now().Add(2 * time.Second)
			for srv.Stats().UnwrittenReadBytes != 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if n := srv.Stats().UnwrittenReadBytes; n != 0 {
				t.Errorf("UnwrittenReadBytes %d after Stop, want 0", n)
			}
		}
		st.Close()
	})
	return env
}

// mustStart creates and starts a server; the caller stops it.
func mustStart(t testing.TB, cfg Config, st Storage) *Server {
	t.Helper()
	srv, err := New(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	return srv
}

func withTLS() envOption {
	return func(c *Config, _ *servertest.MemStorage) { c.TLSAddr = "127.0.0.1:0" }
}

func withConfig(f func(*Config)) envOption {
	return func(c *Config, _ *servertest.MemStorage) { f(c) }
}

func withStorage(f func(*servertest.MemStorage)) envOption {
	return func(_ *Config, st *servertest.MemStorage) { f(st) }
}

func (e *testEnv) dial(t testing.TB) *servertest.Client {
	t.Helper()
	c, err := servertest.Dial(e.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (e *testEnv) dialTLS(t testing.TB) *servertest.Client {
	t.Helper()
	c, err := servertest.DialTLS(e.srv.TLSAddr().String(), e.tlsCli)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// transports runs f once over a plaintext (gnet) connection and once over TLS.
func transports(t *testing.T, opts []envOption, f func(t *testing.T, env *testEnv, dial func() *servertest.Client)) {
	t.Run("gnet", func(t *testing.T) {
		env := startEnv(t, opts...)
		f(t, env, func() *servertest.Client { return env.dial(t) })
	})
	t.Run("tls", func(t *testing.T) {
		env := startEnv(t, append([]envOption{withTLS()}, opts...)...)
		f(t, env, func() *servertest.Client { return env.dialTLS(t) })
	})
}

func entry(ledgerID, entryID int64, payload string) []byte {
	return servertest.Entry(ledgerID, entryID, entryID-1, []byte(payload))
}

func mustAdd(t testing.TB, c *servertest.Client, key [protocol.MasterKeyLength]byte, e []byte, flags protocol.Flags, want protocol.ReturnCode) {
	t.Helper()
	rc, err := c.Add(key, e, flags)
	if err != nil {
		t.Fatalf("add: %v", err)
	}
	if rc != want {
		l, id := servertest.EntryIDs(e)
		t.Fatalf("add %d/%d: rc %v, want %v", l, id, rc, want)
	}
}

func mustRead(t testing.TB, c *servertest.Client, ledgerID, entryID int64, want protocol.ReturnCode) []byte {
	t.Helper()
	rc, got, err := c.Read(ledgerID, entryID)
	if err != nil {
		t.Fatalf("read %d/%d: %v", ledgerID, entryID, err)
	}
	if rc != want {
		t.Fatalf("read %d/%d: rc %v, want %v", ledgerID, entryID, rc, want)
	}
	return got
}

// eventually polls cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// testPKI is a throwaway CA with a server and a client certificate.
type testPKI struct {
	pool   *x509.CertPool
	caDER  []byte
	server tls.Certificate
	client tls.Certificate
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, usage x509.ExtKeyUsage) tls.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "bookie"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return &testPKI{pool: pool, caDER: caDER, server: leaf(2, x509.ExtKeyUsageServerAuth), client: leaf(3, x509.ExtKeyUsageClientAuth)}
}

func (p *testPKI) serverConfig(requireClientCert bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}
	if requireClientCert {
		cfg.ClientCAs, cfg.ClientAuth = p.pool, tls.RequireAndVerifyClientCert
	}
	return cfg
}

func (p *testPKI) clientConfig(withCert bool) *tls.Config {
	cfg := &tls.Config{RootCAs: p.pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if withCert {
		cfg.Certificates = []tls.Certificate{p.client}
	}
	return cfg
}
