package dlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
)

// Position says where a reader starts: see AtDLSN, AtTxID, Head and Tail.
type Position struct {
	kind positionKind
	dlsn DLSN
	txID int64
}

type positionKind int

const (
	posHead positionKind = iota
	posTail
	posDLSN
	posTxID
)

// AtDLSN starts at the record at d, or the first one after it. A position before the
// truncation point fails with ErrTruncated, one with a negative field with ErrInvalidDLSN.
func AtDLSN(d DLSN) Position { return Position{kind: posDLSN, dlsn: d} }

// AtTxID starts at the first record whose transaction id is at least txID.
func AtTxID(txID int64) Position { return Position{kind: posTxID, txID: txID} }

// Head starts at the log's first record that is not truncated.
func Head() Position { return Position{kind: posHead} }

// Tail starts after the records readers can see now: the reader returns only records
// made visible later.
func Tail() Position { return Position{kind: posTail} }

// Bounds of a reader's work.
const (
	// readAheadBytes bounds the payload a reader holds decoded and not yet returned.
	readAheadBytes = 8 << 20
	// segmentRefresh: a reader waiting at the end of a segment re-reads the segment's
	// metadata at least this often, even without a change notification.
	segmentRefresh = time.Second
	// maxReadRetries bounds the retries of a failing read (each with fresh ledger metadata)
	// before Next returns the error.
	maxReadRetries = 8
)

// Reader reads a log's records in order. It follows the writer across segments and writer
// changes, and blocks in Next while it has read everything visible (tailing). It never
// returns a record that is not durable: in a segment being written it reads only up to the
// ledger's last-add-confirmed, which covers only acknowledged entries.
//
// Tailing polls: once caught up, a reader asks the segment's bookies for the
// last-add-confirmed every TailPollInterval, and learns of new and completed segments from a
// watch on the log's metadata. A record is returned at most about TailPollInterval plus two
// round trips after it became visible.
//
// A Reader is not safe for concurrent use, except Close.
type Reader struct {
	log *Log
	cfg Config
	// ctx lives until Close; it bounds the metadata watch.
	ctx    context.Context
	cancel context.CancelFunc
	watch  <-chan struct{}
	// created is when the log was created: a log deleted and created again under the reader
	// is another log.
	created time.Time
	// dirty: the log's segments may have changed since they were last read.
	dirty bool
	// pos is the next position to read; loose lets the first segment found be later than
	// pos's (a reader at the head of a log whose first segments were deleted).
	pos   DLSN
	loose bool
	// minTxID skips records below it (AtTxID); lastTxID is the last record's, for the order
	// check.
	minTxID  int64
	lastTxID int64
	cur      *readSegment
	buf      []Record
	head     int
	bufBytes int
	scratch  []entryRecord
	timer    *time.Timer
}

// readSegment is the segment being read.
type readSegment struct {
	meta Segment
	lh   *client.Ledger
	// next is the next entry to read; lac the last entry known readable of an in-progress
	// segment; records the segment's records before next (-1: unknown yet).
	next      int64
	lac       int64
	records   int64
	refreshed time.Time
}

// OpenReader opens a reader at from.
func (l *Log) OpenReader(ctx context.Context, from Position) (*Reader, error) {
	r := &Reader{log: l, cfg: l.ns.cfg, minTxID: -1, lastTxID: -1}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if err := r.position(ctx, from); err != nil {
		r.cancel()
		return nil, err
	}
	return r, nil
}

func (r *Reader) position(ctx context.Context, from Position) error {
	meta, _, err := r.log.readMeta(ctx)
	if err != nil {
		return err
	}
	// Watch before reading segments, so no change after the read goes unnoticed.
	r.watch, err = r.log.ns.kv.Watch(r.ctx, segmentPrefix(r.log.name))
	if err != nil {
		return fmt.Errorf("dlog: log %s: watch segments: %w", r.log.name, err)
	}
	r.created = meta.created
	trunc := meta.truncation
	switch from.kind {
	case posHead:
		r.pos, r.loose = trunc, true
	case posDLSN:
		d := from.dlsn
		if err := d.check(); err != nil {
			return fmt.Errorf("dlog: log %s: %w", r.log.name, err)
		}
		if d.Less(InitialDLSN) {
			d = InitialDLSN
		}
		if d.Less(trunc) {
			return fmt.Errorf("%w: log %s: %s is before the truncation point %s", ErrTruncated, r.log.name, d.Text(), trunc.Text())
		}
		r.pos = d
	case posTxID:
		segs, err := r.log.Segments(ctx)
		if err != nil {
			return err
		}
		r.minTxID = from.txID
		r.pos = DLSN{SegmentSeqNo: meta.lastSeqNo + 1}
		for _, s := range segs {
			if s.SeqNo >= trunc.SegmentSeqNo && (s.State == InProgress || s.RecordCount > 0 && s.LastTxID >= from.txID) {
				r.pos = DLSN{SegmentSeqNo: s.SeqNo}
				break
			}
		}
		if r.pos.Less(trunc) {
			r.pos = trunc
		}
	case posTail:
		segs, err := r.log.Segments(ctx)
		if err != nil {
			return err
		}
		r.pos = DLSN{SegmentSeqNo: meta.lastSeqNo + 1}
		if n := len(segs); n > 0 {
			last := segs[n-1]
			r.pos = DLSN{SegmentSeqNo: last.SeqNo + 1}
			if last.State == InProgress {
				lh, err := r.log.ns.cl.OpenLedger(ctx, last.LedgerID, r.cfg.Password, false)
				if err != nil {
					return r.ledgerErr(last, err)
				}
				lac, err := lh.ReadLastAddConfirmed(ctx)
				if err != nil {
					return r.ledgerErr(last, err)
				}
				r.pos = DLSN{SegmentSeqNo: last.SeqNo, EntryID: lac + 1}
				r.cur = &readSegment{meta: last, lh: lh, next: lac + 1, lac: lac, records: -1, refreshed: time.Now()}
			}
		}
	}
	return nil
}

// Next returns the next record, waiting for one while the reader has read everything
// visible, until ctx is done.
func (r *Reader) Next(ctx context.Context) (Record, error) {
	if r.ctx.Err() != nil {
		return Record{}, ErrReaderClosed // also with records read ahead
	}
	for r.head >= len(r.buf) {
		if r.ctx.Err() != nil {
			return Record{}, ErrReaderClosed
		}
		clear(r.buf)
		r.buf, r.head, r.bufBytes = r.buf[:0], 0, 0
		if err := r.fill(ctx); err != nil {
			return Record{}, err
		}
	}
	rec := r.buf[r.head]
	r.buf[r.head] = Record{}
	r.head++
	return rec, nil
}

// Close stops the reader; Next then fails with ErrReaderClosed.
func (r *Reader) Close() error {
	r.cancel()
	return nil
}

// fill reads at least one record into buf.
func (r *Reader) fill(ctx context.Context) error {
	retries := 0
	for {
		err := r.step(ctx)
		if err != nil && !errors.Is(err, errWait) && len(r.buf) > 0 {
			return nil // the records read before the failing entry come first; it fails again next
		}
		switch {
		case err == nil:
			if len(r.buf) > 0 {
				return nil
			}
			retries = 0
			continue
		case errors.Is(err, errWait):
			if err := r.wait(ctx); err != nil {
				return err
			}
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case r.ctx.Err() != nil:
			return ErrReaderClosed
		case !retryable(err) || retries >= maxReadRetries:
			return r.goneErr(ctx, err)
		}
		// A bookie may be down or the ledger's ensemble may have changed: retry with fresh
		// ledger metadata.
		retries++
		r.log.ns.cfg.Logger.Debug("dlog: read failed; retrying", "log", r.log.name, "at", r.pos.Text(), "err", err)
		if r.cur != nil {
			if err := r.reopen(ctx, r.cur.meta); err != nil && !retryable(err) {
				return err
			}
		}
		if err := sleepCtx(ctx, min(r.cfg.TailPollInterval<<retries, time.Second)); err != nil {
			return err
		}
	}
}

// errWait says the reader has read everything visible.
var errWait = errors.New("dlog: nothing to read yet")

func retryable(err error) bool {
	return !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNoSuchLog) &&
		!errors.Is(err, client.ErrUnauthorized) && !errors.Is(err, ErrReaderClosed)
}

// step makes one move: find and open the next segment, learn a new last-add-confirmed, or
// read entries. It returns errWait when there is nothing to read yet.
func (r *Reader) step(ctx context.Context) error {
	if r.cur == nil {
		s, ok, err := r.findSegment(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errWait
		}
		// The segment was read first: if it is another log's, so is the log's value now.
		if err := r.checkLog(ctx); err != nil {
			return err
		}
		lh, err := r.log.ns.cl.OpenLedger(ctx, s.LedgerID, r.cfg.Password, false)
		if err != nil {
			return r.ledgerErr(s, err)
		}
		// Checked before the reader takes the segment, so that a mismatch fails every later
		// step too instead of being read past.
		if err := r.checkLedger(s, lh); err != nil {
			return err
		}
		r.cur = &readSegment{meta: s, lh: lh, lac: -1, records: -1, refreshed: time.Now()}
		if s.SeqNo == r.pos.SegmentSeqNo {
			r.cur.next = r.pos.EntryID
		} else {
			r.pos = DLSN{SegmentSeqNo: s.SeqNo}
		}
		r.loose = false
	}
	c := r.cur
	last := c.meta.LastEntryID
	if c.meta.State == InProgress {
		if c.next > c.lac {
			lac, err := c.lh.ReadLastAddConfirmed(ctx)
			if err != nil {
				return r.ledgerErr(c.meta, err)
			}
			c.lac = lac
		}
		if c.next > c.lac {
			// Caught up: has the segment been completed meanwhile?
			if !r.dirty && time.Since(c.refreshed) < segmentRefresh {
				return errWait
			}
			r.dirty = false
			if err := r.refresh(ctx); err != nil {
				return err
			}
			if c.meta.State == InProgress {
				return errWait
			}
			return nil
		}
		last = c.lac
	} else if c.next > last {
		// Done with this segment: the next one must follow it without a gap.
		if c.records >= 0 && c.records != c.meta.RecordCount {
			return fmt.Errorf("%w: log %s: completed segment %d holds %d records, the reader found %d", ErrCorrupt,
				r.log.name, c.meta.SeqNo, c.meta.RecordCount, c.records)
		}
		r.pos = DLSN{SegmentSeqNo: c.meta.SeqNo + 1}
		r.cur = nil
		return nil
	}
	return r.read(ctx, c.next, min(last, c.next+int64(r.cfg.ReadAheadEntries)-1))
}

// findSegment returns the segment at pos (or, when loose, the first one from it on); ok is
// false if it does not exist yet.
func (r *Reader) findSegment(ctx context.Context) (Segment, bool, error) {
	r.dirty = false
	if r.loose {
		segs, err := r.log.Segments(ctx)
		if err != nil {
			return Segment{}, false, err
		}
		for _, s := range segs {
			if s.SeqNo >= r.pos.SegmentSeqNo {
				return s, true, nil
			}
		}
		// None yet, or the log was deleted: waiting would then never end.
		return Segment{}, false, r.checkLog(ctx)
	}
	s, ok, err := r.log.segment(ctx, r.pos.SegmentSeqNo)
	if err != nil || ok {
		return s, ok, err
	}
	// Not there: not written yet, or deleted (then the log's truncation point is past it).
	meta, _, err := r.log.readMeta(ctx)
	if err != nil {
		return Segment{}, false, err
	}
	if err := r.sameLog(meta); err != nil {
		return Segment{}, false, err
	}
	if r.pos.Less(meta.truncation) {
		return Segment{}, false, fmt.Errorf("%w: log %s: the reader is at %s, the truncation point is %s", ErrTruncated,
			r.log.name, r.pos.Text(), meta.truncation.Text())
	}
	if r.pos.SegmentSeqNo > meta.lastSeqNo {
		return Segment{}, false, nil
	}
	// The segment was started between the two reads (a segment and the log's last
	// sequence number are written together): read it again.
	s, ok, err = r.log.segment(ctx, r.pos.SegmentSeqNo)
	if err == nil && !ok {
		err = fmt.Errorf("%w: log %s: segment %d is missing", ErrCorrupt, r.log.name, r.pos.SegmentSeqNo)
	}
	return s, ok, err
}

// refresh re-reads the current segment's metadata; once it is completed, it reopens the
// ledger, now closed, to read it to its end.
func (r *Reader) refresh(ctx context.Context) error {
	c := r.cur
	s, ok, err := r.log.segment(ctx, c.meta.SeqNo)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: log %s: segment %d was deleted under the reader", ErrTruncated, r.log.name, c.meta.SeqNo)
	}
	if s.LedgerID != c.meta.LedgerID {
		return fmt.Errorf("%w: log %s: segment %d's ledger is now %d, was %d: the log was deleted and created again", ErrNoSuchLog,
			r.log.name, s.SeqNo, s.LedgerID, c.meta.LedgerID)
	}
	c.refreshed = time.Now()
	if s.State == InProgress {
		return nil
	}
	return r.reopen(ctx, s)
}

// checkLog checks that the log is the one the reader opened.
func (r *Reader) checkLog(ctx context.Context) error {
	meta, _, err := r.log.readMeta(ctx)
	if err != nil {
		return err
	}
	return r.sameLog(meta)
}

// goneErr returns ErrNoSuchLog instead of err when the log was deleted (or deleted and
// created again): then data missing under the reader is the delete's doing, not truncation
// or corruption.
func (r *Reader) goneErr(ctx context.Context, err error) error {
	if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
		return err
	}
	if lerr := r.checkLog(ctx); errors.Is(lerr, ErrNoSuchLog) {
		return fmt.Errorf("%w (%v)", lerr, err) // no longer ErrCorrupt or ErrTruncated
	}
	return err
}

func (r *Reader) sameLog(meta logMeta) error {
	if !meta.created.Equal(r.created) {
		return fmt.Errorf("%w: log %s was deleted and created again under the reader", ErrNoSuchLog, r.log.name)
	}
	return nil
}

// reopen opens the current segment's ledger again, with fresh metadata, as segment meta. A
// completed segment whose ledger ends elsewhere is ErrCorrupt, and the reader keeps its
// segment as it was, so that the next step checks again.
func (r *Reader) reopen(ctx context.Context, meta Segment) error {
	lh, err := r.log.ns.cl.OpenLedger(ctx, meta.LedgerID, r.cfg.Password, false)
	if err != nil {
		return r.ledgerErr(meta, err)
	}
	if err := r.checkLedger(meta, lh); err != nil {
		return err
	}
	c := r.cur
	c.meta, c.lh = meta, lh
	// A fresh handle of an open ledger knows no last-add-confirmed yet: step reads it again.
	c.lac = lh.LastAddConfirmed()
	return nil
}

// checkLedger checks that a completed segment's ledger (lh) is closed where the segment says.
func (r *Reader) checkLedger(s Segment, lh *client.Ledger) error {
	if s.State != Completed {
		return nil
	}
	if md := lh.Metadata(); md.LastEntryID != s.LastEntryID {
		return fmt.Errorf("%w: log %s: completed segment %d ends at entry %d, its ledger %d (%v) at %d", ErrCorrupt,
			r.log.name, s.SeqNo, s.LastEntryID, s.LedgerID, md.State, md.LastEntryID)
	}
	return nil
}

func (r *Reader) ledgerErr(s Segment, err error) error {
	if errors.Is(err, client.ErrNoSuchLedger) {
		return fmt.Errorf("%w: log %s: segment %d's ledger %d was deleted: %w", ErrTruncated, r.log.name, s.SeqNo, s.LedgerID, err)
	}
	return fmt.Errorf("dlog: log %s: segment %d (ledger %d): %w", r.log.name, s.SeqNo, s.LedgerID, err)
}

// read reads entries first..last of the current segment and decodes their records into buf,
// stopping early once readAheadBytes are buffered.
func (r *Reader) read(ctx context.Context, first, last int64) error {
	c := r.cur
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for e, err := range c.lh.Entries(ctx, first, last) {
		if err != nil {
			return r.ledgerErr(c.meta, err)
		}
		if err := r.decode(c, e); err != nil {
			return err
		}
		if r.bufBytes >= readAheadBytes {
			break
		}
	}
	return nil
}

// decode appends an entry's records from pos on to buf, checking the log's invariants: the
// entry follows the previous one of the segment without a gap, and transaction ids increase.
func (r *Reader) decode(c *readSegment, e client.Entry) error {
	if e.EntryID != c.next {
		return fmt.Errorf("%w: log %s: segment %d: read entry %d, expected %d", ErrCorrupt, r.log.name, c.meta.SeqNo, e.EntryID, c.next)
	}
	h, recs, err := decodeEnvelope(e.Payload, r.scratch)
	r.scratch = recs[:0]
	if err != nil {
		return fmt.Errorf("log %s: segment %d, ledger %d, entry %d: %w", r.log.name, c.meta.SeqNo, c.meta.LedgerID, e.EntryID, err)
	}
	if c.records >= 0 && h.recordsBefore != c.records {
		return fmt.Errorf("%w: log %s: segment %d, entry %d follows %d records, the reader saw %d", ErrCorrupt,
			r.log.name, c.meta.SeqNo, e.EntryID, h.recordsBefore, c.records)
	}
	// The entry is taken whole or not at all: on an error the reader stays before it (its
	// records decoded so far are dropped), so that the next read fails on it again.
	n, bufBytes, lastTxID := len(r.buf), r.bufBytes, r.lastTxID
	for i, rec := range recs {
		d := DLSN{SegmentSeqNo: c.meta.SeqNo, EntryID: e.EntryID, SlotID: int64(i)}
		if d.Less(r.pos) || rec.txID < r.minTxID {
			continue
		}
		if rec.txID <= r.lastTxID {
			err := fmt.Errorf("%w: log %s: record at %s has transaction id %d, after %d", ErrCorrupt, r.log.name, d.Text(), rec.txID, r.lastTxID)
			clear(r.buf[n:])
			r.buf, r.bufBytes, r.lastTxID = r.buf[:n], bufBytes, lastTxID
			return err
		}
		r.lastTxID = rec.txID
		r.buf = append(r.buf, Record{TxID: rec.txID, Payload: rec.payload, DLSN: d})
		r.bufBytes += len(rec.payload)
	}
	c.records = h.recordsBefore + int64(h.count)
	c.next = e.EntryID + 1
	r.pos = DLSN{SegmentSeqNo: c.meta.SeqNo, EntryID: e.EntryID + 1}
	return nil
}

// wait sleeps until the log's segments change, the poll interval passes (in a segment being
// written; a second otherwise), or ctx is done.
func (r *Reader) wait(ctx context.Context) error {
	d := segmentRefresh
	if r.cur != nil && r.cur.meta.State == InProgress {
		d = r.cfg.TailPollInterval
	}
	if r.timer == nil {
		r.timer = time.NewTimer(d)
	} else {
		r.timer.Reset(d)
	}
	defer r.timer.Stop()
	select {
	case _, ok := <-r.watch:
		if !ok {
			r.watch = nil // closed (the reader or the driver is closing): poll only
		}
		r.dirty = true
	case <-r.timer.C:
	case <-ctx.Done():
		return ctx.Err()
	case <-r.ctx.Done():
		return ErrReaderClosed
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
