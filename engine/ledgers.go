package engine

import (
	"crypto/subtle"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
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
	// addMu orders adds against fencing: held from an add's fenced check until its record is
	// queued in the journal, and by Fence while it sets fenced. Never taken by journal
	// callbacks, so holding it while Append waits for queue room cannot deadlock.
	addMu sync.Mutex

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
	shards [ledgerShards]struct {
		// mu guards m and deleting.
		mu sync.RWMutex
		m  map[int64]*ledgerInfo
		// deleting holds deleted ledgers whose ids are not free yet, with 0 until the index has
		// committed the deletion (the commit drops every location of the id: a new ledger made
		// before it would lose its entries), then 1 + the number of mark snapshots taken before
		// the commit: until a snapshot taken after it is persisted, a crash replays the deleted
		// ledger's journal records, which would merge into a new ledger under the same id.
		deleting map[int64]uint64
		// fencedDeleted holds ledgers that were fenced when deleted, with when (monotime): for
		// fencedDeletedRetention every write to them is refused as fenced (BookKeeper #4462).
		fencedDeleted map[int64]int64
		_             [16]byte
	}
}

// fencedDeletedRetention is how long a fenced ledger stays unwritable after its deletion
// (BookKeeper's 7 days). Its old writer, idle meanwhile, would otherwise create the ledger
// anew with its next add and be acknowledged for an entry nothing can read. In memory only,
// as in BookKeeper: a restart forgets it.
const fencedDeletedRetention = 7 * 24 * time.Hour

func newLedgerTable() *ledgerTable {
	t := &ledgerTable{}
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
	if at, ok := s.fencedDeleted[id]; ok && monotime.Now()-at < int64(fencedDeletedRetention) {
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
// before any deletion).
func (t *ledgerTable) load(id int64, key []byte) *ledgerInfo {
	l, created, _ := t.getOrCreate(id, key)
	if created {
		close(l.keyReady)
	}
	return l
}

// removeForDelete takes the ledger out of the table and holds its id until deleted is called
// for it. It returns false if there is no such ledger.
func (t *ledgerTable) removeForDelete(id int64) bool {
	s := &t.shards[t.shard(id)]
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.m[id]
	if l == nil {
		return false
	}
	if l.fenced.Load() {
		if s.fencedDeleted == nil {
			s.fencedDeleted = make(map[int64]int64)
		}
		s.fencedDeleted[id] = monotime.Now()
	}
	delete(s.m, id)
	if s.deleting == nil {
		s.deleting = make(map[int64]uint64)
	}
	s.deleting[id] = 0
	return true
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
// now persisted, and forgets fenced deletions older than fencedDeletedRetention.
func (t *ledgerTable) freeDeleted(snapshot uint64) {
	now := monotime.Now()
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for id, at := range s.deleting {
			if at != 0 && at-1 < snapshot {
				delete(s.deleting, id)
			}
		}
		for id, at := range s.fencedDeleted {
			if now-at >= int64(fencedDeletedRetention) {
				delete(s.fencedDeleted, id)
			}
		}
		s.mu.Unlock()
	}
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
