package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/internal/monotime"
)

// StressOptions configures the stress workload: a long mixed run in which workers create
// ledgers, write them, read them back, close and delete them, optionally while bookies are
// stopped and restarted at random; at the end every acknowledged entry of every ledger that
// was not deleted is read back, and any loss is reported as an error.
type StressOptions struct {
	Target
	Workers int
	// MaxEntries bounds the entries written to one ledger.
	MaxEntries int
	EntrySize  int
	InFlight   int
	// KillBookies stops and restarts standalone bookies at random (one at a time).
	KillBookies bool
	KillEvery   time.Duration
	Duration    time.Duration
	Progress    io.Writer
}

// DefaultStressOptions returns the defaults of `ringkeeper bench stress`.
func DefaultStressOptions() StressOptions {
	return StressOptions{
		Target: Target{Bookies: 4}, Workers: 4, MaxEntries: 2000, EntrySize: 512, InFlight: 64,
		KillEvery: 3 * time.Second, Duration: 30 * time.Second,
	}
}

func (o StressOptions) config() map[string]any {
	return map[string]any{
		"metadata": o.MetadataURI, "standalone": o.Standalone, "bookies": o.Bookies, "workers": o.Workers,
		"max_entries": o.MaxEntries, "entry_size": o.EntrySize, "in_flight": o.InFlight,
		"kill_bookies": o.KillBookies, "kill_every_s": o.KillEvery.Seconds(), "duration_s": o.Duration.Seconds(),
	}
}

// stressPayload is the deterministic content of (ledger, entry), so verification needs no copy.
func stressPayload(ledger, entry int64, size int) []byte {
	b := make([]byte, size)
	seed := uint64(ledger)*0x9E3779B97F4A7C15 ^ uint64(entry)
	for i := range b {
		seed = seed*6364136223846793005 + 1442695040888963407
		b[i] = byte(seed >> 56)
	}
	return b
}

type stressLedger struct {
	id      int64
	acked   int64 // entries 0..acked were acknowledged
	deleted bool
	// deleting is set before a delete is sent: a delete cut short by the end of the run may
	// still have happened, so such a ledger may be gone.
	deleting bool
	// lost is set when the verification during the run found lost entries: the ledger is
	// counted as lost once, whether or not it is deleted afterwards.
	lost bool
}

// RunStress runs the stress workload.
func RunStress(ctx context.Context, o StressOptions) (*Result, error) {
	if o.KillBookies && !o.Standalone {
		return nil, errors.New("bench: --kill-bookies needs --standalone")
	}
	if o.Workers < 1 || o.MaxEntries < 1 || o.InFlight < 1 || o.Duration <= 0 || o.EntrySize < 0 ||
		(o.KillBookies && o.KillEvery <= 0) {
		return nil, errors.New("bench: workers, max entries, in-flight, duration (and kill interval) must be positive, entry size not negative")
	}
	t, err := o.Target.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer t.cleanup()
	rec := NewRecorder()
	var ops struct{ created, closed, deleted, verified, failedOps, kills atomic.Int64 }
	var lost, unverifiable atomic.Int64 // ledgers
	var mu sync.Mutex
	var ledgers []*stressLedger
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if o.KillBookies {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(7, 7))
			for runCtx.Err() == nil {
				Sleep(runCtx, o.KillEvery)
				if runCtx.Err() != nil {
					return
				}
				i := rng.IntN(t.cluster.Size())
				sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := t.cluster.StopBookie(sctx, i)
				scancel()
				if err != nil {
					fmt.Fprintf(o.progressOrDiscard(), "stopping bookie %d: %v\n", i, err)
				}
				ops.kills.Add(1)
				Sleep(runCtx, time.Duration(200+rng.IntN(1000))*time.Millisecond)
				for attempt := 0; attempt < 30; attempt++ {
					sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
					err := t.cluster.StartBookie(sctx, i)
					scancel()
					if err == nil {
						break
					}
					fmt.Fprintf(o.progressOrDiscard(), "restarting bookie %d: %v\n", i, err)
					time.Sleep(200 * time.Millisecond)
				}
			}
		})
	}
	for w := range o.Workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for runCtx.Err() == nil {
				q := [][3]int{{3, 3, 2}, {3, 2, 2}, {2, 2, 2}, {3, 3, 3}}[rng.IntN(4)]
				lh, err := t.client.CreateLedger(runCtx, client.CreateOptions{EnsembleSize: q[0], WriteQuorum: q[1], AckQuorum: q[2], Password: benchPassword})
				if err != nil {
					ops.failedOps.Add(1)
					Sleep(runCtx, 100*time.Millisecond)
					continue
				}
				ops.created.Add(1)
				sl := &stressLedger{id: lh.ID(), acked: -1}
				mu.Lock()
				ledgers = append(ledgers, sl)
				mu.Unlock()
				n := 1 + rng.IntN(o.MaxEntries)
				sem := make(chan struct{}, o.InFlight)
				var inner sync.WaitGroup
				var failed atomic.Bool
				for e := range n {
					if runCtx.Err() != nil || failed.Load() {
						break
					}
					sem <- struct{}{}
					inner.Add(1)
					sent := monotime.Now()
					lh.AppendAsync(stressPayload(lh.ID(), int64(e), o.EntrySize), func(id int64, err error) {
						if err != nil {
							failed.Store(true)
						} else {
							rec.Record(time.Duration(monotime.Now()-sent), o.EntrySize)
							mu.Lock()
							sl.acked = id // completions come in order
							mu.Unlock()
						}
						<-sem
						inner.Done()
					})
				}
				inner.Wait()
				if failed.Load() {
					ops.failedOps.Add(1) // an unwritable ledger is abandoned; verification recovers it
					continue
				}
				switch rng.IntN(4) {
				case 0: // leave it open: verification recovers it
				default:
					if err := lh.Close(runCtx); err != nil {
						ops.failedOps.Add(1)
						continue
					}
					ops.closed.Add(1)
				}
				if rng.IntN(3) == 0 {
					switch err := verifyStress(runCtx, t.client, sl, o.EntrySize); {
					case err == nil:
						ops.verified.Add(1)
					case errors.Is(err, errLost):
						mu.Lock()
						sl.lost = true
						mu.Unlock()
						lost.Add(1)
						fmt.Fprintf(o.progressOrDiscard(), "LOSS: %v\n", err)
					}
				}
				if rng.IntN(3) == 0 {
					mu.Lock()
					sl.deleting = true
					mu.Unlock()
					if err := t.client.DeleteLedger(runCtx, lh.ID()); err == nil {
						mu.Lock()
						sl.deleted = true
						mu.Unlock()
						ops.deleted.Add(1)
					}
				}
			}
		})
	}
	rec.Measure(ctx, 0, o.Duration, o.Progress)
	cancel()
	wg.Wait()
	if o.KillBookies {
		for i := range t.cluster.Size() {
			if t.cluster.Bookie(i) == nil {
				t.cluster.StartBookie(ctx, i)
			}
		}
	}
	// Verify: every acknowledged entry of every ledger not deleted, after recovery, with a few
	// ledgers at a time.
	work := make(chan *stressLedger)
	var vw sync.WaitGroup
	for range 8 {
		vw.Go(func() {
			for sl := range work {
				var err error
				for attempt := 0; attempt < 10; attempt++ {
					vctx, vcancel := context.WithTimeout(ctx, 30*time.Second)
					err = verifyStress(vctx, t.client, sl, o.EntrySize)
					vcancel()
					if err == nil || errors.Is(err, errLost) || errors.Is(err, client.ErrNoSuchLedger) && sl.deleting {
						break
					}
					time.Sleep(500 * time.Millisecond)
				}
				switch {
				case errors.Is(err, client.ErrNoSuchLedger) && sl.deleting:
					// deleted after all (its delete was cut short by the end of the run)
				case errors.Is(err, errLost):
					lost.Add(1)
					fmt.Fprintf(o.progressOrDiscard(), "LOSS: %v\n", err)
				case err != nil:
					unverifiable.Add(1)
					md, _ := t.client.LedgerMetadata(ctx, sl.id)
					fmt.Fprintf(o.progressOrDiscard(), "could not verify ledger %d (acknowledged up to %d; metadata %+v): %v\n", sl.id, sl.acked, md, err)
				}
			}
		})
	}
	for _, sl := range ledgers {
		if !sl.deleted && !sl.lost { // a lost ledger is counted already
			work <- sl
		}
	}
	close(work)
	vw.Wait()
	res := rec.Result("stress", o.config())
	res.Errors = lost.Load() + unverifiable.Load()
	res.Extra = map[string]float64{
		"ledgers_created": float64(ops.created.Load()), "ledgers_closed": float64(ops.closed.Load()),
		"ledgers_deleted": float64(ops.deleted.Load()), "ledgers_verified_during_run": float64(ops.verified.Load()),
		"failed_ops": float64(ops.failedOps.Load()), "bookie_restarts": float64(ops.kills.Load()),
		"ledgers_with_lost_entries": float64(lost.Load()), "ledgers_unverifiable": float64(unverifiable.Load()),
	}
	return res, nil
}

func (o StressOptions) progressOrDiscard() io.Writer {
	if o.Progress == nil {
		return io.Discard
	}
	return o.Progress
}

var errLost = errors.New("bench: acknowledged entry lost")

// verifyStress is verifyStressLedger; tests replace it.
var verifyStress = verifyStressLedger

// verifyStressLedger recovers the ledger and checks entries 0..acked.
func verifyStressLedger(ctx context.Context, cl *client.Client, sl *stressLedger, size int) error {
	rh, err := cl.OpenLedger(ctx, sl.id, benchPassword, true)
	if err != nil {
		return err
	}
	md := rh.Metadata()
	if md.LastEntryID < sl.acked {
		return fmt.Errorf("%w: ledger %d closed at %d, entry %d was acknowledged", errLost, sl.id, md.LastEntryID, sl.acked)
	}
	if sl.acked < 0 {
		return nil
	}
	var next int64
	for e, err := range rh.Entries(ctx, 0, sl.acked) {
		if err != nil {
			return err
		}
		if !bytes.Equal(e.Payload, stressPayload(sl.id, e.EntryID, size)) {
			return fmt.Errorf("%w: ledger %d entry %d has other bytes", errLost, sl.id, e.EntryID)
		}
		next = e.EntryID + 1
	}
	if next != sl.acked+1 {
		return fmt.Errorf("%w: ledger %d: read %d entries, %d were acknowledged", errLost, sl.id, next, sl.acked+1)
	}
	return nil
}
