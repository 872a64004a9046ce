package journal

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// PreallocMode says how space is prepared ahead of the writer, so that the fdatasync on the
// commit path does not also have to commit file metadata.
type PreallocMode int

const (
	// PreallocFallocate reserves the whole file with fallocate when it is created. Cheap, but
	// the extents are "unwritten": the first write to each converts it, a metadata change that
	// the commit's fdatasync then has to journal.
	PreallocFallocate PreallocMode = iota
	// PreallocZero fallocates the file, then writes zeros over it (off the hot path, while the
	// file waits for the writer, at most zeroFillRate), so the extents are written and a
	// commit's fdatasync only flushes data. It costs a second write of every byte of a new file
	// (recycled files are not written again). A writer that needs the file first takes it with
	// the rest fallocated. The first file of a session, which the journal waits for, is
	// zero-filled over its first 256 MiB only.
	PreallocZero
	// PreallocNone lets the file grow as it is written: every commit extends the file size.
	PreallocNone
)

func (m PreallocMode) String() string {
	switch m {
	case PreallocFallocate:
		return "fallocate"
	case PreallocZero:
		return "zero"
	case PreallocNone:
		return "none"
	}
	return fmt.Sprintf("PreallocMode(%d)", int(m))
}

// ParsePreallocMode parses "fallocate", "zero" or "none".
func ParsePreallocMode(s string) (PreallocMode, error) {
	for _, m := range []PreallocMode{PreallocFallocate, PreallocZero, PreallocNone} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("journal: unknown preallocation mode %q (want fallocate, zero or none)", s)
}

// Config configures one journal. Field comments name the BookKeeper key where the concept is
// the same; DefaultConfig has BookKeeper's defaults except where noted.
type Config struct {
	// Dir is the journal directory (one entry of journalDirectories).
	Dir string
	// FS is the file system; nil means the OS.
	FS diskio.FS
	// Engine is journalIOEngine: auto, io_uring or psync.
	Engine diskio.Engine

	// MaxGroupWait is journalMaxGroupWaitMSec (2 ms): a group is committed once its oldest
	// record has waited this long.
	MaxGroupWait time.Duration
	// BufferedWritesThreshold is journalBufferedWritesThreshold (512 KiB): a group is committed
	// once it holds this many bytes.
	BufferedWritesThreshold int
	// FlushWhenQueueEmpty is journalFlushWhenQueueEmpty: commit as soon as the queue runs empty
	// (adaptive group commit). BookKeeper defaults it to false; here it defaults to true,
	// because waiting for more records only adds latency when nothing else is queued.
	FlushWhenQueueEmpty bool
	// QueueSize is journalQueueSize (10000): records waiting for the writer. Producers block
	// when it is full.
	QueueSize int
	// MaxFileSize is journalMaxSizeMB (2048 MiB) in bytes: files roll over at this size.
	MaxFileSize int64
	// MaxBackups is journalMaxBackups (5): files kept before the persisted mark.
	MaxBackups int
	// SyncData is journalSyncData (true). When false, records are acknowledged after the write
	// reaches the device, before any fdatasync: UNSAFE, a power loss can lose acknowledged
	// records. The mark still advances only after an fdatasync.
	SyncData bool
	// PageCacheFlushInterval is journalPageCacheFlushIntervalMSec (1 s): with SyncData off, a
	// group is synced at least this often.
	PageCacheFlushInterval time.Duration
	// Alignment is journalAlignmentSize: every group is padded to it. It is raised to the file
	// system's direct-I/O alignment if that is larger. Default 4096 (BookKeeper: 512), the
	// physical block size of NVMe drives.
	Alignment int
	// MaxRecordSize is the largest record payload. Default 5 MiB, BookKeeper's
	// nettyMaxFrameSizeBytes, since a record never exceeds a frame.
	MaxRecordSize int
	// PipelineDepth is the number of groups written and synced at once (default 2): the next
	// group's write overlaps the previous group's fdatasync.
	PipelineDepth int
	// ReuseFiles is journalReuseFiles: files that journal GC would delete are kept (up to
	// MaxRecycled) and renamed for reuse, so that new files start with written extents.
	ReuseFiles bool
	// MaxRecycled is how many files are kept for reuse (default 4). Files are collected only at
	// checkpoints, so the pool must cover the files written between two checkpoints for every
	// new file to be a reused one.
	MaxRecycled int
	// Prealloc says how a new (not recycled) file's space is prepared.
	Prealloc PreallocMode
	// SkipInvalidRecords is skipReplayJournalInvalidRecord: replay skips corruption in the
	// middle of a file instead of failing. Acknowledged records in the damaged region are lost.
	SkipInvalidRecords bool
	// Logger receives warnings; nil means slog.Default().
	Logger *slog.Logger
	// OnGroup, if set, is called for every synced group once its records have been called
	// back, on the callback goroutine (it must be quick). The bookie feeds its metrics with it.
	OnGroup func(GroupStats)
}

// GroupStats describe one durable group: where its oldest record's time went, stage by stage.
type GroupStats struct {
	Records int
	Bytes   int // on disk, padding included
	// QueueWait is from the push of the first record of the batch the group's first record
	// came in (the oldest record in it) until the writer took that batch from the queue.
	QueueWait time.Duration
	// GroupWait is from then until the group was submitted: filling it, and waiting for the
	// group wait, the queue to run empty or a pipeline slot.
	GroupWait time.Duration
	// Sync is from submission until the write and its sync completed.
	Sync time.Duration
	// CallbackDelay is from then until the group's first callback began (the callbacks of
	// earlier groups run first).
	CallbackDelay time.Duration
}

// DefaultConfig returns the defaults for a journal in dir.
func DefaultConfig(dir string) Config {
	return Config{
		Dir:                     dir,
		MaxGroupWait:            2 * time.Millisecond,
		BufferedWritesThreshold: 512 << 10,
		FlushWhenQueueEmpty:     true,
		QueueSize:               10000,
		MaxFileSize:             2048 << 20,
		MaxBackups:              5,
		SyncData:                true,
		PageCacheFlushInterval:  time.Second,
		Alignment:               4096,
		MaxRecordSize:           5 << 20,
		PipelineDepth:           2,
		ReuseFiles:              true,
		MaxRecycled:             4,
		Prealloc:                PreallocZero,
	}
}

// ErrBadConfig is wrapped by every Validate error.
var ErrBadConfig = errors.New("journal: bad config")

// Validate checks the config and fills in FS and Logger.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	if c.Dir == "" {
		return bad("no journal directory")
	}
	if c.FS == nil {
		c.FS = diskio.NewOS()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Alignment < 512 || c.Alignment&(c.Alignment-1) != 0 {
		return bad("journalAlignmentSize %d is not a power of two ≥ 512", c.Alignment)
	}
	switch {
	case c.MaxGroupWait < 0:
		return bad("journalMaxGroupWaitMSec %v is negative", c.MaxGroupWait)
	case c.BufferedWritesThreshold < 1:
		return bad("journalBufferedWritesThreshold %d must be positive", c.BufferedWritesThreshold)
	case c.QueueSize < 1:
		return bad("journalQueueSize %d must be positive", c.QueueSize)
	case c.MaxRecordSize < 1 || c.MaxRecordSize > 1<<30:
		return bad("max record size %d must be in [1, 1 GiB]", c.MaxRecordSize)
	case c.PipelineDepth < 1 || c.PipelineDepth > 64:
		return bad("pipeline depth %d must be in [1, 64]", c.PipelineDepth)
	case c.MaxBackups < 0:
		return bad("journalMaxBackups %d is negative", c.MaxBackups)
	case c.MaxRecycled < 0:
		return bad("max recycled files %d is negative", c.MaxRecycled)
	case !c.SyncData && c.PageCacheFlushInterval <= 0:
		return bad("journalPageCacheFlushIntervalMSec %v must be positive", c.PageCacheFlushInterval)
	case c.Prealloc < PreallocFallocate || c.Prealloc > PreallocNone:
		return bad("preallocation mode %d", c.Prealloc)
	}
	if min := int64(c.Alignment) + 2*int64(c.groupCapacity()); c.MaxFileSize < min {
		return bad("journalMaxSizeMB %d bytes is below the minimum %d for these limits", c.MaxFileSize, min)
	}
	return nil
}

// groupCapacity is the size of a group buffer: a full group plus the largest record, its
// header and the trailer, aligned.
func (c *Config) groupCapacity() int {
	n := c.BufferedWritesThreshold + c.MaxRecordSize + 3*recordHeaderSize + c.Alignment
	return int(diskio.AlignUp(int64(n), c.Alignment))
}
