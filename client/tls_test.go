package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestLedgerOverTLS: a client with Transport.TLS reaches each bookie at the TLS endpoint it
// registered (its tlsPort), not at its id, which is the plaintext port: writes at (3,3,2),
// with the bookies requiring client certificates, and reads after a close all go over TLS.
func TestLedgerOverTLS(t *testing.T) {
	c, certs := clustertest.StartTLS(t, 3)
	cfg := DefaultConfig(c.MetadataURI())
	cfg.Transport.AddTimeout, cfg.Transport.ReadTimeout = 5*time.Second, 5*time.Second
	cfg.Transport.TLS = &tls.Config{RootCAs: certs.CA.Pool, Certificates: []tls.Certificate{certs.Client}, MinVersion: tls.VersionTLS12}
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
