package transport

import (
	"sync"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// reqKey is what a v2 response carries to say which request it answers.
type reqKey struct {
	ledgerID int64
	entryID  int64
	op       protocol.OpCode
}

// request is one add or read from the call until its callback. It is pooled: the struct is
// returned to requestPool just before the callback runs, so a request allocates nothing in
// steady state.
type request struct {
	key    reqKey
	add    AddCallback
	read   ReadCallback
	ctx    any
	expiry int64 // deadline, monotime nanoseconds

	// Requests with the same key form a FIFO chain; the map holds its head. tail is valid on
	// the head only.
	prevSame, nextSame, tail *request
	// The age list of the request's op, in insertion (hence deadline) order. Off the pending
	// set, nextAge links the request into a reqList.
	prevAge, nextAge *request
	// err is the error to deliver when the request sits on a failure list.
	err error
}

var requestPool = sync.Pool{New: func() any { return new(request) }}

func getRequest() *request { return requestPool.Get().(*request) }

// finish runs the request's callback, after returning the struct to the pool (the callback
// never sees it). Exactly one finish per request: whoever removed it from its connection's
// pending set (under the connection's mutex) owns it.
func (r *request) finish(rc protocol.ReturnCode, entry []byte, err error) {
	add, read, ctx := r.add, r.read, r.ctx
	*r = request{}
	requestPool.Put(r)
	switch {
	case add != nil:
		add(ctx, rc, err)
	case read != nil:
		read(ctx, rc, entry, err)
	}
}

// reqList is a singly linked list of requests off the pending set (through nextAge).
type reqList struct{ head, tail *request }

func (l *reqList) push(r *request) {
	r.nextAge = nil
	if l.tail == nil {
		l.head = r
	} else {
		l.tail.nextAge = r
	}
	l.tail = r
}

// failAll finishes every request of the list with err (or with each request's own err when
// err is nil) and empties it.
func (l *reqList) failAll(err error) {
	r := l.head
	*l = reqList{}
	for r != nil {
		next := r.nextAge
		e := err
		if e == nil {
			e = r.err
		}
		r.finish(0, nil, e)
		r = next
	}
}

// ageList is a doubly linked list of one op's pending requests, the first to expire first.
// All requests of an op share one timeout, so that is oldest first, except for a request whose
// caller blocked on a full queue before it was inserted.
type ageList struct{ head, tail *request }

// insertByExpiry links r after the last request due no later than it (usually the tail: only
// a caller that blocked on a full queue inserts a deadline earlier than the tail's).
func (l *ageList) insertByExpiry(r *request) {
	at := l.tail
	for at != nil && at.expiry > r.expiry {
		at = at.prevAge
	}
	if at == nil {
		r.prevAge, r.nextAge = nil, l.head
		if l.head == nil {
			l.tail = r
		} else {
			l.head.prevAge = r
		}
		l.head = r
		return
	}
	r.prevAge, r.nextAge = at, at.nextAge
	if at.nextAge == nil {
		l.tail = r
	} else {
		at.nextAge.prevAge = r
	}
	at.nextAge = r
}

func (l *ageList) unlink(r *request) {
	if r.prevAge == nil {
		l.head = r.nextAge
	} else {
		r.prevAge.nextAge = r.nextAge
	}
	if r.nextAge == nil {
		l.tail = r.prevAge
	} else {
		r.nextAge.prevAge = r.prevAge
	}
	r.prevAge, r.nextAge = nil, nil
}

// pendingSet is a connection's requests in flight: by key (FIFO among duplicates, for
// matching responses) and by age per op (for timeouts). Guarded by the connection's mutex.
type pendingSet struct {
	byKey keyTable
	adds  ageList
	reads ageList
	n     int
}

func (s *pendingSet) ages(op protocol.OpCode) *ageList {
	if op == protocol.OpAddEntry {
		return &s.adds
	}
	return &s.reads
}

// insert adds r at the back of its key's chain and of its op's age list.
func (s *pendingSet) insert(r *request) {
	r.prevSame, r.nextSame, r.tail = nil, nil, nil
	s.byKey.reserve()
	if i, ok := s.byKey.find(r.key); ok {
		head := s.byKey.slots[i].head
		last := head.tail
		last.nextSame, r.prevSame = r, last
		head.tail = r
	} else {
		r.tail = r
		s.byKey.fill(i, r)
	}
	s.ages(r.key.op).insertByExpiry(r)
	s.n++
}

// pop removes and returns the oldest request with key k, or nil.
func (s *pendingSet) pop(k reqKey) *request {
	i, ok := s.byKey.lookup(k)
	if !ok {
		return nil
	}
	r := s.byKey.slots[i].head
	s.removeAt(r, i)
	return r
}

// remove takes r out of its chain and its age list.
func (s *pendingSet) remove(r *request) {
	i := -1
	if r.prevSame == nil || r.nextSame == nil { // the chain's head or tail: its slot changes
		i, _ = s.byKey.find(r.key)
	}
	s.removeAt(r, i)
}

// removeAt is remove with i the slot of r's key (unused when r is inside its chain).
func (s *pendingSet) removeAt(r *request, i int) {
	switch {
	case r.prevSame == nil && r.nextSame == nil: // alone
		s.byKey.clearSlot(i)
	case r.prevSame == nil: // head of a longer chain
		next := r.nextSame
		next.prevSame, next.tail = nil, r.tail
		s.byKey.slots[i].head = next
	default:
		r.prevSame.nextSame = r.nextSame
		if r.nextSame != nil {
			r.nextSame.prevSame = r.prevSame
		} else {
			s.byKey.slots[i].head.tail = r.prevSame
		}
	}
	r.prevSame, r.nextSame, r.tail = nil, nil, nil
	s.ages(r.key.op).unlink(r)
	s.n--
}

// expire moves every request whose deadline is at or before now to out and returns how many.
// silentSince reports whether a request due by now was sent (its deadline less its op's
// timeout) after lastRecv: the connection has then received nothing for a whole timeout.
func (s *pendingSet) silentSince(now, lastRecv int64, addTimeout, readTimeout time.Duration) bool {
	for _, o := range [2]struct {
		l       *ageList
		timeout time.Duration
	}{{&s.adds, addTimeout}, {&s.reads, readTimeout}} {
		if h := o.l.head; h != nil && h.expiry <= now && lastRecv < h.expiry-int64(o.timeout) {
			return true
		}
	}
	return false
}

func (s *pendingSet) expire(now int64, out *reqList) int {
	n := 0
	for _, l := range [2]*ageList{&s.adds, &s.reads} {
		for l.head != nil && l.head.expiry <= now {
			r := l.head
			s.remove(r)
			out.push(r)
			n++
		}
	}
	return n
}

// takeAll moves every pending request to out, adds first, each op oldest first.
func (s *pendingSet) takeAll(out *reqList) {
	for _, l := range [2]*ageList{&s.adds, &s.reads} {
		for r := l.head; r != nil; {
			next := r.nextAge
			r.prevSame, r.nextSame, r.tail, r.prevAge = nil, nil, nil, nil
			out.push(r)
			r = next
		}
		*l = ageList{}
	}
	s.byKey.reset()
	s.n = 0
}
