// Package clustertest starts small in-process clusters for tests.
package clustertest

import (
	"context"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/cluster"
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
