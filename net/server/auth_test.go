package server

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

func TestAuthRequired(t *testing.T) {
	opts := []envOption{withConfig(func(c *Config) { c.Auth = NewTokenAuth("", []byte("s3cret")) })}
	transports(t, opts, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c := dial()
		// Before AUTH: adds, reads and batch reads get EUA, and the connection stays open.
		mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EUA)
		mustRead(t, c, 1, 0, protocol.EUA)
		resp, err := c.BatchRead(protocol.BatchReadRequest{LedgerID: 1, RequestID: 3, MaxCount: 1, MaxSize: 100})
		if err != nil || resp.RC != protocol.EUA {
			t.Fatalf("batch read before auth: rc %v err %v", resp.RC, err)
		}
		if _, err := c.Auth(TokenAuthPluginName, []byte("s3cret")); err != nil {
			t.Fatalf("auth: %v", err)
		}
		mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
		mustRead(t, c, 1, 0, protocol.EOK)

		// A wrong token closes the connection.
		bad := dial()
		if _, err := bad.Auth(TokenAuthPluginName, []byte("guess")); err == nil || !servertest.IsClosedErr(err) {
			t.Fatalf("wrong token: %v, want the connection closed", err)
		}
		// So does another plugin name.
		other := dial()
		if _, err := other.Auth("SASL", []byte("s3cret")); err == nil || !servertest.IsClosedErr(err) {
			t.Fatalf("wrong plugin: %v, want the connection closed", err)
		}
		if st := env.srv.Stats(); st.AuthFailures != 1 {
			t.Errorf("AuthFailures = %d, want 1", st.AuthFailures)
		}
	})
}

func TestAuthNotConfigured(t *testing.T) {
	transports(t, nil, func(t *testing.T, env *testEnv, dial func() *servertest.Client) {
		c := dial()
		mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
		if _, err := c.Auth(TokenAuthPluginName, []byte("x")); err == nil || !servertest.IsClosedErr(err) {
			t.Fatalf("AUTH without a provider: %v, want the connection closed", err)
		}
	})
}

// twoStep is a two-round AuthProvider: the client sends "hello", gets a challenge, and answers
// it.
type twoStep struct{}

func (twoStep) Name() string                  { return "test.two-step" }
func (twoStep) NewSession(string) AuthSession { return &twoStepSession{} }

type twoStepSession struct{ round int }

func (s *twoStepSession) Step(payload []byte) ([]byte, bool, error) {
	s.round++
	switch {
	case s.round == 1 && string(payload) == "hello":
		return []byte("challenge"), false, nil
	case s.round == 2 && string(payload) == "response":
		return []byte("welcome"), true, nil
	}
	return nil, false, errors.New("bad step")
}

func TestAuthMultiRound(t *testing.T) {
	env := startEnv(t, withConfig(func(c *Config) { c.Auth = twoStep{} }))
	c := env.dial(t)
	if got, err := c.Auth("test.two-step", []byte("hello")); err != nil || string(got) != "challenge" {
		t.Fatalf("round 1: %q %v", got, err)
	}
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EUA)
	if got, err := c.Auth("test.two-step", []byte("response")); err != nil || string(got) != "welcome" {
		t.Fatalf("round 2: %q %v", got, err)
	}
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
}

func TestTokenAuth(t *testing.T) {
	a := NewTokenAuth("custom", []byte("tok"))
	if a.Name() != "custom" {
		t.Fatal(a.Name())
	}
	s := a.NewSession("x")
	for _, p := range []string{"", "to", "tok!", "TOK"} {
		if _, done, err := s.Step([]byte(p)); done || !errors.Is(err, ErrAuthFailed) {
			t.Errorf("token %q accepted", p)
		}
	}
	if _, done, err := s.Step([]byte("tok")); !done || err != nil {
		t.Fatalf("right token: %v %v", done, err)
	}
	empty := NewTokenAuth("", nil).NewSession("x")
	if _, done, _ := empty.Step(nil); done {
		t.Fatal("an empty token matched")
	}
}

func TestTLSClientCertificates(t *testing.T) {
	pki := newTestPKI(t)
	env := startEnv(t, withTLS(), withConfig(func(c *Config) { c.TLSConfig = pki.serverConfig(true) }))
	env.tlsCli = pki.clientConfig(true)
	c := env.dialTLS(t)
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
	mustRead(t, c, 1, 0, protocol.EOK)

	// Without a client certificate the handshake fails (TLS 1.3 reports it on first read).
	nc, err := servertest.DialTLS(env.srv.TLSAddr().String(), pki.clientConfig(false))
	if err == nil {
		defer nc.Close()
		nc.Timeout = 5 * time.Second
		if _, err = nc.Add(keyA, entry(1, 1, "x"), 0); err == nil {
			t.Fatal("a client without a certificate was served")
		}
	}
	// Plaintext clients are served on the other port as usual.
	mustRead(t, env.dial(t), 1, 0, protocol.EOK)
}

// TestPlaintextRefused: with PlaintextRefused the plaintext port answers adds and reads EUA and
// stores nothing, closes the connection on an AUTH, and the TLS port serves as before.
func TestPlaintextRefused(t *testing.T) {
	pki := newTestPKI(t)
	env := startEnv(t, withTLS(), withConfig(func(c *Config) {
		c.TLSConfig = pki.serverConfig(true)
		c.PlaintextRefused = true
	}))
	env.tlsCli = pki.clientConfig(true)
	mustAdd(t, env.dialTLS(t), keyA, entry(1, 0, "x"), 0, protocol.EOK)

	plain := env.dial(t)
	before, _, _, _ := env.storage.Counters()
	mustAdd(t, plain, keyA, entry(2, 0, "x"), 0, protocol.EUA)
	mustRead(t, plain, 1, 0, protocol.EUA)
	if after, _, _, _ := env.storage.Counters(); after != before {
		t.Fatalf("the plaintext port stored %d adds", after-before)
	}
	if _, err := env.dial(t).Auth(TokenAuthPluginName, []byte("any")); err == nil {
		t.Fatal("AUTH on the plaintext port was answered, want the connection closed")
	}
	mustRead(t, env.dialTLS(t), 1, 0, protocol.EOK)

	if err := (&Config{Addr: "127.0.0.1:0", PlaintextRefused: true}).Validate(); !errors.Is(err, ErrBadConfig) ||
		!strings.Contains(err.Error(), "PlaintextRefused") {
		t.Fatalf("PlaintextRefused without a TLS port: %v, want ErrBadConfig naming PlaintextRefused", err)
	}
}

func TestTLSHandshakeTimeout(t *testing.T) {
	env := startEnv(t, withTLS(), withConfig(func(c *Config) { c.TLSHandshakeTimeout = 100 * time.Millisecond }))
	c, err := servertest.Dial(env.srv.TLSAddr().String()) // plaintext to the TLS port: no handshake
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.ExpectClosed(5 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestLoadTLSConfigErrors(t *testing.T) {
	if _, err := LoadTLSConfig("/nonexistent.crt", "/nonexistent.key", "", false); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("missing files: %v", err)
	}
}

func TestLoadTLSConfig(t *testing.T) {
	pki := newTestPKI(t)
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(pki.server.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile := write("server.crt", "CERTIFICATE", pki.server.Certificate[0])
	keyFile := write("server.key", "PRIVATE KEY", keyDER)
	caFile := write("ca.crt", "CERTIFICATE", pki.caDER)
	cfg, err := LoadTLSConfig(certFile, keyFile, caFile, true)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert || cfg.ClientCAs == nil {
		t.Fatalf("client auth not configured: %v", cfg.ClientAuth)
	}
	env := startEnv(t, withTLS(), withConfig(func(c *Config) { c.TLSConfig = cfg }))
	env.tlsCli = pki.clientConfig(true)
	mustAdd(t, env.dialTLS(t), keyA, entry(1, 0, "x"), 0, protocol.EOK)
	if _, err := LoadTLSConfig(certFile, keyFile, "", true); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("client certs without a CA: %v", err)
	}
	if _, err := LoadTLSConfig(certFile, keyFile, certFile+".missing", false); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("missing CA: %v", err)
	}
	if cfg, err := LoadTLSConfig(certFile, keyFile, "", false); err != nil || cfg.ClientAuth != tls.NoClientCert {
		t.Fatalf("server-only: %v", err)
	}
}

// TestTLSClientCertificateVerification: with a CA file (tlsTrustStore), a client certificate
// that has expired, is not yet valid or comes from another CA is refused at the handshake
// whether client certificates are required or only verified if given; a client without one
// is refused only when they are required. A refused client's add is never stored, and the
// server goes on serving good clients.
func TestTLSClientCertificateVerification(t *testing.T) {
	ca, rogue := servertest.MustCA(t, "ringkeeper test CA"), servertest.MustCA(t, "rogue CA")
	issue := func(issuer *servertest.CA, l servertest.Leaf) *tls.Certificate {
		c := issuer.MustIssue(t, l)
		return &c
	}
	caFile, certFile, keyFile, err := ca.WriteFiles(t.TempDir(), "server", *issue(ca, servertest.Leaf{DNSNames: []string{"localhost"}}))
	if err != nil {
		t.Fatal(err)
	}

	now := time.Now()
	good := issue(ca, servertest.Leaf{Client: true})
	clients := []struct {
		name     string
		cert     *tls.Certificate
		optional bool // served when client certificates are optional
	}{
		{"expired", issue(ca, servertest.Leaf{Client: true, NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)}), false},
		{"not yet valid", issue(ca, servertest.Leaf{Client: true, NotBefore: now.Add(24 * time.Hour), NotAfter: now.Add(48 * time.Hour)}), false},
		{"unknown CA", issue(rogue, servertest.Leaf{Client: true}), false},
		{"none", nil, true},
		{"good", good, true},
	}
	for _, require := range []bool{true, false} {
		cfg, err := LoadTLSConfig(certFile, keyFile, caFile, require)
		if err != nil {
			t.Fatal(err)
		}
		env := startEnv(t, withTLS(), withConfig(func(c *Config) { c.TLSConfig = cfg }))
		for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
			for i, cl := range clients {
				name := fmt.Sprintf("require=%v/%s/%s", require, tls.VersionName(version), cl.name)
				t.Run(name, func(t *testing.T) {
					// GetClientCertificate presents the certificate even if the server did not
					// name its CA (crypto/tls would otherwise send none).
					cli := &tls.Config{RootCAs: ca.Pool, ServerName: "localhost", MinVersion: version, MaxVersion: version}
					if cl.cert != nil {
						cli.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cl.cert, nil }
					}
					before, _, _, _ := env.storage.Counters()
					e := entry(int64(version), int64(i), cl.name)
					served := cl.optional && (!require || cl.cert != nil)
					// TLS 1.2 fails the client's handshake; TLS 1.3 completes it before the
					// server has checked the certificate, and the first round trip fails.
					c, err := servertest.DialTLS(env.srv.TLSAddr().String(), cli)
					var rc protocol.ReturnCode
					if err == nil {
						c.Timeout = 5 * time.Second
						rc, err = c.Add(keyA, e, 0)
						_ = c.Close()
					}
					after, _, _, _ := env.storage.Counters()
					switch {
					case served && (err != nil || rc != protocol.EOK || after != before+1):
						t.Fatalf("refused: rc %v err %v, %d adds stored", rc, err, after-before)
					case !served && (err == nil || after != before):
						t.Fatalf("served: rc %v err %v, %d adds stored", rc, err, after-before)
					case !served && !strings.Contains(err.Error(), "remote error: tls: "):
						t.Fatalf("refused with %v, want the server's TLS alert", err)
					}
				})
			}
		}
		// Plaintext clients are unaffected.
		mustAdd(t, env.dial(t), keyA, entry(1, 0, "plain"), 0, protocol.EOK)
	}
}

// TestCertificateRoles: roles come from the OU's code-0 part, in BookKeeper's format.
func TestCertificateRoles(t *testing.T) {
	for _, c := range []struct {
		ou   []string
		want []string
	}{
		{nil, nil},
		{[]string{"ops"}, nil},
		{[]string{"0:ingest"}, []string{"ingest"}},
		{[]string{"0:ingest, audit ;1:cluster-a"}, []string{"ingest", "audit"}},
		{[]string{"1:cluster-a;0:audit"}, []string{"audit"}},
		{[]string{"team", "0:audit"}, []string{"audit"}},
		{[]string{"0:"}, []string{""}},
		{[]string{"x0:ingest"}, nil},
	} {
		got := CertificateRoles(&x509.Certificate{Subject: pkix.Name{OrganizationalUnit: c.ou}})
		if !slices.Equal(got, c.want) {
			t.Errorf("OU %q: roles %q, want %q", c.ou, got, c.want)
		}
	}
}

// TestAuthorizedRoles: with AuthorizeRoles (authorizedRoles) a TLS client whose certificate's
// first role is allowed is served; one with another first role, or none, gets EUA for adds and
// reads, stores nothing, and is closed on AUTH.
func TestAuthorizedRoles(t *testing.T) {
	ca := servertest.MustCA(t, "ringkeeper test CA")
	issue := func(l servertest.Leaf) tls.Certificate { return ca.MustIssue(t, l) }
	srvCert := issue(servertest.Leaf{DNSNames: []string{"localhost"}})
	env := startEnv(t, withTLS(), withConfig(func(c *Config) {
		c.TLSConfig = &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientCAs: ca.Pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
		c.AuthorizeCertificate = AuthorizeRoles([]string{"ingest", "admin"})
	}))
	dial := func(ou ...string) *servertest.Client {
		c, err := servertest.DialTLS(env.srv.TLSAddr().String(), &tls.Config{RootCAs: ca.Pool, ServerName: "localhost",
			Certificates: []tls.Certificate{issue(servertest.Leaf{Client: true, OU: ou})}, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		c.Timeout = 5 * time.Second
		t.Cleanup(func() { c.Close() })
		return c
	}
	good := dial("0:ingest;1:cluster-a")
	mustAdd(t, good, keyA, entry(1, 0, "x"), 0, protocol.EOK)
	mustAdd(t, dial("0:admin"), keyA, entry(1, 1, "x"), 0, protocol.EOK)
	for _, ou := range [][]string{{"0:audit"}, {"0:audit,ingest"}, nil, {"ops"}} {
		c := dial(ou...)
		before, _, _, _ := env.storage.Counters()
		mustAdd(t, c, keyA, entry(2, 0, "x"), 0, protocol.EUA)
		mustRead(t, c, 1, 0, protocol.EUA)
		if after, _, _, _ := env.storage.Counters(); after != before {
			t.Fatalf("OU %q: %d adds stored", ou, after-before)
		}
		if _, err := c.Auth(TokenAuthPluginName, []byte("any")); err == nil {
			t.Fatalf("OU %q: AUTH answered, want the connection closed", ou)
		}
	}
	mustRead(t, good, 1, 1, protocol.EOK)
}
