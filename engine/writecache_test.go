package engine

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

func TestWriteCacheHalfOrderGapsAndSparse(t *testing.T) {
	h := newCacheHalf(1<<20, 256<<10)
	want := map[entryKey][]byte{}
	put := func(l, e int64) {
		data := storedEntry(l, e)
		if _, _, ok := h.put(l, e, data, false); !ok {
			t.Fatalf("put %d/%d failed", l, e)
		}
		want[entryKey{l, e}] = data
	}
	// In order, a gap, far out of order (sparse), before the first entry (sparse), a replace.
	for e := int64(10); e < 20; e++ {
		put(1, e)
	}
	put(1, 25)
	put(1, 100000)
	put(1, 3)
	put(1, 12)
	put(2, 0)
	put(0, 7)
	for k, data := range want {
		got, ok := h.get(k.ledger, k.entry, nil)
		if !ok || !bytes.Equal(got, data) {
			t.Fatalf("get %v: ok=%v", k, ok)
		}
	}
	for _, k := range []entryKey{{1, 20}, {1, 24}, {1, 9}, {3, 0}, {2, 1}} {
		if _, ok := h.get(k.ledger, k.entry, nil); ok {
			t.Fatalf("get %v found an entry that was never put", k)
		}
	}
	if last, ok := h.lastEntry(1); !ok || last != 100000 {
		t.Fatalf("last entry %d %v", last, ok)
	}
	h.seal()
	sorted := h.sorted(nil)
	if len(sorted) != len(want) {
		t.Fatalf("sorted %d entries, want %d", len(sorted), len(want))
	}
	if !slices.IsSortedFunc(sorted, func(a, b sortedEntry) int {
		if a.key.ledger != b.key.ledger {
			return int(a.key.ledger - b.key.ledger)
		}
		return int(a.key.entry - b.key.entry)
	}) {
		t.Fatal("flush order is not (ledger, entry)")
	}
	for _, se := range sorted { // the CRC the flush hands to the entry log is the entry's
		if data := h.memory(se.slot.offset, se.slot.length); se.slot.crc != crc32.Checksum(data, castagnoli) ||
			!bytes.Equal(data, want[se.key]) {
			t.Fatalf("entry %v: slot CRC %#x does not match its bytes", se.key, se.slot.crc)
		}
	}
	h.reset()
	if _, ok := h.get(1, 10, nil); ok || !h.empty() {
		t.Fatal("reset left entries behind")
	}
}

func TestWriteCacheHalfFillsAndRefusesWhenSealed(t *testing.T) {
	h := newCacheHalf(64<<10, 16<<10)
	data := make([]byte, 5000)
	n := 0
	for {
		if _, _, ok := h.put(1, int64(n), data, false); !ok {
			break
		}
		n++
	}
	// 16 KiB segments hold 3 entries of 5000 (64-byte aligned) each: 4 segments, 12 entries.
	if n != 12 {
		t.Fatalf("a 64 KiB half took %d entries of 5000 bytes, want 12", n)
	}
	h2 := newCacheHalf(64<<10, 16<<10)
	h2.seal()
	if _, _, ok := h2.put(1, 0, data, false); ok {
		t.Fatal("a sealed half took an entry")
	}
}

func TestWriteCacheHalfConcurrentPuts(t *testing.T) {
	h := newCacheHalf(32<<20, 4<<20)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range 2000 {
				l := int64(rng.IntN(4))
				e := int64(w*2000 + i)
				if _, _, ok := h.put(l, e, storedEntry(l, e), false); !ok {
					t.Errorf("put failed")
					return
				}
			}
		})
	}
	wg.Wait()
	h.seal()
	if got := len(h.sorted(nil)); got != 16000 {
		t.Fatalf("%d entries after concurrent puts, want 16000", got)
	}
}

// BenchmarkWriteCachePut measures inserts of 1 KiB entries; with -benchmem it must show no
// allocation per insert in steady state (a full half is sealed and recycled, as a flush does).
func BenchmarkWriteCachePut(b *testing.B) {
	h := newCacheHalf(64<<20, 16<<20)
	data := make([]byte, 1024)
	const ledgers = 16
	var next [ledgers]int64
	fill := func(n int) {
		for i := 0; i < n; i++ {
			l := int64(i % ledgers)
			if _, _, ok := h.put(l, next[l], data, false); !ok {
				h.seal()
				h.reset()
				next = [ledgers]int64{}
				continue
			}
			next[l]++
		}
	}
	fill(200000) // warm up: slot slices grow once, then are reused across resets
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	fill(b.N)
}

// TestWriteCacheIndexStaysWithinTheCache (reliability §5 item 24, found by the bookie's flood
// test, fixed): tiny entries whose ids are maxDenseGap apart made each add fill a gap of 4096
// absent dense slots, 64 KiB of index for a 64-byte entry, so that a client adding within every
// limit grew the heap to a thousand times the write cache. The dense slice now fills a gap only
// while it stays within the bytes of the ledger's entries; every entry stays readable.
func TestWriteCacheIndexStaysWithinTheCache(t *testing.T) {
	h := newCacheHalf(64<<10, 16<<10)
	data := make([]byte, storedEntryHeader)
	var ids []int64
	for e := int64(0); ; e += maxDenseGap {
		if _, _, ok := h.put(1, e, data, false); !ok {
			break
		}
		ids = append(ids, e)
	}
	// Then a run of consecutive ids, which stays dense.
	next := ids[len(ids)-1] + maxDenseGap
	h2 := newCacheHalf(64<<10, 16<<10)
	for e := next; e < next+100; e++ {
		if _, _, ok := h2.put(1, e, data, false); !ok {
			t.Fatalf("put %d failed", e)
		}
	}
	ls := h.lookup(1)
	if index := int64(cap(ls.dense)) * cacheSlotSize; index > h.capacity {
		t.Fatalf("%d entries %d ids apart: dense index of %d bytes (%d slots) for a half of %d bytes",
			len(ids), maxDenseGap, index, cap(ls.dense), h.capacity)
	}
	for _, e := range ids {
		if _, ok := h.get(1, e, nil); !ok {
			t.Fatalf("entry %d lost", e)
		}
	}
	if last, ok := h.lastEntry(1); !ok || last != ids[len(ids)-1] {
		t.Fatalf("last entry %d %v, want %d", last, ok, ids[len(ids)-1])
	}
	if ls2 := h2.lookup(1); len(ls2.dense) != 100 || len(ls2.sparse) != 0 {
		t.Fatalf("consecutive ids: %d dense, %d sparse, want all 100 dense", len(ls2.dense), len(ls2.sparse))
	}
}

// TestWriteCacheStaysWithinItsConfiguredSize: a half whose size is not a multiple of the
// segment size was given a whole last segment, so both halves held up to a segment more than
// dbStorage_writeCacheMaxSizeMb: 128 MiB halves for 100 MiB ones with the 64 MiB segments, or
// 4.5 MiB for 4 MiB once segments grew to the largest entry (1.5 MiB). The last segment is now
// only as large as the rest of the half, and the half still takes entries up to its size.
func TestWriteCacheStaysWithinItsConfiguredSize(t *testing.T) {
	defer func(old int64) { writeCacheSegmentSize = old }(writeCacheSegmentSize)
	writeCacheSegmentSize = 1 << 20
	cfg := testConfig(t, diskio.NewMem(4096), 2)
	cfg.WriteCacheMaxSize = 6 << 20 // 1.5 MiB halves
	e := openTest(t, cfg)
	defer e.Close()
	var allocated int64
	for _, d := range e.dirs {
		for _, h := range d.halves {
			for _, seg := range h.segments {
				allocated += int64(len(seg))
			}
		}
	}
	if capacity := e.Stats().WriteCacheCapacity; allocated > cfg.WriteCacheMaxSize || capacity > cfg.WriteCacheMaxSize {
		t.Fatalf("write cache of %d bytes configured: %d bytes allocated, capacity %d", cfg.WriteCacheMaxSize, allocated, capacity)
	}

	h := newCacheHalf(100<<10, 64<<10)
	data := make([]byte, 5000)
	n := 0
	for ; ; n++ {
		if _, _, ok := h.put(1, int64(n), data, false); !ok {
			break
		}
	}
	// 5056 bytes each (64-byte aligned): 12 in the 64 KiB segment, 7 in the 36 KiB one.
	if n != 19 {
		t.Fatalf("a 100 KiB half took %d entries of 5000 bytes, want 19", n)
	}
	for i := range n {
		if got, ok := h.get(1, int64(i), nil); !ok || len(got) != len(data) {
			t.Fatalf("entry %d: ok=%v, %d bytes", i, ok, len(got))
		}
	}
}
