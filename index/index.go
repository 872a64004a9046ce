package index

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

var (
	// ErrNotFound: no such location or ledger.
	ErrNotFound = errors.New("index: not found")
	// ErrCorrupt is wrapped by every error about a stored key or value that does not decode,
	// and by pebble's own corruption errors.
	ErrCorrupt = errors.New("index: corrupt")
	// ErrClosed: the index was closed.
	ErrClosed = errors.New("index: closed")
	// ErrBadID: a ledger or entry id is negative.
	ErrBadID = errors.New("index: negative ledger or entry id")
	// ErrTooLarge: a master key or explicit LAC is longer than the encoding allows.
	ErrTooLarge = errors.New("index: value too large")
	// ErrVersion: the store was written by a newer format version.
	ErrVersion = errors.New("index: unsupported format version")
	// ErrFailed: a commit's write to pebble's WAL failed (a full disk, an I/O error), which
	// pebble cannot continue from: that commit and every later one fail; reads go on.
	ErrFailed = errors.New("index: failed")
)

// Index is the entry-location and ledger-state index of one ledger directory, stored in one
// pebble database. All methods are safe for concurrent use; a Batch is not.
type Index struct {
	db  *pebble.DB
	cfg Config
	// users counts the calls in progress; closed makes new calls fail with ErrClosed. Close
	// sets closed, then waits for users to drain before closing pebble, so that no call ever
	// reaches a closed pebble (which panics).
	users  atomic.Int64
	closed atomic.Bool
	// commitMu makes commits one at a time: a commit reads the runs it merges with.
	commitMu sync.Mutex
	// failed is the error of the commit whose WAL write failed (see ErrFailed), under commitMu.
	failed error
	// upgraded: Open converted an older format, which kept no checkpoint record, and no
	// checkpoint record was committed since (a commit that holds one clears it).
	upgraded atomic.Bool
}

// Open opens (creating it if needed) the index in cfg.Dir.
func Open(cfg Config) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cache := pebble.NewCache(cfg.BlockCacheSize)
	defer cache.Unref()
	fs := cfg.FS
	if fs == vfs.Default {
		fs = ringFS{fs}
	}
	opts := &pebble.Options{
		FS:                 fs,
		Cache:              cache,
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{cfg.Logger},
		MemTableSize:       cfg.MemTableSize,
		// BookKeeper: L1 256 MiB (RocksDB max_bytes_for_level_base).
		LBaseMaxBytes: 256 << 20,
	}
	for i := range opts.Levels {
		l := &opts.Levels[i]
		l.BlockSize = cfg.BlockSize
		if cfg.BloomBitsPerKey > 0 {
			l.FilterPolicy = bloom.FilterPolicy(cfg.BloomBitsPerKey)
		}
	}
	// Values are 8-byte locations and keys are prefix-compressed already: block compression
	// saves little and costs a decode on every cold lookup.
	opts.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionNone })
	db, err := pebble.Open(cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("index: open %s: %w", cfg.Dir, wrapPebble(err))
	}
	ix := &Index{db: db, cfg: cfg}
	if err := ix.checkFormat(); err != nil {
		db.Close()
		return nil, fmt.Errorf("index: open %s: %w", cfg.Dir, err)
	}
	return ix, nil
}

// checkFormat verifies the format record, writing it (synced) into a new, empty store.
func (ix *Index) checkFormat() error {
	v, closer, err := ix.db.Get(formatKey)
	if errors.Is(err, pebble.ErrNotFound) {
		it, err := ix.db.NewIter(nil)
		if err != nil {
			return wrapPebble(err)
		}
		nonEmpty := it.First()
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			return wrapPebble(err)
		}
		if nonEmpty {
			return fmt.Errorf("%w: the store holds keys but no format record", ErrCorrupt)
		}
		return ix.writeFormat()
	}
	if err != nil {
		return wrapPebble(err)
	}
	ok := len(v) == formatLen && bytes.Equal(v[:len(formatMagic)], []byte(formatMagic))
	var ver uint32
	if ok {
		ver = binary.BigEndian.Uint32(v[len(formatMagic):])
	} else {
		err = fmt.Errorf("%w: bad format record %x", ErrCorrupt, v)
	}
	closer.Close()
	switch {
	case !ok:
		return err
	case ver == formatVersion:
		if _, err := ix.Checkpoint(); err != nil {
			return err
		}
		// An upgrade whose first checkpoint record was never committed (the process stopped
		// first) is still an upgrade.
		_, closer, err := ix.db.Get(upgradedKey)
		if err == nil {
			closer.Close()
			ix.upgraded.Store(true)
			return nil
		}
		if errors.Is(err, pebble.ErrNotFound) {
			return nil
		}
		return wrapPebble(err)
	case ver == formatVersionRuns:
		ix.upgraded.Store(true)
		pb := ix.db.NewBatch()
		defer pb.Close()
		setFormat(pb, true)
		return wrapPebble(pb.Commit(pebble.Sync))
	case ver == formatVersionLocations:
		ix.upgraded.Store(true)
		return ix.convertLocations()
	default:
		return fmt.Errorf("%w: store has version %d, this build reads %d", ErrVersion, ver, formatVersion)
	}
}

// writeFormat writes (synced) this build's format record and an empty checkpoint record into
// a new store.
func (ix *Index) writeFormat() error {
	pb := ix.db.NewBatch()
	defer pb.Close()
	setFormat(pb, false)
	return wrapPebble(pb.Commit(pebble.Sync))
}

// setFormat sets this build's format record and an empty checkpoint record; upgraded (a store
// of an older format, which kept no checkpoint record) also sets upgradedKey, which stays
// until the first PutCheckpoint is committed, so that Upgraded survives a stop in between.
func setFormat(pb *pebble.Batch, upgraded bool) {
	_ = pb.Set(formatKey, binary.BigEndian.AppendUint32([]byte(formatMagic), formatVersion), nil)
	_ = pb.Set(checkpointKey, nil, nil)
	if upgraded {
		_ = pb.Set(upgradedKey, nil, nil)
	}
}

// Checkpoint returns the checkpoint record: empty until a Batch.PutCheckpoint was committed.
// A store without one lost writes (damage in pebble's write-ahead log or manifest, which
// pebble takes for a torn tail and drops): that is ErrCorrupt.
func (ix *Index) Checkpoint() ([]byte, error) {
	if !ix.enter() {
		return nil, ErrClosed
	}
	defer ix.exit()
	v, closer, err := ix.db.Get(checkpointKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: no checkpoint record: writes to the store were lost", ErrCorrupt)
	}
	if err != nil {
		return nil, wrapPebble(err)
	}
	defer closer.Close()
	if len(v) > MaxCheckpointLen {
		return nil, fmt.Errorf("%w: checkpoint record of %d bytes", ErrCorrupt, len(v))
	}
	return bytes.Clone(v), nil
}

// Flush writes pebble's memtable to a synced table and returns once that is recorded. Until
// then committed batches live only in pebble's WAL, whose damaged end pebble drops silently
// as a torn write: a caller that is about to destroy what a batch made obsolete (an entry log
// whose entries the batch moved) flushes first.
func (ix *Index) Flush() error {
	if !ix.enter() {
		return ErrClosed
	}
	defer ix.exit()
	return wrapPebble(ix.db.Flush())
}

// Upgraded reports whether the store was converted from an older format, which kept no
// checkpoint record, and no checkpoint record was committed since: its empty record then says
// nothing about what it once held.
func (ix *Index) Upgraded() bool { return ix.upgraded.Load() }

// convertLocationsBatch is how many format-1 locations one unsynced conversion batch holds.
const convertLocationsBatch = 1 << 20

// convertLocations converts a format-1 store (one key per location) to runs: it writes the
// runs in unsynced batches, then, in one synced batch, deletes the old keys and writes the
// new format record. A crash before that batch leaves a format-1 store whose conversion runs
// again (rewriting the same runs); after it, a format-2 store.
func (ix *Index) convertLocations() error {
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLocation}, UpperBound: []byte{prefixLocation + 1}})
	if err != nil {
		return wrapPebble(err)
	}
	b := ix.NewBatch()
	defer b.Close()
	n := 0
	for ok := it.First(); ok && err == nil; ok = it.Next() {
		var l, e int64
		var v []byte
		var loc uint64
		if l, e, err = decodeIDKey(it.Key(), prefixLocation); err != nil {
			break
		}
		if v, err = it.ValueAndErr(); err != nil {
			break
		}
		if loc, err = decodeLocation(v, l, e); err != nil {
			break
		}
		b.PutLocation(l, e, loc)
		if n++; n%convertLocationsBatch == 0 {
			err = b.Commit(false)
		}
	}
	if err = errors.Join(err, wrapPebble(it.Error()), it.Close()); err != nil {
		return fmt.Errorf("converting format %d: %w", formatVersionLocations, err)
	}
	_ = b.pb.DeleteRange([]byte{prefixLocation}, []byte{prefixLocation + 1}, nil)
	setFormat(b.pb, true)
	if err := b.Commit(true); err != nil {
		return fmt.Errorf("converting format %d: %w", formatVersionLocations, err)
	}
	ix.cfg.Logger.Info("index: converted to one key per run of locations", "dir", ix.cfg.Dir,
		"locations", n, "format", formatVersion)
	return nil
}

// Close closes the index. It waits for the calls in progress (so it must not be called from
// a callback of Ledgers or Entries); later calls fail with ErrClosed. Unsynced batches may be
// lost only on a crash: Close itself flushes nothing away.
func (ix *Index) Close() error {
	if ix.closed.Swap(true) {
		return ErrClosed
	}
	for ix.users.Load() != 0 {
		time.Sleep(50 * time.Microsecond)
	}
	ix.commitMu.Lock()
	failed := ix.failed
	ix.commitMu.Unlock()
	if failed != nil {
		// pebble's commit pipeline is broken ("horked") after a failed WAL write, and its
		// Close may wait on it: the database is left to the process's exit.
		return fmt.Errorf("index: close %s: not closed after %w", ix.cfg.Dir, failed)
	}
	if err := ix.db.Close(); err != nil {
		return fmt.Errorf("index: close %s: %w", ix.cfg.Dir, wrapPebble(err))
	}
	return nil
}

// enter registers a call; it returns false once Close has begun. Every true must be paired
// with exit.
func (ix *Index) enter() bool {
	ix.users.Add(1)
	if ix.closed.Load() {
		ix.users.Add(-1)
		return false
	}
	return true
}

func (ix *Index) exit() { ix.users.Add(-1) }

// scratch holds the buffers of one look-up; pooled so that a look-up does not allocate them
// (an iterator keeps its bounds, so they cannot live on the stack).
type scratch struct {
	bounds [2 * runKeyLen]byte
	pairs  []pair
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Location returns the location of (ledgerID, entryID), or an error wrapping ErrNotFound. It
// decodes the one run that can hold the entry: the first of the ledger's runs that ends at or
// after it.
func (ix *Index) Location(ledgerID, entryID int64) (uint64, error) {
	if ledgerID < 0 || entryID < 0 {
		return 0, fmt.Errorf("%w: ledger %d entry %d", ErrBadID, ledgerID, entryID)
	}
	var loc uint64
	found := false
	err := ix.runs(ledgerID, entryID, false, func(last int64, v []byte, _ *[]pair) (more bool, err error) {
		loc, found, err = findInRun(v, ledgerID, last, entryID)
		return false, err
	})
	if err != nil {
		return 0, fmt.Errorf("index: location of ledger %d entry %d: %w", ledgerID, entryID, err)
	}
	if !found {
		return 0, ErrNotFound
	}
	return loc, nil
}

// LastEntry returns the highest entry id of ledgerID that has a location, and that location;
// ErrNotFound if the ledger has none. The look-up is bounded to the ledger's own key range,
// so range tombstones of other (deleted) ledgers are never scanned.
func (ix *Index) LastEntry(ledgerID int64) (entryID int64, loc uint64, err error) {
	if ledgerID < 0 {
		return 0, 0, fmt.Errorf("%w: ledger %d", ErrBadID, ledgerID)
	}
	found := false
	err = ix.runs(ledgerID, 0, true, func(last int64, v []byte, _ *[]pair) (more bool, err error) {
		loc, found, err = findInRun(v, ledgerID, last, last)
		entryID = last
		return false, err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("index: last entry of ledger %d: %w", ledgerID, err)
	}
	if !found {
		return 0, 0, ErrNotFound
	}
	return entryID, loc, nil
}

// Entries calls fn for the locations of ledgerID with entry id ≥ fromEntry, in entry order,
// until fn returns false. fn must not call Close.
func (ix *Index) Entries(ledgerID, fromEntry int64, fn func(entryID int64, loc uint64) bool) error {
	if ledgerID < 0 || fromEntry < 0 {
		return fmt.Errorf("%w: ledger %d from entry %d", ErrBadID, ledgerID, fromEntry)
	}
	err := ix.runs(ledgerID, fromEntry, false, func(last int64, v []byte, ps *[]pair) (more bool, err error) {
		if *ps, err = decodeRun((*ps)[:0], v, ledgerID, last); err != nil {
			return false, err
		}
		for _, p := range *ps {
			if p.entry >= fromEntry && !fn(p.entry, p.loc) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("index: entries of ledger %d: %w", ledgerID, err)
	}
	return nil
}

// runs calls fn with the key's last entry and the value of each of ledgerID's runs that end
// at fromEntry or later, in entry order (or only with its last run, if onlyLast), until fn
// returns false or an error; ps is scratch for fn's decoding. The iterator is bounded to the
// ledger's key range: range tombstones of other (deleted) ledgers lie outside it and are
// never scanned (BookKeeper #2686, #4529).
func (ix *Index) runs(ledgerID, fromEntry int64, onlyLast bool, fn func(last int64, v []byte, ps *[]pair) (bool, error)) error {
	if !ix.enter() {
		return ErrClosed
	}
	defer ix.exit()
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	lower, upper := putLedgerBounds(s.bounds[:], ledgerID, fromEntry)
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return wrapPebble(err)
	}
	ok := it.First()
	if onlyLast {
		ok = it.Last()
	}
	for ; ok; ok = it.Next() {
		var l, runLast int64
		var v []byte
		if l, runLast, err = decodeIDKey(it.Key(), prefixRun); err != nil {
			break
		}
		if l != ledgerID {
			err = fmt.Errorf("%w: key %x outside the bounds of ledger %d", ErrCorrupt, it.Key(), ledgerID)
			break
		}
		if v, err = it.ValueAndErr(); err != nil {
			err = wrapPebble(err)
			break
		}
		if more, ferr := fn(runLast, v, &s.pairs); ferr != nil || !more {
			err = ferr
			break
		}
	}
	return errors.Join(err, wrapPebble(it.Error()), it.Close())
}

// Ledger returns the state of ledgerID, or an error wrapping ErrNotFound. The returned
// slices are the caller's.
func (ix *Index) Ledger(ledgerID int64) (LedgerState, error) {
	if ledgerID < 0 {
		return LedgerState{}, fmt.Errorf("%w: ledger %d", ErrBadID, ledgerID)
	}
	if !ix.enter() {
		return LedgerState{}, ErrClosed
	}
	defer ix.exit()
	var k [ledgerKeyLen]byte
	putLedgerKey(k[:], ledgerID)
	v, closer, err := ix.db.Get(k[:])
	if errors.Is(err, pebble.ErrNotFound) {
		return LedgerState{}, ErrNotFound
	}
	if err != nil {
		return LedgerState{}, fmt.Errorf("index: ledger %d: %w", ledgerID, wrapPebble(err))
	}
	st, err := decodeLedgerState(v)
	closer.Close()
	if err != nil {
		return LedgerState{}, fmt.Errorf("index: ledger %d: %w", ledgerID, err)
	}
	return st, nil
}

// Ledgers calls fn for every ledger with a stored state, in id order, until fn returns false.
// A value that does not decode stops the iteration with an error wrapping ErrCorrupt. fn
// must not call Close.
func (ix *Index) Ledgers(fn func(ledgerID int64, st LedgerState) bool) error {
	return ix.scanByLedger(prefixLedger, "ledger", func(id int64, v []byte) (bool, error) {
		st, err := decodeLedgerState(v)
		if err != nil {
			return false, fmt.Errorf("index: ledger %d: %w", id, err)
		}
		return fn(id, st), nil
	})
}

// FencedDeleted calls fn for every fenced-deleted tombstone (Batch.DeleteFencedLedger), in id
// order, with the wall-clock time of the deletion, until fn returns false. A key or value
// that does not decode stops the iteration with an error wrapping ErrCorrupt. fn must not
// call Close.
func (ix *Index) FencedDeleted(fn func(ledgerID int64, deletedAt time.Time) bool) error {
	return ix.scanByLedger(prefixFencedDeleted, "fenced-deleted ledger", func(id int64, v []byte) (bool, error) {
		at, err := decodeFencedDeleted(v)
		if err != nil {
			return false, fmt.Errorf("index: fenced-deleted ledger %d: %w", id, err)
		}
		return fn(id, at), nil
	})
}

// scanByLedger calls fn with the id and value of every key of the keyspace at prefix (keys
// prefix ‖ BE(ledgerId)), in id order, until fn returns false or an error. A key that does not
// decode is an error wrapping ErrCorrupt; what names the keyspace's entries in errors.
func (ix *Index) scanByLedger(prefix byte, what string, fn func(id int64, v []byte) (bool, error)) error {
	if !ix.enter() {
		return ErrClosed
	}
	defer ix.exit()
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
	if err != nil {
		return fmt.Errorf("index: %ss: %w", what, wrapPebble(err))
	}
	for ok, more := it.First(), true; ok && more && err == nil; ok = it.Next() {
		var id int64
		var v []byte
		if id, err = decodeLedgerIDKey(it.Key(), prefix, what); err != nil {
			break
		}
		if v, err = it.ValueAndErr(); err != nil {
			err = wrapPebble(err)
			break
		}
		more, err = fn(id, v)
	}
	if ierr := errors.Join(it.Error(), it.Close()); ierr != nil && err == nil {
		err = fmt.Errorf("index: %ss: %w", what, wrapPebble(ierr))
	}
	return err
}

// wrapPebble marks pebble's corruption errors with ErrCorrupt, keeping the original.
func wrapPebble(err error) error {
	if err != nil && pebble.IsCorruptionError(err) && !errors.Is(err, ErrCorrupt) {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return err
}

// Warm reads the whole store once, so that its blocks are in the block cache, if its sstables
// take at most half the cache (a larger index would only evict itself; its hot part warms on
// demand). It returns the bytes of sstables read, 0 if it did not warm. A reopened index is
// cold: without this, the first look-up of each block is a disk read ahead of the entry's own
// read, which halves cold random reads (BENCHMARKS.md). It stops early when ctx is done.
func (ix *Index) Warm(ctx context.Context) (int64, error) {
	if !ix.enter() {
		return 0, ErrClosed
	}
	defer ix.exit()
	size := ix.db.Metrics().Total().TablesSize
	if size == 0 || size > ix.cfg.BlockCacheSize/2 {
		return 0, nil
	}
	it, err := ix.db.NewIterWithContext(ctx, &pebble.IterOptions{})
	if err != nil {
		return 0, wrapPebble(err)
	}
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		if n++; n%4096 == 0 && ctx.Err() != nil {
			break
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, fmt.Errorf("index: warm %s: %w", ix.cfg.Dir, wrapPebble(err))
	}
	return size, ctx.Err()
}
