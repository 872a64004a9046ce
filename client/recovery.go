package client

import (
	"context"
	"errors"
	"fmt"
	"hash"

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
		if err := lh.recoveryAdd(ctx, md, e, lac); err != nil {
			return fmt.Errorf("%w: ledger %d: re-add entry %d: %w", ErrRecovery, lh.id, id, err)
		}
		lastEntry, length = id, e.Length
	}
	md, version, err = metadata.UpdateLedger(ctx, lh.c.md.Ledgers(), lh.id, func(m *metadata.LedgerMetadata) error {
		if m.State == metadata.StateClosed {
			return metadata.ErrUnchanged // another recoverer closed it first
		}
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

// recoveryAdd writes e again, with RECOVERY_ADD, to its whole write quorum and waits for Qa
// acknowledgements. The entry is re-sealed with lac, the LAC frozen at the start of recovery,
// so that no reader learns of dirty entries from a recovery write.
func (lh *Ledger) recoveryAdd(ctx context.Context, md *metadata.LedgerMetadata, e *Entry, lac int64) error {
	replicas, err := writeSet(md, e.EntryID)
	if err != nil {
		return err
	}
	hdr := make([]byte, lh.dg.headerSize())
	var mac hash.Hash
	if lh.dg.typ == DigestHMAC {
		mac = lh.dg.newMAC()
	}
	lh.dg.seal(hdr, mac, lh.id, e.EntryID, lac, e.Length, e.Payload)
	parts := [][]byte{hdr, e.Payload}
	type ack struct {
		bookie string
		rc     protocol.ReturnCode
		err    error
	}
	ch := make(chan ack, len(replicas))
	for _, b := range replicas {
		lh.c.cfg.dial(b).Add(lh.id, e.EntryID, &lh.key, protocol.FlagRecoveryAdd|protocol.FlagHighPriority, parts, func(_ any, rc protocol.ReturnCode, err error) {
			ch <- ack{b, rc, err}
		}, nil)
	}
	acks := 0
	var firstErr error
	for range replicas {
		select {
		case a := <-ch:
			if a.err == nil && a.rc == protocol.EOK {
				acks++
				if acks >= md.AckQuorumSize {
					return nil
				}
				continue
			}
			if a.err == nil && a.rc == protocol.EUA {
				return ErrUnauthorized
			}
			firstErr = cmpErr(firstErr, fmt.Errorf("%s: rc %v: %v", a.bookie, a.rc, a.err))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fmt.Errorf("%w: only %d of %d bookies took the recovery add (%d needed): %v", ErrNotEnoughBookies, acks, len(replicas), md.AckQuorumSize, firstErr)
}
