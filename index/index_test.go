package index

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

// openTest opens an index in a fresh directory with a small cache and memtable, closed at
// the end of the test.
func openTest(t testing.TB) *Index {
	t.Helper()
	return openDir(t, t.TempDir())
}

func openDir(t testing.TB, dir string) *Index {
	t.Helper()
	cfg := DefaultConfig(dir)
	cfg.BlockCacheSize = 8 << 20
	cfg.MemTableSize = 8 << 20
	ix, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ix.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Error(err)
		}
	})
	return ix
}

// loc is the location the tests store for (ledger, entry): unique and easy to check.
func loc(ledger, entry int64) uint64 { return uint64(ledger)<<32 ^ uint64(entry)*2654435761 }

func commit(t testing.TB, b *Batch, sync bool) {
	t.Helper()
	if err := b.Commit(sync); err != nil {
		t.Fatal(err)
	}
}

func wantLast(t *testing.T, ix *Index, ledger, entry int64) {
	t.Helper()
	e, l, err := ix.LastEntry(ledger)
	if entry < 0 {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("LastEntry(%d) = %d, %#x, %v; want ErrNotFound", ledger, e, l, err)
		}
		return
	}
	if err != nil || e != entry || l != loc(ledger, entry) {
		t.Fatalf("LastEntry(%d) = %d, %#x, %v; want %d, %#x", ledger, e, l, err, entry, loc(ledger, entry))
	}
}

func entries(t *testing.T, ix *Index, ledger, from int64) []int64 {
	t.Helper()
	var got []int64
	err := ix.Entries(ledger, from, func(e int64, l uint64) bool {
		if l != loc(ledger, e) {
			t.Fatalf("Entries(%d): entry %d at %#x, want %#x", ledger, e, l, loc(ledger, e))
		}
		got = append(got, e)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestLocationsRoundTrip(t *testing.T) {
	ix := openTest(t)
	b := ix.NewBatch()
	defer b.Close()
	// Ledger 7 has gaps; its neighbours 6 and 8 have entries below and above its own.
	gapped := []int64{0, 1, 2, 5, 9, 1000, 1 << 40}
	for _, e := range gapped {
		b.PutLocation(7, e, loc(7, e))
	}
	for e := range int64(2000) {
		b.PutLocation(6, e, loc(6, e))
	}
	b.PutLocation(8, 0, loc(8, 0))
	b.PutLocation(8, math.MaxInt64, loc(8, math.MaxInt64))
	b.PutLocation(0, 3, loc(0, 3))
	b.PutLocation(math.MaxInt64, 4, loc(math.MaxInt64, 4))
	if b.Len() != len(gapped)+2000+4 {
		t.Fatalf("Len = %d", b.Len())
	}
	commit(t, b, true)
	if b.Len() != 0 {
		t.Fatalf("Len after Commit = %d", b.Len())
	}

	for _, e := range gapped {
		if l, err := ix.Location(7, e); err != nil || l != loc(7, e) {
			t.Fatalf("Location(7, %d) = %#x, %v", e, l, err)
		}
	}
	for _, e := range []int64{3, 4, 6, 999, 1001, 1<<40 + 1, math.MaxInt64} {
		if l, err := ix.Location(7, e); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Location(7, %d) = %#x, %v; want ErrNotFound", e, l, err)
		}
	}
	wantLast(t, ix, 7, 1<<40)
	wantLast(t, ix, 6, 1999)
	wantLast(t, ix, 8, math.MaxInt64)
	wantLast(t, ix, 0, 3)
	wantLast(t, ix, math.MaxInt64, 4)
	for _, l := range []int64{1, 5, 9, 100, math.MaxInt64 - 1} {
		wantLast(t, ix, l, -1)
	}

	if got := entries(t, ix, 7, 0); !equalInts(got, gapped) {
		t.Fatalf("Entries(7, 0) = %v", got)
	}
	if got := entries(t, ix, 7, 3); !equalInts(got, gapped[3:]) {
		t.Fatalf("Entries(7, 3) = %v", got)
	}
	if got := entries(t, ix, 8, 1); !equalInts(got, []int64{math.MaxInt64}) {
		t.Fatalf("Entries(8, 1) = %v", got)
	}
	if got := entries(t, ix, 9, 0); len(got) != 0 {
		t.Fatalf("Entries(9, 0) = %v", got)
	}
	n := 0
	if err := ix.Entries(6, 10, func(int64, uint64) bool { n++; return n < 5 }); err != nil || n != 5 {
		t.Fatalf("Entries stopped after %d, %v", n, err)
	}

	// Overwrite (compaction moves an entry) and reuse the batch.
	b.PutLocation(7, 5, 42)
	commit(t, b, false)
	if l, err := ix.Location(7, 5); err != nil || l != 42 {
		t.Fatalf("Location after overwrite = %d, %v", l, err)
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalState(a, b LedgerState) bool {
	return a.Exists == b.Exists && a.Fenced == b.Fenced && a.Limbo == b.Limbo &&
		a.Deleted == b.Deleted && bytes.Equal(a.MasterKey, b.MasterKey) &&
		bytes.Equal(a.ExplicitLAC, b.ExplicitLAC) && (a.ExplicitLAC == nil) == (b.ExplicitLAC == nil)
}

var testStates = []LedgerState{
	{},
	{Exists: true, MasterKey: bytes.Repeat([]byte{0xab}, 20)},
	{Exists: true, Fenced: true, MasterKey: []byte("master-key-of-20-byt")},
	{Exists: true, MasterKey: []byte("k"), ExplicitLAC: []byte{}},
	{Exists: true, Fenced: true, MasterKey: []byte("k2"), ExplicitLAC: bytes.Repeat([]byte{1, 2, 3}, 30)},
	{Exists: true, Limbo: true, Deleted: true, MasterKey: make([]byte, MaxMasterKeyLen)},
	{Fenced: true},
}

func TestLedgerStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ix := openDir(t, dir)
	b := ix.NewBatch()
	for i, st := range testStates {
		b.PutLedger(int64(i*10), st)
	}
	commit(t, b, true)
	b.Close()
	check := func(ix *Index) {
		for i, want := range testStates {
			got, err := ix.Ledger(int64(i * 10))
			if err != nil || !equalState(got, want) {
				t.Fatalf("Ledger(%d) = %+v, %v; want %+v", i*10, got, err, want)
			}
		}
		if _, err := ix.Ledger(5); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Ledger(5): %v, want ErrNotFound", err)
		}
		var ids []int64
		err := ix.Ledgers(func(id int64, st LedgerState) bool {
			if !equalState(st, testStates[id/10]) {
				t.Fatalf("Ledgers: %d = %+v", id, st)
			}
			ids = append(ids, id)
			return true
		})
		if err != nil || len(ids) != len(testStates) {
			t.Fatalf("Ledgers: %v, %v", ids, err)
		}
		for i, id := range ids {
			if id != int64(i*10) {
				t.Fatalf("Ledgers out of order: %v", ids)
			}
		}
	}
	check(ix)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	check(openDir(t, dir))
}

func TestLedgerStateEncoding(t *testing.T) {
	for _, st := range testStates {
		v, err := appendLedgerState(nil, &st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeLedgerState(v)
		if err != nil || !equalState(got, st) {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", st, got, err)
		}
		// Every strict prefix and every extension is corrupt.
		for n := range len(v) {
			if _, err := decodeLedgerState(v[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("prefix %d of %x: %v", n, v, err)
			}
		}
		if _, err := decodeLedgerState(append(v, 0)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("extended %x: %v", v, err)
		}
	}
	// The documented layout, byte for byte.
	v, _ := appendLedgerState(nil, &LedgerState{Exists: true, Fenced: true, MasterKey: []byte("ab"), ExplicitLAC: []byte{9}})
	if want := []byte{1, 0x13, 0, 2, 'a', 'b', 0, 0, 0, 1, 9}; !bytes.Equal(v, want) {
		t.Fatalf("encoding %x, want %x", v, want)
	}
	if _, err := appendLedgerState(nil, &LedgerState{MasterKey: make([]byte, MaxMasterKeyLen+1)}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized master key: %v", err)
	}
}

func TestDeleteLedger(t *testing.T) {
	dir := t.TempDir()
	ix := openDir(t, dir)
	b := ix.NewBatch()
	defer b.Close()
	for l := int64(10); l <= 12; l++ {
		b.PutLedger(l, LedgerState{Exists: true, MasterKey: []byte{byte(l)}})
		for e := range int64(500) {
			b.PutLocation(l, e, loc(l, e))
		}
	}
	commit(t, b, true)
	// Flush so that the range deletion has to cover keys in sstables as well as in the
	// memtable; then add more entries to the memtable.
	if err := ix.db.Flush(); err != nil {
		t.Fatal(err)
	}
	for e := int64(500); e < 600; e++ {
		b.PutLocation(11, e, loc(11, e))
	}
	commit(t, b, false)

	b.DeleteLedger(11)
	if b.Len() != 2 {
		t.Fatalf("DeleteLedger Len = %d", b.Len())
	}
	commit(t, b, true)

	check := func(ix *Index) {
		if _, err := ix.Ledger(11); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Ledger(11) after delete: %v", err)
		}
		for e := range int64(600) {
			if _, err := ix.Location(11, e); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Location(11, %d) after delete: %v", e, err)
			}
		}
		wantLast(t, ix, 11, -1)
		if got := entries(t, ix, 11, 0); len(got) != 0 {
			t.Fatalf("Entries(11) after delete: %v", got)
		}
		for _, l := range []int64{10, 12} {
			wantLast(t, ix, l, 499)
			if got := entries(t, ix, l, 0); len(got) != 500 {
				t.Fatalf("Entries(%d) = %d entries", l, len(got))
			}
			if st, err := ix.Ledger(l); err != nil || !bytes.Equal(st.MasterKey, []byte{byte(l)}) {
				t.Fatalf("Ledger(%d) = %+v, %v", l, st, err)
			}
		}
	}
	check(ix)
	// A ledger id can come back after a delete (the engine never reuses ids, but the index
	// does not forbid it).
	b.PutLocation(11, 3, loc(11, 3))
	commit(t, b, true)
	wantLast(t, ix, 11, 3)
	b.DeleteLedger(11)
	commit(t, b, true)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	check(openDir(t, dir))
}

func TestBadArguments(t *testing.T) {
	ix := openTest(t)
	for _, err := range []error{
		func() error { _, err := ix.Location(-1, 0); return err }(),
		func() error { _, err := ix.Location(0, -1); return err }(),
		func() error { _, _, err := ix.LastEntry(-2); return err }(),
		func() error { _, err := ix.Ledger(-3); return err }(),
		ix.Entries(-1, 0, func(int64, uint64) bool { return true }),
		ix.Entries(1, -1, func(int64, uint64) bool { return true }),
	} {
		if !errors.Is(err, ErrBadID) {
			t.Fatalf("got %v, want ErrBadID", err)
		}
	}
	b := ix.NewBatch()
	defer b.Close()
	for i, bad := range []func(){
		func() { b.PutLocation(-1, 0, 1) },
		func() { b.PutLocation(1, -1, 1) },
		func() { b.PutLedger(-1, LedgerState{}) },
		func() { b.DeleteLedger(-1) },
		func() { b.PutLedger(1, LedgerState{MasterKey: make([]byte, 1<<16)}) },
		func() { b.PutLedger(1, LedgerState{ExplicitLAC: make([]byte, MaxExplicitLACLen+1)}) },
	} {
		b.PutLocation(5, 5, 5) // a good write in the same batch is dropped with it
		bad()
		want := ErrBadID
		if i >= 4 {
			want = ErrTooLarge
		}
		if err := b.Commit(true); !errors.Is(err, want) {
			t.Fatalf("case %d: Commit = %v, want %v", i, err, want)
		}
		if _, err := ix.Location(5, 5); !errors.Is(err, ErrNotFound) {
			t.Fatalf("case %d: a batch with a bad argument was written: %v", i, err)
		}
	}
	// The batch is usable again.
	b.PutLocation(5, 5, 5)
	commit(t, b, true)
	if l, err := ix.Location(5, 5); err != nil || l != 5 {
		t.Fatalf("Location = %d, %v", l, err)
	}
}

func TestResetDiscards(t *testing.T) {
	ix := openTest(t)
	b := ix.NewBatch()
	defer b.Close()
	b.PutLocation(1, 1, 1)
	b.Reset()
	if b.Len() != 0 {
		t.Fatalf("Len after Reset = %d", b.Len())
	}
	commit(t, b, true) // empty and synced: must not fail
	if _, err := ix.Location(1, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Reset batch was written: %v", err)
	}
}

func TestClosed(t *testing.T) {
	ix := openTest(t)
	b := ix.NewBatch()
	defer b.Close()
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	b.PutLocation(1, 1, 1)
	for _, err := range []error{
		ix.Close(),
		b.Commit(true),
		func() error { _, err := ix.Location(1, 1); return err }(),
		func() error { _, _, err := ix.LastEntry(1); return err }(),
		func() error { _, err := ix.Ledger(1); return err }(),
		ix.Ledgers(func(int64, LedgerState) bool { return true }),
		ix.Entries(1, 0, func(int64, uint64) bool { return true }),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("got %v, want ErrClosed", err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		{Dir: "x", BlockCacheSize: -1},
		{Dir: "x", MaxRetainedBatchBytes: -1},
		{Dir: "x", BlockSize: 2 << 20},
		{Dir: "x", MemTableSize: 1 << 10},
		{Dir: "x", BloomBitsPerKey: 100},
	} {
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Fatalf("%+v: %v, want ErrBadConfig", c, err)
		}
	}
	c := Config{Dir: "x"}
	if err := c.Validate(); err != nil || c.BlockCacheSize != DefaultBlockCacheSize ||
		c.MemTableSize != DefaultMemTableSize || c.FS == nil || c.Logger == nil {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
}

// TestCorruptValues stores values that do not decode, behind the index's back, and checks
// that every reader reports ErrCorrupt.
func TestCorruptValues(t *testing.T) {
	ix := openTest(t)
	b := ix.NewBatch()
	defer b.Close()
	b.PutLocation(3, 1, loc(3, 1))
	b.PutLedger(3, LedgerState{Exists: true})
	commit(t, b, true)

	// Run values that do not decode, under a key of ledger 3 after its run ending at entry 1.
	var k [runKeyLen]byte
	putIDKey(k[:], prefixRun, 3, 9)
	for i, v := range [][]byte{
		nil,
		{0, 0, 0},                          // no entries
		{1, 10, 5},                         // span past the key's entry: first entry negative
		{3, 1, 5, 1, 2, 1, 2},              // 3 entries in a span of 1
		{2, 2, 5, 1, 2},                    // entries end before the key's entry
		{2, 1, 5, 1},                       // truncated
		{1, 0, 5, 0},                       // trailing byte
		{2, 1, 5, 0, 2},                    // entry delta 0
		appendRun(nil, []pair{{9, 1}})[:1], // truncated location
	} {
		if err := ix.db.Set(k[:], v, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if _, err := ix.Location(3, 9); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("case %d: Location in run %x: %v", i, v, err)
		}
		if _, _, err := ix.LastEntry(3); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("case %d: LastEntry onto run %x: %v", i, v, err)
		}
		if err := ix.Entries(3, 0, func(int64, uint64) bool { return true }); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("case %d: Entries over run %x: %v", i, v, err)
		}
		if err := ix.db.Delete(k[:], pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	// A key of the wrong length inside a ledger's range.
	if err := ix.db.Set(append(k[:], 0), appendRun(nil, []pair{{9, 1}}), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ix.LastEntry(3); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("LastEntry onto an 18-byte key: %v", err)
	}

	good, _ := appendLedgerState(nil, &LedgerState{Exists: true, MasterKey: []byte("key"), ExplicitLAC: []byte("lac")})
	for i, v := range [][]byte{
		nil,
		{2, 0, 0, 0},                      // unknown version
		{1, 0x80, 0, 0},                   // unknown flag
		{1, 0, 0, 5, 'a'},                 // truncated master key
		{1, flagHasLAC, 0, 0, 0, 0},       // truncated LAC length
		{1, flagHasLAC, 0, 0, 0, 0, 0, 9}, // truncated LAC
		{1, flagHasLAC, 0, 0, 0xff, 0xff, 0xff, 0xff}, // absurd LAC length
		append(good, 0), // trailing byte
	} {
		var lk [ledgerKeyLen]byte
		putLedgerKey(lk[:], 4)
		if err := ix.db.Set(lk[:], v, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if st, err := ix.Ledger(4); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("case %d: Ledger(%x) = %+v, %v", i, v, st, err)
		}
		if err := ix.Ledgers(func(int64, LedgerState) bool { return true }); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("case %d: Ledgers over %x: %v", i, v, err)
		}
	}
}

func TestOpenFormatChecks(t *testing.T) {
	rawOpen := func(dir string) *pebble.DB {
		db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebble.FormatNewest, Logger: pebbleLogger{slog.Default()}})
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	for _, tc := range []struct {
		name  string
		value []byte // nil: no format record, but another key
		want  error
	}{
		{"newer", []byte("RKIX\x00\x00\x00\x04"), ErrVersion},
		// A format-3 store always has a checkpoint record: without one it lost writes.
		{"no checkpoint record", []byte("RKIX\x00\x00\x00\x03"), ErrCorrupt},
		{"magic", []byte("RKIY\x00\x00\x00\x01"), ErrCorrupt},
		{"short", []byte("RKIX"), ErrCorrupt},
		{"missing", nil, ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ix")
			db := rawOpen(dir)
			key, value := formatKey, tc.value
			if value == nil {
				key, value = []byte{prefixLedger, 0, 0, 0, 0, 0, 0, 0, 1}, []byte{1}
			}
			if err := db.Set(key, value, pebble.Sync); err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			if ix, err := Open(DefaultConfig(dir)); !errors.Is(err, tc.want) {
				if err == nil {
					ix.Close()
				}
				t.Fatalf("Open = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestPutLocationAllocs(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instruments allocations")
	}
	ix := openTest(t)
	b := ix.NewBatch()
	defer b.Close()
	fill := func() {
		for e := range int64(10000) {
			b.PutLocation(e/3, e, uint64(e))
		}
	}
	fill() // grow the buffer once
	commit(t, b, false)
	allocs := testing.AllocsPerRun(5, func() {
		fill()
		b.Reset()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per 10000 PutLocation calls on a reused batch", allocs)
	}
}

func FuzzDecodeLedgerState(f *testing.F) {
	for _, st := range testStates[:5] {
		v, _ := appendLedgerState(nil, &st)
		f.Add(v)
	}
	f.Add([]byte{1, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, v []byte) {
		st, err := decodeLedgerState(v)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := appendLedgerState(nil, &st)
		if err != nil || !bytes.Equal(again, v) {
			t.Fatalf("re-encoding %x gave %x, %v", v, again, err)
		}
	})
}

// TestWarmFillsTheBlockCache: after a reopen, Warm reads an index that fits in half the cache,
// so that look-ups then miss the cache no more; an index larger than half the cache is left
// cold.
func TestWarmFillsTheBlockCache(t *testing.T) {
	dir := t.TempDir()
	ix := openDir(t, dir)
	const ledgers, perLedger = 20, 2000
	b := ix.NewBatch()
	for l := range int64(ledgers) {
		for e := range int64(perLedger) {
			b.PutLocation(l, e, loc(l, e))
		}
	}
	commit(t, b, true)
	if err := ix.db.Flush(); err != nil { // into sstables, so the reopened index reads them
		t.Fatal(err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	misses := func(ix *Index) int64 { return ix.db.Metrics().BlockCache.Misses }
	lookUpAll := func(ix *Index) {
		for l := range int64(ledgers) {
			for e := int64(0); e < perLedger; e += 97 {
				if got, err := ix.Location(l, e); err != nil || got != loc(l, e) {
					t.Fatalf("Location(%d, %d) = %#x, %v", l, e, got, err)
				}
			}
		}
	}

	// quiesce waits for the work pebble starts by itself after Open (table stats, which read
	// blocks, and compactions), so that only the look-ups count in the misses measured.
	quiesce := func(ix *Index) {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			m := ix.db.Metrics()
			if m.Table.InitialStatsCollectionComplete && m.Table.PendingStatsCollectionCount == 0 && m.Compact.NumInProgress == 0 {
				return
			}
		}
		t.Fatal("pebble's background work did not settle")
	}

	ix = openDir(t, dir) // 8 MiB cache: the index (under 1 MiB) fits in half
	n, err := ix.Warm(context.Background())
	if err != nil || n <= 0 {
		t.Fatalf("Warm = %d, %v; want the index's size", n, err)
	}
	quiesce(ix)
	before := misses(ix)
	lookUpAll(ix)
	if m := misses(ix) - before; m != 0 {
		t.Fatalf("%d block cache misses after warming", m)
	}
	ix.Close()

	cfg := DefaultConfig(dir)
	cfg.BlockCacheSize = 2 * (n - 1) // the index is more than half of it
	small, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if n, err := small.Warm(context.Background()); err != nil || n != 0 {
		t.Fatalf("Warm with a small cache = %d, %v; want 0, nil", n, err)
	}
	before = misses(small)
	lookUpAll(small)
	if misses(small) == before {
		t.Fatal("a cold index served every look-up from the cache")
	}
}

// TestDamagedRunIsNotAMiss: a look-up that stops at the first pair past its entry used to take
// a run whose span was damaged for one that lacks the entry (ErrNotFound). A miss now decodes
// the whole run, whose end check catches the damage.
func TestDamagedRunIsNotAMiss(t *testing.T) {
	ix := openTest(t)
	var ps []pair
	for e := int64(0); e <= 63; e += 3 { // a striped ledger: 0, 3, ..., 63 in one run
		ps = append(ps, pair{e, loc(5, e)})
	}
	v := appendRun(nil, ps)
	v[1] = 60 // damage the span: the run now starts at 3 and does not end at 63
	var k [runKeyLen]byte
	putIDKey(k[:], prefixRun, 5, 63)
	if err := ix.db.Set(k[:], v, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.Location(5, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Location(5, 0) in the damaged run: %v, want ErrCorrupt", err)
	}
	// An entry a striped run does not hold is still a clean miss.
	good := appendRun(nil, ps)
	if err := ix.db.Set(k[:], good, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if _, err := ix.Location(5, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Location(5, 1), not in the run: %v, want ErrNotFound", err)
	}
}

// TestCheckpointRecord: a new store's checkpoint record is empty; a committed one is read back,
// after a reopen too; one over MaxCheckpointLen fails the commit, which then writes nothing.
func TestCheckpointRecord(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ix")
	ix, err := Open(DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ix.Checkpoint(); err != nil || len(v) != 0 {
		t.Fatalf("new store: Checkpoint = %x, %v; want empty", v, err)
	}
	b := ix.NewBatch()
	b.PutLocation(1, 0, 42)
	b.PutCheckpoint([]byte("marks-1"))
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	b.PutLocation(1, 1, 43)
	b.PutCheckpoint(make([]byte, MaxCheckpointLen+1))
	if err := b.Commit(true); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized checkpoint record: Commit = %v, want ErrTooLarge", err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	if ix, err = Open(DefaultConfig(dir)); err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if v, err := ix.Checkpoint(); err != nil || string(v) != "marks-1" {
		t.Fatalf("reopened: Checkpoint = %q, %v; want marks-1", v, err)
	}
	if _, err := ix.Location(1, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the refused commit's location: %v, want ErrNotFound", err)
	}
}

// TestFormat2GainsACheckpointRecord: a format-2 store (runs, no checkpoint record) opens, keeps
// its runs, and is format 3 with an empty checkpoint record from then on.
func TestFormat2GainsACheckpointRecord(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ix")
	ix, err := Open(DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	b := ix.NewBatch()
	b.PutLocation(7, 3, 99)
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	makeFormat2(t, ix)
	ix.Close()
	if ix, err = Open(DefaultConfig(dir)); err != nil {
		t.Fatalf("format 2: %v", err)
	}
	defer ix.Close()
	if v, err := ix.Checkpoint(); err != nil || len(v) != 0 {
		t.Fatalf("upgraded: Checkpoint = %x, %v; want empty", v, err)
	}
	if loc, err := ix.Location(7, 3); err != nil || loc != 99 {
		t.Fatalf("upgraded: Location = %d, %v", loc, err)
	}
	v, closer, err := ix.db.Get(formatKey)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if string(v) != "RKIX\x00\x00\x00\x03" {
		t.Fatalf("upgraded format record %q", v)
	}
}

// TestDamagedRunIsNeverAWrongLocation: a look-up that stopped at the first pair matching its
// entry, before the run's end check, took a run whose span was damaged (every entry shifted by
// one stride) for one that holds the entry, and returned the location of its neighbour (entry
// 0's for entry 3). A hit decodes the whole run too now, so the damage is ErrCorrupt.
func TestDamagedRunIsNeverAWrongLocation(t *testing.T) {
	ix := openTest(t)
	var ps []pair
	for e := int64(0); e <= 63; e += 3 { // a striped ledger: 0, 3, ..., 63 in one run
		ps = append(ps, pair{e, loc(5, e)})
	}
	v := appendRun(nil, ps)
	v[1] = 60 // damage the span: the run now reads as 3, 6, ..., 66, past its key's 63
	var k [runKeyLen]byte
	putIDKey(k[:], prefixRun, 5, 63)
	if err := ix.db.Set(k[:], v, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	for _, e := range []int64{3, 6, 30, 60} {
		if l, err := ix.Location(5, e); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Location(5, %d) in the damaged run = %#x, %v; want ErrCorrupt (%#x is entry %d's)",
				e, l, err, loc(5, e-3), e-3)
		}
	}
}

// TestUpgradedEndsWithTheFirstCheckpoint: Upgraded reports a converted store only until a
// checkpoint record is committed, in the process that commits it as well as after a reopen;
// a commit that fails, or one without a checkpoint record, leaves it set.
func TestUpgradedEndsWithTheFirstCheckpoint(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ix")
	ix, err := Open(DefaultConfig(dir))
	if err != nil {
		t.Fatal(err)
	}
	if ix.Upgraded() {
		t.Fatal("a new store is Upgraded")
	}
	makeFormat2(t, ix)
	ix.Close()
	if ix, err = Open(DefaultConfig(dir)); err != nil {
		t.Fatal(err)
	}
	if !ix.Upgraded() {
		t.Fatal("a converted format-2 store is not Upgraded")
	}
	b := ix.NewBatch()
	b.PutLocation(1, 0, 42)
	if err := b.Commit(true); err != nil || !ix.Upgraded() {
		t.Fatalf("a commit without a checkpoint record: %v, Upgraded = %v; want true", err, ix.Upgraded())
	}
	b.PutCheckpoint([]byte("marks-1"))
	b.PutLocation(-1, 0, 1)
	if err := b.Commit(true); !errors.Is(err, ErrBadID) || !ix.Upgraded() {
		t.Fatalf("a refused commit of a checkpoint record: %v, Upgraded = %v; want ErrBadID, true", err, ix.Upgraded())
	}
	b.PutCheckpoint([]byte("marks-1"))
	if err := b.Commit(true); err != nil {
		t.Fatal(err)
	}
	if ix.Upgraded() {
		t.Fatal("Upgraded after a checkpoint record was committed")
	}
	b.Close()
	ix.Close()
	if ix, err = Open(DefaultConfig(dir)); err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if ix.Upgraded() {
		t.Fatal("reopened: Upgraded after a checkpoint record was committed")
	}
}

// makeFormat2 makes ix's store a format-2 one, as an older build left it: that format's
// version record and no checkpoint record.
func makeFormat2(t *testing.T, ix *Index) {
	t.Helper()
	if err := ix.db.Set(formatKey, []byte("RKIX\x00\x00\x00\x02"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := ix.db.Delete(checkpointKey, pebble.Sync); err != nil {
		t.Fatal(err)
	}
}
