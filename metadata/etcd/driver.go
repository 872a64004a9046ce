// Package etcd is the metadata driver for etcd v3 (an external cluster, or
// the in-process server of package metadata/embedded). Importing it registers
// the "etcd" URI scheme with metadata.Open:
//
//	import _ "github.com/ringkeeper/ringkeeper/metadata/etcd"
//	d, err := metadata.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379/ledgers", metadata.Options{})
//
// The key layout and value formats are documented in package metadata.
package etcd

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// Scheme is the URI scheme of this driver.
const Scheme = "etcd"

// DefaultPort is used for hosts given without a port.
const DefaultPort = "2379"

func init() {
	metadata.RegisterDriver(Scheme, func(ctx context.Context, uri metadata.URI, opts metadata.Options) (metadata.Driver, error) {
		d, err := Open(ctx, uri, opts)
		if err != nil {
			// Not d: a nil *Driver is a non-nil metadata.Driver, which callers that keep
			// it (bookie.Start's clean-up) would Close.
			return nil, err
		}
		return d, nil
	})
}

// Driver is the etcd implementation of metadata.Driver.
type Driver struct {
	cli    *clientv3.Client
	keys   keys
	opts   metadata.Options
	hosts  string // for messages
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards closed and the Add side of wg, so that no goroutine starts
	// after Close has begun waiting.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup

	isClosed atomic.Bool // fast path check, set under mu
	ids      idAllocator
	instance atomic.Pointer[string] // cached instance id

	ledgers  ledgerStore
	registry registry
	cookies  cookieStore
}

var _ metadata.Driver = (*Driver)(nil)

// Open connects to the etcd cluster of uri. It returns once a member has
// answered a read, or fails with metadata.ErrUnreachable after
// opts.DialTimeout (or when ctx is done). opts is defaulted and validated.
func Open(ctx context.Context, uri metadata.URI, opts metadata.Options) (*Driver, error) {
	if uri.Scheme != Scheme {
		return nil, fmt.Errorf("%w %q: scheme is not %q", metadata.ErrBadURI, uri.String(), Scheme)
	}
	if err := metadata.ValidateRoot(uri.Root); err != nil {
		return nil, fmt.Errorf("%w %q: %w", metadata.ErrBadURI, uri.String(), err)
	}
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	endpoints := make([]string, len(uri.Hosts))
	for i, h := range uri.Hosts {
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), DefaultPort)
		}
		endpoints[i] = "http://" + h
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: opts.DialTimeout,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd %s: %w", metadata.ErrUnreachable, strings.Join(endpoints, ","), err)
	}
	d := newDriver(cli, keys{root: uri.Root}, opts, strings.Join(endpoints, ","))
	if err := d.probe(ctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

func newDriver(cli *clientv3.Client, k keys, opts metadata.Options, hosts string) *Driver {
	d := &Driver{cli: cli, keys: k, opts: opts, hosts: hosts}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.ids = idAllocator{d: d, lock: newCtxMutex()}
	d.ledgers = ledgerStore{d: d}
	d.registry = registry{d: d}
	d.cookies = cookieStore{d: d}
	return d
}

// probe reads one key, bounded by DialTimeout, to tell an unreachable cluster
// apart early instead of at the first real request.
func (d *Driver) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, d.opts.DialTimeout)
	defer cancel()
	if _, err := d.cli.Get(pctx, d.keys.instanceID(), clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("%w: etcd %s did not answer within %v: %w",
			metadata.ErrUnreachable, d.hosts, d.opts.DialTimeout, err)
	}
	return nil
}

// Bookies implements metadata.Driver.
func (d *Driver) Bookies() metadata.Registry { return &d.registry }

// Ledgers implements metadata.Driver.
func (d *Driver) Ledgers() metadata.LedgerStore { return &d.ledgers }

// Cookies implements metadata.Driver.
func (d *Driver) Cookies() metadata.CookieStore { return &d.cookies }

// NewLedgerID implements metadata.Driver.
func (d *Driver) NewLedgerID(ctx context.Context) (int64, error) {
	if err := d.checkOpen(); err != nil {
		return 0, err
	}
	return d.ids.next(ctx)
}

// InstanceID implements metadata.Driver.
func (d *Driver) InstanceID(ctx context.Context) (string, error) {
	if err := d.checkOpen(); err != nil {
		return "", err
	}
	if id := d.instance.Load(); id != nil {
		return *id, nil
	}
	key := d.keys.instanceID()
	fresh := newUUID()
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, fresh)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return "", d.opErr("instance id", err)
	}
	id := fresh
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || len(kvs[0].Value) == 0 {
			return "", fmt.Errorf("metadata/etcd: instance id at %s is empty", key)
		}
		id = string(kvs[0].Value)
	}
	d.instance.Store(&id)
	return id, nil
}

// Close implements metadata.Driver.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.isClosed.Store(true)
	d.mu.Unlock()
	d.cancel()
	d.wg.Wait()
	err := d.cli.Close()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("metadata/etcd: close: %w", err)
	}
	return nil
}

func (d *Driver) checkOpen() error {
	if d.isClosed.Load() {
		return metadata.ErrClosed
	}
	return nil
}

// goDriver runs f in a goroutine that Close waits for. f must return soon
// after ctx (derived from the driver's context) is done.
func (d *Driver) goDriver(f func()) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return metadata.ErrClosed
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
	return nil
}

// boundCtx returns a context that is done when ctx is done or the driver is
// closed.
func (d *Driver) boundCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.ctx, cancel)
	return bctx, func() {
		stop()
		cancel()
	}
}

// opErr wraps an etcd error; after Close it reports ErrClosed.
func (d *Driver) opErr(what string, err error) error {
	if d.isClosed.Load() {
		return fmt.Errorf("metadata/etcd: %s: %w (%w)", what, metadata.ErrClosed, err)
	}
	return fmt.Errorf("metadata/etcd: %s: %w", what, err)
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ctxMutex is a mutex whose Lock gives up when a context is done; it is held
// across etcd requests.
type ctxMutex chan struct{}

func newCtxMutex() ctxMutex { return make(ctxMutex, 1) }

func (m ctxMutex) Lock(ctx context.Context) error {
	select {
	case m <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m ctxMutex) Unlock() { <-m }
