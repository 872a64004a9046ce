package etcd

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// Test-only access to internals for the external test package.

// RawClient returns d's etcd client.
func RawClient(d metadata.Driver) *clientv3.Client { return d.(*Driver).cli }

// LedgerKey returns the key of ledger id.
func LedgerKey(d metadata.Driver, id int64) string { return d.(*Driver).keys.ledger(id) }

// BookieKey returns the registration key of a bookie.
func BookieKey(d metadata.Driver, s metadata.BookieState, id string) string {
	return d.(*Driver).keys.bookie(s, id)
}

// LeaseOf returns the current lease of a registration.
func LeaseOf(r metadata.Registration) clientv3.LeaseID {
	g := r.(*registration)
	if err := g.lock.Lock(g.ctx); err != nil {
		return 0
	}
	defer g.lock.Unlock()
	return g.lease
}

// BehindBookieWatch prepares a bookie watch that is behind: its set is the
// registry as it was at revision rev. Start makes it follow changes from
// rev+1, as a watch resuming there after a broken connection does (the
// history up to the present may have been compacted meanwhile).
func BehindBookieWatch(ctx context.Context, d metadata.Driver, rev int64) (out <-chan []metadata.BookieInfo, start func() error, err error) {
	dr := d.(*Driver)
	resp, err := dr.cli.Get(ctx, dr.keys.bookiesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return nil, nil, err
	}
	w := &bookieWatch{r: &dr.registry, out: make(chan []metadata.BookieInfo, 1), set: map[string]metadata.BookieInfo{}}
	for _, kv := range resp.Kvs {
		if b, ok := w.r.decode(kv); ok {
			w.set[string(kv.Key)] = b
		}
	}
	w.offer()
	start = func() error {
		wctx, cancel := dr.boundCtx(ctx)
		return dr.goDriver(func() {
			defer cancel()
			defer close(w.out)
			w.run(wctx, rev)
		})
	}
	return w.out, start, nil
}

// BehindLedgerWatch is BehindBookieWatch for the watch of one ledger: it
// last reported the ledger as it was at revision rev.
func BehindLedgerWatch(ctx context.Context, d metadata.Driver, id, rev int64) (out <-chan metadata.LedgerChange, start func() error, err error) {
	dr := d.(*Driver)
	key := dr.keys.ledger(id)
	resp, err := dr.cli.Get(ctx, key, clientv3.WithRev(rev))
	if err != nil {
		return nil, nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, nil, metadata.ErrNoSuchLedger
	}
	ch := make(chan metadata.LedgerChange, 1)
	ch <- dr.ledgers.change(id, resp.Kvs[0])
	w := &ledgerWatch{s: &dr.ledgers, id: id, key: key, out: ch, last: resp.Kvs[0].ModRevision}
	start = func() error {
		wctx, cancel := dr.boundCtx(ctx)
		return dr.goDriver(func() {
			defer cancel()
			defer close(ch)
			w.run(wctx, rev)
		})
	}
	return ch, start, nil
}

// WrapLeaseAPI replaces the lease API of d's client (Grant, KeepAlive,
// Revoke, ...) with wrap(original), to inject faults. Call it before d
// grants any lease.
func WrapLeaseAPI(d metadata.Driver, wrap func(clientv3.Lease) clientv3.Lease) {
	cli := d.(*Driver).cli
	cli.Lease = wrap(cli.Lease)
}
