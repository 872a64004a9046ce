package entrylog

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// TestCrashRandom crashes the in-memory file system at random moments (between calls, or from
// another goroutine while writes are in flight) over several generations: every entry that a
// completed Flush covered must be readable after reopening on what survived, and scanning the
// crashed logs must neither fail nor return damaged data, and must find every durable entry.
func TestCrashRandom(t *testing.T) {
	rounds := 30
	if testing.Short() || raceEnabled {
		rounds = 9
	}
	modes := []diskio.CrashMode{diskio.CrashSyncedOnly, diskio.CrashPrefix, diskio.CrashSubset}
	for round := range rounds {
		rng := rand.New(rand.NewPCG(uint64(round), 42))
		mode := modes[round%3]
		fs := diskio.NewMem(4096)
		var durable []added
		for gen := range 3 {
			cfg := memConfig(fs)
			cfg.WriteBuffers = 2 + (round+gen)%3
			e, err := Open(cfg)
			if err != nil {
				t.Fatalf("round %d gen %d (mode %d): open after crash: %v", round, gen, mode, err)
			}
			checkRead(t, e, durable)
			verifyScans(t, e, durable, fmt.Sprintf("round %d gen %d (mode %d)", round, gen, mode))
			var crashed *diskio.Mem
			if round%2 == 0 {
				crashed, durable = writeThenCrash(t, e, fs, mode, rng, durable, int64(gen))
			} else {
				crashed, durable = writeWhileCrashing(t, e, fs, mode, rng, durable, int64(gen))
			}
			e.Close() // fails: the file system is gone
			fs = crashed
		}
		cfg := memConfig(fs)
		e := mustOpen(t, cfg)
		checkRead(t, e, durable)
		verifyScans(t, e, durable, fmt.Sprintf("round %d final", round))
		e.Close()
	}
}

// writeThenCrash adds and flushes from this goroutine and crashes between two calls, after a
// random number of them (writes may still be in flight).
func writeThenCrash(t *testing.T, e *EntryLog, fs *diskio.Mem, mode diskio.CrashMode, rng *rand.Rand, durable []added, gen int64) (*diskio.Mem, []added) {
	var pending []added
	ops := rng.IntN(1500)
	for op := range ops {
		ledger := gen*100 + int64(rng.IntN(4))
		entry := int64(op)
		if rng.IntN(12) == 0 {
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
			durable, pending = append(durable, pending...), pending[:0]
			continue
		}
		loc, err := e.Add(ledger, entry, testEntry(ledger, entry))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, added{key{ledger, entry}, loc})
	}
	return fs.Crash(mode, rng), durable
}

// writeWhileCrashing adds and flushes until another goroutine crashes the file system after a
// random delay. An entry is durable once a Flush after it returned nil: a sync that completed
// before the crash made it durable in the image, and one after it fails.
func writeWhileCrashing(t *testing.T, e *EntryLog, fs *diskio.Mem, mode diskio.CrashMode, rng *rand.Rand, durable []added, gen int64) (*diskio.Mem, []added) {
	delay := time.Duration(rng.IntN(4000)) * time.Microsecond
	crashRng := rand.New(rand.NewPCG(rng.Uint64(), 1))
	result := make(chan *diskio.Mem, 1)
	var done atomic.Bool
	go func() {
		time.Sleep(delay)
		result <- fs.Crash(mode, crashRng)
		done.Store(true)
	}()
	var pending []added
	for op := int64(0); ; op++ {
		ledger := gen*100 + op%5
		var err error
		if op%17 == 16 {
			if err = e.Flush(); err == nil {
				durable, pending = append(durable, pending...), pending[:0]
			}
		} else {
			var loc Location
			if loc, err = e.Add(ledger, op, testEntry(ledger, op)); err == nil {
				pending = append(pending, added{key{ledger, op}, loc})
			}
		}
		if err != nil || (done.Load() && op > 0) {
			break
		}
	}
	return <-result, durable
}

// verifyScans scans every log but the current one: no error, no damaged record, every durable
// entry found; and each log's ledgers map matches what its scan found.
func verifyScans(t *testing.T, e *EntryLog, durable []added, what string) {
	t.Helper()
	found := make(map[Location]key)
	for _, id := range e.Logs() {
		if id == e.CurrentLogID() {
			continue
		}
		m := make(map[int64]uint64)
		err := e.Scan(id, func(ledger, entry int64, b []byte, loc Location) error {
			if !bytes.Equal(b, testEntry(ledger, entry)) {
				return fmt.Errorf("scan returned damaged entry %d/%d at %v", ledger, entry, loc)
			}
			found[loc] = key{ledger, entry}
			m[ledger] += uint64(recordHeaderSize + len(b))
			return nil
		})
		if err != nil {
			t.Fatalf("%s: scan log %x: %v", what, id, err)
		}
		got, err := e.LedgersMap(id)
		if err != nil || !equalMaps(got, m) {
			t.Fatalf("%s: log %x: LedgersMap %v (%v), scan found %v", what, id, got, err, m)
		}
	}
	for _, a := range durable {
		if found[a.loc] != a.key {
			t.Fatalf("%s: durable entry %v at %v not found by scanning", what, a.key, a.loc)
		}
	}
}

// TestMapRebuiltAfterCrash: logs rolled but not finalized, and the current log, lose their maps
// in a crash; LedgersMap rebuilds them by scanning, equal to what was flushed.
func TestMapRebuiltAfterCrash(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	e := mustOpen(t, cfg)
	flushed := addRange(t, e, []int64{11, 12, 13}, 0, 60)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	// Roll without a Flush after it: the sealed log waits for finalization.
	before := e.CurrentLogID()
	var unflushed []added
	for i := int64(60); e.CurrentLogID() == before; i++ {
		unflushed = append(unflushed, addRange(t, e, []int64{11}, i, i+1)...)
	}
	if e.w.pending == nil || e.w.pending.id != before {
		t.Fatal("the rolled log is not pending")
	}
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	e.Close()
	cfg.FS = crashed
	e = mustOpen(t, cfg)
	defer e.Close()
	want := expectedMaps(flushed)
	for _, id := range e.Logs() {
		if id == e.CurrentLogID() {
			continue
		}
		if _, err := e.readLedgersMap(id); err == nil {
			if id >= before {
				t.Fatalf("log %x has a stored map though it was never finalized", id)
			}
		}
		m, err := e.LedgersMap(id)
		if err != nil || !equalMaps(m, want[id]) {
			t.Fatalf("log %x: rebuilt map %v (%v), want %v", id, m, err, want[id])
		}
	}
	checkRead(t, e, flushed)
	_ = unflushed
}

// TestConcurrentCrashReadsNeverDamaged crashes while readers read flushed entries: a read
// either returns the right bytes or fails; it never returns other bytes.
func TestConcurrentCrashReadsNeverDamaged(t *testing.T) {
	fs := diskio.NewMem(4096)
	e := mustOpen(t, memConfig(fs))
	var mu sync.Mutex
	var flushed []added
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 3))
			var buf []byte
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				if len(flushed) == 0 {
					mu.Unlock()
					continue
				}
				a := flushed[rng.IntN(len(flushed))]
				mu.Unlock()
				b, err := e.Read(a.loc, a.ledger, a.entry, buf[:0])
				if err == nil && !bytes.Equal(b, testEntry(a.ledger, a.entry)) {
					t.Errorf("read %v: wrong bytes", a.key)
					return
				}
				buf = b
			}
		})
	}
	var pending []added
	for i := int64(0); i < 2000; i++ {
		loc, err := e.Add(1, i, testEntry(1, i))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, added{key{1, i}, loc})
		if i%50 == 49 {
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			flushed = append(flushed, pending...)
			mu.Unlock()
			pending = pending[:0]
		}
		if i == 1500 {
			fs.Crash(diskio.CrashSubset, rand.New(rand.NewPCG(1, 1)))
			break
		}
	}
	time.Sleep(5 * time.Millisecond)
	close(stop)
	wg.Wait()
	e.Close()
}

// TestCrashInsideFlush fails the k-th sync (or write) of a log file, for every k over a
// workload, then crashes: the crash lands inside a Flush, a finalization or a log creation,
// with its writes done and not synced, which is where the order of writes and syncs matters.
func TestCrashInsideFlush(t *testing.T) {
	modes := []diskio.CrashMode{diskio.CrashSyncedOnly, diskio.CrashPrefix, diskio.CrashSubset}
	runs := 0
	type point struct {
		kind diskio.OpKind
		mode diskio.CrashMode
	}
	var points []point
	for _, kind := range []diskio.OpKind{diskio.OpSync, diskio.OpWrite} {
		for _, mode := range modes {
			points = append(points, point{kind, mode})
		}
	}
	for _, p := range points {
		kind, mode := p.kind, p.mode
		for k := 0; ; k++ {
			if (testing.Short() || raceEnabled) && k%4 != 0 {
				continue
			}
			fs := diskio.NewMem(4096)
			cfg := memConfig(fs)
			cfg.LogSizeLimit = 64 << 10
			e := mustOpen(t, cfg)
			var count atomic.Int64
			var injected atomic.Bool
			fs.SetInjector(func(op diskio.Op) error {
				if op.Kind == kind && len(op.Name) > 4 && op.Name[len(op.Name)-4:] == ".log" && count.Add(1) == int64(k+1) {
					injected.Store(true)
					return fmt.Errorf("injected %v failure", kind)
				}
				return nil
			})
			var durable, pending []added
			failed := false
			for i := int64(0); i < 260 && !failed; i++ {
				ledger := i % 3
				loc, err := e.Add(ledger, i, testEntry(ledger, i))
				if err == nil {
					pending = append(pending, added{key{ledger, i}, loc})
					if i%7 == 6 {
						if err = e.Flush(); err == nil {
							durable, pending = append(durable, pending...), pending[:0]
						}
					}
				}
				failed = err != nil
			}
			if !failed {
				e.Close()
				if !injected.Load() {
					break // k is past the last operation of the workload
				}
				continue // it failed a preparation of the next log ahead, which the roll redid
			}
			image := fs.Crash(mode, rand.New(rand.NewPCG(uint64(k), 5)))
			cfg.FS = image
			e2 := mustOpen(t, cfg)
			checkRead(t, e2, durable)
			verifyScans(t, e2, durable, fmt.Sprintf("%v #%d mode %d", kind, k, mode))
			e2.Close()
			runs++
			e.Close()
		}
	}
	if runs < 30 {
		t.Fatalf("only %d crash points: the workload is too small", runs)
	}
	t.Logf("%d crash points", runs)
}
