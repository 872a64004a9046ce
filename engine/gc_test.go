package engine

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// fakeChecker is a metadata store for the garbage collector: ledgers in gone are deleted.
type fakeChecker struct {
	mu   sync.Mutex
	gone map[int64]bool
	// err, if set, fails every read; block makes every read wait for its context.
	err   error
	block bool
	calls atomic.Int64
}

func newFakeChecker() *fakeChecker { return &fakeChecker{gone: map[int64]bool{}} }

func (f *fakeChecker) LedgerExists(ctx context.Context, id int64) (bool, error) {
	f.calls.Add(1)
	f.mu.Lock()
	err, block, gone := f.err, f.block, f.gone[id]
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return false, ctx.Err()
	}
	if err != nil {
		return false, err
	}
	return !gone, nil
}

func (f *fakeChecker) delete(ids ...int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.gone[id] = true
	}
}

// fakeLister adds a listing to fakeChecker; list returns what the listing holds.
type fakeLister struct {
	*fakeChecker
	list func() ([]int64, error)
}

func (f fakeLister) ListLedgers(_ context.Context, fn func(int64)) error {
	ids, err := f.list()
	for _, id := range ids {
		fn(id)
	}
	return err
}

// gcConfig is testConfig with small entry logs (so that writes fill several) and a garbage
// collector that runs only when a test asks, without rate limits.
func gcConfig(t testing.TB, fs diskio.FS, ledgerDirs int, checker LedgerChecker) Config {
	cfg := testConfig(t, fs, ledgerDirs)
	cfg.EntryLogSizeLimit = 1 << 20
	cfg.GC.WaitTime = time.Hour
	cfg.GC.RateBytes = 0
	cfg.GC.MetadataOpRate = 0
	cfg.GC.Checker = checker
	return cfg
}

// writeRounds adds entries [from, to) of every ledger in rounds of per entries each, with a
// checkpoint after every round, so that the ledgers' entries interleave across entry logs.
func writeRounds(t testing.TB, e *Engine, ledgers []int64, from, to, per int64) {
	t.Helper()
	for start := from; start < to; start += per {
		var wg sync.WaitGroup
		var failed atomic.Pointer[error]
		for _, l := range ledgers {
			for en := start; en < min(start+per, to); en++ {
				wg.Add(1)
				err := e.Add(testKey, storedEntry(l, en), false, func(_ any, err error) {
					if err != nil {
						failed.Store(&err)
					}
					wg.Done()
				}, nil)
				if err != nil {
					t.Fatalf("add %d/%d: %v", l, en, err)
				}
			}
		}
		wg.Wait()
		if p := failed.Load(); p != nil {
			t.Fatal(*p)
		}
		if err := e.Checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
}

func ledgerRange(from, to int64) []int64 {
	var ls []int64
	for l := from; l < to; l++ {
		ls = append(ls, l)
	}
	return ls
}

// split returns the ledgers for which dead is true, and the others.
func split(ledgers []int64, dead func(int64) bool) (gone, live []int64) {
	for _, l := range ledgers {
		if dead(l) {
			gone = append(gone, l)
		} else {
			live = append(live, l)
		}
	}
	return gone, live
}

// checkLedgers reads every entry [0, n) of the live ledgers byte for byte and checks that the
// gone ones are unknown.
func checkLedgers(t testing.TB, e *Engine, live []int64, n int64, gone []int64) {
	t.Helper()
	for _, l := range live {
		for en := int64(0); en < n; en++ {
			mustRead(t, e, l, en)
		}
	}
	for _, l := range gone {
		if _, err := e.Read(l, 0, nil); !errors.Is(err, ErrNoLedger) {
			t.Fatalf("deleted ledger %d: read gives %v, want ErrNoLedger", l, err)
		}
	}
}

// entryLogBytes is the size of every entry log in the ledger dirs.
func entryLogBytes(t testing.TB, fs diskio.FS, cfg Config) int64 {
	t.Helper()
	var total int64
	for _, dir := range cfg.LedgerDirs {
		cur := filepath.Join(dir, currentDir)
		names, err := fs.List(cur)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if !strings.HasSuffix(n, ".log") {
				continue
			}
			f, err := fs.Open(filepath.Join(cur, n), diskio.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			size, err := f.Size()
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			total += size
		}
	}
	return total
}

func runGC(t testing.TB, e *Engine, req *GCRequest) GCStatus {
	t.Helper()
	if err := e.RunGC(context.Background(), req); err != nil {
		t.Fatalf("gc: %v", err)
	}
	return e.GCStatus()
}

// reopen closes e and opens the engine again (which finalizes the logs e was writing).
func reopen(t testing.TB, e *Engine, cfg Config) *Engine {
	t.Helper()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return openTest(t, cfg)
}

func TestGCDeletesLedgersAndReclaimsSpace(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 2, checker)
	e := openTest(t, cfg)
	ledgers := ledgerRange(1, 41)
	const entries = 120
	writeRounds(t, e, ledgers, 0, entries, 30)
	e = reopen(t, e, cfg)
	gone, live := split(ledgers, func(l int64) bool { return l%4 != 0 })
	checker.delete(gone...)
	before := entryLogBytes(t, fs, cfg)

	st := runGC(t, e, &GCRequest{ForceMajor: true})
	if st.DeletedLedgers != uint64(len(gone)) {
		t.Fatalf("deleted %d ledgers, want %d", st.DeletedLedgers, len(gone))
	}
	if st.RemovedLogs+st.CompactedLogs == 0 || st.ReclaimedBytes == 0 {
		t.Fatalf("nothing reclaimed: %+v", st)
	}
	after := entryLogBytes(t, fs, cfg)
	if after >= before {
		t.Fatalf("entry logs take %d bytes after GC, %d before", after, before)
	}
	t.Logf("entry logs: %d -> %d bytes; %d logs removed whole, %d compacted, %d bytes copied",
		before, after, st.RemovedLogs, st.CompactedLogs, st.CompactionWrittenBytes)
	checkLedgers(t, e, live, entries, gone)
	for _, u := range st.Logs {
		if u.LiveBytes != u.TotalBytes {
			t.Errorf("log %x of dir %d is still %.2f live after a major compaction", u.ID, u.Dir, u.Usage)
		}
	}
	// Deletions are durable: nothing comes back after a restart.
	e = reopen(t, e, cfg)
	defer e.Close()
	checkLedgers(t, e, live, entries, gone)
	if n := e.Ledgers(); n != len(live) {
		t.Fatalf("%d ledgers after restart, want %d", n, len(live))
	}
}

// halfLiveLogs writes ledgers so that every entry log holds them interleaved, deletes the even
// ones and returns the engine (after a restart) with the live ledgers.
func halfLiveLogs(t *testing.T, fs *diskio.Mem, cfg Config, checker *fakeChecker) (*Engine, []int64, []int64) {
	t.Helper()
	e := openTest(t, cfg)
	ledgers := ledgerRange(1, 21)
	writeRounds(t, e, ledgers, 0, 200, 20)
	e = reopen(t, e, cfg)
	gone, live := split(ledgers, func(l int64) bool { return l%2 == 0 })
	checker.delete(gone...)
	return e, gone, live
}

func TestMinorLeavesHalfLiveLogsMajorCompactsThem(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	e, gone, live := halfLiveLogs(t, fs, cfg, checker)
	defer func() { e.Close() }()

	st := runGC(t, e, &GCRequest{ForceMinor: true})
	if st.MinorCompactions != 1 || st.CompactedLogs != 0 || st.CompactionWrittenBytes != 0 {
		t.Fatalf("minor compaction touched half-live logs: %+v", st)
	}
	half := 0
	for _, u := range st.Logs {
		if u.Usage > 0.3 && u.Usage < 0.7 {
			half++
		}
	}
	if half < 3 {
		t.Fatalf("only %d of %d logs are about half live: %+v", half, len(st.Logs), st.Logs)
	}
	checkLedgers(t, e, live, 200, gone)
	before := entryLogBytes(t, fs, cfg)

	st = runGC(t, e, &GCRequest{ForceMajor: true})
	if st.MajorCompactions != 1 || st.CompactedLogs < uint64(half) {
		t.Fatalf("major compaction compacted %d logs, want at least %d: %+v", st.CompactedLogs, half, st)
	}
	if after := entryLogBytes(t, fs, cfg); after >= before {
		t.Fatalf("entry logs take %d bytes after major compaction, %d before", after, before)
	}
	checkLedgers(t, e, live, 200, gone)
	e = reopen(t, e, cfg)
	checkLedgers(t, e, live, 200, gone)
}

func TestScheduledCompactionIntervals(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	cfg.GC.MinorInterval = time.Millisecond
	cfg.GC.MajorInterval = time.Hour
	e, gone, live := halfLiveLogs(t, fs, cfg, checker)
	defer func() { e.Close() }()
	time.Sleep(2 * time.Millisecond)
	// Minor is due, major is not: the half-live logs stay.
	st := runGC(t, e, nil)
	if st.MinorCompactions != 1 || st.MajorCompactions != 0 || st.CompactedLogs != 0 {
		t.Fatalf("scheduled run: %+v", st)
	}
	e.Close()
	cfg.GC.MajorInterval = time.Millisecond
	e = openTest(t, cfg)
	time.Sleep(2 * time.Millisecond)
	// Both are due: only the major one runs.
	st = runGC(t, e, nil)
	if st.MajorCompactions != 1 || st.MinorCompactions != 0 || st.CompactedLogs == 0 {
		t.Fatalf("scheduled run with both due: %+v", st)
	}
	checkLedgers(t, e, live, 200, gone)
}

func TestGCDeletesNothingWhenTheMetadataStoreFails(t *testing.T) {
	type setup struct {
		name string
		// arrange configures the checker; ledgers in gone would be deleted by a working store.
		arrange func(c *fakeChecker) LedgerChecker
		// reads is whether point reads may happen at all.
		reads bool
	}
	setups := []setup{
		{"read errors", func(c *fakeChecker) LedgerChecker { c.err = errors.New("store unreachable"); return c }, true},
		{"read timeouts", func(c *fakeChecker) LedgerChecker { c.block = true; return c }, true},
		{"listing error", func(c *fakeChecker) LedgerChecker {
			return fakeLister{c, func() ([]int64, error) { return []int64{1, 2}, errors.New("listing failed") }}
		}, false},
		{"empty listing, ledgers still there", func(c *fakeChecker) LedgerChecker {
			c.gone = map[int64]bool{}
			return fakeLister{c, func() ([]int64, error) { return nil, nil }}
		}, true},
	}
	for _, s := range setups {
		t.Run(s.name, func(t *testing.T) {
			fs := diskio.NewMem(4096)
			checker := newFakeChecker()
			checker.delete(ledgerRange(1, 11)...)
			cfg := gcConfig(t, fs, 1, nil)
			cfg.GC.MetadataOpTimeout = 20 * time.Millisecond
			cfg.GC.Checker = s.arrange(checker)
			e := openTest(t, cfg)
			defer e.Close()
			writeRounds(t, e, ledgerRange(1, 11), 0, 20, 20)
			err := e.RunGC(context.Background(), &GCRequest{ForceMajor: true})
			if s.name != "empty listing, ledgers still there" && err == nil {
				t.Fatal("a failing metadata store went unreported")
			}
			st := e.GCStatus()
			if st.DeletedLedgers != 0 || e.Ledgers() != 10 {
				t.Fatalf("deleted %d ledgers (%d left) with a failing store", st.DeletedLedgers, e.Ledgers())
			}
			if !s.reads && checker.calls.Load() != 0 {
				t.Fatalf("%d point reads after a failed listing", checker.calls.Load())
			}
			checkLedgers(t, e, ledgerRange(1, 11), 20, nil)
		})
	}
}

// TestGCListingOnlyNarrowsPointReads: ledgers the listing lacks are point-read, and only those
// the point read calls gone are deleted (BookKeeper #870).
func TestGCListingOnlyNarrowsPointReads(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	checker.delete(3, 4)
	// The listing misses 3, 4 (deleted) and 5, 6 (not deleted: a partial listing).
	lister := fakeLister{checker, func() ([]int64, error) { return []int64{1, 2, 7, 8}, nil }}
	cfg := gcConfig(t, fs, 1, lister)
	e := openTest(t, cfg)
	defer e.Close()
	writeRounds(t, e, ledgerRange(1, 9), 0, 10, 10)
	st := runGC(t, e, nil)
	if st.DeletedLedgers != 2 || checker.calls.Load() != 4 {
		t.Fatalf("deleted %d ledgers with %d point reads, want 2 and 4", st.DeletedLedgers, checker.calls.Load())
	}
	checkLedgers(t, e, []int64{1, 2, 5, 6, 7, 8}, 10, []int64{3, 4})
}

// TestCompactionDoesNotClobberAnEntryWrittenAgain writes entries again (new content, new
// location) between compaction's index look-ups and its index update: the update must skip
// them. The entries rewritten are those of the log compacted first (the emptiest).
func TestCompactionDoesNotClobberAnEntryWrittenAgain(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	e, gone, live := halfLiveLogs(t, fs, cfg, checker)
	defer func() { e.Close() }()
	st := runGC(t, e, nil) // deletes the ledgers; nothing is due
	first := slices.MinFunc(st.Logs, func(a, b LogUsage) int {
		return cmp.Or(cmp.Compare(a.Usage, b.Usage), cmp.Compare(a.ID, b.ID))
	})
	newer := map[[2]int64][]byte{}
	e.setCheckpointHook(func(s checkpointStep) error {
		if s != stepCompactChunkReady || len(newer) > 0 {
			return nil
		}
		for _, l := range live {
			for en := int64(0); en < 200; en++ {
				if loc, _, _ := e.dir(l).idx.Location(l, en); logID(loc) == first.ID {
					newer[[2]int64{l, en}] = versionedEntry(l, en, 1)
				}
			}
		}
		for k, b := range newer {
			if err := addSync(e, testKey, b, false); err != nil {
				return fmt.Errorf("rewrite %v: %w", k, err)
			}
		}
		return e.Checkpoint()
	})
	runGC(t, e, &GCRequest{ForceMajor: true})
	if len(newer) == 0 {
		t.Fatalf("no entry rewritten: the first chunk was not of log %x", first.ID)
	}
	check := func() {
		t.Helper()
		for _, l := range live {
			for en := int64(0); en < 200; en++ {
				if want := newer[[2]int64{l, en}]; want != nil {
					got, err := e.Read(l, en, nil)
					if err != nil || !bytes.Equal(got, want) {
						t.Fatalf("entry %d/%d written again during compaction: %v, newer content %v", l, en, err, bytes.Equal(got, want))
					}
					continue
				}
				mustRead(t, e, l, en)
			}
		}
		checkLedgers(t, e, nil, 0, gone)
	}
	check()
	e.setCheckpointHook(nil)
	e = reopen(t, e, cfg)
	check()
	t.Logf("%d entries written again during the compaction of log %x", len(newer), first.ID)
}

func TestCompactionSuspendAndDiskPause(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	e, gone, live := halfLiveLogs(t, fs, cfg, checker)
	defer func() { e.Close() }()

	e.SuspendCompaction(true, true)
	st := runGC(t, e, &GCRequest{ForceMajor: true})
	if !st.MajorSuspended || !st.MinorSuspended || st.CompactedLogs != 0 || st.MajorCompactions != 0 {
		t.Fatalf("suspended compaction ran: %+v", st)
	}
	if st.DeletedLedgers != uint64(len(gone)) {
		t.Fatalf("suspension stopped ledger deletion too: %+v", st)
	}
	e.ResumeCompaction(true, true)

	// Disk usage above the warn threshold pauses major compaction.
	e.Close()
	cfg.GC.DiskUsageWarnThreshold = 1e-9
	e = openTest(t, cfg)
	st = runGC(t, e, &GCRequest{ForceMajor: true})
	if st.CompactedLogs != 0 || !strings.Contains(st.Paused, "diskUsageWarnThreshold") {
		t.Fatalf("major compaction above the warn threshold: %+v", st)
	}
	e.Close()
	cfg.GC.ForceAllowWhenNoSpace = true
	e = openTest(t, cfg)
	st = runGC(t, e, &GCRequest{ForceMajor: true})
	if st.CompactedLogs == 0 {
		t.Fatalf("isForceGCAllowWhenNoSpace: a forced run did not compact: %+v", st)
	}
	checkLedgers(t, e, live, 200, gone)
}

func TestCompactionTimeLimitAndShutdown(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	cfg.GC.RateBytes = 256 << 10 // a log takes seconds to compact
	cfg.GC.MajorMaxTime = 300 * time.Millisecond
	e, gone, live := halfLiveLogs(t, fs, cfg, checker)
	runGC(t, e, nil) // deletes the ledgers; nothing is due
	start := time.Now()
	st := runGC(t, e, &GCRequest{ForceMajor: true})
	if took := time.Since(start); took > 2*time.Second || !strings.Contains(st.Paused, "time limit") {
		t.Fatalf("a compaction limited to %v took %v: %+v", cfg.GC.MajorMaxTime, took, st)
	}
	checkLedgers(t, e, live, 200, gone)

	// Close interrupts a compaction in progress promptly.
	e.Close()
	cfg.GC.MajorMaxTime = 0
	e = openTest(t, cfg)
	done := make(chan error, 1)
	go func() { done <- e.RunGC(context.Background(), &GCRequest{ForceMajor: true}) }()
	time.Sleep(200 * time.Millisecond)
	start = time.Now()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	<-done
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("close took %v with a compaction running", took)
	}
	e = openTest(t, cfg)
	defer e.Close()
	checkLedgers(t, e, live, 200, gone)
}

// TestCorruptLogIsSkipped: a log whose data is damaged is reported and kept, and the other logs
// are still compacted (BookKeeper #4544).
func TestCorruptLogIsSkipped(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	e, gone, live := halfLiveLogs(t, fs, cfg, checker)
	defer func() { e.Close() }()
	damaged := storedEntry(live[0], 3)
	flipInEntryLog(t, fs, filepath.Join(cfg.LedgerDirs[0], currentDir), damaged[:storedEntryHeader], storedEntryHeader-1)
	err := e.RunGC(context.Background(), &GCRequest{ForceMajor: true})
	st := e.GCStatus()
	if err == nil || len(st.CorruptLogs) != 1 || st.CompactedLogs == 0 {
		t.Fatalf("corrupt log: err %v, status %+v", err, st)
	}
	t.Log(st.CorruptLogs[0])
	if _, err := e.Read(live[0], 3, nil); !errors.Is(err, ErrIO) {
		t.Fatalf("damaged entry: %v", err)
	}
	for _, l := range live {
		for en := int64(0); en < 200; en++ {
			if l != live[0] || en != 3 {
				mustRead(t, e, l, en)
			}
		}
	}
	checkLedgers(t, e, nil, 0, gone)
	// Later runs skip it without error.
	runGC(t, e, &GCRequest{ForceMajor: true})
}

func TestGCTriggerAndBackgroundRuns(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	e, gone, live := halfLiveLogs(t, fs, cfg, checker)
	defer func() { e.Close() }()
	e.TriggerGC(GCRequest{ForceMajor: true})
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.GCStatus()
		if st.Runs > 0 && !st.Running && !st.Forced {
			if st.CompactedLogs == 0 || st.DeletedLedgers != uint64(len(gone)) {
				t.Fatalf("triggered run: %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the triggered run did not finish: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	checkLedgers(t, e, live, 200, gone)
	// The background goroutine runs every gcWaitTime.
	e.Close()
	cfg.GC.WaitTime = 10 * time.Millisecond
	e = openTest(t, cfg)
	for e.GCStatus().Runs < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no periodic run")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !slices.ContainsFunc(e.GCStatus().Logs, func(u LogUsage) bool { return u.LiveBytes > 0 }) {
		t.Fatalf("status lists no live log: %+v", e.GCStatus())
	}
}

// TestReadDuringLogRemoval holds a read between its index look-up (which returns a location in
// the log being compacted) and its entry-log read while the compaction moves the entry and
// tries to remove the log: the removal must wait for the read, which then succeeds.
func TestReadDuringLogRemoval(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	cfg.ReadAheadBatchSize = 0
	e, gone, live := halfLiveLogs(t, fs, cfg, checker)
	defer func() { e.Close() }()
	st := runGC(t, e, nil)
	first := slices.MinFunc(st.Logs, func(a, b LogUsage) int {
		return cmp.Or(cmp.Compare(a.Usage, b.Usage), cmp.Compare(a.ID, b.ID))
	})
	var target [2]int64
	for _, l := range live {
		for en := int64(0); en < 200 && target == [2]int64{}; en++ {
			if loc, _, _ := e.dir(l).idx.Location(l, en); logID(loc) == first.ID {
				target = [2]int64{l, en}
			}
		}
	}
	looked, release := make(chan struct{}), make(chan struct{})
	e.setReadHook(func(l, en int64, loc uint64) {
		if [2]int64{l, en} == target && logID(loc) == first.ID {
			close(looked)
			<-release
		}
	})
	readErr := make(chan error, 1)
	go func() {
		got, err := e.Read(target[0], target[1], nil)
		if err == nil && !bytes.Equal(got, storedEntry(target[0], target[1])) {
			err = errors.New("wrong bytes")
		}
		readErr <- err
	}()
	<-looked
	moved := make(chan struct{})
	e.setCheckpointHook(func(s checkpointStep) error {
		if s == stepCompactIndexSynced {
			select {
			case <-moved:
			default:
				close(moved)
			}
		}
		return nil
	})
	gcErr := make(chan error, 1)
	go func() { gcErr <- e.RunGC(context.Background(), &GCRequest{ForceMajor: true}) }()
	<-moved
	time.Sleep(50 * time.Millisecond) // the compaction reaches the removal of the log
	close(release)
	if err := <-readErr; err != nil {
		t.Fatalf("read of an entry whose log was compacted meanwhile: %v", err)
	}
	if err := <-gcErr; err != nil {
		t.Fatal(err)
	}
	e.setReadHook(nil)
	e.setCheckpointHook(nil)
	checkLedgers(t, e, live, 200, gone)
}

// TestDamagedLogHeaderDoesNotLoseALiveLog: a log whose header is damaged (here: its ledger
// count zeroed) must not look empty to garbage collection (BookKeeper #4607): its ledgers map
// is rebuilt by scanning, and the log is kept.
func TestDamagedLogHeaderDoesNotLoseALiveLog(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := gcConfig(t, fs, 1, newFakeChecker())
	e := openTest(t, cfg)
	ledgers := ledgerRange(1, 9)
	writeRounds(t, e, ledgers, 0, 200, 50)
	e = reopen(t, e, cfg)
	defer func() { e.Close() }()
	path := filepath.Join(cfg.LedgerDirs[0], currentDir, "1.log")
	f, err := fs.Open(path, diskio.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0, 0, 0, 0}, 32); err != nil { // the map's ledger count
		t.Fatal(err)
	}
	f.Close()
	st := runGC(t, e, &GCRequest{ForceMajor: true})
	if st.RemovedLogs != 0 || st.CompactedLogs != 0 || len(st.CorruptLogs) != 0 {
		t.Fatalf("gc over a damaged header: %+v", st)
	}
	i := slices.IndexFunc(st.Logs, func(u LogUsage) bool { return u.ID == 1 })
	if i < 0 || st.Logs[i].LiveBytes == 0 || st.Logs[i].Usage != 1 {
		t.Fatalf("log 1 is not accounted as live: %+v", st.Logs)
	}
	checkLedgers(t, e, ledgers, 200, nil)
}

// TestCompactionWaitsForAFlushThatFinalizedALog: a checkpoint's flush finalizes the log it
// rolls over before it commits the locations of what it just wrote there. GC listing completed
// logs in between compacted that log without those entries, then removed it.
func TestCompactionWaitsForAFlushThatFinalizedALog(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	cfg.ReadAheadBatchSize = 0
	e := openTest(t, cfg)
	defer func() { e.Close() }()
	add := func(l, from, to int64) {
		for en := from; en < to; en++ {
			if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(1, 0, 600) // to be deleted
	add(2, 0, 60)
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	checker.delete(1)
	runGC(t, e, nil) // ledger 1 deleted; log 1 is still the one being written
	add(3, 0, 500)   // its checkpoint rolls log 1 over
	finalized, compacting := make(chan struct{}), make(chan struct{})
	ckpt := make(chan error, 1)
	var listed, flushed, compacted sync.Once
	e.setCheckpointHook(func(s checkpointStep) error {
		switch s {
		case stepGCDeletesCommitted: // GC is about to list completed logs: flush now
			listed.Do(func() {
				go func() { ckpt <- e.Checkpoint() }()
				<-finalized
			})
		case stepEntryLogSynced: // the flush finalized log 1; its locations are not committed
			flushed.Do(func() {
				close(finalized)
				select {
				case <-compacting: // the old code compacts meanwhile
				case <-time.After(time.Second):
				}
			})
		case stepCompactChunkReady:
			compacted.Do(func() { close(compacting) })
		}
		return nil
	})
	if err := e.RunGC(context.Background(), &GCRequest{ForceMajor: true}); err != nil {
		t.Fatal(err)
	}
	if err := <-ckpt; err != nil {
		t.Fatal(err)
	}
	e.setCheckpointHook(nil)
	e = reopen(t, e, cfg)
	for en := int64(0); en < 500; en++ {
		mustRead(t, e, 3, en)
	}
}

// TestGCKeepsALogWithDamageInItsLastRun: a log a crash left unfinalized has its ledgers map
// rebuilt by a scan, which takes damage in the last run (nothing after it proves it durable)
// for a torn tail. The index points at intact entries after the damage, so the data was
// durable: the log is corrupt and quarantined, not counted dead and removed with them.
func TestGCKeepsALogWithDamageInItsLastRun(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	cfg.ReadAheadBatchSize = 0 // reads go to the entry log
	e := openTest(t, cfg)
	for _, l := range []int64{1, 2} {
		for en := int64(0); en < 10; en++ {
			if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
	crashed := fs.Crash(diskio.CrashSyncedOnly, rand.New(rand.NewPCG(1, 2)))
	e.Close()
	// Bit rot in ledger 2's first entry, the first record of the log's last flushed run.
	flipInEntryLog(t, crashed, filepath.Join(cfg.LedgerDirs[0], currentDir), storedEntry(2, 0), storedEntryHeader+1)
	cfg.FS = crashed
	e = openTest(t, cfg)
	defer func() { e.Close() }()
	checker.delete(1)
	if err := e.RunGC(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if st := e.GCStatus(); len(st.CorruptLogs) != 1 {
		t.Errorf("GC status %+v: want the damaged log reported", st)
	}
	e = reopen(t, e, cfg)
	for en := int64(1); en < 10; en++ {
		mustRead(t, e, 2, en)
	}
}

// TestIndexDamageAfterCompactionNeverLosesRelocatedEntries: compaction copies live entries to a
// new log, points the index at the copies and removes the old log. pebble drops damage at the
// end of its newest WAL silently; had the relocations lived only there, a flipped byte would
// leave the index pointing into removed logs, and the copies, still on disk, unreachable. So
// after any one flipped byte in the index's WAL, the engine either refuses to open or reads
// every live entry back.
func TestIndexDamageAfterCompactionNeverLosesRelocatedEntries(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	cfg.ReadAheadBatchSize = 0
	e, _, live := halfLiveLogs(t, fs, cfg, checker)
	if st := runGC(t, e, &GCRequest{ForceMajor: true}); st.CompactedLogs == 0 {
		t.Fatalf("nothing compacted: %+v", st)
	}
	// A crash before the next checkpoint: the last checkpoint record in the index still
	// matches the persisted marks.
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	e.fail(errTestCrash)
	e.Close()
	idxDir := filepath.Join(cfg.IndexDir, "index0")
	pristine := indexFiles(t, idxDir)
	// restore puts back the index and the crashed disk as they were, with one byte of file
	// flip changed: every Open writes (a replay, a checkpoint).
	restore := func(flip string, at int) {
		if err := os.RemoveAll(idxDir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(idxDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range pristine {
			if name == flip {
				b = bytes.Clone(b)
				b[at] ^= 0x08
			}
			if err := os.WriteFile(filepath.Join(idxDir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cfg.FS = crashed.Crash(diskio.CrashSyncedOnly, nil) // a copy
	}
	flips := 0
	for name, data := range pristine {
		if !strings.HasSuffix(name, ".log") {
			continue
		}
		for at := 0; at < len(data); at += 1 + len(data)/60 {
			restore(name, at)
			flips++
			e, err := Open(cfg)
			if err != nil {
				continue // refused: damage reported, not hidden
			}
		read:
			for _, l := range live {
				for en := int64(0); en < 200; en++ {
					if _, err := e.Read(l, en, nil); err != nil {
						t.Errorf("%s byte %d of %d flipped: the engine opened, but read %d/%d: %v", name, at, len(data), l, en, err)
						break read
					}
				}
			}
			e.Close()
		}
	}
	if flips == 0 {
		t.Fatalf("no WAL in %s: %v", idxDir, slices.Sorted(maps.Keys(pristine)))
	}
}

// indexFiles reads every file of an index directory (pebble's), by name.
func indexFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, n := range names {
		if n.Type().IsRegular() {
			b, err := os.ReadFile(filepath.Join(dir, n.Name()))
			if err != nil {
				t.Fatal(err)
			}
			files[n.Name()] = b
		}
	}
	return files
}
