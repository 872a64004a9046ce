package entrylog

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// EntryLog is the set of entry logs in one directory: one writer appends to the current log,
// any number of goroutines read.
//
// Add, Flush and Close are single-writer: one goroutine at a time calls them (the engine
// serializes its flusher and its compaction with a lock), never two at once. Read, ReadAhead,
// Scan, LedgersMap, Logs, CompletedLogs, Size, CurrentLogID and Remove are safe for concurrent
// use with each other and with the writer. A location returned by Add may be read
// only after the Flush that covers it has returned; before that, Read reports ErrBadLocation
// for it (the engine serves unflushed entries from its write cache).
type EntryLog struct {
	cfg   Config
	fs    diskio.FS
	dir   string
	align int
	log   *slog.Logger
	// readAlign is the direct-I/O alignment of Read and ReadAhead, the device's (512 on
	// most), at most align; it is read from the first log opened for reading (under mu).
	// Reading only the sectors that hold a record, not the 4 KiB blocks around it, moves
	// 1.5-2 KiB instead of 4-8 KiB for a 1 KiB entry (a quarter of them straddle two blocks),
	// and random reads on a disk that limits bandwidth go that much faster.
	readAlign int

	// w is the writer state, touched only by the goroutine that calls Add, Flush and Close.
	w writer

	small readPool
	large readPool
	// readers counts Read, ReadAhead, Scan and LedgersMap calls in progress; Close waits for
	// them before it unmaps the read buffers.
	readers sync.WaitGroup

	// current is the id of the log being written.
	current atomic.Uint64
	// fallocateOff is set once fallocate turned out to be unsupported.
	fallocateOff atomic.Bool

	// mu guards the fields below. Readers hold it shared just long enough to take a handle.
	mu     sync.RWMutex
	closed bool
	// logs is the set of logs that exist (on disk and listed by Logs), the current one included.
	logs map[uint64]struct{}
	// writing holds the logs this instance owns and has not finalized, with the offset below
	// which they may be read: the current log, a sealed one whose finalization is pending, and
	// one being prepared. Logs not in it are readable to their end. Remove refuses them.
	writing map[uint64]int64
	// handles are the open read-only files, by log id.
	handles map[uint64]*readHandle
	// nextID is the next log id to allocate.
	nextID uint64
}

// readHandle is a read-only O_DIRECT file shared by readers. refs counts the handles map's
// reference plus one per reader; the file is closed when it drops to zero.
type readHandle struct {
	id    uint64
	path  string
	salt  uint32
	f     diskio.File
	align int // of reads: EntryLog.readAlign
	refs  atomic.Int32
	// dataStart is the size of the log's header block, where its records start (0 until known):
	// the alignment of the instance that created the log, which the header records. It is set
	// when the handle is opened for a log this instance writes, and otherwise read from the
	// header the first time a read fails (headerBlock).
	dataStart atomic.Int64
}

// Open opens (creating if needed) the entry logs in cfg.Dir and starts a new log, with an id
// above every id ever allocated there. It never appends to an existing log.
func Open(cfg Config) (*EntryLog, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	fs := cfg.FS
	if err := fs.MkdirAll(cfg.Dir); err != nil {
		return nil, err
	}
	align := max(minHeaderBlock, fs.Alignment(cfg.Dir))
	if align&(align-1) != 0 {
		return nil, fmt.Errorf("%w: direct-I/O alignment %d of %s is not a power of two", ErrBadConfig, align, cfg.Dir)
	}
	if err := cfg.checkAlignment(align); err != nil {
		return nil, err
	}
	cfg.Engine = diskio.EngineFor(fs, cfg.Engine)
	e := &EntryLog{
		cfg:     cfg,
		fs:      fs,
		dir:     cfg.Dir,
		align:   align,
		log:     cfg.Logger.With("entrylog", cfg.Dir),
		logs:    make(map[uint64]struct{}),
		writing: make(map[uint64]int64),
		handles: make(map[uint64]*readHandle),
	}
	if !cfg.Fallocate {
		e.fallocateOff.Store(true)
	}
	names, err := fs.List(cfg.Dir)
	if err != nil {
		return nil, err
	}
	ids := listLogIDs(names)
	last, err := e.readLastID()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		e.logs[id] = struct{}{}
		last = max(last, id)
	}
	e.nextID = last + 1
	if err := e.openPools(); err != nil {
		return nil, err
	}
	if err := e.w.init(e); err != nil {
		e.closePools()
		return nil, err
	}
	return e, nil
}

func (e *EntryLog) openPools() error {
	if err := e.small.open(smallBufferSize(e.cfg.ReadBufferSize, e.align), e.cfg.ReadBuffers); err != nil {
		return err
	}
	if err := e.large.open(largeBufferSize(e.cfg.MaxEntrySize, e.align), e.cfg.LargeReadBuffers); err != nil {
		e.small.close()
		return err
	}
	return nil
}

func (e *EntryLog) closePools() {
	e.small.close()
	e.large.close()
}

// Dir returns the directory of the logs.
func (e *EntryLog) Dir() string { return e.dir }

// Alignment returns the alignment of writes and reads (at least 4096).
func (e *EntryLog) Alignment() int { return e.align }

// Engine returns the engine that writes the buffers.
func (e *EntryLog) Engine() diskio.Engine { return e.w.ws.Engine() }

// Path returns the path of log id.
func (e *EntryLog) Path(id uint64) string { return filepath.Join(e.dir, FileName(id)) }

// CurrentLogID returns the id of the log being written.
func (e *EntryLog) CurrentLogID() uint64 { return e.current.Load() }

// Logs returns the ids of the existing logs, ascending, the current one included.
func (e *EntryLog) Logs() []uint64 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	ids := make([]uint64, 0, len(e.logs))
	for id := range e.logs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// CompletedLogs returns the ids of the logs this instance no longer writes, ascending: logs it
// has finalized and logs left by an earlier run (finalized or not). Their contents never change
// again, so garbage collection may read, compact and remove them; the log being written, a
// sealed one whose finalization is pending and one being prepared are left out.
func (e *EntryLog) CompletedLogs() []uint64 {
	e.mu.RLock()
	defer e.mu.RUnlock()
	ids := make([]uint64, 0, len(e.logs))
	for id := range e.logs {
		if _, writing := e.writing[id]; !writing {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Size returns the size of log id's file (what it takes on disk, preallocated space
// included). Safe for concurrent use.
func (e *EntryLog) Size(id uint64) (int64, error) {
	h, _, err := e.acquire(id)
	if err != nil {
		return 0, err
	}
	defer e.release(h)
	n, err := h.f.Size()
	if err != nil {
		return 0, fmt.Errorf("entrylog: size of %s: %w", h.path, err)
	}
	return n, nil
}

// Remove deletes log id and makes the deletion durable (fsync of the directory). It refuses
// (ErrLogInUse) a log this instance is writing or has not yet finalized. Reads in progress on
// the log finish; later ones get ErrNoSuchLog.
func (e *EntryLog) Remove(id uint64) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	if _, ok := e.writing[id]; ok {
		e.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrLogInUse, e.Path(id))
	}
	if _, ok := e.logs[id]; !ok {
		e.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrNoSuchLog, e.Path(id))
	}
	delete(e.logs, id)
	h := e.handles[id]
	delete(e.handles, id)
	e.mu.Unlock()
	if h != nil {
		h.release()
	}
	if err := e.fs.Remove(e.Path(id)); err != nil {
		if errors.Is(err, diskio.ErrNotExist) {
			return fmt.Errorf("%w: %s: %w", ErrNoSuchLog, e.Path(id), err)
		}
		return fmt.Errorf("entrylog: remove %s: %w", e.Path(id), err)
	}
	if err := e.fs.SyncDir(e.dir); err != nil {
		return fmt.Errorf("entrylog: sync %s after removing %s: %w", e.dir, FileName(id), err)
	}
	return nil
}

// Close seals and finalizes the current log (ledgers map, header, fsync), waits for reads in
// progress and releases everything. Only the writer goroutine may call it. It returns the
// writer's sticky error, if any.
func (e *EntryLog) Close() error {
	if errors.Is(e.w.err, ErrClosed) {
		return ErrClosed
	}
	err := e.w.close()
	e.mu.Lock()
	e.closed = true
	handles := e.handles
	e.handles = nil
	e.mu.Unlock()
	e.readers.Wait()
	for _, h := range handles {
		h.release()
	}
	e.closePools()
	return err
}

// acquire returns a read handle for log id and the offset below which it may be read. The
// caller must call e.release(h).
func (e *EntryLog) acquire(id uint64) (*readHandle, int64, error) {
	e.mu.RLock()
	h, limit, err := e.lookupLocked(id)
	if h != nil {
		h.refs.Add(1)
		e.readers.Add(1)
	}
	e.mu.RUnlock()
	if h != nil || err != nil {
		return h, limit, err
	}
	return e.openHandle(id)
}

// lookupLocked finds the handle of id (nil if none is open) and its read limit.
func (e *EntryLog) lookupLocked(id uint64) (*readHandle, int64, error) {
	if e.closed {
		return nil, 0, ErrClosed
	}
	if _, ok := e.logs[id]; !ok {
		return nil, 0, fmt.Errorf("%w: %s", ErrNoSuchLog, e.Path(id))
	}
	limit, ok := e.writing[id]
	if !ok {
		limit = math.MaxInt64
	}
	return e.handles[id], limit, nil
}

// openHandle opens a read handle for id, closing an idle one if MaxOpenReadFiles are open.
func (e *EntryLog) openHandle(id uint64) (*readHandle, int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h, limit, err := e.lookupLocked(id)
	if err != nil {
		return nil, 0, err
	}
	if h == nil {
		path := e.Path(id)
		f, err := e.fs.Open(path, diskio.Options{Direct: true, ReadOnly: true})
		if err != nil {
			if errors.Is(err, diskio.ErrNotExist) {
				return nil, 0, fmt.Errorf("%w: %s: %w", ErrNoSuchLog, path, err)
			}
			return nil, 0, fmt.Errorf("entrylog: open %s: %w", path, err)
		}
		if len(e.handles) >= e.cfg.MaxOpenReadFiles {
			for oid, old := range e.handles {
				// With the lock held exclusively no reader can take old: refs == 1 means
				// only the map holds it.
				if old.refs.Load() == 1 {
					delete(e.handles, oid)
					old.release()
					break
				}
			}
		}
		if e.readAlign == 0 {
			e.readAlign = min(e.align, max(512, e.fs.Alignment(path)))
		}
		h = &readHandle{id: id, path: path, salt: logSalt(id), f: f, align: e.readAlign}
		if _, writing := e.writing[id]; writing {
			h.dataStart.Store(int64(e.align)) // e.header
		}
		h.refs.Store(1)
		e.handles[id] = h
	}
	h.refs.Add(1)
	e.readers.Add(1)
	return h, limit, nil
}

// release gives back a handle taken by acquire.
func (e *EntryLog) release(h *readHandle) {
	h.release()
	e.readers.Done()
}

func (h *readHandle) release() {
	if h.refs.Add(-1) == 0 {
		h.f.Close()
	}
}

// setLimit publishes the readable end of a log being written.
func (e *EntryLog) setLimit(id uint64, limit int64) {
	e.mu.Lock()
	e.writing[id] = limit
	e.mu.Unlock()
}

// allocateID reserves the next log id (and keeps Remove away from it).
func (e *EntryLog) allocateID() (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	id := e.nextID
	if id > maxLogID {
		return 0, fmt.Errorf("%w: next id %x in %s", ErrIDsExhausted, id, e.dir)
	}
	e.nextID++
	e.writing[id] = 0
	return id, nil
}

// readLastID reads the lastId file (0 if there is none).
func (e *EntryLog) readLastID() (uint64, error) {
	path := filepath.Join(e.dir, lastIDName)
	b, err := diskio.ReadFile(e.fs, path, 4096)
	if errors.Is(err, diskio.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("entrylog: read %s: %w", path, err)
	}
	id, err := decodeLastID(b)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w (it guards against reusing log ids; remove it only if no log was ever deleted from %s)",
			ErrCorrupt, path, err, e.dir)
	}
	return id, nil
}

// readPool is a bounded pool of aligned read buffers. get blocks while all are in use.
type readPool struct {
	slab *diskio.Slab
	free chan int
}

func (p *readPool) open(size, count int) error {
	slab, err := diskio.NewSlab(size, count)
	if err != nil {
		return err
	}
	p.slab = slab
	p.free = make(chan int, count)
	for i := range count {
		p.free <- i
	}
	return nil
}

func (p *readPool) get() (int, []byte) {
	i := <-p.free
	return i, p.slab.Buffer(i)
}

func (p *readPool) put(i int) { p.free <- i }

func (p *readPool) close() {
	if p.slab != nil {
		p.slab.Close()
		p.slab = nil
	}
}
