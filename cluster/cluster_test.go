package cluster

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/ringkeeper/ringkeeper/bookie"
)

// smallBookie keeps a test bookie light (clustertest.SmallBookie, which imports this package).
func smallBookie(cfg *bookie.Config) {
	cfg.Engine.WriteCacheMaxSize = 16 << 20
	cfg.Engine.ReadAheadCacheMaxSize = 4 << 20
	cfg.Engine.IndexBlockCacheSize = 4 << 20
	cfg.Engine.Journal.MaxFileSize = 32 << 20
	cfg.Engine.EntryLogSizeLimit = 32 << 20
}

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
			smallBookie(cfg)
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

// TestStartKeepsAnExistingBookieWhosePortIsTaken: a bookie restarted on its existing directory
// (here under a fixed bookie id, so its data stays its own on any port) finds its port taken.
// Start must fail and keep the directory: it took the bookie for a new, empty one, removed its
// directory and started it empty on another port.
func TestStartKeepsAnExistingBookieWhosePortIsTaken(t *testing.T) {
	dir := t.TempDir()
	takenPort := 0
	cfg := Config{
		DataDir: dir, Bookies: 1, UnsafeNoFsync: true, Logger: slog.New(slog.DiscardHandler),
		Bookie: func(i int, cfg *bookie.Config) {
			smallBookie(cfg)
			cfg.BookieID = "bookie-" + strconv.Itoa(i)
			if takenPort != 0 {
				cfg.BookiePort = takenPort
			}
		},
	}
	c, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	version := filepath.Join(dir, "bookie-0", "journal", "current", "VERSION")
	if _, err := os.Stat(version); err != nil {
		t.Fatalf("first run left no journal cookie: %v", err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort = taken.Addr().(*net.TCPAddr).Port
	c, err = Start(context.Background(), cfg)
	if err == nil {
		c.Close(context.Background())
	}
	if _, serr := os.Stat(version); serr != nil {
		t.Fatalf("restart on a taken port (err %v) removed the bookie's directory: %v", err, serr)
	}
}
