package dlogbench

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/bench"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

// checkShape checks a result has the shared JSON shape, some operations and no error.
func checkShape(t *testing.T, res *bench.Result, workload string) {
	t.Helper()
	if res.Workload != workload || res.Ops <= 0 || res.DurationS <= 0 || res.OpsPerSec <= 0 || res.Errors != 0 {
		t.Fatalf("%s: %+v", workload, res)
	}
	if res.LatencyUs.P50 <= 0 || res.LatencyUs.P99 < res.LatencyUs.P50 || len(res.HistogramUs) == 0 {
		t.Fatalf("%s latency: %+v", workload, res.LatencyUs)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"workload", "ops", "bytes", "duration_s", "ops_per_sec", "mb_per_sec", "latency_us", "errors", "config"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("%s: JSON lacks %q: %s", workload, k, b)
		}
	}
	t.Logf("%s: %.0f ops/s, p50 %.0f us, p99 %.0f us, extra %v", workload, res.OpsPerSec, res.LatencyUs.P50, res.LatencyUs.P99, res.Extra)
}

func TestWriteWorkload(t *testing.T) {
	o := DefaultWriteOptions()
	o.Standalone, o.DataDir, o.Bookie = true, t.TempDir(), clustertest.SmallBookie
	o.Duration = time.Second
	o.MaxSegmentBytes = 1 << 20 // rolls during the run
	o.Baseline = true
	res, err := RunWrite(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkShape(t, res, "dlog-write")
	if res.Baseline == nil {
		t.Fatal("no baseline")
	}
	checkShape(t, res.Baseline, "ledger-append")
	if res.Extra["records_per_entry"] <= 1 || res.Extra["segments"] < 2 {
		t.Fatalf("extra %v", res.Extra)
	}
}

func TestTailWorkload(t *testing.T) {
	o := DefaultTailOptions()
	o.Standalone, o.DataDir, o.Bookie = true, t.TempDir(), clustertest.SmallBookie
	o.Duration = time.Second
	o.Rate = 2000
	o.Readers = 2
	res, err := RunTail(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkShape(t, res, "dlog-tail")
	if written := res.Extra["written"]; written <= 0 || float64(res.Ops) < written {
		t.Fatalf("%d records read by 2 readers, %v written", res.Ops, written)
	}
}

// The append-to-read figures cover the measured period only: records read during the warm-up,
// and the time the writer spends draining its last writes, are outside it (the readers'
// recorder once ran from before the warm-up to after the drain, so its duration was the
// warm-up's longer and its throughput and percentiles mixed both).
func TestTailMeasuresWithoutTheWarmup(t *testing.T) {
	o := DefaultTailOptions()
	o.Standalone, o.DataDir, o.Bookie = true, t.TempDir(), clustertest.SmallBookie
	o.Warmup, o.Duration = time.Second, time.Second
	o.Rate = 2000
	res, err := RunTail(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records read in %.2fs (warm-up %v, duration %v), %.0f/s", res.Ops, res.DurationS, o.Warmup, o.Duration, res.OpsPerSec)
	if res.DurationS > 1.2*o.Duration.Seconds() || res.DurationS < 0.8*o.Duration.Seconds() {
		t.Fatalf("append-to-read figures over %.2fs: want the measured %v, without the %v warm-up", res.DurationS, o.Duration, o.Warmup)
	}
}

// In open loop the append-to-read latency counts from each record's due time, as its
// acknowledgement latency does: when the log falls behind the rate, the end-to-end figure
// includes the queueing behind the pacer and can never come out below the acknowledgement
// latency it contains (the stamp was once the time of the write call, after that queueing).
func TestTailEndToEndCountsFromTheDueTime(t *testing.T) {
	o := DefaultTailOptions()
	o.Standalone, o.DataDir, o.Bookie = true, t.TempDir(), clustertest.SmallBookie
	o.Outstanding = 1
	o.Rate = 1e6 // far beyond what one record in flight can do
	o.Duration = time.Second
	res, err := RunTail(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	ack := res.Extra["ack_p50_us"]
	t.Logf("append-to-read p50 %.0f us, acknowledgement p50 %.0f us", res.LatencyUs.P50, ack)
	// The two medians are of slightly different sets of records in a queue that grows all
	// run: allow a little.
	if res.LatencyUs.P50 < 0.9*ack {
		t.Fatalf("append-to-read p50 %.0f us is below the acknowledgement p50 %.0f us it contains: not measured from the due time",
			res.LatencyUs.P50, ack)
	}
}

// A rate beyond what a nanosecond interval can express stays open loop (latency from each
// record's due time, which falls ever further behind), as the bench package's pacer does; it
// became an interval of 0, which produce takes for the closed loop.
func TestWriteHugeRateStaysOpenLoop(t *testing.T) {
	o := DefaultWriteOptions()
	o.Standalone, o.DataDir, o.Bookie = true, t.TempDir(), clustertest.SmallBookie
	o.Outstanding = 1
	o.Rate = 1e12
	o.Duration = 500 * time.Millisecond
	res, err := RunWrite(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records at a rate of %g/s: p50 %.0f us", res.Ops, o.Rate, res.LatencyUs.P50)
	if res.LatencyUs.P50 < 0.1*float64(o.Duration.Microseconds()) {
		t.Fatalf("p50 %.0f us at a rate of %g/s with one record outstanding: timed from its send, not its due time (closed loop)",
			res.LatencyUs.P50, o.Rate)
	}
}
