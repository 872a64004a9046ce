package index

import (
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// ringFS is the OS file system for pebble with reads of opened files going through diskio's
// shared io_uring reader, as the entry logs' do. pebble reads sstable blocks with pread: each
// cold index look-up that misses the block cache would otherwise hold a Go P while it waits
// for the disk, and with few cores the reads of a random-read load queue behind one another.
type ringFS struct{ vfs.FS }

func (fs ringFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil {
		return nil, err
	}
	if f.Fd() == vfs.InvalidFd {
		return f, nil
	}
	return ringFile{f}, nil
}

type ringFile struct{ vfs.File }

func (f ringFile) ReadAt(p []byte, off int64) (int, error) {
	return diskio.ReadAtFd(int(f.Fd()), p, off)
}
