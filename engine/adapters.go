package engine

import (
	"context"
	"errors"
	"time"

	"github.com/ringkeeper/ringkeeper/entrylog"
	"github.com/ringkeeper/ringkeeper/index"
)

// pebbleIndex adapts package index to locationIndex.
type pebbleIndex struct{ ix *index.Index }

func openIndex(e *Engine, dir string) (locationIndex, error) {
	cfg := index.DefaultConfig(dir)
	cfg.BlockCacheSize = e.cfg.IndexBlockCacheSize
	cfg.Logger = e.log
	ix, err := index.Open(cfg)
	if err != nil {
		return nil, err
	}
	return pebbleIndex{ix}, nil
}

func (p pebbleIndex) Location(ledgerID, entryID int64) (uint64, bool, error) {
	loc, err := p.ix.Location(ledgerID, entryID)
	if errors.Is(err, index.ErrNotFound) {
		return 0, false, nil
	}
	return loc, err == nil, err
}

func (p pebbleIndex) LastEntry(ledgerID int64) (int64, bool, error) {
	entry, _, err := p.ix.LastEntry(ledgerID)
	if errors.Is(err, index.ErrNotFound) {
		return 0, false, nil
	}
	return entry, err == nil, err
}

func (p pebbleIndex) Entries(ledgerID, fromEntry int64, fn func(entryID int64, loc uint64) bool) error {
	return p.ix.Entries(ledgerID, fromEntry, fn)
}

func (p pebbleIndex) Ledgers(fn func(int64, ledgerState) bool) error {
	return p.ix.Ledgers(func(id int64, st index.LedgerState) bool {
		if !st.Exists || st.Deleted {
			return true
		}
		return fn(id, ledgerState{Fenced: st.Fenced, MasterKey: st.MasterKey, ExplicitLAC: st.ExplicitLAC})
	})
}

func (p pebbleIndex) FencedDeleted(fn func(int64, time.Time) bool) error {
	return p.ix.FencedDeleted(fn)
}

func (p pebbleIndex) NewBatch() indexBatch { return pebbleBatch{p.ix.NewBatch()} }

func (p pebbleIndex) Checkpoint() ([]byte, error) { return p.ix.Checkpoint() }
func (p pebbleIndex) Flush() error                { return p.ix.Flush() }
func (p pebbleIndex) Upgraded() bool              { return p.ix.Upgraded() }

func (p pebbleIndex) Warm(ctx context.Context) (int64, error) { return p.ix.Warm(ctx) }

func (p pebbleIndex) Close() error { return p.ix.Close() }

type pebbleBatch struct{ b *index.Batch }

func (b pebbleBatch) PutLocation(ledgerID, entryID int64, loc uint64) {
	b.b.PutLocation(ledgerID, entryID, loc)
}

func (b pebbleBatch) PutLedger(id int64, st ledgerState) {
	b.b.PutLedger(id, index.LedgerState{Exists: true, Fenced: st.Fenced, MasterKey: st.MasterKey, ExplicitLAC: st.ExplicitLAC})
}

func (b pebbleBatch) DeleteLedger(id int64) { b.b.DeleteLedger(id) }
func (b pebbleBatch) DeleteFencedLedger(id int64, at time.Time) {
	b.b.DeleteFencedLedger(id, at)
}
func (b pebbleBatch) DropFencedDeleted(id int64) { b.b.DropFencedDeleted(id) }
func (b pebbleBatch) PutCheckpoint(r []byte)     { b.b.PutCheckpoint(r) }
func (b pebbleBatch) Len() int                   { return b.b.Len() }
func (b pebbleBatch) Commit(sync bool) error     { return b.b.Commit(sync) }

// logAdapter adapts package entrylog to entryLog.
type logAdapter struct{ l *entrylog.EntryLog }

func openEntryLog(e *Engine, dir string) (entryLog, error) {
	if err := e.fs.MkdirAll(dir); err != nil {
		return nil, err
	}
	cfg := entrylog.DefaultConfig(dir)
	cfg.FS = e.fs
	cfg.Engine = e.cfg.Journal.Engine
	cfg.LogSizeLimit = e.cfg.EntryLogSizeLimit
	cfg.MaxEntrySize = e.cfg.Journal.MaxRecordSize
	cfg.Logger = e.log
	l, err := entrylog.Open(cfg)
	if err != nil {
		return nil, err
	}
	return logAdapter{l}, nil
}

func (a logAdapter) Add(ledgerID, entryID int64, entry []byte) (uint64, error) {
	loc, err := a.l.Add(ledgerID, entryID, entry)
	return uint64(loc), err
}

func (a logAdapter) AddChecksummed(ledgerID, entryID int64, entry []byte, crc uint32) (uint64, error) {
	loc, err := a.l.AddChecksummed(ledgerID, entryID, entry, crc)
	return uint64(loc), err
}

func (a logAdapter) Flush() error { return a.l.Flush() }

func (a logAdapter) Read(loc uint64, ledgerID, entryID int64, dst []byte) ([]byte, error) {
	return a.l.Read(entrylog.Location(loc), ledgerID, entryID, dst)
}

func (a logAdapter) ReadAhead(loc uint64, maxBytes int, fn func(ledgerID, entryID int64, entry []byte, loc uint64) bool) error {
	return a.l.ReadAhead(entrylog.Location(loc), maxBytes, func(l, e int64, entry []byte, at entrylog.Location) bool {
		return fn(l, e, entry, uint64(at))
	})
}

func (a logAdapter) CompletedLogs() []uint64 { return a.l.CompletedLogs() }

func (a logAdapter) CurrentLogID() uint64 { return a.l.CurrentLogID() }

func (a logAdapter) LedgersMap(id uint64) (map[int64]uint64, int64, error) {
	return a.l.LedgersMapScanned(id)
}

func (a logAdapter) Scan(id uint64, fn func(ledgerID, entryID int64, entry []byte, loc uint64) error) error {
	return a.l.Scan(id, func(l, e int64, entry []byte, at entrylog.Location) error {
		return fn(l, e, entry, uint64(at))
	})
}

func (a logAdapter) Size(id uint64) (int64, error) { return a.l.Size(id) }

func (a logAdapter) Remove(id uint64) error { return a.l.Remove(id) }

func (a logAdapter) Close() error { return a.l.Close() }
