package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// answerOrder orders bookies' answers to reads of the same entry: the answers of some bookies
// are counted as they are delivered, and a gated answer is delivered only once n of them were.
type answerOrder struct {
	mu   sync.Mutex
	cond *sync.Cond
	seen map[int64]int // entry → counted answers delivered
}

func newAnswerOrder() *answerOrder {
	o := &answerOrder{seen: map[int64]int{}}
	o.cond = sync.NewCond(&o.mu)
	return o
}

// counted wraps cb so that its delivery counts for entryID; change, if set, changes the answer.
func (o *answerOrder) counted(entryID int64, cb transport.ReadCallback,
	change func(rc protocol.ReturnCode, entry []byte, err error) (protocol.ReturnCode, []byte, error)) transport.ReadCallback {
	return func(ctx any, rc protocol.ReturnCode, entry []byte, err error) {
		if change != nil {
			rc, entry, err = change(rc, entry, err)
		}
		cb(ctx, rc, entry, err)
		o.mu.Lock()
		o.seen[entryID]++
		o.cond.Broadcast()
		o.mu.Unlock()
	}
}

// after wraps cb so that it is called only once n counted answers for entryID were delivered
// (on its own goroutine, with a copy of the entry).
func (o *answerOrder) after(n int, entryID int64, cb transport.ReadCallback) transport.ReadCallback {
	return func(ctx any, rc protocol.ReturnCode, entry []byte, err error) {
		entry = append([]byte(nil), entry...)
		go func() {
			o.mu.Lock()
			for o.seen[entryID] < n {
				o.cond.Wait()
			}
			o.mu.Unlock()
			cb(ctx, rc, entry, err)
		}()
	}
}

func isRecoveryRead(entryID int64, flags protocol.Flags) bool {
	return entryID >= 0 && flags.Has(protocol.FlagDoFencing)
}

// TestRecoveryNeverCountsErrorsAsMissing: (3,3,2) with entries past the LAC that recovery must
// re-read. For every recovery read one bookie answers NoSuchEntry (as one that lost its copies
// would), a second one fails the read (EIO, a damaged copy, a timeout), and only then the
// third answers with its good copy. A failed read does not say that the entry is missing
// (BookKeeper #2908: an I/O error reported as NoSuchEntry truncated a ledger): counted as
// missing, it would make Qw−Qa+1 = 2 and recovery would close the ledger at its LAC, dropping
// acknowledged entries.
func TestRecoveryNeverCountsErrorsAsMissing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(rc protocol.ReturnCode, entry []byte, err error) (protocol.ReturnCode, []byte, error)
	}{
		{"EIO", func(protocol.ReturnCode, []byte, error) (protocol.ReturnCode, []byte, error) {
			return protocol.EIO, nil, nil
		}},
		{"damaged copy", func(rc protocol.ReturnCode, entry []byte, err error) (protocol.ReturnCode, []byte, error) {
			if rc == protocol.EOK {
				entry = append([]byte(nil), entry...)
				entry[len(entry)-1] ^= 0xff
			}
			return rc, entry, err
		}},
		{"timeout", func(protocol.ReturnCode, []byte, error) (protocol.ReturnCode, []byte, error) {
			return 0, nil, transport.ErrTimeout
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clustertest.Start(t, 3)
			lh := ledgerWithUnconfirmedTail(t, c) // 0..25 acknowledged, the last ones carrying a lagging LAC
			ens := lh.Metadata().Ensembles[0].Bookies
			order := newAnswerOrder()
			r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
				s := &scriptConn{bookieConn: conn, addr: addr}
				s.read = func(entryID int64, flags protocol.Flags, cb transport.ReadCallback, ctx any) bool {
					if !isRecoveryRead(entryID, flags) {
						return false
					}
					switch addr {
					case ens[0]:
						cb = order.counted(entryID, cb, func(protocol.ReturnCode, []byte, error) (protocol.ReturnCode, []byte, error) {
							return protocol.ENOENTRY, nil, nil
						})
					case ens[1]:
						cb = order.counted(entryID, cb, tc.answer)
					default: // the good copy answers last
						cb = order.after(2, entryID, cb)
					}
					// The bookie is asked all the same: a fencing read fences it first.
					conn.Read(context.Background(), lh.ID(), entryID, flags, &lh.key, cb, ctx)
					return true
				}
				return s
			})
			recoverAt(t, r, lh, 25)
		})
	}
}

// TestRecoveryStopsAtTheFirstMissingEntry: (5,3,2). The writer's entry 10 reaches one bookie
// of its write set (the other two hold it), entry 11 all three of its own, which differs: 11 is
// on an ack quorum but was never acknowledged, since 10 was not. Recovery sees 10 missing on
// two bookies (Qw−Qa+1) before the third answers, and must close at 9: not skip the gap to
// keep 11. Its reads fenced the bookies that hold 10 back, so the writer's held adds are then
// refused and it acknowledges nothing past 9.
func TestRecoveryStopsAtTheFirstMissingEntry(t *testing.T) {
	c := clustertest.Start(t, 5)
	ctx := context.Background()
	var held struct {
		sync.Mutex
		sends []func()
	}
	var ens []string
	w := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		return &scriptConn{bookieConn: conn, addr: addr, add: func(entryID int64, _ protocol.Flags, send func(), _ transport.AddCallback, _ any) bool {
			if entryID != 10 || addr == ens[0] {
				return false
			}
			held.Lock()
			held.sends = append(held.sends, send)
			held.Unlock()
			return true
		}}
	})
	waitWritable(t, w, 5)
	lh := createLedger(t, w, 5, 3, 2)
	ens = lh.Metadata().Ensembles[0].Bookies
	appendN(t, lh, 10)
	results := make(chan string, 2)
	for i := int64(10); i < 12; i++ {
		lh.AppendAsync(payload(lh.ID(), i), func(id int64, err error) { results <- fmt.Sprintf("entry %d: id %d, %v", i, id, err) })
	}
	// Entry 10 (write set ens[0..2]) is on ens[0] only; entry 11 (ens[1..3]) on all three.
	if got := copiesOn(t, w, lh, ens[:3], 10, map[string]bool{ens[1]: true, ens[2]: true}); len(got) != 1 {
		t.Fatalf("entry 10 is on %v, want %s only", got, ens[0])
	}
	if got := copiesOn(t, w, lh, ens[1:4], 11, nil); len(got) != 3 {
		t.Fatalf("entry 11 is on %v, want %v", got, ens[1:4])
	}
	select {
	case r := <-results:
		t.Fatalf("acknowledged before entry 10 reached an ack quorum: %s", r)
	default:
	}

	order := newAnswerOrder()
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		s := &scriptConn{bookieConn: conn, addr: addr}
		s.read = func(entryID int64, flags protocol.Flags, cb transport.ReadCallback, ctx any) bool {
			if entryID != 10 || !isRecoveryRead(entryID, flags) {
				return false
			}
			if addr == ens[0] { // its copy answers after the two "missing"
				cb = order.after(2, entryID, cb)
			} else {
				cb = order.counted(entryID, cb, nil)
			}
			conn.Read(context.Background(), lh.ID(), entryID, flags, &lh.key, cb, ctx)
			return true
		}
		return s
	})
	rh := recoverAt(t, r, lh, 9)
	if _, err := rh.Read(ctx, 10, 10); !errors.Is(err, ErrNoSuchEntry) {
		t.Fatalf("read of entry 10 past the end: %v", err)
	}

	held.Lock()
	sends := held.sends
	held.sends = nil
	held.Unlock()
	for _, send := range sends {
		send() // the writer's adds of entry 10 reach the bookies recovery fenced
	}
	for range 2 {
		select {
		case r := <-results:
			if !strings.Contains(r, ErrLedgerFenced.Error()) {
				t.Fatalf("after recovery closed the ledger at 9: %s, want ErrLedgerFenced", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the writer's adds never completed")
		}
	}
}

// TestFencingCoverageWithEnsembleLargerThanWriteQuorum: (6,3,2), whose write quorums are the
// six windows of three consecutive bookies, wrapping around. The fencing LAC read to two
// bookies is lost. Recovery may go on only if every window has fewer than Qa = 2 of them: so
// with bookies 0 and 3 (no window holds both), not with 1 and 3 (window 1-3), nor with 5 and 1
// (window 5,0,1, across the wrap). When it may not, it fails and leaves the ledger in
// recovery, not closed; a later recovery with every bookie answering keeps every entry.
func TestFencingCoverageWithEnsembleLargerThanWriteQuorum(t *testing.T) {
	c := clustertest.Start(t, 6)
	ctx := context.Background()
	w := newClient(t, c, nil)
	waitWritable(t, w, 6)
	for _, tc := range []struct {
		lost    [2]int
		covered bool
	}{{[2]int{0, 3}, true}, {[2]int{1, 3}, false}, {[2]int{5, 1}, false}} {
		t.Run(fmt.Sprint("lost ", tc.lost[0], ",", tc.lost[1]), func(t *testing.T) {
			lh := createLedger(t, w, 6, 3, 2)
			appendN(t, lh, 12)
			ens := lh.Metadata().Ensembles[0].Bookies
			lost := map[string]bool{ens[tc.lost[0]]: true, ens[tc.lost[1]]: true}
			r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
				return &faultConn{inner: conn, addr: addr, failFencingLAC: lost[addr]}
			})
			if tc.covered {
				recoverAt(t, r, lh, 11)
				return
			}
			if _, err := r.OpenLedger(ctx, lh.ID(), password, true); !errors.Is(err, ErrNotEnoughBookies) {
				t.Fatalf("recovery with write quorum %v not covered: %v, want ErrNotEnoughBookies", tc.lost, err)
			}
			if md, _, err := w.md.Ledgers().Read(ctx, lh.ID()); err != nil || md.State != metadata.StateInRecovery {
				t.Fatalf("after the refused recovery: %v (%v), want in recovery", md.State, err)
			}
			recoverAt(t, newClient(t, c, nil), lh, 11)
		})
	}
}

// TestReadReportsMissingOnlyWhenEveryReplicaDoes: two replicas of entry 5 answer NoSuchEntry
// (as bookies that lost it, or a replacement that never got it, would). With the third
// replica's good copy the read succeeds; with an I/O error from the third it fails, but not
// with ErrNoSuchEntry (the entry may well exist); with NoSuchEntry from all three it is
// ErrNoSuchEntry.
func TestReadReportsMissingOnlyWhenEveryReplicaDoes(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	lh := createLedger(t, newClient(t, c, nil), 3, 3, 2)
	appendN(t, lh, 10)
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ens := lh.Metadata().Ensembles[0].Bookies
	for _, third := range []protocol.ReturnCode{protocol.EOK, protocol.EIO, protocol.ENOENTRY} {
		t.Run(fmt.Sprint("third answers ", third), func(t *testing.T) {
			r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
				return &scriptConn{bookieConn: conn, addr: addr, read: func(entryID int64, _ protocol.Flags, cb transport.ReadCallback, ctx any) bool {
					switch {
					case entryID != 5:
						return false
					case addr != ens[2]:
						go cb(ctx, protocol.ENOENTRY, nil, nil)
					case third != protocol.EOK:
						go cb(ctx, third, nil, nil)
					default:
						return false
					}
					return true
				}}
			})
			rh, err := r.OpenLedger(ctx, lh.ID(), password, false)
			if err != nil {
				t.Fatal(err)
			}
			es, err := rh.Read(ctx, 5, 5)
			switch third {
			case protocol.EOK:
				if err != nil || len(es) != 1 || string(es[0].Payload) != string(payload(lh.ID(), 5)) {
					t.Fatalf("read with one good replica: %v", err)
				}
			case protocol.EIO:
				if err == nil || errors.Is(err, ErrNoSuchEntry) {
					t.Fatalf("read with one replica unknown: %v, want an error other than ErrNoSuchEntry", err)
				}
			default:
				if !errors.Is(err, ErrNoSuchEntry) {
					t.Fatalf("read with every replica missing: %v, want ErrNoSuchEntry", err)
				}
			}
		})
	}
}

// scriptedAdds holds or fails a writer's adds per bookie and entry, and records the LAC that
// each add carries in its header.
type scriptedAdds struct {
	mu     sync.Mutex
	action map[string]map[int64]string // bookie → entry → "hold" or "fail"
	held   map[string][]func()         // bookie → its held sends
	lacs   map[int64][]int64           // entry → the LAC of each of its sends
}

func newScriptedAdds() *scriptedAdds {
	return &scriptedAdds{action: map[string]map[int64]string{}, held: map[string][]func(){}, lacs: map[int64][]int64{}}
}

func (s *scriptedAdds) set(addr, action string, entries ...int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.action[addr] == nil {
		s.action[addr] = map[int64]string{}
	}
	for _, e := range entries {
		s.action[addr][e] = action
	}
}

// release sends addr's held adds and lets its later ones through.
func (s *scriptedAdds) release(addr string) {
	s.mu.Lock()
	held := s.held[addr]
	delete(s.held, addr)
	delete(s.action, addr)
	s.mu.Unlock()
	for _, send := range held {
		send()
	}
}

func (s *scriptedAdds) heldCount(addr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held[addr])
}

func (s *scriptedAdds) wrap(addr string, conn bookieConn) bookieConn {
	return &scriptedAddConn{bookieConn: conn, addr: addr, s: s}
}

type scriptedAddConn struct {
	bookieConn
	addr string
	s    *scriptedAdds
}

func (c *scriptedAddConn) Add(ledgerID, entryID int64, key *[20]byte, flags protocol.Flags, entry [][]byte, cb transport.AddCallback, ctx any) {
	send := func() { c.bookieConn.Add(ledgerID, entryID, key, flags, entry, cb, ctx) }
	s := c.s
	s.mu.Lock()
	s.lacs[entryID] = append(s.lacs[entryID], int64(binary.BigEndian.Uint64(entry[0][16:24])))
	action := s.action[c.addr][entryID]
	if action == "hold" {
		s.held[c.addr] = append(s.held[c.addr], send)
	}
	s.mu.Unlock()
	switch action {
	case "hold":
	case "fail":
		go cb(ctx, 0, transport.ErrConnection)
	default:
		send()
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// TestAckOfAReplacedBookieIsNotCounted: (3,3,2). ens[2] acknowledges entry 0 while ens[0] and
// ens[1] hold it, then fails entry 1: the ensemble change replaces ens[2] with the spare from
// entry 0 on (LAC+1). Entry 0 is then on one bookie of the fragment the metadata records for
// it, whatever ens[2] said, so ens[0]'s acknowledgement must not complete it: only the spare's
// can. Meanwhile the writer's next entry carries LAC −1, and the callbacks come in entry order.
func TestAckOfAReplacedBookieIsNotCounted(t *testing.T) {
	c := clustertest.Start(t, 4)
	ctx := context.Background()
	s := newScriptedAdds()
	w := newClient(t, c, s.wrap)
	waitWritable(t, w, 4)
	lh := createLedger(t, w, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	spare := spareOf(t, c, ens)
	s.set(ens[0], "hold", 0, 1)
	s.set(ens[1], "hold", 0, 1, 2)
	s.set(ens[2], "fail", 1)
	s.set(spare, "hold", 0, 1, 2)
	results := make(chan string, 4)
	appendOne := func(i int64) {
		lh.AppendAsync(payload(lh.ID(), i), func(id int64, err error) { results <- fmt.Sprintf("entry %d: id %d, err %v", i, id, err) })
	}
	// opState reports entry 0's acknowledgements and the handle's LAC, in one critical section.
	opState := func() (acked uint64, completed bool, lac int64) {
		lh.mu.Lock()
		defer lh.mu.Unlock()
		if len(lh.pending) == 0 || lh.pending[0].entryID != 0 {
			return 0, false, lh.lac
		}
		return lh.pending[0].acked, lh.pending[0].completed, lh.lac
	}

	appendOne(0)
	waitFor(t, "ens[2] acknowledges entry 0", func() bool { acked, _, _ := opState(); return acked == 1<<2 })
	appendOne(1) // ens[2] fails it: the ensemble change replaces ens[2] with the spare
	waitFor(t, "the ensemble change resends entries 0 and 1 to the spare", func() bool {
		lh.mu.Lock()
		changing := lh.changing
		lh.mu.Unlock()
		return !changing && s.heldCount(spare) == 2
	})
	if md := lh.Metadata(); len(md.Ensembles) != 1 || md.Ensembles[0].Bookies[2] != spare {
		t.Fatalf("ensembles after the change: %+v, want ens[2] replaced by %s from entry 0", md.Ensembles, spare)
	}
	if acked, completed, lac := opState(); acked != 0 || completed || lac != -1 {
		t.Fatalf("after the change entry 0 has acks %b (completed %v), LAC %d: the replaced bookie's ack still counts", acked, completed, lac)
	}
	appendOne(2)

	s.release(ens[0]) // one acknowledgement in the new fragment: not an ack quorum
	waitFor(t, "ens[0] acknowledges entry 0", func() bool { acked, _, _ := opState(); return acked == 1 })
	if _, completed, lac := opState(); completed || lac != -1 {
		t.Fatalf("entry 0 completed (LAC %d) with ens[0]'s ack and the replaced ens[2]'s", lac)
	}
	select {
	case r := <-results:
		t.Fatalf("called back with entry 0 on one bookie of its fragment: %s", r)
	default:
	}

	s.release(spare)
	for i := range int64(3) {
		select {
		case r := <-results:
			if want := fmt.Sprintf("entry %d: id %d, err <nil>", i, i); r != want {
				t.Fatalf("callback %d: %s, want %s", i, r, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("entry %d never acknowledged", i)
		}
	}
	s.release(ens[1])
	appendOne(3)
	if r := <-results; r != "entry 3: id 3, err <nil>" {
		t.Fatal(r)
	}
	s.mu.Lock()
	for e, want := range map[int64]int64{1: -1, 2: -1, 3: 2} {
		for _, lac := range s.lacs[e] {
			if lac != want {
				t.Errorf("entry %d was sent with LAC %d, want %d", e, lac, want)
			}
		}
	}
	s.mu.Unlock()
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ws := lh.Metadata().Ensembles[0].Bookies
	if held := copiesOn(t, w, lh, ws, 0, nil); len(held) != 3 {
		t.Fatalf("entry 0 is on %v of its fragment %v", held, ws)
	}
}

// TestConcurrentRecoverersWithDifferentEnds: (3,3,2), the writer's entry 10 is on ens[0]
// only. Recoverer B reads it from ens[0] first and re-adds it, but its recovery adds are held;
// recoverer A meanwhile sees entry 10 missing on ens[1] and ens[2] first and closes the ledger
// at 9. B then completes: its close finds the ledger closed, and B's handle must adopt A's end
// (9), not keep its own (10): two readers of the ledger must never see different contents.
func TestConcurrentRecoverersWithDifferentEnds(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	s := newScriptedAdds()
	w := newClient(t, c, s.wrap)
	lh := createLedger(t, w, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	appendN(t, lh, 10)
	s.set(ens[1], "hold", 10)
	s.set(ens[2], "hold", 10)
	writerResult := make(chan error, 1)
	lh.AppendAsync(payload(lh.ID(), 10), func(_ int64, err error) { writerResult <- err })
	waitFor(t, "entry 10 reaches ens[0]", func() bool {
		return len(copiesOn(t, w, lh, ens[:1], 10, map[string]bool{ens[0]: true})) == 1
	})

	// recoverer opens lh on a client whose recovery reads of entry 10 answer in an order: the
	// bookie first (ens[0] first) or last (after the two others).
	recoverer := func(ens0First bool, holdAdds *sync.WaitGroup, heldAdds *sync.WaitGroup) *Client {
		order := newAnswerOrder()
		return newClient(t, c, func(addr string, conn bookieConn) bookieConn {
			sc := &scriptConn{bookieConn: conn, addr: addr}
			sc.read = func(entryID int64, flags protocol.Flags, cb transport.ReadCallback, ctx any) bool {
				if entryID != 10 || !isRecoveryRead(entryID, flags) {
					return false
				}
				switch {
				case ens0First == (addr == ens[0]):
					cb = order.counted(entryID, cb, nil)
				case ens0First:
					cb = order.after(1, entryID, cb)
				default:
					cb = order.after(2, entryID, cb)
				}
				conn.Read(context.Background(), lh.ID(), entryID, flags, &lh.key, cb, ctx)
				return true
			}
			if holdAdds != nil {
				sc.add = func(entryID int64, flags protocol.Flags, send func(), _ transport.AddCallback, _ any) bool {
					if entryID != 10 || !flags.Has(protocol.FlagRecoveryAdd) {
						return false
					}
					heldAdds.Done()
					go func() { holdAdds.Wait(); send() }()
					return true
				}
			}
			return sc
		})
	}
	var gate, held sync.WaitGroup
	gate.Add(1)
	held.Add(3)
	b := recoverer(true, &gate, &held)
	bDone := make(chan error, 1)
	var bh *Ledger
	go func() {
		var err error
		bh, err = b.OpenLedger(ctx, lh.ID(), password, true)
		bDone <- err
	}()
	held.Wait() // B found entry 10 and is re-adding it
	ah := recoverAt(t, recoverer(false, nil, nil), lh, 9)
	gate.Done()
	if err := <-bDone; err != nil {
		t.Fatalf("recoverer B: %v", err)
	}
	if md := bh.Metadata(); md.State != metadata.StateClosed || md.LastEntryID != 9 || !md.Equal(ah.Metadata()) {
		t.Fatalf("recoverer B's handle: closed at %d (%v), want A's end 9", md.LastEntryID, md.State)
	}
	if last := bh.LastAddConfirmed(); last != 9 {
		t.Fatalf("recoverer B's handle has LAC %d, want 9", last)
	}
	if _, err := bh.Read(ctx, 10, 10); !errors.Is(err, ErrNoSuchEntry) {
		t.Fatalf("recoverer B reads entry 10 past the end: %v", err)
	}
	s.release(ens[1])
	s.release(ens[2])
	if err := <-writerResult; err == nil {
		t.Fatal("the writer's entry 10 was acknowledged after the ledger was closed at 9")
	}
}
