package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
)

// An operation that completes after Stop fixed the end of the measured period lies outside
// it: counting it puts work done after the window over the window's duration.
func TestRecorderIgnoresOpsAfterStop(t *testing.T) {
	r := NewRecorder()
	for range 10 {
		r.Record(time.Millisecond, 100)
	}
	r.Stop()
	// The drain: adds still in flight at the end complete after it (runAppends, RunJournal,
	// RunStorage, RunServer and RunPebbleBaseline all call Result after waiting for them).
	for range 1000 {
		r.Record(time.Millisecond, 100)
	}
	res := r.Result("x", nil)
	if res.Ops != 10 || res.Bytes != 1000 {
		t.Fatalf("ops %d, bytes %d recorded within the measured period; want 10 and 1000 (throughput %.0f ops/s over %.6fs)",
			res.Ops, res.Bytes, res.OpsPerSec, res.DurationS)
	}
}

// The tail workload runs open loop (10000/s by default). Its append latency counts from each
// append's due time, and so must the end-to-end latency (append to read): when the cluster
// falls behind the pacer, the end-to-end figure includes the queueing the append figure does,
// and can never come out below the append latency it contains.
func TestTailEndToEndCountsFromTheDueTime(t *testing.T) {
	o := DefaultTailOptions()
	o.Target = standalone(t, 3)
	o.Ledgers, o.InFlight = 1, 1
	o.Rate = 1e6 // far beyond what one append in flight can do
	o.Duration = time.Second
	res, err := RunTail(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	appendP50 := res.Extra["append_p50_us"]
	t.Logf("end-to-end p50 %.0f us, p99 %.0f us; append p50 %.0f us, p99 %.0f us",
		res.LatencyUs.P50, res.LatencyUs.P99, appendP50, res.Extra["append_p99_us"])
	// Each entry's end-to-end latency contains its append latency, but the two medians are of
	// slightly different sets of entries (each recorder keeps its own window) in a queue that
	// grows all run: allow a little. Counted from the send time, it was 230 times lower.
	if res.LatencyUs.P50 < 0.9*appendP50 {
		t.Fatalf("append-to-read p50 %.0f us is below the append p50 %.0f us it contains: the end-to-end latency is not measured from the intended send time",
			res.LatencyUs.P50, appendP50)
	}
}

// RunTail refuses options it cannot run: with no append in flight allowed it would append
// nothing and report an empty success (a negative count panicked in runAppends).
func TestTailRejectsNoInFlight(t *testing.T) {
	o := DefaultTailOptions()
	o.Target = standalone(t, 3)
	o.InFlight = 0
	o.Duration = 300 * time.Millisecond
	res, err := RunTail(context.Background(), o)
	if err == nil {
		t.Fatalf("in-flight 0 accepted: %d ops, %.0f ops/s, %d errors, extra %v", res.Ops, res.OpsPerSec, res.Errors, res.Extra)
	}
}

// In a closed loop each append is timed from about when it was sent. The journal bench's
// writer shares one clock read among entries that came back together; a writer that never
// has to wait (completed entries pile up faster than it re-issues them) once timed every
// append from one ever older reading, so latency grew with the run. Little's law bounds the
// mean time in the journal by outstanding / throughput, and a median is at most twice the mean.
func TestJournalClosedLoopLatencyIsFromSend(t *testing.T) {
	o := DefaultJournalOptions()
	o.Dirs = []string{t.TempDir()}
	o.Writers, o.Outstanding, o.Ledgers = 1, 200000, 1
	o.EntrySize = 64
	o.Sync = false
	o.Duration = 2 * time.Second
	o.MaxFileSize = 64 << 20
	res, err := RunJournal(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	bound := float64(o.Writers*o.Outstanding) / res.OpsPerSec * 1e6 // us
	var tl []float64
	for _, s := range res.Timeline {
		tl = append(tl, s.P50Us)
	}
	t.Logf("%.0f ops/s, p50 %.0f us, p99 %.0f us, Little's-law mean bound %.0f us, per-second p50 %v",
		res.OpsPerSec, res.LatencyUs.P50, res.LatencyUs.P99, bound, tl)
	if res.LatencyUs.P50 > 2*bound {
		t.Fatalf("p50 %.0f us exceeds twice the longest mean time an append can spend in the journal (%.0f us)",
			res.LatencyUs.P50, bound)
	}
}

// A positive rate beyond what a nanosecond clock can pace stays open loop: it once became an
// interval of 0, which is the closed loop's marker.
func TestPacerNeverTurnsAHugeRateIntoAClosedLoop(t *testing.T) {
	p := newPacer(1e12, 1)
	if p.closedLoop() {
		t.Fatal("rate 1e12/s paced as a closed loop")
	}
	if due := p.wait(); p.wait() <= due {
		t.Fatal("two operations due at the same time")
	}
}

// Options a workload cannot run are refused before it starts anything (a negative entry size
// panicked, a zero duration or read concurrency ran and reported an empty success).
func TestWorkloadsRefuseOptionsTheyCannotRun(t *testing.T) {
	ctx := context.Background()
	stress := func(f func(*StressOptions)) error {
		o := DefaultStressOptions()
		f(&o)
		_, err := RunStress(ctx, o)
		return err
	}
	read := func(f func(*ReadOptions)) error {
		o := DefaultReadOptions()
		f(&o)
		_, err := RunRead(ctx, o)
		return err
	}
	storage := func(f func(*StorageOptions)) error {
		o := DefaultStorageOptions()
		o.JournalDirs, o.LedgerDirs = []string{t.TempDir()}, []string{t.TempDir()}
		f(&o)
		_, _, err := RunStorage(ctx, o)
		return err
	}
	for name, err := range map[string]error{
		"stress entry size -1":     stress(func(o *StressOptions) { o.EntrySize = -1 }),
		"stress duration 0":        stress(func(o *StressOptions) { o.Duration = 0 }),
		"read duration 0":          read(func(o *ReadOptions) { o.Duration = 0 }),
		"storage read in-flight 0": storage(func(o *StorageOptions) { o.Read, o.ReadOutstanding = "random", 0 }),
		"storage rate -1":          storage(func(o *StorageOptions) { o.Rate = -1 }),
	} {
		if err == nil || !strings.Contains(err.Error(), "must be") {
			t.Errorf("%s: %v, want the options refused before anything starts", name, err)
		}
	}
}

// A loss found by the verification during the run is a loss of the run, even when the
// ledger is deleted afterwards and so never verified again at the end: it was once dropped
// (only a successful verification was counted), and a stress run that found lost entries
// passed.
func TestStressCountsALossFoundDuringTheRun(t *testing.T) {
	var mu sync.Mutex
	reported := map[int64]bool{}
	var duringRun int
	verifyStress = func(ctx context.Context, cl *client.Client, sl *stressLedger, size int) error {
		mu.Lock()
		defer mu.Unlock()
		if reported[sl.id] {
			return verifyStressLedger(ctx, cl, sl, size)
		}
		// The run's own verifications have no deadline; the final ones have one.
		if _, ok := ctx.Deadline(); !ok {
			duringRun++
		}
		reported[sl.id] = true // each ledger's first verification finds a loss
		return fmt.Errorf("%w: ledger %d (injected)", errLost, sl.id)
	}
	t.Cleanup(func() { verifyStress = verifyStressLedger })
	o := DefaultStressOptions()
	o.Target = standalone(t, 4)
	o.Duration, o.MaxEntries = time.Second, 100
	res, err := RunStress(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d ledgers reported lost (%d by the verification during the run); result: %d errors, extra %v",
		len(reported), duringRun, res.Errors, res.Extra)
	if duringRun == 0 {
		t.Fatal("no ledger was verified during the run: the test proves nothing")
	}
	if got := res.Extra["ledgers_with_lost_entries"]; got != float64(len(reported)) || res.Errors < int64(len(reported)) {
		t.Fatalf("%d ledgers were found with lost entries, the result reports %v (errors %d)", len(reported), got, res.Errors)
	}
}

// The journal bench paces its writers itself: a rate beyond what its nanosecond interval can
// express must stay open loop (latency from each append's due time, which falls ever further
// behind), as newPacer does; it became an interval of 0, the closed loop's marker, so the
// latency came out as the journal's own, as if nothing queued.
func TestJournalHugeRateStaysOpenLoop(t *testing.T) {
	o := DefaultJournalOptions()
	o.Dirs = []string{t.TempDir()}
	o.Writers, o.Outstanding, o.Ledgers = 1, 1, 1
	o.EntrySize = 64
	o.Sync = false
	o.Rate = 1e12
	o.Duration = 300 * time.Millisecond
	o.MaxFileSize = 16 << 20
	res, err := RunJournal(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d appends at a rate of %g/s: p50 %.0f us, p99 %.0f us", res.Ops, o.Rate, res.LatencyUs.P50, res.LatencyUs.P99)
	// Open loop, the appends are due 1 ns apart and done one at a time: by the middle of the
	// run the median append is due a good part of the run before it completes.
	if res.LatencyUs.P50 < 0.1*float64(o.Duration.Microseconds()) {
		t.Fatalf("p50 %.0f us at a rate of %g/s with one append in flight: timed from its send, not its due time (closed loop)",
			res.LatencyUs.P50, o.Rate)
	}
}
