package entrylog

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// concurrentWorkload runs one writer (adding, flushing, rolling) against readers that Read and
// ReadAhead flushed entries, and a collector that scans, maps and removes old logs, as the
// engine's GC would. Reads of a removed log may fail with ErrNoSuchLog; nothing else may fail,
// and no read may return other bytes.
func concurrentWorkload(t *testing.T, cfg Config, entries int) {
	e := mustOpen(t, cfg)
	var (
		mu      sync.Mutex
		flushed []added
		removed = make(map[uint64]bool)
	)
	pick := func(rng *rand.Rand) (added, bool) {
		mu.Lock()
		defer mu.Unlock()
		if len(flushed) == 0 {
			return added{}, false
		}
		return flushed[rng.IntN(len(flushed))], true
	}
	gone := func(id uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		return removed[id]
	}
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 11))
			var buf []byte
			for !stop.Load() {
				a, ok := pick(rng)
				if !ok {
					continue
				}
				var err error
				if r%2 == 0 {
					buf, err = e.Read(a.loc, a.ledger, a.entry, buf[:0])
					if err == nil && !bytes.Equal(buf, testEntry(a.ledger, a.entry)) {
						t.Errorf("read %v: wrong bytes", a.key)
						return
					}
				} else {
					n := 0
					err = e.ReadAhead(a.loc, 32<<10, func(ledger, entry int64, b []byte, loc Location) bool {
						if !bytes.Equal(b, testEntry(ledger, entry)) {
							t.Errorf("read-ahead %d/%d at %v: wrong bytes", ledger, entry, loc)
						}
						n++
						return n < 20
					})
				}
				if err != nil && !(errors.Is(err, ErrNoSuchLog) && gone(a.loc.LogID())) {
					t.Errorf("read %v at %v: %v", a.key, a.loc, err)
					return
				}
				reads.Add(1)
			}
		})
	}
	wg.Go(func() { // the collector
		for !stop.Load() {
			logs := e.Logs()
			if len(logs) < 4 {
				continue
			}
			id := logs[0]
			m, err := e.LedgersMap(id)
			if err == nil {
				err = e.Scan(id, func(ledger, entry int64, b []byte, _ Location) error {
					if m[ledger] == 0 || !bytes.Equal(b, testEntry(ledger, entry)) {
						t.Errorf("scan of log %x: entry %d/%d not in its map or damaged", id, ledger, entry)
					}
					return nil
				})
			}
			if err != nil {
				t.Errorf("collector on log %x: %v", id, err)
				return
			}
			mu.Lock()
			removed[id] = true
			mu.Unlock()
			if err := e.Remove(id); err != nil && !errors.Is(err, ErrLogInUse) {
				t.Errorf("remove %x: %v", id, err)
				return
			}
		}
	})
	var pending []added
	for i := range int64(entries) {
		ledger := i % 7
		loc, err := e.Add(ledger, i, testEntry(ledger, i))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, added{key{ledger, i}, loc})
		if i%40 == 39 {
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			flushed = append(flushed, pending...)
			mu.Unlock()
			pending = pending[:0]
		}
	}
	stop.Store(true)
	wg.Wait()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if reads.Load() < int64(entries)/10 {
		t.Logf("only %d reads", reads.Load())
	}
}

func TestConcurrentReadWriteMem(t *testing.T) {
	concurrentWorkload(t, memConfig(diskio.NewMem(4096)), 3000)
}

func TestConcurrentReadWriteOS(t *testing.T) {
	for _, engine := range engines(t) {
		t.Run(engine.String(), func(t *testing.T) {
			cfg := memConfig(diskio.NewOS())
			cfg.Dir, cfg.Engine = t.TempDir(), engine
			cfg.LogSizeLimit = 512 << 10
			concurrentWorkload(t, cfg, 2000)
		})
	}
}

// TestReadersWaitForClose: Close waits for reads in progress and later reads fail cleanly.
func TestReadersWaitForClose(t *testing.T) {
	e := mustOpen(t, memConfig(diskio.NewMem(4096)))
	all := addRange(t, e, []int64{1, 2}, 0, 100)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				a := all[(i*7+r)%len(all)]
				b, err := e.Read(a.loc, a.ledger, a.entry, nil)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil || !bytes.Equal(b, testEntry(a.ledger, a.entry)) {
					t.Errorf("read %v: %v", a.key, err)
					return
				}
			}
		})
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
