package engine

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// TestAddRacingGCDeletionLeavesNoLocation: an add that took its ledger before garbage
// collection deleted it, and was waiting for write-cache room meanwhile, put its entry in the
// cache after the deletion had dropped the ledger's cached entries and garbage collection had
// committed the deletion (the index's range delete). The next checkpoint then wrote the entry's
// location after that range delete: the index kept a location of a deleted ledger, which kept
// its log from ever being reclaimed and, once the id was free again, made the deleted ledger's
// entry the last entry of a new ledger of the same id.
func TestAddRacingGCDeletionLeavesNoLocation(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	cfg.WriteCacheMaxSize = 2 << 20 // 1 MiB halves
	cfg.MaxThrottleTime = time.Minute
	e := openTest(t, cfg)
	defer func() { e.Close() }()
	const victim = 2
	addCheckpointed(t, e, victim, 10)

	// Hold the next checkpoint before it swaps the halves, so that a full active half stays full.
	held, release, deletesCommitted := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var holdOnce, committedOnce sync.Once
	e.setCheckpointHook(func(s checkpointStep) error {
		switch s {
		case stepMarksSnapshot:
			holdOnce.Do(func() {
				close(held)
				<-release
			})
		case stepGCDeletesCommitted:
			committedOnce.Do(func() { close(deletesCommitted) })
		}
		return nil
	})
	var pending sync.WaitGroup
	for en := int64(0); ; en++ {
		pending.Add(1)
		queued, err := e.TryAdd(testKey, storedEntry(1, en), false, func(any, error) { pending.Done() }, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !queued {
			pending.Done()
			break // the active half is full; its checkpoint is held
		}
	}
	<-held
	// Larger than any entry of ledger 1: it does not fit what the active half has left.
	late := append(storedEntry(victim, 10), make([]byte, 32<<10)...)
	added := make(chan error, 1)
	go func() { added <- addSync(e, testKey, late, false) }()
	for e.Stats().ThrottledAdds == 0 {
		time.Sleep(time.Millisecond)
	}

	// Garbage collection deletes the ledger while its add waits for room.
	checker.delete(victim)
	gcDone := make(chan error, 1)
	go func() { gcDone <- e.RunGC(context.Background(), nil) }()
	select {
	case <-deletesCommitted:
	case <-time.After(200 * time.Millisecond): // (a deletion may wait for the add instead)
	}
	close(release)
	if err := <-added; err != nil {
		t.Logf("the racing add failed: %v", err)
	}
	if err := <-gcDone; err != nil {
		t.Fatal(err)
	}
	pending.Wait()
	e.setCheckpointHook(nil)
	if err := e.Checkpoint(); err != nil { // writes what the cache holds; frees the id
		t.Fatal(err)
	}
	if e.Exists(victim) {
		t.Fatalf("ledger %d was not deleted", victim)
	}
	if last, found, err := e.dir(victim).idx.LastEntry(victim); err != nil || found {
		t.Errorf("the index holds entry %d of deleted ledger %d (err %v)", last, victim, err)
	}

	// A new ledger of the same id must not inherit the deleted one's entries.
	if err := addSync(e, testKey, versionedEntry(victim, 0, 1), false); err != nil {
		t.Fatal(err)
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if last, err := e.LastEntry(victim); err != nil || last != 0 {
		t.Errorf("new ledger %d: last entry %d (err %v), want 0", victim, last, err)
	}
	if _, err := e.Read(victim, 10, nil); !errors.Is(err, ErrNoEntry) {
		t.Errorf("new ledger %d: read of entry 10, which only the deleted ledger had: %v, want ErrNoEntry", victim, err)
	}
}

// TestReadRacingDeletionLeavesNoCachedEntry: a read that reads ahead along a ledger filled the
// read cache after garbage collection had deleted the ledger (between the read's look-ups and
// its entry-log read) and dropped its cached entries. Once the id was free again, a new ledger
// of the same id was served the deleted ledger's bytes from the read cache.
func TestReadRacingDeletionLeavesNoCachedEntry(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	e := openTest(t, cfg)
	defer func() { e.Close() }()
	const victim = 2
	addCheckpointed(t, e, victim, 10)
	// The deletion (as garbage collection makes it) lands while the read reads the entry log.
	var deleted atomic.Bool
	fs.SetInjector(func(op diskio.Op) error {
		if op.Kind == diskio.OpRead && strings.HasSuffix(op.Name, ".log") && !deleted.Swap(true) {
			if err := e.DeleteLedger(victim); err != nil {
				t.Errorf("delete: %v", err)
			}
		}
		return nil
	})
	if _, err := e.Read(victim, 1, nil); err != nil { // sequential (after "entry 0"): it reads ahead
		t.Logf("the racing read failed: %v", err)
	}
	fs.SetInjector(nil)
	if !deleted.Load() || e.Exists(victim) {
		t.Fatalf("ledger %d was not deleted during the read", victim)
	}
	checker.delete(victim)
	if err := e.RunGC(context.Background(), nil); err != nil { // commits the deletion
		t.Fatal(err)
	}
	if err := e.Checkpoint(); err != nil { // frees the id
		t.Fatal(err)
	}
	// A new ledger of the same id, its entries flushed out of the write cache.
	for en := int64(0); en < 4; en++ {
		if err := addSync(e, testKey, versionedEntry(victim, en, 1), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	checkOwnEntries(t, e, victim, 4)
}

// TestReadRacingDeletionAndNewLedgerLeavesNoCachedEntry: the ledger of a disk read is deleted,
// the deletion committed and a new ledger of the same id created between the read's index
// look-up (a location of the deleted ledger) and its entry-log read. The read took the new
// ledger for its own and cached the deleted ledger's entry, which the new ledger was then
// served.
func TestReadRacingDeletionAndNewLedgerLeavesNoCachedEntry(t *testing.T) {
	fs := diskio.NewMem(4096)
	checker := newFakeChecker()
	cfg := gcConfig(t, fs, 1, checker)
	e := openTest(t, cfg)
	defer func() { e.Close() }()
	const victim = 2
	addCheckpointed(t, e, victim, 10)
	var once sync.Once
	e.setReadHook(func(l, en int64, _ uint64) {
		once.Do(func() {
			checker.delete(victim)
			if err := e.RunGC(context.Background(), nil); err != nil { // deletes, commits
				t.Errorf("gc: %v", err)
			}
			if err := e.Checkpoint(); err != nil { // frees the id
				t.Errorf("checkpoint: %v", err)
			}
			for en := int64(0); en < 4; en++ {
				if err := addSync(e, testKey, versionedEntry(victim, en, 1), false); err != nil {
					t.Errorf("add to the new ledger: %v", err)
				}
			}
		})
	})
	if _, err := e.Read(victim, 1, nil); err != nil { // sequential (after "entry 0"): it reads ahead
		t.Logf("the racing read failed: %v", err)
	}
	e.setReadHook(nil)
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	checkOwnEntries(t, e, victim, 4)
}

// addCheckpointed adds entries 0 to n-1 of ledger (storedEntry) and checkpoints them out of
// the write cache.
func addCheckpointed(t *testing.T, e *Engine, ledger, n int64) {
	t.Helper()
	for en := int64(0); en < n; en++ {
		if err := addSync(e, testKey, storedEntry(ledger, en), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
}

// checkOwnEntries checks that entries 0 to n-1 of a ledger created again under a deleted
// ledger's id read back as its own (versionedEntry version 1), not the deleted ledger's.
func checkOwnEntries(t *testing.T, e *Engine, ledger, n int64) {
	t.Helper()
	for en := int64(0); en < n; en++ {
		got, err := e.Read(ledger, en, nil)
		if err != nil || !bytes.Equal(got, versionedEntry(ledger, en, 1)) {
			t.Errorf("new ledger %d entry %d: err %v, its own bytes %v, the deleted ledger's bytes %v", ledger, en, err,
				bytes.Equal(got, versionedEntry(ledger, en, 1)), bytes.Equal(got, storedEntry(ledger, en)))
		}
	}
}
