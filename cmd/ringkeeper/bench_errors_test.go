package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ringkeeper/ringkeeper/bench"
)

// captureStdout runs fn with os.Stdout (where bench prints its result) sent to a file, and
// returns what fn printed.
func captureStdout(t *testing.T, fn func()) string {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stdout
	os.Stdout = f
	defer func() { os.Stdout = saved }()
	fn()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBenchFailsWhenOperationsFailed: a workload whose operations failed (errors in its
// result, or in its reads or baseline) still prints its result, text or JSON, and then fails
// with an error counting them; one without errors succeeds.
func TestBenchFailsWhenOperationsFailed(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  bench.Result
		want int64 // failed operations; 0: success
	}{
		{"clean", bench.Result{Workload: "write", Ops: 10}, 0},
		{"errors", bench.Result{Workload: "write", Ops: 10, Errors: 3}, 3},
		{"reads", bench.Result{Workload: "storage", Ops: 10, Reads: &bench.Result{Workload: "storage-read", Errors: 2}}, 2},
		{"baseline", bench.Result{Workload: "journal", Ops: 10, Errors: 1, Baseline: &bench.Result{Workload: "pebble", Errors: 4}}, 5},
	} {
		for _, json := range []bool{false, true} {
			out := output{json: json}
			var progress io.Writer
			var err error
			printed := captureStdout(t, func() {
				_, err = out.run(context.Background(), t.TempDir(), &progress, func(context.Context) (*bench.Result, error) {
					res := tc.res
					return &res, nil
				})
			})
			if !strings.Contains(printed, tc.res.Workload) {
				t.Errorf("%s, json %v: printed %q, want the result", tc.name, json, printed)
			}
			switch {
			case tc.want == 0 && err != nil:
				t.Errorf("%s, json %v: %v, want success", tc.name, json, err)
			case tc.want > 0 && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d operations failed", tc.want))):
				t.Errorf("%s, json %v: %v, want an error saying %d operations failed", tc.name, json, err, tc.want)
			}
		}
	}
	// bench storage prints its adds and reads itself.
	out := output{}
	var err error
	captureStdout(t, func() {
		err = out.storageResult(&bench.Result{Workload: "storage", Ops: 1}, &bench.Result{Workload: "storage-read", Errors: 6}, nil, nil)
	})
	if err == nil || !strings.Contains(err.Error(), "6 operations failed") {
		t.Errorf("storage with 6 failed reads: %v, want an error saying 6 operations failed", err)
	}
}
