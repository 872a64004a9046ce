package main

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func TestSetProcsDoublesTheDefaultUnlessTheUserChose(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)

	t.Setenv("GOMAXPROCS", "")
	setProcs()
	if got := runtime.GOMAXPROCS(0); got != procsPerCPU*before {
		t.Fatalf("GOMAXPROCS %d after setProcs, want %d × %d", got, procsPerCPU, before)
	}
	runtime.GOMAXPROCS(before)

	t.Setenv("GOMAXPROCS", "1")
	setProcs()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS %d after setProcs with the variable set, want it left at %d", got, before)
	}
}

// TestSecondSignalForcesExit: the first SIGINT or SIGTERM cancels the commands' context (a
// graceful stop: bookies drained, etcd closed); a second one ends the process at once, for a
// stop that hangs. The signals stayed caught after the first, so a second Ctrl-C did nothing
// and only SIGKILL ended a shutdown that hung (up to standalone's and bookie's 30 s each).
func TestSecondSignalForcesExit(t *testing.T) {
	if os.Getenv("RINGKEEPER_SIGNAL_HELPER") == "1" {
		ctx, stop := signalContext()
		defer stop()
		fmt.Println("ready")
		<-ctx.Done()
		fmt.Println("stopping")
		time.Sleep(time.Minute) // a shutdown that hangs
		return
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSecondSignalForcesExit$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RINGKEEPER_SIGNAL_HELPER=1")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewScanner(out)
		waitFor := func(want string) {
			for lines.Scan() {
				if lines.Text() == want {
					return
				}
			}
			cmd.Process.Kill()
			t.Fatalf("the helper ended before printing %q", want)
		}
		waitFor("ready")
		cmd.Process.Signal(sig)
		waitFor("stopping")
		exited := make(chan error, 1)
		go func() {
			io.Copy(io.Discard, out)
			exited <- cmd.Wait()
		}()
		cmd.Process.Signal(sig)
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != sig {
				t.Errorf("%v twice: the process ended with %v, want killed by %v", sig, err, sig)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("%v twice: the process still ran 10 s after the second", sig)
		}
	}
}

// TestProfilesWrittenWhenTheCommandFails: --cpuprofile writes its profile whatever the
// command's outcome. A command that failed skipped cobra's post-run hook, which stops the
// profile (and --trace's trace): the profile was left empty, just when a failure was what one
// wanted to look at.
func TestProfilesWrittenWhenTheCommandFails(t *testing.T) {
	cpu := filepath.Join(t.TempDir(), "cpu.pprof")
	err := execute(context.Background(), rootCommand(), []string{"--cpuprofile", cpu, "shell", "ledger", "delete", "not-a-number"})
	if err == nil {
		t.Fatal("shell ledger delete not-a-number: no error")
	}
	// A profile is a gzipped protocol buffer, written whole when the profile stops.
	f, err := os.Open(cpu)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	zr, err := gzip.NewReader(f)
	if err == nil {
		n, err = io.Copy(io.Discard, zr)
	}
	if err != nil || n == 0 {
		t.Fatalf("--cpuprofile of a failed command: %d bytes of profile, %v", n, err)
	}
}
