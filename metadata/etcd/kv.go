package etcd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// kvStore implements metadata.KV under <root>/kv/; locks live under <root>/locks/. Versions are
// ModRevisions.
type kvStore struct {
	d *Driver
}

var (
	_ metadata.KV       = (*kvStore)(nil)
	_ metadata.KVDriver = (*Driver)(nil)
)

// KV implements metadata.KVDriver.
func (d *Driver) KV() metadata.KV { return &kvStore{d: d} }

func (k keys) kvPrefix() string              { return k.root + "/kv/" }
func (k keys) kv(key string) string          { return k.kvPrefix() + key }
func (k keys) lockPrefix(name string) string { return k.root + "/locks/" + url.PathEscape(name) }

// Get implements metadata.KV.
func (s *kvStore) Get(ctx context.Context, key string) (metadata.KeyValue, error) {
	if err := s.check(key); err != nil {
		return metadata.KeyValue{}, err
	}
	resp, err := s.d.cli.Get(ctx, s.d.keys.kv(key))
	if err != nil {
		return metadata.KeyValue{}, s.d.opErr("get "+key, err)
	}
	if len(resp.Kvs) == 0 {
		return metadata.KeyValue{}, fmt.Errorf("%w: %s", metadata.ErrNoSuchKey, key)
	}
	return s.keyValue(resp.Kvs[0]), nil
}

func (s *kvStore) keyValue(kv *mvccpb.KeyValue) metadata.KeyValue {
	return metadata.KeyValue{
		Key:     strings.TrimPrefix(string(kv.Key), s.d.keys.kvPrefix()),
		Value:   kv.Value,
		Version: metadata.Version(kv.ModRevision),
	}
}

func (s *kvStore) check(key string) error {
	if err := s.d.checkOpen(); err != nil {
		return err
	}
	return metadata.ValidateKVKey(key)
}

// List implements metadata.KV.
func (s *kvStore) List(ctx context.Context, prefix, after string, limit int) ([]metadata.KeyValue, bool, error) {
	if err := s.d.checkOpen(); err != nil {
		return nil, false, err
	}
	if prefix != "" {
		if err := metadata.ValidateKVKey(prefix); err != nil {
			return nil, false, err
		}
	}
	if limit < 1 || limit > metadata.MaxKVPageSize {
		return nil, false, fmt.Errorf("%w: list limit %d not in 1..%d", metadata.ErrInvalidKey, limit, metadata.MaxKVPageSize)
	}
	full := s.d.keys.kv(prefix)
	start := full
	if after != "" {
		if !strings.HasPrefix(after, prefix) {
			return nil, false, fmt.Errorf("%w: list after %q, which does not start with the prefix %q", metadata.ErrInvalidKey, after, prefix)
		}
		start = s.d.keys.kv(after) + "\x00"
	}
	resp, err := s.d.cli.Get(ctx, start,
		clientv3.WithRange(clientv3.GetPrefixRangeEnd(full)), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, false, s.d.opErr("list "+prefix, err)
	}
	out := make([]metadata.KeyValue, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		out[i] = s.keyValue(kv)
	}
	return out, resp.More, nil
}

// Commit implements metadata.KV.
func (s *kvStore) Commit(ctx context.Context, guard metadata.Lock, ops ...metadata.KVOp) (metadata.Version, error) {
	if err := s.d.checkOpen(); err != nil {
		return 0, err
	}
	if err := metadata.ValidateKVOps(ops); err != nil {
		return 0, err
	}
	var cmps []clientv3.Cmp
	var elses []clientv3.Op
	var lock *kvLock
	if guard != nil {
		var ok bool
		if lock, ok = guard.(*kvLock); !ok || lock.d != s.d {
			return 0, fmt.Errorf("%w: the guard %T is not a lock of this driver", metadata.ErrInvalidKey, guard)
		}
		// Lost is final: etcd may still hold the key (a restarted server renews leases), but
		// the holder was told it lost the lock and may have given way already.
		select {
		case <-lock.Lost():
			return 0, fmt.Errorf("%w: %s", metadata.ErrLockLost, lock.name)
		default:
		}
		cmps = append(cmps, lock.mutex.IsOwner())
		elses = append(elses, clientv3.OpGet(lock.mutex.Key()))
	}
	thens := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		key := s.d.keys.kv(op.Key)
		switch op.Expected {
		case metadata.AnyVersion:
		case metadata.NoVersion:
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
		default:
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", int64(op.Expected)))
		}
		if op.Delete {
			thens[i] = clientv3.OpDelete(key)
		} else {
			thens[i] = clientv3.OpPut(key, string(op.Value))
		}
		elses = append(elses, clientv3.OpGet(key, clientv3.WithKeysOnly()))
	}
	resp, err := s.d.cli.Txn(ctx).If(cmps...).Then(thens...).Else(elses...).Commit()
	if err != nil {
		return 0, s.d.opErr(fmt.Sprintf("commit %d ops (first key %s)", len(ops), ops[0].Key), err)
	}
	if resp.Succeeded {
		return metadata.Version(resp.Header.Revision), nil
	}
	rs := resp.Responses
	if lock != nil {
		kvs := rs[0].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != lock.rev {
			return 0, fmt.Errorf("%w: %s", metadata.ErrLockLost, lock.name)
		}
		rs = rs[1:]
	}
	for i, op := range ops {
		var cur metadata.Version
		if kvs := rs[i].GetResponseRange().Kvs; len(kvs) > 0 {
			cur = metadata.Version(kvs[0].ModRevision)
		}
		if op.Expected != metadata.AnyVersion && cur != op.Expected {
			return 0, &metadata.BadVersionError{What: "key " + op.Key, Expected: op.Expected, Current: cur}
		}
	}
	return 0, fmt.Errorf("metadata/etcd: commit of %d ops failed, yet every comparison holds (a concurrent change)", len(ops))
}

// Watch implements metadata.KV.
func (s *kvStore) Watch(ctx context.Context, prefix string) (<-chan struct{}, error) {
	if err := s.d.checkOpen(); err != nil {
		return nil, err
	}
	if prefix != "" {
		if err := metadata.ValidateKVKey(prefix); err != nil {
			return nil, err
		}
	}
	full := s.d.keys.kv(prefix)
	resp, err := s.d.cli.Get(ctx, full, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, s.d.opErr("watch "+prefix, err)
	}
	out := make(chan struct{}, 1)
	wctx, cancel := s.d.boundCtx(ctx)
	err = s.d.goDriver(func() {
		defer cancel()
		defer close(out)
		s.watch(wctx, full, resp.Header.Revision, out)
	})
	if err != nil {
		cancel()
		return nil, err
	}
	return out, nil
}

// watch follows the keys under full from revision rev+1 until ctx is done; when the watch
// breaks (compaction, leader loss) it signals and resumes from the current revision.
func (s *kvStore) watch(ctx context.Context, full string, rev int64, out chan struct{}) {
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		for wresp := range s.d.cli.Watch(clientv3.WithRequireLeader(wctx), full, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if wresp.Canceled || wresp.Err() != nil {
				break
			}
			if len(wresp.Events) > 0 {
				rev = wresp.Events[len(wresp.Events)-1].Kv.ModRevision
				signal()
			}
		}
		cancel()
		// The watch ended: changes may have been missed. Resume from now and say so.
		for ctx.Err() == nil {
			resp, err := s.d.cli.Get(ctx, full, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err == nil {
				rev = resp.Header.Revision
				break
			}
			sleepCtx(ctx, resyncBackoff)
		}
		signal()
	}
}

// Lock implements metadata.KV: an etcd concurrency mutex (a key per contender under
// <root>/locks/<name>/, bound to the contender's lease; the oldest key holds the lock) in a
// session of its own.
func (s *kvStore) Lock(ctx context.Context, name string, ttl time.Duration) (metadata.Lock, error) {
	if err := s.check(name); err != nil {
		return nil, err
	}
	if ttl < metadata.MinLockTTL {
		return nil, fmt.Errorf("%w: lock %s: TTL %v is below %v", metadata.ErrInvalidOptions, name, ttl, metadata.MinLockTTL)
	}
	secs := int64(math.Ceil(ttl.Seconds()))
	lease, err := s.d.cli.Grant(ctx, secs)
	if err != nil {
		return nil, s.d.opErr("lock "+name+": grant lease", err)
	}
	session, err := concurrency.NewSession(s.d.cli, concurrency.WithLease(lease.ID),
		concurrency.WithTTL(int(secs)), concurrency.WithContext(s.d.ctx))
	if err != nil {
		s.revoke(lease.ID)
		return nil, s.d.opErr("lock "+name+": keep lease alive", err)
	}
	mutex := concurrency.NewMutex(session, s.d.keys.lockPrefix(name))
	if err := mutex.Lock(ctx); err != nil {
		session.Close()
		return nil, s.d.opErr("lock "+name, err)
	}
	// The mutex's revision is the creation revision of its key.
	resp, err := s.d.cli.Get(ctx, mutex.Key())
	if err != nil || len(resp.Kvs) == 0 {
		session.Close()
		if err == nil {
			err = metadata.ErrLockLost
		}
		return nil, s.d.opErr("lock "+name, err)
	}
	return &kvLock{d: s.d, name: name, session: session, mutex: mutex, rev: resp.Kvs[0].CreateRevision, unlocked: newCtxMutex()}, nil
}

func (s *kvStore) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(s.d.ctx, revokeTimeout)
	defer cancel()
	_, _ = s.d.cli.Revoke(ctx, id)
}

// kvLock is a held lock.
type kvLock struct {
	d       *Driver
	name    string
	session *concurrency.Session
	mutex   *concurrency.Mutex
	rev     int64 // creation revision of the mutex key
	// unlocked makes Unlock idempotent.
	unlocked ctxMutex
	done     bool
}

func (l *kvLock) Name() string          { return l.name }
func (l *kvLock) Lost() <-chan struct{} { return l.session.Done() }

// Unlock implements metadata.Lock.
func (l *kvLock) Unlock(ctx context.Context) error {
	if err := l.unlocked.Lock(ctx); err != nil {
		return err
	}
	defer l.unlocked.Unlock()
	if l.done {
		return nil
	}
	l.done = true
	var errs []error
	select {
	case <-l.session.Done():
		// The lease is gone or no longer kept alive: the key goes with it, and a revoke
		// can only fail.
		l.session.Close()
	default:
		if err := l.mutex.Unlock(ctx); err != nil {
			errs = append(errs, err)
		}
		if err := l.session.Close(); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return l.d.opErr("unlock "+l.name, err)
	}
	return nil
}
