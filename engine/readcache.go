package engine

import "sync"

// readCache keeps entries read from entry logs (and read ahead along the same ledger): a ring of
// segments, each with its own index. When the newest segment is full, the oldest is cleared and
// becomes the newest, so memory is bounded by the segments (dbStorage_readAheadCacheMaxSizeMb).
//
// A cached copy must never outlive a newer add of its entry (a recovery add writes an entry
// again): the write cache hides it only until the flush recycles the half. So each flush drops
// the entries it wrote (invalidate), and a read that looked the index up before that flush's
// commit caches nothing (its generation is stale), or it would put back the older copy.
type readCache struct {
	// mu guards everything below.
	mu       sync.RWMutex
	segments []readSegment
	current  int
	// gen counts invalidations: put caches only for the generation its reader started in.
	gen uint64
}

type readSegment struct {
	data  []byte
	used  int
	index map[entryKey]cacheSlot
	// ledgers counts the segment's entries per ledger, so that invalidate skips ledgers it
	// does not hold without a look-up per entry.
	ledgers map[int64]int
}

func newReadCache(size int64, segments int) *readCache {
	// Fewer segments for a small cache, so that none is under 64 KiB, but at least 2 (then
	// smaller); never more memory than size (0 caches nothing).
	segments = int(max(min(int64(segments), size/(64<<10)), 2))
	segSize := size / int64(segments)
	c := &readCache{segments: make([]readSegment, segments)}
	for i := range c.segments {
		c.segments[i] = readSegment{data: make([]byte, segSize), index: make(map[entryKey]cacheSlot), ledgers: make(map[int64]int)}
	}
	return c
}

// get appends the entry to dst if cached.
func (c *readCache) get(ledger, entry int64, dst []byte) ([]byte, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range c.segments {
		s := &c.segments[(c.current-i+len(c.segments))%len(c.segments)]
		if slot, ok := s.index[entryKey{ledger, entry}]; ok {
			return append(dst, s.data[slot.offset:slot.offset+int64(slot.length)]...), true
		}
	}
	return dst, false
}

// generation returns the current generation: take it before the index look-ups whose
// results are to be cached.
func (c *readCache) generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

// put caches an entry read in generation gen; nothing is cached if an invalidation came since.
// Entries larger than a segment are not cached.
func (c *readCache) put(gen uint64, ledger, entry int64, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	s := &c.segments[c.current]
	if len(data) > len(s.data) {
		return
	}
	if s.used+len(data) > len(s.data) {
		c.current = (c.current + 1) % len(c.segments)
		s = &c.segments[c.current]
		clear(s.index)
		clear(s.ledgers)
		s.used = 0
	}
	copy(s.data[s.used:], data)
	k := entryKey{ledger, entry}
	if _, ok := s.index[k]; !ok {
		s.ledgers[ledger]++
	}
	s.index[k] = cacheSlot{offset: int64(s.used), length: int32(len(data))}
	s.used += len(data)
}

// invalidate drops the cached copies of flushed entries (sorted by ledger, as a flush writes
// them) and starts a new generation, so that a read that looked them up before cannot cache
// them again.
func (c *readCache) invalidate(flushed []sortedEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for len(flushed) > 0 {
		ledger := flushed[0].key.ledger
		n := 1
		for n < len(flushed) && flushed[n].key.ledger == ledger {
			n++
		}
		for i := range c.segments {
			s := &c.segments[i]
			if s.ledgers[ledger] == 0 {
				continue
			}
			for _, f := range flushed[:n] {
				if _, ok := s.index[f.key]; ok {
					delete(s.index, f.key)
					if s.ledgers[ledger]--; s.ledgers[ledger] == 0 {
						delete(s.ledgers, ledger)
						break
					}
				}
			}
		}
		flushed = flushed[n:]
	}
}

// has reports whether the entry is cached.
func (c *readCache) has(ledger, entry int64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range c.segments {
		if _, ok := c.segments[i].index[entryKey{ledger, entry}]; ok {
			return true
		}
	}
	return false
}

// removeLedger forgets a deleted ledger's entries.
func (c *readCache) removeLedger(ledger int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.segments {
		s := &c.segments[i]
		if s.ledgers[ledger] == 0 {
			continue
		}
		for k := range s.index {
			if k.ledger == ledger {
				delete(s.index, k)
			}
		}
		delete(s.ledgers, ledger)
	}
}
