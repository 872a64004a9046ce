package engine

import (
	"bytes"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// TestReadCacheServesAnOverwrittenEntry: a read that read ahead cached entries of a ledger; a
// recovery add then wrote one of them again with other bytes. Reads returned the new bytes from
// the write cache, but once a checkpoint flushed them (and recycled the half) the read cache
// still held the old copy, which it served before the index: stale bytes after a newer add.
func TestReadCacheServesAnOverwrittenEntry(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.ReadAheadBatchSize = 100
	e := openTest(t, cfg)
	defer e.Close()
	const l = int64(4)
	addCheckpointed(t, e, l, 10)
	for en := range int64(2) { // a sequential read reads 2..9 ahead into the read cache
		mustRead(t, e, l, en)
	}
	if _, ok := e.dir(l).reads.get(l, 5, nil); !ok {
		t.Fatal("entry 5 was not read ahead")
	}
	newer := versionedEntry(l, 5, 1)
	if err := addSync(e, testKey, newer, true); err != nil { // a recovery add rewrites entry 5
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		got, err := e.Read(l, 5, nil)
		if err != nil {
			t.Fatalf("%s: read %d/5: %v", when, l, err)
		}
		if !bytes.Equal(got, newer) {
			t.Fatalf("%s: read %d/5 returned the bytes of the older copy (%v)", when, l, bytes.Equal(got, storedEntry(l, 5)))
		}
	}
	check("in the write cache")
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	check("after the checkpoint")
}

// TestThrottledAddFailsWhenTheFlushFails: an add waiting for write-cache space (both halves
// full) is woken only by a swap of the halves, the timer or Close. When the flush that was to
// recycle the sealed half failed, the engine stopped for good (sticky) and no swap could come:
// the add, holding its ledger's addMu (a fence of the ledger waited too), slept out the whole
// MaxThrottleTime before it returned the failure. It now returns it at once.
func TestThrottledAddFailsWhenTheFlushFails(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.WriteCacheMaxSize = 2 << 20 // 1 MiB halves
	cfg.MaxThrottleTime = 10 * time.Second
	e := openTest(t, cfg)
	defer e.Close()
	release := make(chan struct{})
	held := make(chan struct{})
	e.setCheckpointHook(func(s checkpointStep) error {
		if s == stepHalvesSwapped {
			close(held)
			<-release // the flush of the sealed half is stuck, then fails
			return errTestCrash
		}
		return nil
	})
	checkpointed := make(chan error, 1)
	go func() { checkpointed <- e.Checkpoint() }()
	<-held
	// Fill the active half: both halves are full.
	en := int64(0)
	for ; ; en++ {
		queued, err := e.TryAdd(testKey, storedEntry(9, en), false, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !queued {
			break
		}
	}
	added := make(chan error, 1)
	go func() { added <- e.Add(testKey, storedEntry(9, en), false, nil, nil) }()
	for e.Stats().ThrottledAdds == 0 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-checkpointed; !errors.Is(err, errTestCrash) {
		t.Fatalf("checkpoint: %v", err)
	}
	failed := time.Now()
	select {
	case err := <-added:
		if !errors.Is(err, errTestCrash) {
			t.Fatalf("throttled add after the flush failed: %v, want the engine's failure", err)
		}
		t.Logf("the throttled add failed %v after the flush", time.Since(failed))
	case <-time.After(3 * time.Second):
		err := <-added
		t.Fatalf("the throttled add still waited 3s after the flush failed for good (then, after %v: %v)",
			time.Since(failed), err)
	}
}

// TestHugeReadAheadBatchSize: dbStorage_readAheadCacheBatchSize has no upper bound (an
// operator may set it very high to mean "as far as the read goes"), and every read that read
// ahead allocated room for that many index locations up front: a sequential read panicked
// (makeslice) or asked for gigabytes. A read ahead never covers more entries than its bytes
// can hold, so the batch is bounded by that.
func TestHugeReadAheadBatchSize(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.ReadAheadBatchSize = math.MaxInt
	e := openTest(t, cfg)
	defer e.Close()
	const l = int64(4)
	addCheckpointed(t, e, l, 10)
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("a sequential read with a batch size of %d panicked: %v", cfg.ReadAheadBatchSize, r)
			}
		}()
		for en := range int64(2) {
			mustRead(t, e, l, en)
		}
	}()
	for en := int64(2); en < 10; en++ {
		if got, ok := e.ReadCached(l, en, nil); !ok || !bytes.Equal(got, storedEntry(l, en)) {
			t.Fatalf("entry %d not read ahead", en)
		}
	}
}

// TestReadCacheStaysWithinItsConfiguredSize: the read cache gave each of its 8 segments at
// least 64 KiB, 512 KiB per ledger dir whatever dbStorage_readAheadCacheMaxSizeMb said: a
// cache configured off (0) or small, or split over several dirs, held more. Reads still work,
// and a sequential read still reads ahead into a small cache.
func TestReadCacheStaysWithinItsConfiguredSize(t *testing.T) {
	for _, size := range []int64{0, 256 << 10, 100 << 10} {
		fs := diskio.NewMem(4096)
		cfg := testConfig(t, fs, 2)
		cfg.ReadAheadCacheMaxSize = size
		e := openTest(t, cfg)
		var held int64
		for _, d := range e.dirs {
			for _, s := range d.reads.segments {
				held += int64(len(s.data))
			}
		}
		if held > size {
			e.Close()
			t.Fatalf("read cache of %d bytes configured over 2 dirs holds %d bytes", size, held)
		}
		const l = int64(4)
		for en := range int64(10) {
			if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Checkpoint(); err != nil {
			t.Fatal(err)
		}
		for en := range int64(10) {
			mustRead(t, e, l, en)
		}
		if _, ok := e.ReadCached(l, 9, nil); ok != (size > 0) {
			t.Errorf("read cache of %d bytes: entry 9 read ahead %v", size, ok)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// The read cache's invalidation (TestReadCacheServesAnOverwrittenEntry) drops exactly the
// flushed entries from every segment, keeps the others, and refuses a put of a read that took
// its generation before it.
func TestReadCacheInvalidate(t *testing.T) {
	c := newReadCache(4*(64<<10), 4)
	data := func(l, en int64) []byte { return bytes.Repeat([]byte{byte(l*31 + en)}, 600) }
	gen := c.generation()
	for en := range int64(200) { // about 3 segments of 2 ledgers' entries
		for _, l := range []int64{1, 2} {
			c.put(gen, l, en, data(l, en))
		}
	}
	var flushed []sortedEntry
	for _, k := range []entryKey{{1, 10}, {1, 150}, {1, 199}, {2, 7}, {3, 5}} {
		flushed = append(flushed, sortedEntry{key: k})
	}
	c.invalidate(flushed)
	for _, f := range flushed {
		if _, ok := c.get(f.key.ledger, f.key.entry, nil); ok {
			t.Fatalf("entry %v still cached after its flush", f.key)
		}
	}
	for _, k := range []entryKey{{1, 11}, {1, 198}, {2, 10}, {2, 199}} {
		if got, ok := c.get(k.ledger, k.entry, nil); !ok || !bytes.Equal(got, data(k.ledger, k.entry)) {
			t.Fatalf("entry %v lost by the invalidation of others", k)
		}
	}
	c.put(gen, 1, 10, data(1, 10)) // looked up before the flush: not cached
	if _, ok := c.get(1, 10, nil); ok {
		t.Fatal("a read of the generation before the flush cached its older copy")
	}
	c.put(c.generation(), 1, 10, data(1, 10))
	if _, ok := c.get(1, 10, nil); !ok {
		t.Fatal("a read after the flush cached nothing")
	}
}

// TestReadsRacingSwapsAndRewrites: entries are written again and again (recovery adds, each
// version with other bytes) while checkpoints swap, flush and recycle the halves and readers
// read them sequentially (reading ahead) and at random. A read must return the version last
// acknowledged before it started, or a newer one: never "no such entry", never an older copy,
// never torn bytes.
func TestReadsRacingSwapsAndRewrites(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.WriteCacheMaxSize = 2 << 20
	cfg.ReadAheadBatchSize = 8
	cfg.ReadAheadCacheMaxSize = 512 << 10
	e := openTest(t, cfg)
	defer e.Close()
	const l, entries = int64(5), 64
	var acked [entries]atomic.Int32
	for en := range int64(entries) {
		if err := addSync(e, testKey, versionedEntry(l, en, 0), false); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // writer
		for v := 1; v < 200; v++ {
			for en := range int64(entries) {
				select {
				case <-stop:
					return
				default:
				}
				if err := addSync(e, testKey, versionedEntry(l, en, byte(v)), true); err != nil {
					t.Error(err)
					return
				}
				acked[en].Store(int32(v))
			}
		}
	})
	wg.Go(func() { // checkpoints
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := e.Checkpoint(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var bad atomic.Int64
	for r := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				en := int64(i % entries)
				if r == 1 {
					en = int64((i * 37) % entries)
				}
				from := int(acked[en].Load())
				got, err := e.Read(l, en, nil)
				if err != nil {
					t.Errorf("read %d/%d (version %d acknowledged): %v", l, en, from, err)
					bad.Add(1)
					return
				}
				ok := false
				for v := from; v < 256 && !ok; v++ {
					ok = bytes.Equal(got, versionedEntry(l, en, byte(v)))
				}
				if !ok {
					older := -1
					for v := range from {
						if bytes.Equal(got, versionedEntry(l, en, byte(v))) {
							older = v
						}
					}
					t.Errorf("read %d/%d: version %d acknowledged, got bytes of version %d (-1: torn)", l, en, from, older)
					bad.Add(1)
					return
				}
			}
		})
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	if n := e.Stats().Flushes; n < 10 {
		t.Logf("only %d flushes", n)
	}
}
