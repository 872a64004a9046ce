package entrylog

import (
	"bytes"
	"errors"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

type delivered struct {
	key
	loc Location
}

// collect runs ReadAhead from loc and returns what fn saw, checking the bytes; fn stops after
// stopAfter entries (0: never).
func collect(t *testing.T, e *EntryLog, loc Location, maxBytes, stopAfter int) ([]delivered, error) {
	t.Helper()
	var got []delivered
	err := e.ReadAhead(loc, maxBytes, func(ledger, entry int64, b []byte, l Location) bool {
		if !bytes.Equal(b, testEntry(ledger, entry)) {
			t.Fatalf("read-ahead %d/%d at %v: wrong bytes", ledger, entry, l)
		}
		got = append(got, delivered{key{ledger, entry}, l})
		return stopAfter == 0 || len(got) < stopAfter
	})
	return got, err
}

func TestReadAhead(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	cfg.LogSizeLimit = 1 << 20
	cfg.ReadBufferSize = 8 << 10
	e := mustOpen(t, cfg)
	defer e.Close()
	// One ledger's entries in two flushed runs (a padding between them), then a second ledger.
	first := addRange(t, e, []int64{4}, 0, 60)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	second := addRange(t, e, []int64{4}, 60, 120)
	other := addRange(t, e, []int64{9}, 0, 10)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	unflushed := addRange(t, e, []int64{4}, 120, 130)
	all := append(append(append([]added{}, first...), second...), other...)
	span := func(from, to int) int { // bytes of records all[from:to], padding excluded
		n := 0
		for _, a := range all[from:to] {
			n += recordHeaderSize + entrySize(a.ledger, a.entry)
		}
		return n
	}
	same := func(got []delivered, want []added) bool {
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if got[i].key != want[i].key || got[i].loc != want[i].loc {
				return false
			}
		}
		return true
	}

	// Everything up to the end of the flushed data, across the padding, never the unflushed.
	got, err := collect(t, e, all[0].loc, 1<<30, 0)
	if err != nil || !same(got, all) {
		t.Fatalf("read-ahead of everything: %d entries (%v), want %d", len(got), err, len(all))
	}
	// fn stops it.
	got, err = collect(t, e, all[5].loc, 1<<30, 7)
	if err != nil || !same(got, all[5:12]) {
		t.Fatalf("stopped by fn: %d entries (%v)", len(got), err)
	}
	// maxBytes stops it before a record that would end beyond loc+maxBytes.
	for _, n := range []int{3, 17, 40} {
		got, err = collect(t, e, all[10].loc, span(10, 10+n), 0)
		if err != nil || !same(got, all[10:10+n]) {
			t.Fatalf("maxBytes for %d records: got %d (%v)", n, len(got), err)
		}
	}
	// The first record is always delivered.
	got, err = collect(t, e, all[2].loc, 0, 0)
	if err != nil || !same(got, all[2:3]) {
		t.Fatalf("maxBytes 0: %d entries (%v)", len(got), err)
	}
	// Starting in the middle of a record is corruption; at an unflushed one, a bad location.
	if err := e.ReadAhead(NewLocation(all[3].loc.LogID(), all[3].loc.Offset()+1), 100, nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read-ahead inside a record: %v", err)
	}
	if err := e.ReadAhead(unflushed[0].loc, 100, nil); !errors.Is(err, ErrBadLocation) {
		t.Fatalf("read-ahead of an unflushed entry: %v", err)
	}
	// Damage after the first record only ends the read-ahead.
	path := e.Path(all[20].loc.LogID())
	flipByte(t, fs, path, all[20].loc.Offset()+recordHeaderSize, 1)
	got, err = collect(t, e, all[15].loc, 1<<30, 0)
	if err != nil || !same(got, all[15:20]) {
		t.Fatalf("damage ahead: %d entries (%v)", len(got), err)
	}
	flipByte(t, fs, path, all[20].loc.Offset()+recordHeaderSize, 1)
	// In a finalized log it stops at the ledgers map.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, cfg)
	all = append(all, unflushed...)
	got, err = collect(t, e, all[100].loc, 1<<30, 0)
	if err != nil || !same(got, all[100:]) {
		t.Fatalf("finalized log: %d entries (%v), want %d", len(got), err, len(all)-100)
	}
}

// TestReadAheadLargeRecords: records larger than the small read buffers are read through the
// large ones, first or later.
func TestReadAheadLargeRecords(t *testing.T) {
	cfg := memConfig(diskio.NewMem(4096))
	cfg.ReadBufferSize = 8 << 10
	e := mustOpen(t, cfg)
	defer e.Close()
	var locs []Location
	for i := range 12 {
		b := bytes.Repeat([]byte{byte(i)}, (i%4)*5000)
		loc, err := e.Add(1, int64(i), b)
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	for start := range locs {
		var n int
		err := e.ReadAhead(locs[start], 64<<10, func(ledger, entry int64, b []byte, loc Location) bool {
			i := start + n
			if entry != int64(i) || loc != locs[i] || !bytes.Equal(b, bytes.Repeat([]byte{byte(i)}, (i%4)*5000)) {
				t.Fatalf("from %d: got entry %d at %v, want %d at %v", start, entry, loc, i, locs[i])
			}
			n++
			return true
		})
		if err != nil || n == 0 {
			t.Fatalf("from %d: %d entries, %v", start, n, err)
		}
	}
}
