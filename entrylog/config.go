package entrylog

import (
	"fmt"
	"log/slog"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// Config configures the entry logs of one directory. Field comments name the BookKeeper key
// where the concept is the same; DefaultConfig has the defaults.
type Config struct {
	// Dir is the directory of the logs (in a bookie, <ledgerDir>/current).
	Dir string
	// FS is the file system; nil means the OS.
	FS diskio.FS
	// Engine serves the asynchronous buffer writes: auto, io_uring or psync. Files of an FS
	// other than the OS are always written with psync.
	Engine diskio.Engine

	// LogSizeLimit is logSizeLimit (1 GiB): a log is fallocated to this size at creation and
	// rolled when the next record would not fit. At most 4 GiB (offsets are 32 bits). The
	// ledgers map is appended at the roll and may extend a log past the limit.
	LogSizeLimit int64
	// MaxEntrySize is the largest stored entry (5 MiB, BookKeeper's nettyMaxFrameSizeBytes:
	// an entry never exceeds a frame). Do not lower it below the size of stored entries: reads
	// and scans reject records above it.
	MaxEntrySize int
	// WriteBufferSize is the size of each aligned write buffer (1 MiB); records are appended to a
	// buffer and a full buffer is written as one O_DIRECT write. Open rounds it up to a multiple
	// of the device's direct-I/O alignment.
	WriteBufferSize int
	// WriteBuffers is the number of write buffers (2, at least 2): while some are being written,
	// the writer fills the next.
	//
	// Small writes, one in flight, keep a flush from queueing megabytes in front of the
	// journal's writes where both share a disk: with 4 MiB × 3 in flight the storage
	// benchmark's add p99 was 78–87 ms, with 1 MiB × 1 it was 22 ms (and throughput 5% higher);
	// a flush still runs at over 500 MB/s. See BENCHMARKS.md.
	WriteBuffers int
	// Fallocate reserves LogSizeLimit bytes when a log is created
	// (entryLogFilePreallocationEnabled). It is turned off by itself, with a warning, where the
	// file system does not support it.
	Fallocate bool

	// ReadBufferSize is the size of each pooled aligned read buffer (128 KiB): it bounds what
	// one Read or ReadAhead reads with the small buffers. Larger records use a large buffer.
	// Direct-I/O reads cover whole units of the device's alignment, which Open finds out (the
	// user may not know it, and it changes with the device): Open rounds the size up to a
	// multiple of it, and to at least two units, rather than refusing it, as for
	// WriteBufferSize. The default needs no rounding for alignments up to 64 KiB.
	ReadBufferSize int
	// ReadBuffers is the number of small read buffers (64): at most this many reads run at once.
	ReadBuffers int
	// LargeReadBuffers is the number of read buffers that hold a record of MaxEntrySize (2):
	// reads of larger records, and ReadAheads beyond ReadBufferSize, wait for one of them.
	LargeReadBuffers int
	// ReadHint is the stored-entry size a Read expects (1536: a 1 KiB payload with BookKeeper's
	// header and digest, and room to spare): its first read covers a record of this size, so
	// that a typical entry takes one read.
	ReadHint int
	// MaxOpenReadFiles bounds the read-only file handles kept open (256); idle ones are closed
	// when it is reached.
	MaxOpenReadFiles int

	// Logger receives warnings; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults for the logs in dir.
func DefaultConfig(dir string) Config {
	return Config{
		Dir:              dir,
		LogSizeLimit:     1 << 30,
		MaxEntrySize:     5 << 20,
		WriteBufferSize:  1 << 20,
		WriteBuffers:     2,
		Fallocate:        true,
		ReadBufferSize:   128 << 10,
		ReadBuffers:      64,
		LargeReadBuffers: 2,
		ReadHint:         1536,
		MaxOpenReadFiles: 256,
	}
}

// Validate checks the config and fills in FS and Logger. Open also checks the limits against
// the directory's direct-I/O alignment.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	if c.Dir == "" {
		return bad("no entry log directory")
	}
	if c.FS == nil {
		c.FS = diskio.NewOS()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.MaxEntrySize < 1 || c.MaxEntrySize > 1<<30:
		return bad("max entry size %d must be in [1, 1 GiB]", c.MaxEntrySize)
	case c.LogSizeLimit < 1 || c.LogSizeLimit > maxLogSizeLimit:
		return bad("logSizeLimit %d must be in [1, 4 GiB]", c.LogSizeLimit)
	case c.WriteBufferSize < minHeaderBlock:
		return bad("write buffer size %d is below %d", c.WriteBufferSize, minHeaderBlock)
	case c.WriteBufferSize > 1<<30:
		return bad("write buffer size %d is above 1 GiB", c.WriteBufferSize)
	case c.WriteBuffers < 2 || c.WriteBuffers > 64:
		return bad("write buffers %d must be in [2, 64]", c.WriteBuffers)
	case c.ReadBufferSize < 2*minHeaderBlock || c.ReadBufferSize > 1<<30:
		return bad("read buffer size %d must be in [%d, 1 GiB]", c.ReadBufferSize, 2*minHeaderBlock)
	case c.ReadBuffers < 1 || c.ReadBuffers > 1<<16:
		return bad("read buffers %d must be in [1, 65536]", c.ReadBuffers)
	case c.LargeReadBuffers < 1 || c.LargeReadBuffers > 1024:
		return bad("large read buffers %d must be in [1, 1024]", c.LargeReadBuffers)
	case c.ReadHint < 0 || c.ReadHint > c.MaxEntrySize:
		return bad("read hint %d must be in [0, max entry size %d]", c.ReadHint, c.MaxEntrySize)
	case c.MaxOpenReadFiles < 1:
		return bad("max open read files %d must be positive", c.MaxOpenReadFiles)
	}
	return c.checkAlignment(minHeaderBlock)
}

// checkAlignment checks the limits that depend on the alignment.
func (c *Config) checkAlignment(align int) error {
	if minimum := c.minLogSize(align); c.LogSizeLimit < minimum {
		return fmt.Errorf("%w: logSizeLimit %d is below %d, the header block plus a largest entry and its padding",
			ErrBadConfig, c.LogSizeLimit, minimum)
	}
	return nil
}

// minLogSize is the smallest LogSizeLimit that holds the header block and one largest record.
func (c *Config) minLogSize(align int) int64 {
	return int64(align) + diskio.AlignUp(int64(2*recordHeaderSize+c.MaxEntrySize), align)
}

// smallBufferSize is the size of the small read buffers for ReadBufferSize size and the
// alignment: a whole number of alignment units, at least two, so that a record header that
// straddles a unit boundary fits (and so does the first unit of a log, its header).
func smallBufferSize(size, align int) int {
	return max(int(diskio.AlignUp(int64(size), align)), 2*align)
}

// largeBufferSize is the size of a buffer that holds any record read from an aligned offset.
func largeBufferSize(maxEntry, align int) int {
	return int(diskio.AlignUp(int64(recordHeaderSize+maxEntry), align)) + align
}
