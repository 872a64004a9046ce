package metadata

import (
	"errors"
	"fmt"
)

// Sentinel errors. Drivers wrap them with %w; callers branch with errors.Is.
var (
	// ErrNoSuchLedger: the ledger has no metadata (never created, or deleted).
	ErrNoSuchLedger = errors.New("metadata: no such ledger")
	// ErrLedgerExists: Create found metadata already stored under the id.
	ErrLedgerExists = errors.New("metadata: ledger already exists")
	// ErrBadVersion: a compare-and-set found another version than expected.
	// Ledger updates return a *BadVersionError, which matches it and carries
	// the current metadata.
	ErrBadVersion = errors.New("metadata: bad version")
	// ErrInvalidMetadata: LedgerMetadata.Validate rejected the metadata.
	ErrInvalidMetadata = errors.New("metadata: invalid ledger metadata")
	// ErrCorruptMetadata: stored metadata bytes could not be decoded, or
	// decoded to metadata that does not validate.
	ErrCorruptMetadata = errors.New("metadata: corrupt ledger metadata")
	// ErrUnsupportedFormat: the stored bytes are in a format (or a format
	// version) that this build cannot decode.
	ErrUnsupportedFormat = errors.New("metadata: unsupported metadata format")
	// ErrNoSuchCookie: no cookie is stored for the bookie.
	ErrNoSuchCookie = errors.New("metadata: no such cookie")
	// ErrBookieExists: another live process holds the bookie's registration.
	ErrBookieExists = errors.New("metadata: bookie id already registered by another process")
	// ErrInvalidBookieID: a bookie id that cannot be used as a key.
	ErrInvalidBookieID = errors.New("metadata: invalid bookie id")
	// ErrInvalidBookieInfo: stored bookie registration data that cannot be
	// decoded, or a BookieInfo that cannot be registered.
	ErrInvalidBookieInfo = errors.New("metadata: invalid bookie registration")
	// ErrInvalidLedgerID: a negative ledger id.
	ErrInvalidLedgerID = errors.New("metadata: invalid ledger id")
	// ErrLedgerIDsExhausted: the 63-bit ledger id space is used up.
	ErrLedgerIDsExhausted = errors.New("metadata: ledger ids exhausted")
	// ErrBadURI: the metadata service URI is malformed or names no
	// registered driver.
	ErrBadURI = errors.New("metadata: bad metadata service URI")
	// ErrInvalidOptions: Options.Validate rejected the options.
	ErrInvalidOptions = errors.New("metadata: invalid options")
	// ErrUnreachable: the metadata service did not answer in time.
	ErrUnreachable = errors.New("metadata: metadata service unreachable")
	// ErrClosed: the driver (or registration) was closed.
	ErrClosed = errors.New("metadata: closed")
	// ErrUnchanged may be returned by the mutate function given to
	// UpdateLedger to say that no write is needed.
	ErrUnchanged = errors.New("metadata: unchanged")
)

// BadVersionError is returned by a compare-and-set that lost: the stored
// version is not the expected one. It matches ErrBadVersion.
//
// For ledger updates, Metadata and Current hold the metadata now stored and
// its version, so that a read-modify-write loop can retry without another
// read. For other objects (cookies) Metadata is nil; Current is still set.
type BadVersionError struct {
	// What names the object, e.g. "ledger 42" or "cookie 10.0.0.1:3181".
	What string
	// Expected is the version the caller passed.
	Expected Version
	// Current is the version now stored.
	Current Version
	// Metadata is the ledger metadata now stored (ledger updates only).
	Metadata *LedgerMetadata
}

func (e *BadVersionError) Error() string {
	return fmt.Sprintf("metadata: bad version: %s: expected version %d, stored version is %d",
		e.What, e.Expected, e.Current)
}

// Is makes errors.Is(err, ErrBadVersion) true.
func (e *BadVersionError) Is(target error) bool { return target == ErrBadVersion }

// ForeignLedgerKeysError is returned by LedgerStore.List, together with the page's ledger ids
// and more, when keys under the ledgers prefix are not ledger keys (written by hand or by
// another tool). IDs are the ids such keys name as a decimal number of another width ("42"),
// which may hold a ledger's metadata; Unnamed are the keys that name no id. It matches
// ErrCorruptMetadata, so a caller that checks err first fails as before.
type ForeignLedgerKeysError struct {
	IDs     []int64
	Unnamed []string
}

func (e *ForeignLedgerKeysError) Error() string {
	return fmt.Sprintf("%v: keys under the ledgers prefix that are not ledger keys: naming ids %v, naming no id %q",
		ErrCorruptMetadata, e.IDs, e.Unnamed)
}

// Is makes errors.Is(err, ErrCorruptMetadata) true.
func (e *ForeignLedgerKeysError) Is(target error) bool { return target == ErrCorruptMetadata }
