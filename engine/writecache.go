package engine

import (
	"cmp"
	"encoding/binary"
	"hash/crc32"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// writeCacheShards is the number of shards of a half's ledger table: adds to ledgers on
// different shards never touch the same lock or map.
const writeCacheShards = 64

// cacheAlign is the allocation granularity: entries start on 64-byte boundaries (one cache
// line), so concurrent copies never share a line.
const cacheAlign = 64

// maxDenseGap bounds how far past a ledger's dense index an entry may land and still be stored
// densely (the gap is filled with absent slots); entries further out go to the sparse map. A gap
// is filled only while the dense slice stays within the bytes of the ledger's entries in the half
// (ledgerSlots.fitsDense).
const maxDenseGap = 4096

// writeCacheSegmentSize is the size of a write-cache half's memory segments (smaller halves
// are one segment; a largest entry over it makes the segments that large). A variable so that
// tests can use small ones.
var writeCacheSegmentSize int64 = 64 << 20

// cacheSlotSize is the memory of one dense slot.
const cacheSlotSize = int64(unsafe.Sizeof(cacheSlot{}))

// entryKey identifies an entry.
type entryKey struct{ ledger, entry int64 }

// cacheSlot locates an entry inside a half's memory; length < 0 marks an absent entry. crc is
// the entry's CRC32C in the write cache, computed once when it is copied in: the journal and
// the entry log take it instead of computing their own (the read cache leaves it 0).
type cacheSlot struct {
	offset int64
	length int32
	crc    uint32
}

// castagnoli is the CRC32C table of the journal's and the entry log's record checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ledgerSlots indexes one ledger's entries in a half. A ledger's entries mostly arrive in
// order, so they go into a dense slice indexed by entry-first: appends touch consecutive memory,
// lookups are one index, and a flush reads them already sorted. Entries far out of order go to
// a small map. No entry is in both: when the dense slice grows over an id the map holds, the
// entry moves into the slice (a lookup looks only in the slice for ids it covers).
type ledgerSlots struct {
	// mu guards the fields below.
	mu     sync.Mutex
	id     int64
	first  int64
	dense  []cacheSlot
	sparse map[int64]cacheSlot
	last   int64
	// bytes is the length of the ledger's entries in the half, dense and sparse.
	bytes int64
}

// fitsDense reports whether the dense slice may grow to cover index i, for an entry of n
// bytes. The next index always may (a slot per entry); a gap is filled with absent slots only
// while the slice stays within the bytes of the ledger's entries: tiny entries whose ids are up
// to maxDenseGap apart would otherwise cost 64 KiB of slots each, an index a thousand times the
// size of the write cache it indexes.
func (ls *ledgerSlots) fitsDense(i, n int64) bool {
	gap := i - int64(len(ls.dense))
	return gap == 0 || gap > 0 && gap <= maxDenseGap && (i+1)*cacheSlotSize <= ls.bytes+n
}

func (ls *ledgerSlots) set(entry int64, s cacheSlot) (old cacheSlot, replaced bool) {
	old, replaced = ls.place(entry, s)
	ls.bytes += int64(s.length)
	if replaced {
		ls.bytes -= int64(old.length)
	}
	return old, replaced
}

// place stores s as entry's slot, densely or in the sparse map, returning the slot it replaced.
func (ls *ledgerSlots) place(entry int64, s cacheSlot) (old cacheSlot, replaced bool) {
	if len(ls.dense) == 0 && len(ls.sparse) == 0 {
		ls.first, ls.last = entry, entry
	}
	ls.last = max(ls.last, entry)
	i := entry - ls.first
	switch {
	case i >= 0 && i < int64(len(ls.dense)):
		old = ls.dense[i]
		ls.dense[i] = s
		return old, old.length >= 0
	case i >= int64(len(ls.dense)) && ls.fitsDense(i, int64(s.length)):
		for int64(len(ls.dense)) < i {
			ls.dense = append(ls.dense, ls.takeSparse(ls.first+int64(len(ls.dense)), cacheSlot{length: -1}))
		}
		old = ls.takeSparse(entry, cacheSlot{length: -1})
		ls.dense = append(ls.dense, s)
		return old, old.length >= 0
	}
	if ls.sparse == nil {
		ls.sparse = make(map[int64]cacheSlot)
	}
	old, replaced = ls.sparse[entry]
	ls.sparse[entry] = s
	return old, replaced
}

// takeSparse removes entry from the sparse map and returns its slot, or absent if it is not
// there.
func (ls *ledgerSlots) takeSparse(entry int64, absent cacheSlot) cacheSlot {
	if len(ls.sparse) == 0 {
		return absent
	}
	s, ok := ls.sparse[entry]
	if !ok {
		return absent
	}
	delete(ls.sparse, entry)
	return s
}

func (ls *ledgerSlots) get(entry int64) (cacheSlot, bool) {
	if i := entry - ls.first; i >= 0 && i < int64(len(ls.dense)) {
		s := ls.dense[i]
		return s, s.length >= 0
	}
	s, ok := ls.sparse[entry]
	return s, ok
}

func (ls *ledgerSlots) reset() {
	ls.dense = ls.dense[:0]
	clear(ls.sparse)
	ls.bytes = 0
}

type cacheShard struct {
	// mu guards ledgers.
	mu      sync.RWMutex
	ledgers map[int64]*ledgerSlots
	_       [40]byte // keep shards on separate cache lines
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
	// spare holds ledgerSlots of ledgers flushed earlier, reused so that steady-state adds do
	// not allocate (guarded by spareMu).
	spareMu sync.Mutex
	spare   []*ledgerSlots
	// readers guards the memory against reset while a read copies from it: reads hold RLock,
	// reset holds Lock. Adds do not use it.
	readers sync.RWMutex
	// activatedAt is when the half last became the active one (zero before its first swap);
	// the flush paces itself by how long the half took to fill. Used under the dir's flushMu.
	activatedAt time.Time
}

func newCacheHalf(size, segSize int64) *cacheHalf {
	if segSize > size {
		segSize = size
	}
	n := (size + segSize - 1) / segSize
	// The last segment holds only the rest of the half (allocate never crosses a segment's end
	// nor the capacity): whole segments would hold up to a segment more than the configured
	// size.
	h := &cacheHalf{segSize: segSize, capacity: size}
	h.segments = make([][]byte, n)
	for i := range h.segments {
		seg := make([]byte, min(segSize, size-int64(i)*segSize))
		// Touch every page now: a first write to a fresh page is a page fault, which would
		// otherwise land on the add path.
		for p := 0; p < len(seg); p += 4096 {
			seg[p] = 1
		}
		h.segments[i] = seg
	}
	for i := range h.shards {
		h.shards[i].ledgers = make(map[int64]*ledgerSlots)
	}
	return h
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
func (h *cacheHalf) put(ledger, entry int64, data []byte, journaled bool) ([]byte, uint32, bool) {
	h.writers.Add(1)
	defer h.writers.Add(-1)
	if h.sealed.Load() {
		return nil, 0, false
	}
	off, ok := h.allocate(int64(len(data)))
	if !ok {
		return nil, 0, false
	}
	mem := h.memory(off, int32(len(data)))
	copy(mem, data)
	crc := crc32.Checksum(mem, castagnoli)
	if journaled {
		h.pendingJournal.Add(1)
	}
	ls := h.slots(ledger)
	ls.mu.Lock()
	old, replaced := ls.set(entry, cacheSlot{offset: off, length: int32(len(data)), crc: crc})
	ls.mu.Unlock()
	if replaced {
		h.bytes.Add(int64(len(data)) - int64(old.length))
	} else {
		h.count.Add(1)
		h.bytes.Add(int64(len(data)))
	}
	return mem, crc, true
}

// slots returns the ledger's index in the half, creating it if needed.
func (h *cacheHalf) slots(ledger int64) *ledgerSlots {
	s := &h.shards[ledgerShardOf(ledger)]
	s.mu.RLock()
	ls := s.ledgers[ledger]
	s.mu.RUnlock()
	if ls != nil {
		return ls
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls = s.ledgers[ledger]; ls != nil {
		return ls
	}
	h.spareMu.Lock()
	if n := len(h.spare); n > 0 {
		ls = h.spare[n-1]
		h.spare = h.spare[:n-1]
	}
	h.spareMu.Unlock()
	if ls == nil {
		ls = &ledgerSlots{}
	}
	ls.id = ledger
	s.ledgers[ledger] = ls
	return ls
}

// lookup returns the ledger's index in the half, or nil.
func (h *cacheHalf) lookup(ledger int64) *ledgerSlots {
	s := &h.shards[ledgerShardOf(ledger)]
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ledgers[ledger]
}

// get appends the entry to dst. The caller holds h.readers.RLock.
func (h *cacheHalf) get(ledger, entry int64, dst []byte) ([]byte, bool) {
	ls := h.lookup(ledger)
	if ls == nil {
		return dst, false
	}
	ls.mu.Lock()
	slot, ok := ls.get(entry)
	ls.mu.Unlock()
	if !ok {
		return dst, false
	}
	return append(dst, h.memory(slot.offset, slot.length)...), true
}

// lastEntry returns the highest entry of ledger in the half. The caller holds h.readers.RLock.
func (h *cacheHalf) lastEntry(ledger int64) (int64, bool) {
	ls := h.lookup(ledger)
	if ls == nil {
		return 0, false
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.last, len(ls.dense) > 0 || len(ls.sparse) > 0
}

// activate lets adds into a half that is becoming the active one. A half is sealed from its
// flush until then, through reset: an add that loaded it as the active half and stalled while a
// whole checkpoint ran must not put into it while it is the spare, which neither reads nor the
// next flush look at.
func (h *cacheHalf) activate() { h.sealed.Store(false) }

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
// Dense indexes are already in order: only ledgers and sparse entries are sorted.
func (h *cacheHalf) sorted(dst []sortedEntry) []sortedEntry {
	var ledgers []*ledgerSlots
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		for _, ls := range s.ledgers {
			ledgers = append(ledgers, ls)
		}
		s.mu.RUnlock()
	}
	slices.SortFunc(ledgers, func(a, b *ledgerSlots) int { return cmp.Compare(a.id, b.id) })
	for _, ls := range ledgers {
		dst = ls.appendSorted(dst)
	}
	return dst
}

// appendSorted appends the ledger's entries in entry order. Under ls.mu: a sealed half takes
// no add, but DeleteLedger still empties a ledger of it (removeLedger).
func (ls *ledgerSlots) appendSorted(dst []sortedEntry) []sortedEntry {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	start := len(dst)
	for i, slot := range ls.dense {
		if slot.length >= 0 {
			dst = append(dst, sortedEntry{entryKey{ls.id, ls.first + int64(i)}, slot})
		}
	}
	if len(ls.sparse) == 0 {
		return dst
	}
	for e, slot := range ls.sparse {
		dst = append(dst, sortedEntry{entryKey{ls.id, e}, slot})
	}
	slices.SortFunc(dst[start:], func(a, b sortedEntry) int { return cmp.Compare(a.key.entry, b.key.entry) })
	return dst
}

// reset empties a sealed half for reuse, once no reader and no journal write uses its memory.
// It stays sealed until activate.
func (h *cacheHalf) reset() {
	h.pendingJournal.Wait()
	h.readers.Lock()
	h.spareMu.Lock()
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for _, ls := range s.ledgers {
			ls.reset()
			h.spare = append(h.spare, ls)
		}
		clear(s.ledgers)
		s.mu.Unlock()
	}
	h.spareMu.Unlock()
	h.offset.Store(0)
	h.count.Store(0)
	h.bytes.Store(0)
	h.readers.Unlock()
}

// empty reports whether the half holds no entries.
func (h *cacheHalf) empty() bool { return h.count.Load() == 0 }

// removeLedger drops a deleted ledger's entries (they stay in memory until reset).
func (h *cacheHalf) removeLedger(ledger int64) {
	s := &h.shards[ledgerShardOf(ledger)]
	s.mu.Lock()
	ls := s.ledgers[ledger]
	delete(s.ledgers, ledger)
	s.mu.Unlock()
	if ls == nil {
		return
	}
	ls.mu.Lock()
	n := len(ls.sparse)
	for _, slot := range ls.dense {
		if slot.length >= 0 {
			n++
		}
	}
	ls.reset()
	ls.mu.Unlock()
	h.count.Add(-int64(n))
}
