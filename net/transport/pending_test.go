package transport

import (
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
	if s.n != 6 || len(s.byKey) != 2 {
		t.Fatalf("n %d keys %d", s.n, len(s.byKey))
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
	if out.head != add || s.n != 0 || len(s.byKey) != 0 || s.adds.head != nil {
		t.Fatal("takeAll")
	}
}
