package index

import (
	"bytes"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

func fencedDeleted(t *testing.T, ix *Index) map[int64]time.Time {
	t.Helper()
	got := map[int64]time.Time{}
	if err := ix.FencedDeleted(func(id int64, at time.Time) bool { got[id] = at; return true }); err != nil {
		t.Fatal(err)
	}
	return got
}

func wantFencedDeleted(t *testing.T, ix *Index, want map[int64]time.Time) {
	t.Helper()
	if got := fencedDeleted(t, ix); !maps.EqualFunc(got, want, time.Time.Equal) {
		t.Fatalf("tombstones %v, want %v", got, want)
	}
}

// TestDeleteFencedLedger: DeleteFencedLedger deletes the ledger (state and runs) and writes its
// tombstone in the same batch; the tombstone keeps its date across a reopen until
// DropFencedDeleted removes it; and a batch that fails writes neither half.
func TestDeleteFencedLedger(t *testing.T) {
	dir := t.TempDir()
	ix := openDir(t, dir)
	b := ix.NewBatch()
	defer b.Close()
	for l := int64(1); l <= 3; l++ {
		b.PutLedger(l, LedgerState{Exists: true, Fenced: true, MasterKey: []byte{byte(l)}})
		for e := range int64(100) {
			b.PutLocation(l, e, loc(l, e))
		}
	}
	commit(t, b, true)
	at1 := time.Date(2026, 2, 3, 4, 5, 6, 7, time.UTC)
	b.DeleteFencedLedger(1, at1)
	if b.Len() != 3 {
		t.Fatalf("DeleteFencedLedger Len = %d, want 3", b.Len())
	}
	commit(t, b, true)
	gone := func(ix *Index, l int64) {
		t.Helper()
		if _, err := ix.Ledger(l); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Ledger(%d) after its deletion: %v", l, err)
		}
		wantLast(t, ix, l, -1)
	}
	gone(ix, 1)
	wantLast(t, ix, 2, 99)
	wantFencedDeleted(t, ix, map[int64]time.Time{1: at1})

	// A batch with a bad argument writes nothing: neither the deletion nor the tombstone.
	b.DeleteFencedLedger(2, at1)
	b.DeleteFencedLedger(-1, at1)
	if err := b.Commit(true); !errors.Is(err, ErrBadID) {
		t.Fatalf("Commit = %v, want ErrBadID", err)
	}
	wantLast(t, ix, 2, 99)
	wantFencedDeleted(t, ix, map[int64]time.Time{1: at1})
	// An uncommitted batch is not visible either.
	b.DeleteFencedLedger(2, at1)
	wantLast(t, ix, 2, 99)
	wantFencedDeleted(t, ix, map[int64]time.Time{1: at1})
	b.Reset()

	// A later deletion of the same id dates the tombstone anew; the clock before 1970 too.
	at2, at3 := at1.Add(time.Hour), time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)
	b.PutLocation(1, 0, loc(1, 0))
	commit(t, b, true)
	b.DeleteFencedLedger(1, at2)
	b.DeleteFencedLedger(3, at3)
	commit(t, b, true)
	gone(ix, 1)
	gone(ix, 3)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openDir(t, dir)
	wantFencedDeleted(t, ix, map[int64]time.Time{1: at2, 3: at3})
	gone(ix, 1)
	wantLast(t, ix, 2, 99)

	b = ix.NewBatch()
	defer b.Close()
	b.DropFencedDeleted(3)
	b.DropFencedDeleted(5) // none: nothing happens
	b.DropFencedDeleted(-5)
	if err := b.Commit(true); !errors.Is(err, ErrBadID) {
		t.Fatalf("DropFencedDeleted(-5): Commit = %v, want ErrBadID", err)
	}
	b.DropFencedDeleted(3)
	b.DropFencedDeleted(5)
	commit(t, b, true)
	wantFencedDeleted(t, ix, map[int64]time.Time{1: at2})
	// Iteration stops when fn says so.
	b.DeleteFencedLedger(2, at1)
	commit(t, b, true)
	n := 0
	if err := ix.FencedDeleted(func(int64, time.Time) bool { n++; return false }); err != nil || n != 1 {
		t.Fatalf("FencedDeleted stopping at once: %d calls, %v", n, err)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ix.FencedDeleted(func(int64, time.Time) bool { return true }); !errors.Is(err, ErrClosed) {
		t.Fatalf("FencedDeleted on a closed index: %v", err)
	}
}

// TestFencedDeletedKeepsFormat3: keyspace 04 came without a format bump (doc.go). A store with
// tombstones still says format 3, so a build that predates keyspace 04 opens it; and what such
// a build reads (ledger states, runs, the checkpoint record) is the same with tombstones as
// without: no reader of another keyspace sees them.
func TestFencedDeletedKeepsFormat3(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ix")
	ix := openDir(t, dir)
	b := ix.NewBatch()
	defer b.Close()
	for l := int64(1); l <= 4; l++ {
		b.PutLedger(l, LedgerState{Exists: true, MasterKey: []byte{byte(l)}})
		b.PutLocation(l, 0, loc(l, 0))
	}
	b.PutCheckpoint([]byte("marks"))
	commit(t, b, true)
	// Tombstones of ledgers below, between and above the ones kept, and one beside a state.
	for _, l := range []int64{0, 2, 3, 9} {
		b.DeleteFencedLedger(l, time.Unix(0, l))
	}
	b.PutLedger(3, LedgerState{Exists: true, MasterKey: []byte{3}})
	b.PutLocation(3, 0, loc(3, 0))
	commit(t, b, true)
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	ix = openDir(t, dir)
	v, closer, err := ix.db.Get(formatKey)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(v, []byte("RKIX\x00\x00\x00\x03")) {
		t.Fatalf("format record %q, want format 3", v)
	}
	closer.Close()
	var ids []int64
	if err := ix.Ledgers(func(id int64, _ LedgerState) bool { ids = append(ids, id); return true }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []int64{1, 3, 4}) {
		t.Fatalf("Ledgers = %v, want [1 3 4]", ids)
	}
	for _, l := range []int64{1, 3, 4} {
		wantLast(t, ix, l, 0)
	}
	wantLast(t, ix, 2, -1)
	if c, err := ix.Checkpoint(); err != nil || string(c) != "marks" {
		t.Fatalf("Checkpoint = %q, %v", c, err)
	}
	wantFencedDeleted(t, ix, map[int64]time.Time{0: time.Unix(0, 0), 2: time.Unix(0, 2), 3: time.Unix(0, 3), 9: time.Unix(0, 9)})
}

// TestFencedDeletedOldFormats: stores of the formats before keyspace 04 (format 1 and 2, and
// format 3 as written before it) open and hold no tombstones; tombstones written after the
// upgrade persist.
func TestFencedDeletedOldFormats(t *testing.T) {
	for _, format := range []string{"RKIX\x00\x00\x00\x01", "RKIX\x00\x00\x00\x02", "RKIX\x00\x00\x00\x03"} {
		dir := filepath.Join(t.TempDir(), "ix")
		db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebble.FormatNewest})
		if err != nil {
			t.Fatal(err)
		}
		pb := db.NewBatch()
		_ = pb.Set(formatKey, []byte(format), nil)
		var lk [ledgerKeyLen]byte
		putLedgerKey(lk[:], 8)
		st, _ := appendLedgerState(nil, &LedgerState{Exists: true, Fenced: true, MasterKey: []byte("k")})
		_ = pb.Set(lk[:], st, nil)
		if format[7] == 3 {
			_ = pb.Set(checkpointKey, nil, nil)
		}
		if err := pb.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		ix := openDir(t, dir)
		if st, err := ix.Ledger(8); err != nil || !st.Fenced {
			t.Fatalf("format %d: Ledger(8) = %+v, %v", format[7], st, err)
		}
		wantFencedDeleted(t, ix, map[int64]time.Time{})
		at := time.Unix(1700000000, 0)
		b := ix.NewBatch()
		b.DeleteFencedLedger(8, at)
		commit(t, b, true)
		b.Close()
		if err := ix.Close(); err != nil {
			t.Fatal(err)
		}
		ix = openDir(t, dir)
		wantFencedDeleted(t, ix, map[int64]time.Time{8: at})
		if _, err := ix.Ledger(8); !errors.Is(err, ErrNotFound) {
			t.Fatalf("format %d: Ledger(8) after its deletion: %v", format[7], err)
		}
	}
}

// TestCorruptFencedDeleted: tombstone keys and values that do not decode are ErrCorrupt.
func TestCorruptFencedDeleted(t *testing.T) {
	good := appendFencedDeleted(nil, time.Unix(5, 0))
	var k [ledgerKeyLen]byte
	putFencedDeletedKey(k[:], 4)
	for i, kv := range [][2][]byte{
		{k[:], nil},
		{k[:], good[:len(good)-1]},             // truncated
		{k[:], append(bytes.Clone(good), 0)},   // trailing byte
		{k[:], append([]byte{2}, good[1:]...)}, // unknown version
		{append(k[:], 0), good},                // key too long
		{[]byte{prefixFencedDeleted, 0x80, 0, 0, 0, 0, 0, 0, 0}, good}, // negative id
	} {
		ix := openTest(t)
		if err := ix.db.Set(kv[0], kv[1], pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := ix.FencedDeleted(func(int64, time.Time) bool { return true }); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("case %d: FencedDeleted over %x → %x: %v, want ErrCorrupt", i, kv[0], kv[1], err)
		}
		ix.Close()
	}
}

func FuzzDecodeFencedDeleted(f *testing.F) {
	f.Add(appendFencedDeleted(nil, time.Unix(1700000000, 123)))
	f.Add(appendFencedDeleted(nil, time.Unix(0, -1)))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, v []byte) {
		at, err := decodeFencedDeleted(v)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if again := appendFencedDeleted(nil, at); !bytes.Equal(again, v) {
			t.Fatalf("re-encoding %x gave %x", v, again)
		}
	})
}
