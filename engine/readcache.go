package engine

import "sync"

// readCache keeps entries read from entry logs (and read ahead along the same ledger): a ring of
// segments, each with its own index. When the newest segment is full, the oldest is cleared and
// becomes the newest, so memory is bounded by the segments (dbStorage_readAheadCacheMaxSizeMb).
type readCache struct {
	// mu guards everything below.
	mu       sync.RWMutex
	segments []readSegment
	current  int
}

type readSegment struct {
	data  []byte
	used  int
	index map[entryKey]cacheSlot
}

func newReadCache(size int64, segments int) *readCache {
	segments = max(segments, 2)
	segSize := max(size/int64(segments), 64<<10)
	c := &readCache{segments: make([]readSegment, segments)}
	for i := range c.segments {
		c.segments[i] = readSegment{data: make([]byte, segSize), index: make(map[entryKey]cacheSlot)}
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

// put caches an entry. Entries larger than a segment are not cached.
func (c *readCache) put(ledger, entry int64, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.segments[c.current]
	if len(data) > len(s.data) {
		return
	}
	if s.used+len(data) > len(s.data) {
		c.current = (c.current + 1) % len(c.segments)
		s = &c.segments[c.current]
		clear(s.index)
		s.used = 0
	}
	copy(s.data[s.used:], data)
	s.index[entryKey{ledger, entry}] = cacheSlot{offset: int64(s.used), length: int32(len(data))}
	s.used += len(data)
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
		for k := range c.segments[i].index {
			if k.ledger == ledger {
				delete(c.segments[i].index, k)
			}
		}
	}
}
