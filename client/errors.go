package client

import "errors"

// Errors returned by the client; match them with errors.Is.
var (
	ErrClosed                 = errors.New("client: closed")
	ErrBadArgument            = errors.New("client: bad argument")
	ErrNoSuchLedger           = errors.New("client: no such ledger")
	ErrNoSuchEntry            = errors.New("client: no such entry")
	ErrLedgerClosed           = errors.New("client: ledger is closed")
	ErrLedgerFenced           = errors.New("client: ledger is fenced (another client opened it for recovery); the entry may or may not have been written")
	ErrReadOnly               = errors.New("client: ledger handle is read-only")
	ErrNotEnoughBookies       = errors.New("client: not enough bookies")
	ErrDigestMismatch         = errors.New("client: entry digest mismatch")
	ErrUnauthorized           = errors.New("client: unauthorized (wrong password)")
	ErrEntryTooLarge          = errors.New("client: entry too large")
	ErrTimeout                = errors.New("client: timed out")
	ErrRecovery               = errors.New("client: ledger recovery failed")
	ErrTooManyEnsembleChanges = errors.New("client: too many ensemble changes")
	ErrBookieUnavailable      = errors.New("client: bookie unavailable")
	ErrTooManyPendingAdds     = errors.New("client: too many adds in flight (Config.MaxPendingAdds); the append was not written")
)
