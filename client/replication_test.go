package client

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// TestTwoBookiesLostMidStream (reliability.md §5 item 16): (3,3,2) on 5 bookies; one bookie
// of the ensemble is stopped a third of the way through a stream of adds, a bookie of the
// then current ensemble two thirds of the way. Every add must succeed, the fragments' first
// entries must strictly increase, and after close every entry must be on at least Qa bookies
// of the fragment the metadata records for it (read from each bookie directly, the stopped
// ones restarted) and readable through the client.
func TestTwoBookiesLostMidStream(t *testing.T) {
	c := clustertest.Start(t, 5)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	lh := createLedger(t, cl, 3, 3, 2)
	const n = 900
	var stopped []int
	// stop stops the bookie at position len(stopped) of the current ensemble (so that the
	// second stop hits a bookie of the first fragment that the first change kept), on its own
	// goroutine: adds keep being issued while the bookie goes and the ensemble changes.
	stop := func() <-chan error {
		done := make(chan error, 1)
		ens := lh.Metadata().Ensembles
		i := slices.Index(c.BookieAddrs(), ens[len(ens)-1].Bookies[len(stopped)])
		stopped = append(stopped, i)
		go func() { done <- c.StopBookie(ctx, i) }()
		return done
	}
	var wg sync.WaitGroup
	var stopping <-chan error
	for i := range n {
		if i == n/3 || i == 2*n/3 {
			if stopping != nil {
				if err := <-stopping; err != nil {
					t.Fatal(err)
				}
			}
			stopping = stop()
		}
		wg.Add(1)
		lh.AppendAsync(payload(lh.ID(), int64(i)), func(id int64, err error) {
			defer wg.Done()
			if err != nil || id != int64(i) {
				t.Errorf("append %d: id %d, %v", i, id, err)
			}
		})
		if i%10 == 0 {
			time.Sleep(time.Millisecond) // spread the stream over the stops
		}
	}
	if err := <-stopping; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	md := lh.Metadata()
	if md.LastEntryID != n-1 {
		t.Fatalf("closed at %d, want %d", md.LastEntryID, n-1)
	}
	t.Logf("ensembles: %+v", md.Ensembles)
	if len(md.Ensembles) < 3 {
		t.Fatalf("want at least two ensemble changes: %+v", md.Ensembles)
	}
	for k := 1; k < len(md.Ensembles); k++ {
		if md.Ensembles[k].FirstEntryID <= md.Ensembles[k-1].FirstEntryID {
			t.Fatalf("fragment first entries do not increase: %+v", md.Ensembles)
		}
	}
	last := md.Ensembles[len(md.Ensembles)-1].Bookies
	victims := map[string]bool{}
	for _, i := range stopped {
		victims[c.BookieAddrs()[i]] = true
		if slices.Contains(last, c.BookieAddrs()[i]) {
			t.Fatalf("stopped bookie %s is in the last ensemble %v", c.BookieAddrs()[i], last)
		}
		if err := c.StartBookie(ctx, i); err != nil { // its copies count too
			t.Fatal(err)
		}
	}
	for e := range int64(n) {
		// Computed here, not with the client's writeSet: the fragment is the last one
		// starting at or before e, and e goes to Qw consecutive bookies from e mod E.
		k := len(md.Ensembles) - 1
		for md.Ensembles[k].FirstEntryID > e {
			k--
		}
		var ws []string
		for i := range md.WriteQuorumSize {
			ws = append(ws, md.Ensembles[k].Bookies[(int(e)+i)%md.EnsembleSize])
		}
		held := copiesOn(t, cl, lh, ws, e, victims)
		if len(held) < md.AckQuorumSize {
			t.Fatalf("entry %d is on %v of its write set %v, want at least %d bookies", e, held, ws, md.AckQuorumSize)
		}
		// Stronger, as nothing else failed: a bookie never stopped holds every entry of the
		// fragments it is in (the adds in flight at a change were resent to the replacement).
		for _, b := range ws {
			if !victims[b] && !slices.Contains(held, b) {
				t.Fatalf("entry %d (fragment %d, %v) is not on %s, which never stopped; on %v", e, k, ws, b, held)
			}
		}
	}
	rh, err := cl.OpenLedger(ctx, lh.ID(), password, false)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, rh, n-1)
}

// copiesOn returns the bookies of ws that hold a good copy of entry e (the right payload and a
// valid digest), reading each one directly. A restarted bookie may still be starting (a
// connection error is retried), and the last add to a bookie that never stopped may still be
// on its way when Qa others have acknowledged it (a missing entry is retried there).
func copiesOn(t *testing.T, cl *Client, lh *Ledger, ws []string, e int64, victims map[string]bool) []string {
	t.Helper()
	want := payload(lh.ID(), e)
	ch := make(chan readResult, 1)
	var held []string
	for _, b := range ws {
		deadline := time.Now().Add(5 * time.Second)
		for {
			cl.cfg.dial(b).Read(context.Background(), lh.ID(), e, 0, nil, readResponse, &readCtx{ch: ch})
			r := <-ch
			retry := r.err != nil || (!victims[b] && isMissing(r.rc))
			if retry && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if r.err == nil && r.rc == protocol.EOK {
				got, err := lh.dg.verify(r.entry, lh.ID(), e)
				if err != nil || !bytes.Equal(got.Payload, want) {
					t.Fatalf("%s's copy of entry %d: %v, payload %q", b, e, err, got.Payload)
				}
				held = append(held, b)
			}
			break
		}
	}
	return held
}
