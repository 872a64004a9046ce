// Package cluster runs a whole ringkeeper cluster in one process: an embedded etcd and N
// bookies on loopback. It is `ringkeeper standalone`, the bench tool's --standalone target, and
// the harness of the client and end-to-end tests.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/metadata/embedded"
)

// Config describes a cluster.
type Config struct {
	// DataDir holds everything: DataDir/metadata (etcd) and DataDir/bookie-<i>/{journal,ledgers}.
	DataDir string
	// Bookies is the number of bookies (default 3).
	Bookies int
	// BasePort is the first bookie's port; bookie i listens on BasePort+i. 0 picks free ports
	// (tests).
	BasePort int
	// MetadataPort is etcd's client port (0: free port).
	MetadataPort int
	// HTTPBasePort, if not 0, serves bookie i's metrics and admin API on HTTPBasePort+i; -1
	// picks free ports.
	HTTPBasePort int
	// Bookie adjusts each bookie's config (optional): directories and ports are set already.
	Bookie func(i int, cfg *bookie.Config)
	// UnsafeNoFsync turns off etcd's fsyncs (tests only).
	UnsafeNoFsync bool
	Logger        *slog.Logger
}

// Cluster is a running in-process cluster.
type Cluster struct {
	cfg  Config
	etcd *embedded.Server
	// mu guards bookies and configs.
	mu      sync.Mutex
	bookies []*bookie.Bookie
	configs []bookie.Config
}

// standaloneFileSize is journalMaxSizeMB and logSizeLimit of the cluster's bookies.
const standaloneFileSize = 256 << 20

// Start starts etcd and the bookies. On error it stops what it started.
func Start(ctx context.Context, cfg Config) (c *Cluster, err error) {
	if cfg.Bookies == 0 {
		cfg.Bookies = 3
	}
	if cfg.Bookies < 0 {
		return nil, fmt.Errorf("cluster: Bookies %d is negative", cfg.Bookies)
	}
	if cfg.DataDir == "" {
		return nil, errors.New("cluster: no data dir")
	}
	// The bookies' cookies record their directories: the same data dir must read the same
	// whatever the working directory.
	if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("cluster: data dir: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c = &Cluster{cfg: cfg}
	started := c // the error returns below set c to nil
	defer func() {
		if err != nil {
			started.Close(context.Background())
		}
	}()
	c.etcd, err = embedded.Start(ctx, embedded.Config{
		Dir: filepath.Join(cfg.DataDir, "metadata"), ClientPort: cfg.MetadataPort,
		UnsafeNoFsync: cfg.UnsafeNoFsync, AutoCompactionRetention: time.Hour,
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: metadata store: %w", err)
	}
	for i := range cfg.Bookies {
		port := cfg.BasePort + i
		if cfg.BasePort == 0 {
			if port, err = freePort(); err != nil {
				return nil, err
			}
		}
		bc := bookie.DefaultConfig()
		bc.ListenAddress = "127.0.0.1"
		bc.BookiePort = port
		bc.MetadataServiceURI = c.etcd.URI()
		bc.PrometheusStatsHTTPPort = 0
		switch {
		case cfg.HTTPBasePort > 0:
			bc.PrometheusStatsHTTPPort = cfg.HTTPBasePort + i
		case cfg.HTTPBasePort < 0:
			bc.PrometheusStatsHTTPPort = -1
		}
		dir := c.bookieDir(i)
		bc.Engine.JournalDirs = []string{filepath.Join(dir, "journal")}
		bc.Engine.LedgerDirs = []string{filepath.Join(dir, "ledgers")}
		// Several bookies share one machine's disk: files of a production size (journal 2 GiB,
		// prepared one ahead and recycled; entry logs 1 GiB, fallocated) would take ~5 GiB per
		// bookie before the first add.
		bc.Engine.Journal.MaxFileSize = standaloneFileSize
		bc.Engine.EntryLogSizeLimit = standaloneFileSize
		bc.Logger = cfg.Logger.With("bookie", i)
		if cfg.Bookie != nil {
			cfg.Bookie(i, &bc)
		}
		c.configs = append(c.configs, bc)
		c.bookies = append(c.bookies, nil)
	}
	// Bookies start in parallel: each replays its journal.
	errs := make([]error, cfg.Bookies)
	var wg sync.WaitGroup
	for i := range cfg.Bookies {
		_, serr := os.Stat(c.bookieDir(i))
		fresh := errors.Is(serr, fs.ErrNotExist)
		wg.Go(func() { errs[i] = c.startNew(ctx, i, fresh) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// startNew starts bookie i. A port picked by freePort can be taken by another process before
// the bookie binds it; a fresh bookie (its directory did not exist before this Start), new and
// empty, then starts again from an empty directory on another port (its id is its address, so
// the old directory's cookie would not match). A bookie with an existing directory is never
// moved: that would remove its data.
func (c *Cluster) startNew(ctx context.Context, i int, fresh bool) error {
	for attempt := 1; ; attempt++ {
		err := c.StartBookie(ctx, i)
		if err == nil || c.cfg.BasePort != 0 || !fresh || attempt == 3 {
			return err
		}
		c.mu.Lock()
		cfg := &c.configs[i]
		c.mu.Unlock()
		if portFree(cfg.BookiePort) {
			return err // not a lost port
		}
		port, perr := freePort()
		if perr != nil {
			return errors.Join(err, perr)
		}
		dir := c.bookieDir(i)
		for _, d := range append(cfg.Engine.JournalDirs[:1:1], cfg.Engine.LedgerDirs...) {
			if filepath.Dir(d) != dir {
				return err // the bookie's config put its data elsewhere: not ours to remove
			}
		}
		if rerr := os.RemoveAll(dir); rerr != nil {
			return errors.Join(err, rerr)
		}
		c.mu.Lock()
		cfg.BookiePort = port
		c.mu.Unlock()
		c.cfg.Logger.Warn("bookie port taken before it could bind; starting on another", "bookie", i, "err", err)
	}
}

func (c *Cluster) bookieDir(i int) string {
	return filepath.Join(c.cfg.DataDir, "bookie-"+strconv.Itoa(i))
}

// portFree reports whether port can be listened on now.
func portFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// MetadataURI is the URI clients and tools use.
func (c *Cluster) MetadataURI() string { return c.etcd.URI() }

// Bookie returns bookie i (nil while stopped).
func (c *Cluster) Bookie(i int) *bookie.Bookie {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bookies[i]
}

// Size is the number of bookies.
func (c *Cluster) Size() int { return len(c.configs) }

// BookieAddrs lists the bookies' addresses (host:port).
func (c *Cluster) BookieAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, cfg := range c.configs {
		out = append(out, net.JoinHostPort(cfg.ListenAddress, strconv.Itoa(cfg.BookiePort)))
	}
	return out
}

// StartBookie starts (or restarts) bookie i on its directories.
func (c *Cluster) StartBookie(ctx context.Context, i int) error {
	c.mu.Lock()
	if c.bookies[i] != nil {
		c.mu.Unlock()
		return fmt.Errorf("cluster: bookie %d is running", i)
	}
	cfg := c.configs[i]
	c.mu.Unlock()
	b, err := bookie.Start(ctx, cfg)
	if err != nil {
		return fmt.Errorf("cluster: bookie %d: %w", i, err)
	}
	c.mu.Lock()
	c.bookies[i] = b
	c.mu.Unlock()
	return nil
}

// StopBookie stops bookie i gracefully.
func (c *Cluster) StopBookie(ctx context.Context, i int) error {
	c.mu.Lock()
	b := c.bookies[i]
	c.bookies[i] = nil
	c.mu.Unlock()
	if b == nil {
		return nil
	}
	return b.Close(ctx)
}

// Close stops every bookie, then etcd.
func (c *Cluster) Close(ctx context.Context) error {
	var errs []error
	for i := range c.bookies {
		errs = append(errs, c.StopBookie(ctx, i))
	}
	if c.etcd != nil {
		errs = append(errs, c.etcd.Close())
	}
	return errors.Join(errs...)
}
