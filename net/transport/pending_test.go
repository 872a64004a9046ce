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
	if n := s.expire(1, &out); n != 1 || out.head != rs[1] {
		t.Fatalf("expire: %d", n)
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
