package metadata

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// Version identifies one stored version of an object (ledger metadata,
// cookie) for compare-and-set. Its value is driver-specific (etcd: the key's
// ModRevision); compare versions only for equality, and only versions from
// the same driver.
type Version int64

// Special versions.
const (
	// NoVersion, passed as the expected version, means "the object must not
	// exist yet" (create). Reads never return it.
	NoVersion Version = 0
	// AnyVersion, passed as the expected version, skips the comparison.
	AnyVersion Version = -1
)

// Driver is one connection to a metadata service. All methods are safe for
// concurrent use. Every method that talks to the service takes a context and
// returns when it is done.
type Driver interface {
	// Bookies returns the bookie registry.
	Bookies() Registry
	// Ledgers returns the ledger metadata store.
	Ledgers() LedgerStore
	// Cookies returns the cookie store.
	Cookies() CookieStore
	// NewLedgerID returns a ledger id (>= 0) that no client of the cluster has
	// been given before, nor will be, even after the ledger is deleted. Ids
	// from one Driver increase; ids from different Drivers interleave.
	NewLedgerID(ctx context.Context) (int64, error)
	// InstanceID returns the cluster's instance id, creating it (a random
	// UUID) on first use. Every later call, from any client, returns the
	// same id.
	InstanceID(ctx context.Context) (string, error)
	// Close stops every goroutine the driver started (watches, keep-alives)
	// and closes the connection. Bookie registrations that were not closed
	// are not removed: they expire with their lease, as if the process had
	// crashed. Later calls fail with ErrClosed.
	Close() error
}

// LedgerStore stores ledger metadata under 64-bit ledger ids. Updates are
// compare-and-set on the Version returned by the previous read or write.
type LedgerStore interface {
	// Create stores md under id. It fails with ErrLedgerExists if the id has
	// metadata, and with ErrInvalidMetadata if md does not validate.
	Create(ctx context.Context, id int64, md *LedgerMetadata) (Version, error)
	// Read returns the metadata and its version, or ErrNoSuchLedger.
	Read(ctx context.Context, id int64) (*LedgerMetadata, Version, error)
	// Update replaces the metadata if its version is still expected. If
	// not, it returns a *BadVersionError (errors.Is ErrBadVersion) holding
	// the current metadata and version; if the ledger is gone,
	// ErrNoSuchLedger.
	Update(ctx context.Context, id int64, md *LedgerMetadata, expected Version) (Version, error)
	// Delete removes the metadata if its version is expected (AnyVersion:
	// whatever it is). Missing: ErrNoSuchLedger; other version: ErrBadVersion.
	Delete(ctx context.Context, id int64, expected Version) error
	// List returns up to limit ledger ids >= start in increasing order, and
	// whether more ids follow (the next page starts at the last id + 1). It
	// reads keys only, so it is cheap for millions of ledgers. Keys under the
	// ledgers prefix that are not ledger keys fail it with a
	// *ForeignLedgerKeysError, returned with the page's ids and more.
	List(ctx context.Context, start int64, limit int) (ids []int64, more bool, err error)
	// Scan is List with each ledger's metadata and version. A ledger whose
	// bytes do not decode fails the call with ErrCorruptMetadata, naming it.
	Scan(ctx context.Context, start int64, limit int) (ledgers []VersionedLedger, more bool, err error)
	// Watch reports the ledger's metadata: first its current state, then
	// every change. See LedgerChange.
	Watch(ctx context.Context, id int64) (<-chan LedgerChange, error)
}

// VersionedLedger is one ledger's metadata with its id and version.
type VersionedLedger struct {
	ID       int64
	Metadata *LedgerMetadata
	Version  Version
}

// LedgerChange is one notification from LedgerStore.Watch.
//
// The channel has room for one notification and keeps only the latest: a
// slow reader skips intermediate versions but always sees the newest. After
// Deleted, or when the watch's context is done or the driver is closed, the
// channel is closed.
type LedgerChange struct {
	ID int64
	// Metadata and Version are the newest stored metadata, unless Deleted or
	// Err is set.
	Metadata *LedgerMetadata
	Version  Version
	// Deleted is set once the ledger is gone (or was never there).
	Deleted bool
	// Err is set when the stored bytes do not decode (ErrCorruptMetadata).
	Err error
}

// Registry is the bookie registry. A bookie registers under its id, bound to
// a lease; a bookie whose process dies disappears when the lease's TTL runs
// out.
type Registry interface {
	// Register files info under info.ID and info.State, bound to a lease
	// with the given TTL (0: DefaultRegistrationTTL), and keeps the lease
	// alive until the Registration is closed. If the lease is lost (the
	// service did not hear from this process within the TTL), it registers
	// again under a new lease. If another live process holds the id,
	// Register waits for that lease to expire and fails with ErrBookieExists
	// if it does not (or when ctx is done).
	Register(ctx context.Context, info BookieInfo, ttl time.Duration) (Registration, error)
	// List returns the registered bookies that pass filter, sorted by id.
	List(ctx context.Context, filter BookieFilter) ([]BookieInfo, error)
	// Watch reports the set of registered bookies (all states, sorted by
	// id): first the current set, then the new set after every change. The
	// channel has room for one set and keeps only the latest; it is closed
	// when ctx is done or the driver is closed.
	Watch(ctx context.Context) (<-chan []BookieInfo, error)
}

// Registration is a live bookie registration.
type Registration interface {
	// Update replaces the registration's data; a change of info.State moves
	// the bookie between writable and read-only atomically. info.ID must
	// not change.
	Update(ctx context.Context, info BookieInfo) error
	// Close removes the registration and revokes its lease; it stops the
	// keep-alive. Calling it again returns nil.
	Close(ctx context.Context) error
}

// CookieStore keeps each bookie's cookie (opaque bytes; the bookie package
// owns their format) with compare-and-set.
type CookieStore interface {
	// Read returns the cookie and its version, or ErrNoSuchCookie.
	Read(ctx context.Context, bookieID string) ([]byte, Version, error)
	// Write stores the cookie if the stored version is expected (NoVersion:
	// none may exist yet; AnyVersion: unconditional). Otherwise it returns
	// a *BadVersionError.
	Write(ctx context.Context, bookieID string, cookie []byte, expected Version) (Version, error)
	// Delete removes the cookie if its version is expected (or AnyVersion).
	// Missing: ErrNoSuchCookie; other version: ErrBadVersion.
	Delete(ctx context.Context, bookieID string, expected Version) error
}

// Defaults for Options and Register.
const (
	DefaultDialTimeout     = 5 * time.Second
	DefaultIDBatchSize     = 64
	DefaultRegistrationTTL = 10 * time.Second
	// MaxIDBatchSize bounds Options.IDBatchSize.
	MaxIDBatchSize = 1 << 20
)

// Options tune a driver. The zero value is usable.
type Options struct {
	// DialTimeout bounds connecting: Open fails with ErrUnreachable if the
	// service has not answered within it (or before Open's context is
	// done). Default DefaultDialTimeout.
	DialTimeout time.Duration
	// IDBatchSize is how many ledger ids one driver reserves with one
	// compare-and-set; it hands them out locally until they run out. Ids of
	// a batch that a closed driver did not hand out are never used. Default
	// DefaultIDBatchSize.
	IDBatchSize int
	// Codec encodes ledger metadata. Default DefaultCodec.
	Codec Codec
	// Logger receives the driver's own notable events (a lost lease, a
	// re-registration). Default: discard.
	Logger *slog.Logger
}

// EnsureDefaults fills in zero fields.
func (o *Options) EnsureDefaults() {
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.IDBatchSize == 0 {
		o.IDBatchSize = DefaultIDBatchSize
	}
	if o.Codec == nil {
		o.Codec = DefaultCodec
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate checks the options (after EnsureDefaults).
func (o *Options) Validate() error {
	if o.DialTimeout < 0 {
		return fmt.Errorf("%w: negative DialTimeout %v", ErrInvalidOptions, o.DialTimeout)
	}
	if o.IDBatchSize < 1 || o.IDBatchSize > MaxIDBatchSize {
		return fmt.Errorf("%w: IDBatchSize %d not in 1..%d", ErrInvalidOptions, o.IDBatchSize, MaxIDBatchSize)
	}
	return nil
}

// OpenFunc opens a driver for a parsed URI with validated options.
type OpenFunc func(ctx context.Context, uri URI, opts Options) (Driver, error)

var drivers struct {
	sync.Mutex // guards byScheme
	byScheme   map[string]OpenFunc
}

// RegisterDriver makes a driver available to Open under a URI scheme. Driver
// packages call it from init (for etcd: import
// github.com/ringkeeper/ringkeeper/metadata/etcd). It panics if the scheme
// is registered twice, like database/sql.Register.
func RegisterDriver(scheme string, open OpenFunc) {
	drivers.Lock()
	defer drivers.Unlock()
	if _, dup := drivers.byScheme[scheme]; dup {
		panic("metadata: RegisterDriver called twice for scheme " + scheme)
	}
	if drivers.byScheme == nil {
		drivers.byScheme = make(map[string]OpenFunc)
	}
	drivers.byScheme[scheme] = open
}

// Drivers returns the registered schemes, sorted.
func Drivers() []string {
	drivers.Lock()
	defer drivers.Unlock()
	s := make([]string, 0, len(drivers.byScheme))
	for k := range drivers.byScheme {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// Open parses uri and opens the driver registered for its scheme. It returns
// once the service has answered, or fails with ErrUnreachable within
// opts.DialTimeout (or when ctx is done).
func Open(ctx context.Context, uri string, opts Options) (Driver, error) {
	u, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	drivers.Lock()
	open := drivers.byScheme[u.Scheme]
	drivers.Unlock()
	if open == nil {
		return nil, fmt.Errorf("%w %q: no driver for scheme %q (registered: %v; is the driver package imported?)",
			ErrBadURI, uri, u.Scheme, Drivers())
	}
	return open(ctx, u, opts)
}
