package transport

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// The tests of this file check that two requests for one key whose flags change what the
// bookie does (a fencing and a plain read, a recovery and a plain add) are never in flight
// together on a connection, so that neither can take the other's answer (see doc.go,
// Matching).

// markerLedger is the ledger of the read a test sends after the requests it checks: the fake
// bookie reads frames up to it to learn what was sent, without waiting on a clock.
const markerLedger = 99

// issue sends an add (with the ctx string as payload) or a read of entry of ledger 1.
func issue(conn *Conn, op protocol.OpCode, entry int64, flags protocol.Flags, col *collector, ctx string) {
	if op == protocol.OpAddEntry {
		conn.Add(1, entry, &keyA, flags, parts(1, entry, []byte(ctx)), col.onAdd, ctx)
		return
	}
	conn.Read(1, entry, flags, &keyA, col.onRead, ctx)
}

func sendMarker(conn *Conn, col *collector) {
	conn.Read(markerLedger, 0, 0, nil, col.onRead, "marker")
}

// untilMarker reads request frames up to the marker read and returns those before it.
func untilMarker(t *testing.T, fc *fakeConn) []protocol.Request {
	t.Helper()
	var before []protocol.Request
	for {
		req := fc.next(t)
		if req.Header.Op == protocol.OpReadEntry && req.Read.LedgerID == markerLedger {
			return before
		}
		before = append(before, req)
	}
}

// kindAnswer is what the fake bookie answers a request with: a fencing read gets "fenced" and
// a plain one "plain"; a recovery add is accepted and a plain add refused, as on a fenced
// ledger.
func kindAnswer(op protocol.OpCode, flags protocol.Flags) (protocol.ReturnCode, string) {
	switch {
	case op == protocol.OpAddEntry && flags.Has(protocol.FlagRecoveryAdd):
		return protocol.EOK, ""
	case op == protocol.OpAddEntry:
		return protocol.EFENCED, ""
	case flags.Has(protocol.FlagDoFencing):
		return protocol.EOK, "fenced"
	default:
		return protocol.EOK, "plain"
	}
}

func answer(t *testing.T, fc *fakeConn, req protocol.Request) {
	t.Helper()
	switch req.Header.Op {
	case protocol.OpAddEntry:
		rc, _ := kindAnswer(req.Header.Op, req.Header.Flags)
		fc.answerAdd(t, req.Add.LedgerID, req.Add.EntryID, rc)
	case protocol.OpReadEntry:
		if req.Read.LedgerID == markerLedger {
			fc.answerRead(t, req.Read.LedgerID, req.Read.EntryID, protocol.ENOENTRY, nil)
			return
		}
		rc, data := kindAnswer(req.Header.Op, req.Header.Flags)
		fc.answerRead(t, req.Read.LedgerID, req.Read.EntryID, rc, []byte(data))
	default:
		t.Fatalf("fake bookie: unexpected %v", req.Header.Op)
	}
}

// TestConflictingKindsGetTheirOwnAnswers: a fencing and a plain read of one entry (LAC read
// included), or a recovery and a plain add, issued back to back on one connection, against a
// bookie that answers the later one first whenever it has both. Each must get its own answer,
// which only holds if the second is not sent until the first is answered.
func TestConflictingKindsGetTheirOwnAnswers(t *testing.T) {
	const (
		fence    = protocol.FlagDoFencing | protocol.FlagHighPriority
		recovery = protocol.FlagRecoveryAdd | protocol.FlagHighPriority
	)
	for _, tc := range []struct {
		name          string
		op            protocol.OpCode
		entry         int64
		first, second protocol.Flags
	}{
		{"read/fence-then-plain", protocol.OpReadEntry, 5, fence, 0},
		{"read/plain-then-fence", protocol.OpReadEntry, 5, 0, protocol.FlagDoFencing},
		{"lac/fence-then-plain", protocol.OpReadEntry, protocol.LastAddConfirmedEntryID, protocol.FlagDoFencing, 0},
		{"lac/plain-then-fence", protocol.OpReadEntry, protocol.LastAddConfirmedEntryID, protocol.FlagHighPriority, fence},
		{"add/plain-then-recovery", protocol.OpAddEntry, 3, 0, recovery},
		{"add/recovery-then-plain", protocol.OpAddEntry, 3, protocol.FlagRecoveryAdd, protocol.FlagHighPriority},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFakeBookie(t)
			p := newPool(t, Config{})
			conn := p.Conn(fb.addr())
			col := newCollector(8)
			issue(conn, tc.op, tc.entry, tc.first, col, "first")
			issue(conn, tc.op, tc.entry, tc.second, col, "second")
			sendMarker(conn, col)

			fc := fb.accept(t)
			before := untilMarker(t, fc)
			for i := len(before) - 1; i >= 0; i-- { // the later one first
				answer(t, fc, before[i])
			}
			fc.answerRead(t, markerLedger, 0, protocol.ENOENTRY, nil)
			for range 2 - len(before) { // what was held goes out once the first is answered
				answer(t, fc, fc.next(t))
			}

			flags := map[any]protocol.Flags{"first": tc.first, "second": tc.second}
			for _, r := range col.wait(t, 3) {
				if r.ctx == "marker" {
					continue
				}
				rc, data := kindAnswer(tc.op, flags[r.ctx])
				if r.err != nil || r.rc != rc || string(r.entry) != data {
					t.Errorf("%v request got rc %v entry %q err %v, want rc %v entry %q (its own answer)",
						r.ctx, r.rc, r.entry, r.err, rc, data)
				}
			}
			if len(before) != 1 || before[0].Header.Flags != tc.first {
				t.Errorf("%d requests on the wire together, want only the first", len(before))
			}
			if st := conn.Stats(); st.Held != 1 || st.Pending != 0 || st.Unmatched != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestSameKindNotHeld: requests for one key of one kind (FlagHighPriority aside), and
// requests of different kinds for different keys, all go out at once, as before.
func TestSameKindNotHeld(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{})
	conn := p.Conn(fb.addr())
	col := newCollector(32)
	type rq struct {
		op    protocol.OpCode
		entry int64
		flags protocol.Flags
	}
	reqs := []rq{
		{protocol.OpReadEntry, 5, 0}, {protocol.OpReadEntry, 5, protocol.FlagHighPriority},
		{protocol.OpReadEntry, 6, protocol.FlagDoFencing}, {protocol.OpReadEntry, 6, protocol.FlagDoFencing | protocol.FlagHighPriority},
		{protocol.OpReadEntry, -1, 0}, {protocol.OpReadEntry, -1, 0},
		{protocol.OpAddEntry, 3, 0}, {protocol.OpAddEntry, 3, protocol.FlagHighPriority},
		{protocol.OpAddEntry, 4, protocol.FlagRecoveryAdd}, {protocol.OpAddEntry, 4, protocol.FlagRecoveryAdd},
		// Other kinds, other keys: an add and a fencing read of entry 3, a fencing read of 7
		// beside a plain one of 8.
		{protocol.OpReadEntry, 3, protocol.FlagDoFencing}, {protocol.OpReadEntry, 7, protocol.FlagDoFencing},
		{protocol.OpReadEntry, 8, 0},
	}
	for i, r := range reqs {
		issue(conn, r.op, r.entry, r.flags, col, fmt.Sprint(i))
	}
	sendMarker(conn, col)
	fc := fb.accept(t)
	before := untilMarker(t, fc)
	if len(before) != len(reqs) {
		t.Fatalf("%d of %d requests sent before the marker", len(before), len(reqs))
	}
	for _, req := range before {
		answer(t, fc, req)
	}
	fc.answerRead(t, markerLedger, 0, protocol.ENOENTRY, nil)
	for _, r := range col.wait(t, len(reqs)+1) {
		if r.err != nil {
			t.Fatalf("request %v: %v", r.ctx, r.err)
		}
	}
	if st := conn.Stats(); st.Held != 0 || st.Pending != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHeldRequestTimesOut: a held request whose deadline passes while the request ahead of it
// is still in flight fails with ErrTimeout and is never sent; the one ahead still gets its
// answer. (A held request's deadline can come first when its caller blocked on a full queue;
// the test moves it.)
func TestHeldRequestTimesOut(t *testing.T) {
	fb := newFakeBookie(t)
	p := newPool(t, Config{ReadTimeout: time.Minute})
	conn := p.Conn(fb.addr())
	col := newCollector(8)
	conn.Read(1, 5, protocol.FlagDoFencing, &keyA, col.onRead, "fence")
	conn.Read(1, 5, 0, nil, col.onRead, "plain")
	fc := fb.accept(t)

	conn.mu.Lock()
	i, ok := conn.pending.byKey.lookup(reqKey{ledgerID: 1, entryID: 5, op: protocol.OpReadEntry})
	if !ok || conn.pending.byKey.slots[i].head.nextSame == nil {
		conn.mu.Unlock()
		t.Fatal("the two reads are not pending")
	}
	plain := conn.pending.byKey.slots[i].head.nextSame
	conn.pending.reads.unlink(plain)
	plain.expiry = monotime.Now()
	conn.pending.reads.insertByExpiry(plain)
	conn.mu.Unlock()

	if r := col.one(t); r.ctx != "plain" || !errors.Is(r.err, ErrTimeout) {
		t.Fatalf("callback of %v: %v, want the plain read's ErrTimeout", r.ctx, r.err)
	}
	sendMarker(conn, col)
	before := untilMarker(t, fc)
	if len(before) != 1 || !before[0].Read.IsFencing() {
		t.Fatalf("%d requests sent, want only the fencing read", len(before))
	}
	answer(t, fc, before[0])
	fc.answerRead(t, markerLedger, 0, protocol.ENOENTRY, nil)
	for _, r := range col.wait(t, 2) {
		if r.err != nil || (r.ctx == "fence" && string(r.entry) != "fenced") {
			t.Fatalf("%v: entry %q err %v", r.ctx, r.entry, r.err)
		}
	}
	if st := conn.Stats(); st.Timeouts != 1 || st.Pending != 0 || st.Unmatched != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHeldRequestsFailWithConnection: when the connection is lost or the pool closed, held
// requests fail with the rest, each exactly once, without having been sent.
func TestHeldRequestsFailWithConnection(t *testing.T) {
	fb := newFakeBookie(t)
	p, err := NewPool(Config{Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	conn := p.Conn(fb.addr())
	col := newCollector(16)
	conn.Read(1, -1, protocol.FlagDoFencing, &keyA, col.onRead, "fence")
	conn.Read(1, -1, 0, nil, col.onRead, "plain")
	conn.Read(1, -1, protocol.FlagDoFencing, &keyA, col.onRead, "fence2") // held behind the plain one
	sendMarker(conn, col)
	fc := fb.accept(t)
	if before := untilMarker(t, fc); len(before) != 1 {
		t.Fatalf("%d requests sent, want only the first fencing read", len(before))
	}
	fc.close()
	got := map[any]int{}
	for _, r := range col.wait(t, 4) {
		if !errors.Is(r.err, ErrConnection) {
			t.Fatalf("%v: %v, want ErrConnection", r.ctx, r.err)
		}
		got[r.ctx]++
	}
	if len(got) != 4 {
		t.Fatalf("callbacks %v", got)
	}

	// The next connection: one held request again, then Close.
	conn.Add(1, 2, &keyA, 0, parts(1, 2, []byte("x")), col.onAdd, "add")
	conn.Add(1, 2, &keyA, protocol.FlagRecoveryAdd, parts(1, 2, []byte("x")), col.onAdd, "recovery")
	sendMarker(conn, col)
	fc = fb.accept(t)
	if before := untilMarker(t, fc); len(before) != 1 {
		t.Fatalf("%d requests sent, want only the plain add", len(before))
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if len(col.ch) != 3 { // every callback has run when Close returns, and no earlier one again
		t.Fatalf("%d callbacks after Close, want 3", len(col.ch))
	}
	for _, r := range col.wait(t, 3) {
		if !errors.Is(r.err, ErrClosed) {
			t.Fatalf("%v: %v, want ErrClosed", r.ctx, r.err)
		}
	}
	checkNoGoroutines(t)
}

// TestHeldRequestsCountTowardLimits: a held request takes a MaxPendingPerConn slot, and its
// frame counts toward MaxQueuedBytesPerConn: an add that does not fit beside a held one waits
// until it is released.
func TestHeldRequestsCountTowardLimits(t *testing.T) {
	t.Run("pending", func(t *testing.T) {
		fb := newFakeBookie(t)
		p := newPool(t, Config{MaxPendingPerConn: 2})
		conn := p.Conn(fb.addr())
		col := newCollector(8)
		conn.Read(1, 5, protocol.FlagDoFencing, &keyA, col.onRead, "fence")
		conn.Read(1, 5, 0, nil, col.onRead, "plain")
		conn.Read(1, 6, 0, nil, col.onRead, "third")
		if r := col.one(t); r.ctx != "third" || !errors.Is(r.err, ErrTooManyPending) {
			t.Fatalf("%v: %v, want ErrTooManyPending", r.ctx, r.err)
		}
		fc := fb.accept(t)
		answer(t, fc, fc.next(t)) // the fencing read; the plain one goes out after it
		answer(t, fc, fc.next(t))
		for _, r := range col.wait(t, 2) {
			if r.err != nil {
				t.Fatalf("%v: %v", r.ctx, r.err)
			}
		}
	})
	t.Run("bytes", func(t *testing.T) {
		fb := newFakeBookie(t)
		p := newPool(t, Config{MaxFrameSize: 4096, MaxQueuedBytesPerConn: 4096})
		conn := p.Conn(fb.addr())
		col := newCollector(8)
		payload := make([]byte, 3000)
		conn.Add(1, 2, &keyA, 0, parts(1, 2, payload), col.onAdd, "plain")
		fc := fb.accept(t)
		first := fc.next(t) // the queue is empty again
		conn.Add(1, 2, &keyA, protocol.FlagRecoveryAdd, parts(1, 2, payload), col.onAdd, "recovery")
		added := make(chan struct{})
		go func() {
			defer close(added)
			conn.Add(1, 3, &keyA, 0, parts(1, 3, payload), col.onAdd, "other")
		}()
		eventually(t, "the third add to block on the held one's bytes", func() bool {
			conn.mu.Lock()
			defer conn.mu.Unlock()
			return conn.space != nil
		})
		answer(t, fc, first)
		for _, want := range []int64{2, 3} { // the released one, then the one that waited
			req := fc.next(t)
			if req.Add.EntryID != want {
				t.Fatalf("sent entry %d, want %d", req.Add.EntryID, want)
			}
			answer(t, fc, req)
		}
		<-added
		for _, r := range col.wait(t, 3) {
			rc := protocol.EFENCED // plain adds, as on a fenced ledger
			if r.ctx == "recovery" {
				rc = protocol.EOK
			}
			if r.err != nil || r.rc != rc {
				t.Fatalf("%v: rc %v err %v", r.ctx, r.rc, r.err)
			}
		}
	})
}

// TestLateAnswerNeverAnswersAnotherKind: a request that times out after it was sent may still
// be answered, and a request of another kind for its key must not take that late answer: a
// recoverer's fencing read must not take a tailing reader's plain LAC read answer for proof of
// the fence (nor a plain read the fence's answer). So the other kind stays held until the late
// answer has come, whether it was issued before the timeout (held already) or after it.
func TestLateAnswerNeverAnswersAnotherKind(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second protocol.Flags
		afterTimeout  bool
	}{
		{"plain-then-fence/held", 0, protocol.FlagDoFencing, false},
		{"plain-then-fence/after", 0, protocol.FlagDoFencing, true},
		{"fence-then-plain/held", protocol.FlagDoFencing, 0, false},
		{"fence-then-plain/after", protocol.FlagDoFencing, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFakeBookie(t)
			p := newPool(t, Config{ReadTimeout: time.Minute})
			conn := p.Conn(fb.addr())
			col := newCollector(8)
			conn.Read(1, protocol.LastAddConfirmedEntryID, tc.first, &keyA, col.onRead, "first")
			if !tc.afterTimeout {
				conn.Read(1, protocol.LastAddConfirmedEntryID, tc.second, &keyA, col.onRead, "second")
			}
			fc := fb.accept(t)
			first := fc.next(t)

			// The first read times out (its deadline moved to now).
			conn.mu.Lock()
			i, ok := conn.pending.byKey.lookup(reqKey{ledgerID: 1, entryID: protocol.LastAddConfirmedEntryID, op: protocol.OpReadEntry})
			if !ok {
				conn.mu.Unlock()
				t.Fatal("the first read is not pending")
			}
			r := conn.pending.byKey.slots[i].head
			conn.pending.reads.unlink(r)
			r.expiry = monotime.Now()
			conn.pending.reads.insertByExpiry(r)
			conn.mu.Unlock()
			if r := col.one(t); r.ctx != "first" || !errors.Is(r.err, ErrTimeout) {
				t.Fatalf("callback of %v: %v, want the first read's ErrTimeout", r.ctx, r.err)
			}
			if tc.afterTimeout {
				conn.Read(1, protocol.LastAddConfirmedEntryID, tc.second, &keyA, col.onRead, "second")
			}

			// The bookie answers the first read late, then the second.
			answer(t, fc, first)
			second := fc.next(t)
			if second.Header.Flags&kindFlags != tc.second {
				t.Fatalf("sent flags %v, want %v", second.Header.Flags, tc.second)
			}
			answer(t, fc, second)
			_, want := kindAnswer(protocol.OpReadEntry, tc.second)
			if r := col.one(t); r.ctx != "second" || r.err != nil || string(r.entry) != want {
				t.Fatalf("callback of %v: entry %q err %v, want %q", r.ctx, r.entry, r.err, want)
			}
			eventually(t, "the late answer dropped", func() bool { return conn.Stats().Unmatched == 1 })
			if st := conn.Stats(); st.Pending != 0 || st.Timeouts != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}
