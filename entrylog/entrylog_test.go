package entrylog

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// roundTrip adds entries of several ledgers across several logs with flushes in between, reads
// every one back, and checks the ledgers maps of the finalized logs and of the current one.
func roundTrip(t *testing.T, cfg Config) {
	e := mustOpen(t, cfg)
	ledgers := []int64{3, 1, 4, 1 << 40, -5}
	var all []added
	for round := range 6 {
		batch := addRange(t, e, ledgers, int64(round*40), int64(round*40+40))
		if err := e.Flush(); err != nil {
			t.Fatal(err)
		}
		all = append(all, batch...)
		checkRead(t, e, batch)
	}
	logs := e.Logs()
	if len(logs) < 4 {
		t.Fatalf("only %d logs: the test should roll several times", len(logs))
	}
	if cur := e.CurrentLogID(); cur != logs[len(logs)-1] {
		t.Fatalf("current log %x is not the newest of %x", cur, logs)
	}
	checkRead(t, e, all)
	want := expectedMaps(all)
	for _, id := range logs {
		if id != e.CurrentLogID() {
			// Finalized: the map is read from the log, not rebuilt.
			if m, err := e.readLedgersMap(id); err != nil || !equalMaps(m, want[id]) {
				t.Fatalf("log %x: stored map %v (%v), want %v", id, m, err, want[id])
			}
		}
		m, err := e.LedgersMap(id)
		if err != nil || !equalMaps(m, want[id]) {
			t.Fatalf("log %x: LedgersMap %v (%v), want %v", id, m, err, want[id])
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopened: everything readable, every log finalized with a valid map, a new current log.
	e = mustOpen(t, cfg)
	defer e.Close()
	if slices.Contains(logs, e.CurrentLogID()) || e.CurrentLogID() <= logs[len(logs)-1] {
		t.Fatalf("reopened current log %x among or below the old logs %x", e.CurrentLogID(), logs)
	}
	checkRead(t, e, all)
	for _, id := range logs {
		if m, err := e.readLedgersMap(id); err != nil || !equalMaps(m, want[id]) {
			t.Fatalf("log %x after reopen: stored map %v (%v), want %v", id, m, err, want[id])
		}
	}
	// Scan returns every entry, in order, with its location.
	var scanned []added
	for _, id := range logs {
		err := e.Scan(id, func(ledger, entry int64, b []byte, loc Location) error {
			if string(b) != string(testEntry(ledger, entry)) {
				return fmt.Errorf("scan %d/%d: wrong bytes", ledger, entry)
			}
			scanned = append(scanned, added{key{ledger, entry}, loc})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(scanned, all) {
		t.Fatalf("scan returned %d entries, want the %d added, in order", len(scanned), len(all))
	}
}

func TestRoundTripMem(t *testing.T) {
	roundTrip(t, memConfig(diskio.NewMem(4096)))
}

func TestRoundTripOS(t *testing.T) {
	for _, engine := range engines(t) {
		t.Run(engine.String(), func(t *testing.T) {
			cfg := memConfig(nil)
			cfg.FS = diskio.NewOS()
			cfg.Dir = t.TempDir()
			cfg.Engine = engine
			roundTrip(t, cfg)
		})
	}
}

func TestEngineIsUsed(t *testing.T) {
	for _, engine := range engines(t) {
		cfg := memConfig(nil)
		cfg.FS, cfg.Dir, cfg.Engine = diskio.NewOS(), t.TempDir(), engine
		e := mustOpen(t, cfg)
		if e.Engine() != engine {
			t.Errorf("asked for %v, got %v", engine, e.Engine())
		}
		e.Close()
	}
	e := mustOpen(t, memConfig(diskio.NewMem(4096)))
	defer e.Close()
	if e.Engine() != diskio.EnginePsync {
		t.Errorf("in-memory FS served by %v", e.Engine())
	}
}

func TestIDsNeverReused(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	e := mustOpen(t, cfg)
	addRange(t, e, []int64{1, 2}, 0, 100)
	logs := e.Logs()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	newest := logs[len(logs)-1]
	if err := fs.Remove(filepath.Join(cfg.Dir, FileName(newest))); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, cfg)
	if id := e.CurrentLogID(); id <= newest {
		t.Fatalf("after deleting the newest log %x the new log is %x", newest, id)
	}
	second := e.CurrentLogID()
	e.Close()
	// Also after removing through Remove, and with every log gone.
	e = mustOpen(t, cfg)
	for _, id := range e.Logs() {
		if id != e.CurrentLogID() {
			if err := e.Remove(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	third := e.CurrentLogID()
	if third <= second {
		t.Fatalf("ids went backwards: %x then %x", second, third)
	}
	e.Close()
	if err := fs.Remove(filepath.Join(cfg.Dir, FileName(third))); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, cfg)
	if id := e.CurrentLogID(); id <= third {
		t.Fatalf("with no log left the new log is %x, not above %x", id, third)
	}
	e.Close()
	// The highest id survives a crash: it is persisted before a log is created.
	e = mustOpen(t, cfg)
	addRange(t, e, []int64{1}, 0, 300) // rolls; the next log is prepared ahead
	top := e.CurrentLogID()
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	e.Close()
	cfg.FS = crashed
	e = mustOpen(t, cfg)
	defer e.Close()
	if id := e.CurrentLogID(); id <= top {
		t.Fatalf("after a crash the new log is %x, not above %x", id, top)
	}
}

func TestLastIDDamageIsAnError(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	e := mustOpen(t, cfg)
	e.Close()
	flipByte(t, fs, filepath.Join(cfg.Dir, lastIDName), 9, 1)
	if _, err := Open(cfg); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), lastIDName) {
		t.Fatalf("open with a damaged lastId: %v", err)
	}
}

func TestRemove(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	e := mustOpen(t, cfg)
	all := addRange(t, e, []int64{7, 8}, 0, 300)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	logs := e.Logs()
	if len(logs) < 3 {
		t.Fatalf("only %d logs", len(logs))
	}
	victim := logs[0]
	var kept []added
	var gone added
	for _, a := range all {
		if a.loc.LogID() == victim {
			gone = a
		} else {
			kept = append(kept, a)
		}
	}
	checkRead(t, e, []added{gone}) // opens a read handle that Remove must drop
	if err := e.Remove(victim); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Read(gone.loc, gone.ledger, gone.entry, nil); !errors.Is(err, ErrNoSuchLog) {
		t.Fatalf("read from a removed log: %v", err)
	}
	if _, err := e.LedgersMap(victim); !errors.Is(err, ErrNoSuchLog) {
		t.Fatalf("map of a removed log: %v", err)
	}
	if err := e.Remove(victim); !errors.Is(err, ErrNoSuchLog) {
		t.Fatalf("second remove: %v", err)
	}
	if err := e.Remove(e.CurrentLogID()); !errors.Is(err, ErrLogInUse) {
		t.Fatalf("remove of the current log: %v", err)
	}
	if err := e.Remove(0xdead); !errors.Is(err, ErrNoSuchLog) {
		t.Fatalf("remove of an unknown log: %v", err)
	}
	if slices.Contains(e.Logs(), victim) {
		t.Fatal("Logs still lists the removed log")
	}
	checkRead(t, e, kept)
	e.Close()
	// The removal is durable.
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	cfg.FS = crashed
	e = mustOpen(t, cfg)
	defer e.Close()
	if slices.Contains(e.Logs(), victim) {
		t.Fatal("removed log is back after a crash")
	}
	checkRead(t, e, kept)
}

func TestReadErrors(t *testing.T) {
	fs := diskio.NewMem(4096)
	e := mustOpen(t, memConfig(fs))
	defer e.Close()
	flushed := addRange(t, e, []int64{1}, 0, 20)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	unflushed := addRange(t, e, []int64{1}, 20, 21)[0]
	a := flushed[3]
	cur := e.CurrentLogID()
	for name, c := range map[string]struct {
		loc           Location
		ledger, entry int64
		want          error
	}{
		"unflushed":        {unflushed.loc, 1, 20, ErrBadLocation},
		"in the header":    {NewLocation(cur, 100), 1, 0, ErrBadLocation},
		"past the flush":   {NewLocation(cur, 1<<30), 1, 0, ErrBadLocation},
		"no such log":      {NewLocation(cur+100, 4096), 1, 0, ErrNoSuchLog},
		"log zero":         {0, 1, 0, ErrNoSuchLog},
		"other entry":      {a.loc, 1, a.entry + 1, ErrCorrupt},
		"other ledger":     {a.loc, 2, a.entry, ErrCorrupt},
		"inside a record":  {NewLocation(cur, a.loc.Offset()+8), 1, a.entry, ErrCorrupt},
		"padding location": {NewLocation(cur, flushed[len(flushed)-1].loc.Offset()+int64(recordHeaderSize+entrySize(1, 19))), 1, 0, ErrCorrupt},
	} {
		_, err := e.Read(c.loc, c.ledger, c.entry, nil)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", name, err, c.want)
		}
	}
	if _, err := e.Add(1, 99, make([]byte, e.cfg.MaxEntrySize+1)); !errors.Is(err, ErrEntryTooLarge) {
		t.Errorf("add too large: %v", err)
	}
	// After the flush the unflushed entry is readable.
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	checkRead(t, e, []added{unflushed})
	// A finalized log: a location past the end of its file.
	addRange(t, e, []int64{1}, 21, 200)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Read(NewLocation(cur, math.MaxUint32), 1, 0, nil); !errors.Is(err, ErrBadLocation) {
		t.Errorf("past the end of a finalized log: %v", err)
	}
}

func TestLargeEntries(t *testing.T) {
	cfg := memConfig(diskio.NewMem(4096))
	cfg.MaxEntrySize = 100 << 10
	cfg.LogSizeLimit = 1 << 20
	e := mustOpen(t, cfg)
	defer e.Close()
	var locs []Location
	sizes := []int{cfg.MaxEntrySize, 1, 40 << 10, cfg.MaxEntrySize - 1, 17 << 10, 0, cfg.MaxEntrySize}
	for i, n := range sizes {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(i + j*13)
		}
		loc, err := e.Add(9, int64(i), b)
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, n := range sizes {
		got, err := e.Read(locs[i], 9, int64(i), nil)
		if err != nil || len(got) != n {
			t.Fatalf("entry %d: %d bytes, %v", i, len(got), err)
		}
		for j := range got {
			if got[j] != byte(i+j*13) {
				t.Fatalf("entry %d: wrong byte %d", i, j)
			}
		}
	}
}

func TestWriteErrorsAreSticky(t *testing.T) {
	for _, kind := range []diskio.OpKind{diskio.OpWrite, diskio.OpSync} {
		for n := range 4 {
			fs := diskio.NewMem(4096)
			cfg := memConfig(fs)
			e := mustOpen(t, cfg)
			failed := errors.New("injected")
			fs.SetInjector(func(op diskio.Op) error {
				if op.Kind == kind && filepath.Ext(op.Name) == ".log" && op.Index >= n+4 {
					return failed
				}
				return nil
			})
			var first error
			for i := int64(0); i < 400 && first == nil; i++ {
				if _, err := e.Add(1, i, testEntry(1, i)); err != nil {
					first = err
				} else if i%20 == 19 {
					first = e.Flush()
				}
			}
			if first == nil {
				first = e.Flush()
			}
			if !errors.Is(first, failed) {
				t.Fatalf("%v #%d: first error %v", kind, n, first)
			}
			if _, err := e.Add(1, 1000, []byte("x")); !errors.Is(err, failed) {
				t.Fatalf("%v #%d: add after failure: %v", kind, n, err)
			}
			if err := e.Flush(); !errors.Is(err, failed) {
				t.Fatalf("%v #%d: flush after failure: %v", kind, n, err)
			}
			if err := e.Close(); !errors.Is(err, failed) {
				t.Fatalf("%v #%d: close after failure: %v", kind, n, err)
			}
			if _, err := e.Add(1, 1001, nil); !errors.Is(err, ErrClosed) {
				t.Fatalf("add after close: %v", err)
			}
		}
	}
}

func TestClosed(t *testing.T) {
	e := mustOpen(t, memConfig(diskio.NewMem(4096)))
	a := addRange(t, e, []int64{1}, 0, 3)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	if _, err := e.Read(a[0].loc, 1, 0, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if err := e.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("flush after close: %v", err)
	}
	if err := e.Remove(a[0].loc.LogID()); !errors.Is(err, ErrClosed) {
		t.Fatalf("remove after close: %v", err)
	}
}
