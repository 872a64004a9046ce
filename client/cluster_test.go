package client

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

// newClient opens a client on the cluster; wrap, if set, wraps every bookie connection.
func newClient(t testing.TB, c *cluster.Cluster, wrap func(addr string, conn bookieConn) bookieConn) *Client {
	t.Helper()
	cfg := DefaultConfig(c.MetadataURI())
	cfg.Transport.AddTimeout = 2 * time.Second
	cfg.Transport.ReadTimeout = 2 * time.Second
	cfg.Transport.ReconnectMax = 200 * time.Millisecond
	cfg.SpeculativeReadTimeout = 200 * time.Millisecond
	var cl *Client
	if wrap != nil {
		pool, err := transport.NewPool(cfg.Transport)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pool.Close() })
		var mu sync.Mutex
		conns := map[string]bookieConn{}
		cfg.dial = func(addr string) bookieConn {
			mu.Lock()
			defer mu.Unlock()
			if conns[addr] == nil {
				conns[addr] = wrap(addr, transportConn{pool.Conn(addr)})
			}
			return conns[addr]
		}
	}
	cl, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// faultConn wraps a bookie connection for scripted interleavings: it can hold adds (send them
// only when released), hold read responses, and fail fencing LAC reads.
type faultConn struct {
	inner bookieConn
	addr  string

	mu             sync.Mutex
	holdAdds       bool
	heldAdds       []func()
	heldAddFails   []func(error) // answer the held adds with an error instead
	addDelay       time.Duration
	holdReads      bool
	heldReads      []func()
	failFencingLAC bool
	corruptReads   bool
}

func (f *faultConn) Add(ledgerID, entryID int64, masterKey *[20]byte, flags protocol.Flags, entry [][]byte, cb transport.AddCallback, ctx any) {
	f.mu.Lock()
	if f.holdAdds {
		f.heldAdds = append(f.heldAdds, func() { f.inner.Add(ledgerID, entryID, masterKey, flags, entry, cb, ctx) })
		f.heldAddFails = append(f.heldAddFails, func(err error) { cb(ctx, 0, err) })
		f.mu.Unlock()
		return
	}
	delay := f.addDelay
	f.mu.Unlock()
	time.Sleep(delay) // in the caller's send, as a full send queue would
	f.inner.Add(ledgerID, entryID, masterKey, flags, entry, cb, ctx)
}

func (f *faultConn) Read(rctx context.Context, ledgerID, entryID int64, flags protocol.Flags, masterKey *[20]byte, cb transport.ReadCallback, ctx any) {
	f.mu.Lock()
	fail := f.failFencingLAC && entryID == -1 && flags.Has(protocol.FlagDoFencing)
	hold := f.holdReads && entryID >= 0 // LAC reads (entry -1) pass
	corrupt := f.corruptReads
	f.mu.Unlock()
	if fail {
		go cb(ctx, 0, nil, transport.ErrConnection)
		return
	}
	if corrupt {
		inner := cb
		cb = func(ctx any, rc protocol.ReturnCode, entry []byte, err error) {
			if len(entry) > 40 {
				entry = append([]byte(nil), entry...)
				entry[len(entry)-1] ^= 0xff
			}
			inner(ctx, rc, entry, err)
		}
	}
	if hold {
		inner := cb
		cb = func(ctx any, rc protocol.ReturnCode, entry []byte, err error) {
			entry = append([]byte(nil), entry...)
			f.mu.Lock()
			f.heldReads = append(f.heldReads, func() { inner(ctx, rc, entry, err) })
			f.mu.Unlock()
		}
	}
	f.inner.Read(rctx, ledgerID, entryID, flags, masterKey, cb, ctx)
}

func (f *faultConn) releaseAdds() {
	f.mu.Lock()
	held := f.heldAdds
	f.heldAdds, f.heldAddFails, f.holdAdds = nil, nil, false
	f.mu.Unlock()
	for _, send := range held {
		send()
	}
}

// failAdds answers the held adds with a connection error, as if the bookie had gone.
func (f *faultConn) failAdds() { f.failAddsWith(transport.ErrConnection) }

// failAddsWith answers the held adds with err.
func (f *faultConn) failAddsWith(err error) {
	f.mu.Lock()
	fails := f.heldAddFails
	f.heldAdds, f.heldAddFails, f.holdAdds = nil, nil, false
	f.mu.Unlock()
	for _, fail := range fails {
		fail(err)
	}
}

func (f *faultConn) releaseReads() {
	f.mu.Lock()
	held := f.heldReads
	f.heldReads, f.holdReads = nil, false
	f.mu.Unlock()
	for _, deliver := range held {
		deliver()
	}
}
