package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/internal/monotime"
)

// ReadOptions configures the read workload: catch-up reads of existing ledgers.
type ReadOptions struct {
	Target
	// Mode is "sequential" (each reader catches up one ledger from its start, InFlight entries
	// at a time) or "random" (single entries at random).
	Mode string
	// Ledgers and Entries are written first (not measured) and closed.
	Ledgers, Entries                 int
	Ensemble, WriteQuorum, AckQuorum int
	EntrySize                        int
	Readers                          int
	InFlight                         int
	// Cold restarts the standalone bookies after writing, so no bookie cache holds the entries.
	Cold     bool
	Duration time.Duration
	Progress io.Writer
}

// DefaultReadOptions returns the defaults of `ringkeeper bench read`.
func DefaultReadOptions() ReadOptions {
	return ReadOptions{
		Target: Target{Bookies: 3}, Mode: "sequential", Ledgers: 4, Entries: 20000,
		Ensemble: 3, WriteQuorum: 3, AckQuorum: 2, EntrySize: 1024, Readers: 4, InFlight: 64,
		Duration: 10 * time.Second,
	}
}

func (o ReadOptions) config() map[string]any {
	return map[string]any{
		"metadata": o.MetadataURI, "standalone": o.Standalone, "bookies": o.Bookies, "mode": o.Mode,
		"ledgers": o.Ledgers, "entries": o.Entries, "ensemble": o.Ensemble, "write_quorum": o.WriteQuorum,
		"ack_quorum": o.AckQuorum, "entry_size": o.EntrySize, "readers": o.Readers, "in_flight": o.InFlight,
		"cold": o.Cold, "duration_s": o.Duration.Seconds(),
	}
}

// RunRead writes the ledgers, then reads them back.
func RunRead(ctx context.Context, o ReadOptions) (*Result, error) {
	if o.Mode != "sequential" && o.Mode != "random" {
		return nil, fmt.Errorf("bench: read mode %q: want sequential or random", o.Mode)
	}
	if o.Ledgers < 1 || o.Entries < 1 || o.Readers < 1 || o.InFlight < 1 || o.Duration <= 0 || o.EntrySize < 0 {
		return nil, fmt.Errorf("bench: ledgers, entries, readers, in-flight and duration must be positive, entry size not negative")
	}
	if o.Cold && !o.Standalone {
		return nil, fmt.Errorf("bench: --cold needs --standalone (it restarts the bookies)")
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
	if err := fill(ctx, ledgers, o.Entries, o.EntrySize); err != nil {
		return nil, err
	}
	closeLedgers(ledgers)
	if o.Cold {
		for i := range t.cluster.Size() {
			if err := t.cluster.StopBookie(ctx, i); err != nil {
				return nil, err
			}
			if err := t.cluster.StartBookie(ctx, i); err != nil {
				return nil, err
			}
		}
	}
	handles := make([]*client.Ledger, len(ledgers))
	for i, lh := range ledgers {
		if handles[i], err = t.client.OpenLedger(ctx, lh.ID(), benchPassword, false); err != nil {
			return nil, err
		}
	}
	rec := NewRecorder()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for r := range o.Readers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			ledger := r % len(handles)
			next := int64(0)
			for runCtx.Err() == nil {
				lh := handles[ledger]
				first, last := next, min(next+int64(o.InFlight)-1, int64(o.Entries)-1)
				if o.Mode == "random" {
					first = rng.Int64N(int64(o.Entries))
					last = first
					lh = handles[rng.IntN(len(handles))]
				}
				start := monotime.Now()
				entries, err := lh.Read(runCtx, first, last)
				lat := time.Duration(monotime.Now() - start)
				if err != nil {
					if runCtx.Err() == nil {
						rec.Error()
					}
					continue
				}
				for _, e := range entries {
					rec.Record(lat, len(e.Payload))
				}
				next = last + 1
				if next >= int64(o.Entries) {
					ledger, next = (ledger+o.Readers)%len(handles), 0
				}
			}
		})
	}
	rec.Measure(ctx, 0, o.Duration, o.Progress)
	cancel()
	wg.Wait()
	return rec.Result("read-"+o.Mode, o.config()), nil
}

// fill writes entries to every ledger with many appends in flight.
func fill(ctx context.Context, ledgers []*client.Ledger, entries, size int) error {
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(rand.Uint32())
	}
	errs := make(chan error, len(ledgers))
	for _, lh := range ledgers {
		go func() {
			sem := make(chan struct{}, 512)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var first error
			for range entries {
				sem <- struct{}{}
				wg.Add(1)
				lh.AppendAsync(payload, func(_ int64, err error) {
					if err != nil {
						mu.Lock()
						first = cmpFirst(first, err)
						mu.Unlock()
					}
					<-sem
					wg.Done()
				})
			}
			wg.Wait()
			errs <- first
		}()
	}
	var first error
	for range ledgers {
		first = cmpFirst(first, <-errs)
	}
	return first
}

func cmpFirst(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
