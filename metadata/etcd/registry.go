package etcd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/metadata"
)

const (
	// revokeTimeout bounds the best-effort revoke of a lease being abandoned.
	revokeTimeout = 2 * time.Second
	// expirySlack is how long past a lease's remaining TTL Register waits
	// for etcd to expire it (etcd checks for expired leases twice a second,
	// and reports the TTL rounded down to whole seconds).
	expirySlack = 2 * time.Second
)

// registry implements metadata.Registry.
type registry struct {
	d *Driver
}

var _ metadata.Registry = (*registry)(nil)

// Register implements metadata.Registry.
func (r *registry) Register(ctx context.Context, info metadata.BookieInfo, ttl time.Duration) (metadata.Registration, error) {
	if err := r.d.checkOpen(); err != nil {
		return nil, err
	}
	if err := info.Validate(); err != nil {
		return nil, err
	}
	if ttl == 0 {
		ttl = metadata.DefaultRegistrationTTL
	}
	if ttl < 0 {
		return nil, fmt.Errorf("%w: bookie %s: negative TTL %v", metadata.ErrInvalidBookieInfo, info.ID, ttl)
	}
	g := &registration{
		d:    r.d,
		id:   info.ID,
		ttl:  int64(math.Ceil(ttl.Seconds())),
		lock: newCtxMutex(),
		info: info.Clone(),
		done: make(chan struct{}),
	}
	g.ctx, g.cancel = context.WithCancel(r.d.ctx)
	if err := g.establish(ctx); err != nil {
		g.cancel()
		return nil, err
	}
	if err := r.d.goDriver(g.run); err != nil {
		g.cancel()
		g.revoke(g.lease)
		return nil, err
	}
	return g, nil
}

// List implements metadata.Registry.
func (r *registry) List(ctx context.Context, filter metadata.BookieFilter) ([]metadata.BookieInfo, error) {
	if err := r.d.checkOpen(); err != nil {
		return nil, err
	}
	resp, err := r.d.cli.Get(ctx, r.d.keys.bookiesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, r.d.opErr("list bookies", err)
	}
	var out []metadata.BookieInfo
	for _, kv := range resp.Kvs {
		if b, ok := r.decode(kv); ok && filter.Matches(b.State) {
			out = append(out, b)
		}
	}
	sortBookies(out)
	return out, nil
}

// decode turns a registration key-value into a BookieInfo; it logs and
// skips what it cannot read.
func (r *registry) decode(kv *mvccpb.KeyValue) (metadata.BookieInfo, bool) {
	state, id, ok := r.d.keys.parseBookie(kv.Key)
	if !ok {
		r.d.opts.Logger.Warn("metadata/etcd: ignoring unexpected key in the bookie registry", "key", string(kv.Key))
		return metadata.BookieInfo{}, false
	}
	b, err := metadata.DecodeBookieInfo(kv.Value)
	if err != nil {
		r.d.opts.Logger.Warn("metadata/etcd: ignoring unreadable bookie registration", "key", string(kv.Key), "err", err)
		return metadata.BookieInfo{}, false
	}
	b.ID, b.State = id, state
	return b, true
}

func sortBookies(bs []metadata.BookieInfo) {
	slices.SortFunc(bs, func(a, b metadata.BookieInfo) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.State, b.State))
	})
}

// Watch implements metadata.Registry.
func (r *registry) Watch(ctx context.Context) (<-chan []metadata.BookieInfo, error) {
	if err := r.d.checkOpen(); err != nil {
		return nil, err
	}
	w := &bookieWatch{r: r, out: make(chan []metadata.BookieInfo, 1)}
	rev, err := w.load(ctx)
	if err != nil {
		return nil, err
	}
	wctx, cancel := r.d.boundCtx(ctx)
	err = r.d.goDriver(func() {
		defer cancel()
		defer close(w.out)
		w.run(wctx, rev)
	})
	if err != nil {
		cancel()
		return nil, err
	}
	return w.out, nil
}

// bookieWatch follows the registry prefix for Registry.Watch.
type bookieWatch struct {
	r   *registry
	out chan []metadata.BookieInfo
	// set maps a registration key to its bookie; only run's goroutine
	// touches it after load.
	set map[string]metadata.BookieInfo
}

// load reads the whole registry, replaces set and offers the snapshot. It
// returns the revision read at.
func (w *bookieWatch) load(ctx context.Context) (int64, error) {
	resp, err := w.r.d.cli.Get(ctx, w.r.d.keys.bookiesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return 0, w.r.d.opErr("watch bookies", err)
	}
	w.set = make(map[string]metadata.BookieInfo, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if b, ok := w.r.decode(kv); ok {
			w.set[string(kv.Key)] = b
		}
	}
	w.offer()
	return resp.Header.Revision, nil
}

func (w *bookieWatch) offer() {
	snap := make([]metadata.BookieInfo, 0, len(w.set))
	for _, b := range w.set {
		snap = append(snap, b.Clone())
	}
	sortBookies(snap)
	offerLatest(w.out, snap)
}

func (w *bookieWatch) run(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		w.watch(ctx, rev)
		// The watch ended (compaction, leader loss, or ctx): reload.
		for ctx.Err() == nil {
			var err error
			if rev, err = w.load(ctx); err == nil {
				break
			}
			sleepCtx(ctx, resyncBackoff)
		}
	}
}

// watch applies the registry's changes from rev+1 until the watch ends.
func (w *bookieWatch) watch(ctx context.Context, rev int64) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := w.r.d.cli.Watch(clientv3.WithRequireLeader(ctx), w.r.d.keys.bookiesPrefix(),
		clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for wresp := range wch {
		if wresp.Canceled || wresp.Err() != nil {
			return
		}
		for _, ev := range wresp.Events {
			key := string(ev.Kv.Key)
			delete(w.set, key)
			// A key overwritten with a value it cannot read stays out, as
			// List leaves it out.
			if ev.Type != clientv3.EventTypeDelete {
				if b, ok := w.r.decode(ev.Kv); ok {
					w.set[key] = b
				}
			}
		}
		if len(wresp.Events) > 0 {
			w.offer()
		}
	}
}

// registration implements metadata.Registration: it owns one lease and keeps
// the bookie's key bound to it.
type registration struct {
	d   *Driver
	id  string // the bookie id; never changes
	ttl int64  // seconds

	// lock guards info, lease, closed and revoked; it is held across the etcd
	// requests that change the registration. closed: Close has begun (Update
	// refuses); revoked: Close revoked the lease (later ones do nothing).
	lock    ctxMutex
	info    metadata.BookieInfo
	lease   clientv3.LeaseID
	closed  bool
	revoked bool

	ctx    context.Context // done when the registration or the driver closes
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
}

// establish grants a lease and claims the bookie's key with it. A key still
// bound to the registration's previous lease (g.lease, whose keep-alive ended
// but which etcd may hold alive until its TTL runs out) is its own: it moves
// to the new lease at once. If another lease holds the key, it gives its own
// lease back, waits for the other to expire and tries again. The caller holds
// lock or owns g exclusively.
func (g *registration) establish(ctx context.Context) error {
	for {
		lresp, err := g.d.cli.Grant(ctx, g.ttl)
		if err != nil {
			return g.d.opErr("register bookie "+g.id, err)
		}
		err = g.claim(ctx, lresp.ID, g.lease, g.info)
		if err == nil {
			g.lease = lresp.ID
			return nil
		}
		g.revoke(lresp.ID)
		var held *heldError
		if !errors.As(err, &held) {
			return err
		}
		if err := g.waitGone(ctx, held.kv, held.rev); err != nil {
			return err
		}
	}
}

// heldError reports that another lease holds a bookie's key.
type heldError struct {
	kv  *mvccpb.KeyValue
	rev int64 // revision at which kv was read
}

func (e *heldError) Error() string {
	return fmt.Sprintf("%v: %s is held by lease %x", metadata.ErrBookieExists, e.kv.Key, e.kv.Lease)
}

func (e *heldError) Unwrap() error { return metadata.ErrBookieExists }

// claim makes info the bookie's registration, bound to lease: it writes the
// key for info.State and removes the key for the other state, in one
// transaction conditional on what it read. Keys bound to prev (this
// registration's previous lease; 0: none) are taken over. If a key is bound
// to any other lease (another process's registration), it returns a
// *heldError.
func (g *registration) claim(ctx context.Context, lease, prev clientv3.LeaseID, info metadata.BookieInfo) error {
	val, err := metadata.EncodeBookieInfo(info)
	if err != nil {
		return fmt.Errorf("%w: bookie %s: %w", metadata.ErrInvalidBookieInfo, info.ID, err)
	}
	keys := g.d.keys
	key, other := keys.bookie(info.State, info.ID), keys.bookie(otherState(info.State), info.ID)
	for {
		resp, err := g.d.cli.Txn(ctx).Then(clientv3.OpGet(key), clientv3.OpGet(other)).Commit()
		if err != nil {
			return g.d.opErr("register bookie "+info.ID, err)
		}
		cur, oth := firstKV(resp, 0), firstKV(resp, 1)
		if foreign := foreignKV(lease, prev, cur, oth); foreign != nil {
			return &heldError{kv: foreign, rev: resp.Header.Revision}
		}
		ops := []clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithLease(lease))}
		if oth != nil {
			ops = append(ops, clientv3.OpDelete(other))
		}
		tresp, err := g.d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev(cur)),
				clientv3.Compare(clientv3.ModRevision(other), "=", modRev(oth))).
			Then(ops...).
			Commit()
		if err != nil {
			return g.d.opErr("register bookie "+info.ID, err)
		}
		if tresp.Succeeded {
			return nil
		}
	}
}

func firstKV(resp *clientv3.TxnResponse, i int) *mvccpb.KeyValue {
	if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
		return kvs[0]
	}
	return nil
}

func modRev(kv *mvccpb.KeyValue) int64 {
	if kv == nil {
		return 0
	}
	return kv.ModRevision
}

// foreignKV returns the first of kvs that exists and is bound neither to
// lease nor to prev (when prev is not 0).
func foreignKV(lease, prev clientv3.LeaseID, kvs ...*mvccpb.KeyValue) *mvccpb.KeyValue {
	for _, kv := range kvs {
		if kv == nil {
			continue
		}
		if l := clientv3.LeaseID(kv.Lease); l != lease && (prev == 0 || l != prev) {
			return kv
		}
	}
	return nil
}

// waitGone waits until kv's key (read at rev) is deleted, for at most the
// remaining TTL of its lease plus expirySlack. It fails with ErrBookieExists if
// the key stays.
func (g *registration) waitGone(ctx context.Context, kv *mvccpb.KeyValue, rev int64) error {
	if kv.Lease == 0 {
		return fmt.Errorf("%w: %s exists without a lease (written by hand?)", metadata.ErrBookieExists, kv.Key)
	}
	ttl, err := g.d.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil {
		return g.d.opErr("register bookie "+g.id, err)
	}
	wait := time.Duration(max(ttl.TTL, 0))*time.Second + expirySlack
	g.d.opts.Logger.Info("metadata/etcd: bookie id is registered by another lease; waiting for it to expire",
		"key", string(kv.Key), "lease", fmt.Sprintf("%x", kv.Lease), "wait", wait)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for wresp := range g.d.cli.Watch(wctx, string(kv.Key), clientv3.WithRev(rev+1), clientv3.WithFilterPut()) {
		if wresp.Canceled || wresp.Err() != nil || len(wresp.Events) > 0 {
			return nil // deleted, or cannot tell: read again
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: register bookie %s: %s is held by lease %x: %w", metadata.ErrBookieExists, g.id, kv.Key, kv.Lease, err)
	}
	return fmt.Errorf("%w: %s is held by lease %x, still alive after %v", metadata.ErrBookieExists, kv.Key, kv.Lease, wait)
}

// revoke revokes lease, best effort, bounded by revokeTimeout.
func (g *registration) revoke(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(g.d.ctx, revokeTimeout)
	defer cancel()
	_, _ = g.d.cli.Revoke(ctx, lease)
}

// run keeps the lease alive; when the lease is lost it registers again under
// a new one. It returns when g.ctx is done.
func (g *registration) run() {
	defer close(g.done)
	for g.ctx.Err() == nil {
		if err := g.lock.Lock(g.ctx); err != nil {
			return
		}
		lease := g.lease
		g.lock.Unlock()
		g.keepAlive(lease)
		if g.ctx.Err() != nil {
			return
		}
		g.d.opts.Logger.Warn("metadata/etcd: bookie registration lost its lease; registering again",
			"bookie", g.id, "lease", fmt.Sprintf("%x", lease))
		g.reestablish(lease)
	}
}

// keepAlive returns when the lease is lost or g.ctx is done.
func (g *registration) keepAlive(lease clientv3.LeaseID) {
	ctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	ka, err := g.d.cli.KeepAlive(ctx, lease)
	if err != nil {
		return
	}
	for {
		select {
		case _, ok := <-ka:
			if !ok {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// reestablish registers again under a new lease, retrying with backoff until
// it succeeds or g.ctx is done. The old lease is revoked only once the key
// has moved off it: revoking it first would delete the key of a healthy
// bookie, and a revoke that fails or hangs would hold the new registration
// back.
func (g *registration) reestablish(old clientv3.LeaseID) {
	backoff := 100 * time.Millisecond
	for g.ctx.Err() == nil {
		if err := g.lock.Lock(g.ctx); err != nil {
			return
		}
		err := g.establish(g.ctx)
		g.lock.Unlock()
		if err == nil {
			g.d.opts.Logger.Info("metadata/etcd: bookie registered again", "bookie", g.id)
			// Off run's path, so the new lease's keep-alive starts now; if the
			// driver is closing, the old lease simply expires.
			_ = g.d.goDriver(func() { g.revoke(old) })
			return
		}
		g.d.opts.Logger.Warn("metadata/etcd: registering bookie again failed", "bookie", g.id, "err", err)
		sleepCtx(g.ctx, backoff)
		backoff = min(2*backoff, time.Duration(g.ttl)*time.Second)
	}
}

// Update implements metadata.Registration.
func (g *registration) Update(ctx context.Context, info metadata.BookieInfo) error {
	if err := info.Validate(); err != nil {
		return err
	}
	if err := g.lock.Lock(ctx); err != nil {
		return fmt.Errorf("metadata/etcd: update bookie %s: %w", info.ID, err)
	}
	defer g.lock.Unlock()
	if g.closed {
		return metadata.ErrClosed
	}
	if info.ID != g.id {
		return fmt.Errorf("%w: registration of %s cannot take id %s", metadata.ErrInvalidBookieInfo, g.id, info.ID)
	}
	// The new info is the one to register from now on, even if this write fails: a
	// registration made again after a lost lease must not file the bookie under an older
	// state (a read-only bookie as writable) until its owner's next Update.
	g.info = info.Clone()
	err := g.claim(ctx, g.lease, 0, info)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The lease is gone; run is about to register again and will use
		// the new info.
		err = nil
	}
	return err
}

// Close implements metadata.Registration. A Close that failed (its context ended, the service
// was unreachable) can be called again; once one succeeded, later ones return nil.
func (g *registration) Close(ctx context.Context) error {
	g.cancel()
	select {
	case <-g.done:
	case <-ctx.Done():
		return fmt.Errorf("metadata/etcd: deregister bookie %s: %w", g.id, ctx.Err())
	}
	if err := g.lock.Lock(ctx); err != nil {
		return fmt.Errorf("metadata/etcd: deregister bookie %s: %w", g.id, err)
	}
	defer g.lock.Unlock()
	if g.revoked {
		return nil
	}
	g.closed = true // Update refuses from now on
	if _, err := g.d.cli.Revoke(ctx, g.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return g.d.opErr("deregister bookie "+g.id, err)
	}
	g.revoked = true
	return nil
}
