package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/journal"
)

var errTestCrash = errors.New("test crash")

// TestCrashAtEveryCheckpointStep stops a checkpoint after each of its steps with a simulated
// power loss (the in-memory FS keeps only what was synced), restarts, and checks that every
// acknowledged entry is readable, that the persisted mark never moved backwards and that no
// journal file needed for replay was deleted (the restart would fail).
func TestCrashAtEveryCheckpointStep(t *testing.T) {
	steps := []checkpointStep{stepMarksSnapshot, stepHalvesSwapped, stepEntryLogSynced, stepIndexSynced, stepMarksPersisted, stepJournalsCollected}
	for _, step := range steps {
		for _, mode := range []diskio.CrashMode{diskio.CrashSyncedOnly, diskio.CrashSubset} {
			t.Run(fmt.Sprintf("step%d/mode%d", step, mode), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(step), uint64(mode)))
				fs := diskio.NewMem(4096)
				cfg := testConfig(t, fs, 2)
				cfg.Journal.MaxFileSize = 1 << 20 // several journal files, so GC has work
				e := openTest(t, cfg)
				acked := map[[2]int64]bool{}
				var mu sync.Mutex
				write := func(from, to int64) {
					var wg sync.WaitGroup
					for l := int64(1); l <= 4; l++ {
						for en := from; en < to; en++ {
							wg.Add(1)
							err := e.Add(testKey, storedEntry(l, en), false, func(_ any, err error) {
								if err == nil {
									mu.Lock()
									acked[[2]int64{l, en}] = true
									mu.Unlock()
								}
								wg.Done()
							}, nil)
							if err != nil {
								wg.Done()
							}
						}
					}
					wg.Wait()
				}
				write(0, 300)
				if err := e.Checkpoint(); err != nil {
					t.Fatal(err)
				}
				markBefore := loadMarks(t, e)
				write(300, 600)
				var crashed *diskio.Mem
				var crashMu sync.Mutex // the dirs flush in parallel
				e.setCheckpointHook(func(s checkpointStep) error {
					crashMu.Lock()
					defer crashMu.Unlock()
					if s == step && crashed == nil {
						crashed = fs.Crash(mode, rng)
						return errTestCrash
					}
					return nil
				})
				if err := e.Checkpoint(); !errors.Is(err, errTestCrash) {
					t.Fatalf("checkpoint: %v", err)
				}
				e.Close()
				cfg.FS = crashed
				e = openTest(t, cfg)
				defer e.Close()
				if after := loadMarks(t, e); after[0].Compare(markBefore[0]) < 0 {
					t.Fatalf("mark went backwards: %v -> %v", markBefore, after)
				}
				for k := range acked {
					mustRead(t, e, k[0], k[1])
				}
				if len(acked) != 4*600 {
					t.Fatalf("only %d of %d adds were acknowledged", len(acked), 4*600)
				}
			})
		}
	}
}

func loadMarks(t *testing.T, e *Engine) []journal.Mark {
	t.Helper()
	var marks []journal.Mark
	for _, s := range e.markStores {
		m, err := s.Load()
		if err != nil {
			t.Fatal(err)
		}
		marks = append(marks, m)
	}
	return marks
}
