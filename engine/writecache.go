package engine

import (
	"cmp"
	"encoding/binary"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// writeCacheShards is the number of index shards of a write-cache half: adds on different
// shards never contend on a lock.
const writeCacheShards = 64

// cacheAlign is the allocation granularity: entries start on 64-byte boundaries (one cache
// line), so concurrent copies never share a line.
const cacheAlign = 64

// entryKey identifies an entry.
type entryKey struct{ ledger, entry int64 }

// cacheSlot locates an entry inside a half's memory.
type cacheSlot struct {
	offset int64
	length int32
}

type cacheShard struct {
	// mu guards entries and last.
	mu      sync.Mutex
	entries map[entryKey]cacheSlot
	// last is the highest entry id per ledger (ledgers sharded by ledger id alone).
	last map[int64]int64
	_    [40]byte // keep shards on separate cache lines
}

// cacheHalf is one half of the write cache: preallocated segments with lock-free bump
// allocation (an atomic offset) and a sharded index.
//
// Adds never take a half-wide lock: an add registers in writers, checks sealed, allocates with a
// CAS on offset, copies, and inserts under its shard's lock. Sealing sets sealed and then waits
// for writers to drain, so after seal returns no add can still touch the half (both sides use
// sequentially consistent atomics: an add either sees sealed and retries elsewhere, or the
// sealer sees the add in writers and waits for it).
type cacheHalf struct {
	segments [][]byte
	segSize  int64
	capacity int64
	offset   atomic.Int64
	writers  atomic.Int64
	sealed   atomic.Bool
	count    atomic.Int64
	bytes    atomic.Int64
	// pendingJournal counts adds whose journal record has not completed: the journal copies the
	// payload from this half's memory, so the half is not reset while any is pending.
	pendingJournal sync.WaitGroup
	shards         [writeCacheShards]cacheShard
	// readers guards the memory against reset while a read copies from it: reads hold RLock,
	// reset holds Lock. Adds do not use it.
	readers sync.RWMutex
}

func newCacheHalf(size, segSize int64) *cacheHalf {
	if segSize > size {
		segSize = size
	}
	n := (size + segSize - 1) / segSize
	h := &cacheHalf{segSize: segSize, capacity: n * segSize}
	h.segments = make([][]byte, n)
	for i := range h.segments {
		h.segments[i] = make([]byte, segSize)
	}
	for i := range h.shards {
		h.shards[i].entries = make(map[entryKey]cacheSlot)
		h.shards[i].last = make(map[int64]int64)
	}
	return h
}

func shardOf(ledger, entry int64) int {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], uint64(ledger))
	binary.LittleEndian.PutUint64(b[8:], uint64(entry))
	return int(xxhash.Sum64(b[:]) % writeCacheShards)
}

func ledgerShardOf(ledger int64) int {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(ledger))
	return int(xxhash.Sum64(b[:]) % writeCacheShards)
}

// allocate reserves n bytes that do not cross a segment boundary. It returns false when the
// half is full.
func (h *cacheHalf) allocate(n int64) (int64, bool) {
	size := (n + cacheAlign - 1) &^ (cacheAlign - 1)
	for {
		old := h.offset.Load()
		start := old
		if start/h.segSize != (start+size-1)/h.segSize {
			start = (start/h.segSize + 1) * h.segSize // skip the tail of this segment
		}
		if start+size > h.capacity || size > h.segSize {
			return 0, false
		}
		if h.offset.CompareAndSwap(old, start+size) {
			return start, true
		}
	}
}

func (h *cacheHalf) memory(offset int64, length int32) []byte {
	seg := h.segments[offset/h.segSize]
	o := offset % h.segSize
	return seg[o : o+int64(length) : o+int64(length)]
}

// put copies data into the half and returns the copy. It returns false if the half is sealed
// or full; the caller then moves to the other half. With journaled, pendingJournal is raised
// before the half can be sealed, so the copy outlives the journal's use of it.
func (h *cacheHalf) put(ledger, entry int64, data []byte, journaled bool) ([]byte, bool) {
	h.writers.Add(1)
	defer h.writers.Add(-1)
	if h.sealed.Load() {
		return nil, false
	}
	off, ok := h.allocate(int64(len(data)))
	if !ok {
		return nil, false
	}
	mem := h.memory(off, int32(len(data)))
	copy(mem, data)
	if journaled {
		h.pendingJournal.Add(1)
	}
	s := &h.shards[shardOf(ledger, entry)]
	s.mu.Lock()
	old, replaced := s.entries[entryKey{ledger, entry}]
	s.entries[entryKey{ledger, entry}] = cacheSlot{offset: off, length: int32(len(data))}
	s.mu.Unlock()
	ls := &h.shards[ledgerShardOf(ledger)]
	ls.mu.Lock()
	if last, ok := ls.last[ledger]; !ok || entry > last {
		ls.last[ledger] = entry
	}
	ls.mu.Unlock()
	if replaced {
		h.bytes.Add(int64(len(data)) - int64(old.length))
	} else {
		h.count.Add(1)
		h.bytes.Add(int64(len(data)))
	}
	return mem, true
}

// get appends the entry to dst. The caller holds h.readers.RLock.
func (h *cacheHalf) get(ledger, entry int64, dst []byte) ([]byte, bool) {
	s := &h.shards[shardOf(ledger, entry)]
	s.mu.Lock()
	slot, ok := s.entries[entryKey{ledger, entry}]
	s.mu.Unlock()
	if !ok {
		return dst, false
	}
	return append(dst, h.memory(slot.offset, slot.length)...), true
}

// lastEntry returns the highest entry of ledger in the half. The caller holds h.readers.RLock.
func (h *cacheHalf) lastEntry(ledger int64) (int64, bool) {
	s := &h.shards[ledgerShardOf(ledger)]
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.last[ledger]
	return e, ok
}

// seal stops new adds and waits until adds in progress have finished.
func (h *cacheHalf) seal() {
	h.sealed.Store(true)
	for h.writers.Load() != 0 {
		runtime.Gosched()
	}
}

// sortedEntry is one entry of a sealed half, for flushing in (ledger, entry) order.
type sortedEntry struct {
	key  entryKey
	slot cacheSlot
}

// sorted appends the half's entries to dst sorted by (ledger, entry). The half must be sealed.
func (h *cacheHalf) sorted(dst []sortedEntry) []sortedEntry {
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for k, v := range s.entries {
			dst = append(dst, sortedEntry{k, v})
		}
		s.mu.Unlock()
	}
	slices.SortFunc(dst, func(a, b sortedEntry) int {
		if c := cmp.Compare(a.key.ledger, b.key.ledger); c != 0 {
			return c
		}
		return cmp.Compare(a.key.entry, b.key.entry)
	})
	return dst
}

// reset empties a sealed half for reuse, once no reader and no journal write uses its memory.
func (h *cacheHalf) reset() {
	h.pendingJournal.Wait()
	h.readers.Lock()
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		clear(s.entries)
		clear(s.last)
		s.mu.Unlock()
	}
	h.offset.Store(0)
	h.count.Store(0)
	h.bytes.Store(0)
	h.sealed.Store(false)
	h.readers.Unlock()
}

// empty reports whether the half holds no entries.
func (h *cacheHalf) empty() bool { return h.count.Load() == 0 }

// removeLedger drops a deleted ledger's entries (they stay in memory until reset).
func (h *cacheHalf) removeLedger(ledger int64) {
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for k := range s.entries {
			if k.ledger == ledger {
				delete(s.entries, k)
				h.count.Add(-1)
			}
		}
		delete(s.last, ledger)
		s.mu.Unlock()
	}
}
