package engine

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

const fpKillChildEnv = "RINGKEEPER_ENGINE_FAILPOINT_CHILD"

// fpKillSites are the steps at which the child kills itself, each on a hit drawn from
// 1..maxHit: the first hits of the checkpoint's steps are those of Open (the flushes of
// replay, the checkpoint after it).
var fpKillSites = []struct {
	name   string
	step   checkpointStep
	maxHit int
}{
	// Checkpoint.
	{"marks-snapshot", stepMarksSnapshot, 4},
	{"halves-swapped", stepHalvesSwapped, 8},
	{"entrylog-written", stepEntryLogWritten, 8},
	{"entrylog-synced", stepEntryLogSynced, 8},
	{"index-synced", stepIndexSynced, 8},
	{"marks-persisted", stepMarksPersisted, 4},
	{"journals-collected", stepJournalsCollected, 4},
	// Entry-log rollover, in a checkpoint's flush or a compaction chunk.
	{"entrylog-rolled", stepEntryLogRolled, 3},
	// Garbage collection: deletions committed, logs removed.
	{"deletes-committed", stepDeletesCommitted, 3},
	{"gc-deletes-committed", stepGCDeletesCommitted, 4},
	{"logs-index-flushed", stepLogsIndexFlushed, 3},
	{"log-removed", stepLogRemoved, 3},
	// Compaction.
	{"compact-chunk-ready", stepCompactChunkReady, 3},
	{"compact-copied", stepCompactCopied, 3},
	{"compact-log-synced", stepCompactLogSynced, 3},
	{"compact-index-synced", stepCompactIndexSynced, 3},
	{"compact-log-removed", stepCompactLogRemoved, 2},
}

// fpKillLive are the ledgers every child adds to and never deletes; compaction moves their
// entries.
var fpKillLive = []int64{1, 2, 3, 4}

// fpKillConfig is killConfig with small entry logs (rollovers and compactions every few
// MiB), checkpoints only when the child asks or a write-cache half fills, and a
// garbage collector that runs only when the child asks.
func fpKillConfig(dir string, engine diskio.Engine, journals int) Config {
	cfg := killConfig(dir, engine)
	cfg.JournalDirs = nil
	for i := range journals {
		cfg.JournalDirs = append(cfg.JournalDirs, filepath.Join(dir, fmt.Sprintf("journal%d", i)))
	}
	cfg.WriteCacheMaxSize = 4 << 20
	cfg.EntryLogSizeLimit = 1 << 20
	cfg.FlushInterval = time.Hour
	cfg.GC.WaitTime = time.Hour
	cfg.GC.RateBytes = 0
	cfg.GC.MetadataOpRate = 0
	return cfg
}

// fpKillState is what the children of one directory reported, over its rounds.
type fpKillState struct {
	acked   map[[2]int64]bool // entries whose add was acknowledged
	fenced  map[int64]bool    // ledgers whose fence was acknowledged
	gone    map[int64]bool    // ledgers whose deletion began (their entries may be gone)
	deleted map[int64]bool    // ledgers deleted, the deletion committed and a checkpoint after it done
	// fencedDeleted are ledgers deleted while fenced, the deletion (with its tombstone)
	// committed by a garbage collection run.
	fencedDeleted map[int64]bool
}

func newFPKillState() *fpKillState {
	return &fpKillState{acked: map[[2]int64]bool{}, fenced: map[int64]bool{}, gone: map[int64]bool{},
		deleted: map[int64]bool{}, fencedDeleted: map[int64]bool{}}
}

// TestKill9AtEngineFailpoints runs a child that opens an engine on a directory, adds to live
// ledgers all along and to ledgers it fences and, a cycle later, deletes, forces checkpoints and
// garbage collection runs that compact (the entry logs are small, so they roll often), and
// SIGKILLs itself on the n-th hit of one step of a checkpoint, a compaction, a deletion's
// commit, a log's removal or an entry log's rollover (reliability §5.1, 5.8 and 5.12; the
// steps are the engine's failpoint sites). It reports every acknowledgement through a pipe
// from the completion callback. The parent saves a copy of what the kill left, opens the
// engine on it (Open must succeed) and checks that every acknowledged entry reads back byte
// for byte (never "no such entry", never corrupt; entries of ledgers whose deletion began may
// be missing, never wrong), that fenced ledgers are fenced, that ledgers whose deletion was
// durable are gone, and that those deleted while fenced refuse their old writer. The next
// child starts from the saved copy, not from the parent's restart, so its Open replays the
// kill's state, and the sites hit in Open (replay's flushes, the checkpoint after replay) are
// killed there too. A directory carries over five rounds. RINGKEEPER_CRASH_SEED reruns a
// seed.
func TestKill9AtEngineFailpoints(t *testing.T) {
	if dir := os.Getenv(fpKillChildEnv); dir != "" {
		fpKillChild(dir)
		return
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RINGKEEPER_CRASH_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (RINGKEEPER_CRASH_SEED reruns it)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	// Every site five times in a full run, in a random order; a short run takes the first few,
	// so that runs over time cover them all.
	var order []int
	for range 5 {
		order = append(order, rng.Perm(len(fpKillSites))...)
	}
	perDir := 5
	if testing.Short() || raceEnabled {
		order = order[:8]
	}
	engines := []diskio.Engine{diskio.EnginePsync}
	if diskio.IOUringAvailable() == nil {
		engines = append(engines, diskio.EngineIOUring)
	}
	var (
		dir      string
		engine   diskio.Engine
		journals int
		st       *fpKillState
	)
	kills := map[string]int{}
	for round, si := range order {
		if round%perDir == 0 {
			dir, st = filepath.Join(t.TempDir(), "bookie"), newFPKillState()
			engine, journals = engines[rng.IntN(len(engines))], 1+rng.IntN(2)
		}
		site := fpKillSites[si]
		nth := 1 + rng.IntN(site.maxHit)
		// A child with a larger write cache than the parent's leaves more in the journals past
		// the persisted marks than a half holds: replay then flushes the cache (without marks),
		// and the next child may be killed there.
		cacheMiB := []int{4, 16}[rng.IntN(2)]
		desc := fmt.Sprintf("seed %d round %d: kill at %s hit %d, %v, %d journals, %d MiB write cache",
			seed, round, site.name, nth, engine, journals, cacheMiB)
		lines := runFPKillChild(t, desc, dir, si, nth, round, engine, journals, cacheMiB)
		acks := st.add(lines)
		checkFPKilled(t, desc, dir, fpKillConfig(dir, engine, journals), st)
		kills[site.name]++
		t.Logf("%s: %d acknowledged, %d entries, %d fenced, %d deleted (%d while fenced) verified",
			desc, acks, len(st.acked), len(st.fenced), len(st.deleted), len(st.fencedDeleted))
	}
	t.Logf("kills per site: %v", kills)
}

// runFPKillChild runs one child until it kills itself at its failpoint and returns what it
// reported.
func runFPKillChild(t *testing.T, desc, dir string, site, nth, round int, engine diskio.Engine, journals, cacheMiB int) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKill9AtEngineFailpoints$")
	cmd.Env = append(os.Environ(), fpKillChildEnv+"="+dir,
		fmt.Sprintf("RINGKEEPER_FAILPOINT=%d %d %d %d %d %d", site, nth, round, engine, journals, cacheMiB))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got := make(chan []string, 1)
	go func() {
		var ls []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ls = append(ls, sc.Text())
		}
		io.Copy(io.Discard, out)
		got <- ls
	}()
	// A child stuck short of its failpoint dumps its goroutines (SIGQUIT) and dies.
	timer := time.AfterFunc(60*time.Second, func() {
		cmd.Process.Signal(syscall.SIGQUIT)
		time.AfterFunc(5*time.Second, func() { cmd.Process.Kill() })
	})
	lines := <-got
	cmd.Wait()
	if !timer.Stop() {
		t.Fatalf("%s: the child did not reach its failpoint in 60 s; stderr:\n%s", desc, stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s: the child did not die by its kill (%v); stderr:\n%s", desc, cmd.ProcessState, stderr.String())
	}
	return lines
}

// add records a child's report and returns how many acknowledgements it held.
func (st *fpKillState) add(lines []string) int {
	acks := 0
	for _, line := range lines {
		var kind string
		var a, b int64
		if n, _ := fmt.Sscan(line, &kind, &a, &b); n < 2 {
			continue
		}
		switch kind {
		case "A":
			st.acked[[2]int64{a, b}] = true
			acks++
		case "F":
			st.fenced[a] = true
		case "X":
			st.gone[a] = true
		case "D":
			st.deleted[a] = true
		case "FD":
			st.fencedDeleted[a] = true
		}
	}
	return acks
}

// checkFPKilled opens the engine on what the kill left and checks it against the reports.
// It works on the directory itself, then puts back a copy of what the kill left, for the
// next child (the directories' paths are in the cookies: the engine cannot open a copy made
// elsewhere).
func checkFPKilled(t *testing.T, desc, dir string, cfg Config, st *fpKillState) {
	t.Helper()
	saved := dir + ".killed"
	if err := os.CopyFS(saved, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	e, err := Open(cfg)
	if err != nil {
		t.Fatalf("%s: open after the kill: %v", desc, err)
	}
	defer func() {
		if e != nil {
			e.Close()
		}
	}()
	// In (ledger, entry) order, so that read-ahead serves most reads from the read cache.
	keys := slices.SortedFunc(maps.Keys(st.acked), func(a, b [2]int64) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	})
	for _, k := range keys {
		got, err := e.Read(k[0], k[1], nil)
		if st.gone[k[0]] && (errors.Is(err, ErrNoLedger) || errors.Is(err, ErrNoEntry)) {
			// Its deletion began: the ledger may be gone, or back from the journal (a crash
			// before a checkpoint covered its deletion) with some of its entries. Those it has
			// must still read back right.
			continue
		}
		if err != nil {
			t.Fatalf("%s: acknowledged entry %d/%d: %v", desc, k[0], k[1], err)
		}
		if !bytes.Equal(got, storedEntry(k[0], k[1])) {
			t.Fatalf("%s: acknowledged entry %d/%d reads back other bytes", desc, k[0], k[1])
		}
	}
	for l := range st.fenced {
		if st.gone[l] {
			continue
		}
		if fenced, err := e.IsFenced(l); err != nil || !fenced {
			t.Fatalf("%s: ledger %d, fenced, is fenced %v (%v)", desc, l, fenced, err)
		}
		if err := addSync(e, testKey, storedEntry(l, 1<<40), false); !errors.Is(err, ErrFenced) {
			t.Fatalf("%s: add to ledger %d, fenced: %v, want ErrFenced", desc, l, err)
		}
	}
	for l := range st.deleted {
		if _, err := e.Read(l, 0, nil); e.Exists(l) || !errors.Is(err, ErrNoLedger) {
			t.Fatalf("%s: ledger %d, deleted durably, exists %v, read %v", desc, l, e.Exists(l), err)
		}
	}
	for l := range st.fencedDeleted {
		wantOldWriterRefused(t, e, l, desc)
	}
	err = e.Close()
	e = nil
	if err != nil {
		t.Fatalf("%s: close: %v", desc, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(saved, dir); err != nil {
		t.Fatal(err)
	}
}

// fpKillChild opens the engine on dir with the parent's parameters and runs the workload until
// the failpoint kills it. It writes one line per report to stdout (one write system call, so
// the line is in the pipe before anything later can happen): "A ledger entry" once an add is
// acknowledged, "F ledger" once a fence is, "X ledger" before a deletion, "FD ledger" once a
// garbage collection run has committed the deletion of a ledger deleted while fenced, "D
// ledger" once a checkpoint after that commit has returned (replay can no longer bring it
// back).
func fpKillChild(dir string) {
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "child: "+format+"\n", args...)
		os.Exit(3)
	}
	var site, nth, round, engine, journals, cacheMiB int
	if _, err := fmt.Sscan(os.Getenv("RINGKEEPER_FAILPOINT"), &site, &nth, &round, &engine, &journals, &cacheMiB); err != nil {
		fail("parameters: %v", err)
	}
	step := fpKillSites[site].step
	var hits atomic.Int64
	failpoint = func(s checkpointStep) {
		if s != step || hits.Add(1) != int64(nth) {
			return
		}
		// This goroutine stops here; the others run on a moment (acknowledgements already due
		// are reported), then the process dies.
		time.Sleep(time.Millisecond)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	cfg := fpKillConfig(dir, diskio.Engine(engine), journals)
	cfg.WriteCacheMaxSize = int64(cacheMiB) << 20
	e, err := Open(cfg)
	if err != nil {
		fail("open: %v", err)
	}
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		line := fmt.Appendf(nil, format+"\n", args...)
		outMu.Lock()
		os.Stdout.Write(line)
		outMu.Unlock()
	}
	// add adds an entry; wg waits for its acknowledgement.
	add := func(wg *sync.WaitGroup, l, en int64, recovery bool) {
		for {
			wg.Add(1)
			err := e.Add(testKey, storedEntry(l, en), recovery, func(_ any, err error) {
				if err != nil {
					fail("add %d/%d: %v", l, en, err)
				}
				say("A %d %d", l, en)
				wg.Done()
			}, nil)
			if err == nil {
				return
			}
			wg.Done()
			if !errors.Is(err, ErrTooManyRequests) {
				fail("add %d/%d: %v", l, en, err)
			}
		}
	}
	// The live ledgers take adds all along, so that their entries sit in every log among
	// those of ledgers deleted later, and compaction moves them.
	go func() {
		var wg sync.WaitGroup
		for en := int64(round) << 20; ; en++ {
			for _, l := range fpKillLive {
				add(&wg, l, en, false)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	rng := rand.New(rand.NewPCG(uint64(round), 1))
	base := int64(round+1) << 24 // this round's ledger ids
	// Each cycle writes ledgers, fences two, then deletes the previous cycle's (already in the
	// entry logs among the live ledgers' entries, so that compaction has work), one of them
	// fenced, and runs a garbage collection and a checkpoint.
	var prevGone []int64
	for c := int64(0); ; c++ {
		temp := []int64{base + 8*c, base + 8*c + 1, base + 8*c + 2}
		fenced := []int64{base + 8*c + 3, base + 8*c + 4} // the first is deleted in the next cycle
		var wg sync.WaitGroup
		for en := range int64(500) {
			for _, l := range append(temp, fenced...) {
				add(&wg, l, en, false)
			}
		}
		wg.Wait()
		for _, l := range fenced {
			if err := fenceSync(e, l, testKey); err != nil {
				fail("fence %d: %v", l, err)
			}
			say("F %d", l)
		}
		// A recoverer's adds to the fenced ledger that stays, the first ten written again.
		for en := int64(490); en < 510; en++ {
			add(&wg, fenced[1], en, true)
		}
		wg.Wait()
		// With the large cache, nothing but the checkpoint after garbage collection moves the
		// marks: a kill in the collection leaves the whole cycle to replay.
		if cacheMiB <= 4 && rng.IntN(2) == 0 {
			if err := e.Checkpoint(); err != nil {
				fail("checkpoint: %v", err)
			}
		}
		for _, l := range prevGone {
			say("X %d", l)
			if err := e.DeleteLedger(l); err != nil {
				fail("delete %d: %v", l, err)
			}
		}
		if err := e.RunGC(context.Background(), &GCRequest{ForceMajor: true}); err != nil {
			fail("gc: %v", err)
		}
		if len(prevGone) > 0 {
			say("FD %d", prevGone[len(prevGone)-1])
		}
		if err := e.Checkpoint(); err != nil {
			fail("checkpoint: %v", err)
		}
		for _, l := range prevGone {
			say("D %d", l)
		}
		prevGone = append(temp, fenced[0])
	}
}
