package diskio

import (
	"errors"
	"fmt"
	"io"
)

// Sentinel errors. Errors from the OS are wrapped, so errors.Is also matches syscall errnos.
var (
	ErrMisaligned  = errors.New("diskio: buffer, offset or length not aligned for direct I/O")
	ErrCrashed     = errors.New("diskio: file system instance has crashed")
	ErrClosed      = errors.New("diskio: file is closed")
	ErrNotExist    = errors.New("diskio: file does not exist")
	ErrExist       = errors.New("diskio: file already exists")
	ErrUnsupported = errors.New("diskio: operation not supported by this file system")
	ErrLocked      = errors.New("diskio: directory is locked by another user")
)

// Options says how a file is opened.
type Options struct {
	// Direct opens the file with O_DIRECT. Reads and writes must then use aligned buffers,
	// offsets and lengths (FS.Alignment).
	Direct bool
	// ReadOnly opens the file for reading only.
	ReadOnly bool
}

// FS is a file system. Paths are plain OS paths. Implementations are safe for concurrent use.
type FS interface {
	// Create creates a new file for reading and writing; it fails with ErrExist if name exists.
	// The directory entry is durable only after SyncDir of the parent.
	Create(name string, opts Options) (File, error)
	// Open opens an existing file; it fails with ErrNotExist if there is none.
	Open(name string, opts Options) (File, error)
	Remove(name string) error
	// Rename atomically replaces newname with oldname. Durable after SyncDir.
	Rename(oldname, newname string) error
	MkdirAll(dir string) error
	// List returns the names (not paths) of the entries in dir, sorted.
	List(dir string) ([]string, error)
	// SyncDir makes the directory's entries (creates, renames, removes) durable.
	SyncDir(dir string) error
	// Alignment is the buffer, offset and length alignment that direct I/O needs for files
	// under dir; dir may also name a file (some file systems report it only for files).
	Alignment(dir string) int
	// Usage reports the total and free bytes of the file system holding dir.
	Usage(dir string) (total, free uint64, err error)
	// Lock takes dir (created if needed) for this user alone until unlock, or fails with
	// ErrLocked: two bookies must never open one directory.
	Lock(dir string) (unlock func() error, err error)
}

// File is an open file. Its methods are safe for concurrent use on distinct regions.
type File interface {
	io.ReaderAt
	io.WriterAt
	// SyncData makes the written data durable (fdatasync).
	SyncData() error
	// Sync makes data and metadata durable (fsync).
	Sync() error
	// Allocate reserves space for [off, off+length) without changing what reads return.
	Allocate(off, length int64) error
	Truncate(size int64) error
	Size() (int64, error)
	Name() string
	Close() error
}

// Engine selects how durable writes are issued.
type Engine int

const (
	EngineAuto Engine = iota
	EngineIOUring
	EnginePsync
)

func (e Engine) String() string {
	switch e {
	case EngineAuto:
		return "auto"
	case EngineIOUring:
		return "io_uring"
	case EnginePsync:
		return "psync"
	}
	return fmt.Sprintf("Engine(%d)", int(e))
}

// ParseEngine parses "auto", "io_uring" or "psync" (the values of journalIOEngine).
func ParseEngine(s string) (Engine, error) {
	switch s {
	case "auto", "":
		return EngineAuto, nil
	case "io_uring", "iouring", "uring":
		return EngineIOUring, nil
	case "psync":
		return EnginePsync, nil
	}
	return 0, fmt.Errorf("diskio: unknown I/O engine %q (want auto, io_uring or psync)", s)
}

// IsAligned reports whether n is a multiple of align (a power of two).
func IsAligned(n int64, align int) bool { return n&int64(align-1) == 0 }

// AlignUp rounds n up to a multiple of align (a power of two).
func AlignUp(n int64, align int) int64 { return (n + int64(align) - 1) &^ int64(align-1) }

// AlignDown rounds n down to a multiple of align (a power of two).
func AlignDown(n int64, align int) int64 { return n &^ int64(align-1) }
