package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latency holds latency percentiles in microseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// Sample is one second of progress.
type Sample struct {
	ElapsedS  float64 `json:"elapsed_s"`
	OpsPerSec float64 `json:"ops_per_sec"`
	MBPerSec  float64 `json:"mb_per_sec"`
	P50Us     float64 `json:"p50_us"`
	P99Us     float64 `json:"p99_us"`
	Errors    int64   `json:"errors"`
}

// Result is the outcome of one workload run. Its JSON shape is shared by every workload.
type Result struct {
	Workload  string         `json:"workload"`
	Ops       int64          `json:"ops"`
	Bytes     int64          `json:"bytes"`
	DurationS float64        `json:"duration_s"`
	OpsPerSec float64        `json:"ops_per_sec"`
	MBPerSec  float64        `json:"mb_per_sec"`
	LatencyUs Latency        `json:"latency_us"`
	Errors    int64          `json:"errors"`
	Config    map[string]any `json:"config"`
	// Reads is the read phase of a workload that writes and then reads.
	Reads *Result `json:"reads,omitempty"`
	// Baseline is the same workload run on a peer system, for comparison.
	Baseline *Result `json:"baseline,omitempty"`
	// PhysLimit is the disk's limit measured in the same run (physlimit's JSON).
	PhysLimit map[string]PhysLimitJob `json:"physlimit,omitempty"`
	// Ratios compare the result with PhysLimit.
	Ratios []Ratio `json:"ratios,omitempty"`
	// Timeline has one sample per second.
	Timeline []Sample `json:"timeline,omitempty"`
	// Extra holds workload-specific figures (group sizes, sync latency, ...).
	Extra map[string]float64 `json:"extra,omitempty"`
	// HistogramUs is the latency distribution (percentile → microseconds) for plots.
	HistogramUs []PercentilePoint `json:"histogram_us,omitempty"`
}

// PercentilePoint is one point of a latency percentile plot.
type PercentilePoint struct {
	Percentile float64 `json:"percentile"`
	Us         float64 `json:"us"`
}

// PhysLimitJob is one job of ../shared/tools/physlimit.
type PhysLimitJob struct {
	OpsPerSec float64 `json:"ops_per_sec"`
	MBPerSec  float64 `json:"mb_per_sec"`
	P50Us     float64 `json:"p50_us"`
	P99Us     float64 `json:"p99_us"`
}

// Recorder collects latencies and counts from many goroutines and prints progress.
type Recorder struct {
	// mu guards the histograms, stopped and the clock fields.
	mu       sync.Mutex
	total    *hdrhistogram.Histogram
	interval *hdrhistogram.Histogram

	ops    atomic.Int64
	bytes  atomic.Int64
	errors atomic.Int64

	start    time.Time
	end      time.Time
	stopped  bool // Stop was called: later completions fall outside the measured period
	timeline []Sample
	// pausedAt is when Pause stopped the clock (zero while running); paused is the time spent
	// paused before, left out of the measured duration.
	pausedAt time.Time
	paused   time.Duration
}

const maxLatencyNs = int64(120 * time.Second)

func newHistogram() *hdrhistogram.Histogram { return hdrhistogram.New(1, maxLatencyNs, 3) }

// NewRecorder returns a recorder whose clock starts now.
func NewRecorder() *Recorder {
	return &Recorder{total: newHistogram(), interval: newHistogram(), start: time.Now()}
}

// Record counts one operation of n payload bytes that took latency.
func (r *Recorder) Record(latency time.Duration, n int) {
	r.RecordBatch([]int64{int64(latency)}, n)
}

// RecordBatch counts len(latenciesNs) operations of n payload bytes each.
func (r *Recorder) RecordBatch(latenciesNs []int64, n int) {
	if len(latenciesNs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return // completed after the measured period (the drain of what was in flight)
	}
	for _, l := range latenciesNs {
		v := min(max(l, 1), maxLatencyNs)
		r.total.RecordValue(v)
		r.interval.RecordValue(v)
	}
	r.ops.Add(int64(len(latenciesNs)))
	r.bytes.Add(int64(len(latenciesNs) * n))
}

// Error counts one failed operation.
func (r *Recorder) Error() { r.errors.Add(1) }

// Errors returns the failures so far.
func (r *Recorder) Errors() int64 { return r.errors.Load() }

// Restart forgets the operations recorded so far (the end of a warm-up), not the failures:
// an error in the warm-up is still an error of the run.
func (r *Recorder) Restart() {
	r.mu.Lock()
	r.total.Reset()
	r.interval.Reset()
	r.ops.Store(0)
	r.bytes.Store(0)
	r.start = time.Now()
	r.timeline = nil
	r.pausedAt, r.paused = time.Time{}, 0
	r.mu.Unlock()
}

// Progress prints one line per interval to w until stop is closed.
func (r *Recorder) Progress(w io.Writer, every time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	lastOps, lastBytes, last := r.ops.Load(), r.bytes.Load(), time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			ops, bytes := r.ops.Load(), r.bytes.Load()
			secs := now.Sub(last).Seconds()
			r.mu.Lock()
			s := Sample{
				ElapsedS:  now.Sub(r.start).Seconds(),
				OpsPerSec: float64(ops-lastOps) / secs,
				MBPerSec:  float64(bytes-lastBytes) / secs / 1e6,
				P50Us:     float64(r.interval.ValueAtQuantile(50)) / 1e3,
				P99Us:     float64(r.interval.ValueAtQuantile(99)) / 1e3,
				Errors:    r.errors.Load(),
			}
			r.interval.Reset()
			r.timeline = append(r.timeline, s)
			r.mu.Unlock()
			lastOps, lastBytes, last = ops, bytes, now
			if w != nil {
				fmt.Fprintf(w, "%6.1fs  %10.0f ops/s  %8.1f MB/s  p50 %8.1f us  p99 %8.1f us  errors %d\n",
					s.ElapsedS, s.OpsPerSec, s.MBPerSec, s.P50Us, s.P99Us, s.Errors)
			}
		}
	}
}

// Measure is a workload's measured phase, while its workers run: an unmeasured warm-up (then
// the recorder restarts), then duration with one progress line a second to w (nil: none), then
// the end of the measurement. Stopping the workers is the caller's.
func (r *Recorder) Measure(ctx context.Context, warmup, duration time.Duration, w io.Writer) {
	if warmup > 0 {
		Sleep(ctx, warmup)
		r.Restart()
	}
	stop := make(chan struct{})
	var pw sync.WaitGroup
	pw.Go(func() { r.Progress(w, time.Second, stop) })
	Sleep(ctx, duration)
	r.Stop()
	close(stop)
	pw.Wait()
}

// Stop fixes the end of the measured period: operations that complete later are not counted
// (failures still are).
func (r *Recorder) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopped {
		r.end, r.stopped = time.Now(), true
	}
}

// Pause stops the recorder's clock until Resume: a workload that alternates phases measures
// each phase's own time. Operations still complete into it.
func (r *Recorder) Pause() {
	r.mu.Lock()
	if r.pausedAt.IsZero() {
		r.pausedAt = time.Now()
	}
	r.mu.Unlock()
}

// Resume restarts the clock stopped by Pause.
func (r *Recorder) Resume() {
	r.mu.Lock()
	if !r.pausedAt.IsZero() {
		r.paused += time.Since(r.pausedAt)
		r.pausedAt = time.Time{}
	}
	r.mu.Unlock()
}

// Ops returns the operations recorded so far.
func (r *Recorder) Ops() int64 { return r.ops.Load() }

// Result summarises the run.
func (r *Recorder) Result(workload string, config map[string]any) *Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := r.end
	if end.IsZero() {
		end = time.Now()
	}
	paused := r.paused
	if !r.pausedAt.IsZero() && end.After(r.pausedAt) {
		paused += end.Sub(r.pausedAt)
	}
	secs := (end.Sub(r.start) - paused).Seconds()
	ops, bytes := r.ops.Load(), r.bytes.Load()
	us := func(q float64) float64 { return float64(r.total.ValueAtQuantile(q)) / 1e3 }
	res := &Result{
		Workload:  workload,
		Ops:       ops,
		Bytes:     bytes,
		DurationS: secs,
		OpsPerSec: float64(ops) / secs,
		MBPerSec:  float64(bytes) / secs / 1e6,
		LatencyUs: Latency{P50: us(50), P90: us(90), P99: us(99), P999: us(99.9), Max: float64(r.total.Max()) / 1e3},
		Errors:    r.errors.Load(),
		Config:    config,
		Timeline:  append([]Sample(nil), r.timeline...),
	}
	for _, q := range []float64{0, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.95, 99.99, 100} {
		res.HistogramUs = append(res.HistogramUs, PercentilePoint{Percentile: q, Us: us(q)})
	}
	return res
}

// Summary prints a human summary of res.
func Summary(w io.Writer, res *Result) {
	fmt.Fprintf(w, "%s: %d ops in %.1fs: %.0f ops/s, %.1f MB/s, errors %d\n",
		res.Workload, res.Ops, res.DurationS, res.OpsPerSec, res.MBPerSec, res.Errors)
	l := res.LatencyUs
	fmt.Fprintf(w, "latency us: p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n", l.P50, l.P90, l.P99, l.P999, l.Max)
	for _, r := range res.Ratios {
		fmt.Fprintf(w, "disk limit: %s: %.1f / %.1f = %.2f\n", r.Name, r.Value, r.Limit, r.Ratio)
	}
	if res.Baseline != nil {
		b := res.Baseline
		fmt.Fprintf(w, "baseline %s: %.0f ops/s, %.1f MB/s, p50 %.1f us, p99 %.1f us; ratio ours/baseline: throughput %.2f, p99 %.2f\n",
			b.Workload, b.OpsPerSec, b.MBPerSec, b.LatencyUs.P50, b.LatencyUs.P99, res.OpsPerSec/b.OpsPerSec, res.LatencyUs.P99/b.LatencyUs.P99)
	}
	if len(res.Extra) > 0 {
		keys := slices.Sorted(maps.Keys(res.Extra))
		for _, k := range keys {
			fmt.Fprintf(w, "  %s %.1f", k, res.Extra[k])
		}
		fmt.Fprintln(w)
	}
}

// quietLogger logs warnings and errors of the system under test to stderr.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
