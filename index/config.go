package index

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Config configures the index of one ledger directory. The zero value of every field but Dir
// means "the default"; DefaultConfig spells the defaults out.
type Config struct {
	// Dir is the directory of the pebble store (for example <ledgerDir>/current/index).
	Dir string
	// FS is the file system pebble uses; nil means the OS (vfs.Default). Tests pass
	// vfs.NewCrashableMem() to simulate a power loss.
	FS vfs.FS
	// BlockCacheSize is the size in bytes of pebble's block cache (BookKeeper:
	// dbStorage_rocksDB_blockCacheSize, 10% of direct memory divided by the ledger dirs). It
	// is filled on demand. Look-ups are ~5x faster when the hot part of the index fits:
	// 1M ledgers × 4 entries take about 80 MB on disk (see Performance in the package doc). Default 256 MiB.
	BlockCacheSize int64
	// MemTableSize is the size in bytes of one pebble memtable (BookKeeper's RocksDB write
	// buffer, 64 MiB). pebble budgets 220 bytes of memtable per location, and hands a batch
	// whose budget exceeds half a memtable (above ~150k locations for 64 MiB) to the LSM as
	// a "flushable batch": just as durable, but it forces a memtable flush and the Batch's
	// buffer is then not kept for reuse. Default 64 MiB.
	MemTableSize uint64
	// MaxRetainedBatchBytes is how large a Batch's buffer may grow and still be kept for
	// reuse after Commit or Reset. A location costs 28 bytes in a batch, so the default
	// (16 MiB) keeps the buffer of a 500k-location checkpoint.
	MaxRetainedBatchBytes int
	// BloomBitsPerKey is the bloom filter size of every level (BookKeeper: 10). Filters
	// serve Location look-ups of absent keys and of levels that do not hold the key; the
	// iterator look-ups (LastEntry, Entries) do not use them. Default 10; negative disables.
	BloomBitsPerKey int
	// BlockSize is the target uncompressed size of an sstable data block. Default 16 KiB
	// (BookKeeper: 64 KiB); smaller blocks waste less cache on random point look-ups.
	BlockSize int
	// Logger receives pebble's messages: informational ones at Debug level, errors at Error
	// level. nil means slog.Default().
	Logger *slog.Logger
}

// Defaults used by Validate for zero fields.
const (
	DefaultBlockCacheSize        = 256 << 20
	DefaultMemTableSize          = 64 << 20
	DefaultMaxRetainedBatchBytes = 16 << 20
	DefaultBloomBitsPerKey       = 10
	DefaultBlockSize             = 16 << 10
)

// DefaultConfig returns the defaults for an index in dir.
func DefaultConfig(dir string) Config {
	return Config{
		Dir:                   dir,
		BlockCacheSize:        DefaultBlockCacheSize,
		MemTableSize:          DefaultMemTableSize,
		MaxRetainedBatchBytes: DefaultMaxRetainedBatchBytes,
		BloomBitsPerKey:       DefaultBloomBitsPerKey,
		BlockSize:             DefaultBlockSize,
	}
}

// ErrBadConfig is wrapped by every Validate error.
var ErrBadConfig = errors.New("index: bad config")

// Validate checks the config and fills in the defaults of zero fields, FS and Logger.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	if c.Dir == "" {
		return bad("no index directory")
	}
	switch {
	case c.BlockCacheSize < 0:
		return bad("block cache size %d is negative", c.BlockCacheSize)
	case c.MaxRetainedBatchBytes < 0:
		return bad("max retained batch bytes %d is negative", c.MaxRetainedBatchBytes)
	case c.BlockSize < 0 || c.BlockSize > 1<<20:
		return bad("block size %d must be in [0, 1 MiB]", c.BlockSize)
	case c.MemTableSize != 0 && (c.MemTableSize < 1<<20 || c.MemTableSize > 4<<30):
		return bad("memtable size %d must be in [1 MiB, 4 GiB]", c.MemTableSize)
	case c.BloomBitsPerKey > 64:
		return bad("bloom bits per key %d is above 64", c.BloomBitsPerKey)
	}
	if c.BlockCacheSize == 0 {
		c.BlockCacheSize = DefaultBlockCacheSize
	}
	if c.MemTableSize == 0 {
		c.MemTableSize = DefaultMemTableSize
	}
	if c.MaxRetainedBatchBytes == 0 {
		c.MaxRetainedBatchBytes = DefaultMaxRetainedBatchBytes
	}
	if c.BloomBitsPerKey == 0 {
		c.BloomBitsPerKey = DefaultBloomBitsPerKey
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}
