package engine

import "errors"

// Errors returned by the engine. Each maps to one BookKeeper return code (see net/protocol).
var (
	ErrNoLedger        = errors.New("engine: no such ledger")                 // ENOLEDGER
	ErrNoEntry         = errors.New("engine: no such entry")                  // ENOENTRY
	ErrUnauthorized    = errors.New("engine: master key does not match")      // EUA
	ErrFenced          = errors.New("engine: ledger is fenced")               // EFENCED
	ErrIO              = errors.New("engine: I/O error")                      // EIO
	ErrTooManyRequests = errors.New("engine: write cache full")               // ETOOMANYREQUESTS
	ErrReadOnly        = errors.New("engine: bookie is read-only")            // EREADONLY
	ErrClosed          = errors.New("engine: closed")                         // EIO
	ErrBadEntry        = errors.New("engine: malformed entry or bad id")      // EBADREQ
	ErrCookie          = errors.New("engine: cookie check failed")            // startup
	ErrBadConfig       = errors.New("engine: bad config")                     // startup
	ErrFailed          = errors.New("engine: storage failed; restart needed") // EIO, sticky
)
