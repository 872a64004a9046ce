package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/index"
	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/journal"
)

// storedEntryHeader is the size of a BookKeeper stored entry's header: ledgerId, entryId,
// lastAddConfirmed and length, big-endian int64s, then the digest and payload.
const storedEntryHeader = 32

// Engine is a bookie's storage engine. All methods are safe for concurrent use.
type Engine struct {
	cfg      Config
	fs       diskio.FS
	log      *slog.Logger
	journals *journal.Set
	// markStores persist journal i's mark in every ledger dir.
	markStores []*journal.MarkStore
	dirs       []*ledgerDir
	ledgers    *ledgerTable
	// unlocks release the directory locks taken at Open (lockDirs).
	unlocks []func() error
	// snapshots counts the checkpoints' snapshots of the journal marks (see ledgerTable.deleting).
	snapshots atomic.Uint64

	readOnly atomic.Bool
	// diskFull refuses every add: below the space needed even for recovery adds.
	diskFull atomic.Bool
	// failed holds the sticky storage error (a failed flush or journal): adds fail with it.
	failed atomic.Pointer[error]
	// failedCh is closed when failed is set: it wakes adds waiting for write-cache space, which
	// no checkpoint will make any more.
	failedCh chan struct{}

	checkpointMu   sync.Mutex // one checkpoint at a time
	checkpointKick chan struct{}
	closing        chan struct{}
	checkpointDone chan struct{}
	// warmCancel stops the index warm-up goroutine, which closes warmDone when it returns.
	warmCancel context.CancelFunc
	warmDone   chan struct{}
	closeOnce  sync.Once

	addOps sync.Pool

	counters counters

	// gc is the garbage collector of entry logs (gc.go).
	gc *gc

	// checkpointHook, set by tests only, runs after each checkpoint step; an error stops the
	// checkpoint there, as a crash would.
	checkpointHook atomic.Pointer[func(step checkpointStep) error]
	// readHook, set by tests only, runs in a read between its index look-up and its entry-log
	// read.
	readHook atomic.Pointer[func(ledger, entry int64, loc uint64)]
}

// checkpointStep names the steps of a checkpoint, for crash tests.
type checkpointStep int

const (
	stepMarksSnapshot checkpointStep = iota + 1
	stepHalvesSwapped
	stepEntryLogSynced
	stepIndexSynced
	stepMarksPersisted
	stepJournalsCollected
	// Compaction of one entry log (compact.go): a chunk of live entries is collected (ready),
	// added to the entry log (copied), the log fsynced, the index updated and synced; after
	// the last chunk the old log is removed.
	stepCompactChunkReady
	stepCompactCopied
	stepCompactLogSynced
	stepCompactIndexSynced
	stepCompactLogRemoved
	// GC's refresh has committed the queued deletions and is about to list completed logs.
	stepGCDeletesCommitted
	// A checkpoint's flush (or replay's) has added the sealed half to the entry log (full
	// buffers submitted, nothing synced); the entry log's flush comes next.
	stepEntryLogWritten
	// The entry log rolled during a flush or a compaction chunk: the previous log is sealed
	// (its ledgers map appended, not waited for) and finalized only by the Flush that follows.
	stepEntryLogRolled
	// removeLogs has flushed pebble's memtable (the deletions and relocations that leave the
	// logs unreferenced are in its tables) and is about to remove the logs.
	stepLogsIndexFlushed
	// removeLogs has removed one log (the directory synced); more may follow.
	stepLogRemoved
	// commitDeletes has committed a batch of ledger deletions and tombstone removals (from
	// garbage collection: its refresh, or before removing logs).
	stepDeletesCommitted
)

// failpoint, set only by the kill tests' child process (kill_failpoint_test.go), is called at
// every step, before checkpointHook, and also inside Open (replay's flushes, the checkpoint
// after replay), where no engine's hook can be set yet. It kills the process and never
// returns. Unset, it costs a load and a branch per step, never per add.
var failpoint func(checkpointStep)

func (e *Engine) hook(step checkpointStep) error {
	if failpoint != nil {
		failpoint(step)
	}
	h := e.checkpointHook.Load()
	if h == nil || *h == nil {
		return nil
	}
	err := (*h)(step)
	if err != nil {
		e.fail(err)
	}
	return err
}

type counters struct {
	checkpoints      atomic.Uint64
	checkpointNanos  atomic.Uint64
	adds             atomic.Uint64
	reads            atomic.Uint64
	readCacheHits    atomic.Uint64
	readErrors       atomic.Uint64
	readErrorLogged  atomic.Int64 // when a failed read was last logged (monotime)
	indexWarmedBytes atomic.Int64
}

// Stats is a snapshot of the engine's counters, summed over ledger dirs.
type Stats struct {
	Checkpoints       uint64
	CheckpointSeconds float64
	Adds              uint64
	Reads             uint64
	ReadCacheHits     uint64
	// ReadErrors counts reads that failed on damaged or unreadable data (ErrIO: a checksum
	// mismatch, a read error), never those of a missing entry.
	ReadErrors     uint64
	Flushes        uint64
	FlushedEntries uint64
	FlushedBytes   uint64
	FlushSeconds   float64
	ThrottledAdds  uint64
	RejectedAdds   uint64
	// WriteCacheBytes is the bytes held by the active write-cache halves; WriteCacheCapacity
	// their total capacity (both halves).
	WriteCacheBytes    int64
	WriteCacheCapacity int64
	// IndexWarmedBytes is the size of the indexes warmed after Open (WarmIndex).
	IndexWarmedBytes int64
}

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	s := Stats{
		Checkpoints:       e.counters.checkpoints.Load(),
		CheckpointSeconds: float64(e.counters.checkpointNanos.Load()) / 1e9,
		Adds:              e.counters.adds.Load(),
		Reads:             e.counters.reads.Load(),
		ReadCacheHits:     e.counters.readCacheHits.Load(),
		ReadErrors:        e.counters.readErrors.Load(),
		IndexWarmedBytes:  e.counters.indexWarmedBytes.Load(),
	}
	for _, d := range e.dirs {
		s.Flushes += d.stats.flushes.Load()
		s.FlushedEntries += d.stats.flushedItems.Load()
		s.FlushedBytes += d.stats.flushedBytes.Load()
		s.FlushSeconds += float64(d.stats.flushNanos.Load()) / 1e9
		s.ThrottledAdds += d.stats.throttledAdds.Load()
		s.RejectedAdds += d.stats.rejectedAdds.Load()
		s.WriteCacheBytes += d.active.Load().bytes.Load()
		s.WriteCacheCapacity += d.halves[0].capacity + d.halves[1].capacity
	}
	return s
}

// Journals returns the engine's journals (for their statistics).
func (e *Engine) Journals() *journal.Set { return e.journals }

// Open starts the engine: it checks cookies, opens entry logs and indexes, loads ledger
// states, replays every journal from its persisted mark, opens the journals for writing and runs
// a checkpoint. Only then is the engine ready.
func Open(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:            cfg,
		fs:             cfg.FS,
		log:            cfg.Logger,
		checkpointKick: make(chan struct{}, 1),
		closing:        make(chan struct{}),
		checkpointDone: make(chan struct{}),
		failedCh:       make(chan struct{}),
	}
	e.ledgers = newLedgerTable(e.wallNow)
	e.addOps.New = func() any {
		op := &addOp{}
		op.entry.Ctx = op
		op.entry.Done = addJournaled
		return op
	}
	if err := e.lockDirs(); err != nil {
		return nil, err
	}
	opened := false
	defer func() {
		if !opened {
			e.unlockDirs()
		}
	}()
	want := e.Cookie()
	created, err := checkCookies(e.fs, append(append([]string(nil), cfg.JournalDirs...), cfg.LedgerDirs...), want, cfg.RequireExistingCookies)
	if err != nil {
		return nil, err
	}
	if created {
		e.log.Info("new bookie: cookies written", "dirs", len(cfg.JournalDirs)+len(cfg.LedgerDirs))
	}
	if err := e.openDirs(); err != nil {
		e.closeDirs()
		return nil, err
	}
	if err := e.checkIndexCheckpoints(); err != nil {
		e.closeDirs()
		return nil, err
	}
	if err := e.replay(); err != nil {
		e.closeDirs()
		return nil, err
	}
	var jcfgs []journal.Config
	for _, dir := range cfg.JournalDirs {
		jc := cfg.Journal
		jc.Dir = filepath.Join(dir, currentDir)
		jc.FS = e.fs
		jc.Logger = e.log
		jcfgs = append(jcfgs, jc)
	}
	if e.journals, err = journal.OpenSet(jcfgs); err != nil {
		e.closeDirs()
		return nil, err
	}
	if err := e.Checkpoint(); err != nil {
		e.journals.Close()
		e.closeDirs()
		return nil, fmt.Errorf("engine: checkpoint after replay: %w", err)
	}
	e.gc = newGC(e)
	go e.runCheckpoints()
	go e.gc.runLoop()
	var warmCtx context.Context
	warmCtx, e.warmCancel = context.WithCancel(context.Background())
	e.warmDone = make(chan struct{})
	go e.warmIndexes(warmCtx)
	opened = true
	return e, nil
}

// lockDirs takes every directory the engine writes (diskio's Lock) before it reads or writes
// anything there: a second bookie started on the same directories would otherwise create
// files (the next entry log) that the running one then fails on.
func (e *Engine) lockDirs() error {
	dirs := append(append([]string(nil), e.cfg.JournalDirs...), e.cfg.LedgerDirs...)
	if e.cfg.IndexDir != "" {
		dirs = append(dirs, e.cfg.IndexDir)
	}
	seen := make(map[string]bool)
	for _, dir := range dirs {
		dir = filepath.Clean(dir)
		if seen[dir] {
			continue // a journal dir may also be a ledger dir
		}
		seen[dir] = true
		unlock, err := e.fs.Lock(dir)
		if err != nil {
			e.unlockDirs()
			return fmt.Errorf("engine: %w", err)
		}
		e.unlocks = append(e.unlocks, unlock)
	}
	return nil
}

func (e *Engine) unlockDirs() {
	for _, unlock := range e.unlocks {
		unlock()
	}
	e.unlocks = nil
}

// warmIndexes warms every ledger dir's index (WarmIndex), one after the other, stopping at
// Close. A failure only costs speed: it is logged.
func (e *Engine) warmIndexes(ctx context.Context) {
	defer close(e.warmDone)
	if !e.cfg.WarmIndex {
		return
	}
	for _, d := range e.dirs {
		start := time.Now()
		n, err := d.idx.Warm(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			e.log.Warn("index warm-up failed", "dir", d.path, "err", err)
		case n > 0:
			e.counters.indexWarmedBytes.Add(n)
			e.log.Info("index warmed", "dir", d.path, "bytes", n, "took", time.Since(start))
		}
	}
}

// IndexesWarmed is closed once the index warm-up after Open has finished (or was skipped).
func (e *Engine) IndexesWarmed() <-chan struct{} { return e.warmDone }

func (e *Engine) openDirs() error {
	n := len(e.cfg.LedgerDirs)
	half := e.cfg.WriteCacheMaxSize / int64(n) / 2
	// A segment holds whole entries: one the largest entry does not fit would refuse it for
	// ever (as too many requests, after MaxThrottleTime) although it passed every limit.
	segSize := min(half, max(writeCacheSegmentSize, int64(e.cfg.Journal.MaxRecordSize)))
	var ledgerCurrents []string
	for i, dir := range e.cfg.LedgerDirs {
		cur := filepath.Join(dir, currentDir)
		ledgerCurrents = append(ledgerCurrents, cur)
		d := &ledgerDir{e: e, index: i, path: cur, space: make(chan struct{})}
		d.halves = [2]*cacheHalf{newCacheHalf(half, segSize), newCacheHalf(half, segSize)}
		d.halves[1].seal() // the spare takes no add until a flush activates it
		d.active.Store(d.halves[0])
		d.reads = newReadCache(e.cfg.ReadAheadCacheMaxSize/int64(n), 8)
		var err error
		if d.log, err = openEntryLog(e, cur); err != nil {
			return err
		}
		indexDir := filepath.Join(cur, "index")
		if e.cfg.IndexDir != "" {
			indexDir = filepath.Join(e.cfg.IndexDir, fmt.Sprintf("index%d", i))
		}
		d.indexPath = indexDir
		if d.idx, err = openIndex(e, indexDir); err != nil {
			d.log.Close()
			return err
		}
		d.batch = d.idx.NewBatch()
		d.gcBatch = d.idx.NewBatch()
		d.gc = dirGC{d: d, usage: make(map[uint64]*logUsage), bad: make(map[uint64]error)}
		e.dirs = append(e.dirs, d)
		err = d.idx.Ledgers(func(id int64, st ledgerState) bool {
			l := e.ledgers.load(id, st.MasterKey)
			l.fenced.Store(st.Fenced)
			l.fenceDurable = st.Fenced
			l.explicitLAC = st.ExplicitLAC
			return true
		})
		if err != nil {
			return fmt.Errorf("engine: load ledgers of %s: %w", cur, err)
		}
	}
	// After every dir's ledgers: a tombstone beside a ledger state is dropped.
	for _, d := range e.dirs {
		if err := e.loadFencedDeleted(d); err != nil {
			return err
		}
	}
	for i := range e.cfg.JournalDirs {
		e.markStores = append(e.markStores, journal.NewMarkStore(e.fs, ledgerCurrents, journal.MarkFileName(i, len(e.cfg.JournalDirs))))
	}
	return nil
}

// loadFencedDeleted loads the fenced-deleted tombstones of d's index (see
// fencedDeletedRetention). Expired ones, and any beside a state of the same ledger (the ledger
// was created again: after the tombstone expired in memory, or by an older build that ignores
// tombstones), are queued for removal instead, which the checkpoint that ends Open commits.
func (e *Engine) loadFencedDeleted(d *ledgerDir) error {
	now := e.wallNow()
	var loaded, expired, superseded int
	var drops []int64
	err := d.idx.FencedDeleted(func(id int64, deletedAt time.Time) bool {
		at := deletedAt.UnixNano()
		switch {
		case e.ledgers.get(id) != nil:
			superseded++
			drops = append(drops, id)
		case fencedDeletedExpired(now, at):
			expired++
			drops = append(drops, id)
		default:
			loaded++
			e.ledgers.loadFencedDeleted(id, at)
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("engine: load fenced-deleted ledgers of %s: %w", d.path, err)
	}
	d.dirtyMu.Lock()
	d.fencedDrops = append(d.fencedDrops, drops...)
	d.dirtyMu.Unlock()
	if loaded+expired+superseded > 0 {
		e.log.Info("ledgers deleted while fenced: writes to them stay refused", "dir", d.path,
			"loaded", loaded, "expired", expired, "created_again", superseded)
	}
	return nil
}

// wallNow is the wall clock in Unix nanoseconds (Config.WallClock).
func (e *Engine) wallNow() int64 { return e.cfg.WallClock().UnixNano() }

// expireFencedDeleted forgets the fenced deletions past fencedDeletedRetention and queues the
// removal of their tombstones from the index, which the garbage collection run's commit of
// deletions (or the next checkpoint) writes.
func (e *Engine) expireFencedDeleted() {
	n := e.ledgers.expireFencedDeleted(e.wallNow(), func(id int64) {
		d := e.dir(id)
		d.dirtyMu.Lock()
		d.fencedDrops = append(d.fencedDrops, id)
		d.dirtyMu.Unlock()
	})
	if n > 0 {
		e.log.Info("ledgers deleted while fenced: retention over, writes to them are allowed again",
			"ledgers", n, "retention", fencedDeletedRetention)
	}
}

func (e *Engine) closeDirs() error {
	var errs []error
	for _, d := range e.dirs {
		errs = append(errs, d.close())
	}
	return errors.Join(errs...)
}

// dir returns the ledger dir of a ledger.
func (e *Engine) dir(ledgerID int64) *ledgerDir { return e.dirs[journal.Index(ledgerID, len(e.dirs))] }

// Err returns the sticky storage error, if any.
func (e *Engine) Err() error {
	if p := e.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Failure returns the first sticky failure of the engine or of a journal (a failed write or
// fsync): nil while the engine can still take adds. Only a restart clears it.
func (e *Engine) Failure() error {
	if err := e.Err(); err != nil {
		return err
	}
	for _, j := range e.journals.Journals() {
		if err := j.Err(); err != nil {
			return fmt.Errorf("%w: journal %s: %w", ErrFailed, j.Dir(), err)
		}
	}
	return nil
}

func (e *Engine) fail(err error) {
	if e.failed.CompareAndSwap(nil, &err) {
		close(e.failedCh)
		e.log.Error("storage failed: adds are refused until restart", "err", err)
	}
}

// SetReadOnly turns read-only mode on or off. The engine only reports the mode: the server
// answers EREADONLY to adds other than recovery and high-priority adds, which may still be
// written while space remains.
func (e *Engine) SetReadOnly(ro bool) { e.readOnly.Store(ro) }

// SetDiskFull refuses every add (ErrReadOnly), recovery adds included, while the disk has
// less free space than even they may use.
func (e *Engine) SetDiskFull(full bool) { e.diskFull.Store(full) }

// ReadOnly reports whether the engine is in read-only mode.
func (e *Engine) ReadOnly() bool { return e.readOnly.Load() }

// Completions of asynchronous operations (Add, Fence, SetExplicitLAC) are plain
// func(ctx any, err error) values: they run on a journal goroutine, in journal order, and must
// not block. ctx is the caller's, passed through, so callers need no closure per operation.

// addOp carries one add through the journal; pooled so adds do not allocate.
type addOp struct {
	entry journal.Entry
	half  *cacheHalf
	done  func(ctx any, err error)
	ctx   any
	e     *Engine
}

func addJournaled(je *journal.Entry, err error) {
	op := je.Ctx.(*addOp)
	if op.half != nil {
		op.half.pendingJournal.Done()
	}
	done, ctx, e := op.done, op.ctx, op.e
	op.half, op.done, op.ctx, op.entry.Payload = nil, nil, nil, nil
	e.addOps.Put(op)
	if done != nil {
		done(ctx, err)
	}
}

// StoredEntryIDs returns the ledger and entry ids at the start of a stored entry.
func StoredEntryIDs(stored []byte) (ledgerID, entryID int64, err error) {
	if len(stored) < storedEntryHeader {
		return 0, 0, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrBadEntry, len(stored), storedEntryHeader)
	}
	ledgerID, entryID = int64(binary.BigEndian.Uint64(stored)), int64(binary.BigEndian.Uint64(stored[8:]))
	if ledgerID < 0 || entryID < 0 {
		// The index cannot hold them: stored, one would fail every later checkpoint.
		return 0, 0, fmt.Errorf("%w: negative id: ledger %d entry %d", ErrBadEntry, ledgerID, entryID)
	}
	return ledgerID, entryID, nil
}

// checkLedgerID refuses a negative ledger id (a fence or LAC record for one would fail every
// later checkpoint).
func checkLedgerID(ledgerID int64) error {
	if ledgerID < 0 {
		return fmt.Errorf("%w: negative ledger id %d", ErrBadEntry, ledgerID)
	}
	return nil
}

// Add stores an entry (a BookKeeper stored entry: ledgerId, entryId, LAC, length, digest,
// payload) under masterKey. It checks the key in constant time and the fenced state (recovery
// adds pass a fence), copies the entry into the write cache, and journals it; done runs once the
// journal record is durable. On a ledger's first add the ledger key is journaled first.
// A nil return means done will be called; otherwise it will not.
func (e *Engine) Add(masterKey, stored []byte, recovery bool, done func(ctx any, err error), ctx any) error {
	return e.add(masterKey, stored, recovery, done, ctx, true)
}

// errWouldBlock says both write-cache halves, or the journal's queue, are full and the caller
// did not want to wait.
var errWouldBlock = errors.New("engine: write cache or journal queue full")

// TryAdd is Add for callers that must not block (an event loop): when both write-cache halves
// are full (it asks for a checkpoint), or the journal's queue is, it returns queued=false with
// no error, instead of waiting;
// the caller then retries with Add from a goroutine that may wait up to MaxThrottleTime. Other
// refusals are errors, as from Add.
func (e *Engine) TryAdd(masterKey, stored []byte, recovery bool, done func(ctx any, err error), ctx any) (queued bool, err error) {
	err = e.add(masterKey, stored, recovery, done, ctx, false)
	if errors.Is(err, errWouldBlock) {
		return false, nil
	}
	return err == nil, err
}

func (e *Engine) add(masterKey, stored []byte, recovery bool, done func(ctx any, err error), ctx any, wait bool) error {
	ledgerID, entryID, err := StoredEntryIDs(stored)
	if err != nil {
		return err
	}
	if len(stored) > e.cfg.Journal.MaxRecordSize {
		// Neither the journal nor the entry log takes it: in the cache, it would fail the
		// next checkpoint and with it the engine.
		return fmt.Errorf("%w: entry of %d bytes, limit %d", ErrBadEntry, len(stored), e.cfg.Journal.MaxRecordSize)
	}
	if err := e.Err(); err != nil {
		return err
	}
	if e.diskFull.Load() {
		return fmt.Errorf("%w: the disk is full", ErrReadOnly)
	}
	// Under addMu from the fenced check to the journal: a fence either comes first (the add is
	// refused) or journals its record after this one, so no add that is not a recovery add is
	// acknowledged after the fence is durable. Likewise a deletion either comes first (the
	// ledger is looked up again: its id is refused until the deletion is covered, or it is a
	// new ledger) or drops this add's entry from the cache after it is put there.
	l, err := e.ledgerLockedForWrite(ledgerID, masterKey)
	if err != nil {
		return err
	}
	defer l.addMu.Unlock()
	if l.fenced.Load() && !recovery {
		return fmt.Errorf("%w: ledger %d", ErrFenced, ledgerID)
	}
	jl := e.journals.For(ledgerID)
	if !wait && jl.Backlogged() {
		return errWouldBlock // the journal's queue is full: Append would wait for the disk
	}
	half, mem, crc, err := e.dir(ledgerID).put(ledgerID, entryID, stored, true, wait)
	if err != nil {
		return err
	}
	op := e.addOps.Get().(*addOp)
	op.half, op.done, op.ctx, op.e = half, done, ctx, e
	op.entry.Type, op.entry.LedgerID, op.entry.EntryID, op.entry.Payload = journal.RecordData, ledgerID, entryID, mem
	op.entry.SetPayloadCRC(crc)
	if err := jl.Append(&op.entry); err != nil {
		half.pendingJournal.Done()
		op.half, op.done, op.ctx = nil, nil, nil
		e.addOps.Put(op)
		return fmt.Errorf("%w: journal: %w", ErrIO, err)
	}
	e.counters.adds.Add(1)
	return nil
}

// ledgerLockedForWrite is ledgerForWrite for an add: it returns the ledger with its addMu
// held, not deleted. DeleteLedger takes addMu too, so an add either has its entry in the write
// cache before the deletion drops the ledger's entries, or finds the ledger deleted and starts
// over (refused while the id is not free, or creating the ledger anew). An entry put after the
// deletion outlived it: the next checkpoint wrote its location after the deletion's committed
// range delete.
func (e *Engine) ledgerLockedForWrite(ledgerID int64, masterKey []byte) (*ledgerInfo, error) {
	for {
		l, err := e.ledgerForWrite(ledgerID, masterKey)
		if err != nil {
			return nil, err
		}
		l.addMu.Lock()
		if !l.deleted.Load() {
			return l, nil
		}
		l.addMu.Unlock()
	}
}

// ledgerForWrite returns the ledger, creating it (and journaling its key) on the first write,
// after checking the master key.
func (e *Engine) ledgerForWrite(ledgerID int64, masterKey []byte) (*ledgerInfo, error) {
	if len(masterKey) > index.MaxMasterKeyLen {
		// The index could not store it: the checkpoint would fail, and every replay again.
		return nil, fmt.Errorf("%w: master key of %d bytes, limit %d", ErrBadEntry, len(masterKey), index.MaxMasterKeyLen)
	}
	l, created, err := e.ledgers.getOrCreate(ledgerID, masterKey)
	if err != nil {
		return nil, err
	}
	if created {
		e.dir(ledgerID).markDirty(l)
		op := e.addOps.Get().(*addOp)
		op.e = e
		op.entry.Type, op.entry.LedgerID, op.entry.EntryID, op.entry.Payload = journal.RecordLedgerKey, ledgerID, 0, l.masterKey
		err := e.journals.For(ledgerID).Append(&op.entry)
		close(l.keyReady)
		if err != nil {
			e.addOps.Put(op)
			return nil, fmt.Errorf("%w: journal: %w", ErrIO, err)
		}
		return l, nil
	}
	<-l.keyReady
	if !l.checkKey(masterKey) {
		return nil, fmt.Errorf("%w: ledger %d", ErrUnauthorized, ledgerID)
	}
	return l, nil
}

// Fence marks a ledger fenced (creating it if this bookie has not seen it, so that a late add
// of the old writer is refused here too) and calls done once the fence is durable. Fencing is
// permanent and idempotent.
func (e *Engine) Fence(ledgerID int64, masterKey []byte, done func(ctx any, err error), ctx any) error {
	if err := checkLedgerID(ledgerID); err != nil {
		return err
	}
	if err := e.Err(); err != nil {
		return err
	}
	// Adds that passed their fenced check have journaled their records once addMu is free;
	// later ones see the fence. The fence record goes to the same journal after them. Under
	// addMu, the ledger is not being deleted: a deletion either comes first (the ledger is
	// looked up again) or sees the fence and leaves a tombstone.
	l, err := e.ledgerLockedForWrite(ledgerID, masterKey)
	if err != nil {
		return err
	}
	l.fenced.Store(true)
	l.addMu.Unlock()
	l.mu.Lock()
	if l.fenceDurable {
		l.mu.Unlock()
		done(ctx, nil)
		return nil
	}
	// Waiters mean a fence record is on its way; none (and not durable) means none is, also
	// after an earlier record failed: send one.
	first := len(l.fenceWaiters) == 0
	l.fenceWaiters = append(l.fenceWaiters, func(err error) { done(ctx, err) })
	l.mu.Unlock()
	e.dir(ledgerID).markDirty(l)
	if !first {
		return nil // the fence record is already on its way
	}
	op := &addOp{e: e}
	op.entry.Ctx = op
	op.entry.Type, op.entry.LedgerID, op.entry.EntryID = journal.RecordFence, ledgerID, -1
	op.entry.Done = func(_ *journal.Entry, err error) {
		l.mu.Lock()
		waiters := l.fenceWaiters
		l.fenceWaiters = nil
		if err == nil {
			l.fenceDurable = true
		}
		l.mu.Unlock()
		for _, w := range waiters {
			w(err)
		}
	}
	if err := e.journals.For(ledgerID).Append(&op.entry); err != nil {
		err = fmt.Errorf("%w: journal: %w", ErrIO, err)
		// No record is on its way: fail the requests that joined this one (this one's error is
		// returned), so that the next one sends a record again.
		l.mu.Lock()
		joined := l.fenceWaiters[1:]
		l.fenceWaiters = nil
		l.mu.Unlock()
		for _, w := range joined {
			w(err)
		}
		return err
	}
	return nil
}

// SetExplicitLAC stores an explicit last-add-confirmed packet and calls done once it is
// durable.
func (e *Engine) SetExplicitLAC(ledgerID int64, masterKey, lacPacket []byte, done func(ctx any, err error), ctx any) error {
	if err := checkLedgerID(ledgerID); err != nil {
		return err
	}
	if limit := min(index.MaxExplicitLACLen, e.cfg.Journal.MaxRecordSize); len(lacPacket) > limit {
		return fmt.Errorf("%w: explicit LAC of %d bytes, limit %d", ErrBadEntry, len(lacPacket), limit)
	}
	if err := e.Err(); err != nil {
		return err
	}
	l, err := e.ledgerForWrite(ledgerID, masterKey)
	if err != nil {
		return err
	}
	packet := append([]byte(nil), lacPacket...)
	l.mu.Lock()
	l.explicitLAC = packet
	l.mu.Unlock()
	e.dir(ledgerID).markDirty(l)
	op := &addOp{e: e, done: done, ctx: ctx}
	op.entry.Ctx = op
	op.entry.Type, op.entry.LedgerID, op.entry.EntryID, op.entry.Payload = journal.RecordExplicitLAC, ledgerID, 0, packet
	op.entry.Done = func(_ *journal.Entry, err error) { done(ctx, err) }
	if err := e.journals.For(ledgerID).Append(&op.entry); err != nil {
		return fmt.Errorf("%w: journal: %w", ErrIO, err)
	}
	return nil
}

// ExplicitLAC returns the ledger's explicit LAC packet, or nil.
func (e *Engine) ExplicitLAC(ledgerID int64) ([]byte, error) {
	l := e.ledgers.get(ledgerID)
	if l == nil {
		return nil, ErrNoLedger
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.explicitLAC...), nil
}

// Exists reports whether this bookie knows the ledger.
func (e *Engine) Exists(ledgerID int64) bool { return e.ledgers.get(ledgerID) != nil }

// IsFenced reports whether the ledger is fenced.
func (e *Engine) IsFenced(ledgerID int64) (bool, error) {
	l := e.ledgers.get(ledgerID)
	if l == nil {
		return false, ErrNoLedger
	}
	return l.fenced.Load(), nil
}

// CheckMasterKey compares key with the ledger's master key in constant time.
func (e *Engine) CheckMasterKey(ledgerID int64, key []byte) error {
	l := e.ledgers.get(ledgerID)
	if l == nil {
		return ErrNoLedger
	}
	if !l.checkKey(key) {
		return fmt.Errorf("%w: ledger %d", ErrUnauthorized, ledgerID)
	}
	return nil
}

// Read appends entry entryID of the ledger to dst; entryID -1 means the last entry. It looks in
// the write cache, the half being flushed, the read cache, then index and entry log. A damaged
// entry is an ErrIO, never ErrNoEntry.
func (e *Engine) Read(ledgerID, entryID int64, dst []byte) ([]byte, error) {
	if ledgerID < 0 || entryID < -1 {
		return dst, fmt.Errorf("%w: read of ledger %d entry %d", ErrBadEntry, ledgerID, entryID)
	}
	if e.ledgers.get(ledgerID) == nil {
		return dst, fmt.Errorf("%w: %d", ErrNoLedger, ledgerID)
	}
	d := e.dir(ledgerID)
	if entryID == -1 {
		last, found, err := d.lastEntry(ledgerID)
		if err != nil {
			e.readFailed(ledgerID, entryID, err)
			return dst, err
		}
		if !found {
			return dst, fmt.Errorf("%w: ledger %d has no entries", ErrNoEntry, ledgerID)
		}
		entryID = last
	}
	e.counters.reads.Add(1)
	out, err := d.get(ledgerID, entryID, dst)
	if err != nil {
		e.readFailed(ledgerID, entryID, err)
	}
	return out, err
}

// readFailedLogInterval spaces the log lines of failed reads: a scan of a damaged log fails
// every read.
const readFailedLogInterval = int64(time.Second)

// readFailed counts and reports a read that failed on damaged or unreadable data.
func (e *Engine) readFailed(ledgerID, entryID int64, err error) {
	if !errors.Is(err, ErrIO) {
		return
	}
	n := e.counters.readErrors.Add(1)
	now, last := monotime.Now(), e.counters.readErrorLogged.Load()
	if now-last >= readFailedLogInterval && e.counters.readErrorLogged.CompareAndSwap(last, now) {
		e.log.Error("read failed on damaged or unreadable data", "ledger", ledgerID, "entry", entryID,
			"read_errors", n, "err", err)
	}
}

// ReadCached is Read from memory only: found is false when the entry would need disk I/O (or
// does not exist). It never blocks on disk, so an event loop may call it.
func (e *Engine) ReadCached(ledgerID, entryID int64, dst []byte) (out []byte, found bool) {
	if entryID < 0 || e.ledgers.get(ledgerID) == nil {
		return dst, false
	}
	out, found = e.dir(ledgerID).getCached(ledgerID, entryID, dst)
	if found {
		e.counters.readCacheHits.Add(1)
	}
	return out, found
}

// LastEntry returns the highest entry id stored for the ledger.
func (e *Engine) LastEntry(ledgerID int64) (int64, error) {
	if e.ledgers.get(ledgerID) == nil {
		return 0, ErrNoLedger
	}
	last, found, err := e.dir(ledgerID).lastEntry(ledgerID)
	if err != nil {
		return 0, err
	}
	if !found {
		return -1, nil
	}
	return last, nil
}

// LastAddConfirmed returns the LAC the ledger's last stored entry carries (or the explicit LAC
// if that is larger); -1 if there is no entry.
func (e *Engine) LastAddConfirmed(ledgerID int64) (int64, error) {
	last, err := e.Read(ledgerID, -1, nil)
	if errors.Is(err, ErrNoEntry) {
		return -1, nil
	}
	if err != nil {
		return 0, err
	}
	lac := int64(binary.BigEndian.Uint64(last[16:]))
	if p, _ := e.ExplicitLAC(ledgerID); len(p) >= 16 {
		lac = max(lac, int64(binary.BigEndian.Uint64(p[8:])))
	}
	return lac, nil
}

// DeleteLedger forgets a ledger: its state and locations leave the index at the next
// checkpoint; its entries stay in entry logs until garbage collection reclaims them. A ledger
// fenced at this point leaves a tombstone in the same index batch, and is refused every write
// for fencedDeletedRetention.
func (e *Engine) DeleteLedger(ledgerID int64) error {
	l := e.ledgers.get(ledgerID)
	if l == nil {
		return ErrNoLedger
	}
	// Under addMu from before removeForDelete's fenced check to the drop below: a fence either
	// comes first (the ledger leaves a tombstone) or finds the ledger gone; an add that found
	// the ledger has its entry in the cache by now (dropped below), or sees deleted and looks
	// the ledger up again (ledgerLockedForWrite). None lands in the cache after the drop, where
	// a checkpoint after garbage collection's commit of the deletion would write its location
	// back into the index.
	l.addMu.Lock()
	defer l.addMu.Unlock()
	if l.deleted.Load() {
		return ErrNoLedger // deleted meanwhile
	}
	removed, fenced, fencedAt := e.ledgers.removeForDelete(ledgerID)
	if removed != l {
		return ErrNoLedger // unreachable: only DeleteLedger removes a ledger, under its addMu
	}
	l.deleted.Store(true)
	d := e.dir(ledgerID)
	for _, h := range [2]*cacheHalf{d.active.Load(), d.flushing.Load()} {
		if h != nil {
			h.removeLedger(ledgerID)
		}
	}
	d.reads.removeLedger(ledgerID)
	d.dirtyMu.Lock()
	d.deletes = append(d.deletes, ledgerDeletion{id: ledgerID, fenced: fenced, fencedAt: fencedAt})
	d.dirtyMu.Unlock()
	return nil
}

// Ledgers returns the number of ledgers this bookie holds.
func (e *Engine) Ledgers() int { return e.ledgers.count() }

// requestCheckpoint asks the checkpoint goroutine for a checkpoint soon.
func (e *Engine) requestCheckpoint() {
	select {
	case e.checkpointKick <- struct{}{}:
	default:
	}
}

func (e *Engine) runCheckpoints() {
	defer close(e.checkpointDone)
	t := time.NewTicker(e.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-e.closing:
			return
		case <-t.C:
		case <-e.checkpointKick:
		}
		if err := e.Checkpoint(); err != nil && !errors.Is(err, ErrFailed) {
			e.log.Error("checkpoint failed", "err", err)
		}
	}
}

// Checkpoint makes everything journaled so far durable in entry logs and indexes, then lets the
// journals drop what it covers, in DESIGN.md's order: 1. snapshot every journal's mark; 2-4. in
// every ledger dir swap the write-cache halves, write the sealed half to the entry log and fsync
// it, and write locations and ledger states to the index as one synced batch; 5. only after
// every dir has flushed, persist each mark in every ledger dir (never backwards); 6. only then
// delete journal files wholly before the persisted marks.
func (e *Engine) Checkpoint() error {
	e.checkpointMu.Lock()
	defer e.checkpointMu.Unlock()
	if err := e.Err(); err != nil {
		return err
	}
	start := time.Now()
	// Counted before the marks are taken: a deletion committed from here on is recorded under
	// this snapshot, whose marks may not cover it (ledgerTable.deleting).
	snapshot := e.snapshots.Add(1)
	marks := e.journals.Marks() // 1
	if err := e.hook(stepMarksSnapshot); err != nil {
		return err
	}
	errs := make([]error, len(e.dirs))
	var wg sync.WaitGroup
	for i, d := range e.dirs { // 2-4, dirs in parallel
		wg.Go(func() { errs[i] = d.flush(marks) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	persisted := make([]journal.Mark, len(marks))
	for i, m := range marks { // 5
		p, err := e.markStores[i].Persist(m)
		if err != nil {
			err = fmt.Errorf("%w: persist mark: %w", ErrIO, err)
			e.fail(err)
			return err
		}
		persisted[i] = p
	}
	e.ledgers.freeDeleted(snapshot)
	if err := e.hook(stepMarksPersisted); err != nil {
		return err
	}
	for i, p := range persisted { // 6
		if err := e.journals.Journals()[i].GC(p); err != nil {
			e.log.Warn("journal GC", "err", err)
		}
	}
	if err := e.hook(stepJournalsCollected); err != nil {
		return err
	}
	e.counters.checkpoints.Add(1)
	e.counters.checkpointNanos.Add(uint64(time.Since(start)))
	return nil
}

// Close stops the engine: it stops taking adds, waits for the journals to finish what is
// queued, runs a last checkpoint and closes every file.
func (e *Engine) Close() error {
	var err error
	e.closeOnce.Do(func() {
		close(e.closing)
		e.gc.stop() // interrupts a compaction in progress
		e.warmCancel()
		<-e.warmDone
		<-e.checkpointDone
		jerr := e.journals.Close()
		var cerr error
		if e.Err() == nil {
			cerr = e.Checkpoint()
		}
		err = errors.Join(jerr, cerr, e.closeDirs())
		e.unlockDirs()
	})
	return err
}

// Cookie is the cookie the engine's directories hold.
func (e *Engine) Cookie() Cookie {
	return Cookie{
		BookieID:   e.cfg.BookieID,
		JournalDir: strings.Join(e.cfg.JournalDirs, ","),
		LedgerDirs: e.cfg.LedgerDirs,
		InstanceID: e.cfg.InstanceID,
	}
}

// Usage reports the fullest file system among the journal and ledger dirs: its used fraction,
// and the free bytes and total bytes of the ledger dirs (for placement).
func (e *Engine) Usage() (worst float64, ledgerFree, ledgerTotal uint64, err error) {
	for i, dir := range append(append([]string(nil), e.cfg.LedgerDirs...), e.cfg.JournalDirs...) {
		total, free, err := e.fs.Usage(dir)
		if err != nil {
			return 0, 0, 0, err
		}
		if total > 0 {
			worst = max(worst, 1-float64(free)/float64(total))
		}
		if i < len(e.cfg.LedgerDirs) {
			ledgerFree += free
			ledgerTotal += total
		}
	}
	return worst, ledgerFree, ledgerTotal, nil
}
