package engine

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// TestCrashAtEveryCompactionStep stops a compaction after each of its steps with a simulated
// power loss (only synced data survives, plus, in CrashSubset mode, random sectors of the
// rest), restarts, and checks that every entry of every live ledger is readable byte for byte
// and that no deleted ledger is back. The deletions are made durable (GC, then a checkpoint)
// before the compaction, so the journal holds nothing of the deleted ledgers. The restarted
// engine then compacts again, over whatever the crash left.
func TestCrashAtEveryCompactionStep(t *testing.T) {
	steps := []checkpointStep{stepCompactChunkReady, stepCompactCopied, stepCompactLogSynced, stepCompactIndexSynced, stepCompactLogRemoved}
	modes := []diskio.CrashMode{diskio.CrashSyncedOnly, diskio.CrashSubset}
	hits := []int{0, 2} // the first chunk or log, and the third
	if raceEnabled || testing.Short() {
		modes, hits = modes[1:], hits[:1]
	}
	for _, step := range steps {
		for _, mode := range modes {
			for _, nth := range hits {
				t.Run(fmt.Sprintf("step%d/mode%d/hit%d", step, mode, nth), func(t *testing.T) {
					crashAtCompactionStep(t, step, mode, nth)
				})
			}
		}
	}
}

func crashAtCompactionStep(t *testing.T, step checkpointStep, mode diskio.CrashMode, nth int) {
	rng := rand.New(rand.NewPCG(uint64(step), uint64(mode)))
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 2, checker)
	e := openTest(t, cfg)
	ledgers := ledgerRange(1, 17)
	const entries = 160
	writeRounds(t, e, ledgers, 0, entries, 40)
	e = reopen(t, e, cfg)
	gone, live := split(ledgers, func(l int64) bool { return l%3 != 0 })
	checker.delete(gone...)
	runGC(t, e, nil) // deletes the ledgers, compacts nothing (nothing is due)
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	hits := 0
	var crashed *diskio.Mem
	e.setCheckpointHook(func(s checkpointStep) error {
		if s != step || crashed != nil {
			return nil
		}
		if hits++; hits <= nth {
			return nil
		}
		crashed = fs.Crash(mode, rng)
		return errTestCrash
	})
	err := e.RunGC(context.Background(), &GCRequest{ForceMajor: true})
	if crashed == nil {
		t.Fatalf("the compaction never reached step %d (hit %d): %v", step, nth, err)
	}
	if !errors.Is(err, errTestCrash) {
		t.Fatalf("gc after the crash: %v", err)
	}
	e.Close()
	cfg.FS = crashed
	cfg.GC.Checker = nil // the deletions must be durable by themselves
	e = openTest(t, cfg)
	defer func() { e.Close() }()
	checkLedgers(t, e, live, entries, gone)
	st := runGC(t, e, &GCRequest{ForceMajor: true})
	checkLedgers(t, e, live, entries, gone)
	e = reopen(t, e, cfg)
	checkLedgers(t, e, live, entries, gone)
	t.Logf("after the crash: %d logs compacted, %d removed", st.CompactedLogs, st.RemovedLogs)
}

const gcKillChildEnv = "RINGKEEPER_GC_KILL_CHILD"

func gcKillConfig(dir string) Config {
	cfg := killConfig(dir, diskio.EnginePsync)
	cfg.EntryLogSizeLimit = 1 << 20
	cfg.FlushInterval = time.Hour // checkpoints only when the child asks or a half fills
	cfg.GC.WaitTime = time.Hour
	cfg.GC.RateBytes = 4 << 20 // a log takes a fraction of a second: kills land inside
	cfg.GC.MetadataOpRate = 0
	return cfg
}

// gcKillLive is whether ledger l of the kill test is never deleted.
func gcKillLive(l int64) bool { return l < 100 && l%3 == 0 }

// TestKill9DuringCompaction SIGKILLs a child process that compacts entry logs continuously
// while it adds to live ledgers and writes and deletes other ledgers, then restarts the engine
// on the same directories and checks every acknowledged entry of the live ledgers and every
// entry the child wrote before the first compaction, and that no ledger whose deletion the
// child reported as durable is back. Rounds reuse the directories.
func TestKill9DuringCompaction(t *testing.T) {
	if dir := os.Getenv(gcKillChildEnv); dir != "" {
		gcKillChild(dir)
		return
	}
	rounds := 4
	if testing.Short() || raceEnabled {
		rounds = 2
	}
	dir := t.TempDir()
	written := map[int64]int64{} // live ledger -> entries written before the first kill
	acked := map[[2]int64]bool{}
	deleted := map[int64]bool{}
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKill9DuringCompaction$")
		cmd.Env = append(os.Environ(), gcKillChildEnv+"="+dir, "RINGKEEPER_ROUND="+strconv.Itoa(round))
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make(chan struct{})
		lines := make(chan []string, 1)
		go func() {
			var ls []string
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == "READY" {
					close(ready)
					continue
				}
				ls = append(ls, sc.Text())
			}
			lines <- ls
		}()
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("round %d: the child never got ready", round)
		}
		time.Sleep(time.Duration(50+rand.IntN(400)) * time.Millisecond)
		cmd.Process.Kill()
		ls := <-lines
		if err := cmd.Wait(); err == nil || cmd.ProcessState.ExitCode() != -1 {
			t.Fatalf("round %d: child did not die by the kill: %v", round, err)
		}
		compactions := 0
		for _, line := range ls {
			var kind string
			var a, b int64
			fmt.Sscan(line, &kind, &a, &b)
			switch kind {
			case "W":
				written[a] = b
			case "A":
				acked[[2]int64{a, b}] = true
			case "D":
				deleted[a] = true
			case "C":
				compactions = max(compactions, int(a))
			}
		}
		e, err := Open(gcKillConfig(dir))
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		for l, n := range written {
			for en := range n {
				mustRead(t, e, l, en)
			}
		}
		// In (ledger, entry) order, so that read-ahead serves most reads from the read cache.
		keys := slices.SortedFunc(maps.Keys(acked), func(a, b [2]int64) int {
			return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
		})
		for _, k := range keys {
			mustRead(t, e, k[0], k[1])
		}
		for l := range deleted {
			if _, err := e.Read(l, 0, nil); !errors.Is(err, ErrNoLedger) {
				t.Fatalf("round %d: ledger %d, deleted durably, reads %v", round, l, err)
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d entries acknowledged, %d ledgers deleted, %d logs compacted in this round before the kill",
			round, len(acked), len(deleted), compactions)
	}
}

func gcKillChild(dir string) {
	round, _ := strconv.Atoi(os.Getenv("RINGKEEPER_ROUND"))
	checker := newFakeChecker()
	cfg := gcKillConfig(dir)
	cfg.GC.Checker = checker
	e, err := Open(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
		outMu.Unlock()
	}
	fail := func(what string, err error) {
		fmt.Fprintln(os.Stderr, "child:", what+":", err)
		os.Exit(2)
	}
	add := func(l, en int64, report bool) {
		err := e.Add(testKey, storedEntry(l, en), false, func(_ any, err error) {
			if err == nil && report {
				say("A %d %d", l, en)
			}
		}, nil)
		if err != nil && !errors.Is(err, ErrTooManyRequests) {
			fail("add", err)
		}
	}
	const perLedger = 150
	temp := int64(1000 + round*100000) // ledgers written to be deleted
	if round == 0 {
		// Ledgers 1..99 interleaved in the logs; all but the live ones are then deleted.
		for start := int64(0); start < perLedger; start += 50 {
			var wg sync.WaitGroup
			for l := int64(1); l < 100; l++ {
				for en := start; en < start+50; en++ {
					wg.Add(1)
					if err := e.Add(testKey, storedEntry(l, en), false, func(_ any, err error) {
						if err != nil {
							fail("add", err)
						}
						wg.Done()
					}, nil); err != nil {
						fail("add", err)
					}
				}
			}
			wg.Wait()
			if err := e.Checkpoint(); err != nil {
				fail("checkpoint", err)
			}
		}
		for l := int64(1); l < 100; l++ {
			if gcKillLive(l) {
				say("W %d %d", l, perLedger)
			} else {
				checker.delete(l)
			}
		}
		if err := e.RunGC(context.Background(), nil); err != nil {
			fail("gc", err)
		}
		if err := e.Checkpoint(); err != nil {
			fail("checkpoint", err)
		}
		for l := int64(1); l < 100; l++ {
			if !gcKillLive(l) {
				say("D %d", l)
			}
		}
	}
	say("READY")
	go func() {
		var last uint64
		for {
			if n := e.GCStatus().CompactedLogs; n != last {
				say("C %d", n)
				last = n
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	// Adds to the live ledgers go on while the loop below compacts.
	go func() {
		for en := int64(perLedger + round*100000); ; en++ {
			for l := int64(3); l < 100; l += 3 {
				add(l, en, true)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	for {
		// New garbage: a few ledgers written, made durable, then deleted.
		batch := []int64{temp, temp + 1, temp + 2}
		for en := int64(0); en < 300; en++ {
			for _, l := range batch {
				add(l, en, false)
			}
		}
		if err := e.Checkpoint(); err != nil {
			fail("checkpoint", err)
		}
		checker.delete(batch...)
		if err := e.RunGC(context.Background(), &GCRequest{ForceMajor: true}); err != nil {
			fail("gc", err)
		}
		if err := e.Checkpoint(); err != nil {
			fail("checkpoint", err)
		}
		for _, l := range batch {
			say("D %d", l)
		}
		temp += 3
	}
}

// TestCompactionRacesWithAddsReadsAndCheckpoints runs compaction over and over while writers
// add (and write some entries again with new content), readers read and check every byte,
// checkpoints run and ledgers are deleted; run it with -race.
func TestCompactionRacesWithAddsReadsAndCheckpoints(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 2, checker)
	cfg.WriteCacheMaxSize = 4 << 20 // halves fill: checkpoints also come from adds
	e := openTest(t, cfg)
	defer func() { e.Close() }()
	const initial = 60
	stable := ledgerRange(1, 9)     // never deleted; entries 0..initial-1 rewritten with version 1
	doomed := ledgerRange(100, 124) // deleted during the test
	writeRounds(t, e, append(append([]int64(nil), stable...), doomed...), 0, initial, 20)
	writeRounds(t, e, doomed, initial, 3*initial, 2*initial)
	e = reopen(t, e, cfg) // the logs are complete: garbage collection may touch them

	stop := make(chan struct{})
	var wg, writers sync.WaitGroup
	var failures sync.Map
	fail := func(format string, args ...any) { failures.Store(fmt.Sprintf(format, args...), true) }
	rounds, appends := 6, int64(200)
	if raceEnabled {
		rounds, appends = 3, 60
	}
	// Writers: rewrite the stable ledgers' entries with new content, and append new entries.
	writers.Go(func() {
		for en := int64(0); en < initial; en++ {
			for _, l := range stable {
				if err := addSync(e, testKey, versionedEntry(l, en, 1), false); err != nil {
					fail("rewrite %d/%d: %v", l, en, err)
					return
				}
			}
		}
	})
	writers.Go(func() {
		for en := int64(initial); en < initial+appends; en++ {
			for _, l := range stable {
				if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
					fail("append %d/%d: %v", l, en, err)
					return
				}
			}
		}
	})
	// Readers: every read returns one of the versions ever written.
	for r := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				l := stable[rng.IntN(len(stable))]
				en := rng.Int64N(initial)
				got, err := e.Read(l, en, nil)
				if err != nil {
					fail("read %d/%d: %v", l, en, err)
					return
				}
				if string(got) != string(storedEntry(l, en)) && string(got) != string(versionedEntry(l, en, 1)) {
					fail("read %d/%d: bytes of no version written", l, en)
					return
				}
			}
		})
	}
	// Checkpoints.
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
				if err := e.Checkpoint(); err != nil {
					fail("checkpoint: %v", err)
					return
				}
			}
		}
	})
	// Deletions and compactions, for as long as the writers write.
	writing := make(chan struct{})
	go func() { writers.Wait(); close(writing) }()
	for round := 0; ; round++ {
		if round < rounds {
			checker.delete(doomed[round*4 : round*4+4]...)
		}
		if err := e.RunGC(context.Background(), &GCRequest{ForceMajor: true}); err != nil {
			t.Fatalf("gc: %v", err)
		}
		select {
		case <-writing:
		default:
			continue
		}
		if round >= rounds {
			break
		}
	}
	close(stop)
	wg.Wait()
	failures.Range(func(k, _ any) bool { t.Error(k); return true })
	if t.Failed() {
		return
	}
	if err := e.RunGC(context.Background(), &GCRequest{ForceMajor: true}); err != nil {
		t.Fatal(err)
	}
	st := e.GCStatus()
	if st.CompactedLogs+st.RemovedLogs == 0 {
		t.Fatalf("no log was compacted or removed: %+v", st)
	}
	verify := func(e *Engine) {
		for _, l := range stable {
			for en := int64(0); en < initial+appends; en++ {
				want := storedEntry(l, en)
				if en < initial {
					want = versionedEntry(l, en, 1)
				}
				got, err := e.Read(l, en, nil)
				if err != nil || string(got) != string(want) {
					t.Fatalf("read %d/%d: %v (right bytes: %v)", l, en, err, string(got) == string(want))
				}
			}
		}
		checkLedgers(t, e, nil, 0, doomed[:rounds*4])
	}
	// The read cache may still hold entries read before they were written again (entries are
	// immutable in BookKeeper, so adds do not invalidate it): check after a restart.
	e = reopen(t, e, cfg)
	verify(e)
	t.Logf("%d logs compacted, %d removed, %d bytes copied", st.CompactedLogs, st.RemovedLogs, st.CompactionWrittenBytes)
}

// versionedEntry is storedEntry with its payload changed for version v > 0.
func versionedEntry(l, en int64, v byte) []byte {
	b := storedEntry(l, en)
	for i := storedEntryHeader; i < len(b); i++ {
		b[i] ^= v * 0x5a
	}
	return b
}
