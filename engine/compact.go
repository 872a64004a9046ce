package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ringkeeper/ringkeeper/entrylog"
)

// dirGC is one ledger dir's garbage-collection state, used by the run in progress only (under
// gc.runMu).
type dirGC struct {
	d *ledgerDir
	// usage caches each completed log's ledgers map (reading one may mean scanning the whole
	// log), minus the ledgers that have died since.
	usage map[uint64]*logUsage
	// bad holds logs whose map or data could not be read, skipped until restart.
	bad map[uint64]error
}

// logUsage is a completed log's live-data accounting: bytes per ledger still alive.
type logUsage struct {
	ledgers map[int64]uint64
	total   uint64 // bytes of every ledger's records, dead or alive
	live    uint64 // bytes of the live ledgers' records
	size    int64  // the file's size on disk
}

func (u *logUsage) ratio() float64 {
	if u.total == 0 {
		return 0
	}
	return float64(u.live) / float64(u.total)
}

func (g *dirGC) markBad(id uint64, err error) {
	g.bad[id] = err
	delete(g.usage, id)
	g.d.e.log.Error("entry log skipped by garbage collection until restart", "dir", g.d.path, "log", fmt.Sprintf("%x", id), "err", err)
}

// refresh brings the usage cache up to date: it forgets removed logs, reads the ledgers maps
// of newly completed ones and drops the ledgers that have died. A ledger counts as dead only
// when the engine no longer has it and the index holds none of its locations: its deletion is
// committed, so no location can point at its records any more (a cross-check of the ledgers
// map against the index; BookKeeper #4607). Deletions are committed first.
func (g *dirGC) refresh(ctx context.Context) error {
	d := g.d
	if err := d.commitDeletes(); err != nil {
		return err
	}
	if err := d.e.hook(stepGCDeletesCommitted); err != nil {
		return err
	}
	// Under flushMu: a flush finalizes a log (rolling over) before it commits the locations of
	// what it just wrote there; listed in between, the log would be compacted without them and
	// removed.
	d.flushMu.Lock()
	logs := d.log.CompletedLogs()
	d.flushMu.Unlock()
	present := make(map[uint64]bool, len(logs))
	for _, id := range logs {
		present[id] = true
	}
	for id := range g.usage {
		if !present[id] {
			delete(g.usage, id)
		}
	}
	for _, id := range logs {
		if ctx.Err() != nil {
			return nil
		}
		if g.usage[id] != nil || g.bad[id] != nil {
			continue
		}
		m, scannedTo, err := d.log.LedgersMap(id)
		if err == nil && scannedTo >= 0 {
			var ierr error
			if err, ierr = g.checkScannedLog(id, scannedTo); ierr != nil {
				return ierr
			}
		}
		if err == nil {
			var size int64
			if size, err = d.log.Size(id); err == nil {
				u := &logUsage{ledgers: m, size: size}
				for _, n := range m {
					u.total += n
				}
				u.live = u.total
				g.usage[id] = u
				continue
			}
		}
		if d.e.Err() != nil {
			return d.e.Err()
		}
		g.markBad(id, err)
	}
	return g.dropDeadLedgers()
}

// checkScannedLog checks a log whose ledgers map a scan rebuilt (a crash before it was
// finalized, or a damaged map) against the index: the scan ends at the first invalid record it
// cannot prove durable, taking damage in the log's last run for a torn tail. A location at or
// past that end proves the data there was durable: the log is corrupt (bad), and must be neither
// compacted nor removed. It reads every location of the index, but only for such logs, once.
func (g *dirGC) checkScannedLog(id uint64, scannedTo int64) (bad, err error) {
	d := g.d
	var ierr error
	err = d.idx.Ledgers(func(ledger int64, _ ledgerState) bool {
		ierr = d.idx.Entries(ledger, 0, func(entry int64, loc uint64) bool {
			if at := entrylog.Location(loc); at.LogID() == id && at.Offset() >= scannedTo {
				bad = fmt.Errorf("%w: entry log %x: the index points at ledger %d entry %d at offset %d, past the end of "+
					"the valid data a scan found (%d): the damage is in durable data", entrylog.ErrCorrupt, id, ledger, entry,
					at.Offset(), scannedTo)
				return false
			}
			return true
		})
		return ierr == nil && bad == nil
	})
	if err = cmp.Or(err, ierr); err != nil {
		return nil, fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
	}
	return bad, nil
}

// dropDeadLedgers removes the dead ledgers from the cached maps, checking each once against the
// index (see refresh).
func (g *dirGC) dropDeadLedgers() error {
	d := g.d
	dead := map[int64]bool{}
	for _, u := range g.usage {
		for l, n := range u.ledgers {
			isDead, seen := dead[l]
			if !seen {
				isDead = d.e.ledgers.get(l) == nil
				if isDead {
					_, found, err := d.idx.LastEntry(l)
					if err != nil {
						return fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
					}
					// Locations left: the deletion is not committed yet (a later run
					// retries), or the index and the engine disagree: keep the data.
					isDead = !found
				}
				dead[l] = isDead
			}
			if isDead {
				delete(u.ledgers, l)
				u.live -= n
			}
		}
	}
	return nil
}

// candidates returns the logs whose live share is below threshold (and above zero: empty logs
// are removed whole), emptiest first.
func (g *dirGC) candidates(threshold float64) []uint64 {
	var ids []uint64
	for id, u := range g.usage {
		if u.live > 0 && u.ratio() < threshold {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b uint64) int {
		return cmp.Or(cmp.Compare(g.usage[a].ratio(), g.usage[b].ratio()), cmp.Compare(a, b))
	})
	return ids
}

// commitDeletes writes the pending ledger deletions (index range deletes, with the tombstones
// of fenced ledgers) and tombstone removals as one synced batch, so that no removed log can be
// referenced by a ledger that a crash would bring back.
func (d *ledgerDir) commitDeletes() error {
	d.flushMu.Lock()
	defer d.flushMu.Unlock()
	if err := d.e.Err(); err != nil {
		return err
	}
	d.dirtyMu.Lock()
	deletes, drops := d.deletes, d.fencedDrops
	d.deletes, d.fencedDrops = nil, nil
	d.dirtyMu.Unlock()
	if len(deletes) == 0 && len(drops) == 0 {
		return nil
	}
	deleted := putDeletes(d.gcBatch, deletes, drops)
	if err := d.gcBatch.Commit(true); err != nil {
		err = fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
		d.e.fail(err)
		return err
	}
	d.e.ledgers.deleted(deleted, d.e.snapshots.Load())
	d.indexSeq.Add(1)
	return d.e.hook(stepDeletesCommitted)
}

// removeLogs removes completed logs that no index location points into any more: it commits
// pending deletions, waits for reads that may have looked up an old location (logsMu), then
// removes each log durably. It returns how many logs it removed and their bytes on disk.
func (d *ledgerDir) removeLogs(ids []uint64) (n int, bytes int64, err error) {
	if err := d.commitDeletes(); err != nil {
		return 0, 0, err
	}
	// The deletions and relocations that leave these logs unreferenced must not live only in
	// pebble's WAL: damage at its end drops them silently, and the index would point into
	// removed logs (the checkpoint record covers only what the journals still hold).
	if err := d.idx.Flush(); err != nil {
		err = fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
		d.e.fail(err)
		return 0, 0, err
	}
	if err := d.e.hook(stepLogsIndexFlushed); err != nil {
		return 0, 0, err
	}
	// Every read that started before this point and may still use a location in these logs
	// holds logsMu shared; reads that start later find the index's current locations.
	d.logsMu.Lock()
	d.logsMu.Unlock() // (empty on purpose: a barrier, not a critical section)
	var errs []error
	for _, id := range ids {
		size := int64(0)
		if u := d.gc.usage[id]; u != nil {
			size = u.size
		}
		if err := d.log.Remove(id); err != nil {
			errs = append(errs, fmt.Errorf("engine: gc: %w", err))
			continue
		}
		delete(d.gc.usage, id)
		n++
		bytes += size
		if err := d.e.hook(stepLogRemoved); err != nil {
			return n, bytes, errors.Join(append(errs, err)...)
		}
	}
	return n, bytes, errors.Join(errs...)
}

// compactEntry is one live entry being copied: where it was and where its bytes sit in the
// chunk buffer.
type compactEntry struct {
	ledger, entry int64
	from          uint64
	offset, size  int
}

// compactChunk collects live entries of a log up to compactionChunkBytes.
type compactChunk struct {
	entries []compactEntry
	buf     []byte
	// seq is the dir's indexSeq before the first index look-up of the chunk: if it is
	// unchanged when the chunk commits, no index write happened meanwhile.
	seq uint64
}

func (c *compactChunk) reset(seq uint64) {
	c.entries, c.buf, c.seq = c.entries[:0], c.buf[:0], seq
}

// compactLog copies the live entries of completed log id to the current entry log, one chunk at
// a time, then removes the log. An entry is live when its ledger is alive and the index still
// points at this very record (an entry written again elsewhere is not clobbered). Each chunk:
// the entries are added to the entry log, which is fsynced; then, only where the index still
// points at the old record, the locations are updated in one synced batch; all of it under
// flushMu, so that no checkpoint writes the entry log or the index in between. Only after every
// chunk is the old log removed (removeLogs). A crash at any point leaves every entry readable at
// its old or its new location. Reads and writes are each limited to RateBytes.
func (d *ledgerDir) compactLog(ctx context.Context, g *gc, id uint64, pause func() string) error {
	start := time.Now()
	c := &logCompaction{ctx: ctx, d: d, g: g, pause: pause}
	c.chunk.reset(d.indexSeq.Load())
	err := d.log.Scan(id, c.visit)
	if err == nil && len(c.chunk.entries) > 0 {
		err = c.commit()
	}
	g.update(func(s *GCStatus) {
		s.CompactionReadBytes += uint64(c.readBytes)
		s.CompactionSeconds += time.Since(start).Seconds()
	})
	if err != nil {
		if ctx.Err() != nil || isWaitDeadline(err) {
			return errors.Join(err, ctx.Err())
		}
		return fmt.Errorf("engine: compact %s log %x: %w", d.path, id, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	size := int64(0)
	if u := d.gc.usage[id]; u != nil {
		size = u.size
	}
	n, _, err := d.removeLogs([]uint64{id})
	if err != nil {
		return err
	}
	if err := d.e.hook(stepCompactLogRemoved); err != nil {
		return err
	}
	if n == 1 {
		g.update(func(s *GCStatus) {
			s.CompactedLogs++
			s.ReclaimedBytes += uint64(size)
		})
		d.e.log.Info("entry log compacted", "dir", d.path, "log", fmt.Sprintf("%x", id), "moved_entries", c.moved,
			"read_bytes", c.readBytes, "seconds", time.Since(start).Seconds())
	}
	return nil
}

// logCompaction is the state of one compactLog.
type logCompaction struct {
	ctx   context.Context
	d     *ledgerDir
	g     *gc
	pause func() string
	chunk compactChunk
	// readBytes counts what was scanned, unthrottled what was not yet charged to the read
	// limiter; moved counts the entries whose location moved.
	readBytes, unthrottled, moved int
}

// visit takes one scanned record: it keeps it in the chunk if it is live, and commits the
// chunk when it is full.
func (c *logCompaction) visit(ledger, entry int64, data []byte, loc uint64) error {
	d := c.d
	size := len(data) + recordOverhead
	c.readBytes += size
	c.unthrottled += size
	if c.unthrottled >= readThrottleBytes {
		if err := waitBytes(c.ctx, c.g.readLimit, c.unthrottled); err != nil {
			return err
		}
		c.unthrottled = 0
	}
	if err := c.ctx.Err(); err != nil {
		return err
	}
	if entry < 0 || d.e.ledgers.get(ledger) == nil {
		return nil
	}
	cur, found, err := d.idx.Location(ledger, entry)
	if err != nil {
		return fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
	}
	if !found || cur != loc {
		return nil
	}
	ch := &c.chunk
	ch.entries = append(ch.entries, compactEntry{ledger: ledger, entry: entry, from: loc, offset: len(ch.buf), size: len(data)})
	ch.buf = append(ch.buf, data...)
	if len(ch.buf) < compactionChunkBytes {
		return nil
	}
	if reason := c.pause(); reason != "" {
		return fmt.Errorf("%w: %s", errCompactionPaused, reason)
	}
	return c.commit()
}

// commit moves the chunk's entries and starts a new chunk.
func (c *logCompaction) commit() error {
	n, err := c.d.commitChunk(c.ctx, c.g, &c.chunk)
	c.moved += n
	c.chunk.reset(c.d.indexSeq.Load())
	return err
}

// recordOverhead is the entry-log record header that precedes each stored entry.
const recordOverhead = 32

// readThrottleBytes is how much compaction reads between two waits on the read limiter.
const readThrottleBytes = 64 << 10

// isWaitDeadline reports a rate limiter that refused to wait past the context's deadline.
func isWaitDeadline(err error) bool { return errors.Is(err, errWouldExceedDeadline) }

// errWouldExceedDeadline marks a rate-limit wait that would outlast the compaction's deadline.
var errWouldExceedDeadline = errors.New("engine: compaction time limit reached")

// commitChunk moves a chunk's entries: append them to the entry log and fsync it, then point the
// index at the copies where it still points at the originals, in one synced batch. It returns
// the number of entries whose location moved.
func (d *ledgerDir) commitChunk(ctx context.Context, g *gc, c *compactChunk) (int, error) {
	if err := d.e.hook(stepCompactChunkReady); err != nil {
		return 0, err
	}
	if err := waitBytes(ctx, g.writeLimit, len(c.buf)+len(c.entries)*recordOverhead); err != nil {
		return 0, err
	}
	e := d.e
	d.flushMu.Lock()
	defer d.flushMu.Unlock()
	if err := e.Err(); err != nil {
		return 0, err
	}
	entries := c.entries
	if d.indexSeq.Load() != c.seq {
		// A checkpoint or a deletion wrote the index since the look-ups: check again, now
		// that no index write can happen until we are done.
		var err error
		if entries, err = d.stillAt(entries); err != nil {
			return 0, err
		}
	}
	if len(entries) == 0 {
		return 0, nil
	}
	locs := make([]uint64, len(entries))
	var written int
	fromLog := d.log.CurrentLogID()
	for i, ce := range entries {
		loc, err := d.log.Add(ce.ledger, ce.entry, c.buf[ce.offset:ce.offset+ce.size])
		if err != nil {
			err = fmt.Errorf("%w: entry log of %s: %w", ErrIO, d.path, err)
			e.fail(err)
			return 0, err
		}
		locs[i] = loc
		written += ce.size + recordOverhead
	}
	if err := e.hook(stepCompactCopied); err != nil {
		return 0, err
	}
	if d.log.CurrentLogID() != fromLog {
		if err := e.hook(stepEntryLogRolled); err != nil {
			return 0, err
		}
	}
	if err := d.log.Flush(); err != nil {
		err = fmt.Errorf("%w: entry log of %s: %w", ErrIO, d.path, err)
		e.fail(err)
		return 0, err
	}
	if err := e.hook(stepCompactLogSynced); err != nil {
		return 0, err
	}
	for i, ce := range entries {
		d.gcBatch.PutLocation(ce.ledger, ce.entry, locs[i])
	}
	if err := d.gcBatch.Commit(true); err != nil {
		err = fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
		e.fail(err)
		return 0, err
	}
	d.indexSeq.Add(1)
	g.update(func(s *GCStatus) { s.CompactionWrittenBytes += uint64(written) })
	if err := e.hook(stepCompactIndexSynced); err != nil {
		return 0, err
	}
	return len(entries), nil
}

// stillAt keeps the entries whose ledger is alive and whose index location is still where they
// were copied from. The caller holds flushMu.
func (d *ledgerDir) stillAt(entries []compactEntry) ([]compactEntry, error) {
	kept := entries[:0]
	for _, ce := range entries {
		if d.e.ledgers.get(ce.ledger) == nil {
			continue
		}
		cur, found, err := d.idx.Location(ce.ledger, ce.entry)
		if err != nil {
			return nil, fmt.Errorf("%w: index of %s: %w", ErrIO, d.path, err)
		}
		if found && cur == ce.from {
			kept = append(kept, ce)
		}
	}
	return kept, nil
}
