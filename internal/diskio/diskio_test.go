package diskio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func mustWrite(t *testing.T, f File, p []byte, off int64) {
	t.Helper()
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatalf("write at %d: %v", off, err)
	}
}

func readAll(t *testing.T, fs FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return buf
}

func TestMemCrashKeepsOnlySyncedData(t *testing.T) {
	m := NewMem(512)
	if err := m.MkdirAll("/d"); err != nil {
		t.Fatal(err)
	}
	f, err := m.Create("/d/a", Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, []byte("synced"), 0)
	if err := f.SyncData(); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, []byte("-lost"), 6)

	// The directory entry was never synced: the file is gone after a crash.
	if c := m.Crash(CrashSyncedOnly, nil); len(mustList(t, c, "/d")) != 0 {
		t.Fatalf("unsynced directory entry survived: %v", mustList(t, c, "/d"))
	}
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, ErrCrashed) {
		t.Fatalf("write after crash: got %v, want ErrCrashed", err)
	}

	m = NewMem(512)
	_ = m.MkdirAll("/d")
	f, _ = m.Create("/d/a", Options{})
	mustWrite(t, f, []byte("synced"), 0)
	_ = f.SyncData()
	_ = m.SyncDir("/d")
	mustWrite(t, f, []byte("-lost"), 6)
	c := m.Crash(CrashSyncedOnly, nil)
	if got := readAll(t, c, "/d/a"); string(got) != "synced" {
		t.Fatalf("after crash got %q, want %q", got, "synced")
	}
}

func mustList(t *testing.T, fs FS, dir string) []string {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestMemCrashPrefixAndSubsetOnlyAddUnsyncedBytes(t *testing.T) {
	for _, mode := range []CrashMode{CrashPrefix, CrashSubset} {
		for seed := range uint64(50) {
			m := NewMem(512)
			_ = m.MkdirAll("/d")
			f, _ := m.Create("/d/a", Options{})
			base := bytes.Repeat([]byte{'s'}, 1024)
			mustWrite(t, f, base, 0)
			_ = f.SyncData()
			_ = m.SyncDir("/d")
			mustWrite(t, f, bytes.Repeat([]byte{'u'}, 2048), 1024)
			c := m.Crash(mode, rand.New(rand.NewPCG(seed, 1)))
			got := readAll(t, c, "/d/a")
			if !bytes.Equal(got[:1024], base) {
				t.Fatalf("mode %d seed %d: synced prefix damaged", mode, seed)
			}
			for i, b := range got[1024:] {
				if b != 'u' && b != 0 {
					t.Fatalf("mode %d seed %d: byte %d is %q: neither written nor zero", mode, seed, 1024+i, b)
				}
			}
		}
	}
}

func TestMemRenameAndRemoveNeedSyncDir(t *testing.T) {
	m := NewMem(0)
	_ = m.MkdirAll("/d")
	f, _ := m.Create("/d/tmp", Options{})
	mustWrite(t, f, []byte("v1"), 0)
	_ = f.Sync()
	_ = m.SyncDir("/d")
	if err := m.Rename("/d/tmp", "/d/final"); err != nil {
		t.Fatal(err)
	}
	if names := mustList(t, m.Crash(CrashSyncedOnly, nil), "/d"); len(names) != 1 || names[0] != "tmp" {
		t.Fatalf("rename without SyncDir survived a crash: %v", names)
	}
}

func TestMemInjectsNthFailure(t *testing.T) {
	m := NewMem(0)
	_ = m.MkdirAll("/d")
	f, _ := m.Create("/d/a", Options{})
	m.SetInjector(FailNth(OpSync, 1, unix.EIO))
	if err := f.SyncData(); err != nil {
		t.Fatalf("sync 0: %v", err)
	}
	if err := f.SyncData(); !errors.Is(err, unix.EIO) {
		t.Fatalf("sync 1: got %v, want EIO", err)
	}
	if err := f.SyncData(); err != nil {
		t.Fatalf("sync 2: %v", err)
	}
}

func TestMemDirectNeedsAlignment(t *testing.T) {
	m := NewMem(4096)
	_ = m.MkdirAll("/d")
	f, _ := m.Create("/d/a", Options{Direct: true})
	if _, err := f.WriteAt(make([]byte, 100), 0); !errors.Is(err, ErrMisaligned) {
		t.Fatalf("misaligned write: got %v", err)
	}
	if _, err := f.WriteAt(make([]byte, 4096), 4096); err != nil {
		t.Fatalf("aligned write: %v", err)
	}
}

func TestMemCapacityGivesENOSPC(t *testing.T) {
	m := NewMem(0)
	m.SetCapacity(100)
	_ = m.MkdirAll("/d")
	f, _ := m.Create("/d/a", Options{})
	mustWrite(t, f, make([]byte, 100), 0)
	if _, err := f.WriteAt([]byte{1}, 100); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("write past capacity: got %v, want ENOSPC", err)
	}
}

func TestOSDirectRoundTripAndWriteSyncer(t *testing.T) {
	dir := t.TempDir()
	fs := NewOS()
	align := fs.Alignment(dir)
	if align < 512 || align&(align-1) != 0 {
		t.Fatalf("alignment %d", align)
	}
	slab, err := NewSlab(64<<10, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer slab.Close()
	name := filepath.Join(dir, "f")
	f, err := fs.Create(name, Options{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fs.Create(name, Options{}); !errors.Is(err, ErrExist) {
		t.Fatalf("second create: got %v, want ErrExist", err)
	}
	if err := f.Allocate(0, 1<<20); err != nil {
		t.Fatal(err)
	}
	for _, engine := range []Engine{EnginePsync, EngineAuto} {
		ws, err := NewWriteSyncer(engine, 2, slab.Buffers())
		if err != nil {
			t.Fatal(err)
		}
		const n = 64
		// Completions come in any order, so a buffer is reused only after the completion of
		// the request that last used it; at most 2 requests are outstanding.
		pending := map[uint64]bool{}
		reap := func() {
			c := <-ws.Completions()
			if c.Err != nil {
				t.Fatal(c.Err)
			}
			if !pending[c.ID] {
				t.Fatalf("%v: completion for %d, which is not outstanding", engine, c.ID)
			}
			delete(pending, c.ID)
		}
		for i := range n {
			for i >= 2 && pending[uint64(i-2)] {
				reap()
			}
			if len(pending) > ws.Depth() {
				t.Fatalf("%d outstanding, depth %d", len(pending), ws.Depth())
			}
			buf := slab.Buffer(i % 2)[:align*4]
			for j := range buf {
				buf[j] = byte(i)
			}
			pending[uint64(i)] = true
			if err := ws.Submit(WriteRequest{File: f, Buf: buf, BufIndex: i % 2, Offset: int64(i * len(buf)), Sync: SyncMode(1 + i%2), ID: uint64(i)}); err != nil {
				t.Fatal(err)
			}
		}
		for len(pending) > 0 {
			reap()
		}
		if err := ws.Close(); err != nil {
			t.Fatal(err)
		}
		rd := slab.Buffer(3)[:align*4]
		for i := range n {
			if _, err := f.ReadAt(rd, int64(i*len(rd))); err != nil {
				t.Fatal(err)
			}
			if rd[0] != byte(i) || rd[len(rd)-1] != byte(i) {
				t.Fatalf("%v: block %d holds %d", engine, i, rd[0])
			}
		}
	}
}

func TestParseEngine(t *testing.T) {
	for in, want := range map[string]Engine{"auto": EngineAuto, "io_uring": EngineIOUring, "psync": EnginePsync} {
		if got, err := ParseEngine(in); err != nil || got != want {
			t.Errorf("ParseEngine(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseEngine("aio"); err == nil {
		t.Error("ParseEngine(aio) did not fail")
	}
}

// TestOSConcurrentReadsThroughRing: many goroutines read a file at random offsets, buffered and
// O_DIRECT, through OS files (the shared io_uring reader where available); every byte must be
// the file's, a read past the end must say so, and the ring must have served them.
func TestOSConcurrentReadsThroughRing(t *testing.T) {
	dir := t.TempDir()
	fs := NewOS()
	align := int64(fs.Alignment(dir))
	const size = 4 << 20
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	name := filepath.Join(dir, "f")
	if err := os.WriteFile(name, want, 0o644); err != nil {
		t.Fatal(err)
	}
	slab, err := NewSlab(64<<10, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer slab.Close()
	for _, direct := range []bool{false, true} {
		f, err := fs.Open(name, Options{ReadOnly: true, Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for g := range 16 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 1))
				buf := slab.Buffer(g)
				for range 200 {
					n := int64(1+rng.IntN(16)) * align
					off := rng.Int64N((size-n)/align) * align
					if !direct {
						n, off = int64(1+rng.IntN(len(buf)-1)), rng.Int64N(size-int64(len(buf)))
					}
					got, err := f.ReadAt(buf[:n], off)
					if err != nil || !bytes.Equal(buf[:got], want[off:off+n]) {
						errs <- fmt.Errorf("direct=%v read %d at %d: %d bytes, %v, equal %v", direct, n, off, got, err, bytes.Equal(buf[:got], want[off:off+int64(got)]))
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(slab.Buffer(0)[:align], size); err == nil {
			t.Fatalf("direct=%v: a read past the end succeeded", direct)
		}
		f.Close()
	}
	if IOUringAvailable() == nil && readerFor() == nil {
		t.Fatal("io_uring is available but reads did not use it")
	}
	if r := readerFor(); r != nil {
		if n := r.woken.Load(); n != 0 {
			t.Fatalf("%d readers counted as woken with no read in flight", n)
		}
	}
}

// TestURingWriteSyncerFailedWrite: a write the kernel fails (here O_DIRECT at a misaligned
// offset) is reported once, with its own error, whether or not an fdatasync was linked to it
// (the linked sync is cancelled and must not produce a second completion); the syncer keeps
// serving the requests after it, and Close returns with nothing in flight.
func TestURingWriteSyncerFailedWrite(t *testing.T) {
	if err := IOUringAvailable(); err != nil {
		t.Skipf("io_uring unavailable: %v", err)
	}
	fs := NewOS()
	dir := t.TempDir()
	align := fs.Alignment(dir)
	f, err := fs.Create(filepath.Join(dir, "f"), Options{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	slab, err := NewSlab(4*align, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer slab.Close()
	ws, err := NewWriteSyncer(EngineIOUring, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := slab.Buffer(0)[:align]
	// A misaligned file offset: EINVAL with O_DIRECT on any device (a misaligned buffer is not,
	// where the device's DMA alignment is small and the alignment asked is the sector's).
	const badOffset = 1
	reqs := []WriteRequest{
		{File: f, Buf: good, BufIndex: -1, Offset: badOffset, Sync: SyncFile, ID: 1},
		{File: f, Buf: good, BufIndex: -1, Offset: badOffset, Sync: SyncWrite, ID: 2},
		{File: f, Buf: good, BufIndex: -1, Offset: 0, Sync: SyncFile, ID: 3},
	}
	for _, req := range reqs {
		if err := ws.Submit(req); err != nil {
			t.Fatal(err)
		}
		c := <-ws.Completions()
		if c.ID != req.ID {
			t.Fatalf("completion for %d, want %d", c.ID, req.ID)
		}
		if wantErr := req.ID != 3; (c.Err != nil) != wantErr || (wantErr && !errors.Is(c.Err, unix.EINVAL)) {
			t.Fatalf("request %d: completion error %v", req.ID, c.Err)
		}
		select {
		case extra := <-ws.Completions():
			t.Fatalf("a second completion after request %d: %+v", req.ID, extra)
		default:
		}
	}
	if err := ws.Submit(reqs[2]); err != nil {
		t.Fatal(err)
	}
	if err := ws.Close(); err != nil { // with the last request still in flight
		t.Fatal(err)
	}
	n := 0
	for c := range ws.Completions() {
		if c.Err != nil || c.ID != 3 {
			t.Fatalf("after Close: %+v", c)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d completions for the request in flight at Close, want 1", n)
	}
	if err := ws.Submit(reqs[2]); err == nil {
		t.Fatal("Submit after Close succeeded")
	}
}

// A directory is held by one Lock at a time, in this process as in another (an flock on its
// LOCK file), and is free again after unlock.
func TestLockHoldsADirectoryAlone(t *testing.T) {
	for name, fs := range map[string]FS{"os": NewOS(), "mem": NewMem(4096)} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "journal")
			unlock, err := fs.Lock(dir)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fs.Lock(dir + "/"); !errors.Is(err, ErrLocked) {
				t.Fatalf("second lock of %s: %v, want ErrLocked", dir, err)
			}
			if err := unlock(); err != nil {
				t.Fatal(err)
			}
			unlock, err = fs.Lock(dir)
			if err != nil {
				t.Fatalf("lock after unlock: %v", err)
			}
			unlock()
		})
	}
}

// A directory's alignment is what O_DIRECT files in it need: ext4 and XFS answer statx
// STATX_DIOALIGN only for files, and the fallback of 4096 for a directory made every direct
// write fail on a device with 8 KiB sectors. RINGKEEPER_LBS_DIR may name a directory on such a
// device (a loop device made with --sector-size 8192); otherwise it checks the same property
// on the test's own disk, where the file system reports an alignment at all.
func TestAlignmentOfADirectoryIsItsFiles(t *testing.T) {
	dir := t.TempDir()
	if base := os.Getenv("RINGKEEPER_LBS_DIR"); base != "" {
		d, err := os.MkdirTemp(base, "align")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	name := filepath.Join(dir, "f")
	if err := os.WriteFile(name, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	need, known := dioAlignment(unix.AT_FDCWD, name, 0)
	if !known {
		t.Skipf("the file system of %s does not report direct-I/O alignment", dir)
	}
	if got := NewOS().Alignment(dir); got != need {
		t.Fatalf("Alignment(%s) = %d, O_DIRECT files there need %d", dir, got, need)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("the probe left files behind: %v", entries)
	}
}

// Reads waiting for a slot of the shared io_uring reader when it breaks (a failed submission)
// fall back to pread at once: a broken ring never gives its slots back, and they waited for
// ever.
func TestBrokenURingReaderReleasesWaitingReads(t *testing.T) {
	if err := IOUringAvailable(); err != nil {
		t.Skipf("io_uring unavailable: %v", err)
	}
	r, err := newURingReader(1)
	if err != nil {
		t.Fatal(err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	holder := make(chan struct{})
	go func() {
		defer close(holder)
		r.pread(p[0], make([]byte, 1), 0) // holds the only slot until the pipe is written
	}()
	for len(r.free) != 0 {
		time.Sleep(time.Millisecond)
	}
	waiters := make(chan bool, 2)
	for range 2 {
		go func() {
			_, _, ok := r.pread(p[0], make([]byte, 1), 0)
			waiters <- ok
		}()
	}
	time.Sleep(20 * time.Millisecond) // both wait for the slot
	r.markBroken()
	for range 2 {
		select {
		case ok := <-waiters:
			if ok {
				t.Error("a read on a broken ring was taken by it")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a read waiting for a slot of the broken reader never returned")
		}
	}
	unix.Write(p[1], []byte{1})
	<-holder
}
