package dlog

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
)

// Config configures a Namespace and the writers and readers it opens. The zero value is usable:
// EnsureDefaults fills zero fields with the defaults below (DistributedLog's, where it has
// one; the setting's DistributedLog name is in each comment).
type Config struct {
	// EnsembleSize, WriteQuorum and AckQuorum are the ledger settings of new segments
	// (ensemble-size, write-quorum-size, ack-quorum-size; default 3/3/2).
	EnsembleSize, WriteQuorum, AckQuorum int
	// Digest of new segment ledgers (default CRC32C).
	Digest client.DigestType
	// Password of the segment ledgers (digest password; default empty). Every client of a
	// namespace must use the same one.
	Password []byte

	// MaxLogSegmentBytes rolls the writer to a new segment once the current one holds this
	// many bytes (maxLogSegmentBytes; default 256 MiB).
	MaxLogSegmentBytes int64
	// LogSegmentRollingInterval rolls to a new segment once the current one, holding
	// records, is this old (logSegmentRollingIntervalMinutes; default 120 minutes).
	LogSegmentRollingInterval time.Duration

	// OutputBufferSize: a batch of records (one ledger entry) is sent once it holds this
	// many bytes of records (writerOutputBufferSize; default 1024).
	OutputBufferSize int
	// PeriodicFlushFrequency: a batch is sent at the latest this long after its first
	// record arrived (periodicFlushFrequencyMilliSeconds; default 2 ms). A batch is also sent
	// at once when no other batch is in flight, so a lone synchronous writer is not delayed.
	PeriodicFlushFrequency time.Duration
	// ImmediateFlush sends every record as its own entry (immediateFlushEnabled).
	ImmediateFlush bool
	// MaxInFlightEntries bounds the entries sent and not yet acknowledged (default 1000).
	MaxInFlightEntries int
	// MaxOutstandingBytes bounds the record bytes accepted and not yet acknowledged; Write
	// and WriteAsync wait for room (default 64 MiB).
	MaxOutstandingBytes int64

	// RetentionPeriod: completed segments older than this are deleted with their ledgers
	// (retentionPeriodHours; default 72 hours). Negative: keep them until truncated.
	RetentionPeriod time.Duration
	// LockTTL is the lease of the writer's ownership lock: a writer whose process dies
	// leaves the log to the next writer after about this long (default 10 s; at least 1 s).
	LockTTL time.Duration

	// TailPollInterval: a reader that has read everything acknowledged polls the bookies
	// for a new last-add-confirmed this often (the bound on tailing latency; default 10 ms).
	TailPollInterval time.Duration
	// ReadAheadEntries: a reader reads up to this many entries per request batch (default
	// 256); the client's ReadWindow of them are in flight at once.
	ReadAheadEntries int

	// Logger receives warnings (a segment recovered, an orphaned ledger). Default: the
	// client's logger, or slog.Default.
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultMaxLogSegmentBytes        = 256 << 20
	DefaultLogSegmentRollingInterval = 120 * time.Minute
	DefaultOutputBufferSize          = 1024
	DefaultPeriodicFlushFrequency    = 2 * time.Millisecond
	DefaultMaxInFlightEntries        = 1000
	DefaultMaxOutstandingBytes       = 64 << 20
	DefaultRetentionPeriod           = 72 * time.Hour
	DefaultLockTTL                   = 10 * time.Second
	DefaultTailPollInterval          = 10 * time.Millisecond
	DefaultReadAheadEntries          = 256
)

// EnsureDefaults fills zero fields.
func (c *Config) EnsureDefaults() {
	if c.EnsembleSize == 0 && c.WriteQuorum == 0 && c.AckQuorum == 0 {
		c.EnsembleSize, c.WriteQuorum, c.AckQuorum = 3, 3, 2
	}
	if c.Digest == 0 {
		c.Digest = client.DigestCRC32C
	}
	setDefault(&c.MaxLogSegmentBytes, DefaultMaxLogSegmentBytes)
	setDefault(&c.LogSegmentRollingInterval, DefaultLogSegmentRollingInterval)
	setDefault(&c.OutputBufferSize, DefaultOutputBufferSize)
	setDefault(&c.PeriodicFlushFrequency, DefaultPeriodicFlushFrequency)
	setDefault(&c.MaxInFlightEntries, DefaultMaxInFlightEntries)
	setDefault(&c.MaxOutstandingBytes, DefaultMaxOutstandingBytes)
	setDefault(&c.RetentionPeriod, DefaultRetentionPeriod)
	setDefault(&c.LockTTL, DefaultLockTTL)
	setDefault(&c.TailPollInterval, DefaultTailPollInterval)
	setDefault(&c.ReadAheadEntries, DefaultReadAheadEntries)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate checks the config after EnsureDefaults.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.EnsembleSize < c.WriteQuorum || c.WriteQuorum < c.AckQuorum || c.AckQuorum < 1:
		return bad("need ensemble ≥ write quorum ≥ ack quorum ≥ 1 (got %d/%d/%d)", c.EnsembleSize, c.WriteQuorum, c.AckQuorum)
	case c.MaxLogSegmentBytes < 1:
		return bad("MaxLogSegmentBytes %d", c.MaxLogSegmentBytes)
	case c.LogSegmentRollingInterval < 0:
		return bad("LogSegmentRollingInterval %v", c.LogSegmentRollingInterval)
	case c.OutputBufferSize < 1 || c.OutputBufferSize > maxEntryRecordBytes:
		return bad("OutputBufferSize %d not in 1..%d", c.OutputBufferSize, maxEntryRecordBytes)
	case c.PeriodicFlushFrequency < 0:
		return bad("PeriodicFlushFrequency %v", c.PeriodicFlushFrequency)
	case c.MaxInFlightEntries < 1:
		return bad("MaxInFlightEntries %d", c.MaxInFlightEntries)
	case c.MaxOutstandingBytes < 1:
		return bad("MaxOutstandingBytes %d", c.MaxOutstandingBytes)
	case c.LockTTL < time.Second:
		return bad("LockTTL %v is below 1s", c.LockTTL)
	case c.TailPollInterval < 0:
		return bad("TailPollInterval %v", c.TailPollInterval)
	case c.ReadAheadEntries < 1:
		return bad("ReadAheadEntries %d", c.ReadAheadEntries)
	}
	return nil
}
