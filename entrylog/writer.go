package entrylog

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// writer is the state of the single writer (the goroutine that calls Add, Flush and Close).
// Nothing in it is shared, except that the preparing goroutine hands a new log over prep.
type writer struct {
	e *EntryLog
	// slab holds the write buffers; ws writes them (registered with io_uring when it serves).
	slab *diskio.Slab
	ws   diskio.WriteSyncer
	// headers holds two header blocks: 0 for the writer (finalize), 1 for the preparing
	// goroutine (new logs). Only one log is prepared at a time.
	headers *diskio.Slab
	// bufLog is the log each in-flight buffer is written to, by buffer index.
	bufLog   []*wlog
	free     []int
	inFlight int
	// cur is the buffer being filled (-1: none; the next byte starts a new one at bufOff).
	cur  int
	used int
	// bufOff is the file offset where the current buffer starts; always aligned.
	bufOff int64
	// log is the log being written; pending is a sealed log whose finalization waits for the
	// next Flush (or roll, or Close).
	log     *wlog
	pending *wlog
	// ledgers is the current log's ledgers map: ledger id → bytes of its records.
	ledgers map[int64]uint64
	pairs   []ledgerBytes
	mapBuf  []byte
	// hdr is where record headers are encoded: a local array would escape to the heap
	// (crc32 calls through a function value), costing an allocation per Add.
	hdr [recordHeaderSize]byte
	// prepareAt is the offset past which the next log is prepared in the background.
	prepareAt int64
	prep      chan preparedLog
	preparing bool
	// err is sticky: the first write, sync or create error, then ErrClosed.
	err error
}

// wlog is a log the writer owns.
type wlog struct {
	id        uint64
	f         diskio.File
	path      string
	salt      uint32
	dataStart int64
	// durable is the offset below which everything is durable: the end of the last completed
	// Flush. Padding records carry it as their claim.
	durable int64
	// dirty says whether a write was submitted since the last sync.
	dirty    bool
	inFlight int
	// mapOffset and mapCount describe the ledgers map once the log is sealed.
	mapOffset int64
	mapCount  int
	closed    bool
}

type preparedLog struct {
	log *wlog
	err error
}

func (w *writer) init(e *EntryLog) error {
	w.e = e
	bufSize := int(diskio.AlignUp(int64(e.cfg.WriteBufferSize), e.align))
	slab, err := diskio.NewSlab(bufSize, e.cfg.WriteBuffers)
	if err != nil {
		return err
	}
	headers, err := diskio.NewSlab(e.align, 2)
	if err != nil {
		slab.Close()
		return err
	}
	ws, err := diskio.NewWriteSyncer(e.cfg.Engine, e.cfg.WriteBuffers, slab.Buffers())
	if err != nil {
		slab.Close()
		headers.Close()
		return err
	}
	w.slab, w.headers, w.ws = slab, headers, ws
	w.bufLog = make([]*wlog, e.cfg.WriteBuffers)
	for i := range e.cfg.WriteBuffers {
		w.free = append(w.free, i)
	}
	w.cur = -1
	w.ledgers = make(map[int64]uint64)
	w.mapBuf = make([]byte, 0, mapChunkLedgers*mapPairSize)
	w.prep = make(chan preparedLog, 1)
	first, err := w.createLog()
	if err != nil {
		ws.Close()
		for range ws.Completions() {
		}
		slab.Close()
		headers.Close()
		return err
	}
	w.switchTo(first)
	return nil
}

// Add appends a stored entry to the current log, rolling to a new log first if it does not fit,
// and returns its location. The entry is copied; the caller may reuse it at once. The location
// may be read only after the next Flush has returned. Single-writer: see EntryLog.
func (e *EntryLog) Add(ledgerID, entryID int64, entry []byte) (Location, error) {
	return e.AddChecksummed(ledgerID, entryID, entry, payloadChecksum(entry))
}

// AddChecksummed is Add for a caller that has computed the entry's CRC32C (Castagnoli)
// already, as the engine does once when an entry enters its write cache. crc must be right:
// a wrong one makes the record read back as corrupt.
func (e *EntryLog) AddChecksummed(ledgerID, entryID int64, entry []byte, crc uint32) (Location, error) {
	w := &e.w
	if w.err != nil {
		return 0, w.err
	}
	if len(entry) > e.cfg.MaxEntrySize {
		return 0, fmt.Errorf("%w: %d bytes, limit %d", ErrEntryTooLarge, len(entry), e.cfg.MaxEntrySize)
	}
	size := int64(recordHeaderSize + len(entry))
	if w.pos()+size > e.cfg.LogSizeLimit {
		if err := w.roll(); err != nil {
			return 0, err
		}
	}
	l := w.log
	off := w.pos()
	putRecordHeader(w.hdr[:], l.salt, recordData, uint64(ledgerID), uint64(entryID), len(entry), crc)
	if err := w.put(w.hdr[:]); err != nil {
		return 0, err
	}
	if err := w.put(entry); err != nil {
		return 0, err
	}
	w.ledgers[ledgerID] += uint64(size)
	if !w.preparing && w.pos() >= w.prepareAt {
		w.startPrepare()
	}
	return NewLocation(l.id, off), nil
}

// Flush makes every entry added so far durable and readable: it pads the partial buffer to the
// alignment, writes it, waits for every write, finalizes a log rolled since the last Flush and
// fdatasyncs the current log. Later entries start at the next aligned offset: a flushed block is
// never written again. An error is sticky: every later Add and Flush fails with it.
// Single-writer: see EntryLog.
func (e *EntryLog) Flush() error {
	w := &e.w
	if w.err != nil {
		return w.err
	}
	if err := w.padAndSubmit(); err != nil {
		return err
	}
	if err := w.waitAll(); err != nil {
		return err
	}
	if p := w.pending; p != nil {
		if err := w.finalize(p); err != nil {
			return err
		}
		w.pending = nil
	}
	l := w.log
	if l.dirty {
		if err := l.f.SyncData(); err != nil {
			return w.fail(fmt.Errorf("entrylog: fdatasync %s: %w", l.path, err))
		}
		l.dirty = false
	}
	if d := w.pos(); d != l.durable {
		l.durable = d
		e.setLimit(l.id, d)
	}
	return nil
}

// pos is the offset of the next record in the current log.
func (w *writer) pos() int64 { return w.bufOff + int64(w.used) }

func (w *writer) fail(err error) error {
	if w.err == nil {
		w.err = err
		w.e.log.Error("entry log writer failed; every later add fails", "err", err)
	}
	return w.err
}

// put appends p to the buffers, submitting each one that fills.
func (w *writer) put(p []byte) error {
	for len(p) > 0 {
		if w.cur < 0 {
			if err := w.takeBuffer(); err != nil {
				return err
			}
		}
		buf := w.slab.Buffer(w.cur)
		n := copy(buf[w.used:], p)
		w.used += n
		p = p[n:]
		if w.used == len(buf) {
			if err := w.submit(); err != nil {
				return err
			}
		}
	}
	return nil
}

// putZeros appends n zero bytes.
func (w *writer) putZeros(n int) error {
	for n > 0 {
		if w.cur < 0 {
			if err := w.takeBuffer(); err != nil {
				return err
			}
		}
		buf := w.slab.Buffer(w.cur)
		k := min(n, len(buf)-w.used)
		clear(buf[w.used : w.used+k])
		w.used += k
		n -= k
		if w.used == len(buf) {
			if err := w.submit(); err != nil {
				return err
			}
		}
	}
	return nil
}

// takeBuffer makes a free buffer current, waiting for a write to complete if none is free.
func (w *writer) takeBuffer() error {
	for len(w.free) == 0 {
		if err := w.reap(); err != nil {
			return err
		}
	}
	w.cur = w.free[len(w.free)-1]
	w.free = w.free[:len(w.free)-1]
	w.used = 0
	return nil
}

// submit writes the current buffer (its used part, a multiple of the alignment) at bufOff
// without waiting.
func (w *writer) submit() error {
	l := w.log
	i := w.cur
	err := w.ws.Submit(diskio.WriteRequest{
		File: l.f, Buf: w.slab.Buffer(i)[:w.used], BufIndex: i, Offset: w.bufOff,
		Sync: diskio.SyncNone, ID: uint64(i),
	})
	if err != nil {
		return w.fail(fmt.Errorf("entrylog: write %s at %d: %w", l.path, w.bufOff, err))
	}
	w.bufLog[i] = l
	l.inFlight++
	l.dirty = true
	w.inFlight++
	w.bufOff += int64(w.used)
	w.cur, w.used = -1, 0
	return nil
}

// reap waits for one write to complete and frees its buffer.
func (w *writer) reap() error {
	c, ok := <-w.ws.Completions()
	if !ok {
		w.inFlight = 0
		return w.fail(errors.New("entrylog: write syncer stopped"))
	}
	i := int(c.ID)
	l := w.bufLog[i]
	w.bufLog[i] = nil
	l.inFlight--
	w.inFlight--
	w.free = append(w.free, i)
	if c.Err != nil {
		return w.fail(fmt.Errorf("entrylog: write %s: %w", l.path, c.Err))
	}
	return w.err
}

// waitAll waits for every write in flight.
func (w *writer) waitAll() error {
	for w.inFlight > 0 {
		if err := w.reap(); err != nil {
			return err
		}
	}
	return w.err
}

// padAndSubmit ends the current run of records with a padding record up to the next aligned
// offset and submits the partial buffer. The padding carries the durable claim.
func (w *writer) padAndSubmit() error {
	if w.cur < 0 {
		return w.err // already at an aligned offset
	}
	l := w.log
	pos := w.pos()
	end := diskio.AlignUp(pos+recordHeaderSize, w.e.align)
	padLen := int(end - pos - recordHeaderSize)
	putRecordHeader(w.hdr[:], l.salt, recordPadding, uint64(l.durable), 0, padLen, 0)
	if err := w.put(w.hdr[:]); err != nil {
		return err
	}
	if err := w.putZeros(padLen); err != nil {
		return err
	}
	if w.cur >= 0 {
		return w.submit()
	}
	return nil
}

// roll seals the current log and switches to the next one (prepared in the background).
func (w *writer) roll() error {
	next, err := w.nextLog()
	if err != nil {
		return w.fail(err)
	}
	if err := w.seal(); err != nil {
		w.discard(next)
		return err
	}
	w.switchTo(next)
	return nil
}

// seal appends the current log's ledgers map and a padding record, and makes the log pending:
// the next Flush (or roll, or Close) finalizes it. A log pending from before is finalized
// first, so at most one is pending.
func (w *writer) seal() error {
	if p := w.pending; p != nil {
		if err := w.finalize(p); err != nil {
			return err
		}
		w.pending = nil
	}
	l := w.log
	l.mapOffset = w.pos()
	w.pairs = w.pairs[:0]
	for id, n := range w.ledgers {
		w.pairs = append(w.pairs, ledgerBytes{id, n})
	}
	slices.SortFunc(w.pairs, func(a, b ledgerBytes) int { return cmp.Compare(a.ledgerID, b.ledgerID) })
	count := len(w.pairs)
	for chunk := 0; ; chunk++ {
		pairs := w.pairs[chunk*mapChunkLedgers : min((chunk+1)*mapChunkLedgers, count)]
		payload := putMapPairs(w.mapBuf[:0], pairs)
		putRecordHeader(w.hdr[:], l.salt, recordLedgersMap, uint64(count), uint64(chunk), len(payload), payloadChecksum(payload))
		if err := w.put(w.hdr[:]); err != nil {
			return err
		}
		if err := w.put(payload); err != nil {
			return err
		}
		if (chunk+1)*mapChunkLedgers >= count {
			break
		}
	}
	l.mapCount = count
	if err := w.padAndSubmit(); err != nil {
		return err
	}
	clear(w.ledgers)
	w.pending = l
	return nil
}

// finalize makes sealed log l durable and points its header at its ledgers map: wait for its
// writes, fdatasync, rewrite the header, fsync. The header is written only after the map is
// durable, so a header that names a map is always backed by it.
func (w *writer) finalize(l *wlog) error {
	for l.inFlight > 0 {
		if err := w.reap(); err != nil {
			return err
		}
	}
	if w.err != nil {
		return w.err
	}
	if err := l.f.SyncData(); err != nil {
		return w.fail(fmt.Errorf("entrylog: fdatasync %s: %w", l.path, err))
	}
	buf := w.headers.Buffer(0)[:w.e.align]
	w.e.header(l.id, l.mapOffset, l.mapCount).encode(buf)
	if _, err := l.f.WriteAt(buf, 0); err != nil {
		return w.fail(fmt.Errorf("entrylog: write header of %s: %w", l.path, err))
	}
	if err := l.f.Sync(); err != nil {
		return w.fail(fmt.Errorf("entrylog: fsync %s: %w", l.path, err))
	}
	l.dirty = false
	l.closed = true
	if err := l.f.Close(); err != nil {
		w.e.log.Warn("closing finalized entry log", "file", l.path, "err", err)
	}
	w.e.mu.Lock()
	delete(w.e.writing, l.id)
	w.e.mu.Unlock()
	return nil
}

// header returns the header of log id.
func (e *EntryLog) header(id uint64, mapOffset int64, mapCount int) logHeader {
	return logHeader{
		version:      formatVersion,
		headerSize:   uint32(e.align),
		logID:        id,
		mapOffset:    uint64(mapOffset),
		mapCount:     uint32(mapCount),
		maxEntrySize: uint32(e.cfg.MaxEntrySize),
	}
}

// switchTo makes l the current log.
func (w *writer) switchTo(l *wlog) {
	e := w.e
	w.log = l
	w.bufOff, w.cur, w.used = l.dataStart, -1, 0
	w.prepareAt = max(l.dataStart, e.cfg.LogSizeLimit/2)
	e.mu.Lock()
	e.logs[l.id] = struct{}{}
	e.writing[l.id] = l.dataStart
	e.mu.Unlock()
	e.current.Store(l.id)
}

// startPrepare creates the next log in the background.
func (w *writer) startPrepare() {
	w.preparing = true
	buf := w.headers.Buffer(1)[:w.e.align]
	go func() {
		l, err := w.e.createLogWith(buf)
		w.prep <- preparedLog{l, err}
	}()
}

// nextLog returns the prepared log, preparing it now if that has not started. A log prepared
// in the background was prepared when the current one was half full, possibly long before: a
// failure then (a disk full for a moment) says nothing about now and holds no entry, so it is
// retried once, here, before the roll fails the writer. The retry takes a new id (ids are never
// reused, and nothing requires them to follow each other).
func (w *writer) nextLog() (*wlog, error) {
	if !w.preparing {
		w.startPrepare()
	}
	r := <-w.prep
	w.preparing = false
	if r.err != nil {
		w.e.log.Warn("preparing the next entry log failed; preparing it again", "err", r.err)
		r.log, r.err = w.createLog()
	}
	return r.log, r.err
}

// createLog creates a log synchronously (the first one, at Open).
func (w *writer) createLog() (*wlog, error) {
	return w.e.createLogWith(w.headers.Buffer(1)[:w.e.align])
}

// createLogWith allocates an id, persists it as the highest id ever allocated, then creates the
// log exclusively, reserves its space, writes its header and syncs it and the directory.
func (e *EntryLog) createLogWith(hdr []byte) (*wlog, error) {
	id, err := e.allocateID()
	if err != nil {
		return nil, err
	}
	l, err := e.createLog(id, hdr)
	if err != nil {
		e.mu.Lock()
		delete(e.writing, id)
		e.mu.Unlock()
		return nil, err
	}
	return l, nil
}

func (e *EntryLog) createLog(id uint64, hdr []byte) (*wlog, error) {
	lastID := filepath.Join(e.dir, lastIDName)
	if err := diskio.WriteFileAtomic(e.fs, lastID, encodeLastID(id)); err != nil {
		return nil, fmt.Errorf("entrylog: persist %s = %x: %w", lastID, id, err)
	}
	path := e.Path(id)
	f, err := e.fs.Create(path, diskio.Options{Direct: true})
	if err != nil {
		return nil, fmt.Errorf("entrylog: create %s: %w", path, err)
	}
	fail := func(err error) (*wlog, error) {
		f.Close()
		e.fs.Remove(path)
		return nil, fmt.Errorf("entrylog: create %s: %w", path, err)
	}
	if !e.fallocateOff.Load() {
		if err := f.Allocate(0, e.cfg.LogSizeLimit); err != nil {
			if !errors.Is(err, errors.ErrUnsupported) {
				return fail(err)
			}
			if e.fallocateOff.CompareAndSwap(false, true) {
				e.log.Warn("fallocate is not supported here; entry logs grow as they are written", "err", err)
			}
		}
	}
	e.header(id, 0, 0).encode(hdr)
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := e.fs.SyncDir(e.dir); err != nil {
		return fail(err)
	}
	return &wlog{id: id, f: f, path: path, salt: logSalt(id), dataStart: int64(e.align), durable: int64(e.align)}, nil
}

// discard removes a prepared log that was never written to.
func (w *writer) discard(l *wlog) {
	e := w.e
	l.f.Close()
	if err := e.fs.Remove(l.path); err == nil {
		e.fs.SyncDir(e.dir)
	}
	e.mu.Lock()
	delete(e.writing, l.id)
	e.mu.Unlock()
}

// close seals and finalizes the current log, waits for every write, removes an unused prepared
// log and frees the buffers. It returns the sticky error, if any.
func (w *writer) close() error {
	if w.err == nil {
		err := w.seal()
		if err == nil {
			err = w.waitAll()
		}
		if err == nil && w.pending != nil {
			if err = w.finalize(w.pending); err == nil {
				w.pending = nil
			}
		}
	}
	for w.inFlight > 0 {
		w.reap()
	}
	w.ws.Close()
	for range w.ws.Completions() {
	}
	for _, l := range []*wlog{w.pending, w.log} {
		if l != nil && !l.closed {
			l.closed = true
			l.f.Close()
		}
	}
	if w.preparing {
		if r := <-w.prep; r.err == nil {
			w.discard(r.log)
		}
		w.preparing = false
	}
	w.slab.Close()
	w.headers.Close()
	err := w.err
	w.err = ErrClosed
	return err
}
