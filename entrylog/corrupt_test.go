package entrylog

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// wantCorrupt checks that err is an ErrCorrupt error naming path and offset, and never one of
// the "not there" errors.
func wantCorrupt(t *testing.T, what string, err error, path string, off int64) {
	t.Helper()
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("%s: got %v, want ErrCorrupt", what, err)
	}
	if errors.Is(err, ErrNoSuchLog) || errors.Is(err, ErrBadLocation) {
		t.Fatalf("%s: %v also reads as not found", what, err)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", off)) {
		t.Fatalf("%s: %v does not name %s at offset %d", what, err, path, off)
	}
}

// TestBitFlipsInRead flips bits in stored entries and record headers of finalized and current
// logs: Read fails with ErrCorrupt naming the file and offset; flipped back, it reads again.
func TestBitFlipsInRead(t *testing.T) {
	fs := diskio.NewMem(4096)
	e := mustOpen(t, memConfig(fs))
	defer e.Close()
	all := addRange(t, e, []int64{5, 6}, 0, 200)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(e.Logs()) < 3 {
		t.Fatal("want several logs")
	}
	// Offsets inside the record to flip: header fields and payload bytes.
	spots := []struct {
		name string
		at   func(a added) int64
	}{
		{"hcrc", func(added) int64 { return 0 }},
		{"length", func(added) int64 { return 5 }},
		{"type", func(added) int64 { return 8 }},
		{"ledger id", func(added) int64 { return 13 }},
		{"entry id", func(added) int64 { return 27 }},
		{"payload crc", func(added) int64 { return 30 }},
		{"first payload byte", func(added) int64 { return recordHeaderSize }},
		{"last payload byte", func(a added) int64 { return recordHeaderSize + int64(entrySize(a.ledger, a.entry)) - 1 }},
	}
	checked := 0
	for i, a := range all {
		if i%23 != 0 {
			continue
		}
		path := e.Path(a.loc.LogID())
		for _, s := range spots {
			rel := s.at(a)
			if rel >= recordHeaderSize+int64(entrySize(a.ledger, a.entry)) {
				continue // empty entry: no payload byte
			}
			off := a.loc.Offset() + rel
			flipByte(t, fs, path, off, 0x10)
			_, err := e.Read(a.loc, a.ledger, a.entry, nil)
			wantCorrupt(t, fmt.Sprintf("entry %v, %s flipped", a.key, s.name), err, path, a.loc.Offset())
			err = e.ReadAhead(a.loc, 1<<20, func(int64, int64, []byte, Location) bool { return true })
			wantCorrupt(t, fmt.Sprintf("read-ahead of entry %v, %s flipped", a.key, s.name), err, path, a.loc.Offset())
			flipByte(t, fs, path, off, 0x10)
			checkRead(t, e, []added{a})
			checked++
		}
	}
	if checked < 50 {
		t.Fatalf("only %d flips", checked)
	}
}

// TestBitFlipsInScan: a flipped bit in the middle of a finalized log, or before the last Flush
// of a log that a crash left unfinalized (found through a later padding's claim), or in the
// flushed part of the log being written, is corruption for Scan; LedgersMap still answers from
// an intact map, and rebuilds a damaged map or header by scanning.
func TestBitFlipsInScan(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	cfg.LogSizeLimit = 1 << 20
	e := mustOpen(t, cfg)
	var groups [][]added
	for g := range 6 {
		groups = append(groups, addRange(t, e, []int64{1, 2, 3}, int64(g*20), int64(g*20+20)))
		if err := e.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	id := e.CurrentLogID()
	path := e.Path(id)
	// The log being written: its flushed part is durable, so damage there is corruption.
	victim := groups[5][7]
	flipByte(t, fs, path, victim.loc.Offset()+recordHeaderSize+1, 1)
	wantCorrupt(t, "scan of the current log", e.Scan(id, nopScan), path, victim.loc.Offset())
	if _, err := e.LedgersMap(id); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("map of the damaged current log: %v", err)
	}
	flipByte(t, fs, path, victim.loc.Offset()+recordHeaderSize+1, 1)

	// A crash leaves the log unfinalized. Damage in the first group is proven durable by the
	// later groups' padding claims; damage in the last flushed group cannot be told from a torn
	// tail (doc.go), but reads still catch it.
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	e.Close()
	cfg.FS = crashed
	fs = crashed
	e = mustOpen(t, cfg)
	var all []added
	for _, g := range groups {
		all = append(all, g...)
	}
	want := expectedMaps(all)[id]
	early := groups[0][10]
	flipByte(t, fs, path, early.loc.Offset()+3, 4)
	wantCorrupt(t, "scan of a crashed log, early damage", e.Scan(id, nopScan), path, early.loc.Offset())
	flipByte(t, fs, path, early.loc.Offset()+3, 4)
	late := groups[5][30]
	flipByte(t, fs, path, late.loc.Offset()+recordHeaderSize, 4)
	if err := e.Scan(id, nopScan); err != nil {
		t.Fatalf("damage in the last flushed group of a crashed log: %v (documented as indistinguishable from a torn tail)", err)
	}
	_, err := e.Read(late.loc, late.ledger, late.entry, nil)
	wantCorrupt(t, "read in the last flushed group", err, path, late.loc.Offset())
	flipByte(t, fs, path, late.loc.Offset()+recordHeaderSize, 4)
	if m, err := e.LedgersMap(id); err != nil || !equalMaps(m, want) {
		t.Fatalf("rebuilt map %v (%v), want %v", m, err, want)
	}
	e.Close()

	// A finalized log (Close finalizes the current one).
	fs = diskio.NewMem(4096)
	cfg = memConfig(fs)
	cfg.LogSizeLimit = 1 << 20
	e = mustOpen(t, cfg)
	all = addRange(t, e, []int64{1, 2, 3}, 0, 100)
	id = e.CurrentLogID()
	path = e.Path(id)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, cfg)
	defer e.Close()
	want = expectedMaps(all)[id]
	mid := all[len(all)/2]
	flipByte(t, fs, path, mid.loc.Offset()+20, 2)
	wantCorrupt(t, "scan of a finalized log", e.Scan(id, nopScan), path, mid.loc.Offset())
	if m, err := e.LedgersMap(id); err != nil || !equalMaps(m, want) {
		t.Fatalf("map of a finalized log with a damaged record: %v (%v)", m, err)
	}
	flipByte(t, fs, path, mid.loc.Offset()+20, 2)
	last := all[len(all)-1]
	mapOffset := last.loc.Offset() + recordHeaderSize + int64(entrySize(last.ledger, last.entry))
	for name, off := range map[string]int64{"map": mapOffset + recordHeaderSize + 3, "header": 20} {
		flipByte(t, fs, path, off, 8)
		if _, err := e.readLedgersMap(id); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s damaged: stored map read gives %v", name, err)
		}
		if m, err := e.LedgersMap(id); err != nil || !equalMaps(m, want) {
			t.Fatalf("%s damaged: rebuilt map %v (%v), want %v", name, m, err, want)
		}
		flipByte(t, fs, path, off, 8)
	}
	// Zeroed sectors in the middle of a finalized log are corruption too.
	zero := make([]byte, 512)
	f, err := fs.Open(path, diskio.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(zero, diskio.AlignDown(mid.loc.Offset(), 512))
	f.Close()
	if err := e.Scan(id, nopScan); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("zeroed sector in a finalized log: %v", err)
	}
}

func nopScan(int64, int64, []byte, Location) error { return nil }
