package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/internal/monotime"
)

// TailOptions configures the tail workload: readers follow writers and report end-to-end
// latency from append to read.
type TailOptions struct {
	Target
	Ensemble, WriteQuorum, AckQuorum int
	EntrySize                        int
	Ledgers                          int
	InFlight                         int
	Rate                             float64
	// PollInterval is how often a tailing reader asks for the last add confirmed when it has
	// caught up.
	PollInterval time.Duration
	Duration     time.Duration
	Progress     io.Writer
}

// DefaultTailOptions returns the defaults of `ringkeeper bench tail`.
func DefaultTailOptions() TailOptions {
	return TailOptions{
		Target: Target{Bookies: 3}, Ensemble: 3, WriteQuorum: 3, AckQuorum: 2, EntrySize: 1024, Ledgers: 2,
		InFlight: 100, Rate: 10000, PollInterval: time.Millisecond, Duration: 10 * time.Second,
	}
}

func (o TailOptions) config() map[string]any {
	return map[string]any{
		"metadata": o.MetadataURI, "standalone": o.Standalone, "bookies": o.Bookies, "ensemble": o.Ensemble,
		"write_quorum": o.WriteQuorum, "ack_quorum": o.AckQuorum, "entry_size": o.EntrySize, "ledgers": o.Ledgers,
		"in_flight": o.InFlight, "rate": o.Rate, "poll_interval_ms": float64(o.PollInterval) / 1e6,
		"duration_s": o.Duration.Seconds(),
	}
}

func (o TailOptions) validate() error {
	if o.Ledgers < 1 || o.InFlight < 1 || o.Duration <= 0 || o.EntrySize < 0 || !(o.Rate >= 0) || o.PollInterval < 0 {
		return fmt.Errorf("bench: ledgers (%d) and in-flight (%d) must be positive, duration positive, entry size, rate (%g) and poll interval not negative",
			o.Ledgers, o.InFlight, o.Rate)
	}
	return nil
}

// RunTail runs writers and tailing readers; the result's latency is append-to-read.
func RunTail(ctx context.Context, o TailOptions) (*Result, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	t, err := o.Target.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer t.cleanup()
	ledgers, err := createLedgers(ctx, t.client, o.Ledgers, o.Ensemble, o.WriteQuorum, o.AckQuorum)
	if err != nil {
		return nil, err
	}
	defer closeLedgers(ledgers)
	rec := NewRecorder()    // end-to-end: append to read
	writes := NewRecorder() // append latency, for the summary
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range ledgers {
		rh, err := t.client.OpenLedger(ctx, w.ID(), benchPassword, false)
		if err != nil {
			return nil, err
		}
		wg.Go(func() { tailLedger(runCtx, rh, o, rec) })
	}
	wg.Go(func() {
		runAppends(runCtx, appendLoad{
			ledgers: ledgers, writers: len(ledgers), inFlight: o.InFlight, entrySize: max(o.EntrySize, 8),
			rate: o.Rate, duration: o.Duration, stamp: true,
		}, writes)
	})
	rec.Measure(ctx, 0, o.Duration, o.Progress)
	cancel()
	wg.Wait()
	res := rec.Result("tail", o.config())
	wr := writes.Result("write", nil)
	res.Extra = map[string]float64{"append_p50_us": wr.LatencyUs.P50, "append_p99_us": wr.LatencyUs.P99, "appended": float64(wr.Ops)}
	res.Errors += wr.Errors
	return res, nil
}

// tailLedger follows one ledger: whenever the last add confirmed moves, it reads the new
// entries and records now − the due time stamped in each payload (monotime: the writers run
// in this process).
func tailLedger(ctx context.Context, lh *client.Ledger, o TailOptions, rec *Recorder) {
	next := int64(0)
	for ctx.Err() == nil {
		lac, err := lh.ReadLastAddConfirmed(ctx)
		if err != nil {
			if ctx.Err() == nil {
				rec.Error()
			}
			continue
		}
		if lac < next {
			Sleep(ctx, o.PollInterval)
			continue
		}
		for e, err := range lh.Entries(ctx, next, lac) {
			if err != nil {
				if ctx.Err() == nil {
					rec.Error()
				}
				break
			}
			due := int64(binary.LittleEndian.Uint64(e.Payload))
			rec.Record(time.Duration(monotime.Now()-due), len(e.Payload))
			next = e.EntryID + 1
		}
	}
}
