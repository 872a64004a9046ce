package main

import (
	"fmt"
	"io"
	"strings"
	"testing"
)

// bench refuses flags and arguments it cannot run with a clear error, before any workload
// starts: an empty directory list panicked (index out of range), a stray argument was ignored
// and the workload ran (`bench journal 30s` ran the default 10 s), and a rate of NaN ran
// closed loop and then could not be written as JSON.
func TestBenchRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"journal", "--dir="}, "--dir"},
		{[]string{"storage", "--journal-dir=", "--ledger-dir", dir}, "--journal-dir"},
		{[]string{"storage", "--journal-dir", dir, "--ledger-dir=", "--read", "random"}, "--ledger-dir"},
		{[]string{"journal", "--dir", dir, "--duration", "1ms", "30s"}, `"30s"`},
		{[]string{"storage", "--journal-dir", dir, "--ledger-dir", dir, "--duration", "1ms", "x"}, `"x"`},
		{[]string{"write", "--standalone", "--duration", "1ms", "x"}, `"x"`},
		{[]string{"read", "--standalone", "--duration", "1ms", "x"}, `"x"`},
		{[]string{"tail", "--standalone", "--duration", "1ms", "x"}, `"x"`},
		{[]string{"stress", "--standalone", "--duration", "1ms", "x"}, `"x"`},
		{[]string{"server", "--standalone", "--duration", "1ms", "x"}, `"x"`},
		{[]string{"dlog", "write", "--standalone", "--duration", "1ms", "x"}, `"x"`},
		{[]string{"dlog", "tail", "--standalone", "--duration", "1ms", "x"}, `"x"`},
		{[]string{"journal", "--dir", dir, "--duration", "1ms", "--rate", "NaN"}, "rate"},
		{[]string{"server", "--standalone", "--duration", "1ms", "--rate", "NaN"}, "rate"},
		{[]string{"dlog", "write", "--standalone", "--duration", "1ms", "--rate", "NaN"}, "rate"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := benchCommand()
			cmd.SetArgs(append(tc.args, "--json"))
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			err := func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				return cmd.Execute()
			}()
			if err == nil || strings.HasPrefix(err.Error(), "panic") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one that names %s", err, tc.want)
			}
		})
	}
}
