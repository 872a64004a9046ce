package client

import (
	"bytes"
	"context"
	"errors"
	"sync"
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
	gated := &gatedPlacement{PlacementPolicy: cl.cfg.Placement, entered: make(chan struct{}), gate: make(chan struct{})}
	cl.cfg.Placement = gated
	lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
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
	ctx := context.Background()
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	last := lh.Metadata().Ensembles[0].Bookies[2] // entry 0's last send goes to position 2
	slow := faultConnOf(t, cl, &conns, last)
	slow.mu.Lock()
	slow.addDelay = 300 * time.Millisecond
	slow.mu.Unlock()
	data := payload(lh.ID(), 0)
	want := bytes.Clone(data)
	done := make(chan error, 1)
	lh.AppendAsync(data, func(_ int64, err error) {
		for i := range data {
			data[i] = 'X' // the caller reuses its buffer
		}
		done <- err
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Read entry 0 from the third bookie alone.
	got := make(chan readResult, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		cl.cfg.dial(last).Read(lh.ID(), 0, 0, nil, readResponse, &readCtx{ch: got})
		r := <-got
		if r.err == nil && r.rc == protocol.EOK {
			e, err := lh.dg.verify(r.entry, lh.ID(), 0)
			if err != nil {
				t.Fatalf("the third bookie's copy: %v", err)
			}
			if !bytes.Equal(e.Payload, want) {
				t.Fatalf("the third bookie stored %q, want %q", e.Payload, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("read from the third bookie: rc %v, %v", r.rc, r.err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCloseAfterAFailedAdd: when no bookie can replace a failed one, the handle fails; Close
// still closes the ledger at the last acknowledged entry (BookKeeper closes failed handles), so
// readers see its end without having to recover it.
func TestCloseAfterAFailedAdd(t *testing.T) {
	c := clustertest.Start(t, 3)
	ctx := context.Background()
	cl := newClient(t, c, nil)
	lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
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
	ctx := context.Background()
	var conns sync.Map
	cl := newClient(t, c, wrapConns(&conns))
	lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
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
