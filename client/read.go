package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/transport"
)

// readResult is one bookie's answer to a read.
type readResult struct {
	replica int
	rc      protocol.ReturnCode
	entry   []byte // copied: the transport's buffer is reused after the callback
	err     error
}

type readCtx struct {
	ch      chan readResult
	replica int
}

func readResponse(ctx any, rc protocol.ReturnCode, entry []byte, err error) {
	rctx := ctx.(*readCtx)
	var copied []byte
	if err == nil && rc == protocol.EOK {
		copied = append([]byte(nil), entry...)
	}
	rctx.ch <- readResult{replica: rctx.replica, rc: rc, entry: copied, err: err}
}

// writeSet returns the bookies holding entryID, in write-set order, per the metadata.
func writeSet(md *metadata.LedgerMetadata, entryID int64) ([]string, error) {
	ens, ok := md.EnsembleAt(entryID)
	if !ok {
		return nil, fmt.Errorf("%w: no ensemble for entry %d", ErrNoSuchEntry, entryID)
	}
	e := int64(md.EnsembleSize)
	set := make([]string, md.WriteQuorumSize)
	for k := range set {
		set[k] = ens.Bookies[(entryID+int64(k))%e]
	}
	return set, nil
}

func isMissing(rc protocol.ReturnCode) bool {
	return rc == protocol.ENOENTRY || rc == protocol.ENOLEDGER
}

// replicaErr is the error of a read that bookie failed: r.err, or an rc that is neither EOK
// nor missing. final says the read should stop at once rather than try other replicas: the
// caller's ctx ended (a send it cut short failed; no bookie did), its error is returned; or
// this client is closed (no bookie failed, and none can answer any more), ErrClosed. A read
// that timed out is ErrBookieUnavailable and ErrTimeout.
func replicaErr(ctx context.Context, bookie string, r readResult) (final bool, err error) {
	switch {
	case ctx.Err() != nil:
		return true, ctx.Err()
	case errors.Is(r.err, transport.ErrClosed):
		return true, fmt.Errorf("%w: %w", ErrClosed, r.err)
	case errors.Is(r.err, transport.ErrTimeout): // tells a caller a slow bookie from a failed one
		return false, fmt.Errorf("%w: %w: %s: %v", ErrBookieUnavailable, ErrTimeout, bookie, r.err)
	case r.err != nil:
		return false, fmt.Errorf("%w: %s: %v", ErrBookieUnavailable, bookie, r.err)
	}
	return false, fmt.Errorf("%w: %s: rc %v", ErrBookieUnavailable, bookie, r.rc)
}

// metadataRecheck is how often, at most, a read handle of an open ledger re-reads its
// metadata when a LAC read finds nothing new: the writer may have moved to bookies the handle
// does not know, which then never report the later LACs.
const metadataRecheck = time.Second

// readEntry reads one entry from its write set: one replica at a time, the next one after an
// error or after SpeculativeReadTimeout without an answer. A digest mismatch is reported and
// the next replica tried. It fails with ErrNoSuchEntry only if every replica said so. A read
// handle of an open ledger that fails re-reads the metadata and, if it changed (an ensemble
// change since the handle was opened), reads from the new write set.
func (lh *Ledger) readEntry(ctx context.Context, entryID int64) (Entry, error) {
	lh.mu.Lock()
	md := lh.md
	lh.mu.Unlock()
	e, err := lh.readReplicas(ctx, md, entryID)
	if err != nil && ctx.Err() == nil && lh.mayBeStale(md) {
		if changed, _ := lh.refreshMetadata(ctx, md); changed {
			lh.mu.Lock()
			md = lh.md
			lh.mu.Unlock()
			return lh.readReplicas(ctx, md, entryID)
		}
	}
	return e, err
}

// mayBeStale says whether md, this handle's metadata, may be behind the metadata service: only
// a read handle's, and only while the ledger is open.
func (lh *Ledger) mayBeStale(md *metadata.LedgerMetadata) bool {
	return lh.readOnly && md.State != metadata.StateClosed
}

// refreshMetadata re-reads a read handle's metadata, unless it changed since the caller read
// seen (another caller refreshed it meanwhile). changed says whether the handle's metadata is
// now another than seen.
func (lh *Ledger) refreshMetadata(ctx context.Context, seen *metadata.LedgerMetadata) (changed bool, err error) {
	select {
	case lh.refreshing <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-lh.refreshing }()
	lh.mu.Lock()
	cur := lh.md
	lh.mu.Unlock()
	if cur != seen {
		return true, nil
	}
	md, v, err := lh.c.md.Ledgers().Read(ctx, lh.id)
	if err != nil {
		return false, err
	}
	lh.mu.Lock()
	defer lh.mu.Unlock()
	lh.refreshedAt = time.Now()
	if v == lh.version {
		return false, nil
	}
	lh.setMetadataLocked(md, v)
	return true, nil
}

// readReplicas reads entryID from its write set in md (see readEntry).
func (lh *Ledger) readReplicas(ctx context.Context, md *metadata.LedgerMetadata, entryID int64) (Entry, error) {
	replicas, err := writeSet(md, entryID)
	if err != nil {
		return Entry{}, err
	}
	ch := make(chan readResult, len(replicas))
	sent := 0
	send := func() {
		lh.c.cfg.dial(replicas[sent]).Read(ctx, lh.id, entryID, 0, nil, readResponse, &readCtx{ch: ch, replica: sent})
		sent++
	}
	send()
	var timer *time.Timer
	var timeout <-chan time.Time
	if d := lh.c.cfg.SpeculativeReadTimeout; d > 0 {
		timer = time.NewTimer(d)
		defer timer.Stop()
		timeout = timer.C
	}
	missing, received := 0, 0
	var firstErr error
	for {
		select {
		case r := <-ch:
			received++
			switch {
			case r.err == nil && r.rc == protocol.EOK:
				e, err := lh.dg.verify(r.entry, lh.id, entryID)
				if err == nil {
					return e, nil
				}
				lh.c.log.Warn("bad entry from bookie; reading another replica", "ledger", lh.id, "entry", entryID,
					"bookie", replicas[r.replica], "err", err)
				firstErr = cmpErr(firstErr, fmt.Errorf("bookie %s: %w", replicas[r.replica], err))
			case r.err == nil && isMissing(r.rc):
				missing++
			case r.err == nil && r.rc == protocol.EUA:
				firstErr = cmpErr(firstErr, ErrUnauthorized)
			default:
				final, err := replicaErr(ctx, replicas[r.replica], r)
				if final {
					return Entry{}, err
				}
				firstErr = cmpErr(firstErr, err)
			}
			if sent < len(replicas) {
				send()
				if timer != nil {
					timer.Reset(lh.c.cfg.SpeculativeReadTimeout)
				}
				continue
			}
			if received == sent {
				if missing == len(replicas) {
					return Entry{}, fmt.Errorf("%w: %d/%d", ErrNoSuchEntry, lh.id, entryID)
				}
				if firstErr == nil {
					firstErr = fmt.Errorf("%w: %d/%d (missing on %d of %d replicas)", ErrNoSuchEntry, lh.id, entryID, missing, len(replicas))
				}
				return Entry{}, firstErr
			}
		case <-timeout:
			if sent < len(replicas) {
				send()
				timer.Reset(lh.c.cfg.SpeculativeReadTimeout)
			}
		case <-ctx.Done():
			return Entry{}, ctx.Err()
		}
	}
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// readableLast is the last entry this handle may read: the last entry of a closed ledger, or
// the last add confirmed.
func (lh *Ledger) readableLast() int64 {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	if lh.md.State == metadata.StateClosed {
		return lh.md.LastEntryID
	}
	return lh.lac
}

// Read returns entries first..last (inclusive), verified, with up to ReadWindow reads in
// flight. Reading past the last add confirmed fails with ErrNoSuchEntry.
func (lh *Ledger) Read(ctx context.Context, first, last int64) ([]Entry, error) {
	var out []Entry
	for e, err := range lh.Entries(ctx, first, last) {
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Entries streams entries first..last in order, reading ahead up to ReadWindow entries. It
// stops at the first error, which it yields.
func (lh *Ledger) Entries(ctx context.Context, first, last int64) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		if first < 0 || last < first {
			yield(Entry{}, fmt.Errorf("%w: range %d..%d", ErrBadArgument, first, last))
			return
		}
		if max := lh.readableLast(); last > max {
			yield(Entry{}, fmt.Errorf("%w: entry %d is past the last confirmed entry %d of ledger %d", ErrNoSuchEntry, last, max, lh.id))
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type slot struct {
			e   Entry
			err error
		}
		window := lh.c.cfg.ReadWindow
		results := make([]chan slot, 0, window)
		next := first
		issue := func() {
			ch := make(chan slot, 1)
			id := next
			next++
			go func() {
				e, err := lh.readEntry(ctx, id)
				ch <- slot{e, err}
			}()
			results = append(results, ch)
		}
		for next <= last && len(results) < window {
			issue()
		}
		for len(results) > 0 {
			r := <-results[0]
			results = results[1:]
			if r.err != nil {
				yield(Entry{}, r.err)
				return
			}
			if !yield(r.e, nil) {
				return
			}
			if next <= last {
				issue()
			}
		}
	}
}

// ReadLastAddConfirmed asks the bookies of the last ensemble for their last entry and returns
// the highest LAC those entries carry (entries up to it are safe to read), once enough bookies
// answered to cover every write quorum. The handle's LastAddConfirmed moves up to it. A read
// handle also re-reads the ledger's metadata when that fails, or (at most once per
// metadataRecheck) when it learns nothing new: the writer may have replaced the bookies it asked,
// or closed the ledger.
func (lh *Ledger) ReadLastAddConfirmed(ctx context.Context) (int64, error) {
	lh.mu.Lock()
	md, prev, recheck := lh.md, lh.lac, time.Since(lh.refreshedAt) >= metadataRecheck
	lh.mu.Unlock()
	if md.State == metadata.StateClosed {
		return md.LastEntryID, nil
	}
	found, err := lh.readLAC(ctx, md, false)
	if (err != nil || found <= prev && recheck) && ctx.Err() == nil && lh.mayBeStale(md) {
		if changed, rerr := lh.refreshMetadata(ctx, md); rerr == nil && changed {
			lh.mu.Lock()
			md = lh.md
			lh.mu.Unlock()
			if md.State == metadata.StateClosed {
				return md.LastEntryID, nil
			}
			found, err = lh.readLAC(ctx, md, false)
		}
	}
	if err != nil {
		return -1, err
	}
	lh.mu.Lock()
	lh.lac = max(lh.lac, found)
	lac := lh.lac
	lh.mu.Unlock()
	return lac, nil
}

// readLAC sends READ(-1) to every bookie of the last ensemble (fencing ones with fence) and
// waits until, for every write quorum, fewer than Qa of its bookies are unknown (not answered,
// or answered with an error): then no write quorum can have acknowledged an entry without one
// of the known bookies having it. NoSuchEntry and NoSuchLedger count as known. It returns the
// highest LAC the known bookies reported (-1: none), also with an error.
func (lh *Ledger) readLAC(ctx context.Context, md *metadata.LedgerMetadata, fence bool) (int64, error) {
	last, _ := md.LastEnsemble()
	n := len(last.Bookies)
	ch := make(chan readResult, n)
	flags := protocol.Flags(0)
	var key *[20]byte
	if fence {
		flags, key = protocol.FlagDoFencing|protocol.FlagHighPriority, &lh.key
	}
	for i, b := range last.Bookies {
		lh.c.cfg.dial(b).Read(ctx, lh.id, -1, flags, key, readResponse, &readCtx{ch: ch, replica: i})
	}
	known := make([]bool, n)
	lac := int64(-1)
	covered := func() bool {
		for start := range n {
			unknown := 0
			for k := range md.WriteQuorumSize {
				if !known[(start+k)%n] {
					unknown++
				}
			}
			if unknown >= md.AckQuorumSize {
				return false
			}
		}
		return true
	}
	var firstErr error
	for received := 0; received < n; {
		select {
		case r := <-ch:
			received++
			switch {
			case r.err == nil && r.rc == protocol.EOK:
				e, err := lh.dg.verify(r.entry, lh.id, -1)
				if err != nil {
					lh.c.log.Warn("bad last entry from bookie", "ledger", lh.id, "bookie", last.Bookies[r.replica], "err", err)
					firstErr = cmpErr(firstErr, fmt.Errorf("bookie %s: %w", last.Bookies[r.replica], err))
					// Its LAC is unknown, but an EOK to a fencing read means it is fenced (the
					// bookie answers once the fence is durable): it counts for the fence.
					known[r.replica] = fence
					if fence && covered() {
						return lac, nil
					}
					continue
				}
				known[r.replica] = true
				lac = max(lac, e.LastAddConfirmed)
			case r.err == nil && isMissing(r.rc):
				known[r.replica] = true
			case r.err == nil && r.rc == protocol.EUA:
				return lac, fmt.Errorf("%w: ledger %d", ErrUnauthorized, lh.id)
			default:
				final, err := replicaErr(ctx, last.Bookies[r.replica], r)
				if final {
					return lac, err
				}
				firstErr = cmpErr(firstErr, err)
			}
			if covered() {
				return lac, nil
			}
		case <-ctx.Done():
			return lac, ctx.Err()
		}
	}
	return lac, fmt.Errorf("%w: too few bookies of the last ensemble answered: %w", ErrNotEnoughBookies, firstErr)
}
