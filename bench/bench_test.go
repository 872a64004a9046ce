package bench

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// checkResult asserts the shared JSON shape of a result: it must marshal with every field the
// tools read, and the run must have done work without errors. It never asserts on speed.
func checkResult(t *testing.T, res *Result, workload string) {
	t.Helper()
	if res.Workload != workload || res.Ops <= 0 || res.DurationS <= 0 || res.Errors != 0 {
		t.Fatalf("result %+v", res)
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
			t.Errorf("JSON result lacks %q: %s", k, b)
		}
	}
	lat, _ := m["latency_us"].(map[string]any)
	for _, k := range []string{"p50", "p90", "p99", "p999", "max"} {
		if v, ok := lat[k].(float64); !ok || v <= 0 {
			t.Errorf("latency_us.%s = %v", k, lat[k])
		}
	}
}

func TestJournalWorkload(t *testing.T) {
	o := DefaultJournalOptions()
	o.Dirs = []string{t.TempDir(), t.TempDir()}
	o.Writers, o.Outstanding, o.Ledgers = 4, 8, 8
	o.Duration = time.Second
	o.MaxFileSize = 64 << 20
	res, err := RunJournal(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, "journal")
	// Open loop at a modest rate.
	o.Rate = 2000
	o.Duration = 500 * time.Millisecond
	res, err = RunJournal(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, res, "journal")
}

func TestStorageWorkload(t *testing.T) {
	for _, mode := range []string{"random", "sequential"} {
		o := DefaultStorageOptions()
		o.JournalDirs = []string{t.TempDir()}
		o.LedgerDirs = []string{t.TempDir(), t.TempDir()}
		o.Writers, o.Outstanding, o.Ledgers = 4, 16, 8
		o.Duration, o.ReadDuration = time.Second, 500*time.Millisecond
		o.WriteCacheSize = 16 << 20
		o.MaxFileSize = 64 << 20
		o.Read = mode
		o.ReadOutstanding = 4
		adds, reads, err := RunStorage(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, adds, "storage")
		checkResult(t, reads, "read-"+mode)
		if adds.Extra["checkpoints"] < 1 {
			t.Errorf("no checkpoint ran: %v", adds.Extra)
		}
	}
}

func TestStorageCompactionWorkload(t *testing.T) {
	o := DefaultStorageOptions()
	o.JournalDirs = []string{t.TempDir()}
	o.LedgerDirs = []string{t.TempDir()}
	o.Writers, o.Outstanding, o.Ledgers = 2, 16, 4
	o.Duration = 2 * time.Second // per phase, in two slices each
	o.WriteCacheSize = 16 << 20
	o.MaxFileSize = 64 << 20
	o.EntryLogSize = 2 << 20
	o.LedgerEntries = 200
	o.Compaction = true
	adds, _, err := RunStorage(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, adds, "storage")
	if adds.Baseline == nil {
		t.Fatal("no baseline phase")
	}
	checkResult(t, adds.Baseline, "storage-no-compaction")
	x := adds.Extra
	for _, k := range []string{"throughput_ratio", "p99_ratio", "compaction_written_mb_per_sec", "reclaimed_mb", "deleted_ledgers"} {
		if _, ok := x[k]; !ok {
			t.Errorf("extra lacks %s: %v", k, x)
		}
	}
	if x["deleted_ledgers"] == 0 || x["compacted_logs"]+x["removed_logs"] == 0 || x["reclaimed_mb"] <= 0 {
		t.Errorf("nothing was deleted or reclaimed: %v", x)
	}
	t.Logf("throughput ratio %.2f, p99 ratio %.2f, compaction %.1f MB/s written, %.1f MB reclaimed",
		x["throughput_ratio"], x["p99_ratio"], x["compaction_written_mb_per_sec"], x["reclaimed_mb"])
}
