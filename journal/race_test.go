package journal

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// gcRaceFS lets a test hold journal GC's directory listing until a prepared file's reuse
// rename has happened.
type gcRaceFS struct {
	*diskio.Mem
	armed   atomic.Bool
	renamed chan struct{}
	once    sync.Once
}

func (f *gcRaceFS) List(dir string) ([]string, error) {
	names, err := f.Mem.List(dir)
	if f.armed.Load() {
		select {
		case <-f.renamed:
		case <-time.After(time.Second):
		}
		time.Sleep(20 * time.Millisecond) // let prepare finish its bookkeeping after the rename
	}
	return names, err
}

func (f *gcRaceFS) Rename(oldname, newname string) error {
	err := f.Mem.Rename(oldname, newname)
	if f.armed.Load() {
		f.once.Do(func() { close(f.renamed) })
	}
	return err
}

// appendUntilRoll appends 3 KB records until the journal moved to rolls more files; it
// returns the first error any of them got.
func appendUntilRoll(t *testing.T, j *Journal, rolls int, next *int64) error {
	t.Helper()
	start := j.LastLogMark().FileID
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	var switched int
	last := start
	for deadline := time.Now().Add(20 * time.Second); switched < rolls && time.Now().Before(deadline); {
		es := make([]*Entry, 32)
		for i := range es {
			wg.Add(1)
			*next++
			es[i] = &Entry{Type: RecordData, LedgerID: 9, EntryID: *next, Payload: make([]byte, 3000),
				Done: func(_ *Entry, err error) {
					if err != nil {
						firstErr.CompareAndSwap(nil, &err)
					}
					wg.Done()
				}}
		}
		if err := j.AppendBatch(es); err != nil {
			for range es {
				wg.Done()
			}
			return err
		}
		wg.Wait()
		if p := firstErr.Load(); p != nil {
			return *p
		}
		if id := j.LastLogMark().FileID; id != last {
			switched++
			last = id
		}
	}
	return nil
}

// TestGCRacingReuseRenameRecyclesAGhost: a journal GC whose listing was taken before a
// recycled file was renamed for reuse, and whose bookkeeping ran after, put the old (now
// nonexistent) id back in the recycle pool; the rollover that tries to reuse it fails the
// journal.
func TestGCRacingReuseRenameRecyclesAGhost(t *testing.T) {
	fs := &gcRaceFS{Mem: diskio.NewMem(4096), renamed: make(chan struct{})}
	cfg := memConfig(nil)
	cfg.FS = fs
	cfg.MaxFileSize = 1 << 20
	cfg.MaxBackups = 0
	cfg.MaxRecycled = 4
	cfg.ReuseFiles = true
	cfg.Prealloc = PreallocFallocate
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	var next int64
	if err := appendUntilRoll(t, j, 2, &next); err != nil {
		t.Fatal(err)
	}
	mark := j.LastLogMark()
	if err := j.GC(mark); err != nil { // the two old files go to the recycle pool
		t.Fatal(err)
	}
	fs.armed.Store(true)
	gcDone := make(chan error, 1)
	go func() { gcDone <- j.GC(mark) }()
	// The next rollover starts preparing a file that reuses a recycled one (a rename) while
	// the GC above holds its listing.
	if err := appendUntilRoll(t, j, 1, &next); err != nil {
		t.Fatal(err)
	}
	if err := <-gcDone; err != nil {
		t.Fatal(err)
	}
	fs.armed.Store(false)
	if err := appendUntilRoll(t, j, 4, &next); err != nil {
		t.Fatalf("appends after GC raced a reuse: %v", err)
	}
}

// delayFS holds the first data write (past the header) to the first file until a sync of it
// has completed, as a pwrite worker that was scheduled late would.
type delayFS struct {
	*diskio.Mem
	armed  atomic.Bool
	held   atomic.Bool
	synced chan struct{}
	once   sync.Once
}

type delayFile struct {
	diskio.File
	fs *delayFS
}

func (f *delayFS) Create(name string, opts diskio.Options) (diskio.File, error) {
	file, err := f.Mem.Create(name, opts)
	if err != nil {
		return nil, err
	}
	return &delayFile{File: file, fs: f}, nil
}

func (f *delayFile) WriteAt(p []byte, off int64) (int, error) {
	if off > 0 && f.fs.armed.Load() && f.fs.held.CompareAndSwap(false, true) {
		select {
		case <-f.fs.synced:
		case <-time.After(time.Second):
		}
	}
	return f.File.WriteAt(p, off)
}

func (f *delayFile) SyncData() error {
	err := f.File.SyncData()
	if f.fs.armed.Load() {
		f.fs.once.Do(func() { close(f.fs.synced) })
	}
	return err
}

// TestMarkNeverCoversAnUnsyncedGroup: with journalSyncData off, an unsynced group and the
// synced group after it are in flight together; the synced group's fdatasync can run before
// the unsynced group's write, yet the mark moves to the synced group's end, over a group that
// was never synced.
func TestMarkNeverCoversAnUnsyncedGroup(t *testing.T) {
	fs := &delayFS{Mem: diskio.NewMem(4096), synced: make(chan struct{})}
	cfg := memConfig(nil)
	cfg.FS = fs
	cfg.Prealloc = PreallocFallocate
	cfg.SyncData = false
	cfg.PageCacheFlushInterval = 200 * time.Millisecond
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	fs.armed.Store(true)
	first := j.LastLogMark()
	done1 := make(chan error, 1)
	// Group 1: unsynced (the flush interval has not passed); its write is held.
	if err := j.Append(&Entry{Type: RecordData, LedgerID: 1, EntryID: 0, Payload: testPayload(1, 0, 100),
		Done: func(_ *Entry, err error) { done1 <- err }}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond)
	// Group 2: synced (write + fdatasync), pipelined with group 1.
	if err := appendSync(t, j, RecordData, 1, 1, testPayload(1, 1, 100)); err != nil {
		t.Fatal(err)
	}
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	mark := j.LastLogMark()
	crashed := fs.Mem.Crash(diskio.CrashSyncedOnly, nil)
	data := fileBytes(t, crashed, j.FilePath(first.FileID))
	if mark.FileID == first.FileID && mark.Offset > first.Offset {
		if end := first.Offset + 4096; int64(len(data)) < end || isZero(data[first.Offset:end]) {
			t.Fatalf("mark %v covers the group at %d, which was never synced", mark, first.Offset)
		}
	}
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
