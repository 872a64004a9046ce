package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// scriptConn lets a test decide, per request, what a bookie connection does.
type scriptConn struct {
	bookieConn
	addr string
	// read, if set, may answer a read itself (handled true) instead of the bookie.
	read func(entryID int64, flags protocol.Flags, cb transport.ReadCallback, ctx any) (handled bool)
	add  func(entryID int64, flags protocol.Flags, send func(), cb transport.AddCallback, ctx any) (handled bool)
}

func (s *scriptConn) Read(rctx context.Context, ledgerID, entryID int64, flags protocol.Flags, key *[20]byte, cb transport.ReadCallback, ctx any) {
	if s.read != nil && s.read(entryID, flags, cb, ctx) {
		return
	}
	s.bookieConn.Read(rctx, ledgerID, entryID, flags, key, cb, ctx)
}

func (s *scriptConn) Add(ledgerID, entryID int64, key *[20]byte, flags protocol.Flags, entry [][]byte, cb transport.AddCallback, ctx any) {
	send := func() { s.bookieConn.Add(ledgerID, entryID, key, flags, entry, cb, ctx) }
	if s.add != nil && s.add(entryID, flags, send, cb, ctx) {
		return
	}
	send()
}

// ackLog records what AppendAsync callbacks reported.
type ackLog struct {
	mu    sync.Mutex
	acked map[int64][]byte
	errs  map[int64]error // by the order of the append (index), not entry id
	n     int
	done  chan struct{}
	want  int
}

func newAckLog(want int) *ackLog {
	return &ackLog{acked: map[int64][]byte{}, errs: map[int64]error{}, done: make(chan struct{}), want: want}
}

func (a *ackLog) append(lh *Ledger, idx int64, data []byte) {
	lh.AppendAsync(data, func(id int64, err error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if err == nil {
			a.acked[id] = data
		} else {
			a.errs[idx] = err
		}
		a.n++
		if a.n == a.want {
			close(a.done)
		}
	})
}

func (a *ackLog) wait(t *testing.T) {
	t.Helper()
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		a.mu.Lock()
		defer a.mu.Unlock()
		t.Fatalf("%d of %d callbacks ran", a.n, a.want)
	}
}

// checkAcked verifies that every acknowledged entry is in the closed ledger rh, byte-identical,
// and that reading past its end fails.
func checkAcked(t *testing.T, rh *Ledger, acked map[int64][]byte) {
	t.Helper()
	md := rh.Metadata()
	if md.State != metadata.StateClosed {
		t.Fatalf("not closed: %v", md.State)
	}
	for id, data := range acked {
		if id > md.LastEntryID {
			t.Fatalf("entry %d was acknowledged but the ledger was closed at %d: data loss", id, md.LastEntryID)
		}
		es, err := rh.Read(context.Background(), id, id)
		if err != nil {
			t.Fatalf("acknowledged entry %d: %v", id, err)
		}
		if !bytes.Equal(es[0].Payload, data) {
			t.Fatalf("acknowledged entry %d: %q, want %q", id, es[0].Payload, data)
		}
	}
	if _, err := rh.Read(context.Background(), md.LastEntryID+1, md.LastEntryID+1); !errors.Is(err, ErrNoSuchEntry) {
		t.Fatalf("read past the end %d: %v", md.LastEntryID, err)
	}
}

// TestRecoveryDuringTheWritersEnsembleChange: the writer's ensemble change is held in Replace
// while a recoverer fences and closes the ledger (or, casFirst, its metadata update lands just
// before the recovery); then the change resumes. Every acknowledged entry is in the recovered
// ledger, nothing past its end is readable, and the writer learns it was fenced.
func TestRecoveryDuringTheWritersEnsembleChange(t *testing.T) {
	for _, casFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("casFirst=", casFirst), func(t *testing.T) {
			c := clustertest.Start(t, 4)
			ctx := context.Background()
			var conns sync.Map
			w := newClient(t, c, wrapConns(&conns))
			waitWritable(t, w, 4)
			gated := gatePlacement(w)
			lh := createLedger(t, w, 3, 3, 2)
			appendN(t, lh, 5)
			ens := lh.Metadata().Ensembles[0].Bookies
			spare := spareOf(t, c, ens)
			b1, b2, sp := faultConnOf(t, w, &conns, ens[1]), faultConnOf(t, w, &conns, ens[2]), faultConnOf(t, w, &conns, spare)
			holdAdds(b1)
			holdAdds(b2)
			holdAdds(sp)
			log := newAckLog(8)
			for i := int64(5); i < 10; i++ {
				log.append(lh, i, payload(lh.ID(), i))
			}
			time.Sleep(100 * time.Millisecond)
			b2.failAdds()
			<-gated.entered
			for i := int64(10); i < 13; i++ { // held in unsent by the change
				log.append(lh, i, payload(lh.ID(), i))
			}
			if casFirst {
				close(gated.gate)
				for deadline := time.Now().Add(10 * time.Second); len(lh.Metadata().Ensembles) < 2; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("no ensemble change")
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			rh, err := newClient(t, c, nil).OpenLedger(ctx, lh.ID(), password, true)
			if err != nil {
				t.Fatal(err)
			}
			if !casFirst {
				close(gated.gate)
			}
			time.Sleep(200 * time.Millisecond)
			b1.releaseAdds()
			sp.releaseAdds()
			log.wait(t)
			log.mu.Lock()
			defer log.mu.Unlock()
			checkAcked(t, rh, log.acked)
			if err := lh.Close(ctx); !errors.Is(err, ErrLedgerFenced) {
				t.Fatalf("the writer's Close: %v, want ErrLedgerFenced", err)
			}
		})
	}
}

// TestRecovererDiesMidway: recoverer A replaces a bookie that fails its recovery adds
// (in its own copy of the metadata) and dies (its context is cancelled) after re-adding some
// entries to the replacement. Recoverer B then recovers the ledger; every acknowledged entry is
// there.
func TestRecovererDiesMidway(t *testing.T) {
	for _, downForB := range []bool{false, true} {
		t.Run(fmt.Sprint("downForB=", downForB), func(t *testing.T) {
			c := clustertest.Start(t, 4)
			ctx := context.Background()
			lh := ledgerWithUnconfirmedTail(t, c) // 0..25 acknowledged
			ens := lh.Metadata().Ensembles[0].Bookies
			spare := spareOf(t, c, ens)
			actx, cancel := context.WithCancel(ctx)
			defer cancel()
			a := newClient(t, c, func(addr string, conn bookieConn) bookieConn {
				switch addr {
				case ens[1]:
					return &recoveryAdds{bookieConn: conn, fail: always}
				case spare:
					var n atomic.Int32
					return &scriptConn{bookieConn: conn, addr: addr, add: func(_ int64, flags protocol.Flags, send func(), _ transport.AddCallback, _ any) bool {
						if flags.Has(protocol.FlagRecoveryAdd) && n.Add(1) == 3 {
							cancel()
						}
						send()
						return true
					}}
				}
				return conn
			})
			if _, err := a.OpenLedger(actx, lh.ID(), password, true); err == nil {
				t.Fatal("recoverer A completed")
			}
			if md, _, _ := a.md.Ledgers().Read(ctx, lh.ID()); md.State != metadata.StateInRecovery {
				t.Fatalf("after A: %v", md.State)
			}
			if downForB {
				if err := c.StopBookie(ctx, slices.Index(c.BookieAddrs(), ens[1])); err != nil {
					t.Fatal(err)
				}
			}
			if err := recoverAt(t, newClient(t, c, nil), lh, 25).Metadata().Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
