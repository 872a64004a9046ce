package transport

// keyTable maps a request key to the head of its chain of pending requests: an open-addressing
// table with linear probing that stores each key beside its head, so that a probe reads no
// request. It replaces a Go map, whose hashing of the 24-byte key and generic probing were 6%
// of a pipelining client's CPU. The table grows to keep at most half of its slots used and
// never shrinks (a connection's pending requests are bounded by MaxPendingPerConn). Keys come
// from the client's own requests, so probe lengths do not depend on what a bookie sends.
type keyTable struct {
	slots []keySlot
	used  int
}

type keySlot struct {
	key  reqKey
	head *request // nil: the slot is empty
}

// keyTableMinSize is the table's first size (a power of two).
const keyTableMinSize = 64

// home is the slot where the search for k starts.
func (t *keyTable) home(k reqKey) int {
	h := uint64(k.ledgerID)*0x9e3779b97f4a7c15 ^ uint64(k.entryID) ^ uint64(k.op)<<56
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 31
	return int(h & uint64(len(t.slots)-1))
}

// find returns the slot of k, or the empty slot where it would go (ok false). The table must
// have a slot (see reserve).
func (t *keyTable) find(k reqKey) (i int, ok bool) {
	mask := len(t.slots) - 1
	for i = t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.head == nil {
			return i, false
		}
		if s.key == k {
			return i, true
		}
	}
}

// lookup is find for a table that may have no slots yet.
func (t *keyTable) lookup(k reqKey) (i int, ok bool) {
	if t.used == 0 {
		return 0, false
	}
	return t.find(k)
}

// reserve makes room for one more key, so that find's empty slot can be filled.
func (t *keyTable) reserve() {
	if 2*(t.used+1) <= len(t.slots) {
		return
	}
	old := t.slots
	t.slots = make([]keySlot, max(keyTableMinSize, 2*len(old)))
	for _, s := range old {
		if s.head != nil {
			i, _ := t.find(s.key)
			t.slots[i] = s
		}
	}
}

// fill puts head into the empty slot i that find returned for head.key (after reserve).
func (t *keyTable) fill(i int, head *request) {
	t.slots[i] = keySlot{key: head.key, head: head}
	t.used++
}

// clearSlot empties slot i, shifting later entries of its probe sequence back so that no
// tombstones are needed.
func (t *keyTable) clearSlot(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].head != nil; j = (j + 1) & mask {
		// The entry at j may move to the hole at i unless its home lies in (i, j] cyclically.
		h := t.home(t.slots[j].key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = keySlot{}
	t.used--
}

// reset empties the table, keeping its storage for the next connection.
func (t *keyTable) reset() {
	clear(t.slots)
	t.used = 0
}
