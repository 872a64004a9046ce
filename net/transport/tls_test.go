package transport

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// withServerTLS serves TLS on a loopback port with cfg.
func withServerTLS(cfg *tls.Config) bookieOption {
	return func(c *server.Config, _ *servertest.MemStorage) {
		c.TLSAddr = "127.0.0.1:0"
		c.TLSConfig = cfg
	}
}

func withLogger(l *slog.Logger) bookieOption {
	return func(c *server.Config, _ *servertest.MemStorage) { c.Logger = l }
}

// logBuffer collects a logger's text output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

var loopback = []net.IP{net.IPv4(127, 0, 0, 1)}

// tlsPort is the port of b's TLS listener.
func (b *testBookie) tlsPort() string {
	_, port, _ := net.SplitHostPort(b.tlsAddr)
	return port
}

// TestTLSClientVerifiesBookieCertificate: a client refuses a bookie whose certificate has
// expired, is not yet valid, names another host or address, or comes from a CA it does not
// trust. The request fails with ErrConnection wrapping the x509 error that names the cause,
// and never reaches the bookie. An empty ServerName is the host of the address dialled (a
// name, or an IP that must be an IP SAN); a configured one wins.
func TestTLSClientVerifiesBookieCertificate(t *testing.T) {
	ca, rogue := servertest.MustCA(t, "ringkeeper test CA"), servertest.MustCA(t, "rogue CA")
	now := time.Now()
	expired := func(e error) bool {
		var ci x509.CertificateInvalidError
		return errors.As(e, &ci) && ci.Reason == x509.Expired
	}
	wrongHost := func(e error) bool {
		var he x509.HostnameError
		return errors.As(e, &he)
	}
	unknownCA := func(e error) bool {
		var ua x509.UnknownAuthorityError
		return errors.As(e, &ua)
	}
	wrongUsage := func(e error) bool {
		var ci x509.CertificateInvalidError
		return errors.As(e, &ci) && ci.Reason == x509.IncompatibleUsage
	}
	otherHost := servertest.Leaf{DNSNames: []string{"bookie-a.example"}}
	for _, tc := range []struct {
		name       string
		issuer     *servertest.CA
		leaf       servertest.Leaf
		host       string // dialled: host:port
		serverName string // Config.TLS.ServerName
		noHostname bool   // Config.TLSHostnameVerificationDisabled
		is         func(error) bool
		text       string // in the error's text; "" = the request succeeds
	}{
		{name: "expired", issuer: ca, host: "127.0.0.1", is: expired, text: "certificate has expired",
			leaf: servertest.Leaf{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour), IPs: loopback, DNSNames: []string{"localhost"}}},
		{name: "not yet valid", issuer: ca, host: "127.0.0.1", is: expired, text: "not yet valid",
			leaf: servertest.Leaf{NotBefore: now.Add(24 * time.Hour), NotAfter: now.Add(48 * time.Hour), IPs: loopback, DNSNames: []string{"localhost"}}},
		{name: "unknown CA", issuer: rogue, host: "127.0.0.1", is: unknownCA, text: "signed by unknown authority",
			leaf: servertest.Leaf{IPs: loopback, DNSNames: []string{"localhost"}}},
		{name: "other hostname", issuer: ca, host: "localhost", is: wrongHost, text: "valid for bookie-a.example, not localhost",
			leaf: servertest.Leaf{IPs: loopback, DNSNames: []string{"bookie-a.example"}}},
		{name: "other IP", issuer: ca, host: "127.0.0.1", is: wrongHost, text: "valid for 127.0.0.2, not 127.0.0.1",
			leaf: servertest.Leaf{IPs: []net.IP{net.IPv4(127, 0, 0, 2)}, DNSNames: []string{"localhost"}}},
		{name: "no IP SAN", issuer: ca, host: "127.0.0.1", is: wrongHost, text: "127.0.0.1 because it doesn't contain any IP SANs",
			leaf: servertest.Leaf{DNSNames: []string{"localhost"}}},
		{name: "configured ServerName mismatch", issuer: ca, host: "127.0.0.1", serverName: "bookie-b.example", is: wrongHost,
			text: "not bookie-b.example", leaf: servertest.Leaf{IPs: loopback, DNSNames: []string{"localhost", "bookie-a.example"}}},
		// Controls: the same verification accepts a certificate that fits.
		{name: "hostname from the address", issuer: ca, host: "localhost", leaf: servertest.Leaf{DNSNames: []string{"localhost"}}},
		{name: "IP from the address", issuer: ca, host: "127.0.0.1", leaf: servertest.Leaf{IPs: loopback}},
		{name: "configured ServerName", issuer: ca, host: "127.0.0.1", serverName: "bookie-a.example", leaf: otherHost},
		// TLSHostnameVerificationDisabled skips the name only.
		{name: "no hostname verification/other hostname", issuer: ca, host: "127.0.0.1", noHostname: true, leaf: otherHost},
		{name: "no hostname verification/expired", issuer: ca, host: "127.0.0.1", noHostname: true, is: expired, text: "certificate has expired",
			leaf: servertest.Leaf{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour), DNSNames: otherHost.DNSNames}},
		{name: "no hostname verification/not yet valid", issuer: ca, host: "127.0.0.1", noHostname: true, is: expired, text: "not yet valid",
			leaf: servertest.Leaf{NotBefore: now.Add(24 * time.Hour), NotAfter: now.Add(48 * time.Hour), DNSNames: otherHost.DNSNames}},
		{name: "no hostname verification/unknown CA", issuer: rogue, host: "127.0.0.1", noHostname: true, is: unknownCA,
			text: "signed by unknown authority", leaf: otherHost},
		{name: "no hostname verification/client certificate", issuer: ca, host: "127.0.0.1", noHostname: true, is: wrongUsage,
			text: "incompatible key usage", leaf: servertest.Leaf{Client: true, DNSNames: otherHost.DNSNames}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert := tc.issuer.MustIssue(t, tc.leaf)
			b := startBookie(t, withServerTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
			p := newPool(t, Config{TLS: &tls.Config{RootCAs: ca.Pool, ServerName: tc.serverName, MinVersion: tls.VersionTLS12},
				TLSHostnameVerificationDisabled: tc.noHostname, ReconnectMin: time.Minute, ReconnectMax: time.Minute})
			conn := p.Conn(net.JoinHostPort(tc.host, b.tlsPort()))
			col := newCollector(1)
			conn.Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, nil)
			r := col.one(t)
			adds, _, _, _ := b.st.Counters()
			if tc.text == "" {
				if r.err != nil || r.rc != protocol.EOK || adds != 1 {
					t.Fatalf("add: rc %v err %v, %d adds stored; want EOK", r.rc, r.err, adds)
				}
				return
			}
			var cve *tls.CertificateVerificationError
			if !errors.Is(r.err, ErrConnection) || errors.Is(r.err, ErrAuth) || !errors.As(r.err, &cve) || !tc.is(r.err) {
				t.Fatalf("add: %v, want ErrConnection wrapping the x509 error", r.err)
			}
			if !strings.Contains(r.err.Error(), tc.text) {
				t.Fatalf("add: %q does not name the cause (%q)", r.err, tc.text)
			}
			if adds != 0 {
				t.Fatalf("%d adds reached the bookie", adds)
			}
		})
	}
}

// TestTLSHostnameVerificationDisabledKeepsVerifyConnection: the configuration's own
// VerifyConnection still runs, after the transport's check, and can refuse the bookie; the
// option needs TLS; and the caller's tls.Config is left as it was.
func TestTLSHostnameVerificationDisabledKeepsVerifyConnection(t *testing.T) {
	if _, err := NewPool(Config{TLSHostnameVerificationDisabled: true}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("TLSHostnameVerificationDisabled without TLS: %v, want ErrBadConfig", err)
	}
	ca := servertest.MustCA(t, "ringkeeper test CA")
	b := startBookie(t, withServerTLS(&tls.Config{Certificates: []tls.Certificate{ca.MustIssue(t, servertest.Leaf{DNSNames: []string{"bookie-a.example"}})},
		MinVersion: tls.VersionTLS12}))
	var calls atomic.Int32
	refuse := errors.New("refused by the application")
	cfg := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12, VerifyConnection: func(cs tls.ConnectionState) error {
		calls.Add(1)
		return refuse
	}}
	p := newPool(t, Config{TLS: cfg, TLSHostnameVerificationDisabled: true, ReconnectMin: time.Minute, ReconnectMax: time.Minute})
	col := newCollector(1)
	p.Conn(b.tlsAddr).Add(1, 0, &keyA, 0, parts(1, 0, []byte("x")), col.onAdd, nil)
	if r := col.one(t); !errors.Is(r.err, ErrConnection) || !errors.Is(r.err, refuse) || calls.Load() != 1 {
		t.Fatalf("add: %v after %d VerifyConnection calls, want ErrConnection wrapping its refusal", r.err, calls.Load())
	}
	if cfg.InsecureSkipVerify {
		t.Fatal("NewPool changed the caller's tls.Config")
	}
	if adds, _, _, _ := b.st.Counters(); adds != 0 {
		t.Fatalf("%d adds reached the bookie", adds)
	}
}

// TestTLSBookieVerifiesClientCertificate: a bookie that requires client certificates refuses
// a client whose certificate has expired, is not yet valid or comes from a CA it does not
// trust (or that has none), over TLS 1.2 (the client's handshake fails) and TLS 1.3 (the
// client's handshake completes first; its first request fails). Nothing is stored, the bookie
// logs the cause, and a well-configured client, connected before and after, is served.
func TestTLSBookieVerifiesClientCertificate(t *testing.T) {
	ca, rogue := servertest.MustCA(t, "ringkeeper test CA"), servertest.MustCA(t, "rogue CA")
	now := time.Now()
	var log logBuffer
	b := startBookie(t, withLogger(slog.New(slog.NewTextHandler(&log, nil))), withServerTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.MustIssue(t, servertest.Leaf{IPs: loopback})},
		ClientCAs:    ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}))
	// clientTLS presents cert, if any, whatever CAs the bookie asks for: crypto/tls would
	// otherwise send no certificate rather than one from a CA the bookie did not name.
	clientTLS := func(cert *tls.Certificate, maxVersion uint16) *tls.Config {
		cfg := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12, MaxVersion: maxVersion}
		if cert != nil {
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		return cfg
	}
	issue := func(issuer *servertest.CA, from, to time.Time) *tls.Certificate {
		c := issuer.MustIssue(t, servertest.Leaf{Client: true, NotBefore: from, NotAfter: to})
		return &c
	}
	good := issue(ca, time.Time{}, time.Time{})
	// A client connected before the refusals keeps its connection. The other pools live
	// alongside it: they are closed without newPool's check that no pool goroutine is left.
	before := newPool(t, Config{TLS: clientTLS(good, 0)}).Conn(b.tlsAddr)
	openPool := func(t *testing.T, cfg Config) *Pool {
		cfg.Logger = testLogger()
		p, err := NewPool(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	col := newCollector(1)
	before.Add(1, 0, &keyA, 0, parts(1, 0, []byte("before")), col.onAdd, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EOK {
		t.Fatalf("good client: rc %v err %v", r.rc, r.err)
	}

	for _, version := range []struct {
		name string
		max  uint16
	}{{"TLS1.2", tls.VersionTLS12}, {"TLS1.3", tls.VersionTLS13}} {
		for _, tc := range []struct {
			name  string
			cert  *tls.Certificate
			cause string // in the bookie's log
		}{
			{"expired", issue(ca, now.Add(-48*time.Hour), now.Add(-24*time.Hour)), "certificate has expired"},
			{"not yet valid", issue(ca, now.Add(24*time.Hour), now.Add(48*time.Hour)), "not yet valid"},
			{"unknown CA", issue(rogue, time.Time{}, time.Time{}), "signed by unknown authority"},
			{"no certificate", nil, "didn't provide a certificate"},
		} {
			t.Run(version.name+"/"+tc.name, func(t *testing.T) {
				log.Reset()
				p := openPool(t, Config{TLS: clientTLS(tc.cert, version.max), ReconnectMin: time.Minute, ReconnectMax: time.Minute})
				col := newCollector(1)
				p.Conn(b.tlsAddr).Add(2, 0, &keyA, 0, parts(2, 0, []byte("refused")), col.onAdd, nil)
				// The bookie's alert reaches the client before its close does, also over TLS
				// 1.3 where the add was already sent: the error says the bookie refused.
				if r := col.one(t); !errors.Is(r.err, ErrConnection) || !strings.Contains(r.err.Error(), "remote error: tls: ") {
					t.Fatalf("add: rc %v err %v, want ErrConnection from the bookie's TLS alert", r.rc, r.err)
				}
				eventually(t, "the bookie to log the refused handshake with "+tc.cause, func() bool {
					s := log.String()
					return strings.Contains(s, "TLS handshake failed") && strings.Contains(s, tc.cause)
				})
				if adds, _, _, _ := b.st.Counters(); adds != 1 {
					t.Fatalf("%d adds stored, want only the good client's", adds)
				}
			})
		}
	}

	before.Add(1, 1, &keyA, 0, parts(1, 1, []byte("after")), col.onAdd, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EOK {
		t.Fatalf("good client after the refusals: rc %v err %v", r.rc, r.err)
	}
	after := openPool(t, Config{TLS: clientTLS(good, 0)}).Conn(b.tlsAddr)
	after.Read(2, 0, 0, nil, col.onRead, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.ENOLEDGER {
		t.Fatalf("read of the refused add: rc %v err %v, want ENOLEDGER", r.rc, r.err)
	}
	after.Read(1, 1, 0, nil, col.onRead, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EOK || !bytes.Equal(r.entry, servertest.Entry(1, 1, 0, []byte("after"))) {
		t.Fatalf("new good client: rc %v err %v", r.rc, r.err)
	}
}
