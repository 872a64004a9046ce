package diskio

import (
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// OpKind names an operation that an Injector may fail.
type OpKind int

const (
	OpWrite OpKind = iota
	OpSync         // SyncData or Sync
	OpRead
	OpCreate
	OpRename
	OpRemove
	OpSyncDir
	OpAllocate
	OpTruncate
	numOpKinds
)

func (k OpKind) String() string {
	return [...]string{"write", "sync", "read", "create", "rename", "remove", "syncdir", "allocate", "truncate"}[k]
}

// Op describes one operation for an Injector. Index counts operations of this kind from 0.
type Op struct {
	Kind  OpKind
	Name  string
	Index int
}

// Injector decides whether an operation fails. A nil error lets it proceed.
type Injector func(op Op) error

// FailNth fails the n-th (0-based) operation of kind with err, and only that one.
func FailNth(kind OpKind, n int, err error) Injector {
	return func(op Op) error {
		if op.Kind == kind && op.Index == n {
			return err
		}
		return nil
	}
}

// CrashMode says what survives a simulated power loss besides synced data.
type CrashMode int

const (
	// CrashSyncedOnly keeps only what was synced (file data by SyncData/Sync, directory entries
	// by SyncDir).
	CrashSyncedOnly CrashMode = iota
	// CrashPrefix also keeps a random prefix of each file's unsynced writes, the last one torn at
	// a 512-byte sector boundary.
	CrashPrefix
	// CrashSubset also keeps a random subset of the 512-byte sectors of each file's unsynced writes.
	CrashSubset
)

const sectorSize = 512

// Mem is an in-memory FS that models what survives a crash. Safe for concurrent use.
type Mem struct {
	mu sync.Mutex
	// crashed is set by Crash: every later operation on this instance fails with ErrCrashed.
	crashed  bool
	dirs     map[string]*memDir
	injector Injector
	opCounts [numOpKinds]int
	align    int
	// capacity bounds the total live bytes (0 = unbounded); beyond it writes fail with ENOSPC.
	capacity uint64
	used     uint64
	locked   map[string]bool // directories held by Lock
}

type memDir struct {
	live    map[string]*memInode
	durable map[string]*memInode
}

type memInode struct {
	data    []byte
	durable []byte
	pending []memOp
}

type memOp struct {
	truncate bool
	off      int64 // write offset, or the new size for a truncate
	data     []byte
}

// NewMem returns an empty in-memory FS whose direct-I/O alignment is align (0 means 4096).
func NewMem(align int) *Mem {
	if align == 0 {
		align = 4096
	}
	return &Mem{dirs: make(map[string]*memDir), align: align}
}

// SetInjector installs an error injector (nil removes it).
func (m *Mem) SetInjector(inj Injector) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.injector = inj
}

// SetCapacity bounds the total bytes of all files; 0 means unbounded.
func (m *Mem) SetCapacity(bytes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.capacity = bytes
}

// checkLocked counts the operation and asks the injector.
func (m *Mem) checkLocked(kind OpKind, name string) error {
	if m.crashed {
		return ErrCrashed
	}
	idx := m.opCounts[kind]
	m.opCounts[kind]++
	if m.injector != nil {
		if err := m.injector(Op{Kind: kind, Name: name, Index: idx}); err != nil {
			return fmt.Errorf("diskio: injected %s failure on %s: %w", kind, name, err)
		}
	}
	return nil
}

func (m *Mem) dirLocked(dir string) (*memDir, error) {
	d, ok := m.dirs[filepath.Clean(dir)]
	if !ok {
		return nil, fmt.Errorf("diskio: directory %s: %w", dir, ErrNotExist)
	}
	return d, nil
}

func split(name string) (string, string) {
	name = filepath.Clean(name)
	return filepath.Dir(name), filepath.Base(name)
}

// Create implements FS.
func (m *Mem) Create(name string, opts Options) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(OpCreate, name); err != nil {
		return nil, err
	}
	dir, base := split(name)
	d, err := m.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	if _, ok := d.live[base]; ok {
		return nil, fmt.Errorf("diskio: create %s: %w", name, ErrExist)
	}
	ino := &memInode{}
	d.live[base] = ino
	return &memFile{fs: m, ino: ino, name: name, opts: opts}, nil
}

// Open implements FS.
func (m *Mem) Open(name string, opts Options) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, ErrCrashed
	}
	dir, base := split(name)
	d, err := m.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	ino, ok := d.live[base]
	if !ok {
		return nil, fmt.Errorf("diskio: open %s: %w", name, ErrNotExist)
	}
	return &memFile{fs: m, ino: ino, name: name, opts: opts}, nil
}

// Remove implements FS.
func (m *Mem) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(OpRemove, name); err != nil {
		return err
	}
	dir, base := split(name)
	d, err := m.dirLocked(dir)
	if err != nil {
		return err
	}
	ino, ok := d.live[base]
	if !ok {
		return fmt.Errorf("diskio: remove %s: %w", name, ErrNotExist)
	}
	m.used -= uint64(len(ino.data))
	delete(d.live, base)
	return nil
}

// Rename implements FS.
func (m *Mem) Rename(oldname, newname string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(OpRename, oldname); err != nil {
		return err
	}
	odir, obase := split(oldname)
	ndir, nbase := split(newname)
	od, err := m.dirLocked(odir)
	if err != nil {
		return err
	}
	nd, err := m.dirLocked(ndir)
	if err != nil {
		return err
	}
	ino, ok := od.live[obase]
	if !ok {
		return fmt.Errorf("diskio: rename %s: %w", oldname, ErrNotExist)
	}
	if old, ok := nd.live[nbase]; ok && old != ino {
		m.used -= uint64(len(old.data))
	}
	delete(od.live, obase)
	nd.live[nbase] = ino
	return nil
}

// MkdirAll implements FS. Directories are durable at once.
// Lock holds dir until unlock; a second Lock of it fails with ErrLocked.
func (m *Mem) Lock(dir string) (func() error, error) {
	if err := m.MkdirAll(dir); err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locked[dir] {
		return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
	}
	if m.locked == nil {
		m.locked = make(map[string]bool)
	}
	m.locked[dir] = true
	return func() error {
		m.mu.Lock()
		delete(m.locked, dir)
		m.mu.Unlock()
		return nil
	}, nil
}

func (m *Mem) MkdirAll(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return ErrCrashed
	}
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, ok := m.dirs[d]; !ok {
			m.dirs[d] = &memDir{live: make(map[string]*memInode), durable: make(map[string]*memInode)}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// List implements FS: files and subdirectories of dir.
func (m *Mem) List(dir string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, ErrCrashed
	}
	dir = filepath.Clean(dir)
	d, err := m.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(d.live))
	for name := range d.live {
		names = append(names, name)
	}
	for p := range m.dirs {
		if p != dir && filepath.Dir(p) == dir {
			names = append(names, filepath.Base(p))
		}
	}
	slices.Sort(names)
	return names, nil
}

// SyncDir implements FS.
func (m *Mem) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(OpSyncDir, dir); err != nil {
		return err
	}
	d, err := m.dirLocked(dir)
	if err != nil {
		return err
	}
	d.durable = make(map[string]*memInode, len(d.live))
	for name, ino := range d.live {
		d.durable[name] = ino
	}
	return nil
}

// Alignment implements FS.
func (m *Mem) Alignment(string) int { return m.align }

// Usage implements FS.
func (m *Mem) Usage(string) (total, free uint64, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.capacity == 0 {
		return 1 << 40, 1<<40 - m.used, nil
	}
	return m.capacity, m.capacity - min(m.used, m.capacity), nil
}

// Crash simulates a power loss. This instance fails every later operation with ErrCrashed (so
// goroutines still using it cannot change the result) and the returned FS holds what survived:
// synced data and directory entries, plus what mode allows of the rest. Pending writes are
// applied to copies, so the result shares no memory with this instance.
func (m *Mem) Crash(mode CrashMode, rng *rand.Rand) *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.crashed = true
	out := NewMem(m.align)
	out.capacity = m.capacity
	copied := make(map[*memInode]*memInode)
	for path, d := range m.dirs {
		nd := &memDir{live: make(map[string]*memInode), durable: make(map[string]*memInode)}
		for name, ino := range d.durable {
			c, ok := copied[ino]
			if !ok {
				data := ino.survivors(mode, rng)
				c = &memInode{data: data, durable: slices.Clone(data)}
				copied[ino] = c
				out.used += uint64(len(data))
			}
			nd.live[name] = c
			nd.durable[name] = c
		}
		out.dirs[path] = nd
	}
	return out
}

// survivors returns the content a crash leaves: the durable content plus what mode keeps of the
// pending operations.
func (ino *memInode) survivors(mode CrashMode, rng *rand.Rand) []byte {
	data := slices.Clone(ino.durable)
	switch mode {
	case CrashPrefix:
		keep := rng.IntN(len(ino.pending) + 1)
		for i, op := range ino.pending[:keep] {
			if i == keep-1 && !op.truncate && len(op.data) > 0 {
				sectors := (len(op.data) + sectorSize - 1) / sectorSize
				torn := min(len(op.data), rng.IntN(sectors+1)*sectorSize)
				op.data = op.data[:torn]
			}
			data = applyOp(data, op)
		}
	case CrashSubset:
		for _, op := range ino.pending {
			if op.truncate {
				if rng.IntN(2) == 0 {
					data = applyOp(data, op)
				}
				continue
			}
			for s := 0; s < len(op.data); s += sectorSize {
				if rng.IntN(2) == 0 {
					e := min(s+sectorSize, len(op.data))
					data = applyOp(data, memOp{off: op.off + int64(s), data: op.data[s:e]})
				}
			}
		}
	}
	return data
}

func applyOp(data []byte, op memOp) []byte {
	if op.truncate {
		if op.off <= int64(len(data)) {
			return data[:op.off]
		}
		return append(data, make([]byte, op.off-int64(len(data)))...)
	}
	end := op.off + int64(len(op.data))
	if end > int64(len(data)) {
		data = append(data, make([]byte, end-int64(len(data)))...)
	}
	copy(data[op.off:], op.data)
	return data
}

type memFile struct {
	fs     *Mem
	ino    *memInode
	name   string
	opts   Options
	closed bool
}

func (f *memFile) Name() string { return f.name }

func (f *memFile) checkAlign(p []byte, off int64) error {
	if !f.opts.Direct {
		return nil
	}
	if !IsAligned(off, f.fs.align) || !IsAligned(int64(len(p)), f.fs.align) {
		return fmt.Errorf("diskio: %s at %d len %d: %w", f.name, off, len(p), ErrMisaligned)
	}
	return nil
}

func (f *memFile) usableLocked() error {
	if f.fs.crashed {
		return ErrCrashed
	}
	if f.closed {
		return ErrClosed
	}
	return nil
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.usableLocked(); err != nil {
		return 0, err
	}
	if err := f.fs.checkLocked(OpRead, f.name); err != nil {
		return 0, err
	}
	if err := f.checkAlign(p, off); err != nil {
		return 0, err
	}
	if off >= int64(len(f.ino.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.ino.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.usableLocked(); err != nil {
		return 0, err
	}
	if f.opts.ReadOnly {
		return 0, fmt.Errorf("diskio: write %s: %w", f.name, unix.EBADF)
	}
	if err := f.fs.checkLocked(OpWrite, f.name); err != nil {
		return 0, err
	}
	if err := f.checkAlign(p, off); err != nil {
		return 0, err
	}
	if grow := off + int64(len(p)) - int64(len(f.ino.data)); grow > 0 {
		if err := f.fs.reserveLocked(f.name, uint64(grow)); err != nil {
			return 0, err
		}
	}
	op := memOp{off: off, data: slices.Clone(p)}
	f.ino.data = applyOp(f.ino.data, op)
	f.ino.pending = append(f.ino.pending, op)
	return len(p), nil
}

func (m *Mem) reserveLocked(name string, grow uint64) error {
	if m.capacity != 0 && m.used+grow > m.capacity {
		return fmt.Errorf("diskio: write %s: %w", name, unix.ENOSPC)
	}
	m.used += grow
	return nil
}

func (f *memFile) sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.usableLocked(); err != nil {
		return err
	}
	if err := f.fs.checkLocked(OpSync, f.name); err != nil {
		if !f.fs.crashed {
			// As Linux after a writeback error: the pages stay readable but are marked clean,
			// so no later sync writes them and a crash loses them (the harshest outcome).
			f.ino.pending = f.ino.pending[:0]
		}
		return err
	}
	for _, op := range f.ino.pending {
		f.ino.durable = applyOp(f.ino.durable, op)
	}
	f.ino.pending = f.ino.pending[:0]
	return nil
}

func (f *memFile) SyncData() error { return f.sync() }
func (f *memFile) Sync() error     { return f.sync() }

func (f *memFile) Allocate(off, length int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.usableLocked(); err != nil {
		return err
	}
	if err := f.fs.checkLocked(OpAllocate, f.name); err != nil {
		return err
	}
	return nil // reservation does not change what reads or a crash see
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.usableLocked(); err != nil {
		return err
	}
	if err := f.fs.checkLocked(OpTruncate, f.name); err != nil {
		return err
	}
	old := int64(len(f.ino.data))
	if size > old {
		if err := f.fs.reserveLocked(f.name, uint64(size-old)); err != nil {
			return err
		}
	} else {
		f.fs.used -= uint64(old - size)
	}
	op := memOp{truncate: true, off: size}
	f.ino.data = applyOp(f.ino.data, op)
	f.ino.pending = append(f.ino.pending, op)
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.usableLocked(); err != nil {
		return 0, err
	}
	return int64(len(f.ino.data)), nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return ErrClosed
	}
	f.closed = true
	return nil
}
