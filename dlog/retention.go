package dlog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// Truncate marks the records before d deletable: readers can no longer be opened before d,
// and the segments whose records all lie before it are deleted with their ledgers (now, and
// by later retention passes). The truncation point never moves back; d may not be past what
// the writer has written (the start of the next entry of the segment being written), nor have
// a negative field (ErrInvalidDLSN).
func (w *Writer) Truncate(ctx context.Context, d DLSN) error {
	if err := d.check(); err != nil {
		// The log's value would not decode any more, and every reader and writer would fail.
		return fmt.Errorf("dlog: log %s: truncate: %w", w.log.name, err)
	}
	w.mu.Lock()
	err, active, next := w.err, w.seg.meta.SeqNo, w.seg.nextEntry
	w.mu.Unlock()
	if err != nil {
		return err
	}
	if d.SegmentSeqNo > active || d.SegmentSeqNo == active && (d.EntryID > next || d.EntryID == next && d.SlotID > 0) {
		// Past the end: records written later (in the next entry too, from its slot 0) would be
		// hidden from readers, and purged.
		return fmt.Errorf("%w: log %s: truncate at %s, the writer is at %d/%d", ErrTruncateBeyondEnd, w.log.name, d.Text(), active, next)
	}
	w.metaMu.Lock()
	if w.meta.truncation.Less(d) {
		next := w.meta
		next.truncation = d
		v, err := w.ns.kv.Commit(ctx, w.lock, metadata.Put(logKey(w.log.name), encodeLog(next), w.metaVersion))
		switch {
		case err == nil:
			w.meta, w.metaVersion = next, v
		case errors.Is(err, metadata.ErrLockLost) || !w.settleMetaLocked(ctx):
			w.metaMu.Unlock()
			return w.metaErr("truncate", err)
		}
	}
	w.metaMu.Unlock()
	_, err = w.Purge(ctx)
	return err
}

// Purge runs a retention pass now (the writer also runs one when it opens and after every
// roll): it deletes, oldest first, the completed segments that are wholly before the
// truncation point or completed more than RetentionPeriod ago, and their ledgers. Deleting an
// expired segment moves the truncation point past it. It returns how many segments it
// deleted; on a closed or failed writer, nothing, with the error a write would get.
func (w *Writer) Purge(ctx context.Context) (int, error) {
	w.purgeMu.Lock()
	defer w.purgeMu.Unlock()
	w.mu.Lock()
	err, closing, active := w.err, w.closing, w.seg.meta.SeqNo
	w.mu.Unlock()
	// As for a write: a closed writer's commits would fail on the lock it released.
	if err == nil && closing {
		err = ErrWriterClosed
	}
	if err != nil {
		return 0, err
	}
	segs, err := w.log.Segments(ctx)
	if err != nil {
		return 0, err
	}
	cutoff := time.Now().Add(-w.cfg.RetentionPeriod)
	deleted := 0
	for _, s := range segs {
		if s.State != Completed || s.SeqNo >= active {
			break
		}
		w.metaMu.Lock()
		trunc := w.meta.truncation
		truncated := s.SeqNo < trunc.SegmentSeqNo || s.SeqNo == trunc.SegmentSeqNo && trunc.EntryID > s.LastEntryID
		expired := w.cfg.RetentionPeriod > 0 && s.CompletedAt.Before(cutoff)
		if !truncated && !expired {
			w.metaMu.Unlock()
			break
		}
		ops := []metadata.KVOp{metadata.Delete(segmentKey(w.log.name, s.SeqNo), s.version)}
		next := w.meta
		if after := (DLSN{SegmentSeqNo: s.SeqNo + 1}); next.truncation.Less(after) {
			next.truncation = after
			ops = append(ops, metadata.Put(logKey(w.log.name), encodeLog(next), w.metaVersion))
		}
		v, err := w.ns.kv.Commit(ctx, w.lock, ops...)
		switch {
		case err == nil && len(ops) > 1:
			w.meta, w.metaVersion = next, v
		case err != nil && len(ops) > 1 && !errors.Is(err, metadata.ErrLockLost) && w.settleMetaLocked(ctx):
			err = nil // it applied: the segment is gone, its ledger goes below
		}
		w.metaMu.Unlock()
		if err != nil {
			return deleted, w.metaErr(fmt.Sprintf("delete segment %d", s.SeqNo), err)
		}
		w.ns.deleteLedger(ctx, w.log.name, s)
		deleted++
	}
	return deleted, nil
}

// startRetention runs a retention pass in the background, unless one is running.
func (w *Writer) startRetention() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bgClosed || !w.retaining.CompareAndSwap(false, true) {
		return
	}
	w.bg.Go(func() {
		defer w.retaining.Store(false)
		ctx, cancel := context.WithTimeout(w.ctx, metadataTimeout)
		defer cancel()
		if n, err := w.Purge(ctx); err != nil && !errors.Is(err, ErrWriterClosed) {
			w.logger.Warn("dlog: retention pass failed", "log", w.log.name, "err", err)
		} else if n > 0 {
			w.logger.Info("dlog: retention deleted segments", "log", w.log.name, "segments", n)
		}
	})
}
