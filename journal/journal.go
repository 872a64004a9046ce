package journal

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// Sentinel errors.
var (
	// ErrClosed is returned for records appended after Close.
	ErrClosed = errors.New("journal: closed")
	// ErrRecordTooLarge is returned for a payload above MaxRecordSize.
	ErrRecordTooLarge = errors.New("journal: record too large")
	// ErrCorruption is wrapped by replay errors about damaged files (not a torn tail).
	ErrCorruption = errors.New("journal: corruption")
	// ErrMissingFile is returned when a file that replay needs is gone.
	ErrMissingFile = errors.New("journal: journal file needed for replay is missing")
)

// Entry is one record to journal. The caller owns it: it must not change or reuse it, nor its
// Payload, until Done has been called.
type Entry struct {
	Type     RecordType
	LedgerID int64
	EntryID  int64
	Payload  []byte
	// Done is called exactly once, after the record is durable (err == nil) or has failed.
	// Calls come in journal order, on the journal's completion goroutine; Done must not block.
	Done func(e *Entry, err error)
	// Ctx is free for the caller.
	Ctx any

	payloadCRC uint32
	crcSet     bool // SetPayloadCRC was called since the last Append
}

// SetPayloadCRC gives Append the CRC32C (Castagnoli) of Payload, for a caller that computed
// it already; Append then does not compute it. A wrong crc makes the record fail its check at
// replay. It holds for the next Append or AppendBatch of e only, whatever its outcome: an Entry
// reused after a refused Append (a pooled one) must not carry the CRC to another payload.
func (e *Entry) SetPayloadCRC(crc uint32) { e.payloadCRC, e.crcSet = crc, true }

// sealPayload makes sure payloadCRC is Payload's CRC32C.
func (e *Entry) sealPayload() {
	if !e.crcSet {
		e.payloadCRC = payloadChecksum(e.Payload)
	}
	e.crcSet = false
}

// Stats are cumulative counters. Safe to read at any time.
type Stats struct {
	Groups       atomic.Uint64
	Entries      atomic.Uint64
	Bytes        atomic.Uint64 // bytes written, padding included
	Syncs        atomic.Uint64
	SyncNanos    atomic.Uint64 // total time from submit to completion of synced groups
	QueueDepth   atomic.Int64  // records waiting in the queue (sampled by the writer)
	FilesCreated atomic.Uint64
	FilesReused  atomic.Uint64
}

// Journal is a group-committed write-ahead log in one directory. Append is safe for concurrent
// use; one owner goroutine writes, a second runs callbacks in order.
type Journal struct {
	cfg    Config
	fs     diskio.FS
	log    *slog.Logger
	salted bool

	q     *queue
	slab  *diskio.Slab
	ws    diskio.WriteSyncer
	files *fileManager

	// released returns completed groups from the completion goroutine to the owner.
	released chan *group
	// groups are all groups, indexed by buffer index (the WriteRequest id). Set by the owner
	// before groupsReady is closed, read-only afterwards.
	groups      []*group
	groupsReady chan struct{}
	// callbacks carries finished groups' records to the callback goroutine; callbackSlices
	// circulates the slices that hold them (a fixed set, so memory stays bounded).
	callbacks      chan callbackBatch
	callbackSlices chan []*Entry

	// sticky holds the first durability error; once set, every record fails with it.
	sticky atomic.Pointer[error]

	// markMu guards mark.
	markMu sync.Mutex
	mark   Mark

	stats Stats

	ownerDone     chan struct{}
	completerDone chan struct{}
	closeOnce     sync.Once
}

// group is one commit: records laid out in a slab buffer, written at start in file.
type group struct {
	seq      uint64
	bufIndex int
	buf      []byte
	used     int
	file     *journalFile
	start    int64
	end      int64
	synced   bool
	fileEnd  bool // holds only the file-end record: the mark stays before it
	err      error
	firstNs  int64 // when the writer took its first record from the queue
	queuedNs int64 // when that record's batch began to queue
	submitNs int64
	entries  []*Entry
}

// Open starts a journal in cfg.Dir. It does not replay: call Replay first. It always starts a
// new file, with an id above every existing one.
func Open(cfg Config) (*Journal, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.FS.MkdirAll(cfg.Dir); err != nil {
		return nil, err
	}
	cfg.Alignment = max(cfg.Alignment, cfg.FS.Alignment(cfg.Dir))
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	j := &Journal{
		cfg:            cfg,
		fs:             cfg.FS,
		log:            cfg.Logger.With("journal", cfg.Dir),
		q:              newQueue(cfg.QueueSize),
		released:       make(chan *group, cfg.PipelineDepth+1),
		groupsReady:    make(chan struct{}),
		callbacks:      make(chan callbackBatch, cfg.PipelineDepth+2),
		callbackSlices: make(chan []*Entry, cfg.PipelineDepth+3),
		ownerDone:      make(chan struct{}),
		completerDone:  make(chan struct{}),
	}
	groups := cfg.PipelineDepth + 1
	slab, err := diskio.NewSlab(cfg.groupCapacity(), groups)
	if err != nil {
		return nil, err
	}
	j.slab = slab
	j.cfg.Engine = diskio.EngineFor(cfg.FS, cfg.Engine)
	ws, err := diskio.NewWriteSyncer(j.cfg.Engine, cfg.PipelineDepth, slab.Buffers())
	if err != nil {
		slab.Close()
		return nil, err
	}
	j.ws = ws
	j.files, err = newFileManager(&j.cfg, &j.stats, j.log)
	if err != nil {
		ws.Close()
		slab.Close()
		return nil, err
	}
	first, err := j.files.next()
	if err != nil {
		j.files.close()
		ws.Close()
		slab.Close()
		return nil, err
	}
	j.mark = Mark{FileID: first.id, Offset: first.dataStart}
	free := make([]*group, groups)
	for i := range free {
		free[i] = &group{bufIndex: i, buf: slab.Buffer(i)}
	}
	for range cap(j.callbackSlices) {
		j.callbackSlices <- nil
	}
	go j.runOwner(first, free)
	go j.runSequencer()
	go j.runCallbacks()
	return j, nil
}

// Engine reports the I/O engine in use.
func (j *Journal) Engine() diskio.Engine { return j.ws.Engine() }

// Stats returns the journal's counters.
func (j *Journal) Stats() *Stats { return &j.stats }

// Dir returns the journal directory.
func (j *Journal) Dir() string { return j.cfg.Dir }

// Append queues e. It blocks while the queue is full. Once it returns nil, e.Done will be
// called; if it returns an error, e.Done is not called.
func (j *Journal) Append(e *Entry) error {
	if len(e.Payload) > j.cfg.MaxRecordSize {
		e.crcSet = false
		return fmt.Errorf("%w: %d bytes, limit %d", ErrRecordTooLarge, len(e.Payload), j.cfg.MaxRecordSize)
	}
	if err := j.Err(); err != nil {
		e.crcSet = false
		return err
	}
	e.sealPayload()
	return j.q.push(e)
}

// AppendBatch queues several entries at once, in order. It is all or nothing.
func (j *Journal) AppendBatch(es []*Entry) error {
	for i, e := range es {
		if len(e.Payload) > j.cfg.MaxRecordSize {
			for _, e := range es[i:] {
				e.crcSet = false
			}
			return fmt.Errorf("%w: %d bytes, limit %d", ErrRecordTooLarge, len(e.Payload), j.cfg.MaxRecordSize)
		}
		e.sealPayload()
	}
	if err := j.Err(); err != nil {
		return err
	}
	return j.q.push(es...)
}

// Backlogged reports whether Append would wait now: the queue holds journalQueueSize records
// (the disk is behind). A caller that must not block (an event loop) checks it first.
func (j *Journal) Backlogged() bool { return j.q.full() }

// Err returns the sticky durability error, if any.
func (j *Journal) Err() error {
	if p := j.sticky.Load(); p != nil {
		return *p
	}
	return nil
}

func (j *Journal) fail(err error) {
	if j.sticky.CompareAndSwap(nil, &err) {
		j.log.Error("journal failed; every later record fails", "err", err)
		j.q.close(err)
	}
}

// LastLogMark returns the durable end: every record before it has been fdatasynced.
func (j *Journal) LastLogMark() Mark {
	j.markMu.Lock()
	defer j.markMu.Unlock()
	return j.mark
}

// Close stops accepting records, commits what is queued, waits for it and closes the files.
// It returns the sticky error, if any.
func (j *Journal) Close() error {
	j.closeOnce.Do(func() {
		j.q.close(ErrClosed)
		<-j.ownerDone
		<-j.completerDone
		j.files.close()
		j.slab.Close()
	})
	if err := j.Err(); err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	return nil
}

// GC removes (or keeps for reuse) journal files wholly before persisted, keeping MaxBackups of
// them. persisted must be a mark that has been persisted (MarkStore.Persist).
func (j *Journal) GC(persisted Mark) error {
	return j.files.collect(persisted.FileID)
}

// FilePath returns the path of journal file id.
func (j *Journal) FilePath(id uint64) string { return filepath.Join(j.cfg.Dir, FileName(id)) }
