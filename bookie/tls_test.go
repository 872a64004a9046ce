package bookie

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// TestTLSClientAuthenticationRefusesBadClientCertificates: a bookie configured with BookKeeper's
// keys tlsPort, tlsCertificatePath, tlsKeyStore, tlsTrustStore and tlsClientAuthentication=true
// refuses a client whose certificate has expired or comes from a CA outside its trust store:
// the handshake fails, the client's add is not stored, and a client with a good certificate is
// served before and after. Its plaintext port answers adds and reads EUA.
func TestTLSClientAuthenticationRefusesBadClientCertificates(t *testing.T) {
	ca, rogue := servertest.MustCA(t, "ringkeeper test CA"), servertest.MustCA(t, "rogue CA")
	issue := func(issuer *servertest.CA, l servertest.Leaf) *tls.Certificate {
		c := issuer.MustIssue(t, l)
		return &c
	}
	caFile, certFile, keyFile, err := ca.WriteFiles(t.TempDir(), "bookie", *issue(ca, servertest.Leaf{DNSNames: []string{"localhost"}}))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, metadatatest.URI(t), t.TempDir())
	props, err := ParseProperties(strings.NewReader(fmt.Sprintf(
		"tlsPort=%d\ntlsCertificatePath=%s\ntlsKeyStore=%s\ntlsTrustStore=%s\ntlsClientAuthentication=true\n",
		freePort(t), certFile, keyFile, caFile)))
	if err != nil {
		t.Fatal(err)
	}
	if warnings, err := cfg.Apply(props); err != nil || len(warnings) != 0 {
		t.Fatalf("apply: %v %v", warnings, err)
	}
	b := start(t, cfg)

	// dialTLS presents cert whatever CAs the bookie names (crypto/tls would otherwise send
	// none for a rogue one). Over TLS 1.3 a refused handshake shows on the first round trip.
	dialTLS := func(cert *tls.Certificate) (*servertest.Client, error) {
		cli := &tls.Config{RootCAs: ca.Pool, ServerName: "localhost", MinVersion: tls.VersionTLS12,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }}
		c, err := servertest.DialTLS(b.TLSAddr().String(), cli)
		if err == nil {
			c.Timeout = 5 * time.Second
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	good, err := dialTLS(issue(ca, servertest.Leaf{Client: true}))
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := good.Add(key, entry(1, 0), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("good client: %v %v", rc, err)
	}
	now := time.Now()
	for i, bad := range []struct {
		name string
		cert *tls.Certificate
	}{
		{"expired", issue(ca, servertest.Leaf{Client: true, NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)})},
		{"unknown CA", issue(rogue, servertest.Leaf{Client: true})},
	} {
		ledger := int64(10 + i)
		c, err := dialTLS(bad.cert)
		if err == nil {
			var rc protocol.ReturnCode
			if rc, err = c.Add(key, entry(ledger, 0), 0); err == nil {
				t.Fatalf("%s client certificate: add answered %v", bad.name, rc)
			}
		}
		if !strings.Contains(err.Error(), "remote error: tls: ") {
			t.Fatalf("%s client certificate: %v, want the bookie's TLS alert", bad.name, err)
		}
		if rc, _, err := good.Read(ledger, 0); err != nil || rc != protocol.ENOLEDGER {
			t.Fatalf("%s client certificate: its add was stored (read: %v %v)", bad.name, rc, err)
		}
	}
	if rc, err := good.Add(key, entry(1, 1), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("good client after the refusals: %v %v", rc, err)
	}
	again, err := dialTLS(issue(ca, servertest.Leaf{Client: true}))
	if err != nil {
		t.Fatal(err)
	}
	if rc, _, err := again.Read(1, 1); err != nil || rc != protocol.EOK {
		t.Fatalf("new good client: %v %v", rc, err)
	}
	// The plaintext port does not let a client without a certificate around the check.
	plain := dial(t, b)
	if rc, err := plain.Add(key, entry(20, 0), 0); err != nil || rc != protocol.EUA {
		t.Fatalf("add on the plaintext port: %v %v, want EUA", rc, err)
	}
	if rc, _, err := plain.Read(1, 1); err != nil || rc != protocol.EUA {
		t.Fatalf("read on the plaintext port: %v %v, want EUA", rc, err)
	}
	if rc, _, err := good.Read(20, 0); err != nil || rc != protocol.ENOLEDGER {
		t.Fatalf("the plaintext add was stored (read: %v %v)", rc, err)
	}
}

// TestAuthorizedRolesKey: authorizedRoles (BookKeeper's BookieAuthZFactory) lets a TLS client
// in only when its certificate's first role is listed; it is refused as config without
// tlsClientAuthentication, since roles come from client certificates.
func TestAuthorizedRolesKey(t *testing.T) {
	ca := servertest.MustCA(t, "ringkeeper test CA")
	caFile, certFile, keyFile, err := ca.WriteFiles(t.TempDir(), "bookie", ca.MustIssue(t, servertest.Leaf{DNSNames: []string{"localhost"}}))
	if err != nil {
		t.Fatal(err)
	}
	keys := fmt.Sprintf("tlsPort=%d\ntlsCertificatePath=%s\ntlsKeyStore=%s\ntlsTrustStore=%s\nauthorizedRoles=ingest, admin\n",
		freePort(t), certFile, keyFile, caFile)
	apply := func(props string) Config {
		cfg := testConfig(t, metadatatest.URI(t), t.TempDir())
		p, err := ParseProperties(strings.NewReader(props))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cfg.Apply(p); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	noClientAuth := apply(keys)
	if err := noClientAuth.Validate(); err == nil || !strings.Contains(err.Error(), "authorizedRoles") {
		t.Fatalf("authorizedRoles without tlsClientAuthentication: %v, want a config error naming it", err)
	}
	cfg := apply(keys + "tlsClientAuthentication=true\n")
	if !slices.Equal(cfg.AuthorizedRoles, []string{"ingest", "admin"}) {
		t.Fatalf("authorizedRoles parsed as %q", cfg.AuthorizedRoles)
	}
	b := start(t, cfg)
	dial := func(role string) *servertest.Client {
		c, err := servertest.DialTLS(b.TLSAddr().String(), &tls.Config{RootCAs: ca.Pool, ServerName: "localhost",
			Certificates: []tls.Certificate{ca.MustIssue(t, servertest.Leaf{Client: true, OU: []string{"0:" + role}})},
			MinVersion:   tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		c.Timeout = 5 * time.Second
		t.Cleanup(func() { c.Close() })
		return c
	}
	if rc, err := dial("admin").Add(key, entry(1, 0), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("role admin: %v %v, want EOK", rc, err)
	}
	if rc, err := dial("audit").Add(key, entry(2, 0), 0); err != nil || rc != protocol.EUA {
		t.Fatalf("role audit: %v %v, want EUA", rc, err)
	}
}

// TestTLSClientAuthenticationNeedsTLSPortAndTrustStore: tlsClientAuthentication=true is a
// config error naming what it lacks at Validate: without tlsPort it was ignored, and the
// bookie served every client on its plaintext port without a certificate; without
// tlsTrustStore the bookie opened its engine and wrote its cookie before LoadTLSConfig refused
// it, outside ErrBadConfig.
func TestTLSClientAuthenticationNeedsTLSPortAndTrustStore(t *testing.T) {
	dir := t.TempDir()
	noPort := testConfig(t, "etcd://127.0.0.1:1/ledgers", dir)
	noPort.TLSClientAuthentication = true
	if err := noPort.Validate(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "tlsClientAuthentication") {
		t.Fatalf("tlsClientAuthentication without tlsPort: %v, want ErrBadConfig naming it", err)
	}
	noCA := testConfig(t, "etcd://127.0.0.1:1/ledgers", dir)
	noCA.TLSPort, noCA.TLSCertificatePath, noCA.TLSKeyPath = 3182, "cert.pem", "key.pem"
	noCA.TLSClientAuthentication = true
	if err := noCA.Validate(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "tlsTrustStore") {
		t.Fatalf("tlsClientAuthentication without tlsTrustStore: %v, want ErrBadConfig naming tlsTrustStore", err)
	}
	noCA.TLSTrustStorePath = "ca.pem"
	if err := noCA.Validate(); err != nil {
		t.Fatalf("tlsClientAuthentication with tlsPort and tlsTrustStore: %v", err)
	}
}
