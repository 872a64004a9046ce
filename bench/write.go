package bench

import (
	"context"
	"encoding/binary"
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

// WriteOptions configures the write workload: clients → bookies over the network.
type WriteOptions struct {
	Target
	Ensemble, WriteQuorum, AckQuorum int
	EntrySize                        int
	// Ledgers are written round-robin by the writers (each writer owns Ledgers/Writers).
	Ledgers int
	// Clients is the number of client instances; ledger i belongs to client i mod Clients, and
	// each client has its own connection to every bookie.
	Clients int
	Writers int
	// InFlight is the number of appends each writer keeps outstanding.
	InFlight int
	// Rate is the total appends per second (open loop); 0 means closed loop.
	Rate     float64
	Duration time.Duration
	Warmup   time.Duration
	Progress io.Writer
}

// DefaultWriteOptions returns the defaults of `ringkeeper bench write`.
func DefaultWriteOptions() WriteOptions {
	return WriteOptions{
		Target:   Target{Bookies: 3},
		Ensemble: 3, WriteQuorum: 3, AckQuorum: 2, EntrySize: 1024, Ledgers: 1, Clients: 1, Writers: 1, InFlight: 1000,
		Duration: 10 * time.Second,
	}
}

func (o WriteOptions) config() map[string]any {
	return map[string]any{
		"metadata": o.MetadataURI, "standalone": o.Standalone, "bookies": o.Bookies,
		"ensemble": o.Ensemble, "write_quorum": o.WriteQuorum, "ack_quorum": o.AckQuorum,
		"entry_size": o.EntrySize, "ledgers": o.Ledgers, "clients": o.Clients, "writers": o.Writers, "in_flight": o.InFlight,
		"rate": o.Rate, "duration_s": o.Duration.Seconds(), "warmup_s": o.Warmup.Seconds(),
	}
}

func (o WriteOptions) validate() error {
	if o.Writers < 1 || o.InFlight < 1 || o.Ledgers < o.Writers || o.Duration <= 0 || o.EntrySize < 0 ||
		o.Clients < 1 || o.Clients > o.Ledgers || !(o.Rate >= 0) {
		return fmt.Errorf("bench: writers (%d), clients (%d) and in-flight (%d) must be positive, ledgers (%d) at least writers and clients, duration positive, rate (%g) not negative",
			o.Writers, o.Clients, o.InFlight, o.Ledgers, o.Rate)
	}
	return nil
}

// RunWrite runs the write workload.
func RunWrite(ctx context.Context, o WriteOptions) (*Result, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	t, err := o.Target.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer t.cleanup()
	clients, err := t.moreClients(ctx, o.Clients)
	if err != nil {
		return nil, err
	}
	var ledgers []*client.Ledger
	for i := range o.Ledgers {
		lh, err := createLedgers(ctx, clients[i%len(clients)], 1, o.Ensemble, o.WriteQuorum, o.AckQuorum)
		if err != nil {
			closeLedgers(ledgers)
			return nil, err
		}
		ledgers = append(ledgers, lh...)
	}
	defer closeLedgers(ledgers)
	rec := NewRecorder()
	res, err := runAppends(ctx, appendLoad{
		ledgers: ledgers, writers: o.Writers, inFlight: o.InFlight, entrySize: o.EntrySize, rate: o.Rate,
		duration: o.Duration, warmup: o.Warmup, progress: o.Progress,
	}, rec)
	if err != nil {
		return nil, err
	}
	r := rec.Result("write", o.config())
	r.Extra = map[string]float64{"appended": float64(res.appended), "failed": float64(res.failed)}
	return r, nil
}

var benchPassword = []byte("ringkeeper-bench")

func createLedgers(ctx context.Context, cl *client.Client, n, e, qw, qa int) ([]*client.Ledger, error) {
	var out []*client.Ledger
	for range n {
		lh, err := cl.CreateLedger(ctx, client.CreateOptions{EnsembleSize: e, WriteQuorum: qw, AckQuorum: qa, Password: benchPassword})
		if err != nil {
			closeLedgers(out)
			return nil, err
		}
		out = append(out, lh)
	}
	return out, nil
}

func closeLedgers(ls []*client.Ledger) {
	for _, lh := range ls {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		lh.Close(ctx)
		cancel()
	}
}

// appendLoad drives async appends: each writer keeps inFlight appends outstanding over its
// share of the ledgers, closed loop or at a total rate.
type appendLoad struct {
	ledgers   []*client.Ledger
	writers   int
	inFlight  int
	entrySize int
	rate      float64
	duration  time.Duration
	warmup    time.Duration
	progress  io.Writer
	// stamp writes the time the append was due (monotime, this process's clock) into the
	// payload, for the tail workload's end-to-end latency: in open loop that counts the
	// queueing behind the pacer, as the append latency does.
	stamp bool
	// onAck, if set, is called for every acknowledged entry.
	onAck func(ledger, entry int64)
}

type appendResult struct {
	appended, failed int64
}

func runAppends(ctx context.Context, l appendLoad, rec *Recorder) (appendResult, error) {
	var appended, failed atomic.Int64
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for w := range l.writers {
		var mine []*client.Ledger
		for i := w; i < len(l.ledgers); i += l.writers {
			mine = append(mine, l.ledgers[i])
		}
		wg.Go(func() {
			// One payload buffer per add in flight: a slot is taken before an append and given
			// back by its callback (or reused by it for the next append), so the slots also
			// bound what is in flight (the client keeps the payload until the entry is
			// acknowledged).
			payloads := make([][]byte, l.inFlight)
			free := make(chan int, l.inFlight)
			for i := range payloads {
				payloads[i] = make([]byte, max(l.entrySize, 8))
				for j := range payloads[i] {
					payloads[i][j] = byte(rand.Uint32())
				}
				free <- i
			}
			pace := newPacer(l.rate, l.writers)
			var issued atomic.Int64 // picks each append's ledger
			// One completion per slot, made once: a closure per append would allocate.
			type slotState struct {
				lh   *client.Ledger
				sent int64 // when the append was due
				done func(id int64, err error)
			}
			slots := make([]slotState, l.inFlight)
			// issue appends the payload of slot; sent is when the append was due.
			issue := func(slot int, sent int64) {
				st := &slots[slot]
				st.lh = mine[(issued.Add(1)-1)%int64(len(mine))]
				st.sent = sent
				p := payloads[slot][:l.entrySize]
				if l.stamp {
					p = payloads[slot][:max(l.entrySize, 8)]
					binary.LittleEndian.PutUint64(p, uint64(sent))
				}
				st.lh.AppendAsync(p, st.done)
			}
			for slot := range slots {
				st := &slots[slot]
				st.done = func(id int64, err error) {
					now := monotime.Now() // the completion, and the next append's start in a closed loop
					if err != nil {
						rec.Error()
						failed.Add(1)
					} else {
						rec.Record(time.Duration(now-st.sent), l.entrySize)
						appended.Add(1)
						if l.onAck != nil {
							l.onAck(st.lh.ID(), id)
						}
					}
					// Closed loop: the next append leaves from this callback, as the raw-codec
					// load (bench server) sends its next add from the goroutine that read the
					// response. Handing the slot to the writer goroutine instead costs a wake-up
					// per round of adds, about 0.1 ms on 2 cores, and ~8% of the throughput.
					if err == nil && pace.closedLoop() && runCtx.Err() == nil {
						issue(slot, now)
						return
					}
					free <- slot
				}
			}
			for {
				slot := -1
				select {
				case slot = <-free:
				case <-runCtx.Done():
				}
				if runCtx.Err() != nil {
					if slot >= 0 {
						free <- slot
					}
					break
				}
				issue(slot, pace.wait())
			}
			// Every slot comes back once its append has completed.
			for range l.inFlight {
				<-free
			}
		})
	}
	rec.Measure(ctx, l.warmup, l.duration, l.progress)
	cancel()
	wg.Wait()
	res := appendResult{appended: appended.Load(), failed: failed.Load()}
	if res.appended == 0 && res.failed > 0 {
		return res, errors.New("bench: every append failed")
	}
	return res, nil
}
