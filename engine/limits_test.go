package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/journal"
)

// An add loads the active half (h := d.active.Load() in ledgerDir.put) and is preempted before
// h.put registers in h.writers while a whole checkpoint runs (swap, flush, reset). h is now the
// spare half, which neither reads nor the next flush look at: the put must be refused (the add
// then retries on the active half), or, if taken, the entry must be readable and survive a
// crash after the next checkpoint, whose mark covers its journal record. It used to be taken
// into the spare (reset cleared sealed) and lost.
func TestAddStalledAcrossACheckpointIsNotLost(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	const l = int64(5)
	if err := addSync(e, testKey, storedEntry(l, 0), false); err != nil {
		t.Fatal(err)
	}
	d := e.dir(l)
	stored := storedEntry(l, 1)

	// Engine.add → ledgerDir.put: h := d.active.Load() ...
	h := d.active.Load()
	// ... the goroutine is preempted here while a checkpoint runs to its end.
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// ... and resumes: the rest of ledgerDir.put and of Engine.add, verbatim.
	mem, crc, ok := h.put(l, 1, stored, true)
	if !ok {
		return // refused: the add would retry on the active half (correct behaviour)
	}
	if h == d.active.Load() {
		t.Fatal("test setup: h is active again")
	}
	done := make(chan error, 1)
	op := e.addOps.Get().(*addOp)
	op.half, op.done, op.ctx, op.e = h, func(_ any, err error) { done <- err }, nil, e
	op.entry.Type, op.entry.LedgerID, op.entry.EntryID, op.entry.Payload = journal.RecordData, l, 1, mem
	op.entry.SetPayloadCRC(crc)
	if err := e.journals.For(l).Append(&op.entry); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Acknowledged. It must be readable...
	if _, err := e.Read(l, 1, nil); err != nil {
		t.Errorf("acknowledged entry %d/1 unreadable: %v", l, err)
	}
	// ... and survive a power loss after the next checkpoint (its mark covers the record).
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	e.fail(errors.New("test crash")) // no final checkpoint: the process is gone
	e.Close()
	cfg.FS = crashed
	e = openTest(t, cfg)
	defer e.Close()
	if _, err := e.Read(l, 1, nil); err != nil {
		t.Fatalf("acknowledged entry %d/1 lost after a crash: %v", l, err)
	}
}

// The index cannot store an explicit LAC over 1 MiB or a master key over 65535 bytes
// (index.ErrTooLarge at Batch.Commit). Both must be refused up front: once journaled and
// acknowledged, they failed the next checkpoint, the engine for good, and every replay after a
// restart.
func TestOversizedLedgerStateIsRefusedUpFront(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(e *Engine) error
	}{
		{"explicitLAC", func(e *Engine) error {
			if err := addSync(e, testKey, storedEntry(3, 0), false); err != nil {
				return err
			}
			done := make(chan error, 1)
			if err := e.SetExplicitLAC(3, testKey, make([]byte, 1<<20+1), func(_ any, err error) { done <- err }, nil); err != nil {
				return err
			}
			return <-done
		}},
		{"masterKey", func(e *Engine) error {
			return addSync(e, make([]byte, 1<<16), storedEntry(3, 0), false)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := diskio.NewMem(4096)
			cfg := testConfig(t, fs, 1)
			cfg.Journal.MaxRecordSize = 2 << 20 // above the index limits (default 5 MiB)
			cfg.Journal.MaxFileSize = 16 << 20
			e := openTest(t, cfg)
			if err := tc.do(e); err != nil {
				e.Close()
				if !errors.Is(err, ErrBadEntry) {
					t.Fatalf("refused with %v, want ErrBadEntry", err)
				}
				return
			}
			if err := e.Checkpoint(); err != nil {
				t.Errorf("an accepted request failed the checkpoint: %v", err)
			}
			if err := addSync(e, testKey, storedEntry(4, 0), false); err != nil {
				t.Errorf("an accepted request failed later adds of other ledgers: %v", err)
			}
			e.Close()
			e2, err := Open(cfg)
			if err != nil {
				t.Fatalf("restart fails: %v", err)
			}
			e2.Close()
		})
	}
}

// A deleted ledger's id is refused for new writes until the index has committed the deletion
// (which drops every location of the id) and a checkpoint taken after that has persisted its
// marks: a ledger created again before the commit lost its acknowledged entries to the older
// deletion applied after them in the same batch. Then the id can be used again, and its new
// entries survive.
func TestLedgerIDReusedOnlyAfterItsDeletionIsCommitted(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	const l = int64(9)
	if err := addSync(e, testKey, storedEntry(l, 0), false); err != nil {
		t.Fatal(err)
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if err := e.DeleteLedger(l); err != nil {
		t.Fatal(err)
	}
	if err := addSync(e, testKey, storedEntry(l, 1), false); !errors.Is(err, ErrTooManyRequests) {
		t.Fatalf("add to a ledger whose deletion is not committed: %v, want ErrTooManyRequests", err)
	}
	if e.Exists(l) {
		t.Fatal("a refused add created the ledger")
	}
	if err := e.Checkpoint(); err != nil { // commits the deletion, after its marks snapshot
		t.Fatal(err)
	}
	if err := addSync(e, testKey, storedEntry(l, 1), false); !errors.Is(err, ErrTooManyRequests) {
		t.Fatalf("add before a checkpoint covers the committed deletion: %v, want ErrTooManyRequests", err)
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if err := addSync(e, testKey, storedEntry(l, 1), false); err != nil {
		t.Fatalf("add after a checkpoint covered the deletion: %v", err)
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Read(l, 1, nil); err != nil {
		t.Errorf("acknowledged entry %d/1 after the checkpoint: %v", l, err)
	}
	if _, err := e.Read(l, 0, nil); !errors.Is(err, ErrNoEntry) {
		t.Errorf("entry %d/0 of the deleted ledger: %v, want ErrNoEntry", l, err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openTest(t, cfg)
	defer e.Close()
	if _, err := e.Read(l, 1, nil); err != nil {
		t.Errorf("acknowledged entry %d/1 after a restart: %v", l, err)
	}
}

// DeleteLedger empties the ledger's slots in the half being flushed (removeLedger) while the
// flush lists them (cacheHalf.sorted): the listing must hold the ledger's lock. Entries more
// than maxDenseGap apart (a sparse map of 40000) make the window wide: without the lock the
// process died with "concurrent map iteration and map write" (and -race reports it).
func TestDeleteLedgerDuringFlush(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	defer e.Close()
	const l = int64(11)
	var wg sync.WaitGroup
	for i := int64(0); i < 40000; i++ {
		b := make([]byte, storedEntryHeader+1)
		binary.BigEndian.PutUint64(b[0:], uint64(l))
		binary.BigEndian.PutUint64(b[8:], uint64(i*(maxDenseGap+10)))
		wg.Add(1)
		if err := e.Add(testKey, b, false, func(any, error) { wg.Done() }, nil); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	e.setCheckpointHook(func(s checkpointStep) error {
		if s == stepHalvesSwapped {
			wg.Go(func() { _ = e.DeleteLedger(l) })
		}
		return nil
	})
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// An add of an entry above the largest record (the journal's and the entry log's limit) is
// refused and changes nothing: it is not readable and does not break the next checkpoint. It
// used to land in the write cache before the journal refused it, and the checkpoint then failed
// the engine.
func TestOversizedAddChangesNothing(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	defer e.Close()
	if err := addSync(e, testKey, storedEntry(1, 0), false); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, cfg.Journal.MaxRecordSize+1)
	binary.BigEndian.PutUint64(big[0:], 1)
	binary.BigEndian.PutUint64(big[8:], 1)
	if err := addSync(e, testKey, big, false); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("an add above MaxRecordSize: %v, want ErrBadEntry", err)
	}
	if got, err := e.Read(1, 1, nil); err == nil {
		t.Errorf("the refused entry is readable (%d bytes)", len(got))
	}
	if err := e.Checkpoint(); err != nil {
		t.Errorf("checkpoint after a refused oversized add: %v", err)
	}
	if err := e.Err(); err != nil {
		t.Errorf("engine failed after a refused oversized add: %v", err)
	}
	if err := addSync(e, testKey, storedEntry(1, 2), false); err != nil {
		t.Errorf("add after a refused oversized add: %v", err)
	}
}

// A sequential read from an entry log reads ahead the ledger's next entries into the read cache, those the
// index points at (TestReadAheadServesUnindexedRecords: and no others).
func TestReadAheadCachesTheIndexedNextEntries(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.ReadAheadBatchSize = 100
	e := openTest(t, cfg)
	const l = int64(4)
	for en := range int64(10) {
		if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil { // the last checkpoint flushes them
		t.Fatal(err)
	}
	e = openTest(t, cfg)
	defer e.Close()
	if _, ok := e.ReadCached(l, 5, nil); ok {
		t.Fatal("entry 5 cached before any read")
	}
	for en := range int64(2) { // a sequential read reads ahead
		if _, err := e.Read(l, en, nil); err != nil {
			t.Fatal(err)
		}
	}
	for en := int64(2); en < 10; en++ {
		if got, ok := e.ReadCached(l, en, nil); !ok || !bytes.Equal(got, storedEntry(l, en)) {
			t.Fatalf("entry %d not read ahead into the read cache", en)
		}
	}
}

// A journaled entry that cannot fit an empty write-cache half at replay (the cache was made
// smaller, or the largest entry lowered, since it was acknowledged) makes Open fail with an
// error that says so. Replay flushed the empty half and tried again, for ever: Open hung.
func TestReplayOfAnEntryLargerThanTheWriteCacheHalfFails(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.Journal.MaxRecordSize = 3 << 20
	cfg.Journal.MaxFileSize = 16 << 20
	e := openTest(t, cfg)
	const l = int64(7)
	big := make([]byte, 2<<20)
	binary.BigEndian.PutUint64(big[0:], uint64(l))
	binary.BigEndian.PutUint64(big[8:], 0)
	if err := addSync(e, testKey, big, false); err != nil {
		t.Fatal(err)
	}
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil) // before any checkpoint covers it
	e.Close()

	cfg.FS = crashed
	cfg.WriteCacheMaxSize = 2 << 20 // 1 MiB halves
	cfg.Journal.MaxRecordSize = 1 << 20
	cfg.Journal.MaxFileSize = 4 << 20
	opened := make(chan error, 1)
	go func() {
		e, err := Open(cfg)
		if err == nil {
			e.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if err == nil {
			t.Fatal("Open replayed a 2 MiB entry into 1 MiB write-cache halves")
		}
		if !strings.Contains(err.Error(), "write-cache half") {
			t.Errorf("Open: %v; want an error about the write-cache half", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Open hangs replaying an entry larger than a write-cache half")
	}
}

// Adds in progress while their ledger is deleted and the deletion committed (garbage
// collection deletes ledgers gone from the metadata store, then commits at once, while the
// old writer may still be adding): an add that passed its ledger look-up before the deletion
// put its entry into the write cache after the deletion had dropped the ledger's entries, and
// the next checkpoint wrote its location after the committed range delete. The deleted
// ledger kept index rows, which a new ledger under the same id then served as its own (its
// last entry and LAC among them). No row may outlive the deletion.
func TestAddRacingALedgerDeletionLeavesNoIndexRow(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	defer e.Close()
	const rounds = 200
	stale := 0
	for round := int64(0); round < rounds; round++ {
		l := 1000 + round
		if err := addSync(e, testKey, storedEntry(l, 0), false); err != nil {
			t.Fatal(err)
		}
		d := e.dir(l)
		var stop atomic.Bool
		var writers, callbacks sync.WaitGroup
		for w := int64(0); w < 8; w++ {
			writers.Go(func() {
				for en := 1 + w<<20; !stop.Load(); en++ {
					callbacks.Add(1)
					if err := e.Add(testKey, storedEntry(l, en), false, func(any, error) { callbacks.Done() }, nil); err != nil {
						callbacks.Done()
					}
				}
			})
		}
		for d.active.Load().count.Load() < 50 {
			runtime.Gosched()
		}
		if err := e.DeleteLedger(l); err != nil {
			t.Fatal(err)
		}
		if err := d.commitDeletes(); err != nil { // as garbage collection does
			t.Fatal(err)
		}
		stop.Store(true)
		writers.Wait()
		callbacks.Wait()
		if e.Exists(l) {
			// A checkpoint (a half filled) freed the id while the writers ran, and one of them
			// created the ledger anew, as it may: its rows are its own.
			continue
		}
		for range 2 { // the second one frees the id
			if err := e.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
		last, found, err := d.idx.LastEntry(l)
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			continue
		}
		stale++
		// The id is used again: the old ledger's entry must not be the new one's.
		if err := addSync(e, []byte("another key"), storedEntry(l, 0), false); err != nil {
			t.Fatalf("round %d: creating ledger %d again: %v", round, l, err)
		}
		if _, err := e.Read(l, last, nil); !errors.Is(err, ErrNoEntry) {
			t.Errorf("round %d: ledger %d created again serves entry %d of its deleted predecessor (err %v)", round, l, last, err)
		}
	}
	if stale > 0 {
		t.Fatalf("%d of %d rounds left index rows of a deleted ledger after the commit of its deletion", stale, rounds)
	}
}

// TestLargestEntryFitsAWriteCacheSegment: an entry up to the largest allowed (the journal's
// MaxRecordSize, which the bookie sets from nettyMaxFrameSizeBytes) is stored whatever the
// segment size: segments were 64 MiB at most, so with a larger limit an entry over 64 MiB
// never fitted one and waited out MaxThrottleTime to be refused as too many requests, every
// time. Here the segments are scaled down to 1 MiB and the limit to 1.5 MiB.
func TestLargestEntryFitsAWriteCacheSegment(t *testing.T) {
	defer func(old int64) { writeCacheSegmentSize = old }(writeCacheSegmentSize)
	writeCacheSegmentSize = 1 << 20
	cfg := testConfig(t, diskio.NewMem(4096), 1)
	cfg.Journal.MaxRecordSize = 3 << 19
	cfg.Journal.BufferedWritesThreshold = 3 << 19
	cfg.Journal.MaxFileSize = 16 << 20
	cfg.MaxThrottleTime = 200 * time.Millisecond
	e := openTest(t, cfg)
	defer e.Close()
	stored := storedEntry(1, 0)
	stored = append(stored, make([]byte, cfg.Journal.MaxRecordSize-len(stored)-64)...)
	if err := addSync(e, testKey, stored, false); err != nil {
		t.Fatalf("an entry of %d bytes, under the largest (%d): %v", len(stored), cfg.Journal.MaxRecordSize, err)
	}
	got, err := e.Read(1, 0, nil)
	if err != nil || !bytes.Equal(got, stored) {
		t.Fatalf("read back: %d bytes, err %v; want the %d bytes added", len(got), err, len(stored))
	}
}
