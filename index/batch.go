package index

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"
)

// Batch collects writes to commit atomically: after a crash either all of a committed batch
// is there or none of it (and with sync, all of it). A Batch is used by one goroutine at a
// time and is reusable: Commit and Reset empty it and keep its buffers (up to
// Config.MaxRetainedBatchBytes), so a checkpoint's locations cost no allocation per entry.
//
// Locations are collected as they come and turned into runs by Commit, which merges them with
// the runs already stored that they overlap (see doc.go). Operations apply in call order: a
// DeleteLedger drops the ledger's earlier locations in the batch, not its later ones.
//
// The Put and Delete methods do not return errors: a bad argument (a negative id, an
// oversized value) is remembered, and Commit then returns it and writes nothing.
type Batch struct {
	ix  *Index
	pb  *pebble.Batch
	err error // first bad argument since the last Commit or Reset
	key [runKeyLen]byte
	buf []byte // value encoding scratch

	// puts are the PutLocation calls since the last Commit or Reset, in call order until
	// Commit sorts them; seq numbers every call, and deleted maps a ledger to the seq of its
	// last DeleteLedger in the batch.
	puts    []put
	seq     int
	deleted map[int64]int
	// checkpoint: the batch sets the checkpoint record (PutCheckpoint).
	checkpoint bool
	// Scratch of Commit's merges.
	news, olds, merged []pair
}

type put struct {
	ledger, entry int64
	loc           uint64
	seq           int
}

// NewBatch returns an empty batch. Close it when done.
func (ix *Index) NewBatch() *Batch {
	return &Batch{
		ix:      ix,
		pb:      ix.db.NewBatch(pebble.WithMaxRetainedSizeBytes(ix.cfg.MaxRetainedBatchBytes)),
		deleted: make(map[int64]int),
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
	b.puts = append(b.puts, put{ledger: ledgerID, entry: entryID, loc: loc, seq: b.seq})
	b.seq++
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
	var bounds [2 * runKeyLen]byte
	lower, upper := putLedgerBounds(bounds[:], ledgerID, 0)
	_ = b.pb.DeleteRange(lower, upper, nil)
	b.deleted[ledgerID] = b.seq
	b.seq++
}

// DeleteFencedLedger is DeleteLedger for a ledger that was fenced when it was deleted: in the
// same batch it sets the ledger's fenced-deleted tombstone, dated deletedAt (the wall clock:
// it outlives the process), replacing any earlier one. The deletion and the tombstone are one
// atomic write, so no crash leaves the deletion durable without the tombstone (the old writer
// of a ledger recovered, fenced and deleted must not create it again; BookKeeper #4462).
func (b *Batch) DeleteFencedLedger(ledgerID int64, deletedAt time.Time) {
	if ledgerID < 0 {
		b.fail(fmt.Errorf("%w: ledger %d", ErrBadID, ledgerID))
		return
	}
	b.DeleteLedger(ledgerID)
	putFencedDeletedKey(b.key[:ledgerKeyLen], ledgerID)
	b.buf = appendFencedDeleted(b.buf[:0], deletedAt)
	_ = b.pb.Set(b.key[:ledgerKeyLen], b.buf, nil)
}

// DropFencedDeleted removes ledgerID's fenced-deleted tombstone, if any (it expired).
func (b *Batch) DropFencedDeleted(ledgerID int64) {
	if ledgerID < 0 {
		b.fail(fmt.Errorf("%w: ledger %d", ErrBadID, ledgerID))
		return
	}
	putFencedDeletedKey(b.key[:ledgerKeyLen], ledgerID)
	_ = b.pb.Delete(b.key[:ledgerKeyLen], nil)
}

// PutCheckpoint sets the checkpoint record (see Index.Checkpoint) to v, which is copied.
func (b *Batch) PutCheckpoint(v []byte) {
	if len(v) > MaxCheckpointLen {
		b.fail(fmt.Errorf("%w: checkpoint record of %d bytes", ErrTooLarge, len(v)))
		return
	}
	_ = b.pb.Set(checkpointKey, v, nil)
	_ = b.pb.Delete(upgradedKey, nil)
	b.checkpoint = true
}

// Len returns the number of operations in the batch (a DeleteLedger counts as two, a
// DeleteFencedLedger as three).
func (b *Batch) Len() int { return int(b.pb.Count()) + len(b.puts) }

// Commit applies the batch and empties it for reuse. With sync, Commit returns only after
// pebble's WAL is fsynced: the batch, and every batch committed before it, then survives a
// crash or a power loss. Without sync, the batch is visible to look-ups at once but may be
// lost in a crash (a later synced commit makes it durable too). Committing an empty batch
// with sync still syncs the WAL. If a Put or Delete had a bad argument, Commit writes nothing
// and returns that error; the batch is emptied either way. Commits of one index run one at a
// time (a commit reads the runs it merges with).
func (b *Batch) Commit(sync bool) error {
	defer b.Reset()
	if err := b.err; err != nil {
		return err
	}
	if !b.ix.enter() {
		return ErrClosed
	}
	defer b.ix.exit()
	b.ix.commitMu.Lock()
	defer b.ix.commitMu.Unlock()
	if err := b.ix.failed; err != nil {
		return err
	}
	if err := b.writeRuns(); err != nil {
		return fmt.Errorf("index: commit: %w", err)
	}
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
		if b.pb.Empty() {
			// pebble skips an empty batch altogether, WAL sync included; an empty
			// log-data record makes it write and sync a WAL record.
			_ = b.pb.LogData(nil, nil)
		}
	}
	// A failed WAL write or fsync is fatal inside pebble (Logger.Fatalf: see commitPebble), so
	// an error returned here is about the batch itself, never about durability.
	if err := b.commitPebble(opts); err != nil {
		return fmt.Errorf("index: commit: %w", wrapPebble(err))
	}
	if b.checkpoint {
		// The batch deleted upgradedKey: Upgraded says so at once, not only after a reopen.
		b.ix.upgraded.Store(false)
	}
	return nil
}

// commitPebble commits pb. A failed WAL write or fsync makes pebble call Logger.Fatalf on
// this goroutine, which panics with a *fatalError (see pebbleLogger): it is recovered here
// into ErrFailed, sticky for the index, so that a full disk under the index fails the
// checkpoint (the engine then stops taking writes and keeps serving reads) instead of killing
// the process. Any other panic goes on.
func (b *Batch) commitPebble(opts *pebble.WriteOptions) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		fatal, ok := r.(*fatalError)
		if !ok {
			panic(r)
		}
		b.ix.failed = fmt.Errorf("%w: %s: %w", ErrFailed, b.ix.cfg.Dir, fatal)
		err = b.ix.failed
	}()
	return b.pb.Commit(opts)
}

// writeRuns turns the batch's locations into runs in pb: for each ledger, the new locations
// merged with the stored runs they overlap (which are deleted and rewritten), cut into runs
// of at most maxRunEntries. Runs of a ledger never overlap, so that a look-up finds an entry
// in the one run that ends at or after it.
func (b *Batch) writeRuns() error {
	if len(b.puts) == 0 {
		return nil
	}
	byID := func(x, y put) int {
		return cmp.Or(cmp.Compare(x.ledger, y.ledger), cmp.Compare(x.entry, y.entry))
	}
	// A flush adds in order already; a stable sort keeps the call order of duplicates.
	if !slices.IsSortedFunc(b.puts, byID) {
		slices.SortStableFunc(b.puts, byID)
	}
	it, err := b.ix.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixRun}, UpperBound: []byte{prefixRun + 1}})
	if err != nil {
		return wrapPebble(err)
	}
	for i := 0; i < len(b.puts) && err == nil; {
		ledger := b.puts[i].ledger
		j := i + 1
		for j < len(b.puts) && b.puts[j].ledger == ledger {
			j++
		}
		err = b.writeLedgerRuns(it, ledger, b.puts[i:j])
		i = j
	}
	return errors.Join(err, wrapPebble(it.Error()), it.Close())
}

// writeLedgerRuns writes the runs of one ledger's locations (sorted by entry, call order
// among equal entries).
func (b *Batch) writeLedgerRuns(it *pebble.Iterator, ledger int64, puts []put) error {
	delSeq, deleted := b.deleted[ledger]
	news := b.news[:0]
	for k, p := range puts {
		if (deleted && p.seq < delSeq) || (k+1 < len(puts) && puts[k+1].entry == p.entry) {
			continue // before the ledger's deletion, or replaced later in the batch
		}
		news = append(news, pair{p.entry, p.loc})
	}
	b.news = news
	if len(news) == 0 {
		return nil
	}
	all := news
	if !deleted { // else the batch's range deletion removes every stored run first
		olds := b.olds[:0]
		last := news[len(news)-1].entry
		putIDKey(b.key[:], prefixRun, ledger, news[0].entry)
		for ok := it.SeekGE(b.key[:]); ok; ok = it.Next() {
			l, runLast, err := decodeIDKey(it.Key(), prefixRun)
			if err != nil {
				return err
			}
			if l != ledger {
				break
			}
			v, err := it.ValueAndErr()
			if err != nil {
				return wrapPebble(err)
			}
			_, first, _, err := runHeader(v, l, runLast)
			if err != nil {
				return err
			}
			if first > last {
				break
			}
			if olds, err = decodeRun(olds, v, l, runLast); err != nil {
				return err
			}
			_ = b.pb.Delete(it.Key(), nil)
		}
		b.olds = olds
		if len(olds) > 0 {
			b.merged = mergePairs(b.merged[:0], news, olds)
			all = b.merged
		}
	}
	for len(all) > 0 {
		n := min(len(all), maxRunEntries)
		run := all[:n]
		all = all[n:]
		b.buf = appendRun(b.buf[:0], run)
		putIDKey(b.key[:], prefixRun, ledger, run[n-1].entry)
		_ = b.pb.Set(b.key[:], b.buf, nil)
	}
	return nil
}

// Reset discards the batch's contents (and any remembered error), keeping its buffers.
func (b *Batch) Reset() {
	b.pb.Reset()
	b.err = nil
	b.seq = 0
	b.checkpoint = false
	clear(b.deleted)
	if cap(b.puts)*int(unsafe.Sizeof(put{})) > b.ix.cfg.MaxRetainedBatchBytes {
		b.puts = nil
	}
	b.puts = b.puts[:0]
	for _, s := range []*[]pair{&b.news, &b.olds, &b.merged} {
		if cap(*s)*int(unsafe.Sizeof(pair{})) > b.ix.cfg.MaxRetainedBatchBytes {
			*s = nil
		}
	}
}

// Close releases the batch without committing what it holds. The batch must not be used
// afterwards.
func (b *Batch) Close() {
	_ = b.pb.Close()
}
