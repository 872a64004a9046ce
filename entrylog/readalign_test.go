package entrylog

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// readCountingFS records the length of every read from a file it opened.
type readCountingFS struct {
	*diskio.Mem
	mu    sync.Mutex
	reads []int
}

func (fs *readCountingFS) Open(name string, opts diskio.Options) (diskio.File, error) {
	f, err := fs.Mem.Open(name, opts)
	if err != nil {
		return nil, err
	}
	return &readCountingFile{File: f, fs: fs}, nil
}

type readCountingFile struct {
	diskio.File
	fs *readCountingFS
}

func (f *readCountingFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	f.fs.reads = append(f.fs.reads, len(p))
	f.fs.mu.Unlock()
	return f.File.ReadAt(p, off)
}

// TestReadUsesTheDevicesAlignment: logs are written in 4 KiB blocks whatever the device, but a
// Read reads only the device's sectors that hold the record (the in-memory FS refuses any read
// that is not aligned to its alignment), so a 1 KiB entry costs one read of at most 2.5 KiB on
// a 512-byte device, and 4 or 8 KiB on a 4 KiB one.
func TestReadUsesTheDevicesAlignment(t *testing.T) {
	for _, tc := range []struct{ align, maxRead int }{{512, 2560}, {4096, 8192}} {
		fs := &readCountingFS{Mem: diskio.NewMem(tc.align)}
		cfg := memConfig(fs)
		cfg.ReadHint = 1536
		e := mustOpen(t, cfg)
		entry := bytes.Repeat([]byte{7}, 1056) // a 1 KiB payload and BookKeeper's header
		var locs []Location
		for i := range 20 { // enough for records to straddle 4 KiB blocks
			loc, err := e.Add(1, int64(i), entry)
			if err != nil {
				t.Fatal(err)
			}
			locs = append(locs, loc)
		}
		if err := e.Flush(); err != nil {
			t.Fatal(err)
		}
		for i, loc := range locs {
			fs.mu.Lock()
			fs.reads = fs.reads[:0]
			fs.mu.Unlock()
			got, err := e.Read(loc, 1, int64(i), nil)
			if err != nil || !bytes.Equal(got, entry) {
				t.Fatalf("align %d: read entry %d: %v", tc.align, i, err)
			}
			fs.mu.Lock()
			if len(fs.reads) != 1 || fs.reads[0] > tc.maxRead || fs.reads[0]%tc.align != 0 {
				t.Errorf("align %d: entry %d at offset %d took reads of %v bytes, want one of at most %d",
					tc.align, i, loc.Offset(), fs.reads, tc.maxRead)
			}
			fs.mu.Unlock()
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHeaderBlockIsBadLocationAtLargeAlignment: where the direct-I/O alignment is above 4 KiB
// the header block is that large and records start after it; a location inside the header
// block is below the log's data (ErrBadLocation, as at 4 KiB), not a corrupt record. So is one
// inside the header block of a log written with a larger alignment than the current device's.
func TestHeaderBlockIsBadLocationAtLargeAlignment(t *testing.T) {
	fs := diskio.NewMem(8192)
	e := mustOpen(t, memConfig(fs))
	entries := addRange(t, e, []int64{1}, 0, 10)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	cur := e.CurrentLogID()
	if entries[0].loc.Offset() != 8192 {
		t.Fatalf("first record at %d, want 8192 (after an 8 KiB header block)", entries[0].loc.Offset())
	}
	check := func(e *EntryLog, what string) {
		t.Helper()
		for _, off := range []int64{100, 4096, 6000, 8191} {
			_, err := e.Read(NewLocation(cur, off), 1, 0, nil)
			if !errors.Is(err, ErrBadLocation) {
				t.Errorf("%s: read at offset %d, inside the 8 KiB header block: %v, want ErrBadLocation", what, off, err)
			}
			err = e.ReadAhead(NewLocation(cur, off), 1<<16, func(int64, int64, []byte, Location) bool { return true })
			if !errors.Is(err, ErrBadLocation) {
				t.Errorf("%s: read-ahead at offset %d, inside the 8 KiB header block: %v, want ErrBadLocation", what, off, err)
			}
		}
		checkRead(t, e, entries)
	}
	check(e, "the log being written")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = mustOpen(t, memConfig(fs))
	check(e, "a finalized log")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// The same files on a 4 KiB device: the header still says 8 KiB.
	e = mustOpen(t, memConfig(copyDir(t, fs, diskio.NewMem(4096), "/data/current")))
	defer e.Close()
	check(e, "a finalized log on a 4 KiB device")
}

// TestReadBufferSizeRoundedUpToTheAlignment: ReadBufferSize is a size in bytes, and the
// device's direct-I/O alignment is something the user may not know: Open accepts a size that is
// not a multiple of it (or is below two units) and rounds the read buffers up, so reads work.
func TestReadBufferSizeRoundedUpToTheAlignment(t *testing.T) {
	for _, tc := range []struct{ align, bufSize int }{{8192, 12 << 10}, {32768, 16 << 10}} {
		t.Run(fmt.Sprintf("align %d size %d", tc.align, tc.bufSize), func(t *testing.T) {
			cfg := memConfig(diskio.NewMem(tc.align))
			cfg.ReadBufferSize = tc.bufSize
			e := mustOpen(t, cfg)
			defer e.Close()
			entries := addRange(t, e, []int64{1, 2}, 0, 30)
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
			checkRead(t, e, entries)
			a := entries[0]
			n := 0
			err := e.ReadAhead(a.loc, 1<<20, func(l, en int64, data []byte, _ Location) bool {
				if !bytes.Equal(data, testEntry(l, en)) {
					t.Errorf("read-ahead of %d/%d: wrong bytes", l, en)
				}
				n++
				return true
			})
			if err != nil || n == 0 {
				t.Errorf("read-ahead: %v after %d entries", err, n)
			}
			n = 0
			if err := e.Scan(a.loc.LogID(), func(int64, int64, []byte, Location) error { n++; return nil }); err != nil || n != len(entries) {
				t.Errorf("scan: %v after %d entries, want %d", err, n, len(entries))
			}
		})
	}
}

// copyDir copies the files of dir from one FS to another (a disk moved to another device) and
// returns to.
func copyDir(t *testing.T, from diskio.FS, to *diskio.Mem, dir string) *diskio.Mem {
	t.Helper()
	names, err := from.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := to.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		path := filepath.Join(dir, name)
		f, err := to.Create(path, diskio.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(readFileBytes(t, from, path), 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if err := to.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	return to
}
