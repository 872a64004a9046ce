package engine

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/ringkeeper/ringkeeper/journal"
)

// replay re-applies every journal from its persisted mark: ledger keys, fences, explicit LACs
// and data entries. Replay is idempotent: adds overwrite. When a write-cache half fills during
// replay it is flushed at once (without persisting a mark, which only the checkpoint after
// replay does).
func (e *Engine) replay() error {
	for i, dir := range e.cfg.JournalDirs {
		mark, err := e.markStores[i].Load()
		if err != nil {
			return err
		}
		jdir := filepath.Join(dir, currentDir)
		var data, skipped int
		res, err := journal.Replay(context.Background(), journal.ReplayOptions{
			FS: e.fs, Dir: jdir, From: mark, Truncate: true, Logger: e.log,
			SkipInvalidRecords: e.cfg.Journal.SkipInvalidRecords,
		}, func(r *journal.Record) error {
			applied, err := e.apply(r)
			if applied && r.Type == journal.RecordData {
				data++
			} else if !applied {
				skipped++
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("engine: replay journal %s from %v: %w", jdir, mark, err)
		}
		e.log.Info("journal replayed", "dir", jdir, "from", mark.String(), "records", res.Records,
			"entries", data, "skipped", skipped, "torn_file", res.TornFile, "torn_offset", res.TornOffset)
	}
	return nil
}

// apply applies one replayed record. It reports false for records it skips: records of ledgers
// deleted since (their key is gone from both journal range and index), and of ledgers whose
// deletion the index committed with a fenced-deleted tombstone (the records predate it).
func (e *Engine) apply(r *journal.Record) (bool, error) {
	if r.LedgerID < 0 || r.Type == journal.RecordData && r.EntryID < 0 {
		// Older builds journaled such records from hostile requests; the index cannot hold
		// them, and no client can have been acknowledged for them usefully.
		e.log.Warn("replay: skipping a journal record with a negative id", "ledger", r.LedgerID, "entry", r.EntryID,
			"file", journal.FileName(r.FileID), "offset", r.Offset)
		return false, nil
	}
	switch r.Type {
	case journal.RecordLedgerKey:
		l := e.ledgers.load(r.LedgerID, r.Payload)
		if l == nil {
			return false, nil
		}
		e.dir(r.LedgerID).markDirty(l)
		return true, nil
	case journal.RecordFence:
		l := e.ledgers.get(r.LedgerID)
		if l == nil {
			return false, nil
		}
		l.fenced.Store(true)
		l.mu.Lock()
		l.fenceDurable = true
		l.mu.Unlock()
		e.dir(r.LedgerID).markDirty(l)
		return true, nil
	case journal.RecordExplicitLAC:
		l := e.ledgers.get(r.LedgerID)
		if l == nil {
			return false, nil
		}
		l.mu.Lock()
		l.explicitLAC = append([]byte(nil), r.Payload...)
		l.mu.Unlock()
		e.dir(r.LedgerID).markDirty(l)
		return true, nil
	case journal.RecordData:
		ledgerID, entryID, err := StoredEntryIDs(r.Payload)
		if err != nil || ledgerID != r.LedgerID || entryID != r.EntryID {
			return false, fmt.Errorf("%w: journal record %d/%d at %s offset %d holds a malformed stored entry",
				journal.ErrCorruption, r.LedgerID, r.EntryID, journal.FileName(r.FileID), r.Offset)
		}
		if e.ledgers.get(ledgerID) == nil {
			return false, nil
		}
		d := e.dir(ledgerID)
		for {
			h := d.active.Load()
			if _, _, ok := h.put(ledgerID, entryID, r.Payload, false); ok {
				return true, nil
			}
			if h.empty() {
				// No flush makes room for it: the cache was made smaller, or the largest entry
				// lowered, since it was acknowledged.
				return false, fmt.Errorf("%w: journal record %d/%d at %s offset %d holds an entry of %d bytes, "+
					"which does not fit an empty write-cache half of %s (%d bytes in segments of %d): raise dbStorage_writeCacheMaxSizeMb",
					ErrBadConfig, r.LedgerID, r.EntryID, journal.FileName(r.FileID), r.Offset, len(r.Payload), d.path, h.capacity, h.segSize)
			}
			if err := d.flush(nil); err != nil {
				return false, err
			}
		}
	}
	return false, nil
}
