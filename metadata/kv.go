package metadata

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// KV is a small generic keyspace beside the ledger metadata, for layers built on ledgers (the
// distributed log keeps its logs and segments here). It offers reads, prefix listing,
// multi-key compare-and-set transactions, prefix watches, and lease-based locks whose
// ownership a transaction can require.
//
// KV is an optional capability of a [Driver] (see [KVOf]): a driver that cannot offer it does
// not implement [KVDriver]. All methods are safe for concurrent use.
type KV interface {
	// Get returns key's value and version, or ErrNoSuchKey.
	Get(ctx context.Context, key string) (KeyValue, error)
	// List returns up to limit keys that start with prefix and sort after the key after
	// ("" for the first page), in key order, and whether more follow (the next page starts
	// after the last key returned). limit is 1..MaxKVPageSize.
	List(ctx context.Context, prefix, after string, limit int) (kvs []KeyValue, more bool, err error)
	// Commit applies ops atomically: all of them, or none when a key's version is not the
	// one its op expects (a *BadVersionError naming the first such key) or when guard, if not
	// nil, is no longer held (ErrLockLost). It returns the version every written key now
	// has. At most MaxKVOps ops, each on a different key.
	Commit(ctx context.Context, guard Lock, ops ...KVOp) (Version, error)
	// Lock takes the lock called name, bound to a lease of the given TTL (at least a
	// second; rounded up to whole seconds) that is kept alive until Unlock. It waits while
	// another live process holds the lock, until ctx is done. Waiters get the lock in
	// arrival order. If the holder dies, its lease expires after the TTL and the next waiter
	// gets the lock.
	Lock(ctx context.Context, name string, ttl time.Duration) (Lock, error)
	// Watch reports changes of keys under prefix: the channel (capacity one) receives a
	// value after one or more keys changed; a slow reader sees one value for many changes.
	// If the service lost track (the watch broke and was resumed), a value is sent too, so a
	// reader that re-reads on every value misses nothing. The channel is closed when ctx is
	// done or the driver is closed.
	Watch(ctx context.Context, prefix string) (<-chan struct{}, error)
}

// Lock is a held KV lock.
type Lock interface {
	// Name is the lock's name as given to KV.Lock.
	Name() string
	// Lost is closed when the lock may no longer be held: its lease expired or could not be
	// kept alive (a pause or partition longer than the TTL), the driver was closed, or
	// Unlock was called. Once Lost is closed, Commit with this lock as guard fails.
	Lost() <-chan struct{}
	// Unlock releases the lock and revokes its lease. Calling it again returns nil.
	Unlock(ctx context.Context) error
}

// KVDriver is a Driver that offers a KV keyspace.
type KVDriver interface {
	Driver
	// KV returns the driver's keyspace.
	KV() KV
}

// KVOf returns d's KV keyspace, or ErrNotSupported if its driver has none.
func KVOf(d Driver) (KV, error) {
	if k, ok := d.(KVDriver); ok {
		return k.KV(), nil
	}
	return nil, fmt.Errorf("%w: the %T driver has no KV keyspace", ErrNotSupported, d)
}

// KeyValue is one key with its value and version.
type KeyValue struct {
	Key     string
	Value   []byte
	Version Version
}

// KVOp is one write of a KV transaction.
type KVOp struct {
	Key string
	// Value is stored under Key (unless Delete).
	Value []byte
	// Delete removes Key instead.
	Delete bool
	// Expected is the version Key must have: NoVersion (it must not exist), AnyVersion (no
	// check; a delete of a missing key then does nothing), or the version of a read or write.
	Expected Version
}

// Put returns the op that stores value under key if its version is expected.
func Put(key string, value []byte, expected Version) KVOp {
	return KVOp{Key: key, Value: value, Expected: expected}
}

// Delete returns the op that removes key if its version is expected.
func Delete(key string, expected Version) KVOp {
	return KVOp{Key: key, Delete: true, Expected: expected}
}

// Bounds of the KV interface.
const (
	// MaxKVOps bounds the ops of one Commit (etcd's default limit is 128 per transaction).
	MaxKVOps = 64
	// MaxKVPageSize bounds the limit of List.
	MaxKVPageSize = 10_000
	// MaxKVKeyLength bounds a key's or a lock name's length in bytes.
	MaxKVKeyLength = 1024
	// MinLockTTL is the shortest lock lease.
	MinLockTTL = time.Second
)

// KV errors; drivers wrap them with %w.
var (
	// ErrNoSuchKey: Get found no value under the key.
	ErrNoSuchKey = errors.New("metadata: no such key")
	// ErrLockLost: a Commit's guard lock is no longer held (its lease expired or was
	// revoked, or it was unlocked).
	ErrLockLost = errors.New("metadata: lock lost")
	// ErrInvalidKey: an empty, too long or otherwise unusable key, prefix or lock name.
	ErrInvalidKey = errors.New("metadata: invalid key")
	// ErrNotSupported: the driver does not offer the capability.
	ErrNotSupported = errors.New("metadata: not supported by this driver")
)

// ValidateKVKey checks a KV key or lock name: 1..MaxKVKeyLength bytes of printable ASCII.
func ValidateKVKey(key string) error {
	if key == "" || len(key) > MaxKVKeyLength {
		return fmt.Errorf("%w: %d bytes (want 1..%d)", ErrInvalidKey, len(key), MaxKVKeyLength)
	}
	if i := strings.IndexFunc(key, func(r rune) bool { return r < 0x21 || r > 0x7e }); i >= 0 {
		return fmt.Errorf("%w %q: byte %d is not printable ASCII", ErrInvalidKey, key, i)
	}
	return nil
}

// ValidateKVOps checks the ops of a Commit: 1..MaxKVOps ops on valid, distinct keys, with
// valid expected versions.
func ValidateKVOps(ops []KVOp) error {
	if len(ops) == 0 || len(ops) > MaxKVOps {
		return fmt.Errorf("%w: %d ops in one commit (want 1..%d)", ErrInvalidKey, len(ops), MaxKVOps)
	}
	seen := make(map[string]bool, len(ops))
	for _, op := range ops {
		if err := ValidateKVKey(op.Key); err != nil {
			return err
		}
		if seen[op.Key] {
			return fmt.Errorf("%w %q: written twice in one commit", ErrInvalidKey, op.Key)
		}
		seen[op.Key] = true
		if op.Expected < AnyVersion {
			return fmt.Errorf("%w %q: expected version %d", ErrInvalidKey, op.Key, op.Expected)
		}
		if op.Delete && op.Expected == NoVersion {
			return fmt.Errorf("%w %q: delete of a key that must not exist", ErrInvalidKey, op.Key)
		}
	}
	return nil
}
