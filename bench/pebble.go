package bench

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
)

// RunPebbleBaseline runs the journal workload's durable appends through pebble's synced batch
// commit (db.Set with pebble.Sync from Writers×Outstanding goroutines; pebble's commit
// pipeline groups them into shared WAL writes and syncs), in a fresh directory under the first
// journal dir. It is the Go state of the art for group commit, measured in the same run.
func RunPebbleBaseline(ctx context.Context, o JournalOptions) (*Result, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(o.Dirs[0], "ringkeeper-bench-pebble-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	opts := &pebble.Options{
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             quietPebbleLogger{},
		// A large memtable and lazy compactions keep background work small, so the WAL's group
		// commit is what is measured.
		MemTableSize:                512 << 20,
		MemTableStopWritesThreshold: 4,
		L0CompactionThreshold:       16,
		L0StopWritesThreshold:       64,
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	payload := make([]byte, o.EntrySize)
	for i := range payload {
		payload[i] = byte(rand.Uint32())
	}
	rec := NewRecorder()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for g := range o.Writers * o.Outstanding {
		wg.Go(func() {
			var key [16]byte
			binary.BigEndian.PutUint64(key[:], uint64(g))
			pace := newPacer(o.Rate, o.Writers*o.Outstanding)
			for seq := uint64(0); runCtx.Err() == nil; seq++ {
				binary.BigEndian.PutUint64(key[8:], seq)
				start := pace.wait()
				if err := db.Set(key[:], payload, pebble.Sync); err != nil {
					rec.Error()
					return
				}
				rec.Record(time.Duration(monotime.Now()-start), len(payload))
			}
		})
	}
	rec.Measure(ctx, o.Warmup, o.Duration, o.Progress)
	cancel()
	wg.Wait()
	res := rec.Result("pebble-synced-commit", o.config())
	return res, nil
}

type quietPebbleLogger struct{}

func (quietPebbleLogger) Infof(string, ...any)  {}
func (quietPebbleLogger) Errorf(string, ...any) {}
func (quietPebbleLogger) Fatalf(format string, args ...any) {
	quietLogger().Error("pebble baseline: fatal", "msg", format)
	panic("pebble baseline: fatal error")
}
