// Package clustertest starts small in-process clusters for tests.
package clustertest

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/cluster"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// SmallBookie keeps a test bookie light: small caches and files, one event loop, two read
// workers and a short registration TTL (a stopped bookie leaves the registry quickly).
func SmallBookie(_ int, cfg *bookie.Config) {
	cfg.Engine.WriteCacheMaxSize = 16 << 20
	cfg.Engine.ReadAheadCacheMaxSize = 4 << 20
	cfg.Engine.IndexBlockCacheSize = 4 << 20
	cfg.Engine.Journal.MaxFileSize = 32 << 20
	cfg.Engine.EntryLogSizeLimit = 64 << 20
	cfg.RegistrationTTL = 2 * time.Second
	cfg.Server.NumEventLoops = 1
	cfg.Server.NumReadWorkerThreads = 2
}

// Start starts etcd (without fsyncs) and n small bookies in this process; the cluster is
// closed when the test ends.
func Start(t testing.TB, n int) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Start(context.Background(), cluster.Config{
		DataDir: t.TempDir(), Bookies: n, UnsafeNoFsync: true, Bookie: SmallBookie,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// TLS is what a client of a StartTLS cluster needs: the CA that signs the bookies'
// certificates (127.0.0.1 and localhost) and a client certificate the bookies accept, in
// memory and as PEM files.
type TLS struct {
	CA                                    *servertest.CA
	Client                                tls.Certificate
	CAFile, ClientCertFile, ClientKeyFile string
}

// StartTLS is Start with every bookie also serving TLS on a tlsPort of its own and requiring
// client certificates there (tlsClientAuthentication).
func StartTLS(t testing.TB, n int) (*cluster.Cluster, TLS) {
	t.Helper()
	ca := servertest.MustCA(t, "ringkeeper test CA")
	srv := ca.MustIssue(t, servertest.Leaf{IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}})
	cli := ca.MustIssue(t, servertest.Leaf{Client: true})
	dir := t.TempDir()
	caFile, certFile, keyFile, err := ca.WriteFiles(dir, "bookie", srv)
	if err != nil {
		t.Fatal(err)
	}
	files := TLS{CA: ca, Client: cli, CAFile: caFile}
	if _, files.ClientCertFile, files.ClientKeyFile, err = ca.WriteFiles(dir, "client", cli); err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(context.Background(), cluster.Config{
		DataDir: t.TempDir(), Bookies: n, UnsafeNoFsync: true,
		Bookie: func(i int, cfg *bookie.Config) {
			SmallBookie(i, cfg)
			cfg.TLSPort = freePort(t)
			cfg.TLSCertificatePath, cfg.TLSKeyPath, cfg.TLSTrustStorePath = certFile, keyFile, caFile
			cfg.TLSClientAuthentication = true
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c, files
}

// freePort is a port free now (another process may take it before the bookie binds it).
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
