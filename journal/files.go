package journal

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// journalFile is an open journal file, owned by the writer.
type journalFile struct {
	id        uint64
	f         diskio.File
	dataStart int64
	salt      uint32
}

// fileManager creates, prepares, reuses and collects journal files. One file is prepared ahead
// of the writer, so a rollover does not wait for file creation, preallocation and fsyncs.
type fileManager struct {
	cfg   *Config
	stats *Stats
	log   *slog.Logger
	// header is an aligned buffer for writing file headers; zeros for PreallocZero.
	header *diskio.Slab
	zeros  *diskio.Slab

	// mu guards nextID, recycle and inUse.
	mu     sync.Mutex
	nextID uint64
	// recycle holds ids of old files (below the persisted mark) kept for reuse.
	recycle []uint64
	// inUse holds the ids of the file being written and the one being prepared: never collected.
	inUse map[uint64]bool

	// prepared delivers the file prepared ahead; pending says one is on its way. Closing want
	// tells its preparation that the writer is waiting for it (see zeroFill).
	prepared chan prepareResult
	pending  bool
	want     chan struct{}
	// started is set once the first file of this writer session has been handed to the writer.
	started bool
	// retryID is the id of a file whose preparation failed (0: none): the next preparation
	// takes it again, so that no id is skipped (see next).
	retryID uint64
	// noFallocate is set once the file system has refused fallocate (EOPNOTSUPP): files are then
	// only zero-filled (PreallocZero) or grow as they are written.
	noFallocate atomic.Bool
}

type prepareResult struct {
	id   uint64
	file *journalFile
	err  error
}

const zeroFillChunk = 1 << 20

func newFileManager(cfg *Config, stats *Stats, log *slog.Logger) (*fileManager, error) {
	names, err := cfg.FS.List(cfg.Dir)
	if err != nil {
		return nil, err
	}
	ids := listFileIDs(names)
	next := uint64(time.Now().UnixMilli())
	if len(ids) > 0 {
		next = ids[len(ids)-1] + 1
	}
	header, err := diskio.NewSlab(cfg.Alignment, 1)
	if err != nil {
		return nil, err
	}
	m := &fileManager{
		cfg:      cfg,
		stats:    stats,
		log:      log,
		header:   header,
		nextID:   next,
		inUse:    make(map[uint64]bool),
		prepared: make(chan prepareResult, 1),
	}
	if cfg.Prealloc == PreallocZero {
		if m.zeros, err = diskio.NewSlab(zeroFillChunk, 1); err != nil {
			header.Close()
			return nil, err
		}
	}
	return m, nil
}

// next returns a ready file for the writer and starts preparing the one after it.
//
// The file was prepared ahead, possibly long before: a failure then (a disk briefly full) says
// nothing about now, and no record was involved. So a failed preparation is retried once, here,
// before the error is returned. The retry takes the same id: replay requires the file a
// file-end record names to be the very next file, so no leftover of the failed attempt may
// sit between them under an id of its own.
func (m *fileManager) next() (*journalFile, error) {
	if !m.pending {
		m.startPrepare()
	}
	close(m.want)
	r := <-m.prepared
	m.pending = false
	if r.err != nil {
		m.log.Warn("preparing the next journal file failed; preparing it again", "file", m.path(r.id), "err", r.err)
		m.retryID = r.id
		m.startPrepare()
		close(m.want)
		r = <-m.prepared
		m.pending = false
		if r.err != nil {
			m.retryID = r.id
			return nil, r.err
		}
	}
	m.started = true
	m.startPrepare()
	return r.file, nil
}

func (m *fileManager) startPrepare() {
	m.mu.Lock()
	id, retry := m.retryID, m.retryID != 0
	if !retry {
		id = m.nextID
		m.nextID++
	}
	m.retryID = 0
	m.inUse[id] = true
	var reuse uint64
	if len(m.recycle) > 0 {
		reuse = m.recycle[0]
		m.recycle = m.recycle[1:]
		m.inUse[reuse] = true // until renamed: collect must not remove it meanwhile
	}
	m.mu.Unlock()
	m.pending = true
	sessionStart := !m.started
	want := make(chan struct{})
	m.want = want
	go func() {
		f, err := m.prepare(id, reuse, sessionStart, retry)
		if err == nil && reuse == 0 && !sessionStart && m.cfg.Prealloc == PreallocZero {
			if err = m.zeroFill(f, want); err != nil {
				f.f.Close()
				f = nil
			}
		}
		if err != nil {
			m.discard(id)
		}
		m.prepared <- prepareResult{id, f, err}
	}()
}

// discard removes what a failed preparation of file id left (a fallocated file holds its whole
// size, on a disk that may be full). It is best effort: a retry takes the same id and removes
// the file first, and a leftover without a file-end record naming it replays as an empty file.
func (m *fileManager) discard(id uint64) {
	err := m.cfg.FS.Remove(m.path(id))
	if err == nil {
		err = m.cfg.FS.SyncDir(m.cfg.Dir)
	}
	if err != nil && !errors.Is(err, diskio.ErrNotExist) {
		m.log.Warn("removing a journal file whose preparation failed", "file", m.path(id), "err", err)
	}
}

// release tells the manager that the writer no longer uses file id.
func (m *fileManager) release(jf *journalFile) error {
	m.mu.Lock()
	delete(m.inUse, jf.id)
	m.mu.Unlock()
	return jf.f.Close()
}

func (m *fileManager) path(id uint64) string { return filepath.Join(m.cfg.Dir, FileName(id)) }

// prepare makes file id ready: reused from file reuse (if not 0) or created and preallocated;
// header written; file and directory synced. retry says that a preparation of id failed
// before, and may have left the file.
func (m *fileManager) prepare(id, reuse uint64, sessionStart, retry bool) (*journalFile, error) {
	cfg := m.cfg
	path := m.path(id)
	var f diskio.File
	var err error
	if reuse != 0 {
		err = cfg.FS.Rename(m.path(reuse), path)
		m.mu.Lock()
		delete(m.inUse, reuse)
		m.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("journal: reuse %s as %s: %w", FileName(reuse), FileName(id), err)
		}
		if f, err = cfg.FS.Open(path, diskio.Options{Direct: true}); err != nil {
			return nil, err
		}
		m.stats.FilesReused.Add(1)
	} else {
		if retry {
			if err = cfg.FS.Remove(path); err != nil && !errors.Is(err, diskio.ErrNotExist) {
				return nil, fmt.Errorf("journal: prepare %s: remove the leftover of a failed attempt: %w", path, err)
			}
		}
		if f, err = cfg.FS.Create(path, diskio.Options{Direct: true}); err != nil {
			return nil, fmt.Errorf("journal: prepare %s: %w", path, err)
		}
		if err = m.preallocate(f, sessionStart); err != nil {
			f.Close()
			return nil, fmt.Errorf("journal: prepare %s: %w", path, err)
		}
		m.stats.FilesCreated.Add(1)
	}
	hdr := m.header.Buffer(0)[:cfg.Alignment]
	var flags uint32
	if sessionStart {
		flags |= fileFlagSessionStart
	}
	if !cfg.SyncData {
		flags |= fileFlagUnsynced
	}
	fileHeader{
		flags:         flags,
		version:       fileFormatVersion,
		alignment:     uint32(cfg.Alignment),
		fileID:        id,
		createdNs:     time.Now().UnixNano(),
		pipelineDepth: uint32(cfg.PipelineDepth),
		groupCapacity: uint32(cfg.groupCapacity()),
		maxPayload:    uint32(cfg.MaxRecordSize),
	}.encode(hdr)
	if _, err = f.WriteAt(hdr, 0); err == nil {
		if err = f.Sync(); err == nil {
			err = cfg.FS.SyncDir(cfg.Dir)
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: prepare %s: %w", path, err)
	}
	return &journalFile{id: id, f: f, dataStart: int64(cfg.Alignment), salt: fileSalt(id)}, nil
}

// firstFileZeroFill bounds the zero-filling of a session's first file, which Open waits for:
// the rest of that file is fallocated (its commits pay for unwritten extents), so that a
// bookie with 2 GiB journal files (the default) does not write 2 GiB before it starts. A
// variable so that tests can lower it.
var firstFileZeroFill int64 = 256 << 20

// zeroFillRate bounds how fast a file prepared ahead is zero-filled (bytes/s). Unpaced, a
// 512 MiB file went out at the disk's full speed while the journal was committing to the same
// disk: at 300k adds/s, add latency p99 was 46-107 ms against 6-10 ms with fallocated files
// (BENCHMARKS.md). At this rate a 2 GiB file is zero-filled in 16 s; a writer that needs the
// file sooner takes it with the rest fallocated. A variable so that tests can change it.
var zeroFillRate float64 = 128 << 20

// preallocate reserves a new file's space. PreallocZero zero-fills only a session's first file
// here (up to firstFileZeroFill); the others are fallocated and then zero-filled by zeroFill,
// after their header, while they wait for the writer.
func (m *fileManager) preallocate(f diskio.File, sessionStart bool) error {
	switch m.cfg.Prealloc {
	case PreallocFallocate:
		return m.allocate(f)
	case PreallocZero:
		if err := m.allocate(f); err != nil {
			return err
		}
		if !sessionStart {
			return nil
		}
		if err := m.writeZeros(f, 0, min(m.cfg.MaxFileSize, firstFileZeroFill), nil, 0); err != nil {
			return err
		}
		return f.SyncData()
	}
	return nil
}

// allocate fallocates a new file's space, unless the file system does not support it: then,
// as the entry log does, the journal goes on without (warning once) rather than refusing to
// open; replay finds the end of a file that was never preallocated as it finds a torn tail.
func (m *fileManager) allocate(f diskio.File) error {
	if m.noFallocate.Load() {
		return nil
	}
	err := f.Allocate(0, m.cfg.MaxFileSize)
	if err != nil && errors.Is(err, errors.ErrUnsupported) {
		if m.noFallocate.CompareAndSwap(false, true) {
			m.log.Warn("fallocate is not supported here; journal files grow as they are written", "err", err)
		}
		return nil
	}
	return err
}

// zeroFill zero-fills a prepared file after its header at zeroFillRate until it is done or the
// writer wants the file (want closed), so that commits into it find written extents. It writes
// nothing once want is closed, and the file is handed over only after it returns, so it never
// races the writer. The zeros need no sync of their own: they are not data, and the first
// commit's fdatasync covers the extent conversions.
func (m *fileManager) zeroFill(jf *journalFile, want <-chan struct{}) error {
	if err := m.writeZeros(jf.f, jf.dataStart, m.cfg.MaxFileSize, want, zeroFillRate); err != nil {
		return fmt.Errorf("journal: zero-fill %s: %w", m.path(jf.id), err)
	}
	return nil
}

// writeZeros writes zeros over [from, to) in zeroFillChunk writes, at most rate bytes/s if rate
// is positive, stopping early (with no error) when stop is closed.
func (m *fileManager) writeZeros(f diskio.File, from, to int64, stop <-chan struct{}, rate float64) error {
	zeros := m.zeros.Buffer(0)
	start := time.Now()
	for off := from; off < to; off += zeroFillChunk {
		select {
		case <-stop:
			return nil
		default:
		}
		n := min(int64(zeroFillChunk), to-off)
		if _, err := f.WriteAt(zeros[:diskio.AlignUp(n, m.cfg.Alignment)], off); err != nil {
			return err
		}
		if rate <= 0 {
			continue
		}
		due := start.Add(time.Duration(float64(off+n-from) / rate * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-stop:
				t.Stop()
				return nil
			}
		}
	}
	return nil
}

// collect removes or keeps for reuse the files below markFileID, keeping MaxBackups of them.
func (m *fileManager) collect(markFileID uint64) error {
	// The listing is taken under mu: prepare renames a reused file away before it forgets it
	// in inUse, so a listing taken outside could still show a file no longer there, and
	// recycle it.
	m.mu.Lock()
	names, err := m.cfg.FS.List(m.cfg.Dir)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	var old []uint64
	for _, id := range listFileIDs(names) {
		if id < markFileID && !m.inUse[id] && !slices.Contains(m.recycle, id) {
			old = append(old, id)
		}
	}
	if len(old) <= m.cfg.MaxBackups {
		m.mu.Unlock()
		return nil
	}
	old = old[:len(old)-m.cfg.MaxBackups]
	var remove []uint64
	for _, id := range old {
		if m.cfg.ReuseFiles && len(m.recycle) < m.cfg.MaxRecycled {
			m.recycle = append(m.recycle, id)
		} else {
			remove = append(remove, id)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, id := range remove {
		if err := m.cfg.FS.Remove(m.path(id)); err != nil && !errors.Is(err, diskio.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(remove) > 0 {
		errs = append(errs, m.cfg.FS.SyncDir(m.cfg.Dir))
	}
	return errors.Join(errs...)
}

// close stops and waits for a file being prepared and closes it, then frees buffers.
func (m *fileManager) close() {
	if m.pending {
		close(m.want) // stop zero-filling it
		if r := <-m.prepared; r.err == nil {
			r.file.f.Close()
		}
		m.pending = false
	}
	m.header.Close()
	if m.zeros != nil {
		m.zeros.Close()
	}
}
