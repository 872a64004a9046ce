package cluster

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"github.com/ringkeeper/ringkeeper/bookie"
)

// TestStartMovesABookieWhosePortWasTaken: the port picked for a new bookie is taken by someone
// else before the bookie binds it; Start must start that bookie on another port.
func TestStartMovesABookieWhosePortWasTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	c, err := Start(context.Background(), Config{
		DataDir: t.TempDir(), Bookies: 2, UnsafeNoFsync: true, Logger: slog.New(slog.DiscardHandler),
		Bookie: func(i int, cfg *bookie.Config) {
			cfg.Engine.WriteCacheMaxSize = 16 << 20
			cfg.Engine.ReadAheadCacheMaxSize = 4 << 20
			cfg.Engine.IndexBlockCacheSize = 4 << 20
			cfg.Engine.Journal.MaxFileSize = 32 << 20
			cfg.Engine.EntryLogSizeLimit = 32 << 20
			if i == 0 {
				cfg.BookiePort = takenPort // as if another process took the picked port
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for i := range c.Size() {
		if c.Bookie(i) == nil {
			t.Fatalf("bookie %d not running", i)
		}
	}
	if got := c.Bookie(0).Addr().(*net.TCPAddr).Port; got == takenPort {
		t.Fatalf("bookie 0 still on the taken port %d", got)
	}
}

// TestStartRefusesNegativeBookies: a negative number of bookies is an error before anything
// starts (it panicked after etcd had started, and left etcd running).
func TestStartRefusesNegativeBookies(t *testing.T) {
	c, err := Start(context.Background(), Config{DataDir: t.TempDir(), Bookies: -1, UnsafeNoFsync: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		c.Close(context.Background())
		t.Fatal("Bookies -1: started")
	}
}
