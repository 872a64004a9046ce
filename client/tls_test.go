package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/cluster"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// TestLedgerOverTLS: a client with Transport.TLS reaches each bookie at the TLS endpoint it
// registered (its tlsPort), not at its id, which is the plaintext port: writes at (3,3,2),
// with the bookies requiring client certificates, and reads after a close all go over TLS.
func TestLedgerOverTLS(t *testing.T) {
	ca, err := servertest.NewCA("ringkeeper test CA")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(servertest.Leaf{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.Issue(servertest.Leaf{Client: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyPEM, err := servertest.KeyPEM(srv)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath, caPath := write("bookie.crt", servertest.CertPEM(srv)), write("bookie.key", keyPEM), write("ca.crt", ca.PEM())
	c, err := cluster.Start(context.Background(), cluster.Config{
		DataDir: t.TempDir(), Bookies: 3, UnsafeNoFsync: true,
		Bookie: func(i int, cfg *bookie.Config) {
			clustertest.SmallBookie(i, cfg)
			cfg.TLSPort = freeTCPPort(t)
			cfg.TLSCertificatePath, cfg.TLSKeyPath, cfg.TLSTrustStorePath = certPath, keyPath, caPath
			cfg.TLSClientAuthentication = true
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })

	cfg := DefaultConfig(c.MetadataURI())
	cfg.Transport.AddTimeout, cfg.Transport.ReadTimeout = 5*time.Second, 5*time.Second
	cfg.Transport.TLS = &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cli}, MinVersion: tls.VersionTLS12}
	cl, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	for _, id := range c.BookieAddrs() {
		if addr := cl.bookieAddr(id); addr == id {
			t.Fatalf("bookie %s is dialled at its plaintext id, not its TLS endpoint", id)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: []byte("pw")})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		if id, err := lh.Append(ctx, []byte(fmt.Sprintf("entry-%d", i))); err != nil || id != int64(i) {
			t.Fatalf("append %d: id %d, %v", i, id, err)
		}
	}
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rh, err := cl.OpenLedger(ctx, lh.ID(), []byte("pw"), false)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := rh.Read(ctx, 0, n-1)
	if err != nil || len(entries) != n {
		t.Fatalf("read: %d entries, %v", len(entries), err)
	}
	for i, e := range entries {
		if want := []byte(fmt.Sprintf("entry-%d", i)); !bytes.Equal(e.Payload, want) {
			t.Fatalf("entry %d: %q, want %q", i, e.Payload, want)
		}
	}
}

func freeTCPPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
