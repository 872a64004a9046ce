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
	// kind is the request's flags that change what the bookie does (kindFlags): requests for
	// one key with different kinds are never in flight together (see held).
	kind protocol.Flags
	// held is the encoded frame of a request held back because requests of another kind with
	// its key are in flight; nil once queued for sending.
	held []byte
	// ghost marks what is left in its key's chain of a request that timed out after it was
	// queued for sending: its callback has run, but the bookie may still answer it, so it
	// keeps its place (and its kind) until that answer comes, which it takes and drops, or
	// the connection ends. It is on no age list.
	ghost bool

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

// kindFlags are the flags that make the bookie treat a request differently: a fencing read
// fences, a recovery add may write to a fenced ledger. FlagHighPriority only orders work.
const kindFlags = protocol.FlagDoFencing | protocol.FlagRecoveryAdd

// pendingSet is a connection's requests in flight: by key (FIFO among duplicates, for
// matching responses) and by age per op (for timeouts). Guarded by the connection's mutex.
//
// A v2 response cannot say which of two requests with one key it answers, so two kinds never
// share a key on the wire: a key's chain is a prefix of requests sent (or queued), all of one
// kind, then the held ones in arrival order. When the prefix empties, the held run of the next
// kind is sent; held requests stay in the chain and age list, so they count toward the
// connection's limits and time out like the rest. Without a conflict nothing is held.
type pendingSet struct {
	byKey keyTable
	adds  ageList
	reads ageList
	n     int

	heldBytes int                // sum of len(held): counted as queued bytes
	send      func(frame []byte) // queues a released frame for the writer
	expiring  bool               // in expire: releases wait for recheck (see expire)
	recheck   []reqKey           // keys to release held requests of, after expire
}

func (s *pendingSet) ages(op protocol.OpCode) *ageList {
	if op == protocol.OpAddEntry {
		return &s.adds
	}
	return &s.reads
}

// insert adds r at the back of its key's chain and of its op's age list. It reports whether r
// must be held (then the caller passes its frame to hold instead of sending it): the chain
// holds requests already, or is in flight with another kind.
func (s *pendingSet) insert(r *request) (held bool) {
	r.prevSame, r.nextSame, r.tail = nil, nil, nil
	s.byKey.reserve()
	if i, ok := s.byKey.find(r.key); ok {
		head := s.byKey.slots[i].head
		last := head.tail
		last.nextSame, r.prevSame = r, last
		head.tail = r
		held = last.held != nil || last.kind != r.kind
	} else {
		r.tail = r
		s.byKey.fill(i, r)
	}
	s.ages(r.key.op).insertByExpiry(r)
	s.n++
	return held
}

// hold keeps r's encoded frame until the requests ahead of it of another kind are done.
func (s *pendingSet) hold(r *request, frame []byte) {
	r.held = frame
	s.heldBytes += len(frame)
}

// release sends the held requests from q on that share q's kind (q is the first held
// request of its chain, and nothing of another kind is in flight).
func (s *pendingSet) release(q *request) {
	for kind := q.kind; q != nil && q.held != nil && q.kind == kind; q = q.nextSame {
		frame := q.held
		q.held = nil
		s.heldBytes -= len(frame)
		s.send(frame)
	}
}

// releaseChain releases the first held run of the chain at head, if nothing of another kind
// is in flight ahead of it.
func (s *pendingSet) releaseChain(head *request) {
	q := head
	for q != nil && q.held == nil {
		q = q.nextSame
	}
	if q != nil && (q.prevSame == nil || q.prevSame.kind == q.kind) {
		s.release(q)
	}
}

// pop removes and returns the oldest request with key k, or nil. A chain's head is never held.
func (s *pendingSet) pop(k reqKey) *request {
	i, ok := s.byKey.lookup(k)
	if !ok {
		return nil
	}
	r := s.byKey.slots[i].head
	s.removeAt(r, i)
	return r
}

// remove takes r out of its chain and its age list; a held r is dropped unsent.
func (s *pendingSet) remove(r *request) {
	if r.held != nil { // not on pop's path: a chain's head is never held
		s.heldBytes -= len(r.held)
		r.held = nil
	}
	i := -1
	if r.prevSame == nil || r.nextSame == nil { // the chain's head or tail: its slot changes
		i, _ = s.byKey.find(r.key)
	}
	s.removeAt(r, i)
}

// removeAt is remove with i the slot of r's key (unused when r is inside its chain).
func (s *pendingSet) removeAt(r *request, i int) {
	prev, next := r.prevSame, r.nextSame
	switch {
	case r.prevSame == nil && r.nextSame == nil: // alone
		s.byKey.clearSlot(i)
	case r.prevSame == nil: // head of a longer chain
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
	if !r.ghost {
		s.ages(r.key.op).unlink(r)
	}
	s.n--
	// r may have been the last in flight ahead of a held run, or held between runs of one kind.
	if next != nil && next.held != nil && (prev == nil || prev.held == nil && prev.kind == next.kind) {
		if s.expiring {
			s.recheck = append(s.recheck, next.key)
		} else {
			s.release(next)
		}
	}
}

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

// expire moves every request whose deadline is at or before now to out and returns how many.
// Held requests are released only once every due request is out, so that none that is due
// gets sent. A due request that was queued for sending goes to out as a copy (its callback
// and ctx), and stays in its key's chain as a ghost until its late answer comes (see
// request.ghost): a request of another kind for its key stays held until then, so that it
// cannot take that answer.
func (s *pendingSet) expire(now int64, out *reqList) int {
	n := 0
	s.expiring = true
	for _, l := range [2]*ageList{&s.adds, &s.reads} {
		for l.head != nil && l.head.expiry <= now {
			r := l.head
			if r.held != nil {
				s.remove(r) // never sent: dropped
				out.push(r)
			} else {
				out.push(s.ghost(r))
			}
			n++
		}
	}
	s.expiring = false
	for _, k := range s.recheck {
		if i, ok := s.byKey.lookup(k); ok {
			s.releaseChain(s.byKey.slots[i].head)
		}
	}
	s.recheck = s.recheck[:0]
	return n
}

// ghost turns r, sent or queued for sending, into a ghost in its chain and returns a request
// that carries its callback, for the caller to finish.
func (s *pendingSet) ghost(r *request) *request {
	s.ages(r.key.op).unlink(r)
	c := getRequest()
	c.key, c.add, c.read, c.ctx, c.kind, c.expiry = r.key, r.add, r.read, r.ctx, r.kind, r.expiry
	r.add, r.read, r.ctx, r.ghost = nil, nil, nil, true
	return c
}

// takeAll moves every pending request to out, adds first, each op oldest first. Ghosts (on no
// age list) are left to the garbage collector with the table's contents.
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
	s.heldBytes = 0
}
