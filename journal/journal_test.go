package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// testPayload is the deterministic payload of (ledger, entry): replayed bytes can be checked
// without remembering them.
func testPayload(ledger, entry int64, size int) []byte {
	b := make([]byte, size)
	var seed [16]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(ledger))
	binary.LittleEndian.PutUint64(seed[8:], uint64(entry))
	for i := range b {
		b[i] = seed[i%16] ^ byte(i*31)
	}
	return b
}

func payloadSize(ledger, entry int64) int { return int((uint64(ledger)*7 + uint64(entry)*13) % 3000) }

// engines are the I/O engines to test on the real file system.
func engines(t *testing.T) []diskio.Engine {
	es := []diskio.Engine{diskio.EnginePsync}
	if diskio.IOUringAvailable() == nil {
		es = append(es, diskio.EngineIOUring)
	} else {
		t.Logf("io_uring unavailable, testing psync only: %v", diskio.IOUringAvailable())
	}
	return es
}

func memConfig(fs *diskio.Mem) Config {
	cfg := DefaultConfig("/j")
	cfg.FS = fs
	cfg.MaxRecordSize = 64 << 10
	cfg.BufferedWritesThreshold = 64 << 10
	cfg.MaxFileSize = 4 << 20
	return cfg
}

// appendSync appends one record and waits for its callback.
func appendSync(t testing.TB, j *Journal, typ RecordType, ledger, entry int64, payload []byte) error {
	t.Helper()
	done := make(chan error, 1)
	e := &Entry{Type: typ, LedgerID: ledger, EntryID: entry, Payload: payload, Done: func(_ *Entry, err error) { done <- err }}
	if err := j.Append(e); err != nil {
		return err
	}
	return <-done
}

type key struct{ ledger, entry int64 }

// writeConcurrently appends count records per writer from several goroutines and returns the
// keys acknowledged, checking that each writer's callbacks arrive in its order.
func writeConcurrently(t *testing.T, j *Journal, writers, count int) []key {
	t.Helper()
	var mu sync.Mutex
	var acked []key
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			ledger := int64(w + 1)
			var next int64
			var inner sync.WaitGroup
			for i := range count {
				entry := int64(i)
				inner.Add(1)
				e := &Entry{Type: RecordData, LedgerID: ledger, EntryID: entry, Payload: testPayload(ledger, entry, payloadSize(ledger, entry)),
					Done: func(e *Entry, err error) {
						defer inner.Done()
						if err != nil {
							t.Errorf("append %d/%d: %v", ledger, entry, err)
							return
						}
						if e.EntryID != next {
							t.Errorf("ledger %d: callback for %d, expected %d", ledger, e.EntryID, next)
						}
						next++
						mu.Lock()
						acked = append(acked, key{ledger, entry})
						mu.Unlock()
					}}
				if err := j.Append(e); err != nil {
					t.Errorf("append: %v", err)
					inner.Done()
				}
			}
			inner.Wait()
		})
	}
	wg.Wait()
	return acked
}

// replayAll replays dir from mark and returns the data records, checking their payloads.
func replayAll(t *testing.T, fs diskio.FS, dir string, from Mark) (map[key]int, ReplayResult, error) {
	t.Helper()
	seen := make(map[key]int)
	res, err := Replay(context.Background(), ReplayOptions{FS: fs, Dir: dir, From: from, Truncate: true}, func(r *Record) error {
		if r.Type != RecordData {
			return nil
		}
		k := key{r.LedgerID, r.EntryID}
		if want := testPayload(k.ledger, k.entry, payloadSize(k.ledger, k.entry)); !bytes.Equal(r.Payload, want) {
			t.Errorf("record %v: payload differs", k)
		}
		seen[k]++
		return nil
	})
	return seen, res, err
}

func TestAppendReplayOnBothEngines(t *testing.T) {
	for _, engine := range engines(t) {
		t.Run(engine.String(), func(t *testing.T) {
			dir := t.TempDir()
			cfg := DefaultConfig(dir)
			cfg.Engine = engine
			cfg.MaxFileSize = 16 << 20
			j, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if j.Engine() != engine {
				t.Fatalf("engine %v, want %v", j.Engine(), engine)
			}
			acked := writeConcurrently(t, j, 8, 300)
			mark := j.LastLogMark()
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			if mark.FileID == 0 || mark.Offset <= 4096 {
				t.Fatalf("mark did not advance: %v", mark)
			}
			seen, res, err := replayAll(t, diskio.NewOS(), dir, Mark{})
			if err != nil {
				t.Fatal(err)
			}
			if len(seen) != len(acked) || res.Records != len(acked) {
				t.Fatalf("replayed %d distinct (%d records), acknowledged %d", len(seen), res.Records, len(acked))
			}
			for _, k := range acked {
				if seen[k] != 1 {
					t.Fatalf("record %v replayed %d times", k, seen[k])
				}
			}
		})
	}
}

func TestRolloverGCAndReuse(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	cfg.MaxBackups = 1
	cfg.MaxRecycled = 1
	// 6000 records of 1.5 KB on average are ~9 MiB: at least 8 files of 1 MiB however the
	// records are grouped (with 4 MiB files the fourth file came only from padding).
	cfg.MaxFileSize = 1 << 20
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	acked := writeConcurrently(t, j, 4, 1500)
	files, _ := fs.List(cfg.Dir)
	if len(files) < 8 {
		t.Fatalf("expected several files after %d records, got %v", len(acked), files)
	}
	// Everything replays across the file boundaries.
	seen, _, err := replayAll(t, fs, cfg.Dir, Mark{})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(acked) {
		t.Fatalf("replayed %d of %d", len(seen), len(acked))
	}
	mark := j.LastLogMark()
	if err := j.GC(mark); err != nil {
		t.Fatal(err)
	}
	after, _ := fs.List(cfg.Dir)
	ids := listFileIDs(after)
	var below int
	for _, id := range ids {
		if id < mark.FileID {
			below++
		}
	}
	// MaxBackups plus the one kept for reuse.
	if below != 2 {
		t.Fatalf("after GC at %v: %d files below the mark (%v), want 2", mark, below, after)
	}
	// Write more: the recycled file is reused for a later file.
	writeConcurrently(t, j, 2, 1500)
	if j.Stats().FilesReused.Load() == 0 {
		t.Fatalf("no file was reused")
	}
	m2 := j.LastLogMark()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	// Replay from the old mark sees only what came after it, and stale bytes of the reused
	// file are never returned (replayAll checks every payload).
	if _, _, err := replayAll(t, fs, cfg.Dir, mark); err != nil {
		t.Fatal(err)
	}
	if m2.Compare(mark) <= 0 {
		t.Fatalf("mark went from %v to %v", mark, m2)
	}
}

func TestReplayFromMarkSkipsEarlierRecords(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(10) {
		if err := appendSync(t, j, RecordData, 1, i, testPayload(1, i, payloadSize(1, i))); err != nil {
			t.Fatal(err)
		}
	}
	mark := j.LastLogMark()
	for i := int64(10); i < 15; i++ {
		if err := appendSync(t, j, RecordData, 1, i, testPayload(1, i, payloadSize(1, i))); err != nil {
			t.Fatal(err)
		}
	}
	j.Close()
	seen, _, err := replayAll(t, fs, cfg.Dir, mark)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 5 || seen[key{1, 10}] != 1 || seen[key{1, 9}] != 0 {
		t.Fatalf("replay from %v saw %v", mark, seen)
	}
	// A mark that points into a missing file is an error.
	_, _, err = replayAll(t, fs, cfg.Dir, Mark{FileID: mark.FileID + 100, Offset: 4096})
	if !errors.Is(err, ErrMissingFile) {
		t.Fatalf("missing mark file: got %v", err)
	}
}

func TestMetaRecordsReplay(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{
		{Type: RecordLedgerKey, LedgerID: 5, EntryID: 0, Payload: []byte("master-key-20-bytes!")},
		{Type: RecordFence, LedgerID: 5, EntryID: -1},
		{Type: RecordExplicitLAC, LedgerID: 5, EntryID: 0, Payload: []byte{1, 2, 3}},
	}
	for _, r := range want {
		if err := appendSync(t, j, r.Type, r.LedgerID, r.EntryID, r.Payload); err != nil {
			t.Fatal(err)
		}
	}
	j.Close()
	var got []Record
	_, err = Replay(context.Background(), ReplayOptions{FS: fs, Dir: cfg.Dir}, func(r *Record) error {
		got = append(got, Record{Type: r.Type, LedgerID: r.LedgerID, EntryID: r.EntryID, Payload: bytes.Clone(r.Payload)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d records", len(got))
	}
	for i := range want {
		if got[i].Type != want[i].Type || got[i].LedgerID != want[i].LedgerID || got[i].EntryID != want[i].EntryID || !bytes.Equal(got[i].Payload, want[i].Payload) && len(want[i].Payload) > 0 {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// journalFiles returns the paths of the journal files in dir, ascending.
func journalFiles(t *testing.T, fs diskio.FS, dir string) []string {
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, id := range listFileIDs(names) {
		out = append(out, filepath.Join(dir, FileName(id)))
	}
	return out
}

func fileBytes(t *testing.T, fs diskio.FS, path string) []byte {
	t.Helper()
	b, err := diskio.ReadFile(fs, path, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// memWithFile returns a Mem FS holding the given journal files.
func memWithFiles(t *testing.T, dir string, files map[string][]byte) *diskio.Mem {
	t.Helper()
	fs := diskio.NewMem(4096)
	fs.MkdirAll(dir)
	for path, data := range files {
		f, err := fs.Create(path, diskio.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return fs
}

// writeSequential writes n records one group each and returns the file content and the offset
// of every record.
func writeSequential(t *testing.T, n int) (string, []byte, []int64) {
	t.Helper()
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(n) {
		if err := appendSync(t, j, RecordData, 1, i, testPayload(1, i, payloadSize(1, i))); err != nil {
			t.Fatal(err)
		}
	}
	j.Close()
	paths := journalFiles(t, fs, cfg.Dir)
	var offsets []int64
	_, err = Replay(context.Background(), ReplayOptions{FS: fs, Dir: cfg.Dir}, func(r *Record) error {
		offsets = append(offsets, r.Offset)
		return nil
	})
	if err != nil || len(offsets) != n {
		t.Fatalf("replay: %v, %d records", err, len(offsets))
	}
	// The first file holds everything (the second is the one prepared ahead).
	return paths[0], fileBytes(t, fs, paths[0]), offsets
}

func TestBitFlipInTheMiddleIsCorruption(t *testing.T) {
	path, data, offsets := writeSequential(t, 40)
	target := offsets[10] + recordHeaderSize + 3 // a payload byte of record 10
	bad := bytes.Clone(data)
	bad[target] ^= 0x10
	fs := memWithFiles(t, filepath.Dir(path), map[string][]byte{path: bad})
	_, _, err := replayAll(t, fs, filepath.Dir(path), Mark{})
	if !errors.Is(err, ErrCorruption) {
		t.Fatalf("got %v, want ErrCorruption", err)
	}
	if want := fmt.Sprintf("offset %d", offsets[10]); !bytes.Contains([]byte(err.Error()), []byte(want)) || !bytes.Contains([]byte(err.Error()), []byte(path)) {
		t.Fatalf("error %q does not name %s and %s", err, path, want)
	}
	// With the override, replay skips the damaged record and goes on.
	var n int
	_, err = Replay(context.Background(), ReplayOptions{FS: fs, Dir: filepath.Dir(path), SkipInvalidRecords: true}, func(r *Record) error {
		n++
		return nil
	})
	if err != nil || n != 39 {
		t.Fatalf("skip mode: %v, %d records", err, n)
	}
}

func TestFsyncFailureIsStickyAndNeverAcknowledged(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := appendSync(t, j, RecordData, 1, 0, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	fs.SetInjector(func(op diskio.Op) error {
		if op.Kind == diskio.OpSync {
			return unix.EIO
		}
		return nil
	})
	err = appendSync(t, j, RecordData, 1, 1, []byte("fails"))
	if !errors.Is(err, unix.EIO) {
		t.Fatalf("append with failing fsync: got %v, want EIO", err)
	}
	fs.SetInjector(nil)
	// Sticky: later appends fail with the same error even though fsync works again.
	for i := int64(2); i < 5; i++ {
		if err := appendSync(t, j, RecordData, 1, i, []byte("later")); !errors.Is(err, unix.EIO) {
			t.Fatalf("append %d after failure: got %v, want the sticky EIO", i, err)
		}
	}
	if err := j.Close(); !errors.Is(err, unix.EIO) {
		t.Fatalf("Close: got %v", err)
	}
}

func TestWriteFailureFailsPendingRecords(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	failed := false
	current := j.FilePath(j.LastLogMark().FileID)
	fs.SetInjector(func(op diskio.Op) error {
		if op.Kind == diskio.OpWrite && op.Name == current && !failed {
			failed = true
			return unix.ENOSPC
		}
		return nil
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i := range 50 {
		wg.Add(1)
		e := &Entry{Type: RecordData, LedgerID: 1, EntryID: int64(i), Payload: []byte("x"), Done: func(_ *Entry, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			wg.Done()
		}}
		if err := j.Append(e); err != nil {
			wg.Done() // refused at once: the journal had already failed
		}
	}
	wg.Wait()
	// Callbacks run in journal order. The failed write may belong to a later group than one
	// whose write (pipelined with it) succeeded afterwards, so a prefix may be acknowledged;
	// after the first failure, nothing may be.
	failedAt := -1
	for i, err := range errs {
		switch {
		case err != nil && failedAt < 0:
			failedAt = i
		case err == nil && failedAt >= 0:
			t.Fatalf("record %d acknowledged after record %d failed: %v", i, failedAt, errs[failedAt])
		}
	}
	if failedAt < 0 {
		t.Fatal("every record was acknowledged although a write failed")
	}
	j.Close()
}

func TestCloseFlushesQueuedRecords(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var acked sync.WaitGroup
	for i := range 100 {
		acked.Add(1)
		e := &Entry{Type: RecordData, LedgerID: 2, EntryID: int64(i), Payload: testPayload(2, int64(i), payloadSize(2, int64(i))),
			Done: func(_ *Entry, err error) {
				if err != nil {
					t.Errorf("record failed on close: %v", err)
				}
				acked.Done()
			}}
		if err := j.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	acked.Wait()
	if err := j.Append(&Entry{Type: RecordData, Done: func(*Entry, error) {}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	seen, _, err := replayAll(t, fs, cfg.Dir, Mark{})
	if err != nil || len(seen) != 100 {
		t.Fatalf("replay: %v, %d", err, len(seen))
	}
}

func TestRecordTooLarge(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	err = j.Append(&Entry{Type: RecordData, Payload: make([]byte, cfg.MaxRecordSize+1), Done: func(*Entry, error) {}})
	if !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("got %v", err)
	}
	// The largest allowed record fits in a group.
	if err := appendSync(t, j, RecordData, 1, 0, make([]byte, cfg.MaxRecordSize)); err != nil {
		t.Fatal(err)
	}
}

func TestMarkStore(t *testing.T) {
	fs := diskio.NewMem(0)
	dirs := []string{"/l1", "/l2"}
	for _, d := range dirs {
		fs.MkdirAll(d)
	}
	s := NewMarkStore(fs, dirs, MarkFileName(0, 1))
	if m, err := s.Load(); err != nil || m != (Mark{}) {
		t.Fatalf("empty load: %v %v", m, err)
	}
	m1 := Mark{FileID: 5, Offset: 8192}
	if got, err := s.Persist(m1); err != nil || got != m1 {
		t.Fatal(got, err)
	}
	// Never backwards.
	if got, err := s.Persist(Mark{FileID: 5, Offset: 4096}); err != nil || got != m1 {
		t.Fatalf("backwards persist returned %v, %v", got, err)
	}
	// Crash: the persisted mark survives; a fresh store reads the maximum over dirs.
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	diskio.WriteFileAtomic(crashed, "/l2/lastMark", encodeMark(Mark{FileID: 6, Offset: 4096}))
	s2 := NewMarkStore(crashed, dirs, "lastMark")
	if m, err := s2.Load(); err != nil || m != (Mark{FileID: 6, Offset: 4096}) {
		t.Fatalf("load after crash: %v %v", m, err)
	}
	// A corrupt mark file is an error, not silently an older mark.
	diskio.WriteFileAtomic(crashed, "/l1/lastMark", []byte("garbage"))
	if _, err := s2.Load(); !errors.Is(err, ErrBadMark) {
		t.Fatalf("corrupt mark: got %v", err)
	}
	if MarkFileName(2, 3) != "lastMark.2" {
		t.Fatal(MarkFileName(2, 3))
	}
}

func TestConfigValidate(t *testing.T) {
	base := DefaultConfig("/j")
	cases := map[string]func(c *Config){
		"no dir":         func(c *Config) { c.Dir = "" },
		"alignment":      func(c *Config) { c.Alignment = 1000 },
		"queue":          func(c *Config) { c.QueueSize = 0 },
		"depth":          func(c *Config) { c.PipelineDepth = 0 },
		"threshold":      func(c *Config) { c.BufferedWritesThreshold = 0 },
		"file too small": func(c *Config) { c.MaxFileSize = 1 << 20 },
		"wait":           func(c *Config) { c.MaxGroupWait = -1 },
	}
	for name, mutate := range cases {
		c := base
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	c := base
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	_ = slices.Clone([]int{})
}

// countingFS counts the bytes written to each file.
type countingFS struct {
	diskio.FS
	mu      sync.Mutex
	written map[string]int64
}

type countingFile struct {
	diskio.File
	fs *countingFS
}

func (c *countingFS) Create(name string, opts diskio.Options) (diskio.File, error) {
	f, err := c.FS.Create(name, opts)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, fs: c}, nil
}

func (f *countingFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	f.fs.written[f.Name()] += int64(len(p))
	f.fs.mu.Unlock()
	return f.File.WriteAt(p, off)
}

// TestZeroFillPreallocation: with PreallocZero, a new file prepared ahead is zero-filled over
// its whole size while the writer does not need it, but the session's first file (which Open
// waits for) only over its first firstFileZeroFill bytes; with PreallocFallocate nothing is
// zero-filled.
func TestZeroFillPreallocation(t *testing.T) {
	defer func(old int64) { firstFileZeroFill = old }(firstFileZeroFill)
	firstFileZeroFill = 1 << 20
	for _, mode := range []PreallocMode{PreallocZero, PreallocFallocate} {
		fs := &countingFS{FS: diskio.NewMem(4096), written: map[string]int64{}}
		cfg := memConfig(nil)
		cfg.FS = fs
		cfg.Prealloc = mode
		j, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		written := func() []int64 {
			fs.mu.Lock()
			defer fs.mu.Unlock()
			var n []int64
			for _, name := range slices.Sorted(maps.Keys(fs.written)) {
				n = append(n, fs.written[name])
			}
			return n
		}
		// Close stops a zero-fill in progress: wait for the second file's (4 MiB at 128 MiB/s).
		for deadline := time.Now().Add(10 * time.Second); mode == PreallocZero && time.Now().Before(deadline); {
			if n := written(); len(n) == 2 && n[1] >= cfg.MaxFileSize {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		n := written()
		if len(n) != 2 {
			t.Fatalf("%v: %d files written, want the first and the one prepared after it", mode, len(n))
		}
		first, second := n[0], n[1]
		header := int64(cfg.Alignment)
		switch mode {
		case PreallocZero:
			if first < firstFileZeroFill || first > firstFileZeroFill+4*header {
				t.Fatalf("zero: first file got %d bytes written, want about %d", first, firstFileZeroFill)
			}
			if second < cfg.MaxFileSize {
				t.Fatalf("zero: second file got %d bytes written, want at least %d", second, cfg.MaxFileSize)
			}
		case PreallocFallocate:
			if first > 4*header || second > 4*header {
				t.Fatalf("fallocate: %d and %d bytes written, want headers only", first, second)
			}
		}
	}
}

// TestZeroFillStopsForTheWriter: a writer that rolls over to a file still being zero-filled
// (slowly here) takes it at once, with the rest fallocated, and no zero lands on its records:
// all of them replay.
func TestZeroFillStopsForTheWriter(t *testing.T) {
	defer func(old float64) { zeroFillRate = old }(zeroFillRate)
	zeroFillRate = 64 << 10 // a 4 MiB file would take 64 s
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	cfg.Prealloc = PreallocZero
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var want []key
	start := time.Now()
	for size, e := 0, int64(0); size < 12<<20; e++ { // three rollovers
		n := payloadSize(1, e)
		if err := appendSync(t, j, RecordData, 1, e, testPayload(1, e, n)); err != nil {
			t.Fatal(err)
		}
		want = append(want, key{1, e})
		size += n + 64
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if files := journalFiles(t, fs, cfg.Dir); len(files) < 4 {
		t.Fatalf("%d files, want the records to span at least three rollovers", len(files))
	}
	if d := time.Since(start); d > 30*time.Second { // waiting would take 64 s per file
		t.Fatalf("the writer waited for zero-fills (%v)", d)
	}
	got, _, err := replayAll(t, fs, cfg.Dir, Mark{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range want {
		if got[k] != 1 {
			t.Fatalf("record %v lost", k)
		}
	}
}

// TestSetPayloadCRCHoldsForOneAppend: a CRC given with SetPayloadCRC is used (a wrong one is
// caught at replay: a record that fails its check ends the readable journal), and it does not
// stick to a pooled Entry reused for another payload.
func TestSetPayloadCRCHoldsForOneAppend(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	e := &Entry{Type: RecordData, Done: func(_ *Entry, err error) { done <- err }}
	for i := range int64(3) {
		e.LedgerID, e.EntryID, e.Payload = 1, i, testPayload(1, i, payloadSize(1, i))
		if i == 0 {
			e.SetPayloadCRC(payloadChecksum(e.Payload)) // given, right
		} // later appends reuse e without it: Append computes theirs
		if err := j.Append(e); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	e.LedgerID, e.EntryID, e.Payload = 1, 3, testPayload(1, 3, payloadSize(1, 3))
	e.SetPayloadCRC(payloadChecksum(e.Payload) + 1) // given, wrong
	if err := j.Append(e); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	j.Close()
	seen, _, err := replayAll(t, fs, cfg.Dir, Mark{})
	for i := range int64(3) {
		if seen[key{1, i}] != 1 {
			t.Errorf("entry %d replayed %d times, want once (err %v)", i, seen[key{1, i}], err)
		}
	}
	if seen[key{1, 3}] != 0 {
		t.Errorf("the record with a wrong CRC replayed")
	}
}

// TestGroupStatsAttributeTheWait: OnGroup reports where each group's oldest record waited, after
// the group's callbacks. With one pipeline slot and groups that hold one record each, a slow
// first write shows as that group's Sync, as the second group's GroupWait (it waits for the
// slot) and as the third record's QueueWait (the second group is full, so the writer leaves it
// queued); a slow first callback shows as the second group's CallbackDelay.
func TestGroupStatsAttributeTheWait(t *testing.T) {
	const slow = 40 * time.Millisecond
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	cfg.PipelineDepth = 1
	cfg.BufferedWritesThreshold = 1 // a group is full with one record...
	const size = 40 << 10           // ...and has no room for a second (capacity 72 KiB)
	var mu sync.Mutex
	var stats []GroupStats
	calledBack, reported := 0, 0
	cfg.OnGroup = func(g GroupStats) {
		mu.Lock()
		defer mu.Unlock()
		if reported += g.Records; reported > calledBack {
			t.Errorf("group of %d reported before its callbacks (%d reported, %d called back)", g.Records, reported, calledBack)
		}
		stats = append(stats, g)
	}
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	first := journalFiles(t, fs, cfg.Dir)[0]
	started := make(chan struct{})
	var once sync.Once
	fs.SetInjector(func(op diskio.Op) error {
		if op.Kind == diskio.OpWrite && op.Name == first {
			once.Do(func() { close(started); time.Sleep(slow) }) // only the first group's write
		}
		return nil
	})
	var acked sync.WaitGroup
	appendOne := func(entry int64) {
		acked.Add(1)
		e := &Entry{Type: RecordData, LedgerID: 1, EntryID: entry, Payload: testPayload(1, entry, size),
			Done: func(_ *Entry, err error) {
				if err != nil {
					t.Errorf("entry %d: %v", entry, err)
				}
				if entry == 0 { // a slow callback, while the next group is durable, delays its callbacks
					for deadline := time.Now().Add(10 * time.Second); j.Stats().Syncs.Load() < 2 && time.Now().Before(deadline); {
						time.Sleep(time.Millisecond)
					}
					time.Sleep(slow / 4)
				}
				mu.Lock()
				calledBack++
				mu.Unlock()
				acked.Done()
			}}
		if err := j.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	appendOne(0)
	<-started // the first group is being written, for `slow`
	appendOne(1)
	time.Sleep(slow / 8) // let the writer take record 1 into the second group
	appendOne(2)
	acked.Wait()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stats) != 3 {
		t.Fatalf("%d groups reported, want 3: %+v", len(stats), stats)
	}
	for i, g := range stats {
		if g.Records != 1 || g.Bytes <= size || g.QueueWait < 0 || g.GroupWait < 0 || g.Sync < 0 || g.CallbackDelay < 0 {
			t.Errorf("group %d: %+v", i, g)
		}
	}
	if stats[0].Sync < slow {
		t.Errorf("first group's sync %v, its write took at least %v", stats[0].Sync, slow)
	}
	if min := slow / 4; stats[1].GroupWait < min || stats[2].QueueWait < min {
		t.Errorf("second group waited %v for the slot, third record %v in the queue: want both at least %v", stats[1].GroupWait, stats[2].QueueWait, min)
	}
	if min := slow / 4; stats[1].CallbackDelay < min {
		t.Errorf("second group's callbacks began %v after it was durable, want at least %v (the first group's callback slept that long after it)", stats[1].CallbackDelay, min)
	}
}

// Where the file system does not support fallocate (EOPNOTSUPP: ext3, some network file
// systems), the journal opens and works without it, in every preallocation mode, across
// roll-overs, and replays what it acknowledged; it used to refuse to open.
func TestJournalWithoutFallocate(t *testing.T) {
	for _, mode := range []PreallocMode{PreallocZero, PreallocFallocate} {
		t.Run(mode.String(), func(t *testing.T) {
			fs := diskio.NewMem(4096)
			fs.SetInjector(func(op diskio.Op) error {
				if op.Kind == diskio.OpAllocate {
					return fmt.Errorf("fallocate: %w", unix.EOPNOTSUPP)
				}
				return nil
			})
			cfg := memConfig(fs)
			cfg.Prealloc = mode
			cfg.MaxFileSize = 1 << 20
			j, err := Open(cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			payload := make([]byte, 16<<10)
			const n = 200 // about 3 MiB: several roll-overs
			for i := range int64(n) {
				if err := appendSync(t, j, RecordData, 1, i, payload); err != nil {
					t.Fatalf("append %d: %v", i, err)
				}
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			if got := countDataRecords(t, fs, cfg.Dir); got != n {
				t.Fatalf("replayed %d records, want %d", got, n)
			}
		})
	}
}

// A CRC given with SetPayloadCRC holds for the next Append only, even one that is refused: an
// Entry reused after a refusal (the engine pools them) must not carry it to another payload.
// It did, and the next record was journaled and acknowledged with the stale CRC, then taken
// for a torn tail at replay, with every acknowledged record after it.
func TestRefusedAppendDropsTheGivenCRC(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &Entry{Type: RecordData, LedgerID: 1, EntryID: 0, Payload: make([]byte, cfg.MaxRecordSize+1)}
	e.SetPayloadCRC(0xdeadbeef)
	if err := j.Append(e); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("oversized append: %v", err)
	}
	done := make(chan error, 1)
	e.Payload, e.Done = []byte("the next payload"), func(_ *Entry, err error) { done <- err }
	if err := j.Append(e); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := appendSync(t, j, RecordData, 1, 1, []byte("after it")); err != nil {
		t.Fatal(err)
	}
	j.Close()
	if got := countDataRecords(t, fs, cfg.Dir); got != 2 {
		t.Fatalf("replayed %d acknowledged records, want 2", got)
	}
}

// countDataRecords replays dir from its start and counts the data records.
func countDataRecords(t *testing.T, fs diskio.FS, dir string) int {
	t.Helper()
	n := 0
	if _, err := Replay(context.Background(), ReplayOptions{FS: fs, Dir: dir}, func(r *Record) error {
		if r.Type == RecordData {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMisdirectedBlockIsCorruption: a 4 KiB block of the middle of a journal file that holds
// another block of the same file (a misdirected or lost write) is CRC-valid record by record,
// but its group is out of sequence: replay must call it corruption, naming the file, and not
// replay the copied entry in place of the one that block held (silent loss).
func TestMisdirectedBlockIsCorruption(t *testing.T) {
	path, data, offsets := writeSequential(t, 40)
	for _, c := range []struct {
		name     string
		from, to int
	}{
		{"an earlier block over a later one", 5, 20},
		{"a later block over an earlier one", 30, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			const block = 4096
			from, to := offsets[c.from], offsets[c.to]
			if from%block != 0 || to%block != 0 || offsets[c.to+1]-to != block {
				t.Fatalf("records are not one block each: %v", offsets)
			}
			bad := bytes.Clone(data)
			copy(bad[to:to+block], data[from:from+block])
			fs := memWithFiles(t, filepath.Dir(path), map[string][]byte{path: bad})
			seen, _, err := replayAll(t, fs, filepath.Dir(path), Mark{})
			if !errors.Is(err, ErrCorruption) {
				t.Fatalf("got %v (replayed %d records, entry %d %d times), want ErrCorruption", err, len(seen), c.to, seen[key{1, int64(c.to)}])
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name %s", err, path)
			}
		})
	}
}

// TestTornTailInTheLastThreeRecords cuts or zero-fills the file at every offset of its last
// three records, and appends junk after an intact tail: replay keeps every record before the
// cut, byte for byte (replayAll checks), never returns the torn one, and truncates there.
func TestTornTailInTheLastThreeRecords(t *testing.T) {
	const n = 8
	path, data, offsets := writeSequential(t, n)
	end := func(i int) int64 { return offsets[i] + int64(recordHeaderSize+payloadSize(1, int64(i))) }
	for i := n - 3; i < n; i++ {
		for cut := offsets[i]; cut < end(i); cut++ {
			for _, zeroFill := range []bool{false, true} {
				torn := bytes.Clone(data[:cut])
				if zeroFill {
					torn = append(torn, make([]byte, len(data)-int(cut))...)
				}
				fs := memWithFiles(t, filepath.Dir(path), map[string][]byte{path: torn})
				seen, res, err := replayAll(t, fs, filepath.Dir(path), Mark{})
				if err != nil {
					t.Fatalf("record %d cut at %d (zero fill %v): %v", i, cut, zeroFill, err)
				}
				if len(seen) != i || seen[key{1, int64(i)}] != 0 {
					t.Fatalf("record %d cut at %d (zero fill %v): replayed %v", i, cut, zeroFill, seen)
				}
				if res.TornOffset != offsets[i] {
					t.Fatalf("record %d cut at %d: torn offset %d, want %d", i, cut, res.TornOffset, offsets[i])
				}
				// The torn tail was truncated: a second replay sees a clean end at the same place.
				if got := fileBytes(t, fs, path); int64(len(got)) != offsets[i] {
					t.Fatalf("record %d cut at %d: file is %d bytes after replay, want %d", i, cut, len(got), offsets[i])
				}
			}
		}
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("junk seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	tail := offsets[n-1] + 4096 // the end of the last group (one block per record)
	for round := range 50 {
		junk := make([]byte, 1+rng.IntN(3*4096))
		for k := range junk {
			junk[k] = byte(rng.Uint32())
		}
		fs := memWithFiles(t, filepath.Dir(path), map[string][]byte{path: append(bytes.Clone(data[:tail]), junk...)})
		seen, _, err := replayAll(t, fs, filepath.Dir(path), Mark{})
		if err != nil || len(seen) != n {
			t.Fatalf("round %d: %d junk bytes after the tail: %v, replayed %d of %d", round, len(junk), err, len(seen), n)
		}
	}
}

// TestMissingFileAfterACleanEndIsAnError: a file that rolled over ends with a file-end record
// naming the next file, which was prepared (and its directory entry synced) before that record
// was written. A journal in which that file is gone lost the records it held: replay must say
// so (ErrMissingFile, naming it), whether later files are there or not, not skip from one file
// to the next (it replayed what was left without an error).
func TestMissingFileAfterACleanEndIsAnError(t *testing.T) {
	for _, c := range []struct {
		name   string
		remove func(ids []uint64) []uint64
	}{
		{"middle", func(ids []uint64) []uint64 { return ids[1:2] }},
		{"all after the first", func(ids []uint64) []uint64 { return ids[1:] }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := diskio.NewMem(4096)
			cfg := memConfig(fs)
			cfg.MaxFileSize = 1 << 20
			j, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			acked := writeConcurrently(t, j, 2, 1500)
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			names, _ := fs.List(cfg.Dir)
			ids := listFileIDs(names)
			if len(ids) < 4 {
				t.Fatalf("expected several files, got %v", names)
			}
			from := Mark{FileID: ids[0], Offset: int64(cfg.Alignment)}
			if seen, _, err := replayAll(t, fs, cfg.Dir, from); err != nil || len(seen) != len(acked) {
				t.Fatalf("before the removal: replayed %d of %d, err %v", len(seen), len(acked), err)
			}
			removed := c.remove(ids)
			for _, id := range removed {
				if err := fs.Remove(filepath.Join(cfg.Dir, FileName(id))); err != nil {
					t.Fatal(err)
				}
			}
			seen, _, err := replayAll(t, fs, cfg.Dir, from)
			if !errors.Is(err, ErrMissingFile) {
				t.Fatalf("replay without %s: replayed %d of %d acknowledged records, err %v; want ErrMissingFile",
					FileName(removed[0]), len(seen), len(acked), err)
			}
			if !strings.Contains(err.Error(), FileName(removed[0])) {
				t.Errorf("the error does not name the missing file %s: %v", FileName(removed[0]), err)
			}
		})
	}
}
