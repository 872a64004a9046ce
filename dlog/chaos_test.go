package dlog

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestChaosBookieRestarts writes to a log while bookies are stopped and restarted underneath
// it (one at a time, out of five, with 3/3/2 segments): ensemble changes, segment rolls and
// readers with stale ledger metadata. A writer that fails is closed and replaced, as an
// application would. A tailing reader follows throughout. No acknowledged record may be lost,
// and both the tailing reader and a reader from the head see one ordered sequence.
func TestChaosBookieRestarts(t *testing.T) {
	c := clustertest.Start(t, 5)
	cl := newClient(t, c)
	cfg := testConfig()
	cfg.MaxLogSegmentBytes = 128 << 10
	if os.Getenv("DLOG_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ns := newNamespace(t, cl, cfg)
	ctx := ctxFor(t, 90*time.Second)
	const size = 50
	l, err := ns.CreateLog(ctx, "chaos")
	if err != nil {
		t.Fatal(err)
	}

	// The tailing reader.
	tailer, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer tailer.Close()
	tailCtx, stopTail := context.WithCancel(ctx)
	var tailed []Record
	var tailErr error
	var tailWG sync.WaitGroup
	tailWG.Go(func() {
		for {
			rec, err := tailer.Next(tailCtx)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					tailErr = err
				}
				return
			}
			tailed = append(tailed, rec)
		}
	})

	// Bookies restart underneath.
	chaosCtx, stopChaos := context.WithCancel(ctx)
	var chaosWG sync.WaitGroup
	restarts := 0
	chaosWG.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for chaosCtx.Err() == nil {
			i := rng.IntN(c.Size())
			if err := c.StopBookie(ctx, i); err != nil {
				t.Errorf("stop bookie %d: %v", i, err)
				return
			}
			time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
			if err := c.StartBookie(ctx, i); err != nil {
				t.Errorf("start bookie %d: %v", i, err)
				return
			}
			restarts++
			time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		}
	})

	// Writers: one at a time; a failed one is closed and the next takes over.
	attempted := map[int64]bool{}
	acked := []map[int64]DLSN{}
	writers := 0
	deadline := time.Now().Add(3 * time.Second)
	next := int64(1)
	for time.Now().Before(deadline) {
		w, err := l.OpenWriter(ctx)
		if err != nil {
			t.Fatal(err)
		}
		writers++
		next = max(next, w.LastTxID()+1)
		p := startProducer(ctx, w, next, size, 2*time.Millisecond)
		for time.Now().Before(deadline) && w.errOrNil() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		p.halt()
		t.Logf("writer %d: %d acknowledged, %d failed", writers, len(p.a.byTx), len(p.a.failed))
		for tx := range p.attempted {
			attempted[tx] = true
		}
		next = p.lastTx + 1
		acked = append(acked, p.a.byTx)
		if err := w.Close(ctx); err != nil {
			t.Logf("writer %d stopped: %v (%d acknowledged, %d failed)", writers, err, len(p.a.byTx), len(p.a.failed))
		}
	}
	t.Log("stopping the chaos")
	stopChaos()
	chaosWG.Wait()
	for i := range c.Size() {
		if c.Bookie(i) == nil {
			if err := c.StartBookie(ctx, i); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A last writer recovers what a failed one left, and completes its segment.
	if w, err := l.OpenWriter(ctx); err != nil {
		t.Fatal(err)
	} else if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	segs, _ := l.Segments(ctx)
	t.Logf("%d bookie restarts, %d writers, %d segments", restarts, writers, len(segs))

	start := time.Now()
	recs := readAll(t, ctx, l)
	t.Logf("read the log back in %v", time.Since(start))
	if len(recs) > 0 {
		t.Logf("read %d records, last tx %d at %s", len(recs), recs[len(recs)-1].TxID, recs[len(recs)-1].DLSN.Text())
	}
	checkLog(t, recs, size, func(tx int64) bool { return attempted[tx] }, acked...)
	// The tailing reader saw the same sequence (it may lag behind the head reader).
	time.Sleep(200 * time.Millisecond)
	stopTail()
	tailWG.Wait()
	if tailErr != nil {
		t.Fatalf("tailing reader: %v", tailErr)
	}
	if len(tailed) == 0 || len(tailed) > len(recs) {
		t.Fatalf("tailing reader saw %d records, the log has %d", len(tailed), len(recs))
	}
	for i, r := range tailed {
		if r.TxID != recs[i].TxID || r.DLSN != recs[i].DLSN {
			t.Fatalf("tailing reader's record %d is tx %d at %s, the log's is tx %d at %s", i, r.TxID, r.DLSN.Text(), recs[i].TxID, recs[i].DLSN.Text())
		}
	}
	t.Logf("tailing reader saw %d of %d records", len(tailed), len(recs))
}
