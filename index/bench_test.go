package index

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// openBench opens an index with the default config in a fresh directory.
func openBench(b *testing.B) *Index {
	b.Helper()
	ix, err := Open(DefaultConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ix.Close() })
	return ix
}

// BenchmarkPutLocation measures adding one location to a reused batch (no commit).
func BenchmarkPutLocation(b *testing.B) {
	ix := openBench(b)
	batch := ix.NewBatch()
	defer batch.Close()
	b.ReportAllocs()
	i := int64(0)
	for b.Loop() {
		batch.PutLocation(i>>2, i&3, uint64(i))
		if i++; i%100_000 == 0 {
			batch.Reset()
		}
	}
}

// BenchmarkCheckpoint100k measures a checkpoint's index work: 100k locations (25k ledgers
// × 4 entries, sorted as the write cache flushes them) put into a reused batch and committed
// with sync. ns/op is per checkpoint.
func BenchmarkCheckpoint100k(b *testing.B) {
	ix := openBench(b)
	batch := ix.NewBatch()
	defer batch.Close()
	b.ReportAllocs()
	ledger := int64(0)
	for b.Loop() {
		for range 25_000 {
			for e := range int64(4) {
				batch.PutLocation(ledger, e, loc(ledger, e))
			}
			ledger++
		}
		if err := batch.Commit(true); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100_000, "ns/location")
}

// BenchmarkLongLedgers is bench storage's index: 256 ledgers written together, 200 entries
// of each per checkpoint (synced), 80 checkpoints (16k entries per ledger, one run per ledger
// per checkpoint), left as pebble leaves it, then random look-ups.
func BenchmarkLongLedgers(b *testing.B) {
	const n, per, perCheckpoint = 256, 16_000, 200
	ix := openBench(b)
	batch := ix.NewBatch()
	defer batch.Close()
	for first := int64(0); first < per; first += perCheckpoint {
		for l := range int64(n) {
			for e := first; e < first+perCheckpoint; e++ {
				batch.PutLocation(l, e, loc(l, e))
			}
		}
		if err := batch.Commit(true); err != nil {
			b.Fatal(err)
		}
	}
	m := ix.db.Metrics()
	b.Logf("L0 %d tables in %d sublevels, %d MB of sstables", m.Levels[0].TablesCount, m.Levels[0].Sublevels, m.DiskSpaceUsage()>>20)
	lookups(b, ix, n, per, func(int64) bool { return true })
}

// BenchmarkManyLedgers writes 1M ledgers with 4 entries each (and a ledger state) in
// checkpoint-sized synced batches, then measures random look-ups.
func BenchmarkManyLedgers(b *testing.B) {
	const n, per = 1_000_000, 4
	ix := openBench(b)
	start := time.Now()
	writeLedgers(b, ix, n, per, 200_000)
	b.Logf("wrote %d ledgers × %d entries in %v", n, per, time.Since(start).Round(time.Millisecond))
	settle(b, ix)
	lookups(b, ix, n, per, func(int64) bool { return true })
}

// settle waits until pebble has no compaction running (so that look-ups are measured
// without background work competing for the CPUs) and logs the LSM's shape.
func settle(b *testing.B, ix *Index) {
	b.Helper()
	start := time.Now()
	for time.Since(start) < time.Minute {
		time.Sleep(100 * time.Millisecond)
		if ix.db.Metrics().Compact.NumInProgress == 0 {
			break
		}
	}
	m := ix.db.Metrics()
	b.Logf("settled in %v: L0 %d tables, %d range tombstones, %d MB of sstables",
		time.Since(start).Round(time.Millisecond), m.Levels[0].TablesCount,
		m.Keys.TombstoneCount, m.DiskSpaceUsage()>>20)
}

// lookups runs the random look-up sub-benchmarks over ledgers [0, n) for which live is true.
func lookups(b *testing.B, ix *Index, n, per int64, live func(int64) bool) {
	pick := func(rng *rand.Rand) int64 {
		for {
			if l := rng.Int64N(n); live(l) {
				return l
			}
		}
	}
	b.Run("Location", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 2))
		b.ReportAllocs()
		for b.Loop() {
			l, e := pick(rng), rng.Int64N(per)
			if got, err := ix.Location(l, e); err != nil || got != loc(l, e) {
				b.Fatalf("Location(%d, %d) = %#x, %v", l, e, got, err)
			}
		}
	})
	b.Run("LocationMiss", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 3))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ix.Location(pick(rng), per+rng.Int64N(1000)); !errors.Is(err, ErrNotFound) {
				b.Fatal(err)
			}
		}
	})
	b.Run("LastEntry", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 4))
		b.ReportAllocs()
		for b.Loop() {
			l := pick(rng)
			if e, _, err := ix.LastEntry(l); err != nil || e != per-1 {
				b.Fatalf("LastEntry(%d) = %d, %v", l, e, err)
			}
		}
	})
}

// BenchmarkLastEntryAfterDeletes writes 200k ledgers × 4 entries, deletes 90% of them with
// range deletions (flushed, not compacted away), then measures LastEntry on the survivors
// and on the deleted ledgers. The Unbounded variants show what the per-ledger iterator
// bounds buy: a plain SeekLT over the whole keyspace, as an unbounded getFloor does.
func BenchmarkLastEntryAfterDeletes(b *testing.B) {
	const n, per = 200_000, 4
	ix := openBench(b)
	writeLedgers(b, ix, n, per, 200_000)
	survives := func(l int64) bool { return l%10 == 7 }
	deleteLedgers(b, ix, n, func(l int64) bool { return !survives(l) })
	if err := ix.db.Flush(); err != nil {
		b.Fatal(err)
	}
	settle(b, ix)
	run := func(name string, live bool, lastEntry func(int64) (int64, error)) {
		b.Run(name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(5, 6))
			b.ReportAllocs()
			for b.Loop() {
				l := rng.Int64N(n/10) * 10
				if live {
					l += 7
				} else {
					l += (8 + rng.Int64N(9)) % 10 // any digit but 7
				}
				e, err := lastEntry(l)
				if live && (err != nil || e != per-1) || !live && !errors.Is(err, ErrNotFound) {
					b.Fatalf("LastEntry(%d) = %d, %v", l, e, err)
				}
			}
		})
	}
	bounded := func(l int64) (int64, error) { e, _, err := ix.LastEntry(l); return e, err }
	unbounded := func(l int64) (int64, error) { return lastEntryUnbounded(ix, l) }
	run("Survivors", true, bounded)
	run("Deleted", false, bounded)
	run("SurvivorsUnbounded", true, unbounded)
	run("DeletedUnbounded", false, unbounded)
}

// lastEntryUnbounded is the floor look-up without iterator bounds, for comparison.
func lastEntryUnbounded(ix *Index, l int64) (int64, error) {
	it, err := ix.db.NewIter(&pebble.IterOptions{})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	var k [2 * runKeyLen]byte
	_, upper := putLedgerBounds(k[:], l, 0)
	if !it.SeekLT(upper) {
		return 0, ErrNotFound
	}
	kl, e, err := decodeIDKey(it.Key(), prefixRun)
	if err != nil || kl != l {
		return 0, ErrNotFound
	}
	return e, nil
}
