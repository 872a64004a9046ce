package entrylog

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers branch with errors.Is.
var (
	// ErrBadConfig is wrapped by every Validate error.
	ErrBadConfig = errors.New("entrylog: bad config")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("entrylog: closed")
	// ErrCorrupt is wrapped by every error about damaged data: a checksum mismatch, a record that
	// is not the entry asked for, a damaged header or map, a bad record in the durable part of a
	// log. The error names the file and offset. It is an I/O error, never "no such entry".
	ErrCorrupt = errors.New("entrylog: corrupt data")
	// ErrNoSuchLog is returned for a log id that does not exist (never created, or removed).
	ErrNoSuchLog = errors.New("entrylog: no such entry log")
	// ErrBadLocation is returned for a location outside a log's readable data: inside the header
	// block, past the end of the file, or past the last completed Flush of a log being written.
	ErrBadLocation = errors.New("entrylog: location outside the log's data")
	// ErrEntryTooLarge is returned by Add for an entry above MaxEntrySize.
	ErrEntryTooLarge = errors.New("entrylog: entry too large")
	// ErrLogInUse is returned by Remove for a log this instance is writing or has not finalized.
	ErrLogInUse = errors.New("entrylog: log is being written")
	// ErrIDsExhausted is returned when no log id below 2^32 is left.
	ErrIDsExhausted = errors.New("entrylog: log ids exhausted")
)

// maxLogID is the largest log id: a Location keeps the id in its upper 32 bits.
const maxLogID = 1<<32 - 1

// maxLogSizeLimit is the largest LogSizeLimit: a Location keeps the offset in its lower 32 bits.
const maxLogSizeLimit = 1 << 32

// Location is where a record lies: the log id in the upper 32 bits, the offset of the record
// (its header) in the lower 32 bits, as in BookKeeper. Every valid location is non-zero (log
// ids start at 1 and records at 4096), so 0 can mean "none".
type Location uint64

// NewLocation returns the location of the record at offset in log logID. Both must be below
// 2^32.
func NewLocation(logID uint64, offset int64) Location {
	return Location(logID<<32 | uint64(offset)&0xffffffff)
}

// LogID is the id of the log that holds the record.
func (l Location) LogID() uint64 { return uint64(l) >> 32 }

// Offset is the record's offset in its log.
func (l Location) Offset() int64 { return int64(uint64(l) & 0xffffffff) }

func (l Location) String() string { return fmt.Sprintf("%x@%d", l.LogID(), l.Offset()) }

// corruptf returns an ErrCorrupt error that names path and offset and wraps cause.
func corruptf(path string, off int64, cause error) error {
	return fmt.Errorf("%w: %s at offset %d: %w", ErrCorrupt, path, off, cause)
}
