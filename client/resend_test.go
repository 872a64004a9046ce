package client

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// checkConn checks, as each add leaves the client, that its payload is still the data the
// application appended; failing, if set, fails the bookie's next add.
type checkConn struct {
	inner   bookieConn
	t       *testing.T
	failing *atomic.Bool
}

func (c *checkConn) Add(ledgerID, entryID int64, masterKey *[20]byte, flags protocol.Flags, entry [][]byte, cb transport.AddCallback, ctx any) {
	if payload := entry[len(entry)-1]; !bytes.Equal(payload, resendPayload(entryID)) {
		c.t.Errorf("entry %d sent with changed data %q: sent after its callback released the buffer", entryID, payload)
	}
	if c.failing != nil && c.failing.CompareAndSwap(true, false) {
		go cb(ctx, 0, transport.ErrConnection)
		return
	}
	c.inner.Add(ledgerID, entryID, masterKey, flags, entry, cb, ctx)
}

func (c *checkConn) Read(rctx context.Context, ledgerID, entryID int64, flags protocol.Flags, masterKey *[20]byte, cb transport.ReadCallback, ctx any) {
	c.inner.Read(rctx, ledgerID, entryID, flags, masterKey, cb, ctx)
}

// slowPlacement is RandomPlacement with a slow Replace.
type slowPlacement struct{ RandomPlacement }

func (p slowPlacement) Replace(ensemble []string, index, writeQuorum int, available []metadata.BookieInfo, excluded map[string]bool) (string, error) {
	time.Sleep(100 * time.Millisecond)
	return p.RandomPlacement.Replace(ensemble, index, writeQuorum, available, excluded)
}

func resendPayload(entryID int64) []byte { return bytes.Repeat([]byte{byte(entryID), 'x'}, 50) }

// TestEnsembleChangeResendsBeforeCallbacks: an add that reached Qa while an ensemble change ran
// is still sent to the replacement bookie, and that send must happen before its callback, which
// lets the application reuse the buffer.
func TestEnsembleChangeResendsBeforeCallbacks(t *testing.T) {
	c := clustertest.Start(t, 4)
	var mu sync.Mutex
	failing := map[string]*atomic.Bool{}
	cl := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
		mu.Lock()
		defer mu.Unlock()
		failing[addr] = new(atomic.Bool)
		return &checkConn{inner: conn, t: t, failing: failing[addr]}
	})
	// Choosing the replacement takes a while, so the other bookies' acknowledgements arrive
	// during the change.
	cl.cfg.Placement = slowPlacement{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	var wg sync.WaitGroup
	wg.Add(n)
	var victim string
	for i := range n {
		if i == 50 {
			// An add to the first bookie of the ensemble fails: an ensemble change replaces
			// the bookie while the other two acknowledge the adds in flight.
			mu.Lock()
			victim = lh.Metadata().Ensembles[0].Bookies[0]
			failing[victim].Store(true)
			mu.Unlock()
		}
		buf := resendPayload(int64(i))
		lh.AppendAsync(buf, func(_ int64, err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("entry %d: %v", i, err)
			}
			clear(buf) // the application reuses its buffer
		})
	}
	wg.Wait()
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	last, _ := lh.Metadata().LastEnsemble()
	for _, b := range last.Bookies {
		if b == victim {
			t.Fatalf("no ensemble change: %v", last.Bookies)
		}
	}
}
