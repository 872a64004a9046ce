package index

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestRunsMatchAModel drives batches of random locations (in order and out of order, striped
// like a bookie of a wider ensemble, overwrites of stored entries as compaction and journal
// replay make them, duplicates within a batch, deletions before and after puts in the same
// batch) against a map, and checks every look-up against it after each commit and after a
// reopen.
func TestRunsMatchAModel(t *testing.T) {
	dir := t.TempDir()
	ix := openDir(t, dir)
	rng := rand.New(rand.NewPCG(11, 12))
	const ledgers, maxEntry = 5, 1500
	model := map[[2]int64]uint64{}
	b := ix.NewBatch()
	defer b.Close()
	next := uint64(1)
	for round := range 120 {
		pending := maps.Clone(model)
		for range 1 + rng.IntN(4) {
			l := rng.Int64N(ledgers)
			switch op := rng.IntN(10); {
			case op == 0:
				b.DeleteLedger(l)
				for k := range pending {
					if k[0] == l {
						delete(pending, k)
					}
				}
			default:
				// A stretch of entries: consecutive, or every third, or scattered; in
				// order or shuffled.
				first, n := rng.Int64N(maxEntry), 1+rng.Int64N(600)
				step := []int64{1, 1, 3, 1 + rng.Int64N(40)}[rng.IntN(4)]
				var es []int64
				for e := first; e < first+n*step && e < maxEntry; e += step {
					es = append(es, e)
				}
				if rng.IntN(3) == 0 {
					rng.Shuffle(len(es), func(i, j int) { es[i], es[j] = es[j], es[i] })
				}
				for _, e := range es {
					next += uint64(1 + rng.IntN(2000))
					b.PutLocation(l, e, next)
					pending[[2]int64{l, e}] = next
				}
			}
		}
		commit(t, b, round%10 == 0)
		model = pending
		checkModel(t, ix, model, ledgers, maxEntry)
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	checkModel(t, openDir(t, dir), model, ledgers, maxEntry)
}

func checkModel(t *testing.T, ix *Index, model map[[2]int64]uint64, ledgers, maxEntry int64) {
	t.Helper()
	for l := range ledgers {
		var want []int64
		for e := range maxEntry + 1 {
			got, err := ix.Location(l, e)
			if w, ok := model[[2]int64{l, e}]; ok {
				want = append(want, e)
				if err != nil || got != w {
					t.Fatalf("Location(%d, %d) = %#x, %v; want %#x", l, e, got, err, w)
				}
			} else if !errors.Is(err, ErrNotFound) {
				t.Fatalf("Location(%d, %d) = %#x, %v; want ErrNotFound", l, e, got, err)
			}
		}
		e, lc, err := ix.LastEntry(l)
		if len(want) == 0 {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("LastEntry(%d) = %d, %#x, %v; want ErrNotFound", l, e, lc, err)
			}
		} else if w := want[len(want)-1]; err != nil || e != w || lc != model[[2]int64{l, w}] {
			t.Fatalf("LastEntry(%d) = %d, %#x, %v; want %d, %#x", l, e, lc, err, w, model[[2]int64{l, w}])
		}
		from := maxEntry / 3
		var tail []int64
		for _, e := range want {
			if e >= from {
				tail = append(tail, e)
			}
		}
		var got []int64
		bad := ""
		err = ix.Entries(l, from, func(e int64, lc uint64) bool {
			if lc != model[[2]int64{l, e}] && bad == "" {
				bad = fmt.Sprintf("entry %d at %#x, want %#x", e, lc, model[[2]int64{l, e}])
			}
			got = append(got, e)
			return true
		})
		if err != nil || bad != "" || !slices.Equal(got, tail) {
			t.Fatalf("Entries(%d, from %d) = %v, %v, %s; want %v", l, from, got, err, bad, tail)
		}
	}
	// Runs never overlap and hold at most maxRunEntries.
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRun}, UpperBound: []byte{prefixRun + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	prevLedger, prevLast := int64(-1), int64(-1)
	for ok := it.First(); ok; ok = it.Next() {
		l, last, err := decodeIDKey(it.Key(), prefixRun)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := decodeRun(nil, it.Value(), l, last)
		if err != nil {
			t.Fatal(err)
		}
		if l == prevLedger && ps[0].entry <= prevLast {
			t.Fatalf("ledger %d: a run starting at %d overlaps one ending at %d", l, ps[0].entry, prevLast)
		}
		if len(ps) > maxRunEntries {
			t.Fatalf("ledger %d: a run of %d entries", l, len(ps))
		}
		prevLedger, prevLast = l, last
	}
}

// TestRunsPerFlush checks the point of runs: a flush's consecutive entries of a ledger take
// one key per maxRunEntries entries.
func TestRunsPerFlush(t *testing.T) {
	ix := openTest(t)
	b := ix.NewBatch()
	defer b.Close()
	const n = 10 * maxRunEntries
	for l := range int64(3) {
		for e := range int64(n) {
			b.PutLocation(l, e, uint64(l)<<32|uint64(4096+e*1056))
		}
	}
	commit(t, b, true)
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRun}, UpperBound: []byte{prefixRun + 1}})
	if err != nil {
		t.Fatal(err)
	}
	keys, bytes := 0, 0
	for ok := it.First(); ok; ok = it.Next() {
		keys++
		bytes += len(it.Value())
	}
	it.Close()
	if keys != 3*n/maxRunEntries {
		t.Fatalf("%d keys for 3 ledgers × %d entries, want %d", keys, n, 3*n/maxRunEntries)
	}
	if per := float64(bytes) / (3 * n); per > 3.1 {
		t.Fatalf("%.2f value bytes per entry, want about 3", per)
	}
}

// TestConvertsFormat1 opens a store written in format 1 (one key per location) and checks
// that it is converted: every location and ledger state is there, the old keys are gone and
// the format record says 2.
func TestConvertsFormat1(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ix")
	db, err := pebble.Open(dir, &pebble.Options{FormatMajorVersion: pebble.FormatNewest})
	if err != nil {
		t.Fatal(err)
	}
	pb := db.NewBatch()
	rec := binary.BigEndian.AppendUint32([]byte(formatMagic), formatVersionLocations)
	_ = pb.Set(formatKey, rec, nil)
	model := map[[2]int64]uint64{}
	for l := range int64(4) {
		for e := int64(0); e < 700; e += 1 + l {
			var k [runKeyLen]byte
			putIDKey(k[:], prefixLocation, l, e)
			model[[2]int64{l, e}] = loc(l, e)
			_ = pb.Set(k[:], binary.BigEndian.AppendUint64(nil, loc(l, e)), nil)
		}
		var k [ledgerKeyLen]byte
		putLedgerKey(k[:], l)
		v, _ := appendLedgerState(nil, &LedgerState{Exists: true, Fenced: l == 2})
		_ = pb.Set(k[:], v, nil)
	}
	if err := pb.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	ix := openDir(t, dir)
	checkModel(t, ix, model, 4, 700)
	if st, err := ix.Ledger(2); err != nil || !st.Fenced {
		t.Fatalf("Ledger(2) = %+v, %v", st, err)
	}
	it, err := ix.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLocation}, UpperBound: []byte{prefixLocation + 1}})
	if err != nil {
		t.Fatal(err)
	}
	if it.First() {
		t.Fatalf("format-1 key %x left after the conversion", it.Key())
	}
	it.Close()
	v, closer, err := ix.db.Get(formatKey)
	if err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint32(v[len(formatMagic):]); got != formatVersion {
		t.Fatalf("format record says %d after the conversion", got)
	}
	closer.Close()
}

func FuzzDecodeRun(f *testing.F) {
	f.Add(appendRun(nil, []pair{{3, 4096}, {4, 5152}, {9, 1 << 40}}), int64(9))
	f.Add([]byte{1, 0, 0}, int64(0))
	f.Fuzz(func(t *testing.T, v []byte, last int64) {
		if last < 0 {
			return
		}
		ps, err := decodeRun(nil, v, 1, last)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if len(ps) == 0 || len(ps) > maxRunEntries || ps[len(ps)-1].entry != last || ps[0].entry < 0 {
			t.Fatalf("decoded %v from %x (last %d)", ps, v, last)
		}
		for i := 1; i < len(ps); i++ {
			if ps[i].entry <= ps[i-1].entry {
				t.Fatalf("entries not increasing: %v", ps)
			}
		}
		again, err := decodeRun(nil, appendRun(nil, ps), 1, last)
		if err != nil || !slices.Equal(again, ps) {
			t.Fatalf("re-encoding %v decodes to %v, %v", ps, again, err)
		}
	})
}
