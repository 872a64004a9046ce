package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

func standalone(t *testing.T, bookies int) Target {
	return Target{Standalone: true, Bookies: bookies, DataDir: t.TempDir(), Bookie: clustertest.SmallBookie}
}

func TestWriteWorkload(t *testing.T) {
	o := DefaultWriteOptions()
	o.Target = standalone(t, 3)
	o.Ledgers, o.Writers, o.InFlight, o.Duration = 2, 2, 64, time.Second
	res, err := RunWrite(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, "write")
}

func TestReadWorkload(t *testing.T) {
	for _, mode := range []string{"sequential", "random"} {
		o := DefaultReadOptions()
		o.Target = standalone(t, 3)
		o.Mode, o.Ledgers, o.Entries, o.Readers, o.Duration = mode, 2, 500, 2, time.Second
		o.Cold = mode == "random"
		res, err := RunRead(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, res, "read-"+mode)
	}
}

func TestTailWorkload(t *testing.T) {
	o := DefaultTailOptions()
	o.Target = standalone(t, 3)
	o.Rate, o.Duration = 2000, time.Second
	res, err := RunTail(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, "tail")
}

func TestStressWorkload(t *testing.T) {
	o := DefaultStressOptions()
	o.Target = standalone(t, 4)
	o.Duration, o.MaxEntries = time.Second, 300
	res, err := RunStress(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, "stress")
}

// TestStressKillBookies runs the stress workload for 30 s (5 s with -short) while bookies are
// stopped and restarted at random; it must report zero lost entries.
func TestStressKillBookies(t *testing.T) {
	o := DefaultStressOptions()
	o.Target = standalone(t, 4)
	o.KillBookies, o.KillEvery, o.MaxEntries = true, 2*time.Second, 500
	o.Progress = testLog{t}
	o.Duration = 30 * time.Second
	if testing.Short() {
		o.Duration = 5 * time.Second
	}
	res, err := RunStress(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.Extra["ledgers_with_lost_entries"] != 0 {
		t.Fatalf("stress with bookie restarts: %d errors, extra %v", res.Errors, res.Extra)
	}
	if res.Extra["bookie_restarts"] == 0 {
		t.Fatalf("no bookie was restarted: %v", res.Extra)
	}
	t.Logf("%d acknowledged adds, %v", res.Ops, res.Extra)
}

func TestPebbleBaselineAndReport(t *testing.T) {
	o := DefaultJournalOptions()
	o.Dirs = []string{t.TempDir()}
	o.Writers, o.Outstanding, o.Duration = 4, 4, 500*time.Millisecond
	o.MaxFileSize = 64 << 20
	base, err := RunPebbleBaseline(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, base, "pebble-synced-commit")
	res, err := RunJournal(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	res.Baseline = base
	var b bytes.Buffer
	if err := WriteReport(&b, res); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{"<svg", "polyline", "pebble-synced-commit", "journal", "Latency percentiles"} {
		if !strings.Contains(html, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// testLog writes progress and verification messages to the test log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestServerWorkload(t *testing.T) {
	c, err := standalone(t, 1).startCluster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.cleanup()
	o := DefaultServerOptions()
	o.Bookie = c.cluster.BookieAddrs()[0]
	o.Connections, o.InFlight, o.Duration = 4, 16, time.Second
	res, err := RunServer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, "server")
	if res.Extra["acked"] != res.Extra["sent"] {
		t.Errorf("closed loop: %v adds sent, %v answered", res.Extra["sent"], res.Extra["acked"])
	}

	// Open loop: the pacer never sends more than the rate asks for.
	o.Rate = 2000
	res, err = RunServer(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, "server")
	if want := o.Rate * o.Duration.Seconds(); float64(res.Ops) > 1.1*want || float64(res.Ops) < 0.5*want {
		t.Errorf("open loop at %v/s for %v: %d adds answered", o.Rate, o.Duration, res.Ops)
	}
}
