package index

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Batch collects writes to commit atomically: after a crash either all of a committed batch
// is there or none of it (and with sync, all of it). A Batch is used by one goroutine at a
// time and is reusable: Commit and Reset empty it and keep its buffer (up to
// Config.MaxRetainedBatchBytes), so a checkpoint's locations cost no allocation per entry.
//
// The Put and Delete methods do not return errors: a bad argument (a negative id, an
// oversized value) is remembered, and Commit then returns it and writes nothing.
type Batch struct {
	ix  *Index
	pb  *pebble.Batch
	err error // first bad argument since the last Commit or Reset
	key [locationKeyLen]byte
	end [locationKeyLen]byte
	val [locationLen]byte
	buf []byte // ledger state encoding scratch
}

// NewBatch returns an empty batch. Close it when done.
func (ix *Index) NewBatch() *Batch {
	return &Batch{
		ix: ix,
		pb: ix.db.NewBatch(pebble.WithMaxRetainedSizeBytes(ix.cfg.MaxRetainedBatchBytes)),
	}
}

func (b *Batch) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

// PutLocation sets the location of (ledgerID, entryID), replacing any earlier one.
func (b *Batch) PutLocation(ledgerID, entryID int64, loc uint64) {
	if ledgerID < 0 || entryID < 0 {
		b.fail(fmt.Errorf("%w: ledger %d entry %d", ErrBadID, ledgerID, entryID))
		return
	}
	putLocationKey(b.key[:], ledgerID, entryID)
	binary.BigEndian.PutUint64(b.val[:], loc)
	// Set copies key and value into the batch; it fails only past pebble's 4 GiB limit, where
	// it panics instead.
	_ = b.pb.Set(b.key[:], b.val[:], nil)
}

// PutLedger stores the whole state of ledgerID, replacing any earlier one.
func (b *Batch) PutLedger(ledgerID int64, st LedgerState) {
	if ledgerID < 0 {
		b.fail(fmt.Errorf("%w: ledger %d", ErrBadID, ledgerID))
		return
	}
	var err error
	if b.buf, err = appendLedgerState(b.buf[:0], &st); err != nil {
		b.fail(fmt.Errorf("index: ledger %d: %w", ledgerID, err))
		return
	}
	putLedgerKey(b.key[:ledgerKeyLen], ledgerID)
	_ = b.pb.Set(b.key[:ledgerKeyLen], b.buf, nil)
}

// DeleteLedger removes the state of ledgerID and, with one range deletion, all its
// locations.
func (b *Batch) DeleteLedger(ledgerID int64) {
	if ledgerID < 0 {
		b.fail(fmt.Errorf("%w: ledger %d", ErrBadID, ledgerID))
		return
	}
	putLedgerKey(b.key[:ledgerKeyLen], ledgerID)
	_ = b.pb.Delete(b.key[:ledgerKeyLen], nil)
	var bounds [2 * locationKeyLen]byte
	lower, upper := putLedgerBounds(bounds[:], ledgerID, 0)
	_ = b.pb.DeleteRange(lower, upper, nil)
}

// Len returns the number of operations in the batch (a DeleteLedger counts as two).
func (b *Batch) Len() int { return int(b.pb.Count()) }

// Commit applies the batch and empties it for reuse. With sync, Commit returns only after
// pebble's WAL is fsynced: the batch, and every batch committed before it, then survives a
// crash or a power loss. Without sync, the batch is visible to look-ups at once but may be
// lost in a crash (a later synced commit makes it durable too). Committing an empty batch
// with sync still syncs the WAL. If a Put or Delete had a bad argument, Commit writes nothing
// and returns that error; the batch is emptied either way.
func (b *Batch) Commit(sync bool) error {
	if err := b.err; err != nil {
		b.Reset()
		return err
	}
	if !b.ix.enter() {
		return ErrClosed
	}
	defer b.ix.exit()
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
		if b.pb.Empty() {
			// pebble skips an empty batch altogether, WAL sync included; an empty
			// log-data record makes it write and sync a WAL record.
			_ = b.pb.LogData(nil, nil)
		}
	}
	// A failed WAL write or fsync is fatal inside pebble (it calls Logger.Fatalf), so an
	// error here is about the batch itself, never about durability.
	if err := b.pb.Commit(opts); err != nil {
		return fmt.Errorf("index: commit: %w", wrapPebble(err))
	}
	b.pb.Reset()
	return nil
}

// Reset discards the batch's contents (and any remembered error), keeping its buffer.
func (b *Batch) Reset() {
	b.pb.Reset()
	b.err = nil
}

// Close releases the batch without committing what it holds. The batch must not be used
// afterwards.
func (b *Batch) Close() {
	_ = b.pb.Close()
}
