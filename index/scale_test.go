package index

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// writeLedgers writes ledgers [0, n) with entriesPer locations each (and a state), in
// batches of about batchOps operations.
func writeLedgers(tb testing.TB, ix *Index, n, entriesPer int64, batchOps int) {
	tb.Helper()
	b := ix.NewBatch()
	defer b.Close()
	for l := range n {
		b.PutLedger(l, LedgerState{Exists: true, MasterKey: []byte("0123456789abcdefghij")})
		for e := range entriesPer {
			b.PutLocation(l, e, loc(l, e))
		}
		if b.Len() >= batchOps {
			commit(tb, b, true)
		}
	}
	commit(tb, b, true)
}

// deleteLedgers deletes every ledger in [0, n) for which doomed is true.
func deleteLedgers(tb testing.TB, ix *Index, n int64, doomed func(int64) bool) {
	tb.Helper()
	b := ix.NewBatch()
	defer b.Close()
	for l := range n {
		if doomed(l) {
			b.DeleteLedger(l)
		}
		if b.Len() >= 100_000 {
			commit(tb, b, true)
		}
	}
	commit(tb, b, true)
}

// TestManyLedgers writes 100k ledgers × 3 entries, checks them, deletes 90% of them and
// checks survivors and deleted ledgers alike.
func TestManyLedgers(t *testing.T) {
	const per = 3
	n := int64(100_000)
	if raceEnabled {
		n = 20_000 // the race detector makes pebble ~10x slower
	}
	ix := openTest(t)
	writeLedgers(t, ix, n, per, 100_000)

	count := int64(0)
	if err := ix.Ledgers(func(id int64, st LedgerState) bool {
		if id != count || !st.Exists {
			t.Fatalf("Ledgers: #%d is %d %+v", count, id, st)
		}
		count++
		return true
	}); err != nil || count != n {
		t.Fatalf("Ledgers: %d ledgers, %v", count, err)
	}
	step := int64(7)
	if testing.Short() {
		step = 97
	}
	for l := int64(0); l < n; l += step {
		wantLast(t, ix, l, per-1)
		if got, err := ix.Location(l, 1); err != nil || got != loc(l, 1) {
			t.Fatalf("Location(%d, 1) = %#x, %v", l, got, err)
		}
	}

	survives := func(l int64) bool { return l%10 == 3 }
	deleteLedgers(t, ix, n, func(l int64) bool { return !survives(l) })
	if err := ix.db.Flush(); err != nil {
		t.Fatal(err)
	}
	for l := int64(0); l < n; l += step / 7 * 3 {
		if survives(l) {
			wantLast(t, ix, l, per-1)
		} else {
			wantLast(t, ix, l, -1)
			if _, err := ix.Location(l, 0); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Location(%d, 0) after delete: %v", l, err)
			}
		}
	}
	count = 0
	if err := ix.Ledgers(func(id int64, _ LedgerState) bool {
		if !survives(id) {
			t.Fatalf("deleted ledger %d listed", id)
		}
		count++
		return true
	}); err != nil || count != n/10 {
		t.Fatalf("Ledgers after delete: %d, %v", count, err)
	}
}

// TestConcurrentReadersAndWriter runs readers against committed ledgers while one writer
// commits batches (some deleting older ledgers) into a small memtable, so that pebble
// flushes and compacts underneath the readers.
func TestConcurrentReadersAndWriter(t *testing.T) {
	cfg := DefaultConfig(t.TempDir())
	cfg.MemTableSize = 1 << 20
	cfg.BlockCacheSize = 1 << 20
	ix, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()

	batches := int64(400)
	if testing.Short() || raceEnabled {
		batches = 100
	}
	// Ledger l has entries [0, per(l)); ledgers with l%10 == 5 are deleted by batch l+10.
	per := func(l int64) int64 { return 1 + l%50*20 }
	deletable := func(l int64) bool { return l%10 == 5 }
	var published atomic.Int64 // ledgers [0, published) are committed
	var done atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
		done.Store(true)
	}

	wg.Go(func() {
		defer done.Store(true)
		b := ix.NewBatch()
		defer b.Close()
		for l := range batches {
			b.PutLedger(l, LedgerState{Exists: true, MasterKey: []byte{byte(l)}})
			for e := range per(l) {
				b.PutLocation(l, e, loc(l, e))
			}
			if deletable(l - 10) {
				b.DeleteLedger(l - 10)
			}
			if err := b.Commit(l%2 == 0); err != nil {
				fail(err)
				return
			}
			published.Store(l + 1)
		}
	})
	for r := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			for !done.Load() {
				p := published.Load()
				if p == 0 {
					continue
				}
				l := rng.Int64N(p)
				e := rng.Int64N(per(l))
				got, err := ix.Location(l, e)
				last, lastLoc, lerr := ix.LastEntry(l)
				if deletable(l) {
					// Deleted or not, depending on the race: never another error or value.
					if err == nil && got != loc(l, e) || err != nil && !errors.Is(err, ErrNotFound) ||
						lerr == nil && (last != per(l)-1 || lastLoc != loc(l, last)) ||
						lerr != nil && !errors.Is(lerr, ErrNotFound) {
						fail(errors.Join(err, lerr, errors.New("bad read of a deletable ledger")))
						return
					}
					continue
				}
				if err != nil || got != loc(l, e) {
					fail(errors.Join(err, errors.New("Location returned a wrong value")))
					return
				}
				if lerr != nil || last != per(l)-1 || lastLoc != loc(l, last) {
					fail(errors.Join(lerr, errors.New("LastEntry returned a wrong value")))
					return
				}
			}
		})
	}
	wg.Go(func() {
		for !done.Load() {
			prev := int64(-1)
			err := ix.Ledgers(func(id int64, st LedgerState) bool {
				if id <= prev || !st.Exists {
					fail(errors.New("Ledgers out of order"))
					return false
				}
				prev = id
				return true
			})
			if err != nil {
				fail(err)
				return
			}
		}
	})
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if got := published.Load(); got != batches {
		t.Fatalf("writer stopped at %d of %d", got, batches)
	}
}

// TestCloseWhileReading closes the index under concurrent readers: they see ErrClosed,
// never a panic from a closed pebble.
func TestCloseWhileReading(t *testing.T) {
	ix := openTest(t)
	writeLedgers(t, ix, 100, 10, 1000)
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			for i := int64(0); ; i++ {
				_, err := ix.Location((i+int64(r))%100, i%10)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if _, _, err := ix.LastEntry(i % 100); err != nil && !errors.Is(err, ErrClosed) {
					t.Error(err)
					return
				}
			}
		})
	}
	if err := ix.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
