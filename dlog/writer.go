package dlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// Record is one record of a log.
type Record struct {
	// TxID is the writer's transaction id: it must be greater than the previous record's.
	TxID int64
	// Payload is at most MaxRecordSize bytes. Write copies it; a record returned by
	// Reader.Next owns its payload.
	Payload []byte
	// DLSN is the record's position: set on records returned by Reader.Next, ignored by
	// Write.
	DLSN DLSN
}

// metadataTimeout bounds the metadata work of a roll, a retention pass or a close that has no
// deadline of its own.
const metadataTimeout = 30 * time.Second

// Writer appends records to a log. It owns the log: while it is open, no other writer can
// open the log (see doc.go for the lock and recovery). Methods are safe for concurrent use.
//
// Records are gathered into batches (one ledger entry each) by WriteAsync; a single owner
// goroutine sends the batches to the current segment's ledger in order, rolls to a new
// segment between batches, and, when nothing is in flight, sends a control entry so that
// readers see the last records (see Config for when a batch is sent).
type Writer struct {
	log    *Log
	ns     *Namespace
	cfg    Config
	logger *slog.Logger
	lock   metadata.Lock
	// ctx bounds the writer's metadata work; cancel aborts it (Close).
	ctx    context.Context
	cancel context.CancelFunc
	// kick wakes the owner goroutine; done is closed when it exits.
	kick chan struct{}
	done chan struct{}
	// bg counts retention passes; retaining is set while one runs.
	bg        sync.WaitGroup
	retaining atomic.Bool
	// purgeMu serialises retention passes.
	purgeMu sync.Mutex
	batches sync.Pool
	// ignoreLockLoss (tests) makes the writer carry on after its lock is lost, so that only
	// ledger fencing stops it.
	ignoreLockLoss bool
	// maxBatch bounds the record bytes of a batch: maxEntryRecordBytes, or less where the
	// client's entries are smaller (its frame limit), so that a batch of records that each fit
	// is never refused as too large.
	maxBatch int

	// metaMu serialises the writer's metadata commits and guards meta and metaVersion (the
	// log's value as this writer last wrote or read it).
	metaMu      sync.Mutex
	meta        logMeta
	metaVersion metadata.Version

	// mu guards the fields below; cond (on mu) wakes writes waiting for room, Flush and
	// Close.
	mu   sync.Mutex
	cond *sync.Cond
	// err is sticky: once set, every record not yet sent fails with it.
	err     error
	closing bool
	closed  bool
	// closeDone is closed when the first Close has finished, with closeErr its result.
	closeDone chan struct{}
	closeErr  error
	// bgClosed: Close is waiting for bg; no retention pass may start.
	bgClosed bool
	// flushReq asks the owner to send the open batch without waiting.
	flushReq bool
	// lastTxID is the transaction id of the last record accepted.
	lastTxID int64
	// open is the batch being gathered; sealed are full batches waiting to be sent, in order.
	open   *batch
	sealed []*batch
	// outstandingBytes are record bytes accepted and not yet completed; accepted and
	// completed count records (completed: acknowledged or failed).
	outstandingBytes    int64
	accepted, completed int64
	// seg is the segment being written.
	seg *segWriter
	// inflight counts entries sent and not yet completed, dataInFlight those that hold
	// records; lastSentData says the newest entry sent holds records, so readers will not see
	// them until a later entry carries the last-add-confirmed.
	inflight, dataInFlight int
	lastSentData           bool
	// delivering counts completed entries whose records' callbacks are still running (set
	// under mu, decremented without it): once the writer has failed, the owner fails the
	// records it has not sent only after those have run, so records complete in order.
	delivering atomic.Int32
	// retryAt holds sends back after the client refused one for too many adds in flight.
	retryAt time.Time
	// visible: entries up to it are confirmed to readers; lastDataAcked is the newest
	// acknowledged entry holding records.
	visible, lastDataAcked position
}

// position is an entry of a segment, ordered by segment then entry.
type position struct{ seq, entry int64 }

func (p position) less(o position) bool {
	return p.seq < o.seq || p.seq == o.seq && p.entry < o.entry
}

// segWriter is the segment being written: its metadata and ledger, and what was sent to it
// (changed by the owner under Writer.mu).
type segWriter struct {
	meta      Segment
	lh        *client.Ledger
	started   time.Time
	nextEntry int64
	records   int64
	bytes     int64
	firstTxID int64
	lastTxID  int64
}

// batch is one entry: records gathered in an envelope, or a control entry.
type batch struct {
	w     *Writer
	buf   []byte // envelope: header space, then records
	count int
	// recordBytes counts against MaxOutstandingBytes.
	recordBytes       int64
	firstTxID, lastTx int64
	dones             []func(DLSN, error)
	first             time.Time
	// Set when the batch is sent.
	control    bool
	hdr        entryHeader
	lh         *client.Ledger
	seq        int64
	entryID    int64
	carriedLAC int64
	complete   func(entryID int64, err error)
	// prevSeg and prevLastSentData are the state before the batch took its place in the
	// segment, given back if the client refuses the append (see refused).
	prevSeg          segWriter
	prevLastSentData bool
}

func (w *Writer) newBatch() *batch {
	b := w.batches.Get().(*batch)
	b.buf = b.buf[:envelopeHeaderSize]
	return b
}

func (w *Writer) recycle(b *batch) {
	if cap(b.buf) > 4*maxEntryRecordBytes {
		b.buf = nil
	}
	clear(b.dones)
	*b = batch{w: w, buf: b.buf[:0], dones: b.dones[:0], complete: b.complete}
	w.batches.Put(b)
}

func (w *Writer) init() {
	w.cond = sync.NewCond(&w.mu)
	w.kick = make(chan struct{}, 1)
	w.done = make(chan struct{})
	w.closeDone = make(chan struct{})
	w.batches.New = func() any {
		b := &batch{w: w, buf: make([]byte, 0, envelopeHeaderSize+w.cfg.OutputBufferSize+256)}
		b.complete = b.onComplete
		return b
	}
}

func (w *Writer) kickOwner() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// LastTxID returns the transaction id of the last record accepted, or, before any, the
// log's last transaction id when the writer opened (including records of a previous writer's
// segment that recovery kept): the next record's must be greater.
func (w *Writer) LastTxID() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastTxID
}

// Write appends a record and returns its position once it is durable (acknowledged by the
// ack quorum of its segment's bookies). If ctx ends first, the record may still be written.
func (w *Writer) Write(ctx context.Context, r Record) (DLSN, error) {
	type result struct {
		d   DLSN
		err error
	}
	ch := make(chan result, 1)
	w.WriteAsync(ctx, r, func(d DLSN, err error) { ch <- result{d, err} })
	select {
	case res := <-ch:
		return res.d, res.err
	case <-ctx.Done():
		return DLSN{}, ctx.Err()
	}
}

// WriteAsync appends a record; done is called once with its position when it is durable, or
// with an error. Records accepted by the writer complete in the order they were written; done
// must not block (it runs on a connection's goroutine). WriteAsync waits while
// MaxOutstandingBytes are outstanding, until ctx is done (then done gets ctx's error and the
// record is not written). The payload is copied before WriteAsync returns.
func (w *Writer) WriteAsync(ctx context.Context, r Record, done func(DLSN, error)) {
	if len(r.Payload) > MaxRecordSize {
		done(DLSN{}, fmt.Errorf("%w: %d bytes, limit %d", ErrRecordTooLarge, len(r.Payload), MaxRecordSize))
		return
	}
	size := int64(recordHeaderSize + len(r.Payload))
	w.mu.Lock()
	if err := w.admitLocked(ctx, r.TxID, size); err != nil {
		w.mu.Unlock()
		done(DLSN{}, err)
		return
	}
	kick := false
	if w.open != nil && len(w.open.buf)-envelopeHeaderSize+int(size) > w.maxBatch {
		w.sealLocked()
		kick = true
	}
	if w.open == nil {
		w.open = w.newBatch()
		w.open.first = time.Now()
		kick = true
	}
	b := w.open
	b.buf = appendRecord(b.buf, r.TxID, r.Payload)
	if b.count == 0 {
		b.firstTxID = r.TxID
	}
	b.lastTx = r.TxID
	b.count++
	b.recordBytes += size
	b.dones = append(b.dones, done)
	w.lastTxID = r.TxID
	w.outstandingBytes += size
	w.accepted++
	if w.cfg.ImmediateFlush || len(b.buf)-envelopeHeaderSize >= w.cfg.OutputBufferSize {
		w.sealLocked()
		kick = true
	}
	w.mu.Unlock()
	if kick {
		w.kickOwner()
	}
}

// admitLocked checks that a record may be accepted, waiting for room.
func (w *Writer) admitLocked(ctx context.Context, txID, size int64) error {
	for {
		switch {
		case w.err != nil:
			return w.err
		case w.closing:
			return ErrWriterClosed
		case txID <= w.lastTxID:
			return fmt.Errorf("%w: log %s: transaction id %d is not greater than the last one, %d",
				ErrTxIDNotIncreasing, w.log.name, txID, w.lastTxID)
		case w.outstandingBytes == 0 || w.outstandingBytes+size <= w.cfg.MaxOutstandingBytes:
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		w.waitLocked(ctx)
	}
}

// waitLocked waits on cond, or until ctx is done.
func (w *Writer) waitLocked(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
	})
	w.cond.Wait()
	stop()
}

func (w *Writer) sealLocked() {
	w.sealed = append(w.sealed, w.open)
	w.open = nil
}

// Flush sends the records written so far without waiting for their batch to fill, and
// returns once they are all durable and visible to readers (a later entry, or the segment's
// close, carries them in the last-add-confirmed), or with the writer's error.
func (w *Writer) Flush(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	target := w.accepted
	w.flushReq = true
	w.kickOwner()
	for w.completed < target && w.err == nil && ctx.Err() == nil {
		w.waitLocked(ctx)
	}
	need := w.lastDataAcked
	for w.visible.less(need) && w.err == nil && ctx.Err() == nil {
		w.waitLocked(ctx)
	}
	if w.err != nil {
		return w.err
	}
	return ctx.Err()
}

// Close sends and waits for the records written so far, completes the segment (closing its
// ledger), and releases the log. It returns the error that stopped the writer, if one did.
// If ctx ends first, the writer is abandoned: the next writer recovers its segment. A Close
// while another runs waits for it (until ctx ends) and returns its result; so do later ones.
func (w *Writer) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		select {
		case <-w.closeDone:
			return w.closeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.closed, w.closing = true, true
	w.mu.Unlock()
	err := w.close(ctx)
	w.closeErr = err
	close(w.closeDone)
	return err
}

func (w *Writer) close(ctx context.Context) error {
	w.kickOwner()
	var err error
	select {
	case <-w.done:
		w.mu.Lock()
		err = w.err
		seg := w.seg
		w.mu.Unlock()
		if err == nil && seg != nil {
			err = w.completeSegment(ctx, seg)
		}
	case <-ctx.Done():
		err = ctx.Err()
		w.fail(ErrWriterClosed)
	}
	w.cancel()
	w.mu.Lock()
	w.bgClosed = true
	w.mu.Unlock()
	w.bg.Wait()
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if uerr := w.lock.Unlock(uctx); uerr != nil && err == nil {
		w.logger.Warn("dlog: could not release the writer lock; it expires with its lease", "log", w.log.name, "err", uerr)
	}
	w.mu.Lock()
	if w.err == nil {
		w.err = ErrWriterClosed
	}
	w.cond.Broadcast()
	w.mu.Unlock()
	return err
}

// fail makes err sticky (if no error is yet).
func (w *Writer) fail(err error) {
	w.mu.Lock()
	w.setErrLocked(err)
	w.mu.Unlock()
	w.kickOwner()
}

func (w *Writer) setErrLocked(err error) {
	if w.err == nil {
		w.err = err
		w.logger.Warn("dlog: writer stopped", "log", w.log.name, "err", err)
	}
	w.cond.Broadcast()
}

// ledgerErr turns an add or close error of segment seq into the writer's error: ErrLockLost
// once the lock is lost (another writer may have fenced the segment since), else ErrFenced for
// a fenced ledger.
func (w *Writer) ledgerErr(seq int64, err error) error {
	if !w.ignoreLockLoss && (errors.Is(err, metadata.ErrClosed) || w.lockLost()) {
		return fmt.Errorf("%w: log %s, segment %d: %w", ErrLockLost, w.log.name, seq, err)
	}
	if errors.Is(err, client.ErrLedgerFenced) {
		return fmt.Errorf("%w: log %s, segment %d: %w", ErrFenced, w.log.name, seq, err)
	}
	return fmt.Errorf("dlog: log %s, segment %d: %w", w.log.name, seq, err)
}

// action is what the owner goroutine does next.
type action struct {
	kind     actionKind
	b        *batch
	deadline time.Time
	// failed are the batches an exit fails with err.
	failed []*batch
	err    error
}

type actionKind int

const (
	actWait actionKind = iota
	actSend
	actRoll
	actExit
)

// run is the owner goroutine: it sends batches in order, rolls segments, sends control
// entries, and fails what is left once the writer has an error.
func (w *Writer) run() {
	defer close(w.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	lost := w.lock.Lost()
	if w.ignoreLockLoss {
		lost = nil
	}
	for {
		w.mu.Lock()
		a := w.nextLocked(time.Now())
		w.mu.Unlock()
		switch a.kind {
		case actSend:
			w.send(a.b)
		case actRoll:
			if err := w.roll(); err != nil {
				w.fail(err)
			}
		case actExit:
			for _, b := range a.failed {
				for _, done := range b.dones {
					done(DLSN{}, a.err)
				}
				w.recycle(b)
			}
			return
		case actWait:
			var tc <-chan time.Time
			if !a.deadline.IsZero() {
				timer.Reset(time.Until(a.deadline))
				tc = timer.C
			}
			select {
			case <-w.kick:
			case <-tc:
			case <-lost:
				lost = nil
				w.fail(fmt.Errorf("%w: log %s", ErrLockLost, w.log.name))
			}
			timer.Stop()
		}
	}
}

// nextLocked decides the owner's next action.
func (w *Writer) nextLocked(now time.Time) action {
	if w.err != nil {
		if w.inflight > 0 || w.delivering.Load() > 0 {
			return action{kind: actWait}
		}
		// Everything sent has completed: fail the rest, in order, and stop.
		failed := w.sealed
		if w.open != nil {
			failed = append(failed, w.open)
		}
		w.sealed, w.open = nil, nil
		for _, b := range failed {
			w.outstandingBytes -= b.recordBytes
			w.completed += int64(b.count)
		}
		w.cond.Broadcast()
		return action{kind: actExit, failed: failed, err: w.err}
	}
	if now.Before(w.retryAt) {
		return action{kind: actWait, deadline: w.retryAt}
	}
	var b *batch
	fromOpen := false
	period := w.cfg.PeriodicFlushFrequency
	switch {
	case len(w.sealed) > 0:
		b = w.sealed[0]
	case w.open != nil && (w.flushReq || w.closing || w.dataInFlight == 0 || !now.Before(w.open.first.Add(period))):
		b, fromOpen = w.open, true
	}
	if b != nil {
		if w.rollDueLocked(now) {
			if w.inflight > 0 {
				return action{kind: actWait}
			}
			return action{kind: actRoll}
		}
		if w.inflight >= w.cfg.MaxInFlightEntries {
			return action{kind: actWait}
		}
		if fromOpen {
			w.open = nil
		} else {
			w.sealed[0] = nil
			w.sealed = w.sealed[1:]
		}
		if w.open == nil && len(w.sealed) == 0 {
			w.flushReq = false
		}
		w.prepareLocked(b)
		return action{kind: actSend, b: b}
	}
	if w.closing && w.inflight == 0 && w.open == nil {
		return action{kind: actExit} // Close completes the segment
	}
	if w.inflight == 0 && w.lastSentData {
		return action{kind: actSend, b: w.controlLocked()}
	}
	if w.open != nil {
		return action{kind: actWait, deadline: w.open.first.Add(period)}
	}
	return action{kind: actWait}
}

func (w *Writer) rollDueLocked(now time.Time) bool {
	s := w.seg
	return s.bytes >= w.cfg.MaxLogSegmentBytes ||
		s.records > 0 && now.Sub(s.started) >= w.cfg.LogSegmentRollingInterval
}

// prepareLocked gives a data batch its place in the segment.
func (w *Writer) prepareLocked(b *batch) {
	s := w.seg
	b.prevSeg, b.prevLastSentData = *s, w.lastSentData
	if s.firstTxID == -1 {
		s.firstTxID = b.firstTxID
	}
	b.hdr = entryHeader{count: b.count, recordsBefore: s.records, firstTxID: s.firstTxID, lastTxID: b.lastTx}
	b.lh, b.seq, b.entryID = s.lh, s.meta.SeqNo, s.nextEntry
	s.nextEntry++
	s.records += int64(b.count)
	s.lastTxID = b.lastTx
	s.bytes += int64(len(b.buf))
	w.inflight++
	w.dataInFlight++
	w.lastSentData = true
}

// controlLocked builds a control entry: it carries the last-add-confirmed to readers.
func (w *Writer) controlLocked() *batch {
	s := w.seg
	b := w.newBatch()
	b.control = true
	b.prevSeg, b.prevLastSentData = *s, w.lastSentData
	b.hdr = entryHeader{control: true, recordsBefore: s.records, firstTxID: s.firstTxID, lastTxID: s.lastTxID}
	b.lh, b.seq, b.entryID = s.lh, s.meta.SeqNo, s.nextEntry
	s.nextEntry++
	s.bytes += int64(len(b.buf))
	w.inflight++
	w.lastSentData = false
	return b
}

// send seals the envelope and hands it to the ledger (owner goroutine, mu not held).
func (w *Writer) send(b *batch) {
	sealEnvelope(b.buf, b.hdr)
	b.carriedLAC = b.lh.LastAddConfirmed()
	if _, err := b.lh.TryAppendAsync(b.buf, b.complete); err != nil {
		w.refused(b, err)
	}
}

// refusedRetryDelay is how long the owner waits before sending again a batch the client
// refused because it had too many adds in flight (a bound all logs of its namespace share).
const refusedRetryDelay = 5 * time.Millisecond

// refused gives back the place of a batch the client refused at once, which took no entry id:
// the next batch must not take its place with a header that counts its records. The batch is
// sent again after refusedRetryDelay when the client had too many adds in flight; any other
// refusal (an entry too large for the client's frame limit, a failed ledger) fails the writer,
// and the batch's records with it.
func (w *Writer) refused(b *batch, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	*w.seg, w.lastSentData = b.prevSeg, b.prevLastSentData
	w.inflight--
	if b.control {
		w.recycle(b) // rebuilt when due
	} else {
		w.dataInFlight--
		w.sealed = append([]*batch{b}, w.sealed...)
	}
	if errors.Is(err, client.ErrTooManyPendingAdds) {
		w.retryAt = time.Now().Add(refusedRetryDelay)
		return
	}
	w.setErrLocked(w.ledgerErr(b.seq, err))
}

// onComplete is the ledger's callback for the batch's entry.
func (b *batch) onComplete(entryID int64, err error) {
	w := b.w
	if err == nil && entryID != b.entryID {
		err = fmt.Errorf("%w: the ledger acknowledged entry %d for entry %d", ErrCorrupt, entryID, b.entryID)
	}
	var recErr error
	if err != nil {
		recErr = w.ledgerErr(b.seq, err)
	}
	w.mu.Lock()
	w.inflight--
	if !b.control {
		w.dataInFlight--
		w.outstandingBytes -= b.recordBytes
		w.completed += int64(b.count)
	}
	if recErr != nil {
		w.setErrLocked(recErr)
	} else {
		if p := (position{b.seq, b.carriedLAC}); w.visible.less(p) {
			w.visible = p
		}
		if !b.control {
			w.lastDataAcked = position{b.seq, b.entryID}
		}
	}
	w.delivering.Add(1)
	w.cond.Broadcast()
	w.mu.Unlock()
	w.kickOwner()
	for i, done := range b.dones {
		if recErr != nil {
			done(DLSN{}, recErr)
		} else {
			done(DLSN{SegmentSeqNo: b.seq, EntryID: b.entryID, SlotID: int64(i)}, nil)
		}
	}
	w.recycle(b)
	if w.delivering.Add(-1) == 0 {
		w.kickOwner() // it may be waiting to fail the records after these
	}
}

// errOrNil returns the writer's sticky error (tests).
func (w *Writer) errOrNil() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
