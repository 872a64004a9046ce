package client

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"maps"
	"slices"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// recover fences and closes the ledger (BookKeeper's LedgerRecoveryOp, with the fixes the
// TLA+ model found):
//
//  1. CAS the metadata to IN_RECOVERY, so the writer's next ensemble change or close fails;
//  2. fencing LAC reads to the last ensemble until every write quorum has fewer than Qa unknown
//     answers: from then on no write quorum can acknowledge another add;
//  3. LAC = max(LAC returned, first entry of the last ensemble − 1) (never below the fragment,
//     or recovery would rewrite an older fragment: BookKeeper #2615);
//  4. read forward from LAC+1 with fencing reads (a lost fence message must not let the old
//     writer complete an add behind recovery's back: #2614), re-adding each entry to its whole
//     write quorum with RECOVERY_ADD, carrying the LAC frozen at the start of recovery;
//  5. stop at the first entry that at least Qw−Qa+1 bookies report missing (an I/O error or a
//     digest mismatch never counts as missing), and CAS CLOSED at the last recovered entry.
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
		return fmt.Errorf("%w: ledger %d: mark in recovery: %w", ErrRecovery, lh.id, err)
	}
	lh.setMetadata(md, version)
	if md.State == metadata.StateClosed {
		return nil
	}
	res, err := lh.readLAC(ctx, md, true)
	if err != nil {
		return fmt.Errorf("%w: ledger %d: fencing: %w", ErrRecovery, lh.id, err)
	}
	last, _ := md.LastEnsemble()
	lac := max(res.lac, last.FirstEntryID-1)
	// Entries are read where the writer put them (md); recovery adds go to the ensembles of
	// written, recovery's own copy, which its ensemble changes update.
	written := md.Clone()
	lastEntry, length := lac, int64(0)
	if lac >= 0 {
		e, err := lh.recoveryRead(ctx, md, lac)
		if err != nil {
			return fmt.Errorf("%w: ledger %d: read entry %d (the last add confirmed): %w", ErrRecovery, lh.id, lac, err)
		}
		if e == nil { // confirmed, yet missing on enough bookies: data was lost, never truncate it
			return fmt.Errorf("%w: ledger %d: entry %d, the last add confirmed, is missing on %d or more bookies of its write quorum",
				ErrRecovery, lh.id, lac, md.WriteQuorumSize-md.AckQuorumSize+1)
		}
		length = e.Length
	}
	for id := lac + 1; ; id++ {
		e, err := lh.recoveryRead(ctx, md, id)
		if err != nil {
			return fmt.Errorf("%w: ledger %d: read entry %d: %w", ErrRecovery, lh.id, id, err)
		}
		if e == nil {
			break // missing on enough bookies: nothing at or after it was ever acknowledged
		}
		if err := lh.recoveryAdd(ctx, written, e, lac); err != nil {
			return fmt.Errorf("%w: ledger %d: re-add entry %d: %w", ErrRecovery, lh.id, id, err)
		}
		lastEntry, length = id, e.Length
	}
	read := md
	md, version, err = metadata.UpdateLedger(ctx, lh.c.md.Ledgers(), lh.id, func(m *metadata.LedgerMetadata) error {
		if m.State == metadata.StateClosed {
			return metadata.ErrUnchanged // another recoverer closed it first
		}
		if !slices.EqualFunc(m.Ensembles, read.Ensembles, sameEnsemble) {
			return fmt.Errorf("%w: the ensembles changed while the ledger was in recovery", ErrRecovery)
		}
		m.Ensembles = written.Clone().Ensembles
		m.State, m.LastEntryID, m.Length = metadata.StateClosed, lastEntry, length
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: ledger %d: close: %w", ErrRecovery, lh.id, err)
	}
	if md.LastEntryID != lastEntry || md.Length != length {
		// Both ends hold every acknowledged entry; they differ only in entries never
		// acknowledged that one recoverer found on fewer bookies than the other.
		lh.c.log.Warn("ledger closed by another recoverer at another end; adopting it", "ledger", lh.id,
			"their_last", md.LastEntryID, "their_length", md.Length, "our_last", lastEntry, "our_length", length)
	}
	lh.setMetadata(md, version)
	return nil
}

func (lh *Ledger) setMetadata(md *metadata.LedgerMetadata, version metadata.Version) {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	lh.md, lh.version = md, version
	if md.State == metadata.StateClosed {
		lh.lac, lh.confirmedLength = md.LastEntryID, md.Length
	}
}

// recoveryRead reads entry id with fencing reads from its whole write quorum. It returns the
// entry, or nil if at least Qw−Qa+1 bookies say it is missing; otherwise (too many errors or
// unreachable bookies to tell) an error.
func (lh *Ledger) recoveryRead(ctx context.Context, md *metadata.LedgerMetadata, id int64) (*Entry, error) {
	replicas, err := writeSet(md, id)
	if err != nil {
		return nil, err
	}
	ch := make(chan readResult, len(replicas))
	for i, b := range replicas {
		lh.c.cfg.dial(b).Read(lh.id, id, protocol.FlagDoFencing|protocol.FlagHighPriority, &lh.key, readResponse, &readCtx{ch: ch, replica: i})
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
				firstErr = cmpErr(firstErr, fmt.Errorf("%w: %s: rc %v: %v", ErrBookieUnavailable, replicas[r.replica], r.rc, r.err))
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

// recoveryAdd writes e again, with RECOVERY_ADD, to its whole write set in written until every
// bookie of it has the entry. A bookie that fails is replaced in written (a new ensemble from
// e on) and the entry sent to its replacement; if no bookie can replace it, Qa copies do. The
// entry is re-sealed with lac, the LAC frozen at the start of recovery, so that no reader
// learns of dirty entries from a recovery write.
func (lh *Ledger) recoveryAdd(ctx context.Context, written *metadata.LedgerMetadata, e *Entry, lac int64) error {
	hdr := make([]byte, lh.dg.headerSize())
	var mac hash.Hash
	if lh.dg.typ == DigestHMAC {
		mac = lh.dg.newMAC()
	}
	lh.dg.seal(hdr, mac, lh.id, e.EntryID, lac, e.Length, e.Payload)
	parts := [][]byte{hdr, e.Payload}
	have := map[string]bool{}      // bookies that took the entry
	failedAny := map[string]bool{} // bookies that failed it: never picked as replacements
	for changes := 0; ; changes++ {
		replicas, err := writeSet(written, e.EntryID)
		if err != nil {
			return err
		}
		failed, firstErr, err := lh.sendRecoveryAdd(ctx, replicas, have, e.EntryID, parts)
		if err != nil {
			return err
		}
		if len(failed) == 0 {
			return nil
		}
		maps.Copy(failedAny, failed)
		copies := 0
		for _, b := range replicas {
			if have[b] {
				copies++
			}
		}
		err = ErrTooManyEnsembleChanges
		if changes < lh.c.cfg.MaxEnsembleChanges {
			err = lh.replaceForRecovery(written, e.EntryID, failed, failedAny)
		}
		if err != nil {
			if copies >= written.AckQuorumSize {
				lh.c.log.Warn("recovery add on an ack quorum only; no bookie replaces the failed ones", "ledger", lh.id,
					"entry", e.EntryID, "copies", copies, "err", firstErr)
				return nil
			}
			return fmt.Errorf("%w: %d of %d bookies took the recovery add (%d needed; %v), and none replaces the others: %w",
				ErrNotEnoughBookies, copies, len(replicas), written.AckQuorumSize, firstErr, err)
		}
		lh.c.log.Info("recovery replaced bookies", "ledger", lh.id, "from_entry", e.EntryID, "failed", failed)
	}
}

// sendRecoveryAdd sends a recovery add to the replicas not in have, adds those that take it to
// have, and returns those that failed with the first failure. It fails only when the bookies
// refuse this client or ctx ends.
func (lh *Ledger) sendRecoveryAdd(ctx context.Context, replicas []string, have map[string]bool, entryID int64, parts [][]byte) (
	failed map[string]bool, firstErr, err error) {
	type ack struct {
		bookie string
		rc     protocol.ReturnCode
		err    error
	}
	ch := make(chan ack, len(replicas))
	sent := 0
	for _, b := range replicas {
		if have[b] {
			continue
		}
		sent++
		lh.c.cfg.dial(b).Add(lh.id, entryID, &lh.key, protocol.FlagRecoveryAdd|protocol.FlagHighPriority, parts, func(_ any, rc protocol.ReturnCode, err error) {
			ch <- ack{b, rc, err}
		}, nil)
	}
	for range sent {
		select {
		case a := <-ch:
			switch {
			case a.err == nil && a.rc == protocol.EOK:
				have[a.bookie] = true
			case a.err == nil && a.rc == protocol.EUA:
				return nil, nil, ErrUnauthorized
			default:
				if failed == nil {
					failed = map[string]bool{}
				}
				failed[a.bookie] = true
				firstErr = cmpErr(firstErr, fmt.Errorf("%s: rc %v: %v", a.bookie, a.rc, a.err))
			}
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	return failed, firstErr, nil
}

// replaceForRecovery replaces the failed bookies of written's last ensemble from entry first
// on, in written only (see recover), with bookies not in excluded.
func (lh *Ledger) replaceForRecovery(written *metadata.LedgerMetadata, first int64, failed, excluded map[string]bool) error {
	last, _ := written.LastEnsemble()
	ens := slices.Clone(last.Bookies)
	for i, b := range ens {
		if !failed[b] {
			continue
		}
		repl, err := lh.c.cfg.Placement.Replace(ens, i, written.WriteQuorumSize, lh.c.writableBookies(), excluded)
		if err != nil {
			return err
		}
		ens[i] = repl
	}
	if last.FirstEntryID == first {
		written.Ensembles[len(written.Ensembles)-1].Bookies = ens
	} else {
		written.Ensembles = append(written.Ensembles, metadata.Ensemble{FirstEntryID: first, Bookies: ens})
	}
	return nil
}
