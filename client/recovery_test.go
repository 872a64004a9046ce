package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// TestLostFenceMessage replays the first TLA+ counterexample (BookKeeper #2614): the writer
// has entry 0 on b2 only; the recoverer's fencing LAC read to b3 is lost; its recovery reads
// see entry 0 missing on b1 and b3 before b2 answers, so it closes the ledger empty. The
// writer's held add then reaches b3. Recovery reads carry the fence flag, so b3 is fenced by
// them and the late add is refused: the writer never gets an acknowledgement for an entry past
// the close point.
func TestLostFenceMessage(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	var w1conns sync.Map
	w1 := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		f := &faultConn{inner: conn, addr: addr}
		w1conns.Store(addr, f)
		return f
	})
	lh := createLedger(t, w1, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	b1, b2, b3 := ens[0], ens[1], ens[2]
	conn := func(m *sync.Map, addr string) *faultConn {
		v, _ := m.Load(addr)
		return v.(*faultConn)
	}
	// Entry 0 reaches b2 only: adds to b1 and b3 are held.
	for _, b := range []string{b1, b3} {
		w1.cfg.dial(b) // create the wrapper
		f := conn(&w1conns, b)
		f.mu.Lock()
		f.holdAdds = true
		f.mu.Unlock()
	}
	acked := make(chan error, 1)
	lh.AppendAsync(payload(lh.ID(), 0), func(_ int64, err error) { acked <- err })
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-acked:
		t.Fatalf("entry 0 completed with one copy: %v", err)
	default:
	}

	var w2conns sync.Map
	w2 := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		f := &faultConn{inner: conn, addr: addr}
		w2conns.Store(addr, f)
		return f
	})
	for _, b := range ens {
		w2.cfg.dial(b)
	}
	f3 := conn(&w2conns, b3)
	f3.mu.Lock()
	f3.failFencingLAC = true // the fence message to b3 is lost
	f3.mu.Unlock()
	f2 := conn(&w2conns, b2)
	f2.mu.Lock()
	f2.holdReads = true // b2's answers come late
	f2.mu.Unlock()
	rh, err := w2.OpenLedger(ctx, lh.ID(), password, true)
	f2.releaseReads()
	if err != nil {
		t.Fatal(err)
	}
	md := rh.Metadata()
	if md.State != metadata.StateClosed {
		t.Fatalf("not closed: %+v", md)
	}
	// The writer's held add to b3 now arrives (b1's stays held: with b2's earlier ack, b3's
	// would be the second acknowledgement).
	conn(&w1conns, b3).releaseAdds()
	select {
	case err := <-acked:
		if err == nil && md.LastEntryID < 0 {
			t.Fatalf("entry 0 was acknowledged to the writer but the ledger was closed empty: data loss")
		}
		if err != nil && !errors.Is(err, ErrLedgerFenced) {
			t.Logf("entry 0 failed with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("entry 0 never completed")
	}
	conn(&w1conns, b1).releaseAdds()
	t.Logf("closed at %d", md.LastEntryID)
}

// TestRecoveryFromLACMinusOneInANewFragment replays the second TLA+ counterexample (#2615): the
// last ensemble is a new fragment whose bookies hold nothing (they answer LAC −1). Recovery
// must start from the fragment's first entry − 1, not from −1, close at the last entry of the
// previous fragment and leave the ensembles valid.
func TestRecoveryFromLACMinusOneInANewFragment(t *testing.T) {
	c := clustertest.Start(t, 4)
	ctx := context.Background()
	cl := newClient(t, c, nil)
	lh := createLedger(t, cl, 2, 2, 2)
	appendN(t, lh, 10)
	first := lh.Metadata().Ensembles[0].Bookies
	var others []string
	for _, b := range c.BookieAddrs() {
		if !containsStr(first, b) {
			others = append(others, b)
		}
	}
	// The writer "changed ensemble" at entry 10 to two fresh bookies, then died.
	if _, _, err := metadata.UpdateLedger(ctx, cl.md.Ledgers(), lh.ID(), func(m *metadata.LedgerMetadata) error {
		m.Ensembles = append(m.Ensembles, metadata.Ensemble{FirstEntryID: 10, Bookies: others})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rh, err := newClient(t, c, nil).OpenLedger(ctx, lh.ID(), password, true)
	if err != nil {
		t.Fatal(err)
	}
	md := rh.Metadata()
	if md.State != metadata.StateClosed || md.LastEntryID != 9 {
		t.Fatalf("closed at %d (%v), want 9", md.LastEntryID, md.State)
	}
	if err := md.Validate(); err != nil || len(md.Ensembles) != 2 {
		t.Fatalf("ensembles after recovery: %+v (%v)", md.Ensembles, err)
	}
	checkEntries(t, rh, 9)
}

// TestRecoveryWithABookieDown recovers while one bookie of the ensemble is down, then again
// after it is back; concurrent recoverers agree on the end.
func TestRecoveryWithABookieDownAndConcurrentRecoverers(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	w := newClient(t, c, nil)
	lh := createLedger(t, w, 3, 3, 2)
	appendN(t, lh, 100)
	down := lh.Metadata().Ensembles[0].Bookies[2]
	idx := -1
	for i, a := range c.BookieAddrs() {
		if a == down {
			idx = i
		}
	}
	if err := c.StopBookie(ctx, idx); err != nil {
		t.Fatal(err)
	}
	const recoverers = 3
	results := make([]int64, recoverers)
	errs := make([]error, recoverers)
	var wg sync.WaitGroup
	for i := range recoverers {
		wg.Go(func() {
			rh, err := newClient(t, c, nil).OpenLedger(ctx, lh.ID(), password, true)
			errs[i] = err
			if err == nil {
				results[i] = rh.Metadata().LastEntryID
			}
		})
	}
	wg.Wait()
	for i := range recoverers {
		if errs[i] != nil {
			t.Fatalf("recoverer %d: %v", i, errs[i])
		}
		if results[i] != 99 {
			t.Fatalf("recoverer %d closed at %d, want 99 (all agree: %v)", i, results[i], results)
		}
	}
	if err := c.StartBookie(ctx, idx); err != nil {
		t.Fatal(err)
	}
	rh, err := newClient(t, c, nil).OpenLedger(ctx, lh.ID(), password, true)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, rh, 99)
}

// TestCorruptReplica: one replica returns damaged bytes. Reads succeed from another replica,
// and recovery does not truncate (a digest mismatch never counts as missing).
func TestCorruptReplica(t *testing.T) {
	c := clustertest.Start(t, 3)
	w := newClient(t, c, nil)
	lh := createLedger(t, w, 3, 3, 2)
	appendN(t, lh, 30)
	bad := lh.Metadata().Ensembles[0].Bookies[0]
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		return &faultConn{inner: conn, addr: addr, corruptReads: addr == bad}
	})
	recoverAt(t, r, lh, 29)
}

// TestRecoveryReplacesADownBookie: with (3,2,2) and a bookie of the write set of the entries
// after the LAC down, a recovery add reaches only one bookie. Recovery replaces the down bookie
// (a new ensemble from that entry, written only with the close), closes the ledger at the last
// entry and every entry stays readable.
func TestRecoveryReplacesADownBookie(t *testing.T) {
	c := clustertest.Start(t, 4)
	ctx := context.Background()
	w := newClient(t, c, nil)
	lh := createLedger(t, w, 3, 2, 2)
	appendN(t, lh, 100)
	ens := lh.Metadata().Ensembles[0].Bookies
	// Entry 99 carries LAC 98, so recovery re-adds entry 99, whose write set is ens[0], ens[1].
	down := ens[0]
	idx := slices.Index(c.BookieAddrs(), down)
	if err := c.StopBookie(ctx, idx); err != nil {
		t.Fatal(err)
	}
	rh, err := newClient(t, c, nil).OpenLedger(ctx, lh.ID(), password, true)
	if err != nil {
		t.Fatalf("recovery with a bookie of the write set down: %v", err)
	}
	md := rh.Metadata()
	if md.State != metadata.StateClosed || md.LastEntryID != 99 {
		t.Fatalf("closed at %d (%v), want 99", md.LastEntryID, md.State)
	}
	if err := md.Validate(); err != nil || len(md.Ensembles) != 2 || md.Ensembles[1].FirstEntryID != 99 ||
		slices.Contains(md.Ensembles[1].Bookies, down) {
		t.Fatalf("ensembles after recovery: %+v (%v), want a new one from entry 99 without %s", md.Ensembles, err, down)
	}
	checkEntries(t, rh, 99)
}

// recoveryAdds intercepts a bookie's recovery adds and counts them: the n-th (from 1) is held
// for delay(n), then failed with a timeout if fail(n), else sent (nil funcs: no delay, no fail).
type recoveryAdds struct {
	bookieConn
	delay func(n int32) time.Duration
	fail  func(n int32) bool
	adds  atomic.Int32
}

func (f *recoveryAdds) Add(ledgerID, entryID int64, key *[20]byte, flags protocol.Flags, entry [][]byte, cb transport.AddCallback, ctx any) {
	if !flags.Has(protocol.FlagRecoveryAdd) {
		f.bookieConn.Add(ledgerID, entryID, key, flags, entry, cb, ctx)
		return
	}
	n := f.adds.Add(1)
	var delay time.Duration
	if f.delay != nil {
		delay = f.delay(n)
	}
	failIt := f.fail != nil && f.fail(n)
	if delay == 0 && !failIt {
		f.bookieConn.Add(ledgerID, entryID, key, flags, entry, cb, ctx)
		return
	}
	go func() {
		time.Sleep(delay)
		if failIt {
			cb(ctx, 0, transport.ErrTimeout)
			return
		}
		f.bookieConn.Add(ledgerID, entryID, key, flags, entry, cb, ctx)
	}()
}

func always(int32) bool { return true }

// ledgerWithUnconfirmedTail creates a (3,3,2) ledger on c with entries 0-19 appended one at a
// time and 20-25 all at once: recovery re-adds (at least) the last ones.
func ledgerWithUnconfirmedTail(t *testing.T, c *cluster.Cluster) *Ledger {
	t.Helper()
	lh := createLedger(t, newClient(t, c, nil), 3, 3, 2)
	appendN(t, lh, 20)
	appendUnconfirmed(t, lh, 20, 6)
	return lh
}

// appendUnconfirmed appends entries first to first+n-1 in flight at once, so that the LAC
// they carry lags and recovery re-adds most of them.
func appendUnconfirmed(t *testing.T, lh *Ledger, first, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := first; i < first+n; i++ {
		wg.Add(1)
		lh.AppendAsync(payload(lh.ID(), int64(i)), func(_ int64, err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		})
	}
	wg.Wait()
}

// TestRecoveryQuarantinesFailingBookies: a bookie of the ensemble and the only spare both fail
// recovery adds. The spare replaces the first once, fails too, and neither is tried again: the
// entries are closed on their ack quorum under the original ensemble (not one new ensemble per
// entry, alternating between the two), and every entry is readable.
func TestRecoveryQuarantinesFailingBookies(t *testing.T) {
	c := clustertest.Start(t, 4)
	ctx := context.Background()
	w := newClient(t, c, nil)
	lh := createLedger(t, w, 3, 3, 2)
	appendUnconfirmed(t, lh, 0, 60)
	ens := lh.Metadata().Ensembles[0].Bookies
	spare := spareOf(t, c, ens)
	faults := map[string]*recoveryAdds{}
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		if addr == ens[1] || addr == spare {
			faults[addr] = &recoveryAdds{bookieConn: conn, fail: always}
			return faults[addr]
		}
		return conn
	})
	rh, err := r.OpenLedger(ctx, lh.ID(), password, true)
	if err != nil {
		t.Fatal(err)
	}
	md := rh.Metadata()
	if md.LastEntryID != 59 || len(md.Ensembles) != 1 {
		t.Fatalf("closed at %d with ensembles %+v, want 59 with the original one", md.LastEntryID, md.Ensembles)
	}
	for addr, f := range faults {
		if n := f.adds.Load(); n != 1 {
			t.Errorf("%s was sent %d recovery adds, want 1 (then quarantined)", addr, n)
		}
	}
	checkEntries(t, rh, 59)
}

// TestRecoveryWithAHungBookie: a bookie that never answers recovery adds (they time out) is
// waited for once, after an ack quorum took the entry, then left out: recovery does not pay
// its timeout for every entry.
func TestRecoveryWithAHungBookie(t *testing.T) {
	c := clustertest.Start(t, 3)
	lh := ledgerWithUnconfirmedTail(t, c)
	hung := lh.Metadata().Ensembles[0].Bookies[1]
	var f *recoveryAdds
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		if addr == hung {
			f = &recoveryAdds{bookieConn: conn, fail: always, delay: func(int32) time.Duration { return time.Minute }} // long after the test
			return f
		}
		return conn
	})
	recoverAt(t, r, lh, 25)
	if n := f.adds.Load(); n != 1 {
		t.Fatalf("the hung bookie was sent %d recovery adds, want 1", n)
	}
}

// TestRecoveryRetriesAQuarantinedBookieWhenNeeded: a bookie slow once is quarantined (skipped
// while the others make an ack quorum); when another then fails and no bookie can replace
// them, the slow one is asked again, and recovery completes.
func TestRecoveryRetriesAQuarantinedBookieWhenNeeded(t *testing.T) {
	c := clustertest.Start(t, 3)
	lh := ledgerWithUnconfirmedTail(t, c)
	ens := lh.Metadata().Ensembles[0].Bookies
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		switch addr {
		case ens[0]: // slow once: its first recovery add answers after the straggler wait
			return &recoveryAdds{bookieConn: conn, delay: func(n int32) time.Duration {
				if n == 1 {
					return recoveryStragglerWait + 500*time.Millisecond
				}
				return 0
			}}
		case ens[2]: // fails every recovery add after its first
			return &recoveryAdds{bookieConn: conn, fail: func(n int32) bool { return n > 1 }}
		}
		return conn
	})
	recoverAt(t, r, lh, 25)
}

// TestRecoveryWithACorruptFencedReplicaAndABookieDown: (3,3,2), one bookie down and another
// answering with damaged entries. That one answered the fencing read with EOK, so it is fenced
// (only its LAC is unknown): recovery must complete from the third bookie and keep every entry.
func TestRecoveryWithACorruptFencedReplicaAndABookieDown(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	lh := createLedger(t, newClient(t, c, nil), 3, 3, 2)
	appendN(t, lh, 30)
	ens := lh.Metadata().Ensembles[0].Bookies
	bad, down := ens[0], ens[2]
	if err := c.StopBookie(ctx, slices.Index(c.BookieAddrs(), down)); err != nil {
		t.Fatal(err)
	}
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		return &faultConn{inner: conn, addr: addr, corruptReads: addr == bad}
	})
	recoverAt(t, r, lh, 29)
}

// TestFencedWriterLearnsItWasFenced: after a recoverer closed the ledger, the writer's next add
// fails first on a bookie that errors, before the fenced bookies answer. With a spare bookie
// (the ensemble change finds the ledger closed) or without (no replacement), the writer must
// learn that it was fenced, and so must its Close.
func TestFencedWriterLearnsItWasFenced(t *testing.T) {
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprint(n, " bookies"), func(t *testing.T) {
			c := clustertest.Start(t, n)
			ctx := context.Background()
			var conns sync.Map
			w := newClient(t, c, wrapConns(&conns))
			waitWritable(t, w, n)
			lh := createLedger(t, w, 3, 3, 2)
			appendN(t, lh, 10)
			if _, err := newClient(t, c, nil).OpenLedger(ctx, lh.ID(), password, true); err != nil {
				t.Fatal(err)
			}
			ens := lh.Metadata().Ensembles[0].Bookies
			var held []*faultConn
			for _, b := range ens {
				f := faultConnOf(t, w, &conns, b)
				holdAdds(f)
				held = append(held, f)
			}
			done := make(chan error, 1)
			lh.AppendAsync(payload(lh.ID(), 10), func(_ int64, err error) { done <- err })
			time.Sleep(50 * time.Millisecond)
			held[2].failAdds() // this error arrives first
			time.Sleep(300 * time.Millisecond)
			held[0].releaseAdds() // the fenced bookies' answers come later
			held[1].releaseAdds()
			if err := <-done; !errors.Is(err, ErrLedgerFenced) {
				t.Errorf("append after the ledger was recovered: %v, want ErrLedgerFenced", err)
			}
			if err := lh.Close(ctx); !errors.Is(err, ErrLedgerFenced) {
				t.Errorf("Close of the fenced writer: %v, want ErrLedgerFenced", err)
			}
		})
	}
}

// recoverAt opens lh on cl with recovery and checks that the ledger was closed at last with
// every entry readable; it returns the recovered handle.
func recoverAt(t *testing.T, cl *Client, lh *Ledger, last int64) *Ledger {
	t.Helper()
	rh, err := cl.OpenLedger(context.Background(), lh.ID(), password, true)
	if err != nil {
		t.Fatalf("recovery: %v", err)
	}
	if md := rh.Metadata(); md.State != metadata.StateClosed || md.LastEntryID != last {
		t.Fatalf("closed at %d (%v), want %d", md.LastEntryID, md.State, last)
	}
	checkEntries(t, rh, last)
	return rh
}

// TestRecoveryWritesCarryTheFrozenLAC: the writer pipelined entries 0-5 before any was
// acknowledged, so each carries LAC −1 and recovery re-adds all of them. Every recovery add
// must carry the LAC recovery started from (−1), not one that moves with the entries it
// re-adds: a reader would otherwise learn of entries that no recoverer may end up keeping
// (the TLA+ model's "freeze LAC of recovery writes").
func TestRecoveryWritesCarryTheFrozenLAC(t *testing.T) {
	c := clustertest.Start(t, 3)
	var conns sync.Map
	w := newClient(t, c, wrapConns(&conns))
	lh := createLedger(t, w, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	for _, b := range ens {
		holdAdds(faultConnOf(t, w, &conns, b))
	}
	log := newAckLog(6)
	for i := int64(0); i < 6; i++ {
		log.append(lh, i, payload(lh.ID(), i))
	}
	for _, b := range ens {
		faultConnOf(t, w, &conns, b).releaseAdds()
	}
	log.wait(t)

	var mu sync.Mutex
	lacs := map[int64][]int64{} // entry → LAC of each of its recovery adds
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		return &recordingAdds{bookieConn: conn, record: func(entryID int64, flags protocol.Flags, entry [][]byte) {
			if flags.Has(protocol.FlagRecoveryAdd) {
				mu.Lock()
				lacs[entryID] = append(lacs[entryID], int64(binary.BigEndian.Uint64(entry[0][16:24])))
				mu.Unlock()
			}
		}}
	})
	recoverAt(t, r, lh, 5)
	mu.Lock()
	defer mu.Unlock()
	for e := int64(0); e < 6; e++ {
		if len(lacs[e]) != 3 {
			t.Errorf("entry %d: %d recovery adds, want 3 (its write quorum)", e, len(lacs[e]))
		}
		for _, lac := range lacs[e] {
			if lac != -1 {
				t.Errorf("entry %d was re-added with LAC %d, want the frozen LAC -1", e, lac)
			}
		}
	}
}

// recordingAdds shows record every add before sending it.
type recordingAdds struct {
	bookieConn
	record func(entryID int64, flags protocol.Flags, entry [][]byte)
}

func (r *recordingAdds) Add(ledgerID, entryID int64, key *[20]byte, flags protocol.Flags, entry [][]byte, cb transport.AddCallback, ctx any) {
	r.record(entryID, flags, entry)
	r.bookieConn.Add(ledgerID, entryID, key, flags, entry, cb, ctx)
}

// TestBookiesRestartedMidFence: every bookie restarts after the recoverer fenced the ledger,
// while its recovery reads are still in flight. The fence must outlive the restart: the old
// writer's next add is refused, recovery completes after the restart, and the writer holds no
// acknowledgement past the closed end.
func TestBookiesRestartedMidFence(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	lh := createLedger(t, newClient(t, c, nil), 3, 3, 2)
	appendN(t, lh, 10)
	var conns sync.Map
	r := newClient(t, c, wrapConns(&conns))
	for _, b := range c.BookieAddrs() {
		f := faultConnOf(t, r, &conns, b)
		f.mu.Lock()
		f.holdReads = true // the fencing LAC reads pass; recovery reads answer late
		f.mu.Unlock()
	}
	type result struct {
		rh  *Ledger
		err error
	}
	recovered := make(chan result, 1)
	go func() {
		rh, err := r.OpenLedger(ctx, lh.ID(), password, true)
		recovered <- result{rh, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		held := 0
		for _, b := range c.BookieAddrs() {
			f := faultConnOf(t, r, &conns, b)
			f.mu.Lock()
			held += len(f.heldReads)
			f.mu.Unlock()
		}
		if held > 0 {
			break // fenced: recovery reads go out only after the fencing reads
		}
		if time.Now().After(deadline) {
			t.Fatal("no recovery read was answered")
		}
	}
	for i := range c.Size() {
		if err := c.StopBookie(ctx, i); err != nil {
			t.Fatal(err)
		}
		if err := c.StartBookie(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	id, appendErr := lh.Append(actx, payload(lh.ID(), 10))
	for _, b := range c.BookieAddrs() {
		faultConnOf(t, r, &conns, b).releaseReads()
	}
	res := <-recovered
	if res.err != nil {
		t.Fatalf("recovery across the restart: %v", res.err)
	}
	md := res.rh.Metadata()
	if appendErr == nil && id > md.LastEntryID {
		t.Fatalf("entry %d was acknowledged to the fenced writer, but the ledger was closed at %d: data loss", id, md.LastEntryID)
	}
	if appendErr == nil {
		t.Fatalf("the fenced writer's add was acknowledged (entry %d) after the bookies restarted", id)
	}
	if !errors.Is(appendErr, ErrLedgerFenced) {
		t.Errorf("the fenced writer's add: %v, want ErrLedgerFenced", appendErr)
	}
	if md.LastEntryID != 9 {
		t.Fatalf("closed at %d, want 9", md.LastEntryID)
	}
	checkEntries(t, res.rh, 9)
}

// blackHole never answers: requests vanish, as to a bookie that hangs without closing its
// connection.
type blackHole struct{ bookieConn }

func (blackHole) Read(context.Context, int64, int64, protocol.Flags, *[20]byte, transport.ReadCallback, any) {
}
func (blackHole) Add(int64, int64, *[20]byte, protocol.Flags, [][]byte, transport.AddCallback, any) {
}

// TestRecoveryWithABlackHoledBookie: one bookie of a (3,3,2) ledger answers nothing at all:
// not the fencing read, not recovery reads, not recovery adds (BookKeeper #1067: one hung
// bookie stalled recovery forever). Fencing, reads and the missing end are all decided by the
// other two, so recovery completes, well within the hung bookie's timeouts, and keeps every
// entry.
func TestRecoveryWithABlackHoledBookie(t *testing.T) {
	c := clustertest.Start(t, 3)
	lh := ledgerWithUnconfirmedTail(t, c)
	hung := lh.Metadata().Ensembles[0].Bookies[1]
	r := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		if addr == hung {
			return blackHole{conn}
		}
		return conn
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rh, err := r.OpenLedger(ctx, lh.ID(), password, true)
	if err != nil {
		t.Fatalf("recovery with one bookie hung: %v", err)
	}
	if md := rh.Metadata(); md.State != metadata.StateClosed || md.LastEntryID != 25 {
		t.Fatalf("closed at %d (%v), want 25", md.LastEntryID, md.State)
	}
	checkEntries(t, rh, 25)
}
