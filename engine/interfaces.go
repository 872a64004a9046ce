package engine

import (
	"context"
	"time"
)

// entryLog is what the engine needs from one ledger dir's entry logs (package entrylog). Add
// and Flush are called under the dir's flushMu only (by the checkpoint's flush or by
// compaction); Read and ReadAhead by any goroutine, for locations whose Flush has returned. The
// garbage collector uses the rest.
type entryLog interface {
	Add(ledgerID, entryID int64, entry []byte) (uint64, error)
	// AddChecksummed is Add with the entry's CRC32C computed by the caller.
	AddChecksummed(ledgerID, entryID int64, entry []byte, crc uint32) (uint64, error)
	Flush() error
	Read(loc uint64, ledgerID, entryID int64, dst []byte) ([]byte, error)
	ReadAhead(loc uint64, maxBytes int, fn func(ledgerID, entryID int64, entry []byte, loc uint64) bool) error
	// CompletedLogs lists the logs that are no longer written (ascending ids).
	CompletedLogs() []uint64
	// CurrentLogID is the id of the log being written (it changes when the log rolls).
	CurrentLogID() uint64
	// LedgersMap returns a log's ledgers with their bytes in it (from its map or a scan), and
	// where a rebuilding scan found the end of the valid data (-1: the map was read; see
	// entrylog.EntryLog.LedgersMapScanned).
	LedgersMap(id uint64) (m map[int64]uint64, scannedTo int64, err error)
	// Scan calls fn for every entry of a log in file order; entry is valid during the call.
	Scan(id uint64, fn func(ledgerID, entryID int64, entry []byte, loc uint64) error) error
	// Size is a log file's size on disk.
	Size(id uint64) (int64, error)
	// Remove deletes a completed log durably (the directory is synced).
	Remove(id uint64) error
	Close() error
}

// logID is the entry log a location points into (entrylog.Location's upper 32 bits).
func logID(loc uint64) uint64 { return loc >> 32 }

// ledgerState is a ledger's persisted state.
type ledgerState struct {
	Fenced      bool
	MasterKey   []byte
	ExplicitLAC []byte
}

// locationIndex is what the engine needs from one ledger dir's index (package index).
// found is false when the key is absent; err is reserved for real failures (corruption, I/O),
// so that a damaged index is never taken for "no such entry".
type locationIndex interface {
	Location(ledgerID, entryID int64) (loc uint64, found bool, err error)
	LastEntry(ledgerID int64) (entryID int64, found bool, err error)
	// Entries calls fn with the location of each entry of the ledger from fromEntry on, in
	// entry order, until fn returns false.
	Entries(ledgerID, fromEntry int64, fn func(entryID int64, loc uint64) bool) error
	Ledgers(fn func(id int64, st ledgerState) bool) error
	// FencedDeleted calls fn with each fenced-deleted tombstone (DeleteFencedLedger) and the
	// wall-clock time of its deletion, until fn returns false.
	FencedDeleted(fn func(id int64, deletedAt time.Time) bool) error
	NewBatch() indexBatch
	// Checkpoint returns the record of the last committed PutCheckpoint (empty before the
	// first); an error wrapping ErrCorrupt if the store lost it.
	Checkpoint() ([]byte, error)
	// Flush makes every committed batch part of pebble's checksummed tables (see
	// index.Index.Flush), before the engine removes what the batches made obsolete.
	Flush() error
	// Upgraded: the store was converted from an older format at open, so its empty checkpoint
	// record is no evidence that it is new.
	Upgraded() bool
	// Warm loads the index into its cache if it fits (see index.Index.Warm); bytes read.
	Warm(ctx context.Context) (int64, error)
	Close() error
}

// indexBatch collects a checkpoint's index updates and writes them atomically.
type indexBatch interface {
	PutLocation(ledgerID, entryID int64, loc uint64)
	PutLedger(id int64, st ledgerState)
	DeleteLedger(id int64)
	// DeleteFencedLedger is DeleteLedger plus, in the same atomic write, the ledger's
	// fenced-deleted tombstone dated deletedAt.
	DeleteFencedLedger(id int64, deletedAt time.Time)
	// DropFencedDeleted removes a ledger's fenced-deleted tombstone, if any.
	DropFencedDeleted(id int64)
	// PutCheckpoint records the journal marks of the checkpoint this batch belongs to.
	PutCheckpoint(record []byte)
	Len() int
	// Commit writes the batch (synced if sync) and leaves it empty for reuse.
	Commit(sync bool) error
}
