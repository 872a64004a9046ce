package etcd

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// idAllocator hands out ledger ids from a range reserved in etcd.
//
// The idgen key holds, in decimal, the first id that no client has reserved.
// A client reserves [n, n+batch) by moving the key from n to n+batch with a
// transaction that compares the key's ModRevision with the one it read, so
// two clients can never reserve overlapping ranges, and the counter never
// goes back, even when ledgers are deleted. A missing key starts at the id
// after the largest existing ledger (see firstFreeID).
type idAllocator struct {
	d *Driver
	// lock guards nextID and limit, and is held while reserving a range.
	lock   ctxMutex
	nextID int64 // next id to hand out
	limit  int64 // end (exclusive) of the reserved range
}

func (a *idAllocator) next(ctx context.Context) (int64, error) {
	if err := a.lock.Lock(ctx); err != nil {
		return 0, fmt.Errorf("metadata/etcd: new ledger id: %w", err)
	}
	defer a.lock.Unlock()
	if a.nextID >= a.limit {
		if err := a.reserve(ctx); err != nil {
			return 0, err
		}
	}
	id := a.nextID
	a.nextID++
	return id, nil
}

// reserve moves the shared counter forward by one batch.
func (a *idAllocator) reserve(ctx context.Context) error {
	key := a.d.keys.idgen()
	resp, err := a.d.cli.Get(ctx, key)
	if err != nil {
		return a.d.opErr("new ledger id", err)
	}
	kvs := resp.Kvs
	for {
		start, rev, err := parseCounter(key, kvs)
		if err != nil {
			return err
		}
		if len(kvs) == 0 {
			if start, err = a.firstFreeID(ctx); err != nil {
				return err
			}
		}
		n := min(int64(a.d.opts.IDBatchSize), math.MaxInt64-start)
		if n <= 0 {
			return fmt.Errorf("%w: counter at %s is %d", metadata.ErrLedgerIDsExhausted, key, start)
		}
		tresp, err := a.d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, strconv.FormatInt(start+n, 10))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return a.d.opErr("new ledger id", err)
		}
		if tresp.Succeeded {
			a.nextID, a.limit = start, start+n
			return nil
		}
		// Another client moved the counter; retry from what it wrote.
		kvs = tresp.Responses[0].GetResponseRange().Kvs
	}
}

// firstFreeID is where a missing counter starts: 0 on a new cluster, and
// past the largest existing ledger id if the key was lost (deleted by hand, a
// partial restore). Starting at 0 then would hand out ids of deleted ledgers,
// whose entries and fencing state bookies may still hold, and make every
// CreateLedger step over the existing ones one transaction at a time. Ids of
// deleted ledgers above the largest existing one cannot be told apart from
// unused ids and may be handed out again.
func (a *idAllocator) firstFreeID(ctx context.Context) (int64, error) {
	resp, err := a.d.cli.Get(ctx, a.d.keys.ledgersPrefix(), append(clientv3.WithLastKey(), clientv3.WithKeysOnly())...)
	if err != nil {
		return 0, a.d.opErr("new ledger id", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	last, err := a.d.keys.parseLedger(resp.Kvs[0].Key)
	if err != nil {
		return 0, fmt.Errorf("metadata/etcd: new ledger id: counter %s is missing: %w", a.d.keys.idgen(), err)
	}
	if last == math.MaxInt64 {
		return 0, fmt.Errorf("%w: ledger %d exists and counter %s is missing", metadata.ErrLedgerIDsExhausted, last, a.d.keys.idgen())
	}
	a.d.opts.Logger.Warn("metadata/etcd: ledger id counter missing while ledgers exist; starting past the largest ledger id",
		"key", a.d.keys.idgen(), "largest", last)
	return last + 1, nil
}

// parseCounter returns the counter value and its ModRevision (0, 0 when the
// key does not exist: the caller finds the first id with firstFreeID).
func parseCounter(key string, kvs []*mvccpb.KeyValue) (int64, int64, error) {
	if len(kvs) == 0 {
		return 0, 0, nil
	}
	v, err := strconv.ParseInt(string(kvs[0].Value), 10, 64)
	if err != nil || v < 0 {
		return 0, 0, fmt.Errorf("%w: ledger id counter at %s holds %q", metadata.ErrCorruptMetadata, key, kvs[0].Value)
	}
	return v, kvs[0].ModRevision, nil
}
