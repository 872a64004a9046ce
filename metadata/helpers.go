package metadata

import (
	"context"
	"errors"
	"fmt"
)

// CreateLedger takes a new ledger id from d and stores md under it. Should
// the id already have metadata (written with an explicit id by another
// tool), it takes another id.
func CreateLedger(ctx context.Context, d Driver, md *LedgerMetadata) (int64, Version, error) {
	for {
		id, err := d.NewLedgerID(ctx)
		if err != nil {
			return 0, 0, err
		}
		v, err := d.Ledgers().Create(ctx, id, md)
		if errors.Is(err, ErrLedgerExists) {
			continue
		}
		if err != nil {
			return 0, 0, err
		}
		return id, v, nil
	}
}

// UpdateLedger runs a read-modify-write loop: it reads the ledger, calls
// mutate on a private copy, and writes the copy back with compare-and-set.
// When another writer got there first it calls mutate again on the newer
// metadata that the conflict carries, until the write succeeds, mutate
// fails, or ctx is done.
//
// mutate may return ErrUnchanged (or an error wrapping it) to skip the
// write; UpdateLedger then returns the metadata it read and a nil error.
// Any other error from mutate is returned as is.
func UpdateLedger(ctx context.Context, ls LedgerStore, id int64,
	mutate func(md *LedgerMetadata) error) (*LedgerMetadata, Version, error) {
	cur, ver, err := ls.Read(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	for {
		next := cur.Clone()
		if err := mutate(next); err != nil {
			if errors.Is(err, ErrUnchanged) {
				return cur, ver, nil
			}
			return nil, 0, err
		}
		nv, err := ls.Update(ctx, id, next, ver)
		if err == nil {
			return next, nv, nil
		}
		var bv *BadVersionError
		if !errors.As(err, &bv) || bv.Metadata == nil {
			return nil, 0, err
		}
		if err := ctx.Err(); err != nil {
			return nil, 0, fmt.Errorf("metadata: update ledger %d: %w", id, err)
		}
		cur, ver = bv.Metadata, bv.Current
	}
}

// DefaultPageSize is the page size ForEachLedger uses.
const DefaultPageSize = 1000

// ForEachLedger calls fn for every ledger in id order, reading pageSize
// ledgers per request (0: DefaultPageSize). It stops at the first error from
// fn or from the store and returns it.
func ForEachLedger(ctx context.Context, ls LedgerStore, pageSize int, fn func(VersionedLedger) error) error {
	if pageSize <= 0 {
		pageSize = DefaultPageSize
	}
	var start int64
	for {
		page, more, err := ls.Scan(ctx, start, pageSize)
		if err != nil {
			return err
		}
		for _, l := range page {
			if err := fn(l); err != nil {
				return err
			}
		}
		if !more || len(page) == 0 {
			return nil
		}
		start = page[len(page)-1].ID + 1
	}
}

// LedgersWithBookie returns, in id order, the ledgers that have bookieID in
// any ensemble. It reads every ledger's metadata (as BookKeeper's auditor
// does), a page at a time.
func LedgersWithBookie(ctx context.Context, ls LedgerStore, bookieID string) ([]int64, error) {
	var ids []int64
	err := ForEachLedger(ctx, ls, 0, func(l VersionedLedger) error {
		if l.Metadata.ContainsBookie(bookieID) {
			ids = append(ids, l.ID)
		}
		return nil
	})
	return ids, err
}
