package dlog

import "errors"

// Errors returned by the package; match them with errors.Is.
var (
	// ErrInvalidName: a log name that is empty, too long, or has characters other than
	// [A-Za-z0-9._-].
	ErrInvalidName = errors.New("dlog: invalid log name")
	// ErrInvalidConfig: Config.Validate rejected the configuration.
	ErrInvalidConfig = errors.New("dlog: invalid config")
	// ErrLogExists: CreateLog found a log of that name.
	ErrLogExists = errors.New("dlog: log already exists")
	// ErrNoSuchLog: no log of that name (never created, or deleted).
	ErrNoSuchLog = errors.New("dlog: no such log")
	// ErrInvalidDLSN: bytes or a string that do not decode to a DLSN.
	ErrInvalidDLSN = errors.New("dlog: invalid DLSN")
	// ErrTxIDNotIncreasing: a record's transaction id is not greater than the previous
	// record's (or than the log's last transaction id when the writer opened). The record is
	// refused; the writer stays usable.
	ErrTxIDNotIncreasing = errors.New("dlog: transaction id does not increase")
	// ErrRecordTooLarge: a record payload over MaxRecordSize.
	ErrRecordTooLarge = errors.New("dlog: record too large")
	// ErrWriterClosed: the writer was closed.
	ErrWriterClosed = errors.New("dlog: writer closed")
	// ErrLockLost: the writer lost the log's ownership lock (its lease expired: a pause or a
	// partition from the metadata service longer than LockTTL); another writer may own the
	// log now. Records not yet acknowledged fail with it; the writer is unusable.
	ErrLockLost = errors.New("dlog: writer lost the log's ownership lock")
	// ErrFenced: another writer recovered the segment this writer was writing (it opened the
	// log after this writer lost its lock): the record may or may not have been written, as
	// for a timeout. The writer is unusable.
	ErrFenced = errors.New("dlog: writer fenced by another writer; the record may or may not have been written")
	// ErrTruncated: a position before the log's truncation point, or data deleted by
	// retention under a reader.
	ErrTruncated = errors.New("dlog: position truncated")
	// ErrCorrupt: an entry or a metadata value that does not decode, or a log whose records
	// or segments break the log's invariants (a gap, a transaction id going backwards).
	ErrCorrupt = errors.New("dlog: corrupt log data")
	// ErrReaderClosed: the reader was closed.
	ErrReaderClosed = errors.New("dlog: reader closed")
	// ErrTruncateBeyondEnd: Truncate at a position the writer has not reached.
	ErrTruncateBeyondEnd = errors.New("dlog: truncation point beyond the end of the log")
)
