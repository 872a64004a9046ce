package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// gatedPlacement holds Replace (an ensemble change) until released.
type gatedPlacement struct {
	PlacementPolicy
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

func (g *gatedPlacement) Replace(ensemble []string, index, writeQuorum int, available []metadata.BookieInfo, excluded map[string]bool) (string, error) {
	g.once.Do(func() { close(g.entered) })
	<-g.gate
	return g.PlacementPolicy.Replace(ensemble, index, writeQuorum, available, excluded)
}

// gatePlacement makes cl's ensemble changes wait in Replace until gated.gate is closed.
func gatePlacement(cl *Client) *gatedPlacement {
	g := &gatedPlacement{PlacementPolicy: cl.cfg.Placement, entered: make(chan struct{}), gate: make(chan struct{})}
	cl.cfg.Placement = g
	return g
}

// wrapConns returns a wrap function for newClient that keeps each bookie's faultConn.
func wrapConns(conns *sync.Map) func(addr string, conn bookieConn) bookieConn {
	return func(addr string, conn bookieConn) bookieConn {
		f := &faultConn{inner: conn, addr: addr}
		conns.Store(addr, f)
		return f
	}
}

func faultConnOf(t *testing.T, cl *Client, conns *sync.Map, addr string) *faultConn {
	t.Helper()
	cl.cfg.dial(addr)
	v, ok := conns.Load(addr)
	if !ok {
		t.Fatalf("no connection to %s", addr)
	}
	return v.(*faultConn)
}

// TestCloseDuringAnEnsembleChange: with (3,3,2) an add completes on two bookies, then the
// third fails it and an ensemble change starts; Close, called while the change runs and no add
// is pending, waits for it and then closes the ledger (it used to wait for a wake-up that only
// popping an add gave, and hung).
func TestCloseDuringAnEnsembleChange(t *testing.T) {
	c := clustertest.Start(t, 4)
	ctx := context.Background()
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	gated := gatePlacement(cl)
	lh := createLedger(t, cl, 3, 3, 2)
	third := faultConnOf(t, cl, &conns, lh.Metadata().Ensembles[0].Bookies[2])
	third.mu.Lock()
	third.holdAdds = true
	third.mu.Unlock()
	if _, err := lh.Append(ctx, payload(lh.ID(), 0)); err != nil {
		t.Fatal(err)
	}
	third.failAdds()
	select {
	case <-gated.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no ensemble change")
	}
	closed := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		closed <- lh.Close(cctx)
	}()
	time.Sleep(100 * time.Millisecond) // let Close wait for the change
	close(gated.gate)
	if err := <-closed; err != nil {
		t.Fatalf("close after the ensemble change: %v", err)
	}
	if md := lh.Metadata(); md.State != metadata.StateClosed || md.LastEntryID != 0 || len(md.Ensembles) != 2 {
		t.Fatalf("metadata after close: %+v", md)
	}
}

// TestCallbackRunsAfterEverySend: with (3,3,2) the first two bookies can acknowledge an add
// before it has been handed to the third (a send that waits, as on a full queue). The callback,
// which releases the caller's buffer, must not run before that last send: the third bookie must
// store the bytes that were appended, not what the caller wrote into the buffer afterwards.
func TestCallbackRunsAfterEverySend(t *testing.T) {
	c := clustertest.Start(t, 3)
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	lh := createLedger(t, cl, 3, 3, 2)
	last := lh.Metadata().Ensembles[0].Bookies[2] // entry 0's last send goes to position 2
	slow := faultConnOf(t, cl, &conns, last)
	slow.mu.Lock()
	slow.addDelay = 300 * time.Millisecond
	slow.mu.Unlock()
	want, done := appendReusingBuffer(lh)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	readCopy(t, cl, lh, last, 0, want) // the third bookie's copy
}

// TestCloseAfterAFailedAdd: when no bookie can replace a failed one, the handle fails; Close
// still closes the ledger at the last acknowledged entry (BookKeeper closes failed handles), so
// readers see its end without having to recover it.
func TestCloseAfterAFailedAdd(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	cl := newClient(t, c, nil)
	lh := createLedger(t, cl, 3, 3, 2)
	appendN(t, lh, 5)
	if err := c.StopBookie(ctx, 0); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var appendErr error
	for i := 0; appendErr == nil && i < 100; i++ {
		_, appendErr = lh.Append(actx, payload(lh.ID(), int64(5+i)))
	}
	if !errors.Is(appendErr, ErrNotEnoughBookies) {
		t.Fatalf("appends with no bookie to replace the stopped one: %v", appendErr)
	}
	lac := lh.LastAddConfirmed()
	if err := lh.Close(ctx); err != nil {
		t.Fatalf("close of the failed handle: %v", err)
	}
	md, _, err := cl.md.Ledgers().Read(ctx, lh.ID())
	if err != nil {
		t.Fatal(err)
	}
	if md.State != metadata.StateClosed || md.LastEntryID != lac {
		t.Fatalf("after close: state %v, last entry %d, want closed at %d", md.State, md.LastEntryID, lac)
	}
}

// TestClientCloseFailsPendingAdds: adds in flight when the client closes fail with ErrClosed,
// each callback runs once, and no ensemble change is attempted (no bookie failed).
func TestClientCloseFailsPendingAdds(t *testing.T) {
	c := clustertest.Start(t, 3)
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	lh := createLedger(t, cl, 3, 3, 2)
	for _, b := range lh.Metadata().Ensembles[0].Bookies {
		f := faultConnOf(t, cl, &conns, b)
		f.mu.Lock()
		f.holdAdds = true // nothing is acknowledged
		f.mu.Unlock()
	}
	const n = 10
	results := make(chan error, 2*n)
	for i := range n {
		lh.AppendAsync(payload(lh.ID(), int64(i)), func(_ int64, err error) { results <- err })
	}
	for _, b := range lh.Metadata().Ensembles[0].Bookies {
		faultConnOf(t, cl, &conns, b).failAddsWith(transport.ErrClosed)
	}
	for range n {
		select {
		case err := <-results:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("pending add after close: %v, want ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a pending add was never called back")
		}
	}
	select {
	case err := <-results:
		t.Fatalf("a callback ran twice: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if md := lh.Metadata(); len(md.Ensembles) != 1 {
		t.Fatalf("ensembles after the client closed: %+v", md.Ensembles)
	}
}

// hungUpdates is a metadata driver whose ledger updates hang until their context is done, then
// fail as an etcd request cancelled in flight does.
type hungUpdates struct {
	metadata.Driver
	entered chan struct{}
	once    sync.Once
}

func (h *hungUpdates) Ledgers() metadata.LedgerStore { return hungLedgers{h.Driver.Ledgers(), h} }

type hungLedgers struct {
	metadata.LedgerStore
	h *hungUpdates
}

func (l hungLedgers) Update(ctx context.Context, id int64, _ *metadata.LedgerMetadata, _ metadata.Version) (metadata.Version, error) {
	l.h.once.Do(func() { close(l.h.entered) })
	<-ctx.Done()
	return 0, fmt.Errorf("metadata/etcd: update ledger %d: %w", id, ctx.Err())
}

// TestClientCloseDuringAnEnsembleChange: the client closes while an ensemble change is writing
// the new ensemble into the metadata. The add the change held back must fail with ErrClosed,
// as every add pending at Client.Close does, not with the metadata request's "context
// canceled".
func TestClientCloseDuringAnEnsembleChange(t *testing.T) {
	c := clustertest.Start(t, 4)
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	lh := createLedger(t, cl, 3, 3, 2)
	hung := &hungUpdates{Driver: cl.md, entered: make(chan struct{})}
	cl.md = hung
	ens := lh.Metadata().Ensembles[0].Bookies
	for _, b := range ens {
		holdAdds(faultConnOf(t, cl, &conns, b))
	}
	result := make(chan error, 2)
	lh.AppendAsync(payload(lh.ID(), 0), func(_ int64, err error) { result <- err })
	time.Sleep(100 * time.Millisecond)
	faultConnOf(t, cl, &conns, ens[2]).failAdds() // an ensemble change starts
	<-hung.entered
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-result:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("the add held back by the ensemble change: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the add held back by the ensemble change was never called back")
	}
}

func holdAdds(f *faultConn) {
	f.mu.Lock()
	f.holdAdds = true
	f.mu.Unlock()
}

// takeHeldAdds stops holding f's adds and returns, for each held one, a function that answers
// it with an error.
func takeHeldAdds(f *faultConn) []func(error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fails := f.heldAddFails
	f.heldAdds, f.heldAddFails, f.holdAdds = nil, nil, false
	return fails
}

// spareOf returns a bookie of c outside ensemble.
func spareOf(t *testing.T, c interface{ BookieAddrs() []string }, ensemble []string) string {
	t.Helper()
	for _, b := range c.BookieAddrs() {
		if !slices.Contains(ensemble, b) {
			return b
		}
	}
	t.Fatal("no spare bookie")
	return ""
}

// appendReusingBuffer appends entry 0 from a buffer its callback then overwrites, as a caller
// that reuses its buffer does. It returns the bytes appended and the callback's error.
func appendReusingBuffer(lh *Ledger) (want []byte, done <-chan error) {
	data := payload(lh.ID(), 0)
	want = bytes.Clone(data)
	errs := make(chan error, 1)
	lh.AppendAsync(data, func(_ int64, err error) {
		for i := range data {
			data[i] = 'X'
		}
		errs <- err
	})
	return want, errs
}

// readCopy reads entry from one bookie and checks its digest and payload.
func readCopy(t *testing.T, cl *Client, lh *Ledger, bookie string, entry int64, want []byte) {
	t.Helper()
	got := make(chan readResult, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		cl.cfg.dial(bookie).Read(context.Background(), lh.ID(), entry, 0, nil, readResponse, &readCtx{ch: got})
		r := <-got
		if r.err == nil && r.rc == protocol.EOK {
			e, err := lh.dg.verify(r.entry, lh.ID(), entry)
			if err != nil {
				t.Fatalf("%s's copy of entry %d: %v", bookie, entry, err)
			}
			if !bytes.Equal(e.Payload, want) {
				t.Fatalf("%s stored %q for entry %d, want %q", bookie, e.Payload, entry, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("read entry %d from %s: rc %v, %v", entry, bookie, r.rc, r.err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRefusedAppendIsCalledBackInOrder: an append refused because Close has begun is called back
// after the add still in flight before it.
func TestRefusedAppendIsCalledBackInOrder(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	lh := createLedger(t, cl, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	for _, b := range ens {
		holdAdds(faultConnOf(t, cl, &conns, b))
	}
	order := make(chan string, 2)
	lh.AppendAsync([]byte("a"), func(_ int64, err error) { order <- fmt.Sprint("first: ", err) })
	closed := make(chan error, 1)
	go func() { closed <- lh.Close(ctx) }()
	time.Sleep(100 * time.Millisecond) // Close is waiting for the first add
	lh.AppendAsync([]byte("b"), func(_ int64, err error) { order <- fmt.Sprint("second: ", err) })
	for _, b := range ens {
		faultConnOf(t, cl, &conns, b).releaseAdds()
	}
	if got, want := <-order, "first: <nil>"; got != want {
		t.Fatalf("first callback %q, want %q", got, want)
	}
	if got := <-order; !strings.HasPrefix(got, "second: ") || !strings.Contains(got, ErrLedgerClosed.Error()) {
		t.Fatalf("second callback %q, want ErrLedgerClosed", got)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// TestFailureDuringAnEnsembleChangesResend: the handle fails (here: the client's transport
// closes under it) while an ensemble change is still sending an add to the replacement bookie.
// The add's callback, which releases the caller's buffer, must wait for that send: the
// replacement must store the bytes that were appended.
func TestFailureDuringAnEnsembleChangesResend(t *testing.T) {
	c := clustertest.Start(t, 4)
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	lh := createLedger(t, cl, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	spare := spareOf(t, c, ens)
	b1, b2 := faultConnOf(t, cl, &conns, ens[1]), faultConnOf(t, cl, &conns, ens[2])
	holdAdds(b1)
	holdAdds(b2)
	sp := faultConnOf(t, cl, &conns, spare)
	sp.mu.Lock()
	sp.addDelay = 600 * time.Millisecond // the resend to the replacement is slow
	sp.mu.Unlock()
	want, done := appendReusingBuffer(lh)
	time.Sleep(100 * time.Millisecond)
	b2.failAdds() // the change replaces ens[2] with the spare and resends entry 0 to it
	time.Sleep(200 * time.Millisecond)
	b1.failAddsWith(transport.ErrClosed) // the handle fails while that resend is under way
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("entry 0: %v, want ErrClosed", err)
	}
	readCopy(t, cl, lh, spare, 0, want)
}

// TestFailureDuringAnEnsembleChangeLosesNoCallback: an add that completed while AppendAsync was
// still sending it (left for AppendAsync to deliver) is failed by a handle failure during an
// ensemble change; the change must not make it incomplete again, and its callback must run.
func TestFailureDuringAnEnsembleChangeLosesNoCallback(t *testing.T) {
	c := clustertest.Start(t, 4)
	ctx := context.Background()
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	gated := gatePlacement(cl)
	lh := createLedger(t, cl, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	b1, b2 := faultConnOf(t, cl, &conns, ens[1]), faultConnOf(t, cl, &conns, ens[2])
	holdAdds(faultConnOf(t, cl, &conns, spareOf(t, c, ens)))
	holdAdds(b2)
	if _, err := lh.Append(ctx, payload(lh.ID(), 0)); err != nil { // acknowledged by ens[0], ens[1]
		t.Fatal(err)
	}
	failEntry0 := takeHeldAdds(b2)
	holdAdds(b1)
	holdAdds(b2)
	results := make(chan string, 2)
	lh.AppendAsync(payload(lh.ID(), 1), func(_ int64, err error) { results <- fmt.Sprint("entry 1: ", err) })
	time.Sleep(100 * time.Millisecond)
	failEntry1 := takeHeldAdds(b1)
	b1.mu.Lock()
	b1.addDelay = 1500 * time.Millisecond // entry 2's send to ens[1] is slow...
	b1.mu.Unlock()
	go lh.AppendAsync(payload(lh.ID(), 2), func(_ int64, err error) { results <- fmt.Sprint("entry 2: ", err) })
	time.Sleep(200 * time.Millisecond)     // ...and ens[0], ens[2] have acknowledged it meanwhile
	failEntry0[0](transport.ErrConnection) // ens[2] fails entry 0: an ensemble change starts
	<-gated.entered
	failEntry1[0](transport.ErrClosed) // the handle fails during the change
	close(gated.gate)
	// ens[1] goes away before entry 2's slow send reaches it: no bookie will acknowledge entry
	// 2 again (its resend to the replacement stays held), so only the failure can complete it.
	if err := c.StopBookie(ctx, slices.Index(c.BookieAddrs(), ens[1])); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, results, 2)
}

// expectClosed waits for n results, each reporting ErrClosed.
func expectClosed(t *testing.T, results <-chan string, n int) {
	t.Helper()
	for range n {
		select {
		case r := <-results:
			if !strings.Contains(r, ErrClosed.Error()) {
				t.Fatalf("%s, want ErrClosed", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a callback never ran")
		}
	}
}

// returnsAfterTheGate runs f, checks that it has not returned after wait while gated holds an
// ensemble change, then opens the gate and returns what f returned.
func returnsAfterTheGate(t *testing.T, gated *gatedPlacement, wait time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		t.Fatalf("%s returned (%v) while an ensemble change was held", what, err)
	case <-time.After(wait):
	}
	close(gated.gate)
	return <-done
}

// failDuringChange starts an add on a (3,3,2) ledger of four bookies whose three bookies hold
// it, fails it on ens[2] so that an ensemble change starts (held by gated), and fails the handle
// on ens[1] during the change. It returns ens[0]'s connection, still holding the add.
func failDuringChange(t *testing.T, results chan<- string) (*Ledger, *gatedPlacement, *faultConn) {
	c := clustertest.Start(t, 4)
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	gated := gatePlacement(cl)
	lh := createLedger(t, cl, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	b0, b1, b2 := faultConnOf(t, cl, &conns, ens[0]), faultConnOf(t, cl, &conns, ens[1]), faultConnOf(t, cl, &conns, ens[2])
	holdAdds(b0)
	holdAdds(b1)
	holdAdds(b2)
	lh.AppendAsync(payload(lh.ID(), 0), func(_ int64, err error) { results <- fmt.Sprint("entry 0: ", err) })
	time.Sleep(100 * time.Millisecond)
	takeHeldAdds(b2)[0](transport.ErrConnection) // an ensemble change starts
	<-gated.entered
	takeHeldAdds(b1)[0](transport.ErrClosed) // the handle fails during it
	return lh, gated, b0
}

// TestLateAckAfterAFailure: an acknowledgement that arrives after the add failed (here during
// an ensemble change) must not make it incomplete again: it, and the appends refused after
// it, are called back.
func TestLateAckAfterAFailure(t *testing.T) {
	results := make(chan string, 2)
	lh, gated, b0 := failDuringChange(t, results)
	b0.releaseAdds() // ens[0] acknowledges entry 0 late: one ack of the two needed
	time.Sleep(100 * time.Millisecond)
	close(gated.gate)
	lh.AppendAsync([]byte("x"), func(_ int64, err error) { results <- fmt.Sprint("refused: ", err) })
	expectClosed(t, results, 2)
}

// TestCloseWaitsForFailedAddsDuringAChange: Close of a handle that failed during an ensemble
// change returns only after the change ended and the failed add was called back.
func TestCloseWaitsForFailedAddsDuringAChange(t *testing.T) {
	results := make(chan string, 1)
	lh, gated, _ := failDuringChange(t, results)
	if err := returnsAfterTheGate(t, gated, 200*time.Millisecond, "Close", func() error { return lh.Close(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-results:
		if !strings.Contains(r, ErrClosed.Error()) {
			t.Fatalf("%s, want ErrClosed", r)
		}
	default:
		t.Fatal("Close returned before the failed add was called back")
	}
}

// TestCloseReturnsAfterCallbacks: Close returns only once the callbacks of the adds it waited
// for have run (a slow first callback holds the second one).
func TestCloseReturnsAfterCallbacks(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	cl := newClient(t, c, nil)
	lh := createLedger(t, cl, 3, 3, 2)
	var ran atomic.Int32
	lh.AppendAsync(payload(lh.ID(), 0), func(int64, error) { time.Sleep(300 * time.Millisecond); ran.Add(1) })
	lh.AppendAsync(payload(lh.ID(), 1), func(int64, error) { ran.Add(1) })
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 2 {
		t.Fatalf("Close returned with %d of 2 callbacks run", n)
	}
}

// failingAdds answers every add with a connection error.
type failingAdds struct{ bookieConn }

func (f failingAdds) Add(_, _ int64, _ *[20]byte, _ protocol.Flags, _ [][]byte, cb transport.AddCallback, ctx any) {
	go cb(ctx, 0, transport.ErrConnection)
}

// recordingPlacement returns first for the first Replace and records what every Replace was
// told to exclude.
type recordingPlacement struct {
	PlacementPolicy
	first string
	mu    sync.Mutex
	calls []map[string]bool
}

func (p *recordingPlacement) Replace(ensemble []string, index, writeQuorum int, available []metadata.BookieInfo, excluded map[string]bool) (string, error) {
	p.mu.Lock()
	p.calls = append(p.calls, maps.Clone(excluded))
	n := len(p.calls)
	p.mu.Unlock()
	if n == 1 {
		return p.first, nil
	}
	return p.PlacementPolicy.Replace(ensemble, index, writeQuorum, available, excluded)
}

// waitWritable waits until cl sees n writable bookies (replacements are chosen among them).
func waitWritable(t *testing.T, cl *Client, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(cl.writableBookies()) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("the client sees %d writable bookies, want %d", len(cl.writableBookies()), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReplacedBookiesArePickedLast: a bookie of the ensemble fails, its replacement fails too;
// the second replacement excludes the bookie replaced first (two failing bookies would
// otherwise replace each other) and picks the healthy spare.
func TestReplacedBookiesArePickedLast(t *testing.T) {
	c := clustertest.Start(t, 5)
	ctx := context.Background()
	var failing sync.Map // addresses whose adds fail
	cl := newClient(t, c, failWhileListed(&failing))
	waitWritable(t, cl, 5)
	lh := createLedger(t, cl, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	var spares []string
	for _, b := range c.BookieAddrs() {
		if !slices.Contains(ens, b) {
			spares = append(spares, b)
		}
	}
	rec := &recordingPlacement{PlacementPolicy: cl.cfg.Placement, first: spares[0]}
	cl.cfg.Placement = rec
	failing.Store(ens[1], true)
	failing.Store(spares[0], true)
	if _, err := lh.Append(ctx, payload(lh.ID(), 0)); err != nil {
		t.Fatal(err)
	}
	// The add may complete on ens[0] and ens[2] before the first replacement fails it: the
	// second change can come after Append returned.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if last, _ := lh.Metadata().LastEnsemble(); slices.Contains(last.Bookies, spares[1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ensemble %v, want the healthy spare %s in it", lh.Metadata().Ensembles, spares[1])
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.calls) < 2 || !rec.calls[1][ens[1]] {
		t.Fatalf("replacements excluded %v, want the second to exclude %s", rec.calls, ens[1])
	}
}

// TestReplacedBookieIsPickedWhenNoOtherIsLeft: after a bookie was replaced (it restarted), a
// second failure finds no bookie outside the ensemble but the first one, healthy again: it is
// picked rather than failing the handle.
func TestReplacedBookieIsPickedWhenNoOtherIsLeft(t *testing.T) {
	c := clustertest.Start(t, 4)
	ctx := context.Background()
	var failing sync.Map // addresses whose adds fail
	cl := newClient(t, c, failWhileListed(&failing))
	waitWritable(t, cl, 4)
	lh := createLedger(t, cl, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	failing.Store(ens[1], true)
	if _, err := lh.Append(ctx, payload(lh.ID(), 0)); err != nil {
		t.Fatal(err)
	}
	failing.Delete(ens[1]) // back
	failing.Store(ens[2], true)
	for i := int64(1); i <= 3; i++ {
		if _, err := lh.Append(ctx, payload(lh.ID(), i)); err != nil {
			t.Fatalf("append %d after the second failure: %v", i, err)
		}
	}
	if last, _ := lh.Metadata().LastEnsemble(); !slices.Contains(last.Bookies, ens[1]) || slices.Contains(last.Bookies, ens[2]) {
		t.Fatalf("ensemble %v, want %s back in place of %s", last.Bookies, ens[1], ens[2])
	}
}

// TestReplacedBookieQuarantineEnds: once BookieQuarantineTime has passed, a bookie the handle
// replaced is a replacement like any other again.
func TestReplacedBookieQuarantineEnds(t *testing.T) {
	c := clustertest.Start(t, 5)
	ctx := context.Background()
	var failing sync.Map // addresses whose adds fail
	cl := newClient(t, c, failWhileListed(&failing))
	cl.cfg.BookieQuarantineTime = 200 * time.Millisecond
	waitWritable(t, cl, 5)
	lh := createLedger(t, cl, 3, 3, 2)
	ens := lh.Metadata().Ensembles[0].Bookies
	rec := &recordingPlacement{PlacementPolicy: cl.cfg.Placement, first: spareOf(t, c, ens)}
	cl.cfg.Placement = rec
	replacedEventually := func(b string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if last, _ := lh.Metadata().LastEnsemble(); !slices.Contains(last.Bookies, b) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("ensemble %v, want %s replaced", lh.Metadata().Ensembles, b)
			}
		}
	}
	failing.Store(ens[1], true)
	if _, err := lh.Append(ctx, payload(lh.ID(), 0)); err != nil {
		t.Fatal(err)
	}
	replacedEventually(ens[1])
	failing.Delete(ens[1])
	time.Sleep(300 * time.Millisecond)
	failing.Store(ens[2], true)
	for i := int64(1); i <= 3; i++ {
		if _, err := lh.Append(ctx, payload(lh.ID(), i)); err != nil {
			t.Fatal(err)
		}
	}
	replacedEventually(ens[2])
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.calls) < 2 || rec.calls[1][ens[1]] || !rec.calls[1][ens[2]] {
		t.Fatalf("replacements excluded %v; want the second to exclude %s and not %s", rec.calls, ens[2], ens[1])
	}
}

// failWhileListed wraps each bookie connection so that its adds fail while failing holds its
// address.
func failWhileListed(failing *sync.Map) func(addr string, conn bookieConn) bookieConn {
	return func(addr string, conn bookieConn) bookieConn {
		return &switchableConn{bookieConn: conn, fail: func() bool { _, ok := failing.Load(addr); return ok }}
	}
}

// switchableConn fails adds while fail says so.
type switchableConn struct {
	bookieConn
	fail func() bool
}

func (s *switchableConn) Add(ledgerID, entryID int64, key *[20]byte, flags protocol.Flags, entry [][]byte, cb transport.AddCallback, ctx any) {
	if s.fail() {
		failingAdds{}.Add(ledgerID, entryID, key, flags, entry, cb, ctx)
		return
	}
	s.bookieConn.Add(ledgerID, entryID, key, flags, entry, cb, ctx)
}

// TestTooManyPendingAddsAreRefused: over MaxPendingAdds (all ledgers of a client together) an
// append is refused with ErrTooManyPendingAdds, called back after the adds before it, without
// taking an entry id, failing the handle or replacing a bookie; completed adds free the bound.
func TestTooManyPendingAddsAreRefused(t *testing.T) {
	c := clustertest.Start(t, 1)
	ctx := context.Background()
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	cl.cfg.MaxPendingAdds = 3
	a, b := createLedger(t, cl, 1, 1, 1), createLedger(t, cl, 1, 1, 1)
	bookie := faultConnOf(t, cl, &conns, a.Metadata().Ensembles[0].Bookies[0])
	holdAdds(bookie)
	results := make(chan string, 8)
	appendTo := func(lh *Ledger, name string) {
		lh.AppendAsync([]byte(name), func(id int64, err error) {
			switch {
			case err == nil:
				results <- fmt.Sprintf("%s %d", name, id)
			case errors.Is(err, ErrTooManyPendingAdds):
				results <- name + " refused"
			default:
				results <- fmt.Sprintf("%s %d: %v", name, id, err)
			}
		})
	}
	appendTo(a, "a")
	appendTo(a, "a")
	appendTo(b, "b")
	appendTo(a, "a") // over the bound: refused
	appendTo(b, "b") // the bound is the client's, not the ledger's
	// TryAppendAsync says so at once, and never calls back.
	if id, err := a.TryAppendAsync([]byte("a"), func(int64, error) { results <- "try called back" }); !errors.Is(err, ErrTooManyPendingAdds) || id != -1 {
		t.Fatalf("TryAppendAsync over the bound: %d, %v", id, err)
	}
	select {
	case r := <-results:
		t.Fatalf("%q called back before the adds before it", r)
	case <-time.After(100 * time.Millisecond):
	}
	bookie.releaseAdds()
	var got []string
	for range 5 {
		got = append(got, <-results)
	}
	var gotA, gotB []string
	for _, r := range got {
		if r[0] == 'a' {
			gotA = append(gotA, r)
		} else {
			gotB = append(gotB, r)
		}
	}
	if want := []string{"a 0", "a 1", "a refused"}; !slices.Equal(gotA, want) {
		t.Fatalf("ledger a's callbacks %q, want %q", gotA, want)
	}
	if want := []string{"b 0", "b refused"}; !slices.Equal(gotB, want) {
		t.Fatalf("ledger b's callbacks %q, want %q", gotB, want)
	}
	if n := cl.pendingAdds.Load(); n != 0 {
		t.Fatalf("%d adds counted in flight after all completed", n)
	}
	// The refusals took no entry id and failed nothing.
	if id, err := a.Append(ctx, []byte("a")); err != nil || id != 2 {
		t.Fatalf("append after a refusal: id %d, %v; want 2", id, err)
	}
	tried := make(chan error, 1)
	if id, err := a.TryAppendAsync([]byte("a"), func(_ int64, err error) { tried <- err }); err != nil || id != 3 {
		t.Fatalf("TryAppendAsync: %d, %v; want 3", id, err)
	}
	if err := <-tried; err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-results:
		t.Fatalf("unexpected callback %q", r)
	default:
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if md := a.Metadata(); len(md.Ensembles) != 1 || md.LastEntryID != 3 {
		t.Fatalf("after close: %d ensembles, last entry %d; want 1 and 3", len(md.Ensembles), md.LastEntryID)
	}
}

func TestMaxPendingAddsAboveTheTransportBound(t *testing.T) {
	cfg := DefaultConfig("etcd://127.0.0.1:1/ledgers")
	cfg.Transport.MaxPendingPerConn = 1000
	cfg.MaxPendingAdds = 1001
	if _, err := New(context.Background(), cfg); !errors.Is(err, ErrBadArgument) {
		t.Fatalf("New with MaxPendingAdds above MaxPendingPerConn: %v, want ErrBadArgument", err)
	}
}

// TestAppendWithADoneContextWritesNothing: an Append whose ctx is done before the call returns
// the ctx's error without writing: the entry must not appear in the ledger (the caller is told
// it was not acknowledged, and would write it again), nor take an entry id.
func TestAppendWithADoneContextWritesNothing(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	lh := createLedger(t, cl, 3, 2, 2)
	done, cancel := context.WithCancel(ctx)
	cancel()
	for range 20 { // the add's completion could race the ctx in Append's select
		if id, err := lh.Append(done, []byte("not wanted")); !errors.Is(err, context.Canceled) {
			t.Fatalf("Append with a cancelled ctx: id %d, %v; want context.Canceled", id, err)
		}
	}
	if id, err := lh.Append(ctx, []byte("first")); err != nil || id != 0 {
		t.Fatalf("the first Append with a live ctx got id %d (%v), want 0", id, err)
	}
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if md := lh.Metadata(); md.LastEntryID != 0 || md.Length != int64(len("first")) {
		t.Fatalf("closed at entry %d, length %d; want 0, %d", md.LastEntryID, md.Length, len("first"))
	}
}

// TestCloseWithADoneContextDoesNothing: a Close whose ctx is done before the call returns the
// ctx's error and leaves the handle as it was: it did not close the ledger, so appends go on.
func TestCloseWithADoneContextDoesNothing(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	lh := createLedger(t, cl, 3, 2, 2)
	appendN(t, lh, 1)
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := lh.Close(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close with a cancelled ctx: %v, want context.Canceled", err)
	}
	if md, err := cl.LedgerMetadata(ctx, lh.ID()); err != nil || md.State != metadata.StateOpen {
		t.Fatalf("after a cancelled Close: %v", err)
	}
	if id, err := lh.Append(ctx, []byte("more")); err != nil || id != 1 {
		t.Fatalf("append after a Close that did nothing: id %d, %v; want 1", id, err)
	}
}

// TestNewWithBadConfigIsBadArgument: configuration New rejects, whichever package checks it,
// matches ErrBadArgument and still the checking package's own error.
func TestNewWithBadConfigIsBadArgument(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   func(*Config)
		inner error
	}{
		{"malformed URI", func(c *Config) { c.MetadataURI = "not a uri" }, metadata.ErrBadURI},
		{"unknown scheme", func(c *Config) { c.MetadataURI = "nosuch://127.0.0.1:1/ledgers" }, metadata.ErrBadURI},
		{"bad root", func(c *Config) { c.MetadataURI = "etcd://127.0.0.1:1/" }, metadata.ErrBadURI},
		{"metadata options", func(c *Config) { c.Metadata.IDBatchSize = -1 }, metadata.ErrInvalidOptions},
		{"transport config", func(c *Config) { c.Transport.AddTimeout = -time.Second }, transport.ErrBadConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig("etcd://127.0.0.1:1/ledgers") // nothing listens: only bad config may fail fast
			cfg.Metadata.DialTimeout = 100 * time.Millisecond
			tc.cfg(&cfg)
			_, err := New(context.Background(), cfg)
			if !errors.Is(err, ErrBadArgument) || !errors.Is(err, tc.inner) {
				t.Fatalf("New: %v, want ErrBadArgument and %v", err, tc.inner)
			}
		})
	}
	// An unreachable metadata service is not bad configuration.
	cfg := DefaultConfig("etcd://127.0.0.1:1/ledgers")
	cfg.Metadata.DialTimeout = 100 * time.Millisecond
	if _, err := New(context.Background(), cfg); err == nil || errors.Is(err, ErrBadArgument) {
		t.Fatalf("New with an unreachable metadata service: %v, want an error other than ErrBadArgument", err)
	}
}
