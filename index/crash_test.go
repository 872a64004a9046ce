package index

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The crash workload: batch i writes ledger i (its state and crashEntries(i) locations);
// batch i with i%4 == 0 also deletes ledger i-5, with i%8 == 0 as a fenced ledger (its
// tombstone, dated crashDeletedAt(i), in the same batch); batch i is committed without sync
// when i%3 == 1, with sync otherwise.

func crashEntries(i int64) int64 {
	if i%25 == 24 {
		return 20000 // a large batch now and then
	}
	return 1 + (i*7)%40
}

func crashSynced(i int64) bool { return i%3 != 1 }

// crashDeleter returns the batch that deletes ledger l, if any.
func crashDeleter(l int64) (int64, bool) {
	d := l + 5
	return d, d%4 == 0
}

// crashTombstone says the deletion in batch d leaves a fenced-deleted tombstone.
func crashTombstone(d int64) bool { return d%8 == 0 }

func crashDeletedAt(d int64) time.Time { return time.Unix(1700000000, d) }

func crashState(i int64) LedgerState {
	return LedgerState{Exists: true, Fenced: i%2 == 0, MasterKey: []byte(fmt.Sprintf("key-%016d..", i))}
}

// writeCrashBatch fills b with batch i.
func writeCrashBatch(b *Batch, i int64) {
	b.PutLedger(i, crashState(i))
	for e := range crashEntries(i) {
		b.PutLocation(i, e, loc(i, e))
	}
	switch {
	case i < 5 || i%4 != 0:
	case crashTombstone(i):
		b.DeleteFencedLedger(i-5, crashDeletedAt(i))
	default:
		b.DeleteLedger(i - 5)
	}
}

// checkCrashImage checks a reopened index after a crash. Batches 0..printed-1 returned from
// Commit; batch printed may have been in flight; later batches never started. A batch is
// durable if it or a later returned batch was synced. Every ledger is all or nothing, and so
// is a fenced ledger's deletion with its tombstone: the tombstone is there exactly when the
// deleting batch is (which always leaves its own ledger, never deleted, present).
func checkCrashImage(t *testing.T, ix *Index, printed int64) {
	t.Helper()
	lastSynced := int64(-1)
	for i := range printed {
		if crashSynced(i) {
			lastSynced = i
		}
	}
	durable := func(i int64) bool { return i <= lastSynced }
	present := make(map[int64]bool)
	err := ix.Ledgers(func(id int64, st LedgerState) bool {
		present[id] = true
		if !equalState(st, crashState(id)) {
			t.Errorf("ledger %d state %+v", id, st)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	tombs := make(map[int64]time.Time)
	err = ix.FencedDeleted(func(id int64, at time.Time) bool {
		tombs[id] = at
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	for l, at := range tombs {
		d, deletable := crashDeleter(l)
		switch {
		case !deletable || !crashTombstone(d):
			t.Fatalf("tombstone of ledger %d, which no batch deletes as fenced", l)
		case !at.Equal(crashDeletedAt(d)):
			t.Fatalf("tombstone of ledger %d dated %v, want %v", l, at, crashDeletedAt(d))
		}
	}
	for l := range printed + 2 {
		if d, deletable := crashDeleter(l); deletable && crashTombstone(d) {
			if _, tomb := tombs[l]; tomb != present[d] {
				t.Fatalf("ledger %d: tombstone present %v, but its deleting batch %d present %v (%d returned)",
					l, tomb, d, present[d], printed)
			}
			if _, tomb := tombs[l]; tomb && present[l] {
				t.Fatalf("ledger %d present beside its tombstone", l)
			}
		}
		got := present[l]
		n := len(entries(t, ix, l, 0))
		if got && int64(n) != crashEntries(l) || !got && n != 0 {
			t.Fatalf("ledger %d torn: state present %v, %d of %d locations", l, got, n, crashEntries(l))
		}
		d, deletable := crashDeleter(l)
		switch {
		case l > printed && got:
			t.Fatalf("ledger %d present, but its batch never started (%d returned)", l, printed)
		case deletable && durable(d) && got:
			t.Fatalf("ledger %d present after its durable deletion in batch %d", l, d)
		case durable(l) && !got && (!deletable || d > printed):
			t.Fatalf("ledger %d of a durable batch is missing (%d returned, last synced %d)", l, printed, lastSynced)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

const kill9Env = "RINGKEEPER_INDEX_KILL9_DIR"

// TestKill9 runs a child process that commits batches and prints the number of every batch
// whose Commit returned; the parent SIGKILLs it at a random moment, reopens the index and
// checks every durable batch (checkCrashImage).
func TestKill9(t *testing.T) {
	if dir := os.Getenv(kill9Env); dir != "" {
		kill9Child(dir)
		return
	}
	rounds := 4
	if testing.Short() || raceEnabled {
		rounds = 2
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	for round := range rounds {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestKill9$")
		cmd.Env = append(os.Environ(), kill9Env+"="+dir)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killAt := int64(20 + rng.IntN(300))
		printed := int64(0)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			n, ok := strings.CutPrefix(line, "committed ")
			if !ok {
				continue // test framework output
			}
			i, err := strconv.ParseInt(n, 10, 64)
			if err != nil || i != printed {
				cmd.Process.Kill()
				t.Fatalf("child printed %q after %d batches", line, printed)
			}
			printed++
			if printed == killAt {
				// Kill, then keep reading: the lines still in the pipe are batches that
				// returned before the kill.
				cmd.Process.Kill()
			}
		}
		cmd.Wait()
		if printed < killAt {
			t.Fatalf("child stopped after %d batches: %v", printed, sc.Err())
		}
		ix := openDir(t, dir)
		checkCrashImage(t, ix, printed)
		t.Logf("round %d: killed after %d returned batches", round, printed)
		ix.Close()
	}
}

func kill9Child(dir string) {
	ix, err := Open(DefaultConfig(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	b := ix.NewBatch()
	for i := int64(0); ; i++ {
		writeCrashBatch(b, i)
		if err := b.Commit(crashSynced(i)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(2)
		}
		// An unbuffered write: the parent sees the line as soon as Commit has returned.
		fmt.Fprintf(os.Stdout, "committed %d\n", i)
	}
}

// TestPowerLoss crashes pebble's crashable in-memory file system, which keeps only what was
// synced (plus, in some rounds, a random part of what was not), and checks the same
// invariants as TestKill9.
func TestPowerLoss(t *testing.T) {
	rounds := 12
	if testing.Short() || raceEnabled {
		rounds = 4
	}
	for round := range rounds {
		fs := vfs.NewCrashableMem()
		cfg := DefaultConfig("/ix")
		cfg.FS = fs
		cfg.MemTableSize = 1 << 20 // flushes and compactions run during the workload
		ix, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		b := ix.NewBatch()
		n := int64(10 + round*13)
		for i := range n {
			writeCrashBatch(b, i)
			commit(t, b, crashSynced(i))
		}
		pct := []int{0, 50, 100}[round%3]
		crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: pct, RNG: rand.New(rand.NewPCG(uint64(round), 1))})
		b.Close()
		if err := ix.Close(); err != nil {
			t.Fatal(err)
		}
		cfg.FS = crashed
		ix, err = Open(cfg)
		if err != nil {
			t.Fatalf("round %d: reopen after crash: %v", round, err)
		}
		checkCrashImage(t, ix, n)
		ix.Close()
	}
}

// TestPowerLossSyncsEmptyBatch: an unsynced batch is lost in a power loss, and an empty
// synced commit (the checkpoint's "sync the ledger state even if no entry moved") makes it
// durable.
func TestPowerLossSyncsEmptyBatch(t *testing.T) {
	fs := vfs.NewCrashableMem()
	cfg := DefaultConfig("/ix")
	cfg.FS = fs
	ix, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	reopenCrashed := func() *Index {
		c := cfg
		c.FS = fs.CrashClone(vfs.CrashCloneCfg{})
		ix, err := Open(c)
		if err != nil {
			t.Fatal(err)
		}
		return ix
	}
	b := ix.NewBatch()
	defer b.Close()
	b.PutLedger(1, LedgerState{Exists: true, Fenced: true})
	b.PutLocation(1, 0, 7)
	commit(t, b, false)

	after := reopenCrashed()
	if _, err := after.Ledger(1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unsynced ledger state survived a power loss: %v (the test FS does not drop unsynced data)", err)
	}
	after.Close()

	commit(t, b, true) // empty
	after = reopenCrashed()
	defer after.Close()
	if st, err := after.Ledger(1); err != nil || !st.Fenced {
		t.Fatalf("ledger state after an empty synced commit: %+v, %v", st, err)
	}
	if l, err := after.Location(1, 0); err != nil || l != 7 {
		t.Fatalf("location after an empty synced commit: %d, %v", l, err)
	}
}
