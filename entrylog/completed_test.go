package entrylog

import (
	"errors"
	"slices"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// TestCompletedLogs checks what garbage collection may touch: never the current log nor a
// sealed one waiting for finalization; every log of an earlier run.
func TestCompletedLogs(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	e := mustOpen(t, cfg)
	if got := e.CompletedLogs(); len(got) != 0 {
		t.Fatalf("a new directory has completed logs %x", got)
	}
	addRange(t, e, []int64{1, 2}, 0, 200) // rolls without a Flush: the last sealed log is pending
	logs := e.Logs()
	if len(logs) < 3 {
		t.Fatalf("only %d logs", len(logs))
	}
	done := e.CompletedLogs()
	if slices.Contains(done, e.CurrentLogID()) {
		t.Fatalf("completed logs %x include the current log %x", done, e.CurrentLogID())
	}
	if slices.Contains(done, logs[len(logs)-2]) {
		t.Fatalf("completed logs %x include the sealed log %x not yet finalized", done, logs[len(logs)-2])
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	done = e.CompletedLogs()
	if want := logs[:len(logs)-1]; !slices.Equal(done, want) {
		t.Fatalf("after a flush: completed %x, want %x", done, want)
	}
	for _, id := range done {
		n, err := e.Size(id)
		if err != nil || n < cfg.LogSizeLimit/2 {
			t.Fatalf("size of %x: %d, %v", id, n, err)
		}
		if err := e.Remove(id); err != nil {
			t.Fatalf("remove completed log %x: %v", id, err)
		}
		if _, err := e.Size(id); !errors.Is(err, ErrNoSuchLog) {
			t.Fatalf("size of a removed log: %v", err)
		}
	}
	last := e.CurrentLogID()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, cfg)
	defer e.Close()
	if done := e.CompletedLogs(); !slices.Equal(done, []uint64{last}) {
		t.Fatalf("after reopening: completed %x, want the previous run's log %x", done, last)
	}
}
