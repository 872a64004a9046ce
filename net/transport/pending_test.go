package transport

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// TestPendingSet checks the chains of duplicate keys and the age lists, removing from every
// position.
func TestPendingSet(t *testing.T) {
	var s pendingSet
	k := reqKey{ledgerID: 1, entryID: 2, op: protocol.OpReadEntry}
	other := reqKey{ledgerID: 1, entryID: 2, op: protocol.OpAddEntry}
	rs := make([]*request, 5)
	for i := range rs {
		rs[i] = &request{key: k, ctx: i, expiry: int64(i)}
		s.insert(rs[i])
	}
	add := &request{key: other, ctx: "add", expiry: 100}
	s.insert(add)
	if s.n != 6 || s.byKey.used != 2 {
		t.Fatalf("n %d keys %d", s.n, s.byKey.used)
	}
	s.remove(rs[2]) // middle
	s.remove(rs[4]) // tail
	if got := s.pop(k); got != rs[0] {
		t.Fatalf("pop: %v", got.ctx)
	}
	var out reqList
	if n := s.expire(1, &out); n != 1 || out.head.ctx != 1 || out.head == rs[1] {
		t.Fatalf("expire: %d", n)
	}
	// The expired request was sent: it stays in the chain as a ghost, for its late answer.
	if s.n != 3 || s.reads.head != rs[3] || !rs[1].ghost || rs[1].ctx != nil {
		t.Fatalf("after expire: n %d", s.n)
	}
	if got := s.pop(k); got != rs[1] {
		t.Fatalf("pop: %v, want the ghost", got.ctx)
	}
	if got := s.pop(k); got != rs[3] {
		t.Fatalf("pop: %v", got.ctx)
	}
	if got := s.pop(k); got != nil {
		t.Fatalf("pop of an empty chain: %v", got.ctx)
	}
	if s.reads.head != nil || s.reads.tail != nil || s.n != 1 {
		t.Fatalf("read age list not empty: n %d", s.n)
	}
	out = reqList{}
	s.takeAll(&out)
	if out.head != add || s.n != 0 || s.byKey.used != 0 || s.adds.head != nil {
		t.Fatal("takeAll")
	}
}

// holdHarness drives a pendingSet's holding for one key: requests are named, and sent lists
// the names in the order they went out (at insert, or when released).
type holdHarness struct {
	s    pendingSet
	k    reqKey
	sent []string
}

func newHoldHarness() *holdHarness {
	h := &holdHarness{k: reqKey{ledgerID: 1, entryID: 2, op: protocol.OpReadEntry}}
	h.s.send = func(frame []byte) { h.sent = append(h.sent, string(frame)) }
	return h
}

func (h *holdHarness) insert(name string, kind protocol.Flags, expiry int64) *request {
	r := &request{key: h.k, kind: kind & kindFlags, expiry: expiry, ctx: name}
	if h.s.insert(r) {
		h.s.hold(r, []byte(name))
	} else {
		h.sent = append(h.sent, name)
	}
	return r
}

func (h *holdHarness) check(t *testing.T, step string, sent string, heldBytes int) {
	t.Helper()
	if got := fmt.Sprint(h.sent); got != sent || h.s.heldBytes != heldBytes {
		t.Fatalf("%s: sent %s held bytes %d, want %s %d", step, got, h.s.heldBytes, sent, heldBytes)
	}
}

// TestPendingSetHolds: requests of one kind for a key go out together; one of another kind
// waits for all of them, and everything after it waits in order.
func TestPendingSetHolds(t *testing.T) {
	const fence = protocol.FlagDoFencing
	h := newHoldHarness()
	h.insert("f1", fence, 1)
	h.insert("f2", fence, 2)
	h.insert("p1", 0, 3)
	h.insert("p2", 0, 4)
	h.insert("f3", fence, 5)
	h.check(t, "inserted", "[f1 f2]", 6)
	for i, want := range []struct {
		pop, sent string
		held      int
	}{
		{"f1", "[f1 f2]", 6},
		{"f2", "[f1 f2 p1 p2]", 2},
		{"p1", "[f1 f2 p1 p2]", 2},
		{"p2", "[f1 f2 p1 p2 f3]", 0},
	} {
		if r := h.s.pop(h.k); r == nil || r.ctx != want.pop {
			t.Fatalf("pop %d: %v, want %s", i, r, want.pop)
		}
		h.check(t, "pop "+want.pop, want.sent, want.held)
	}
	h.insert("f4", fence|protocol.FlagHighPriority, 6) // same kind as f3, in flight: no wait
	h.insert("p3", 0, 7)
	h.check(t, "after f3", "[f1 f2 p1 p2 f3 f4]", 2)
	h.s.pop(h.k)
	h.s.pop(h.k)
	h.check(t, "f3 and f4 answered", "[f1 f2 p1 p2 f3 f4 p3]", 0)
	if r := h.s.pop(h.k); r == nil || r.ctx != "p3" || h.s.n != 0 || h.s.byKey.used != 0 {
		t.Fatalf("last pop: %v, n %d", r, h.s.n)
	}
}

// TestPendingSetHeldExpiry: a held request that is due is never sent, even when the request
// it waited for expires in the same scan; one that is not due is sent once the requests ahead
// of it of another kind are gone; a held request expiring between two runs of one kind lets
// the second join the first.
func TestPendingSetHeldExpiry(t *testing.T) {
	const fence = protocol.FlagDoFencing
	t.Run("same scan", func(t *testing.T) {
		h := newHoldHarness()
		h.insert("f", fence, 10)
		h.insert("p", 0, 11)
		h.insert("f2", fence, 20)
		var out reqList
		if n := h.s.expire(11, &out); n != 2 || out.head.ctx != "f" || out.tail.ctx != "p" {
			t.Fatalf("expired %d", n)
		}
		h.check(t, "expired f and p", "[f f2]", 0)
	})
	t.Run("held only", func(t *testing.T) {
		h := newHoldHarness()
		h.insert("f", fence, 100)
		h.insert("p", 0, 5) // its caller blocked on a full queue: due first
		h.insert("f2", fence, 100)
		var out reqList
		if n := h.s.expire(5, &out); n != 1 || out.head.ctx != "p" {
			t.Fatalf("expired %d", n)
		}
		h.check(t, "expired p", "[f f2]", 0)
		if r := h.s.pop(h.k); r.ctx != "f" {
			t.Fatalf("pop: %v", r.ctx)
		}
		if r := h.s.pop(h.k); r.ctx != "f2" {
			t.Fatalf("pop: %v", r.ctx)
		}
	})
	t.Run("takeAll", func(t *testing.T) {
		h := newHoldHarness()
		h.insert("f", fence, 1)
		h.insert("p", 0, 2)
		var out reqList
		h.s.takeAll(&out)
		h.check(t, "taken", "[f]", 0)
	})
}

// BenchmarkPendingSet is one add's cost in a connection's pending set with 1000 in flight:
// an insert and the pop of the response, in order and with responses out of order.
func BenchmarkPendingSet(b *testing.B) {
	const window = 1000
	for _, order := range []string{"inorder", "shuffled"} {
		b.Run(order, func(b *testing.B) {
			var s pendingSet
			reqs := make([]request, window)
			// Responses answer a permutation of each window of requests.
			perm := make([]int64, window)
			for i := range perm {
				perm[i] = int64(i)
			}
			if order == "shuffled" {
				rand.New(rand.NewPCG(1, 2)).Shuffle(window, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
			}
			for i := range reqs {
				reqs[i].key = reqKey{ledgerID: 7, entryID: int64(i), op: protocol.OpAddEntry}
				s.insert(&reqs[i])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range int64(b.N) {
				round, slot := i/window, i%window
				k := reqKey{ledgerID: 7, entryID: round*window + perm[slot], op: protocol.OpAddEntry}
				r := s.pop(k)
				if r == nil {
					b.Fatalf("no request for %+v", k)
				}
				r.key.entryID += window
				s.insert(r)
			}
		})
	}
}

// TestKeyTableMatchesAMap drives the open-addressing table with random inserts and deletes of
// keys from a small universe and checks every key against a map after each step. With 45 keys
// about 30 are live in the smallest table (64 slots): clusters are long and often wrap around
// the table's end, which is where deletion's back-shifting goes wrong first.
func TestKeyTableMatchesAMap(t *testing.T) {
	for _, keys := range []int{45, 200} {
		t.Run(fmt.Sprint(keys), func(t *testing.T) { testKeyTable(t, keys) })
	}
}

func testKeyTable(t *testing.T, keys int) {
	rng := rand.New(rand.NewPCG(3, uint64(keys)))
	var kt keyTable
	model := map[reqKey]*request{}
	universe := make([]reqKey, keys)
	for i := range universe {
		op := protocol.OpAddEntry
		if i%3 == 0 {
			op = protocol.OpReadEntry
		}
		universe[i] = reqKey{ledgerID: int64(i % 7), entryID: int64(i / 7), op: op}
	}
	for step := range 20000 {
		k := universe[rng.IntN(len(universe))]
		if _, ok := model[k]; ok && rng.IntN(2) == 0 {
			i, found := kt.lookup(k)
			if !found {
				t.Fatalf("step %d: %+v missing", step, k)
			}
			kt.clearSlot(i)
			delete(model, k)
		} else {
			r := &request{key: k}
			kt.reserve()
			if i, found := kt.find(k); found {
				kt.slots[i].head = r
			} else {
				kt.fill(i, r)
			}
			model[k] = r
		}
		if kt.used != len(model) {
			t.Fatalf("step %d: used %d, model %d", step, kt.used, len(model))
		}
		for _, k := range universe {
			var got *request
			if i, ok := kt.lookup(k); ok {
				got = kt.slots[i].head
			}
			if got != model[k] {
				t.Fatalf("step %d: key %+v: table %p, model %p", step, k, got, model[k])
			}
		}
	}
	if len(kt.slots) > 4*len(universe) {
		t.Fatalf("table grew to %d slots for at most %d keys", len(kt.slots), len(universe))
	}
}

// TestKeyTableWrapsAround builds clusters that cross the end of the smallest table (keys whose
// home slots are the last two and the first) and deletes their keys in every order of a
// random sample, checking the rest stay findable.
func TestKeyTableWrapsAround(t *testing.T) {
	var kt keyTable
	kt.reserve() // keyTableMinSize slots
	n := len(kt.slots)
	var keys []reqKey
	for e := int64(0); len(keys) < 8; e++ {
		k := reqKey{ledgerID: 5, entryID: e, op: protocol.OpAddEntry}
		if h := kt.home(keyHash(k)); h >= n-2 || h == 0 {
			keys = append(keys, k)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 200 {
		kt.reset()
		live := map[reqKey]bool{}
		for _, k := range keys {
			i, _ := kt.find(k)
			kt.fill(i, &request{key: k})
			live[k] = true
		}
		for _, j := range rng.Perm(len(keys)) {
			i, ok := kt.lookup(keys[j])
			if !ok {
				t.Fatalf("round %d: %+v lost", round, keys[j])
			}
			kt.clearSlot(i)
			delete(live, keys[j])
			for _, k := range keys {
				if _, ok := kt.lookup(k); ok != live[k] {
					t.Fatalf("round %d: %+v found %v, live %v", round, k, ok, live[k])
				}
			}
		}
	}
}

// TestKeyTableHashCollision builds a second key with the first one's hash (keyHash drops the
// top bits of its mix, so a ledger id can be solved for) and checks that each response still
// takes its own request.
func TestKeyTableHashCollision(t *testing.T) {
	inverse := func(a uint64) uint64 { // of an odd a, modulo 2^64 (Newton's iteration)
		x := a
		for range 6 {
			x *= 2 - a*x
		}
		return x
	}
	k1 := reqKey{ledgerID: 1, entryID: 5, op: protocol.OpAddEntry}
	mix := (keyHash(k1) >> keyGroupBits) ^ 1<<62 // the same hash once shifted
	x := mix ^ mix>>31 ^ mix>>62                 // undo h ^= h>>31
	x *= inverse(keyMulMix)                      // undo h *= keyMulMix
	// x = ledger*keyMulLedger ^ group ^ op<<56 with k1's group (entry 5: group 0) and op.
	k2 := reqKey{ledgerID: int64((x ^ uint64(k1.op)<<56) * inverse(keyMulLedger)), entryID: k1.entryID, op: k1.op}
	if k1 == k2 || keyHash(k1) != keyHash(k2) {
		t.Fatalf("no collision: %+v %x, %+v %x", k1, keyHash(k1), k2, keyHash(k2))
	}
	var s pendingSet
	r1, r2 := &request{key: k1}, &request{key: k2}
	s.insert(r1)
	s.insert(r2)
	if got := s.pop(k2); got != r2 {
		t.Fatalf("pop(k2) = %+v", got)
	}
	if got := s.pop(k2); got != nil {
		t.Fatalf("second pop(k2) = %+v", got)
	}
	if got := s.pop(k1); got != r1 {
		t.Fatalf("pop(k1) = %+v", got)
	}
}
