package engine

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/journal"
)

// flipInEntryLog flips one byte of the first copy of needle found in the dir's entry logs.
func flipInEntryLog(t *testing.T, fs *diskio.Mem, dir string, needle []byte, at int) {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !strings.HasSuffix(n, ".log") {
			continue
		}
		path := filepath.Join(dir, n)
		data, err := diskio.ReadFile(fs, path, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(data, needle)
		if i < 0 {
			continue
		}
		f, err := fs.Open(path, diskio.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{data[i+at] ^ 0x40}, int64(i+at)); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return
	}
	t.Fatalf("entry not found in any entry log of %s", dir)
}

func TestBitFlipInEntryLogIsAnIOError(t *testing.T) {
	for name, at := range map[string]int{"stored entry header": 3, "payload": storedEntryHeader + 1} {
		t.Run(name, func(t *testing.T) {
			fs := diskio.NewMem(4096)
			cfg := testConfig(t, fs, 1)
			cfg.ReadAheadBatchSize = 0
			e := openTest(t, cfg)
			defer e.Close()
			for en := int64(0); en < 20; en++ {
				if err := addSync(e, testKey, storedEntry(5, en), false); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			flipInEntryLog(t, fs, filepath.Join(cfg.LedgerDirs[0], currentDir), storedEntry(5, 7), at)
			_, err := e.Read(5, 7, nil)
			if !errors.Is(err, ErrIO) || errors.Is(err, ErrNoEntry) {
				t.Fatalf("read of a damaged entry: %v, want an I/O error", err)
			}
			// Neighbours are fine.
			mustRead(t, e, 5, 6)
			mustRead(t, e, 5, 8)
			// The damage is counted (ringkeeper_engine_read_errors_total), and a missing entry is not.
			if _, err := e.Read(5, 100, nil); !errors.Is(err, ErrNoEntry) {
				t.Fatalf("read of a missing entry: %v", err)
			}
			if n := e.Stats().ReadErrors; n != 1 {
				t.Fatalf("ReadErrors = %d after one damaged read, want 1", n)
			}
		})
	}
}

func TestAddsWaitBoundedThenFailWhenBothHalvesAreFull(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.WriteCacheMaxSize = 2 << 20 // 1 MiB halves
	cfg.MaxThrottleTime = 200 * time.Millisecond
	e := openTest(t, cfg)
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	e.setCheckpointHook(func(s checkpointStep) error {
		if s == stepHalvesSwapped {
			select {
			case held <- struct{}{}:
			default:
			}
			<-release // the flush is stuck: the sealed half cannot be recycled
		}
		return nil
	})
	var err error
	start := time.Now()
	for en := int64(0); en < 10000; en++ {
		if err = e.Add(testKey, storedEntry(9, en), false, func(any, error) {}, nil); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrTooManyRequests) {
		t.Fatalf("adds into a full cache: %v", err)
	}
	if waited := time.Since(start); waited < cfg.MaxThrottleTime {
		t.Fatalf("failed after %v, before the throttle time %v", waited, cfg.MaxThrottleTime)
	}
	<-held
	close(release)
	e.setCheckpointHook(nil)
	// Once the flush completes adds go through again.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := addSync(e, testKey, storedEntry(9, 20000), false)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrTooManyRequests) || time.Now().After(deadline) {
			t.Fatalf("add after the flush: %v", err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTryAddNeverWaits(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.WriteCacheMaxSize = 2 << 20
	cfg.MaxThrottleTime = time.Hour // Add would wait this long
	e := openTest(t, cfg)
	release := make(chan struct{})
	e.setCheckpointHook(func(s checkpointStep) error {
		if s == stepHalvesSwapped {
			<-release
		}
		return nil
	})
	start := time.Now()
	queued := true
	var err error
	for en := int64(0); en < 10000 && queued; en++ {
		queued, err = e.TryAdd(testKey, storedEntry(9, en), false, func(any, error) {}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	if queued {
		t.Fatal("TryAdd never reported a full cache")
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("TryAdd waited: %v", time.Since(start))
	}
	close(release)
	e.setCheckpointHook(nil)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBitFlipInIndexIsNeverNoEntry flips one byte in turn at many offsets of the index's files
// (pebble's WAL and tables) after a checkpoint made the journal's copy of the entries
// unneeded: each acknowledged entry must then read back intact, or fail with an error (or the
// engine refuse to open); an ErrNoEntry or ErrNoLedger for it is data loss reported as absence.
func TestBitFlipInIndexIsNeverNoEntry(t *testing.T) {
	const entries = 300
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.ReadAheadBatchSize = 0
	e := openTest(t, cfg)
	for en := int64(0); en < entries; en++ {
		if err := addSync(e, testKey, storedEntry(5, en), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	e.Close()
	idxDir := filepath.Join(cfg.IndexDir, "index0")
	pristine := indexFiles(t, idxDir)
	flips := 0
	for name, data := range pristine {
		if !strings.HasSuffix(name, ".log") && !strings.HasSuffix(name, ".sst") {
			continue
		}
		path := filepath.Join(idxDir, name)
		for at := 0; at < len(data); at += 1 + len(data)/40 {
			bad := bytes.Clone(data)
			bad[at] ^= 0x08
			if err := os.WriteFile(path, bad, 0o644); err != nil {
				t.Fatal(err)
			}
			flips++
			if e, err := Open(cfg); err == nil {
				for en := int64(0); en < entries; en++ {
					_, err := e.Read(5, en, nil)
					if errors.Is(err, ErrNoEntry) || errors.Is(err, ErrNoLedger) {
						e.Close()
						t.Errorf("%s byte %d of %d flipped: read 5/%d: %v", name, at, len(data), en, err)
						break
					}
				}
				e.Close()
			}
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if flips == 0 {
		t.Fatalf("no index data files in %s: %v", idxDir, slices.Sorted(maps.Keys(pristine)))
	}
	t.Logf("%d flips of %v", flips, slices.Sorted(maps.Keys(pristine)))
}

// journalWithEntries adds entries [0, n) of ledger l, one journal group each, crashes (power
// loss, no final checkpoint) and returns the crashed FS, the path of the journal file that holds
// them, its bytes, and the offset of each entry's record, so that replay must read them all.
func journalWithEntries(t *testing.T, cfg Config, fs *diskio.Mem, l, n int64) (*diskio.Mem, string, []byte, []int64) {
	t.Helper()
	e := openTest(t, cfg)
	for en := range n {
		if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
			t.Fatal(err)
		}
	}
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	e.fail(errTestCrash) // the process is gone: no final checkpoint
	e.Close()
	jdir := filepath.Join(cfg.JournalDirs[0], currentDir)
	names, err := crashed.List(jdir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if !strings.HasSuffix(name, ".txn") {
			continue
		}
		path := filepath.Join(jdir, name)
		data, err := diskio.ReadFile(crashed, path, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		var offsets []int64
		for en := range n {
			i := bytes.Index(data, storedEntry(l, en))
			if i < 0 {
				break
			}
			offsets = append(offsets, int64(i)-32) // the record header precedes the payload
		}
		if len(offsets) == int(n) {
			return crashed, path, data, offsets
		}
	}
	t.Fatalf("no journal file in %s holds all %d entries of ledger %d", jdir, n, l)
	return nil, "", nil, nil
}

// TestJournalCorruptionInTheMiddleRefusesOpen: damage to a journal record that valid groups
// follow is corruption, not a torn tail: Open must fail naming the file and offset, never drop
// the rest of the journal and serve the ledger's later entries as absent (reliability §5.5).
func TestJournalCorruptionInTheMiddleRefusesOpen(t *testing.T) {
	const n = 20
	for _, tc := range []struct {
		name   string
		damage func(data []byte, offsets []int64)
		// at is the record whose offset the error names.
		at int
	}{
		{"bit flip in a payload", func(data []byte, offsets []int64) { data[offsets[7]+32+40] ^= 0x10 }, 7},
		{"bit flip in a header", func(data []byte, offsets []int64) { data[offsets[7]+12] ^= 0x01 }, 7},
		// A 4 KiB write that landed on the wrong block: every record in it verifies, but it
		// holds entry 3's group where entry 9's belongs.
		{"misdirected block", func(data []byte, offsets []int64) {
			from, to := offsets[3]&^4095, offsets[9]&^4095
			copy(data[to:to+4096], data[from:from+4096])
		}, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := diskio.NewMem(4096)
			cfg := testConfig(t, fs, 1)
			crashed, path, data, offsets := journalWithEntries(t, cfg, fs, 5, n)
			tc.damage(data, offsets)
			f, err := crashed.Open(path, diskio.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			cfg.FS = crashed
			e, err := Open(cfg)
			if err == nil {
				defer e.Close()
				for en := int64(0); en < n; en++ {
					if _, rerr := e.Read(5, en, nil); rerr != nil {
						t.Errorf("read 5/%d: %v", en, rerr)
					}
				}
				t.Fatal("Open succeeded on a journal damaged in the middle")
			}
			if !errors.Is(err, journal.ErrCorruption) {
				t.Fatalf("Open: %v, want journal.ErrCorruption", err)
			}
			if want := fmt.Sprintf("%s offset %d", path, offsets[tc.at]); !strings.Contains(err.Error(), want) {
				t.Fatalf("Open: %q does not name %q", err, want)
			}
		})
	}
}
