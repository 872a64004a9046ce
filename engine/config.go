package engine

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/journal"
)

// Config configures the storage engine of one bookie. Field comments name BookKeeper's keys.
type Config struct {
	// JournalDirs is journalDirectories: one journal per directory; ledger L uses L mod n.
	JournalDirs []string
	// LedgerDirs is ledgerDirectories: ledger L lives in dir L mod n, each with its own write
	// cache, entry logs and index.
	LedgerDirs []string
	// FS is the file system for journals and entry logs (nil: the OS). The index (pebble) uses
	// the OS directly.
	FS diskio.FS
	// Journal is the template for every journal; Dir and FS are filled in per directory.
	Journal journal.Config

	// WriteCacheMaxSize is dbStorage_writeCacheMaxSizeMb in bytes, over all ledger dirs; each
	// dir gets an equal share split into two halves.
	WriteCacheMaxSize int64
	// ReadAheadCacheMaxSize is dbStorage_readAheadCacheMaxSizeMb in bytes, over all dirs.
	ReadAheadCacheMaxSize int64
	// ReadAheadBatchSize is dbStorage_readAheadCacheBatchSize: entries read ahead on a miss.
	ReadAheadBatchSize int
	// MaxThrottleTime is dbStorage_maxThrottleTimeMs: how long an add waits for write-cache
	// space before failing with ErrTooManyRequests.
	MaxThrottleTime time.Duration
	// FlushInterval is flushInterval: the checkpoint period.
	FlushInterval time.Duration
	// EntryLogSizeLimit is logSizeLimit.
	EntryLogSizeLimit int64
	// IndexBlockCacheSize is the pebble block cache of each ledger dir's index.
	IndexBlockCacheSize int64
	// WarmIndex (indexWarmOnStart) reads each ledger dir's index into its block cache in the
	// background after Open, when it takes at most half the cache: a reopened bookie's first
	// reads then cost one disk read each instead of two.
	WarmIndex bool
	// IndexDir, if set, holds the indexes (one subdirectory per ledger dir) instead of
	// <ledgerDir>/current/index: for tests whose ledger dirs are in memory.
	IndexDir string

	// GC configures garbage collection and compaction of entry logs.
	GC GCConfig

	// RequireExistingCookies refuses to start when no dir has a cookie: set by the bookie when
	// the metadata store holds a cookie for it, so wiped disks are noticed.
	RequireExistingCookies bool

	// InstanceID is the cluster's instance id, written into cookies.
	InstanceID string
	// BookieID is this bookie's id (host:port), written into cookies.
	BookieID string

	Logger *slog.Logger

	// WallClock dates the deletions of fenced ledgers, whose tombstones outlive restarts
	// (nil: time.Now). Tests set it to move time forward.
	WallClock func() time.Time
}

// DefaultConfig returns defaults for a bookie with the given directories.
func DefaultConfig(journalDirs, ledgerDirs []string) Config {
	return Config{
		JournalDirs:           journalDirs,
		LedgerDirs:            ledgerDirs,
		Journal:               journal.DefaultConfig(""),
		WriteCacheMaxSize:     512 << 20,
		ReadAheadCacheMaxSize: 256 << 20,
		ReadAheadBatchSize:    100,
		MaxThrottleTime:       10 * time.Second,
		FlushInterval:         10 * time.Second,
		EntryLogSizeLimit:     1 << 30,
		IndexBlockCacheSize:   128 << 20,
		WarmIndex:             true,
		GC:                    DefaultGCConfig(),
	}
}

// Validate checks the config and fills FS, Logger and WallClock.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	if len(c.JournalDirs) == 0 {
		return bad("journalDirectories is empty")
	}
	if len(c.LedgerDirs) == 0 {
		return bad("ledgerDirectories is empty")
	}
	// Two journals in one directory collide on their file ids, two ledger dirs on pebble's
	// lock, and only after the cookies were written. A journal dir may be a ledger dir.
	if d, ok := repeatedDir(c.JournalDirs); ok {
		return bad("journalDirectories names %s more than once", d)
	}
	if d, ok := repeatedDir(c.LedgerDirs); ok {
		return bad("ledgerDirectories names %s more than once", d)
	}
	if c.FS == nil {
		c.FS = diskio.NewOS()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.WallClock == nil {
		c.WallClock = time.Now
	}
	perHalf := c.WriteCacheMaxSize / int64(len(c.LedgerDirs)) / 2
	switch {
	case perHalf < 1<<20:
		return bad("dbStorage_writeCacheMaxSizeMb %d bytes gives %d bytes per half, below 1 MiB", c.WriteCacheMaxSize, perHalf)
	case perHalf < int64(c.Journal.MaxRecordSize):
		return bad("write cache half (%d bytes) is smaller than the largest entry (%d)", perHalf, c.Journal.MaxRecordSize)
	case c.ReadAheadCacheMaxSize < 0:
		return bad("dbStorage_readAheadCacheMaxSizeMb is negative")
	case c.ReadAheadBatchSize < 0:
		return bad("dbStorage_readAheadCacheBatchSize is negative")
	case c.MaxThrottleTime < 0:
		return bad("dbStorage_maxThrottleTimeMs is negative")
	case c.FlushInterval <= 0:
		return bad("flushInterval must be positive")
	case c.EntryLogSizeLimit < 1<<20:
		return bad("logSizeLimit %d is below 1 MiB", c.EntryLogSizeLimit)
	}
	return c.GC.validate()
}

// repeatedDir returns a directory that dirs names twice, however spelt ("/a", "/a/", "/b/../a").
func repeatedDir(dirs []string) (string, bool) {
	seen := make(map[string]bool, len(dirs))
	for _, d := range dirs {
		clean := filepath.Clean(d)
		if seen[clean] {
			return d, true
		}
		seen[clean] = true
	}
	return "", false
}
