package dlog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// OpenWriter takes ownership of the log and returns its writer. It waits, until ctx is done,
// while another writer holds the log. Then it recovers what a previous writer left: every
// in-progress segment's ledger is fenced and closed by ledger recovery, its last entry read,
// and the segment completed; the last completed segments' ledgers are checked to be closed
// (fenced if not). Only then does it start a new segment. From then on the previous writer
// can get no acknowledgement: its ledger is fenced, and its metadata writes need the lock it
// lost.
func (l *Log) OpenWriter(ctx context.Context) (*Writer, error) {
	ns := l.ns
	lock, err := ns.kv.Lock(ctx, lockName(l.name), ns.cfg.LockTTL)
	if err != nil {
		return nil, fmt.Errorf("dlog: log %s: take the writer lock: %w", l.name, err)
	}
	w := &Writer{log: l, ns: ns, cfg: ns.cfg, logger: ns.cfg.Logger, lock: lock, ignoreLockLoss: ns.ignoreLockLoss}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.init()
	if err := w.start(ctx); err != nil {
		w.cancel()
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		lock.Unlock(uctx)
		return nil, err
	}
	go w.run()
	w.startRetention()
	return w, nil
}

func (w *Writer) start(ctx context.Context) error {
	meta, version, err := w.log.readMeta(ctx)
	if err != nil {
		return err
	}
	w.meta, w.metaVersion = meta, version
	segs, err := w.log.Segments(ctx)
	if err != nil {
		return err
	}
	for i := range segs {
		s := &segs[i]
		switch {
		case s.State == InProgress:
			if err := w.recoverSegment(ctx, s); err != nil {
				return err
			}
		case i >= len(segs)-2:
			// "Fence the last two ledgers": a completed segment's ledger is closed before
			// the segment is completed, but make sure of it for the newest ones.
			if err := w.ensureClosed(ctx, s); err != nil {
				return err
			}
		}
	}
	w.lastTxID = w.meta.maxTxID
	if n := len(segs); n > 0 && segs[n-1].SeqNo > w.meta.lastSeqNo {
		return fmt.Errorf("%w: log %s: segment %d is past the log's last sequence number %d", ErrCorrupt, w.log.name, segs[n-1].SeqNo, w.meta.lastSeqNo)
	}
	seg, err := w.startSegment(ctx, w.meta.lastSeqNo+1)
	if err != nil {
		return err
	}
	w.seg = seg
	w.maxBatch = min(maxEntryRecordBytes, seg.lh.MaxEntrySize()-envelopeHeaderSize)
	return nil
}

// recoverSegment fences and closes an in-progress segment's ledger (ledger recovery keeps
// every entry that may have been acknowledged), reads its last entry to learn the segment's
// record count and transaction ids, and completes the segment.
func (w *Writer) recoverSegment(ctx context.Context, s *Segment) error {
	lh, err := w.ns.cl.OpenLedger(ctx, s.LedgerID, w.cfg.Password, true)
	if err != nil {
		return fmt.Errorf("dlog: log %s: recover segment %d (ledger %d): %w", w.log.name, s.SeqNo, s.LedgerID, err)
	}
	md := lh.Metadata()
	done := *s
	done.State, done.LastEntryID, done.Bytes, done.CompletedAt = Completed, md.LastEntryID, md.Length, time.Now()
	done.RecordCount, done.FirstTxID, done.LastTxID = 0, -1, -1
	if md.LastEntryID >= 0 {
		entries, err := lh.Read(ctx, md.LastEntryID, md.LastEntryID)
		if err != nil {
			return fmt.Errorf("dlog: log %s: recover segment %d: read its last entry %d: %w", w.log.name, s.SeqNo, md.LastEntryID, err)
		}
		h, _, err := decodeEnvelope(entries[0].Payload, nil)
		if err != nil {
			return fmt.Errorf("log %s: segment %d, ledger %d, entry %d: %w", w.log.name, s.SeqNo, s.LedgerID, md.LastEntryID, err)
		}
		done.RecordCount, done.FirstTxID, done.LastTxID = h.recordsBefore+int64(h.count), h.firstTxID, h.lastTxID
	}
	w.logger.Info("dlog: recovered an in-progress segment", "log", w.log.name, "segment", s.SeqNo, "ledger", s.LedgerID,
		"last_entry", done.LastEntryID, "records", done.RecordCount, "last_txid", done.LastTxID)
	if err := w.commitSegment(ctx, &done, func(m *logMeta) error { m.maxTxID = max(m.maxTxID, done.LastTxID); return nil }); err != nil {
		return err
	}
	*s = done
	return nil
}

// ensureClosed recovers a completed segment's ledger if it is not closed.
func (w *Writer) ensureClosed(ctx context.Context, s *Segment) error {
	md, err := w.ns.cl.LedgerMetadata(ctx, s.LedgerID)
	if errors.Is(err, client.ErrNoSuchLedger) {
		return nil // deleted (retention racing with a crash); nothing can write to it
	}
	if err != nil {
		return fmt.Errorf("dlog: log %s: segment %d: %w", w.log.name, s.SeqNo, err)
	}
	if md.State == metadata.StateClosed {
		return nil
	}
	lh, err := w.ns.cl.OpenLedger(ctx, s.LedgerID, w.cfg.Password, true)
	if err != nil {
		return fmt.Errorf("dlog: log %s: fence completed segment %d (ledger %d): %w", w.log.name, s.SeqNo, s.LedgerID, err)
	}
	if last := lh.LastAddConfirmed(); last != s.LastEntryID {
		return fmt.Errorf("%w: log %s: completed segment %d ends at entry %d, but its ledger %d at %d",
			ErrCorrupt, w.log.name, s.SeqNo, s.LastEntryID, s.LedgerID, last)
	}
	return nil
}

// startSegment creates segment seq: a new ledger, then the segment's metadata (in progress)
// together with the log's last sequence number, in one commit guarded by the lock.
func (w *Writer) startSegment(ctx context.Context, seq int64) (*segWriter, error) {
	lh, err := w.ns.cl.CreateLedger(ctx, client.CreateOptions{
		EnsembleSize: w.cfg.EnsembleSize, WriteQuorum: w.cfg.WriteQuorum, AckQuorum: w.cfg.AckQuorum,
		Digest: w.cfg.Digest, Password: w.cfg.Password,
		Custom: map[string][]byte{"dlog.log": []byte(w.log.name), "dlog.segment": []byte(strconv.FormatInt(seq, 10))},
	})
	if err != nil {
		return nil, w.metaErr(fmt.Sprintf("start segment %d", seq), err)
	}
	now := time.Now()
	s := &segWriter{
		meta: Segment{SeqNo: seq, LedgerID: lh.ID(), State: InProgress, FirstTxID: -1, LastTxID: -1, LastEntryID: -1,
			Created: now, version: metadata.NoVersion},
		lh: lh, started: now, firstTxID: -1, lastTxID: -1,
	}
	err = w.commitSegment(ctx, &s.meta, func(m *logMeta) error {
		if m.lastSeqNo+1 != seq {
			return fmt.Errorf("%w: log %s: segment %d would follow segment %d", ErrCorrupt, w.log.name, seq, m.lastSeqNo)
		}
		m.lastSeqNo = seq
		return nil
	})
	if err != nil {
		// The commit may have applied all the same, or may still apply (a timeout, a cancelled
		// context: the request can reach etcd after its answer was given up on), so a read
		// cannot tell. Rewriting the log's metadata at the version the commit expected can: if
		// that succeeds, the commit did not apply and never will (the version it expects is
		// gone), and the ledger is deleted; otherwise the segment may name it, and it is kept.
		// A leaked empty ledger is garbage; a segment whose ledger is gone would stop every
		// later writer and reader.
		if w.sealMeta(ctx) == nil {
			w.ns.deleteLedger(context.WithoutCancel(ctx), w.log.name, s.meta)
		}
		return nil, err
	}
	return s, nil
}

// sealTimeout bounds the commit that settles whether a failed segment commit applied.
const sealTimeout = 5 * time.Second

// sealMeta rewrites the log's metadata as the writer knows it, at the version it knows, so
// that no commit still in flight that expects that version can apply afterwards.
func (w *Writer) sealMeta(ctx context.Context) error {
	w.metaMu.Lock()
	defer w.metaMu.Unlock()
	return w.sealMetaLocked(ctx)
}

// sealMetaLocked is sealMeta with metaMu held. It fails with a bad version when a commit
// that expected the version applied already.
func (w *Writer) sealMetaLocked(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sealTimeout)
	defer cancel()
	v, err := w.ns.kv.Commit(ctx, w.lock, metadata.Put(logKey(w.log.name), encodeLog(w.meta), w.metaVersion))
	if err == nil {
		w.metaVersion = v
	}
	return err
}

// settleMetaLocked settles the fate of a commit of the log's value that failed with an
// unknown outcome (a timeout, a cancelled context: it may have applied, or may still apply),
// with metaMu held, and reports whether it applied. The writer's value and version stay as
// they were if it did not (sealed, so that it never will); if it did, they become the
// commit's, read back (only the lock's holder writes the log's value). Without this the
// writer kept the version from before a commit that applied, and its next commit (completing
// the segment at a roll or at Close) failed on it, stopping the writer.
func (w *Writer) settleMetaLocked(ctx context.Context) (applied bool) {
	if err := w.sealMetaLocked(ctx); !errors.Is(err, metadata.ErrBadVersion) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sealTimeout)
	defer cancel()
	m, v, err := w.log.readMeta(ctx)
	if err != nil || !m.created.Equal(w.meta.created) {
		return false
	}
	w.meta, w.metaVersion = m, v
	return true
}

// completeSegment closes the segment's ledger at its last acknowledged entry and completes
// the segment's metadata. Nothing may be in flight.
func (w *Writer) completeSegment(ctx context.Context, s *segWriter) error {
	if err := s.lh.Close(ctx); err != nil {
		return w.ledgerErr(s.meta.SeqNo, err)
	}
	md := s.lh.Metadata()
	done := s.meta
	done.State, done.LastEntryID, done.Bytes, done.CompletedAt = Completed, md.LastEntryID, md.Length, time.Now()
	w.mu.Lock()
	done.RecordCount, done.FirstTxID, done.LastTxID = s.records, s.firstTxID, s.lastTxID
	if p := (position{done.SeqNo, done.LastEntryID}); w.visible.less(p) {
		w.visible = p
	}
	w.cond.Broadcast()
	w.mu.Unlock()
	if err := w.commitSegment(ctx, &done, func(m *logMeta) error { m.maxTxID = max(m.maxTxID, done.LastTxID); return nil }); err != nil {
		return err
	}
	w.mu.Lock() // Purge reads the active segment's meta under mu
	s.meta = done
	w.mu.Unlock()
	return nil
}

// commitSegment writes a segment's metadata and the log's value (changed by update) in one
// commit guarded by the writer's lock; on success s.version is the new version.
func (w *Writer) commitSegment(ctx context.Context, s *Segment, update func(*logMeta) error) error {
	w.metaMu.Lock()
	defer w.metaMu.Unlock()
	next := w.meta
	if err := update(&next); err != nil {
		return err
	}
	v, err := w.ns.kv.Commit(ctx, w.lock,
		metadata.Put(segmentKey(w.log.name, s.SeqNo), encodeSegment(s), s.version),
		metadata.Put(logKey(w.log.name), encodeLog(next), w.metaVersion))
	if err != nil {
		return w.metaErr(fmt.Sprintf("segment %d", s.SeqNo), err)
	}
	s.version = v
	w.meta, w.metaVersion = next, v
	return nil
}

// metaErr wraps a metadata failure. It is ErrLockLost when the lock is lost, or when the
// metadata client was closed under the writer (its lock's session with it), since the lock
// can fire Lost after the operation that failed.
func (w *Writer) metaErr(what string, err error) error {
	if errors.Is(err, metadata.ErrLockLost) || (!w.ignoreLockLoss && (errors.Is(err, metadata.ErrClosed) || w.lockLost())) {
		return fmt.Errorf("%w: log %s: %s: %w", ErrLockLost, w.log.name, what, err)
	}
	return fmt.Errorf("dlog: log %s: %s: %w", w.log.name, what, err)
}

// lockLost reports whether the writer's lock has been lost already.
func (w *Writer) lockLost() bool {
	select {
	case <-w.lock.Lost():
		return true
	default:
		return false
	}
}

// roll completes the current segment and starts the next (owner goroutine, nothing in
// flight).
func (w *Writer) roll() error {
	ctx, cancel := context.WithTimeout(w.ctx, metadataTimeout)
	defer cancel()
	w.mu.Lock()
	old := w.seg
	w.mu.Unlock()
	if err := w.completeSegment(ctx, old); err != nil {
		return err
	}
	seg, err := w.startSegment(ctx, old.meta.SeqNo+1)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.seg = seg
	w.lastSentData = false
	w.mu.Unlock()
	w.startRetention()
	return nil
}
