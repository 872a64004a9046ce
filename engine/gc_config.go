package engine

import (
	"context"
	"fmt"
	"time"
)

// LedgerChecker tells the garbage collector whether a ledger still exists in the metadata
// store. The bookie implements it on its metadata driver; tests use fakes.
type LedgerChecker interface {
	// LedgerExists reports whether the metadata store holds the ledger. It returns
	// (false, nil) only when the store says for certain that the ledger is gone (a point read
	// answered "no such ledger"); any doubt (an unreachable store, a timeout, metadata that does
	// not decode) is an error or true. The garbage collector deletes a ledger's local data only
	// on (false, nil). It is called from one goroutine at a time, at most GCConfig.MetadataOpRate
	// times a second, each call bounded by GCConfig.MetadataOpTimeout through ctx.
	LedgerExists(ctx context.Context, ledgerID int64) (bool, error)
}

// LedgerLister is an optional capability of a LedgerChecker: a listing of the store's ledgers
// that spares a point read for every local ledger. The garbage collector point-reads (with
// LedgerExists) only the local ledgers that the listing lacks, so an incomplete listing costs
// extra reads but never deletes a ledger (BookKeeper #870: never conclude deletion from a
// listing alone). A listing error skips deletion for the run.
type LedgerLister interface {
	// ListLedgers calls fn for every ledger id in the store, in any order.
	ListLedgers(ctx context.Context, fn func(ledgerID int64)) error
}

// GCConfig configures garbage collection and compaction of entry logs. Field comments name
// BookKeeper's keys.
type GCConfig struct {
	// WaitTime is gcWaitTime: the period of the garbage collector.
	WaitTime time.Duration
	// MinorThreshold and MinorInterval are minorCompactionThreshold and
	// minorCompactionInterval: a minor compaction runs at most once per interval and compacts
	// logs whose live data is below the threshold (a fraction of the log's data). A zero
	// threshold or interval disables minor compaction.
	MinorThreshold float64
	MinorInterval  time.Duration
	// MajorThreshold and MajorInterval are majorCompactionThreshold and
	// majorCompactionInterval, as for minor compaction. A run does a major compaction when it is
	// due, else a minor one when that is due, never both.
	MajorThreshold float64
	MajorInterval  time.Duration
	// RateBytes is compactionRateByBytes: bytes per second that compaction may read, and bytes
	// per second it may write (each limited on its own); 0 means no limit.
	RateBytes int64
	// MajorMaxTime and MinorMaxTime are majorCompactionMaxTimeMillis and
	// minorCompactionMaxTimeMillis: a compaction stops after this long (it resumes in a later
	// run); 0 or negative means no limit.
	MajorMaxTime time.Duration
	MinorMaxTime time.Duration
	// MetadataOpRate is gcMetadataOpRateLimit: metadata reads per second while looking for
	// deleted ledgers; 0 means no limit.
	MetadataOpRate int
	// MetadataOpTimeout bounds each metadata read; a read that times out deletes nothing.
	MetadataOpTimeout time.Duration
	// DiskUsageWarnThreshold and DiskUsageThreshold are diskUsageWarnThreshold and
	// diskUsageThreshold: major compaction pauses above the first, minor compaction above the
	// second (it writes before it frees, and a failed entry-log write stops the engine).
	DiskUsageWarnThreshold float64
	DiskUsageThreshold     float64
	// ForceAllowWhenNoSpace is isForceGCAllowWhenNoSpace: a run triggered by an operator
	// compacts even when disk usage would pause compaction.
	ForceAllowWhenNoSpace bool
	// Checker finds ledgers deleted from the metadata store (nil: the garbage collector deletes
	// no ledger itself and only reclaims the space of ledgers deleted with DeleteLedger).
	Checker LedgerChecker
}

// DefaultGCConfig returns the garbage collection defaults (BookKeeper's, except the rate:
// BookKeeper throttles by entries by default, about 1 MB/s; here compaction reads and writes
// at most compactionRateByBytes each).
func DefaultGCConfig() GCConfig {
	return GCConfig{
		WaitTime:               10 * time.Minute,
		MinorThreshold:         0.2,
		MinorInterval:          time.Hour,
		MajorThreshold:         0.8,
		MajorInterval:          24 * time.Hour,
		RateBytes:              DefaultCompactionRateBytes,
		MetadataOpRate:         1000,
		MetadataOpTimeout:      10 * time.Second,
		DiskUsageWarnThreshold: 0.90,
		DiskUsageThreshold:     0.95,
	}
}

// DefaultCompactionRateBytes is the default of compactionRateByBytes.
const DefaultCompactionRateBytes = 16 << 20

func (c *GCConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	switch {
	case c.WaitTime <= 0:
		return bad("gcWaitTime must be positive")
	case c.MinorThreshold < 0 || c.MinorThreshold > 1:
		return bad("minorCompactionThreshold %v must be in [0, 1]", c.MinorThreshold)
	case c.MajorThreshold < 0 || c.MajorThreshold > 1:
		return bad("majorCompactionThreshold %v must be in [0, 1]", c.MajorThreshold)
	case c.MinorInterval < 0 || c.MajorInterval < 0:
		return bad("compaction intervals must not be negative")
	case c.minorEnabled() && c.majorEnabled() && c.MinorThreshold > c.MajorThreshold:
		return bad("minorCompactionThreshold %v is above majorCompactionThreshold %v", c.MinorThreshold, c.MajorThreshold)
	case c.RateBytes < 0:
		return bad("compactionRateByBytes is negative")
	case c.MetadataOpRate < 0:
		return bad("gcMetadataOpRateLimit is negative")
	case c.MetadataOpTimeout <= 0:
		return bad("the metadata read timeout must be positive")
	case c.DiskUsageWarnThreshold <= 0 || c.DiskUsageThreshold <= 0:
		return bad("compaction disk thresholds must be positive")
	}
	return nil
}

func (c *GCConfig) minorEnabled() bool { return c.MinorThreshold > 0 && c.MinorInterval > 0 }
func (c *GCConfig) majorEnabled() bool { return c.MajorThreshold > 0 && c.MajorInterval > 0 }
