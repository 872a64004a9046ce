package etcd

import (
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
