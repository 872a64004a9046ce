package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/journal"
)

// StorageOptions configures the storage workload: adds through the whole engine (journal,
// write cache, checkpoints flushing to entry logs and the index), then optionally cold reads.
type StorageOptions struct {
	// JournalDirs and LedgerDirs hold the run's data; each run works in fresh subdirectories
	// that are removed afterwards.
	JournalDirs []string
	LedgerDirs  []string
	Writers     int
	Outstanding int
	EntrySize   int
	Ledgers     int
	Rate        float64
	Duration    time.Duration
	Warmup      time.Duration
	// Journal settings, as for the journal workload.
	Sync          bool
	GroupWait     time.Duration
	GroupBytes    int
	PipelineDepth int
	Engine        diskio.Engine
	MaxFileSize   int64
	// Prealloc is journalPreallocMode.
	Prealloc journal.PreallocMode
	// Engine settings.
	WriteCacheSize int64
	FlushInterval  time.Duration
	// Read is "", "random" or "sequential": after the adds, read back entries that were
	// flushed to entry logs and dropped from the caches, ReadOutstanding at a time, for
	// ReadDuration.
	Read            string
	ReadOutstanding int
	ReadDuration    time.Duration
	// IndexCacheSize is the index's block cache (dbStorage_rocksDB_blockCacheSize).
	IndexCacheSize int64
	// ColdIndex keeps the reopened index cold for the reads (indexWarmOnStart=false); by
	// default the reads start once the engine has warmed it.
	ColdIndex bool
	// Compaction runs the adds twice in one run, Duration each: first without garbage
	// collection, then with major compaction running continuously (at CompactionRate), and
	// reports both (the first as the result's Baseline). In both phases ledgers roll over every
	// LedgerEntries entries and DeleteFraction of the full ledgers are deleted once a checkpoint
	// has flushed them, so that entry logs (EntryLogSize each) fill with garbage.
	Compaction     bool
	CompactionRate int64
	// CompactionSlices splits each phase into this many slices, run alternately (off, on,
	// off, on, ...), so that drift over the run (disk fill, warm-up) affects both phases alike.
	CompactionSlices int
	EntryLogSize     int64
	LedgerEntries    int64
	DeleteFraction   float64
	Progress         io.Writer
}

// DefaultStorageOptions returns the defaults of `ringkeeper bench storage`.
func DefaultStorageOptions() StorageOptions {
	jo := DefaultJournalOptions()
	ec := engine.DefaultConfig(nil, nil)
	return StorageOptions{
		JournalDirs: jo.Dirs, LedgerDirs: jo.Dirs, Writers: 1, Outstanding: 1, EntrySize: 1024, Ledgers: 1,
		Duration: 10 * time.Second, Sync: true, GroupWait: jo.GroupWait, GroupBytes: jo.GroupBytes,
		PipelineDepth: jo.PipelineDepth, MaxFileSize: 512 << 20, WriteCacheSize: ec.WriteCacheMaxSize,
		FlushInterval: ec.FlushInterval, ReadOutstanding: 32, ReadDuration: 10 * time.Second,
		IndexCacheSize: ec.IndexBlockCacheSize, Prealloc: ec.Journal.Prealloc,
		CompactionRate: ec.GC.RateBytes, CompactionSlices: 2, LedgerEntries: 5000, DeleteFraction: 0.5,
	}
}

func (o StorageOptions) config() map[string]any {
	return map[string]any{
		"journal_dirs": o.JournalDirs, "ledger_dirs": o.LedgerDirs, "writers": o.Writers, "outstanding": o.Outstanding,
		"entry_size": o.EntrySize, "ledgers": o.Ledgers, "rate": o.Rate, "duration_s": o.Duration.Seconds(),
		"warmup_s": o.Warmup.Seconds(), "sync": o.Sync, "group_wait_ms": float64(o.GroupWait) / 1e6,
		"group_bytes": o.GroupBytes, "pipeline_depth": o.PipelineDepth, "engine": o.Engine.String(),
		"max_file_size": o.MaxFileSize, "write_cache_size": o.WriteCacheSize, "flush_interval_s": o.FlushInterval.Seconds(),
		"read": o.Read, "read_outstanding": o.ReadOutstanding, "read_duration_s": o.ReadDuration.Seconds(),
		"index_cache_size": o.IndexCacheSize, "cold_index": o.ColdIndex, "prealloc": o.Prealloc.String(),
		"compaction": o.Compaction, "compaction_rate": o.CompactionRate, "compaction_slices": o.CompactionSlices,
		"entry_log_size": o.EntryLogSize,
		"ledger_entries": o.LedgerEntries, "delete_fraction": o.DeleteFraction,
	}
}

// storageAdd is one reusable add: its stored entry buffer and send time.
type storageAdd struct {
	stored []byte
	sent   int64
	free   chan *storageAdd
	// rec is the recorder of the phase the add was sent in.
	rec  *Recorder
	size int
}

func storageDone(ctx any, err error) {
	a := ctx.(*storageAdd)
	if err != nil {
		a.rec.Error()
	} else {
		a.rec.Record(time.Duration(monotime.Now()-a.sent), a.size)
	}
	a.free <- a
}

// RunStorage runs the storage workload and returns the add result and, if o.Read is set, the
// read result.
func RunStorage(ctx context.Context, o StorageOptions) (adds, reads *Result, err error) {
	switch {
	case len(o.JournalDirs) == 0 || len(o.LedgerDirs) == 0:
		return nil, nil, errors.New("bench: journal and ledger dirs are required")
	case o.Writers < 1 || o.Outstanding < 1 || o.Ledgers < 1 || o.Duration <= 0 || o.EntrySize < 0 || !(o.Rate >= 0):
		return nil, nil, errors.New("bench: writers, outstanding, ledgers and duration must be positive, entry size and rate not negative")
	case o.Read != "" && (o.ReadOutstanding < 1 || o.ReadDuration <= 0):
		return nil, nil, errors.New("bench: --read-outstanding and --read-duration must be positive")
	case o.Read != "" && o.Read != "random" && o.Read != "sequential":
		return nil, nil, fmt.Errorf("bench: --read %q: want random or sequential", o.Read)
	case o.Compaction && (o.LedgerEntries < 1 || o.DeleteFraction < 0 || o.DeleteFraction > 1):
		return nil, nil, errors.New("bench: --ledger-entries must be positive and --delete-fraction in [0, 1]")
	case o.Compaction && o.Read != "":
		return nil, nil, errors.New("bench: --read does not combine with --compaction")
	}
	var work []string
	defer func() {
		for _, d := range work {
			os.RemoveAll(d)
		}
	}()
	mk := func(dirs []string, prefix string) ([]string, error) {
		var out []string
		for _, d := range dirs {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, err
			}
			w, err := os.MkdirTemp(d, prefix)
			if err != nil {
				return nil, err
			}
			work = append(work, w)
			out = append(out, w)
		}
		return out, nil
	}
	jdirs, err := mk(o.JournalDirs, "ringkeeper-bench-journal-")
	if err != nil {
		return nil, nil, err
	}
	ldirs, err := mk(o.LedgerDirs, "ringkeeper-bench-ledgers-")
	if err != nil {
		return nil, nil, err
	}
	cfg := engine.DefaultConfig(jdirs, ldirs)
	cfg.Journal.Engine = o.Engine
	cfg.Journal.SyncData = o.Sync
	cfg.Journal.MaxGroupWait = o.GroupWait
	cfg.Journal.BufferedWritesThreshold = o.GroupBytes
	cfg.Journal.PipelineDepth = o.PipelineDepth
	cfg.Journal.MaxFileSize = o.MaxFileSize
	cfg.Journal.Prealloc = o.Prealloc
	cfg.Journal.MaxRecordSize = max(o.EntrySize+64, 4096)
	cfg.WriteCacheMaxSize = o.WriteCacheSize
	cfg.FlushInterval = o.FlushInterval
	cfg.IndexBlockCacheSize = o.IndexCacheSize
	cfg.BookieID = "bench:0"
	cfg.InstanceID = "bench"
	cfg.Logger = quietLogger()
	if o.EntryLogSize > 0 {
		cfg.EntryLogSizeLimit = o.EntryLogSize
	} else if o.Compaction {
		cfg.EntryLogSizeLimit = 64 << 20 // logs fill (and can be compacted) within seconds
	}
	if o.Compaction {
		cfg.GC.RateBytes = o.CompactionRate
		cfg.GC.WaitTime = time.Hour // the run drives garbage collection itself
	}
	eng, err := engine.Open(cfg)
	if err != nil {
		return nil, nil, err
	}
	defer eng.Close()

	key := []byte("bench-master-key")
	rec := NewRecorder()
	var current atomic.Pointer[Recorder]
	current.Store(rec)
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var written atomic.Int64 // entries per ledger are consecutive from 0: next[l]
	next := make([]atomic.Int64, o.Ledgers)
	var roller *ledgerRoller
	if o.Compaction {
		roller = newLedgerRoller(eng, o)
	}
	frees := make([]chan *storageAdd, o.Writers)
	for w := range o.Writers {
		free := make(chan *storageAdd, o.Outstanding)
		for range o.Outstanding {
			a := &storageAdd{stored: make([]byte, 32+o.EntrySize), free: free, size: o.EntrySize}
			for i := 32; i < len(a.stored); i++ {
				a.stored[i] = byte(rand.Uint32())
			}
			free <- a
		}
		frees[w] = free
		wg.Go(func() {
			pace := newPacer(o.Rate, o.Writers)
			ledger := w % o.Ledgers
			for {
				a := <-free
				if runCtx.Err() != nil {
					free <- a
					return
				}
				a.sent = pace.wait()
				id, entry := int64(ledger), int64(0)
				if roller != nil {
					id, entry = roller.next(ledger)
				} else {
					entry = next[ledger].Add(1) - 1
				}
				binary.BigEndian.PutUint64(a.stored[0:], uint64(id))
				binary.BigEndian.PutUint64(a.stored[8:], uint64(entry))
				binary.BigEndian.PutUint64(a.stored[16:], uint64(entry-1))
				binary.BigEndian.PutUint64(a.stored[24:], uint64(entry+1)*uint64(o.EntrySize))
				a.rec = current.Load()
				if err := eng.Add(key, a.stored, false, storageDone, a); err != nil {
					current.Load().Error()
					free <- a
					if errors.Is(err, engine.ErrTooManyRequests) {
						continue
					}
					return
				}
				written.Add(1)
				ledger += o.Writers
				if ledger >= o.Ledgers {
					ledger = w % o.Ledgers
				}
			}
		})
	}
	var deleter sync.WaitGroup
	if roller != nil {
		deleter.Go(func() { roller.deleteLoop(runCtx) })
	}
	if o.Warmup > 0 {
		Sleep(ctx, o.Warmup)
		rec.Restart()
	}
	var baseline *Result
	var gcBefore, gcAfter engine.GCStatus
	if o.Compaction {
		baseline, rec, gcBefore, gcAfter = alternateCompaction(ctx, eng, o, rec, &current)
	} else {
		rec.Measure(ctx, 0, o.Duration, o.Progress)
	}
	cancel()
	deleter.Wait()
	wg.Wait()
	for _, free := range frees {
		for range o.Outstanding {
			<-free
		}
	}
	adds = rec.Result("storage", o.config())
	adds.Extra = storageExtra(eng)
	for k, v := range journalExtra(eng.Journals().Journals()) {
		adds.Extra["journal_"+k] = v
	}
	if baseline != nil {
		adds.Baseline = baseline
		compactionExtra(adds, baseline, gcBefore, gcAfter, roller, o)
	}
	if o.Read == "" || ctx.Err() != nil {
		return adds, nil, nil
	}

	// Cold reads: flush everything to entry logs, then reopen the engine so that no cache
	// holds any entry (entry logs are read with O_DIRECT: no page cache either). The index is
	// warmed on open, as a restarted bookie's is, unless ColdIndex.
	counts := make([]int64, o.Ledgers)
	for l := range counts {
		counts[l] = next[l].Load()
	}
	if err := eng.Close(); err != nil {
		return adds, nil, err
	}
	// The index's files were just written through the page cache: drop them from it, so that
	// a cold index is read from the disk.
	for _, dir := range ldirs {
		if err := dropFromPageCache(dir); err != nil {
			return adds, nil, err
		}
	}
	cfg.WarmIndex = !o.ColdIndex
	if eng, err = engine.Open(cfg); err != nil {
		return adds, nil, err
	}
	defer eng.Close()
	select {
	case <-eng.IndexesWarmed():
	case <-ctx.Done():
		return adds, nil, nil
	}
	reads, err = runStorageReads(ctx, o, eng, counts)
	if reads != nil {
		reads.Extra = map[string]float64{"index_warmed_mb": float64(eng.Stats().IndexWarmedBytes) / 1e6}
	}
	return adds, reads, err
}

func runStorageReads(ctx context.Context, o StorageOptions, eng *engine.Engine, counts []int64) (*Result, error) {
	rec := NewRecorder()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var total int64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return nil, errors.New("bench: nothing was written to read back")
	}
	for r := range o.ReadOutstanding {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			buf := make([]byte, 0, o.EntrySize+64)
			// Sequential readers each catch up a different ledger from its start.
			ledger := int64(r % len(counts))
			var entry int64
			for runCtx.Err() == nil {
				if o.Read == "random" {
					ledger = int64(rng.IntN(len(counts)))
					if counts[ledger] == 0 {
						continue
					}
					entry = rng.Int64N(counts[ledger])
				} else if entry >= counts[ledger] {
					ledger, entry = (ledger+int64(o.ReadOutstanding))%int64(len(counts)), 0
					continue
				}
				start := monotime.Now()
				out, err := eng.Read(ledger, entry, buf[:0])
				if err != nil {
					rec.Error()
				} else {
					rec.Record(time.Duration(monotime.Now()-start), len(out)-32)
				}
				entry++
			}
		})
	}
	rec.Measure(ctx, 0, o.ReadDuration, o.Progress)
	cancel()
	wg.Wait()
	return rec.Result("read-"+o.Read, o.config()), nil
}

func storageExtra(e *engine.Engine) map[string]float64 {
	s := e.Stats()
	extra := map[string]float64{
		"checkpoints":      float64(s.Checkpoints),
		"ledgers":          float64(e.Ledgers()),
		"throttled_adds":   float64(s.ThrottledAdds),
		"rejected_adds":    float64(s.RejectedAdds),
		"flushed_entries":  float64(s.FlushedEntries),
		"flush_mb_per_sec": 0,
	}
	if s.FlushSeconds > 0 {
		extra["flush_mb_per_sec"] = float64(s.FlushedBytes) / s.FlushSeconds / 1e6
	}
	return extra
}

// dropFromPageCache asks the kernel to drop the cached pages of every file under dir
// (posix_fadvise DONTNEED; the files were synced, so their pages are clean).
func dropFromPageCache(dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			return fmt.Errorf("bench: drop %s from the page cache: %w", path, err)
		}
		return nil
	})
}

// Sleep waits for d or until ctx is done.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
