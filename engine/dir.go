package engine

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/journal"
)

// ledgerDir is one ledger directory: its write cache (two halves), read cache, entry logs and
// index. Ledger L lives in dir L mod n.
type ledgerDir struct {
	e     *Engine
	index int
	path  string // <dir>/current
	// indexPath is where its index lives (<dir>/current/index, or under IndexDir).
	indexPath string
	log       entryLog
	idx       locationIndex
	batch     indexBatch

	halves   [2]*cacheHalf
	active   atomic.Pointer[cacheHalf]
	flushing atomic.Pointer[cacheHalf]
	reads    *readCache

	// flushMu makes every writer of this dir's entry log and every index write one at a time:
	// checkpoint flushes, compaction chunks and committed deletions. scratch, gcBatch and
	// indexSeq's increments are used under it.
	flushMu sync.Mutex
	scratch []sortedEntry
	// gcBatch is the index batch of compaction and of committed deletions.
	gcBatch indexBatch
	// indexSeq counts the index commits that may have changed locations; compaction compares
	// it to tell whether a location it looked up may have changed since.
	indexSeq atomic.Uint64
	// logsMu guards entry-log removal against reads: a read holds it shared from its index
	// look-up to the end of its entry-log read; the garbage collector takes it exclusively
	// (and releases it at once) after the index stops pointing into a log and before removing
	// it, so that no read can use a location in a removed log.
	logsMu sync.RWMutex
	// gc is the garbage collector's state of this dir.
	gc dirGC

	// spaceMu guards space: closed (and replaced) whenever a swap makes room in the cache.
	spaceMu sync.Mutex
	space   chan struct{}

	// dirtyMu guards dirty: ledgers of this dir whose state changed since the last flush.
	dirtyMu sync.Mutex
	dirty   []*ledgerInfo
	// deletes are ledgers deleted since the last flush, fencedDrops the fenced-deleted
	// tombstones to remove from the index, expired or superseded (both guarded by dirtyMu,
	// which may be taken under a ledgerTable shard lock, never the other way round).
	deletes     []ledgerDeletion
	fencedDrops []int64

	stats dirStats
}

// ledgerDeletion is a pending deletion: fenced says the ledger was fenced when deleted, at
// wall-clock time fencedAt (Unix nanoseconds); its tombstone goes into the deletion's batch.
type ledgerDeletion struct {
	id       int64
	fenced   bool
	fencedAt int64
}

// putDeletes writes deletions and tombstone removals into b and returns the deleted ids. A
// ledger that was fenced when deleted gets its tombstone in this same batch, so the deletion
// is never durable without it. Removals go first: one of an id is always queued before any
// later deletion of the id (ledgerTable.expireFencedDeleted), so it never removes a newer
// tombstone.
func putDeletes(b indexBatch, deletes []ledgerDeletion, drops []int64) []int64 {
	for _, id := range drops {
		b.DropFencedDeleted(id)
	}
	ids := make([]int64, 0, len(deletes))
	for _, del := range deletes {
		if del.fenced {
			b.DeleteFencedLedger(del.id, time.Unix(0, del.fencedAt))
		} else {
			b.DeleteLedger(del.id)
		}
		ids = append(ids, del.id)
	}
	return ids
}

type dirStats struct {
	flushes       atomic.Uint64
	flushedBytes  atomic.Uint64
	flushedItems  atomic.Uint64
	flushNanos    atomic.Uint64
	throttledAdds atomic.Uint64
	rejectedAdds  atomic.Uint64
}

func (d *ledgerDir) spaceSignal() chan struct{} {
	d.spaceMu.Lock()
	defer d.spaceMu.Unlock()
	return d.space
}

func (d *ledgerDir) signalSpace() {
	d.spaceMu.Lock()
	close(d.space)
	d.space = make(chan struct{})
	d.spaceMu.Unlock()
}

// put copies an entry into the active half, waiting up to MaxThrottleTime for a checkpoint to
// make room when both halves are full (or until the engine fails: no checkpoint will). With
// journaled set, the half's pendingJournal count is raised before the half can be sealed, and
// the returned slice (the cached copy) stays valid until the caller calls pendingJournal.Done.
func (d *ledgerDir) put(ledger, entry int64, data []byte, journaled, wait bool) (*cacheHalf, []byte, uint32, error) {
	var deadline time.Time
	for {
		h := d.active.Load()
		if mem, crc, ok := h.put(ledger, entry, data, journaled); ok {
			return h, mem, crc, nil
		}
		if err := d.e.Err(); err != nil {
			return nil, nil, 0, err
		}
		space := d.spaceSignal()
		if d.active.Load() != h {
			continue // swapped meanwhile
		}
		d.e.requestCheckpoint()
		if !wait {
			return nil, nil, 0, errWouldBlock
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(d.e.cfg.MaxThrottleTime)
			d.stats.throttledAdds.Add(1)
		}
		if !now.Before(deadline) {
			d.stats.rejectedAdds.Add(1)
			return nil, nil, 0, fmt.Errorf("%w: both write-cache halves of %s are full", ErrTooManyRequests, d.path)
		}
		t := time.NewTimer(deadline.Sub(now))
		select {
		case <-space:
		case <-d.e.failedCh: // returns the failure at the next turn
		case <-t.C:
		case <-d.e.closing:
			t.Stop()
			return nil, nil, 0, ErrClosed
		}
		t.Stop()
	}
}

// get appends the entry to dst: write cache, the half being flushed, read cache, then index and
// entry log (reading ahead along the ledger into the read cache).
func (d *ledgerDir) get(ledger, entry int64, dst []byte) ([]byte, error) {
	if out, ok := d.getCached(ledger, entry, dst); ok {
		return out, nil
	}
	// Before the look-up: a location found later may be of this ledger or, if it is deleted
	// meanwhile, of the deleted one, never of a new ledger of the same id.
	l := d.e.ledgers.get(ledger)
	// Before the look-up too: what it finds is cached only if no flush committed a newer copy
	// meanwhile (readCache.invalidate).
	gen := d.reads.generation()
	d.logsMu.RLock()
	defer d.logsMu.RUnlock()
	loc, found, err := d.idx.Location(ledger, entry)
	if err != nil {
		return dst, fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
	}
	if !found {
		return dst, ErrNoEntry
	}
	if h := d.e.readHook.Load(); h != nil && *h != nil {
		(*h)(ledger, entry, loc)
	}
	if l == nil || l.lastRead.Swap(entry) != entry-1 || d.e.cfg.ReadAheadBatchSize == 0 {
		out, err := d.log.Read(loc, ledger, entry, dst)
		if err != nil {
			return dst, fmt.Errorf("%w: %w", ErrIO, err)
		}
		return out, nil
	}
	out, err := d.readFromLog(gen, ledger, entry, loc, dst)
	if l.deleted.Load() {
		// DeleteLedger dropped the ledger's cached entries, perhaps before this read cached
		// some: drop them again, or a new ledger of the same id would be served them. (It sets
		// deleted before it drops them, so one of the two drops comes after every put.)
		d.reads.removeLedger(ledger)
	}
	return out, err
}

// getCached looks in memory only.
func (d *ledgerDir) getCached(ledger, entry int64, dst []byte) ([]byte, bool) {
	for _, h := range [2]*cacheHalf{d.active.Load(), d.flushing.Load()} {
		if h == nil {
			continue
		}
		h.readers.RLock()
		out, ok := h.get(ledger, entry, dst)
		h.readers.RUnlock()
		if ok {
			return out, true
		}
	}
	return d.reads.get(ledger, entry, dst)
}

// entryLocation is one entry's location in the index.
type entryLocation struct {
	entry int64
	loc   uint64
}

// readAheadBytes bounds one read-ahead.
const readAheadBytes = 1 << 20

// readFromLog reads the entry and the ones after it in the same ledger (they lie together: a
// flush writes each ledger's entries in order) into the read cache. Only records the index
// points at are cached: after a crash between a flush's entry-log sync and its index commit, the
// log holds records of entries that were never acknowledged and that reads must not find.
func (d *ledgerDir) readFromLog(gen uint64, ledger, entry int64, loc uint64, dst []byte) ([]byte, error) {
	found := false
	count := 0
	// No more entries than the read-ahead's bytes can hold: the setting has no upper bound, and
	// room for the index's locations is allocated up front.
	batch := min(d.e.cfg.ReadAheadBatchSize, readAheadBytes/storedEntryHeader)
	var indexed []entryLocation // the index's next locations of the ledger, in entry order
	if batch > 0 {
		indexed = make([]entryLocation, 0, batch)
		if err := d.idx.Entries(ledger, entry+1, func(en int64, l uint64) bool {
			indexed = append(indexed, entryLocation{en, l})
			return len(indexed) < batch
		}); err != nil {
			return dst, fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
		}
	}
	err := d.log.ReadAhead(loc, readAheadBytes, func(l, en int64, data []byte, at uint64) bool {
		if count == 0 {
			if l != ledger || en != entry {
				return false
			}
			dst = append(dst, data...)
			found = true
			if batch > 0 {
				d.reads.put(gen, l, en, data)
			}
			count++
			return true
		}
		if l != ledger {
			return false
		}
		// A ledger's records in one run of a log are in entry order, as indexed is.
		for len(indexed) > 0 && indexed[0].entry < en {
			indexed = indexed[1:]
		}
		if len(indexed) == 0 || indexed[0].entry != en || indexed[0].loc != at {
			return false // not the copy the index points at: stop reading ahead
		}
		d.reads.put(gen, l, en, data)
		count++
		return count <= batch
	})
	if err != nil {
		return dst, fmt.Errorf("%w: %w", ErrIO, err)
	}
	if !found {
		// The index points at a record of another entry: the index or the log is damaged.
		return dst, fmt.Errorf("%w: %s: index location %#x of ledger %d entry %d holds another entry",
			ErrIO, d.path, loc, ledger, entry)
	}
	return dst, nil
}

// lastEntry returns the highest entry id of the ledger in this dir.
func (d *ledgerDir) lastEntry(ledger int64) (int64, bool, error) {
	last, found := int64(-1), false
	for _, h := range [2]*cacheHalf{d.active.Load(), d.flushing.Load()} {
		if h == nil {
			continue
		}
		h.readers.RLock()
		e, ok := h.lastEntry(ledger)
		h.readers.RUnlock()
		if ok && e > last {
			last, found = e, true
		}
	}
	e, ok, err := d.idx.LastEntry(ledger)
	if err != nil {
		return 0, false, fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
	}
	if ok && e > last {
		last, found = e, true
	}
	return last, found, nil
}

func (d *ledgerDir) markDirty(l *ledgerInfo) {
	l.mu.Lock()
	already := l.dirty
	l.dirty = true
	l.mu.Unlock()
	if !already {
		d.dirtyMu.Lock()
		d.dirty = append(d.dirty, l)
		d.dirtyMu.Unlock()
	}
}

// flush swaps the halves and writes the sealed one to the entry log (sorted by ledger and
// entry), fsyncs it, then writes its locations and every changed ledger state to the index as
// one synced batch: steps 2 to 4 of the checkpoint. The ledger state is synced even when no
// entry moved.
func (d *ledgerDir) flush(marks []journal.Mark) (err error) {
	d.flushMu.Lock()
	defer d.flushMu.Unlock()
	if err := d.e.Err(); err != nil {
		return err
	}
	start := time.Now()
	h := d.active.Load()
	other := d.halves[0]
	if other == h {
		other = d.halves[1]
	}
	// Swap: the other half was reset by the previous flush.
	d.flushing.Store(h)
	other.activate()
	d.active.Store(other)
	pace := newFlushPacer(h, other, h.activatedAt, start, d.e.closing)
	other.activatedAt = start
	h.seal()
	d.signalSpace()
	if err := d.e.hook(stepHalvesSwapped); err != nil {
		return err
	}

	var bytes int64
	fromLog := d.log.CurrentLogID()
	d.scratch = h.sorted(d.scratch[:0])
	for _, s := range d.scratch {
		data := h.memory(s.slot.offset, s.slot.length)
		loc, err := d.log.AddChecksummed(s.key.ledger, s.key.entry, data, s.slot.crc)
		if err != nil {
			return d.flushFailed(h, fmt.Errorf("%w: entry log of %s: %w", ErrIO, d.path, err))
		}
		d.batch.PutLocation(s.key.ledger, s.key.entry, loc)
		bytes += int64(len(data))
		pace.wait(bytes, time.Now)
	}
	if err := d.e.hook(stepEntryLogWritten); err != nil {
		return err
	}
	if d.log.CurrentLogID() != fromLog {
		if err := d.e.hook(stepEntryLogRolled); err != nil {
			return err
		}
	}
	if err := d.log.Flush(); err != nil {
		return d.flushFailed(h, fmt.Errorf("%w: entry log of %s: %w", ErrIO, d.path, err))
	}
	if err := d.e.hook(stepEntryLogSynced); err != nil {
		return err
	}
	d.dirtyMu.Lock()
	dirty, deletes, drops := d.dirty, d.deletes, d.fencedDrops
	d.dirty, d.deletes, d.fencedDrops = nil, nil, nil
	d.dirtyMu.Unlock()
	for _, l := range dirty {
		if d.e.ledgers.get(l.id) != l {
			continue // deleted since it changed: writing its state would bring it back
		}
		l.mu.Lock()
		st := ledgerState{Fenced: l.fenced.Load(), MasterKey: l.masterKey, ExplicitLAC: l.explicitLAC}
		l.dirty = false
		l.mu.Unlock()
		d.batch.PutLedger(l.id, st)
	}
	deleted := putDeletes(d.batch, deletes, drops)
	if marks != nil {
		d.batch.PutCheckpoint(encodeCheckpoint(marks))
	}
	if err := d.batch.Commit(true); err != nil {
		return d.flushFailed(h, fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err))
	}
	d.e.ledgers.deleted(deleted, d.e.snapshots.Load())
	d.indexSeq.Add(1)
	if err := d.e.hook(stepIndexSynced); err != nil {
		return err
	}
	// Everything in h is now readable from the index: drop older copies of its entries from the
	// read cache (a recovery add may have written one again) while h still hides them, then stop
	// looking in h and recycle it.
	d.reads.invalidate(d.scratch)
	d.flushing.Store(nil)
	h.reset()
	d.stats.flushes.Add(1)
	d.stats.flushedItems.Add(uint64(len(d.scratch)))
	d.stats.flushedBytes.Add(uint64(bytes))
	d.stats.flushNanos.Add(uint64(time.Since(start)))
	clear(d.scratch)
	return nil
}

// flushFailed makes a flush failure sticky: the sealed half stays readable (it is never reset)
// and the engine stops accepting adds.
func (d *ledgerDir) flushFailed(h *cacheHalf, err error) error {
	d.e.fail(err)
	return err
}

func (d *ledgerDir) close() error {
	return errors.Join(d.log.Close(), d.idx.Close())
}
