package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// fencedAndDeleted writes entries 0..2 of ledger l, fences it (as a recoverer would) and
// deletes it (as garbage collection does once the metadata store dropped it). With checkpoint,
// a checkpoint runs after the fence: the ledger's state is in the index and the persisted mark
// is past its journal records, so a crash does not bring it back from replay.
func fencedAndDeleted(t *testing.T, e *Engine, l int64, checkpoint bool) {
	t.Helper()
	for en := range int64(3) {
		if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := fenceSync(e, l, testKey); err != nil {
		t.Fatal(err)
	}
	if checkpoint {
		if err := e.Checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.DeleteLedger(l); err != nil {
		t.Fatal(err)
	}
}

// wantOldWriterRefused checks that the old writer of ledger l (fenced, then deleted) cannot
// write to it: neither a normal add nor a recovery add nor a fence creates it again.
func wantOldWriterRefused(t *testing.T, e *Engine, l int64, when string) {
	t.Helper()
	for _, recovery := range []bool{false, true} {
		if err := addSync(e, testKey, storedEntry(l, 3), recovery); !errors.Is(err, ErrFenced) {
			t.Fatalf("%s: add (recovery %v) to ledger %d, fenced and deleted: %v, want ErrFenced", when, recovery, l, err)
		}
	}
	if err := fenceSync(e, l, testKey); !errors.Is(err, ErrFenced) {
		t.Fatalf("%s: fence of ledger %d, fenced and deleted: %v, want ErrFenced", when, l, err)
	}
	if e.Exists(l) {
		t.Fatalf("%s: ledger %d exists again", when, l)
	}
}

// restartEngine stops e and opens the engine again on its directories: a clean Close, or a
// power loss (the journals and entry logs keep only what was synced; the index, on the OS's
// file system, keeps every committed batch).
func restartEngine(t *testing.T, e *Engine, cfg *Config, fs *diskio.Mem, crash bool) *Engine {
	t.Helper()
	if crash {
		cfg.FS = fs.Crash(diskio.CrashSyncedOnly, nil)
		e.fail(errTestCrash) // no checkpoint at Close: the process is gone
	}
	e.Close()
	return openTest(t, *cfg)
}

// TestFencedDeletedSurvivesRestart replays BookKeeper #4462 across a restart: a ledger fenced
// by a recoverer and then deleted (the deletion committed to the index by a checkpoint or by a
// garbage collection run) must refuse its old writer's next add after the bookie restarts,
// cleanly or after a crash. A bookie that kept the fenced deletion in memory only forgets it,
// creates the ledger anew and acknowledges the add, though nothing can ever read it.
func TestFencedDeletedSurvivesRestart(t *testing.T) {
	for _, by := range []string{"checkpoint", "gc"} {
		for _, crash := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/crash=%v", by, crash), func(t *testing.T) {
				fs := diskio.NewMem(4096)
				cfg := testConfig(t, fs, 2)
				e := openTest(t, cfg)
				const l = 7
				fencedAndDeleted(t, e, l, true)
				var err error
				if by == "checkpoint" {
					err = e.Checkpoint()
				} else {
					err = e.RunGC(context.Background(), nil)
				}
				if err != nil {
					t.Fatal(err)
				}
				wantOldWriterRefused(t, e, l, "before the restart")
				e = restartEngine(t, e, &cfg, fs, crash)
				wantOldWriterRefused(t, e, l, "after the restart")
				// Another ledger is still written as usual.
				if err := addSync(e, testKey, storedEntry(l+2, 0), false); err != nil {
					t.Fatal(err)
				}
				// And a second restart still remembers it (Open's checkpoint kept the tombstone).
				e = restartEngine(t, e, &cfg, fs, false)
				defer e.Close()
				wantOldWriterRefused(t, e, l, "after a second restart")
				mustRead(t, e, l+2, 0)
			})
		}
	}
}

// TestFencedDeletedIsNotReplayed: a ledger fenced and deleted after the last persisted mark,
// its deletion committed by garbage collection, then a crash: the journal still holds the
// ledger's key, entries and fence, but replay must not bring the ledger back (its records
// predate the deletion that the index committed with the tombstone).
func TestFencedDeletedIsNotReplayed(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	const l = 5
	fencedAndDeleted(t, e, l, false)
	if err := e.RunGC(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	e = restartEngine(t, e, &cfg, fs, true)
	defer e.Close()
	if _, err := e.Read(l, 0, nil); !errors.Is(err, ErrNoLedger) {
		t.Fatalf("read of a deleted ledger after replay: %v, want ErrNoLedger", err)
	}
	wantOldWriterRefused(t, e, l, "after replay")
}

// tombstones returns the fenced-deleted tombstones in every index of e.
func tombstones(t *testing.T, e *Engine) map[int64]time.Time {
	t.Helper()
	got := map[int64]time.Time{}
	for _, d := range e.dirs {
		err := d.idx.FencedDeleted(func(id int64, at time.Time) bool {
			got[id] = at
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// TestFencedDeletionCrashKeepsBothOrNeither stops the commit of a fenced ledger's deletion at
// each step of a checkpoint and after garbage collection's commit of deletions, with a power
// loss, and restarts. The deletion and its tombstone are one index batch: after the restart
// either the ledger is back (its deletion was not committed; it is fenced, from the index) or
// the tombstone is there, never neither, never both; and the old writer is refused either way.
func TestFencedDeletionCrashKeepsBothOrNeither(t *testing.T) {
	type point struct {
		gc   bool
		step checkpointStep
	}
	var points []point
	for _, s := range []checkpointStep{stepMarksSnapshot, stepHalvesSwapped, stepEntryLogSynced, stepIndexSynced, stepMarksPersisted, stepJournalsCollected} {
		points = append(points, point{false, s})
	}
	points = append(points, point{true, stepGCDeletesCommitted})
	for _, p := range points {
		t.Run(fmt.Sprintf("gc=%v/step%d", p.gc, p.step), func(t *testing.T) {
			fs := diskio.NewMem(4096)
			cfg := testConfig(t, fs, 1)
			e := openTest(t, cfg)
			const l = 3
			fencedAndDeleted(t, e, l, true)
			var crashed *diskio.Mem
			e.setCheckpointHook(func(s checkpointStep) error {
				if s == p.step && crashed == nil {
					crashed = fs.Crash(diskio.CrashSyncedOnly, nil)
					return errTestCrash
				}
				return nil
			})
			var err error
			if p.gc {
				err = e.RunGC(context.Background(), nil)
			} else {
				err = e.Checkpoint()
			}
			if !errors.Is(err, errTestCrash) {
				t.Fatalf("commit of the deletion: %v, want the test crash", err)
			}
			e.Close()
			cfg.FS = crashed
			e = openTest(t, cfg)
			defer e.Close()
			_, tomb := tombstones(t, e)[l]
			back := e.Exists(l)
			if back == tomb {
				t.Fatalf("after the crash: ledger present %v, tombstone present %v; want exactly one", back, tomb)
			}
			committed := p.gc || p.step >= stepIndexSynced
			if tomb != committed {
				t.Fatalf("after a crash at step %d: tombstone present %v, want %v", p.step, tomb, committed)
			}
			if back {
				if f, err := e.IsFenced(l); err != nil || !f {
					t.Fatalf("the ledger came back unfenced: %v, %v", f, err)
				}
				if err := addSync(e, testKey, storedEntry(l, 3), false); !errors.Is(err, ErrFenced) {
					t.Fatalf("add to the fenced ledger that came back: %v, want ErrFenced", err)
				}
				return
			}
			wantOldWriterRefused(t, e, l, "after the crash")
		})
	}
}

// TestFencedDeletedExpires: tombstones are dated by the wall clock (Config.WallClock, moved
// here by hand) and dropped once older than fencedDeletedRetention: from memory and the index
// at Open for those already expired then, and by a garbage collection run for those that
// expire while the engine runs. The ledger can then be created again.
func TestFencedDeletedExpires(t *testing.T) {
	const day = 24 * time.Hour
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var clock atomic.Int64
	at := func(d time.Duration) { clock.Store(t0.Add(d).UnixNano()) }
	at(0)
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 2)
	cfg.WallClock = func() time.Time { return time.Unix(0, clock.Load()) }
	e := openTest(t, cfg)
	wantTombstones := func(when string, want map[int64]time.Time) {
		t.Helper()
		got := tombstones(t, e)
		if !maps.EqualFunc(got, want, time.Time.Equal) {
			t.Fatalf("%s: tombstones %v, want %v", when, got, want)
		}
		for _, l := range []int64{7, 8} {
			_, w := want[l]
			if m := e.ledgers.isFencedDeleted(l); m != w {
				t.Fatalf("%s: ledger %d remembered as fenced-deleted %v, want %v", when, l, m, w)
			}
		}
	}

	fencedAndDeleted(t, e, 7, false) // at t0
	at(5 * day)
	fencedAndDeleted(t, e, 8, false) // at t0 + 5 days
	if err := e.RunGC(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	wantTombstones("deletions committed", map[int64]time.Time{7: t0, 8: t0.Add(5 * day)})

	// Reopened exactly 7 days after the first deletion: ledger 7's tombstone has expired.
	at(7 * day)
	e = restartEngine(t, e, &cfg, fs, false)
	wantTombstones("reopened after 7 days", map[int64]time.Time{8: t0.Add(5 * day)})
	wantOldWriterRefused(t, e, 8, "reopened after 7 days")
	if err := addSync(e, testKey, storedEntry(7, 0), false); err != nil {
		t.Fatalf("add to ledger 7, its tombstone expired at Open: %v", err)
	}

	// Ledger 8's expires while the engine runs: the next GC run drops it.
	at(12*day - time.Nanosecond)
	if err := e.RunGC(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	wantTombstones("GC run before 8's retention ends", map[int64]time.Time{8: t0.Add(5 * day)})
	at(12 * day)
	if err := e.RunGC(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	wantTombstones("GC run after 8's retention ended", map[int64]time.Time{})
	if err := addSync(e, testKey, storedEntry(8, 0), false); err != nil {
		t.Fatalf("add to ledger 8, its tombstone expired at a GC run: %v", err)
	}

	// Both ledgers, created again, survive a restart, and no tombstone comes back.
	e = restartEngine(t, e, &cfg, fs, false)
	defer e.Close()
	wantTombstones("final restart", map[int64]time.Time{})
	mustRead(t, e, 7, 0)
	mustRead(t, e, 8, 0)
}

// putRawTombstone writes a fenced-deleted tombstone for ledger l, dated at, straight into the
// closed index in dir (index package's keyspace 04: 04 ‖ BE(l) → 01 ‖ BE(Unix nanoseconds)).
func putRawTombstone(t *testing.T, dir string, l int64, at time.Time) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k := binary.BigEndian.AppendUint64([]byte{4}, uint64(l))
	v := binary.BigEndian.AppendUint64([]byte{1}, uint64(at.UnixNano()))
	if err := db.Set(k, v, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFencedDeletedBesideLedgerState: a tombstone beside a state of the same ledger (the
// ledger was created again by a build that ignores tombstones, after a roll-back) does not
// hide the ledger: Open keeps the ledger and drops the tombstone, and keeps the others.
func TestFencedDeletedBesideLedgerState(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	if err := addSync(e, testKey, storedEntry(4, 0), false); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil { // its checkpoint puts ledger 4's state in the index
		t.Fatal(err)
	}
	dir := filepath.Join(cfg.IndexDir, "index0")
	putRawTombstone(t, dir, 4, time.Now())
	putRawTombstone(t, dir, 9, time.Now())
	e = openTest(t, cfg)
	defer e.Close()
	mustRead(t, e, 4, 0)
	if err := addSync(e, testKey, storedEntry(4, 1), false); err != nil {
		t.Fatalf("add to ledger 4, created again beside a stale tombstone: %v", err)
	}
	got := tombstones(t, e)
	if _, ok := got[4]; ok || len(got) != 1 {
		t.Fatalf("tombstones %v, want ledger 9's only", got)
	}
	wantOldWriterRefused(t, e, 9, "tombstone without a ledger state")
}

// TestFencedDeletedAfterUpgradeFromFormat2: an index of an older format (no tombstones) opens,
// and a fenced deletion made after the upgrade survives a restart.
func TestFencedDeletedAfterUpgradeFromFormat2(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	e := openTest(t, cfg)
	if err := addSync(e, testKey, storedEntry(2, 0), false); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	downgradeIndex(t, filepath.Join(cfg.IndexDir, "index0"))
	e = openTest(t, cfg)
	mustRead(t, e, 2, 0)
	if got := tombstones(t, e); len(got) != 0 {
		t.Fatalf("upgraded index holds tombstones %v", got)
	}
	fencedAndDeleted(t, e, 6, true)
	e = restartEngine(t, e, &cfg, fs, false)
	defer e.Close()
	wantOldWriterRefused(t, e, 6, "after the upgrade and a restart")
	mustRead(t, e, 2, 0)
}

// isFencedDeleted reports whether id is remembered as deleted while fenced (expired or not).
func (t *ledgerTable) isFencedDeleted(id int64) bool {
	s := &t.shards[t.shard(id)]
	s.mu.RLock()
	_, ok := s.fencedDeleted[id]
	s.mu.RUnlock()
	return ok
}
