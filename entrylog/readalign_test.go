package entrylog

import (
	"bytes"
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
