package diskio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OS is the real file system.
type OS struct {
	mu sync.Mutex
	// alignments caches Alignment per directory.
	alignments map[string]int
}

// NewOS returns the real file system.
func NewOS() *OS { return &OS{alignments: make(map[string]int)} }

func openFlags(opts Options) int {
	flags := unix.O_CLOEXEC
	if opts.ReadOnly {
		flags |= unix.O_RDONLY
	} else {
		flags |= unix.O_RDWR
	}
	if opts.Direct {
		flags |= unix.O_DIRECT
	}
	return flags
}

func mapOpenError(op, name string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("diskio: %s %s: %w (%w)", op, name, ErrNotExist, err)
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("diskio: %s %s: %w (%w)", op, name, ErrExist, err)
	}
	return fmt.Errorf("diskio: %s %s: %w", op, name, err)
}

func openRetry(name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(name, flags, mode)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// Create implements FS.
func (o *OS) Create(name string, opts Options) (File, error) {
	if opts.ReadOnly {
		return nil, fmt.Errorf("diskio: create %s: read-only create: %w", name, ErrUnsupported)
	}
	fd, err := openRetry(name, openFlags(opts)|unix.O_CREAT|unix.O_EXCL, 0o644)
	if err != nil {
		return nil, mapOpenError("create", name, err)
	}
	return &osFile{fd: fd, name: name, direct: opts.Direct}, nil
}

// Open implements FS.
func (o *OS) Open(name string, opts Options) (File, error) {
	fd, err := openRetry(name, openFlags(opts), 0)
	if err != nil {
		return nil, mapOpenError("open", name, err)
	}
	return &osFile{fd: fd, name: name, direct: opts.Direct}, nil
}

// Remove implements FS.
func (o *OS) Remove(name string) error {
	if err := unix.Unlink(name); err != nil {
		return mapOpenError("remove", name, err)
	}
	return nil
}

// Rename implements FS.
func (o *OS) Rename(oldname, newname string) error {
	if err := unix.Rename(oldname, newname); err != nil {
		return mapOpenError("rename", oldname+" -> "+newname, err)
	}
	return nil
}

// MkdirAll implements FS.
// LockFileName is the file in each directory that OS.Lock holds an flock on.
const LockFileName = "LOCK"

// Lock holds an exclusive flock on dir/LOCK. The kernel releases it when the process dies, so
// a crash never leaves a directory locked; a second open of the file, in this process or
// another, cannot take it.
func (o *OS) Lock(dir string) (func() error, error) {
	if err := o.MkdirAll(dir); err != nil {
		return nil, err
	}
	name := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("diskio: lock %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (another bookie, or another process, uses it)", ErrLocked, dir)
		}
		return nil, fmt.Errorf("diskio: lock %s: %w", dir, err)
	}
	return f.Close, nil
}

// MkdirAll creates dir and its missing parents, and makes each new directory's entry durable
// (an fsync of its parent): files made durable inside a directory whose own entry is not would
// be lost with it.
func (o *OS) MkdirAll(dir string) error {
	var created []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || d == filepath.Dir(d) {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("diskio: mkdir %s: %w", dir, err)
	}
	for _, d := range created {
		if err := o.SyncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

// List implements FS.
func (o *OS) List(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, mapOpenError("list", dir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names, nil
}

// SyncDir implements FS.
func (o *OS) SyncDir(dir string) error {
	fd, err := openRetry(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return mapOpenError("open dir", dir, err)
	}
	defer unix.Close(fd)
	if err := fsyncRetry(fd, false); err != nil {
		return fmt.Errorf("diskio: fsync dir %s: %w", dir, err)
	}
	return nil
}

// Alignment implements FS: statx STATX_DIOALIGN, at least 512, 4096 when unknown. ext4 and XFS
// answer it only for regular files, so for a directory it asks about a file made there for the
// purpose (unnamed, O_TMPFILE, where the file system allows): on a device with 8 KiB sectors,
// 4096 would make every direct write fail.
func (o *OS) Alignment(dir string) int {
	dir = filepath.Clean(dir)
	o.mu.Lock()
	defer o.mu.Unlock()
	if a, ok := o.alignments[dir]; ok {
		return a
	}
	a, ok := dioAlignment(unix.AT_FDCWD, dir, 0)
	if !ok {
		a, ok = probeDirAlignment(dir)
	}
	if !ok {
		a = 4096
	}
	o.alignments[dir] = a
	return a
}

// DirectIOAlignment reads the alignment that O_DIRECT needs for files under path with statx
// STATX_DIOALIGN: the larger of the memory and offset alignments. It returns 4096 when the kernel
// or the file system does not say.
func DirectIOAlignment(path string) int {
	if a, ok := dioAlignment(unix.AT_FDCWD, path, 0); ok {
		return a
	}
	return 4096
}

// dioAlignment is statx STATX_DIOALIGN of path relative to dirfd (or of dirfd itself with
// AT_EMPTY_PATH); ok is false when the kernel or the file system does not say.
func dioAlignment(dirfd int, path string, flags int) (int, bool) {
	var stx unix.Statx_t
	if err := unix.Statx(dirfd, path, flags, unix.STATX_DIOALIGN, &stx); err != nil {
		return 0, false
	}
	if stx.Mask&unix.STATX_DIOALIGN == 0 || stx.Dio_offset_align == 0 {
		return 0, false
	}
	a := max(int(stx.Dio_mem_align), int(stx.Dio_offset_align), 512)
	if a&(a-1) != 0 {
		return 0, false
	}
	return a, true
}

// dioProbeName is the file probeDirAlignment makes where O_TMPFILE is not supported; it is
// removed at once, and no reader of a journal or ledger directory takes it for its own.
const dioProbeName = ".dioalign-probe"

// probeDirAlignment asks statx about a regular file in dir: an unnamed one (O_TMPFILE), else
// one named dioProbeName, removed again.
func probeDirAlignment(dir string) (int, bool) {
	if fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600); err == nil {
		defer unix.Close(fd)
		return dioAlignment(fd, "", unix.AT_EMPTY_PATH)
	}
	name := filepath.Join(dir, dioProbeName)
	fd, err := unix.Open(name, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, false
	}
	defer unix.Unlink(name)
	defer unix.Close(fd)
	return dioAlignment(fd, "", unix.AT_EMPTY_PATH)
}

// Usage implements FS.
func (o *OS) Usage(dir string) (total, free uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("diskio: statfs %s: %w", dir, err)
	}
	return st.Blocks * uint64(st.Bsize), st.Bavail * uint64(st.Bsize), nil
}

// osFile is an open OS file. It is used through File, and by the io_uring engine through Fd.
type osFile struct {
	fd     int
	name   string
	direct bool
	closed sync.Once
}

// Fd returns the file descriptor, for the io_uring engine.
func (f *osFile) Fd() int { return f.fd }

func (f *osFile) Name() string { return f.name }

// ReadAt reads through the shared io_uring reader when io_uring is available (see
// uringReader: a read waiting for the disk then holds no Go P), with pread otherwise.
func (f *osFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := ReadAtFd(f.fd, p, off)
	if err != nil && err != errEOF {
		err = fmt.Errorf("diskio: read %s at %d: %w", f.name, off+int64(n), err)
	}
	return n, err
}

// ReadAtFd is io.ReaderAt for a file descriptor (of any file, also one opened elsewhere, such
// as the index's): it fills p from off, through the shared io_uring reader where io_uring is
// available and with pread otherwise, and returns io.EOF if the file ends first.
func ReadAtFd(fd int, p []byte, off int64) (int, error) {
	r := readerFor()
	n := 0
	for n < len(p) {
		var m int
		var err error
		ok := false
		if r != nil {
			m, err, ok = r.pread(fd, p[n:], off+int64(n))
		}
		if !ok {
			m, err = unix.Pread(fd, p[n:], off+int64(n))
		}
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			return n, errEOF
		}
		n += m
	}
	return n, nil
}

func (f *osFile) WriteAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Pwrite(f.fd, p[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("diskio: write %s at %d: %w", f.name, off+int64(n), err)
		}
		if m == 0 {
			return n, fmt.Errorf("diskio: write %s at %d: %w", f.name, off+int64(n), unix.EIO)
		}
		n += m
	}
	return n, nil
}

func fsyncRetry(fd int, dataOnly bool) error {
	for {
		var err error
		if dataOnly {
			err = unix.Fdatasync(fd)
		} else {
			err = unix.Fsync(fd)
		}
		if err != unix.EINTR {
			return err
		}
	}
}

func (f *osFile) SyncData() error {
	if err := fsyncRetry(f.fd, true); err != nil {
		return fmt.Errorf("diskio: fdatasync %s: %w", f.name, err)
	}
	return nil
}

func (f *osFile) Sync() error {
	if err := fsyncRetry(f.fd, false); err != nil {
		return fmt.Errorf("diskio: fsync %s: %w", f.name, err)
	}
	return nil
}

func (f *osFile) Allocate(off, length int64) error {
	for {
		err := unix.Fallocate(f.fd, 0, off, length)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("diskio: fallocate %s [%d,+%d): %w", f.name, off, length, err)
		}
		return nil
	}
}

func (f *osFile) Truncate(size int64) error {
	if err := unix.Ftruncate(f.fd, size); err != nil {
		return fmt.Errorf("diskio: truncate %s to %d: %w", f.name, size, err)
	}
	return nil
}

func (f *osFile) Size() (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return 0, fmt.Errorf("diskio: stat %s: %w", f.name, err)
	}
	return st.Size, nil
}

func (f *osFile) Close() error {
	err := ErrClosed
	f.closed.Do(func() {
		err = unix.Close(f.fd)
		if err != nil {
			err = fmt.Errorf("diskio: close %s: %w", f.name, err)
		}
	})
	return err
}

// WriteAtDataSync writes p at off with pwritev2(RWF_DSYNC): the write returns once p is durable,
// in one system call instead of pwrite plus fdatasync.
func (f *osFile) WriteAtDataSync(p []byte, off int64) error {
	n := 0
	for n < len(p) {
		var iov unix.Iovec
		iov.Base = &p[n]
		iov.SetLen(len(p) - n)
		pos := off + int64(n)
		r, _, errno := unix.Syscall6(unix.SYS_PWRITEV2, uintptr(f.fd), uintptr(unsafe.Pointer(&iov)), 1,
			uintptr(pos), 0, unix.RWF_DSYNC)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("diskio: pwritev2(RWF_DSYNC) %s at %d: %w", f.name, pos, errno)
		}
		if r == 0 {
			return fmt.Errorf("diskio: pwritev2(RWF_DSYNC) %s at %d: %w", f.name, pos, unix.EIO)
		}
		n += int(r)
	}
	return nil
}
