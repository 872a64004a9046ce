package engine

import (
	"crypto/subtle"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ledgerInfo is the in-memory state of one ledger: the source of truth while the bookie runs,
// persisted to the index at each checkpoint and rebuilt from index + journal at start.
type ledgerInfo struct {
	id int64
	// masterKey is immutable once the ledger exists.
	masterKey []byte
	fenced    atomic.Bool
	// lastRead is the last entry read from disk: the next read of lastRead+1 is sequential and
	// reads ahead; any other read fetches only the blocks of its entry.
	lastRead atomic.Int64
	// keyReady is closed once the ledger-key record is queued in the journal, so that no data
	// record of the ledger can precede it there.
	keyReady chan struct{}
	// addMu orders adds against fencing and deletion: held from an add's fenced check until
	// its record is queued in the journal, by Fence while it sets fenced, and by DeleteLedger
	// while it removes the ledger and its cached entries. Never taken by journal callbacks, so
	// holding it while Append waits for queue room cannot deadlock.
	addMu sync.Mutex
	// deleted is set (under addMu) once DeleteLedger has taken the ledger out of the table: an
	// add or a read that found it before must not put an entry in a cache after DeleteLedger
	// dropped the cached ones (garbage collection may commit the deletion first, and the next
	// checkpoint would then write a location of the deleted ledger to the index).
	deleted atomic.Bool

	// mu guards the fields below.
	mu          sync.Mutex
	explicitLAC []byte
	// dirty says the state changed since the last checkpoint.
	dirty bool
	// fenceDurable is set once a fence record is durable (or the fence was replayed/loaded).
	fenceDurable bool
	// fenceWaiters are callbacks of fence requests waiting for the fence record.
	fenceWaiters []func(error)
}

// checkKey compares key with the ledger's master key in constant time.
func (l *ledgerInfo) checkKey(key []byte) bool {
	return subtle.ConstantTimeCompare(l.masterKey, key) == 1
}

const ledgerShards = 64

// ledgerTable maps ledger ids to their state, sharded to keep lookups on the add path cheap.
type ledgerTable struct {
	// now is the wall clock, in Unix nanoseconds (Config.WallClock).
	now    func() int64
	shards [ledgerShards]struct {
		// mu guards m, deleting and fencedDeleted.
		mu sync.RWMutex
		m  map[int64]*ledgerInfo
		// deleting holds deleted ledgers whose ids are not free yet, with 0 until the index has
		// committed the deletion (the commit drops every location of the id: a new ledger made
		// before it would lose its entries), then 1 + the number of mark snapshots taken before
		// the commit: until a snapshot taken after it is persisted, a crash replays the deleted
		// ledger's journal records, which would merge into a new ledger under the same id.
		deleting map[int64]uint64
		// fencedDeleted holds ledgers that were fenced when deleted, with the wall-clock time of
		// the deletion (Unix nanoseconds): for fencedDeletedRetention every write that would
		// create them again is refused as fenced (BookKeeper #4462). Each also has a tombstone
		// in its dir's index, written with the deletion and loaded back at Open.
		fencedDeleted map[int64]int64
		_             [16]byte
	}
}

// fencedDeletedRetention is how long a fenced ledger stays unwritable after its deletion
// (BookKeeper's 7 days). Its old writer, idle meanwhile, would otherwise create the ledger
// anew with its next add and be acknowledged for an entry nothing can read.
//
// BookKeeper keeps this in memory only, so a restarted bookie forgets it and acknowledges
// that add. Here the deletion leaves a tombstone in the index of the ledger's dir
// (index.Batch.DeleteFencedLedger), in the very batch that commits the deletion (a checkpoint's
// or garbage collection's), so no crash leaves the deletion durable without it. It is dated
// by the wall clock (Config.WallClock), since the monotonic clock restarts with the process:
// a clock set back keeps tombstones longer, one set forward drops them sooner. Open loads the
// unexpired ones (and journal replay skips the records of those ledgers, which the index no
// longer holds); expired ones leave memory and the index at the next garbage collection run,
// or at Open.
//
// Bound: one tombstone per ledger deleted while fenced in the last 7 days (a ledger is deleted
// once, so never more than the ledgers this bookie held in that time). Each is a 9-byte key
// and a 9-byte value in pebble, about 30 bytes with pebble's per-key overhead (and, once it
// expires, a point deletion of about the same size until compaction drops both), plus one
// int64→int64 map entry in memory, 20 to 40 bytes with the map's overhead. A bookie whose
// ledgers are fenced and deleted at a sustained 1 a second thus holds at most 604,800 of them,
// about 18 MiB of index and 12 to 24 MiB of heap; at 100 a second, 100 times that. Pulsar
// deletes a ledger once it is trimmed, so the rate is that of ledger roll-overs that end in a
// recovery, not of entries.
const fencedDeletedRetention = 7 * 24 * time.Hour

// fencedDeletedExpired says a fenced deletion at wall-clock time at (Unix nanoseconds) is past
// fencedDeletedRetention at now.
func fencedDeletedExpired(now, at int64) bool { return now-at >= int64(fencedDeletedRetention) }

// newLedgerTable returns an empty table; now is the wall clock in Unix nanoseconds.
func newLedgerTable(now func() int64) *ledgerTable {
	t := &ledgerTable{now: now}
	for i := range t.shards {
		t.shards[i].m = make(map[int64]*ledgerInfo)
	}
	return t
}

func (t *ledgerTable) shard(id int64) int { return int(uint64(id) % ledgerShards) }

func (t *ledgerTable) get(id int64) *ledgerInfo {
	s := &t.shards[t.shard(id)]
	s.mu.RLock()
	l := s.m[id]
	s.mu.RUnlock()
	return l
}

// getOrCreate returns the ledger, creating it with key if it does not exist. created says the
// caller must journal the ledger key and then close keyReady. A deleted ledger is not created
// again until a checkpoint covers its committed deletion (ErrTooManyRequests: retry later), nor
// one that was fenced when deleted, for fencedDeletedRetention (ErrFenced).
func (t *ledgerTable) getOrCreate(id int64, key []byte) (l *ledgerInfo, created bool, err error) {
	if l := t.get(id); l != nil {
		return l, false, nil
	}
	s := &t.shards[t.shard(id)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.m[id]; l != nil {
		return l, false, nil
	}
	if at, ok := s.fencedDeleted[id]; ok && !fencedDeletedExpired(t.now(), at) {
		return nil, false, fmt.Errorf("%w: ledger %d was fenced, then deleted", ErrFenced, id)
	}
	if _, ok := s.deleting[id]; ok {
		return nil, false, fmt.Errorf("%w: ledger %d was deleted; its id is free again once a checkpoint covers the deletion",
			ErrTooManyRequests, id)
	}
	l = &ledgerInfo{id: id, masterKey: append([]byte(nil), key...), keyReady: make(chan struct{})}
	s.m[id] = l
	return l, true, nil
}

// load inserts a ledger known from the index or replay, with its key already durable (at Open,
// before any deletion). It returns nil for a ledger deleted while fenced (loadFencedDeleted):
// replay skips its records, which predate the deletion that the index committed.
func (t *ledgerTable) load(id int64, key []byte) *ledgerInfo {
	l, created, err := t.getOrCreate(id, key)
	if err != nil {
		return nil
	}
	if created {
		close(l.keyReady)
	}
	return l
}

// loadFencedDeleted records, at Open, a ledger that was fenced when it was deleted at
// wall-clock time at (from its tombstone in the index).
func (t *ledgerTable) loadFencedDeleted(id, at int64) {
	s := &t.shards[t.shard(id)]
	s.mu.Lock()
	if s.fencedDeleted == nil {
		s.fencedDeleted = make(map[int64]int64)
	}
	s.fencedDeleted[id] = at
	s.mu.Unlock()
}

// removeForDelete takes the ledger out of the table and holds its id until deleted is called
// for it; it returns the ledger, nil if there is no such ledger. A ledger fenced at this point
// is remembered as fenced-deleted, from wall-clock time fencedAt: the caller writes its
// tombstone with the deletion.
func (t *ledgerTable) removeForDelete(id int64) (l *ledgerInfo, fenced bool, fencedAt int64) {
	s := &t.shards[t.shard(id)]
	s.mu.Lock()
	defer s.mu.Unlock()
	l = s.m[id]
	if l == nil {
		return nil, false, 0
	}
	if fenced = l.fenced.Load(); fenced {
		if s.fencedDeleted == nil {
			s.fencedDeleted = make(map[int64]int64)
		}
		fencedAt = t.now()
		s.fencedDeleted[id] = fencedAt
	}
	delete(s.m, id)
	if s.deleting == nil {
		s.deleting = make(map[int64]uint64)
	}
	s.deleting[id] = 0
	return l, fenced, fencedAt
}

// deleted records that the index has committed the deletion of ids, when snapshots mark
// snapshots had been taken.
func (t *ledgerTable) deleted(ids []int64, snapshots uint64) {
	for _, id := range ids {
		s := &t.shards[t.shard(id)]
		s.mu.Lock()
		if _, ok := s.deleting[id]; ok {
			s.deleting[id] = 1 + snapshots
		}
		s.mu.Unlock()
	}
}

// freeDeleted frees the ids whose committed deletion precedes mark snapshot number snapshot,
// now persisted.
func (t *ledgerTable) freeDeleted(snapshot uint64) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for id, at := range s.deleting {
			if at != 0 && at-1 < snapshot {
				delete(s.deleting, id)
			}
		}
		s.mu.Unlock()
	}
}

// expireFencedDeleted forgets the fenced deletions past fencedDeletedRetention at wall-clock
// time now and calls drop with each id, under its shard's lock, so that the removal of its
// tombstone is queued before any later deletion of the id can queue a new one (that deletion's
// removeForDelete takes the same lock). It returns how many it forgot. Shards are read under
// the read lock first: adds, which take it too, wait only when something expired.
func (t *ledgerTable) expireFencedDeleted(now int64, drop func(id int64)) int {
	n := 0
	var expired []int64
	for i := range t.shards {
		s := &t.shards[i]
		expired = expired[:0]
		s.mu.RLock()
		for id, at := range s.fencedDeleted {
			if fencedDeletedExpired(now, at) {
				expired = append(expired, id)
			}
		}
		s.mu.RUnlock()
		if len(expired) == 0 {
			continue
		}
		s.mu.Lock()
		for _, id := range expired {
			if at, ok := s.fencedDeleted[id]; ok && fencedDeletedExpired(now, at) {
				delete(s.fencedDeleted, id)
				drop(id)
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

// each calls fn for every ledger (in no order) until it returns false.
func (t *ledgerTable) each(fn func(*ledgerInfo) bool) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		ls := make([]*ledgerInfo, 0, len(s.m))
		for _, l := range s.m {
			ls = append(ls, l)
		}
		s.mu.RUnlock()
		for _, l := range ls {
			if !fn(l) {
				return
			}
		}
	}
}

func (t *ledgerTable) count() int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}
