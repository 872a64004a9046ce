package etcd

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// MaxPageSize bounds the limit of List and Scan.
const MaxPageSize = 100_000

// ledgerStore implements metadata.LedgerStore. Versions are ModRevisions.
type ledgerStore struct {
	d *Driver
}

var _ metadata.LedgerStore = (*ledgerStore)(nil)

func checkLedgerID(id int64) error {
	if id < 0 {
		return fmt.Errorf("%w: %d", metadata.ErrInvalidLedgerID, id)
	}
	return nil
}

// Create implements metadata.LedgerStore.
func (s *ledgerStore) Create(ctx context.Context, id int64, md *metadata.LedgerMetadata) (metadata.Version, error) {
	if err := s.check(id); err != nil {
		return 0, err
	}
	data, err := s.d.opts.Codec.Encode(md)
	if err != nil {
		return 0, fmt.Errorf("metadata/etcd: create ledger %d: %w", id, err)
	}
	key := s.d.keys.ledger(id)
	resp, err := s.d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(data))).
		Commit()
	if err != nil {
		return 0, s.d.opErr(fmt.Sprintf("create ledger %d", id), err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: ledger %d", metadata.ErrLedgerExists, id)
	}
	return metadata.Version(resp.Header.Revision), nil
}

// Read implements metadata.LedgerStore.
func (s *ledgerStore) Read(ctx context.Context, id int64) (*metadata.LedgerMetadata, metadata.Version, error) {
	if err := s.check(id); err != nil {
		return nil, 0, err
	}
	resp, err := s.d.cli.Get(ctx, s.d.keys.ledger(id))
	if err != nil {
		return nil, 0, s.d.opErr(fmt.Sprintf("read ledger %d", id), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, fmt.Errorf("%w: ledger %d", metadata.ErrNoSuchLedger, id)
	}
	md, err := s.decode(id, resp.Kvs[0])
	if err != nil {
		return nil, 0, err
	}
	return md, metadata.Version(resp.Kvs[0].ModRevision), nil
}

// Update implements metadata.LedgerStore.
func (s *ledgerStore) Update(ctx context.Context, id int64, md *metadata.LedgerMetadata, expected metadata.Version) (metadata.Version, error) {
	if err := s.check(id); err != nil {
		return 0, err
	}
	data, err := s.d.opts.Codec.Encode(md)
	if err != nil {
		return 0, fmt.Errorf("metadata/etcd: update ledger %d: %w", id, err)
	}
	key := s.d.keys.ledger(id)
	resp, err := s.d.cli.Txn(ctx).
		If(versionIs(key, expected)...).
		Then(clientv3.OpPut(key, string(data))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return 0, s.d.opErr(fmt.Sprintf("update ledger %d", id), err)
	}
	if !resp.Succeeded {
		return 0, s.conflict(id, expected, resp.Responses[0].GetResponseRange().Kvs)
	}
	return metadata.Version(resp.Header.Revision), nil
}

// Delete implements metadata.LedgerStore.
func (s *ledgerStore) Delete(ctx context.Context, id int64, expected metadata.Version) error {
	if err := s.check(id); err != nil {
		return err
	}
	key := s.d.keys.ledger(id)
	resp, err := s.d.cli.Txn(ctx).
		If(versionIs(key, expected)...).
		Then(clientv3.OpDelete(key)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return s.d.opErr(fmt.Sprintf("delete ledger %d", id), err)
	}
	if !resp.Succeeded {
		return s.conflict(id, expected, resp.Responses[0].GetResponseRange().Kvs)
	}
	return nil
}

// versionIs returns the comparisons "key exists and has version v" (any
// version for metadata.AnyVersion; NoVersion never matches an existing key).
func versionIs(key string, v metadata.Version) []clientv3.Cmp {
	exists := clientv3.Compare(clientv3.CreateRevision(key), ">", 0)
	if v == metadata.AnyVersion {
		return []clientv3.Cmp{exists}
	}
	return []clientv3.Cmp{exists, clientv3.Compare(clientv3.ModRevision(key), "=", int64(v))}
}

// conflict builds the error for a failed compare-and-set from the key's
// current state.
func (s *ledgerStore) conflict(id int64, expected metadata.Version, kvs []*mvccpb.KeyValue) error {
	if len(kvs) == 0 {
		return fmt.Errorf("%w: ledger %d", metadata.ErrNoSuchLedger, id)
	}
	bv := &metadata.BadVersionError{
		What:     fmt.Sprintf("ledger %d", id),
		Expected: expected,
		Current:  metadata.Version(kvs[0].ModRevision),
	}
	md, err := s.decode(id, kvs[0])
	if err != nil {
		return errors.Join(bv, err)
	}
	bv.Metadata = md
	return bv
}

func (s *ledgerStore) decode(id int64, kv *mvccpb.KeyValue) (*metadata.LedgerMetadata, error) {
	md, err := s.d.opts.Codec.Decode(kv.Value)
	if err != nil {
		return nil, fmt.Errorf("metadata/etcd: ledger %d (key %s, version %d): %w", id, kv.Key, kv.ModRevision, err)
	}
	return md, nil
}

func (s *ledgerStore) check(id int64) error {
	if err := s.d.checkOpen(); err != nil {
		return err
	}
	return checkLedgerID(id)
}

// page reads up to limit ledger keys >= start.
func (s *ledgerStore) page(ctx context.Context, start int64, limit int, keysOnly bool) (*clientv3.GetResponse, error) {
	if err := s.check(start); err != nil {
		return nil, err
	}
	if limit < 1 || limit > MaxPageSize {
		return nil, fmt.Errorf("metadata/etcd: list ledgers: limit %d not in 1..%d", limit, MaxPageSize)
	}
	opts := []clientv3.OpOption{
		clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.d.keys.ledgersPrefix())),
		clientv3.WithLimit(int64(limit)),
	}
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	resp, err := s.d.cli.Get(ctx, s.d.keys.ledger(start), opts...)
	if err != nil {
		return nil, s.d.opErr(fmt.Sprintf("list ledgers from %d", start), err)
	}
	return resp, nil
}

// List implements metadata.LedgerStore.
func (s *ledgerStore) List(ctx context.Context, start int64, limit int) ([]int64, bool, error) {
	resp, err := s.page(ctx, start, limit, true)
	if err != nil {
		return nil, false, err
	}
	ids := make([]int64, 0, len(resp.Kvs))
	var foreign metadata.ForeignLedgerKeysError
	for _, kv := range resp.Kvs {
		id, err := s.d.keys.parseLedger(kv.Key)
		if err == nil {
			ids = append(ids, id)
			continue
		}
		// Only canonical ids are returned: the caller pages from the last one, and a foreign
		// key's place in key order is not its id's.
		switch id, named := s.d.keys.foreignLedgerID(kv.Key); {
		case named && id >= 0:
			foreign.IDs = append(foreign.IDs, id)
		case !named:
			foreign.Unnamed = append(foreign.Unnamed, string(kv.Key))
		}
	}
	if foreign.IDs != nil || foreign.Unnamed != nil {
		return ids, resp.More, &foreign
	}
	return ids, resp.More, nil
}

// Scan implements metadata.LedgerStore.
func (s *ledgerStore) Scan(ctx context.Context, start int64, limit int) ([]metadata.VersionedLedger, bool, error) {
	resp, err := s.page(ctx, start, limit, false)
	if err != nil {
		return nil, false, err
	}
	out := make([]metadata.VersionedLedger, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		id, err := s.d.keys.parseLedger(kv.Key)
		if err != nil {
			return nil, false, err
		}
		md, err := s.decode(id, kv)
		if err != nil {
			return nil, false, err
		}
		out = append(out, metadata.VersionedLedger{ID: id, Metadata: md, Version: metadata.Version(kv.ModRevision)})
	}
	return out, resp.More, nil
}

// Watch implements metadata.LedgerStore.
func (s *ledgerStore) Watch(ctx context.Context, id int64) (<-chan metadata.LedgerChange, error) {
	if err := s.check(id); err != nil {
		return nil, err
	}
	key := s.d.keys.ledger(id)
	resp, err := s.d.cli.Get(ctx, key)
	if err != nil {
		return nil, s.d.opErr(fmt.Sprintf("watch ledger %d", id), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: ledger %d", metadata.ErrNoSuchLedger, id)
	}
	out := make(chan metadata.LedgerChange, 1)
	out <- s.change(id, resp.Kvs[0])
	wctx, cancel := s.d.boundCtx(ctx)
	w := &ledgerWatch{s: s, id: id, key: key, out: out, last: resp.Kvs[0].ModRevision}
	err = s.d.goDriver(func() {
		defer cancel()
		defer close(out)
		w.run(wctx, resp.Header.Revision)
	})
	if err != nil {
		cancel()
		return nil, err
	}
	return out, nil
}

func (s *ledgerStore) change(id int64, kv *mvccpb.KeyValue) metadata.LedgerChange {
	md, err := s.decode(id, kv)
	if err != nil {
		return metadata.LedgerChange{ID: id, Err: err}
	}
	return metadata.LedgerChange{ID: id, Metadata: md, Version: metadata.Version(kv.ModRevision)}
}

// ledgerWatch follows one ledger key for LedgerStore.Watch.
type ledgerWatch struct {
	s    *ledgerStore
	id   int64
	key  string
	out  chan metadata.LedgerChange
	last int64 // ModRevision of the last change sent
}

// run watches from revision rev+1 until the ledger is deleted or ctx is done.
// If etcd cancels the watch (compaction, leader loss), it reads the key
// again and resumes.
func (w *ledgerWatch) run(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		if w.watch(ctx, rev) {
			return
		}
		// The watch ended: resynchronise from a fresh read.
		var deleted bool
		if rev, deleted = w.resync(ctx); deleted {
			return
		}
	}
}

// watch follows the key from rev+1 until the ledger is deleted (true) or
// the watch ends (false).
func (w *ledgerWatch) watch(ctx context.Context, rev int64) bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wresp := range w.s.d.cli.Watch(clientv3.WithRequireLeader(ctx), w.key, clientv3.WithRev(rev+1)) {
		if wresp.Canceled || wresp.Err() != nil {
			return false
		}
		for _, ev := range wresp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				offerLatest(w.out, metadata.LedgerChange{ID: w.id, Deleted: true})
				return true
			}
			w.last = ev.Kv.ModRevision
			offerLatest(w.out, w.s.change(w.id, ev.Kv))
		}
	}
	return false
}

// resync reads the key after a broken watch; it reports the revision to
// watch from and whether the ledger is gone.
func (w *ledgerWatch) resync(ctx context.Context) (int64, bool) {
	for ctx.Err() == nil {
		resp, err := w.s.d.cli.Get(ctx, w.key)
		if err != nil {
			sleepCtx(ctx, resyncBackoff)
			continue
		}
		if len(resp.Kvs) == 0 {
			offerLatest(w.out, metadata.LedgerChange{ID: w.id, Deleted: true})
			return 0, true
		}
		if kv := resp.Kvs[0]; kv.ModRevision != w.last {
			w.last = kv.ModRevision
			offerLatest(w.out, w.s.change(w.id, kv))
		}
		return resp.Header.Revision, false
	}
	return 0, true
}
