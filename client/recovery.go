package client

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"maps"
	"slices"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// recover fences and closes the ledger (BookKeeper's LedgerRecoveryOp, with the fixes the
// TLA+ model found):
//
//  1. CAS the metadata to IN_RECOVERY, so the writer's next ensemble change or close fails;
//  2. recoverTail with fencing: fencing LAC reads, then fencing reads forward from the LAC with
//     every entry found re-added to its whole write quorum, up to the first missing one;
//  3. CAS CLOSED at the last recovered entry, with the ensembles the recovery adds wrote.
//
// A bookie that fails a recovery add is replaced, as the writer's ensemble change would, but
// in recovery's own copy of the metadata: the new ensembles are written only with the close, in
// the same compare-and-set (BookKeeper's "recovery uses immutable metadata", #1621). Written
// earlier, they would name a replacement bookie for entries recovery has not re-added yet; a
// later recoverer would read those entries from it and count its NoSuchEntry as missing.
//
// Concurrent recoverers converge: the one whose close lands first wins and the others adopt
// its metadata.
func (lh *Ledger) recover(ctx context.Context) error {
	md, version, err := metadata.UpdateLedger(ctx, lh.c.md.Ledgers(), lh.id, func(m *metadata.LedgerMetadata) error {
		if m.State != metadata.StateOpen {
			return metadata.ErrUnchanged
		}
		m.State = metadata.StateInRecovery
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: ledger %d: mark in recovery: %w", ErrRecovery, lh.id, ledgerErr(err, lh.id))
	}
	lh.setMetadata(md, version)
	if md.State == metadata.StateClosed {
		return nil
	}
	tail, err := lh.recoverTail(ctx, md, true)
	if err != nil {
		return err
	}
	read := md
	md, version, err = metadata.UpdateLedger(ctx, lh.c.md.Ledgers(), lh.id, func(m *metadata.LedgerMetadata) error {
		if m.State == metadata.StateClosed {
			return metadata.ErrUnchanged // another recoverer closed it first
		}
		if !slices.EqualFunc(m.Ensembles, read.Ensembles, sameEnsemble) {
			return fmt.Errorf("%w: the ensembles changed while the ledger was in recovery", ErrRecovery)
		}
		m.Ensembles = tail.written.Clone().Ensembles
		m.State, m.LastEntryID, m.Length = metadata.StateClosed, tail.lastEntry, tail.length
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: ledger %d: close: %w", ErrRecovery, lh.id, ledgerErr(err, lh.id))
	}
	if md.LastEntryID != tail.lastEntry || md.Length != tail.length {
		// Both ends hold every acknowledged entry; they differ only in entries never
		// acknowledged that one recoverer found on fewer bookies than the other.
		lh.c.log.Warn("ledger closed by another recoverer at another end; adopting it", "ledger", lh.id,
			"their_last", md.LastEntryID, "their_length", md.Length, "our_last", tail.lastEntry, "our_length", tail.length)
	}
	lh.setMetadata(md, version)
	return nil
}

// recoveredTail is what recoverTail found and did.
type recoveredTail struct {
	// lastEntry is the last entry that may have been acknowledged (−1: none), now on its
	// write quorum in written; length is the ledger's length up to it.
	lastEntry, length int64
	// written is md with the ensembles the recovery adds' replacements made; they are not in
	// the metadata service yet.
	written *metadata.LedgerMetadata
}

// recoverTail is recovery without its metadata steps (BookKeeper's LedgerRecoveryOp between
// IN_RECOVERY and CLOSED), for recover and for ReopenLedgerForWrite; md is the ledger's
// metadata, which recoverTail does not change:
//
//  1. LAC reads to the last ensemble until every write quorum has fewer than Qa unknown
//     answers; with fence they fence the ledger, and from then on no write quorum can
//     acknowledge another add;
//  2. LAC = max(LAC returned, first entry of the last ensemble − 1) (never below the fragment,
//     or recovery would rewrite an older fragment: BookKeeper #2615);
//  3. read forward from LAC+1 from each entry's whole write set (fencing reads with fence: a
//     lost fence message must not let the old writer complete an add behind recovery's back,
//     #2614), re-adding each entry found to its whole write quorum with RECOVERY_ADD, carrying
//     the LAC frozen at the start (so that no reader learns of entries no recoverer may keep);
//  4. stop at the first entry that at least Qw−Qa+1 bookies report missing (an I/O error or a
//     digest mismatch never counts as missing): no entry from it on was acknowledged.
//
// Without fence, the answers are final only if no writer is still adding (see
// ReopenLedgerForWrite).
func (lh *Ledger) recoverTail(ctx context.Context, md *metadata.LedgerMetadata, fence bool) (recoveredTail, error) {
	found, err := lh.readLAC(ctx, md, fence)
	if err != nil {
		what := "read the LAC"
		if fence {
			what = "fencing"
		}
		return recoveredTail{}, fmt.Errorf("%w: ledger %d: %s: %w", ErrRecovery, lh.id, what, err)
	}
	last, _ := md.LastEnsemble()
	lac := max(found, last.FirstEntryID-1)
	// Entries are read where the writer put them (md); recovery adds go to the ensembles of
	// written, recovery's own copy, which its ensemble changes update.
	w := &recoveryWriter{written: md.Clone(), bad: map[string]bool{}}
	tail := recoveredTail{lastEntry: lac}
	if lac >= 0 {
		e, err := lh.recoveryRead(ctx, md, lac, fence)
		if err != nil {
			return recoveredTail{}, fmt.Errorf("%w: ledger %d: read entry %d (the last add confirmed): %w", ErrRecovery, lh.id, lac, err)
		}
		if e == nil { // confirmed, yet missing on enough bookies: data was lost, never truncate it
			return recoveredTail{}, fmt.Errorf("%w: ledger %d: entry %d, the last add confirmed, is missing on %d or more bookies of its write quorum",
				ErrRecovery, lh.id, lac, md.WriteQuorumSize-md.AckQuorumSize+1)
		}
		tail.length = e.Length
	}
	for id := lac + 1; ; id++ {
		e, err := lh.recoveryRead(ctx, md, id, fence)
		if err != nil {
			return recoveredTail{}, fmt.Errorf("%w: ledger %d: read entry %d: %w", ErrRecovery, lh.id, id, err)
		}
		if e == nil {
			break // missing on enough bookies: nothing at or after it was ever acknowledged
		}
		if err := lh.recoveryAdd(ctx, w, e, lac); err != nil {
			return recoveredTail{}, fmt.Errorf("%w: ledger %d: re-add entry %d: %w", ErrRecovery, lh.id, id, err)
		}
		tail.lastEntry, tail.length = id, e.Length
	}
	tail.written = w.written
	return tail, nil
}

func (lh *Ledger) setMetadata(md *metadata.LedgerMetadata, version metadata.Version) {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	lh.md, lh.version = md, version
	if md.State == metadata.StateClosed {
		lh.lac, lh.confirmedLength = md.LastEntryID, md.Length
	}
}

// recoveryRead reads entry id from its whole write quorum, with fencing reads if fence. It
// returns the entry, or nil if at least Qw−Qa+1 bookies say it is missing; otherwise (too many
// errors, damaged copies or unreachable bookies to tell) an error.
func (lh *Ledger) recoveryRead(ctx context.Context, md *metadata.LedgerMetadata, id int64, fence bool) (*Entry, error) {
	replicas, err := writeSet(md, id)
	if err != nil {
		return nil, err
	}
	flags, key := protocol.FlagHighPriority, (*[20]byte)(nil)
	if fence {
		flags, key = flags|protocol.FlagDoFencing, &lh.key
	}
	ch := make(chan readResult, len(replicas))
	for i, b := range replicas {
		lh.c.cfg.dial(b).Read(ctx, lh.id, id, flags, key, readResponse, &readCtx{ch: ch, replica: i})
	}
	missingNeeded := md.WriteQuorumSize - md.AckQuorumSize + 1
	missing := 0
	var firstErr error
	for range replicas {
		select {
		case r := <-ch:
			switch {
			case r.err == nil && r.rc == protocol.EOK:
				e, err := lh.dg.verify(r.entry, lh.id, id)
				if err == nil {
					return &e, nil
				}
				lh.c.log.Warn("bad entry during recovery; not counted as missing", "ledger", lh.id, "entry", id,
					"bookie", replicas[r.replica], "err", err)
				firstErr = cmpErr(firstErr, err)
			case r.err == nil && isMissing(r.rc):
				missing++
				if missing >= missingNeeded {
					return nil, nil
				}
			case r.err == nil && r.rc == protocol.EUA:
				return nil, ErrUnauthorized
			default:
				final, err := replicaErr(ctx, replicas[r.replica], r)
				if final {
					return nil, err
				}
				firstErr = cmpErr(firstErr, err)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("entry %d: %d of %d bookies report it missing, %d needed: %w", id, missing, len(replicas), missingNeeded,
		errors.Join(firstErr))
}

func sameEnsemble(a, b metadata.Ensemble) bool {
	return a.FirstEntryID == b.FirstEntryID && slices.Equal(a.Bookies, b.Bookies)
}

// replacementTookIt reports whether a bookie of entry's write set in after that is not in it in
// before has the entry.
func replacementTookIt(before, after *metadata.LedgerMetadata, entry int64, have map[string]bool) bool {
	was, _ := writeSet(before, entry)
	now, _ := writeSet(after, entry)
	for _, b := range now {
		if have[b] && !slices.Contains(was, b) {
			return true
		}
	}
	return false
}

// recoveryStragglerWait is how long a recovery add that Qa bookies took waits for the others
// of its write set. One that has not answered by then is treated as failed for the rest of the
// recovery, so that a hung bookie costs one wait, not an AddTimeout per entry.
const recoveryStragglerWait = time.Second

// recoveryWriter holds what recovery adds share: written, recovery's own copy of the metadata
// (see recover), and the bookies that failed or hung on a recovery add, which are replaced and
// never picked as replacements for the rest of the recovery (BookKeeper quarantines them too).
type recoveryWriter struct {
	written *metadata.LedgerMetadata
	bad     map[string]bool
}

// recoveryAdd writes e again, with RECOVERY_ADD, to its write set in written. Bookies that
// failed are replaced (a new ensemble in written from e on) and the entry is sent to the
// replacements; it is done when every bookie of the write set has it, or when Qa do and no
// bookie is left to replace the others. The entry is re-sealed with lac, the LAC frozen at
// the start of recovery, so that no reader learns of dirty entries from a recovery write.
func (lh *Ledger) recoveryAdd(ctx context.Context, w *recoveryWriter, e *Entry, lac int64) error {
	hdr := make([]byte, lh.dg.headerSize())
	var mac hash.Hash
	if lh.dg.typ == DigestHMAC {
		mac = lh.dg.newMAC()
	}
	lh.dg.seal(hdr, mac, lh.id, e.EntryID, lac, e.Length, e.Payload)
	parts := [][]byte{hdr, e.Payload}
	have := map[string]bool{} // bookies that took the entry
	qa := w.written.AckQuorumSize
	before := w.written.Clone()
	for changes := 0; ; changes++ {
		replicas, err := writeSet(w.written, e.EntryID)
		if err != nil {
			return err
		}
		failed, firstErr, err := lh.sendRecoveryAdd(ctx, replicas, have, w.bad, qa, e.EntryID, parts)
		if err != nil {
			return err
		}
		maps.Copy(w.bad, failed)
		if len(failed) == 0 {
			return nil
		}
		err = ErrTooManyEnsembleChanges
		if changes < lh.c.cfg.MaxEnsembleChanges {
			err = lh.c.replaceBookies(w.written, e.EntryID, failed, w.bad, false) // in written only (see recover)
		}
		if err == nil {
			lh.c.log.Info("recovery replaced bookies", "ledger", lh.id, "from_entry", e.EntryID, "failed", failed)
			continue
		}
		if copies(replicas, have) < qa {
			// No bookie replaces the failed ones and the entry lacks its ack quorum: try the
			// quarantined ones of its write set again, waiting for their answers (one that
			// was only slow once may be needed now).
			var retryErr error
			if _, firstErr, retryErr = lh.sendRecoveryAdd(ctx, replicas, have, nil, len(replicas)+1, e.EntryID, parts); retryErr != nil {
				return retryErr
			}
		}
		if n := copies(replicas, have); n < qa {
			return fmt.Errorf("%w: %d of %d bookies took the recovery add (%d needed; %v), and none replaces the others: %w",
				ErrNotEnoughBookies, n, len(replicas), qa, firstErr, err)
		}
		lh.c.log.Warn("recovery add on an ack quorum only; no bookie replaces the failed ones", "ledger", lh.id,
			"entry", e.EntryID, "failed", failed, "err", cmpErr(firstErr, err))
		if !replacementTookIt(before, w.written, e.EntryID, have) {
			w.written = before // a replacement that holds nothing is no better than the bookie it replaced
		}
		return nil
	}
}

// copies counts the replicas in have.
func copies(replicas []string, have map[string]bool) int {
	n := 0
	for _, b := range replicas {
		if have[b] {
			n++
		}
	}
	return n
}

// sendRecoveryAdd sends a recovery add to the replicas neither in have nor in bad, and adds
// those that take it to have. It returns the replicas that are bad, failed, or had not
// answered recoveryStragglerWait after qa of the replicas had it, with the first failure. It
// fails only when the bookies refuse this client or ctx ends.
func (lh *Ledger) sendRecoveryAdd(ctx context.Context, replicas []string, have, bad map[string]bool, qa int, entryID int64, parts [][]byte) (
	failed map[string]bool, firstErr, err error) {
	type ack struct {
		bookie string
		rc     protocol.ReturnCode
		err    error
	}
	ch := make(chan ack, len(replicas)) // buffered: answers after a straggler wait are dropped
	waiting := map[string]bool{}
	failed = map[string]bool{}
	took := 0 // replicas that have the entry
	for _, b := range replicas {
		switch {
		case have[b]:
			took++
			continue
		case bad[b]:
			failed[b] = true
			continue
		}
		waiting[b] = true
		lh.c.cfg.dial(b).Add(lh.id, entryID, &lh.key, protocol.FlagRecoveryAdd|protocol.FlagHighPriority, parts, func(_ any, rc protocol.ReturnCode, err error) {
			ch <- ack{b, rc, err}
		}, nil)
	}
	var straggle <-chan time.Time
	for len(waiting) > 0 {
		if straggle == nil && took >= qa {
			t := time.NewTimer(recoveryStragglerWait)
			defer t.Stop()
			straggle = t.C
		}
		select {
		case a := <-ch:
			delete(waiting, a.bookie)
			switch {
			case a.err == nil && a.rc == protocol.EOK:
				have[a.bookie] = true
				took++
			case a.err == nil && a.rc == protocol.EUA:
				return nil, nil, ErrUnauthorized
			default:
				failed[a.bookie] = true
				firstErr = cmpErr(firstErr, fmt.Errorf("%s: rc %v: %v", a.bookie, a.rc, a.err))
			}
		case <-straggle:
			for b := range waiting {
				failed[b] = true
				firstErr = cmpErr(firstErr, fmt.Errorf("%s: no answer %v after an ack quorum", b, recoveryStragglerWait))
			}
			return failed, firstErr, nil
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	return failed, firstErr, nil
}
