package transport

// keyTable maps a request key to the head of its chain of pending requests: an open-addressing
// table with linear probing. It replaces a Go map, whose hashing of the 24-byte key and generic
// probing were 6% of a pipelining client's CPU. A slot holds the key's hash beside the head, so
// a probe reads a request only when the hashes match (then it is the one wanted). The hash
// keeps groups of consecutive entries of a ledger in consecutive slots, so that a connection's
// run of adds touches few cache lines. The table grows to keep at most half of its slots used
// and never shrinks (a connection's pending requests are bounded by MaxPendingPerConn). Keys
// come from the client's own requests, so probe lengths do not depend on what a bookie sends.
type keyTable struct {
	slots []keySlot
	used  int
}

type keySlot struct {
	hash uint64   // keyHash of head.key; its low bits are the key's home slot
	head *request // nil: the slot is empty
}

// keyGroupBits: 1<<keyGroupBits consecutive entry ids share a group of consecutive slots.
const keyGroupBits = 3

// Odd multipliers of keyHash's mix.
const (
	keyMulLedger = 0x9e3779b97f4a7c15
	keyMulMix    = 0xbf58476d1ce4e5b9
)

// keyHash mixes a key's ledger, op and entry group, and keeps the entry's place in its group
// in the low bits. Distinct keys may share a hash (the shift drops the mix's top bits).
func keyHash(k reqKey) uint64 {
	h := uint64(k.ledgerID)*keyMulLedger ^ uint64(k.entryID>>keyGroupBits) ^ uint64(k.op)<<56
	h *= keyMulMix
	h ^= h >> 31
	return h<<keyGroupBits | uint64(k.entryID)&(1<<keyGroupBits-1)
}

// keyTableMinSize is the table's first size (a power of two).
const keyTableMinSize = 64

// home is the slot where the search for a key of hash h starts.
func (t *keyTable) home(h uint64) int { return int(h & uint64(len(t.slots)-1)) }

// find returns the slot of k, or the empty slot where it would go (ok false). The table must
// have a slot (see reserve).
func (t *keyTable) find(k reqKey) (i int, ok bool) {
	h := keyHash(k)
	mask := len(t.slots) - 1
	for i = t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.head == nil {
			return i, false
		}
		if s.hash == h && s.head.key == k {
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
	mask := len(t.slots) - 1
	for _, s := range old {
		if s.head != nil {
			i := t.home(s.hash)
			for t.slots[i].head != nil {
				i = (i + 1) & mask
			}
			t.slots[i] = s
		}
	}
}

// fill puts head into the empty slot i that find returned for head.key (after reserve).
func (t *keyTable) fill(i int, head *request) {
	t.slots[i] = keySlot{hash: keyHash(head.key), head: head}
	t.used++
}

// clearSlot empties slot i, shifting later entries of its probe sequence back so that no
// tombstones are needed.
func (t *keyTable) clearSlot(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].head != nil; j = (j + 1) & mask {
		// The entry at j may move to the hole at i unless its home lies in (i, j] cyclically.
		h := t.home(t.slots[j].hash)
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
