package journal

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// TestFaultSeamCrash crashes the in-memory file system at random moments while many
// goroutines append, then replays what survived: every acknowledged record must be there, byte
// for byte, and nothing that is there may be damaged (replayAll checks every payload).
func TestFaultSeamCrash(t *testing.T) {
	rounds := 60
	if testing.Short() {
		rounds = 10
	}
	for round := range rounds {
		rng := rand.New(rand.NewPCG(uint64(round), 99))
		mode := []diskio.CrashMode{diskio.CrashSyncedOnly, diskio.CrashPrefix, diskio.CrashSubset}[round%3]
		fs := diskio.NewMem(4096)
		cfg := memConfig(fs)
		cfg.MaxFileSize = 512 << 10
		cfg.PipelineDepth = 1 + round%3
		j, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		acked := make(map[key]bool)
		var stop atomic.Bool
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Go(func() {
				ledger := int64(w + 1)
				for entry := int64(0); !stop.Load(); entry++ {
					e := &Entry{Type: RecordData, LedgerID: ledger, EntryID: entry,
						Payload: testPayload(ledger, entry, payloadSize(ledger, entry)),
						Done: func(e *Entry, err error) {
							if err == nil {
								mu.Lock()
								acked[key{e.LedgerID, e.EntryID}] = true
								mu.Unlock()
							}
						}}
					if j.Append(e) != nil {
						return
					}
				}
			})
		}
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
		// A sync that completed before the crash made its records durable in the crash image;
		// a sync after it fails, so every acknowledgement, even one delivered after Crash
		// returns, must survive.
		crashed := fs.Crash(mode, rng)
		stop.Store(true)
		j.Close()
		wg.Wait()
		seen, _, err := replayAll(t, crashed, cfg.Dir, Mark{})
		if err != nil {
			t.Fatalf("round %d (mode %d): replay after crash: %v", round, mode, err)
		}
		mu.Lock()
		for k := range acked {
			if seen[k] != 1 {
				t.Fatalf("round %d (mode %d): acknowledged record %v replayed %d times", round, mode, k, seen[k])
			}
		}
		mu.Unlock()
	}
}

const crashChildEnv = "RINGKEEPER_JOURNAL_CRASH_CHILD"

// TestKill9Crash runs a child process that appends from many goroutines and prints every
// acknowledged record; the parent SIGKILLs it at a random moment and checks that replay returns
// every acknowledged record byte for byte. The directory carries over between rounds, so later
// rounds also replay across earlier torn tails.
func TestKill9Crash(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	rounds := 50
	if testing.Short() {
		rounds = 8
	}
	es := engines(t)
	dir := t.TempDir()
	acked := make(map[key]bool)
	total := 0
	for round := range rounds {
		if round%10 == 0 {
			dir = t.TempDir()
			clear(acked)
		}
		engine := es[round%len(es)]
		cmd := exec.Command(os.Args[0], "-test.run=^TestKill9Crash$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, "RINGKEEPER_ENGINE="+engine.String())
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := collectAcked(out)
		time.Sleep(time.Duration(40+rand.IntN(120)) * time.Millisecond)
		cmd.Process.Kill()
		ks := <-lines
		if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != -1 {
			t.Fatalf("round %d: child did not die by the kill: %v", round, err)
		}
		for _, k := range ks {
			acked[k] = true
		}
		seen, _, err := replayAll(t, diskio.NewOS(), dir, Mark{})
		if err != nil {
			t.Fatalf("round %d (%v): replay: %v", round, engine, err)
		}
		for k := range acked {
			if seen[k] == 0 {
				t.Fatalf("round %d (%v): acknowledged record %v lost (%d acknowledged this round)", round, engine, k, len(ks))
			}
		}
		total += len(ks)
	}
	if total < rounds {
		t.Fatalf("children acknowledged only %d records in %d rounds: the test proves little", total, rounds)
	}
	t.Logf("%d records acknowledged and verified over %d kills", total, rounds)
}

// crashChild appends until killed (appendAndReportUntilKilled).
func crashChild(dir string) {
	engine, _ := diskio.ParseEngine(os.Getenv("RINGKEEPER_ENGINE"))
	cfg := DefaultConfig(dir)
	cfg.Engine = engine
	cfg.MaxRecordSize = 64 << 10
	cfg.BufferedWritesThreshold = 64 << 10
	cfg.MaxFileSize = 1 << 20
	// Replay first, as a bookie does; it also truncates the previous round's torn tail.
	if _, err := Replay(t0(), ReplayOptions{Dir: dir, Truncate: true}, func(*Record) error { return nil }); err != nil {
		fmt.Fprintln(os.Stderr, "child replay:", err)
		os.Exit(3)
	}
	j, err := Open(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	appendAndReportUntilKilled(j)
}

// appendAndReportUntilKilled appends from 16 goroutines, one ledger each (ids unique across
// rounds), writing "ledger entry" to stdout for each acknowledged record with one write system
// call, so that the parent has the line as soon as the acknowledgement happened. It never
// returns: the child is killed.
func appendAndReportUntilKilled(j *Journal) {
	base := time.Now().UnixNano()
	var outMu sync.Mutex
	for w := range 16 {
		go func() {
			ledger := base + int64(w)
			for entry := int64(0); ; entry++ {
				e := &Entry{Type: RecordData, LedgerID: ledger, EntryID: entry,
					Payload: testPayload(ledger, entry, payloadSize(ledger, entry)),
					Done: func(e *Entry, err error) {
						if err == nil {
							line := fmt.Appendf(nil, "%d %d\n", e.LedgerID, e.EntryID)
							outMu.Lock()
							os.Stdout.Write(line)
							outMu.Unlock()
						}
					}}
				if j.Append(e) != nil {
					return
				}
			}
		}()
	}
	select {}
}

// collectAcked reads a child's "ledger entry" lines until its stdout closes, then sends them.
func collectAcked(out io.Reader) <-chan []key {
	lines := make(chan []key, 1)
	go func() {
		var ks []key
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var k key
			if _, err := fmt.Sscanf(sc.Text(), "%d %d", &k.ledger, &k.entry); err == nil {
				ks = append(ks, k)
			}
		}
		lines <- ks
	}()
	return lines
}
