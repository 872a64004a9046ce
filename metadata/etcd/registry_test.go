package etcd_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/etcd"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

func bookie(id string, s metadata.BookieState) metadata.BookieInfo {
	return metadata.BookieInfo{
		ID:             id,
		State:          s,
		Endpoints:      []metadata.Endpoint{{ID: "bookie", Protocol: "bookie-rpc", Host: "127.0.0.1", Port: 3181}},
		FreeDiskBytes:  100 << 30,
		TotalDiskBytes: 200 << 30,
	}
}

func ids(bs []metadata.BookieInfo) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.ID + "/" + b.State.String()
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func listed(t *testing.T, d metadata.Driver, f metadata.BookieFilter) []string {
	t.Helper()
	bs, err := d.Bookies().List(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return ids(bs)
}

func TestBookieRegistry(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	d, client := open(t, uri), open(t, uri)

	r1, err := d.Bookies().Register(ctx, bookie("b1:3181", metadata.BookieWritable), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := d.Bookies().Register(ctx, bookie("b2:3181", metadata.BookieReadOnly), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := listed(t, client, metadata.ListWritable); !slices.Equal(got, []string{"b1:3181/writable"}) {
		t.Fatalf("writable %v", got)
	}
	if got := listed(t, client, metadata.ListReadOnly); !slices.Equal(got, []string{"b2:3181/readonly"}) {
		t.Fatalf("readonly %v", got)
	}
	all, err := client.Bookies().List(ctx, metadata.ListAll)
	if err != nil || len(all) != 2 || all[0].FreeDiskBytes != 100<<30 || all[0].Endpoints[0].Port != 3181 {
		t.Fatalf("all %+v %v", all, err)
	}

	// b1 turns read-only with less free space: the move is atomic.
	info := bookie("b1:3181", metadata.BookieReadOnly)
	info.FreeDiskBytes = 1 << 20
	if err := r1.Update(ctx, info); err != nil {
		t.Fatal(err)
	}
	ro, err := client.Bookies().List(ctx, metadata.ListReadOnly)
	if err != nil || !slices.Equal(ids(ro), []string{"b1:3181/readonly", "b2:3181/readonly"}) || ro[0].FreeDiskBytes != 1<<20 {
		t.Fatalf("after update: %+v %v", ro, err)
	}
	if got := listed(t, client, metadata.ListWritable); len(got) != 0 {
		t.Fatalf("writable after update %v", got)
	}
	if err := r1.Update(ctx, bookie("other:1", metadata.BookieWritable)); !errors.Is(err, metadata.ErrInvalidBookieInfo) {
		t.Fatalf("update with another id: %v", err)
	}

	// Close deregisters at once.
	if err := r2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := r2.Update(ctx, bookie("b2:3181", metadata.BookieWritable)); !errors.Is(err, metadata.ErrClosed) {
		t.Fatalf("update after close: %v", err)
	}
	if got := listed(t, client, metadata.ListAll); !slices.Equal(got, []string{"b1:3181/readonly"}) {
		t.Fatalf("after close %v", got)
	}
	if _, err := d.Bookies().Register(ctx, bookie("bad/id", metadata.BookieWritable), 0); !errors.Is(err, metadata.ErrInvalidBookieID) {
		t.Fatalf("bad id: %v", err)
	}
}

func TestWatchBookies(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	d, watcher := open(t, uri), open(t, uri)
	ch, err := watcher.Bookies().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// expect reads sets until one equals want.
	expect := func(want ...string) {
		t.Helper()
		for {
			select {
			case set, ok := <-ch:
				if !ok {
					t.Fatal("watch closed")
				}
				if slices.Equal(ids(set), want) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("never saw %v", want)
			}
		}
	}
	expect()
	r, err := d.Bookies().Register(ctx, bookie("w1:1", metadata.BookieWritable), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	expect("w1:1/writable")
	if err := r.Update(ctx, bookie("w1:1", metadata.BookieReadOnly)); err != nil {
		t.Fatal(err)
	}
	expect("w1:1/readonly")
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	expect()
}

// TestBookieLeaseExpiry: a bookie whose process dies (its client goes away
// without deregistering) disappears within its TTL, and watchers see it go.
func TestBookieLeaseExpiry(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	watcher := open(t, uri)
	ch, err := watcher.Bookies().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	crashing, err := metadata.Open(ctx, uri, metadata.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crashing.Bookies().Register(ctx, bookie("dies:1", metadata.BookieWritable), time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "registration visible", func() bool { return len(listed(t, watcher, metadata.ListAll)) == 1 })
	// Crash: the connection goes, nothing is revoked.
	if err := crashing.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for gone := false; !gone; {
		select {
		case set := <-ch:
			gone = len(set) == 0
		case <-ctx.Done():
			t.Fatal("watch never reported the crashed bookie gone")
		}
	}
	t.Logf("crashed bookie with TTL 1s gone after %v", time.Since(start))
	if time.Since(start) > 5*time.Second {
		t.Fatalf("took %v for a 1s TTL", time.Since(start))
	}
}

// TestBookieReRegistersAfterLeaseLoss: when the lease is lost while the
// process lives, the registration comes back under a new lease.
func TestBookieReRegistersAfterLeaseLoss(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	d := open(t, uri)
	r, err := d.Bookies().Register(ctx, bookie("lives:1", metadata.BookieWritable), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lease := etcd.LeaseOf(r)
	if _, err := etcd.RawClient(d).Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	// An update racing with the re-registration is not lost.
	info := bookie("lives:1", metadata.BookieWritable)
	info.FreeDiskBytes = 12345
	if err := r.Update(ctx, info); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 10*time.Second, "re-registration", func() bool {
		l := etcd.LeaseOf(r)
		bs, err := d.Bookies().List(ctx, metadata.ListWritable)
		return err == nil && l != lease && l != 0 && len(bs) == 1 && bs[0].FreeDiskBytes == 12345
	})
	t.Logf("re-registered after %v", took)
	resp, err := etcd.RawClient(d).Get(ctx, etcd.BookieKey(d, metadata.BookieWritable, "lives:1"))
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != int64(etcd.LeaseOf(r)) {
		t.Fatalf("key not bound to the new lease: %v %v", resp, err)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestBookieIDTakeover: while a live process holds a bookie id, another
// cannot register it; once the holder crashes, the new process takes over
// when the old lease expires.
func TestBookieIDTakeover(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	holder, err := metadata.Open(ctx, uri, metadata.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.Bookies().Register(ctx, bookie("dup:1", metadata.BookieWritable), time.Second); err != nil {
		t.Fatal(err)
	}
	other := open(t, uri)
	start := time.Now()
	_, err = other.Bookies().Register(ctx, bookie("dup:1", metadata.BookieReadOnly), time.Second)
	if !errors.Is(err, metadata.ErrBookieExists) {
		t.Fatalf("second registration while the holder lives: %v", err)
	}
	t.Logf("refused after %v: %v", time.Since(start), err)

	holder.Close() // crash
	start = time.Now()
	r, err := other.Bookies().Register(ctx, bookie("dup:1", metadata.BookieReadOnly), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("took over after %v", time.Since(start))
	if got := listed(t, other, metadata.ListAll); !slices.Equal(got, []string{"dup:1/readonly"}) {
		t.Fatalf("after takeover %v", got)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCookies(t *testing.T) {
	t.Parallel()
	d := open(t, metadatatest.URI(t))
	cs := d.Cookies()
	ctx := ctxFor(t, 20*time.Second)
	const id = "10.0.0.1:3181"
	if _, _, err := cs.Read(ctx, id); !errors.Is(err, metadata.ErrNoSuchCookie) {
		t.Fatalf("read missing: %v", err)
	}
	v1, err := cs.Write(ctx, id, []byte("5\ncookie-1"), metadata.NoVersion)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Write(ctx, id, []byte("x"), metadata.NoVersion); !errors.Is(err, metadata.ErrBadVersion) {
		t.Fatalf("create twice: %v", err)
	}
	v2, err := cs.Write(ctx, id, []byte("5\ncookie-2"), v1)
	if err != nil {
		t.Fatal(err)
	}
	var bv *metadata.BadVersionError
	if _, err := cs.Write(ctx, id, []byte("x"), v1); !errors.As(err, &bv) || bv.Current != v2 {
		t.Fatalf("stale write: %v", err)
	}
	got, v, err := cs.Read(ctx, id)
	if err != nil || v != v2 || string(got) != "5\ncookie-2" {
		t.Fatalf("read %q %d %v", got, v, err)
	}
	if err := cs.Delete(ctx, id, v1); !errors.Is(err, metadata.ErrBadVersion) {
		t.Fatalf("stale delete: %v", err)
	}
	if err := cs.Delete(ctx, id, v2); err != nil {
		t.Fatal(err)
	}
	if err := cs.Delete(ctx, id, metadata.AnyVersion); !errors.Is(err, metadata.ErrNoSuchCookie) {
		t.Fatalf("delete missing: %v", err)
	}
	if _, err := cs.Write(ctx, "a/b", nil, metadata.AnyVersion); !errors.Is(err, metadata.ErrInvalidBookieID) {
		t.Fatalf("bad id: %v", err)
	}
}

// TestWatchBookiesDropsUnreadableRegistration: a registration whose value
// becomes unreadable (a newer value format, a corrupt write) is left out of
// the watched set, as List leaves it out, instead of the watch going on
// reporting the bookie with the info it had before (stale endpoints and
// state).
func TestWatchBookiesDropsUnreadableRegistration(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	d, watcher := open(t, uri), open(t, uri)
	ch, err := watcher.Bookies().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// until reads sets until cond holds for one and returns it.
	until := func(what string, cond func([]string) bool) []string {
		t.Helper()
		for {
			select {
			case set, ok := <-ch:
				if !ok {
					t.Fatal("watch closed")
				}
				if got := ids(set); cond(got) {
					return got
				}
			case <-ctx.Done():
				t.Fatalf("never saw %s", what)
			}
		}
	}
	r, err := d.Bookies().Register(ctx, bookie("x:1", metadata.BookieWritable), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	until("x:1 registered", func(s []string) bool { return slices.Equal(s, []string{"x:1/writable"}) })

	// The value is overwritten with one this build cannot read (format "v":2).
	key := etcd.BookieKey(d, metadata.BookieWritable, "x:1")
	if _, err := etcd.RawClient(d).Put(ctx, key, `{"v":2}`); err != nil {
		t.Fatal(err)
	}
	if got := listed(t, watcher, metadata.ListAll); len(got) != 0 {
		t.Fatalf("List after the unreadable write: %v, want none", got)
	}
	// A later change shows what the watch makes of the registry now.
	r2, err := d.Bookies().Register(ctx, bookie("y:1", metadata.BookieWritable), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close(ctx)
	got := until("y:1 registered", func(s []string) bool { return slices.Contains(s, "y:1/writable") })
	if want := listed(t, watcher, metadata.ListAll); !slices.Equal(got, want) {
		t.Fatalf("watched set %v, but List says %v: the watch kept a registration it cannot read", got, want)
	}
}

// TestReRegistrationUsesTheLastRequestedInfo: an Update that fails (here: another lease holds
// the read-only key) still decides what a registration made again after a lost lease files:
// the bookie asked to be read-only, so it comes back read-only, not writable.
func TestReRegistrationUsesTheLastRequestedInfo(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	d := open(t, uri)
	r, err := d.Bookies().Register(ctx, bookie("moves:1", metadata.BookieWritable), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	raw := etcd.RawClient(d)
	foreign, err := raw.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Put(ctx, etcd.BookieKey(d, metadata.BookieReadOnly, "moves:1"), "held", clientv3.WithLease(foreign.ID)); err != nil {
		t.Fatal(err)
	}
	if err := r.Update(ctx, bookie("moves:1", metadata.BookieReadOnly)); !errors.Is(err, metadata.ErrBookieExists) {
		t.Fatalf("move to read-only while another lease holds its key: %v, want ErrBookieExists", err)
	}
	if _, err := raw.Revoke(ctx, foreign.ID); err != nil {
		t.Fatal(err)
	}
	lease := etcd.LeaseOf(r)
	if _, err := raw.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "re-registration", func() bool {
		l := etcd.LeaseOf(r)
		bs, err := d.Bookies().List(ctx, metadata.ListAll)
		return err == nil && l != lease && l != 0 && len(bs) == 1
	})
	if got := listed(t, d, metadata.ListAll); !slices.Equal(got, []string{"moves:1/readonly"}) {
		t.Fatalf("registered again as %v, want moves:1/readonly, the state last asked for", got)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// unreachableLease is a lease API on which chosen leases can be lost the way a partition
// loses them: the client's keep-alive for the lease ends while etcd still holds it alive
// until its TTL runs out, and revoking it fails.
type unreachableLease struct {
	clientv3.Lease
	mu      sync.Mutex
	stopKA  map[clientv3.LeaseID]context.CancelFunc
	lost    map[clientv3.LeaseID]bool
	revokes atomic.Int32 // revokes of lost leases attempted
}

func (l *unreachableLease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	l.mu.Lock()
	l.stopKA[id] = cancel
	l.mu.Unlock()
	return l.Lease.KeepAlive(ctx, id)
}

func (l *unreachableLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	l.mu.Lock()
	lost := l.lost[id]
	l.mu.Unlock()
	if lost {
		l.revokes.Add(1)
		return nil, errors.New("injected: etcd unreachable")
	}
	return l.Lease.Revoke(ctx, id)
}

// lose ends the client's keep-alive of id and makes revoking it fail.
func (l *unreachableLease) lose(id clientv3.LeaseID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost[id] = true
	if stop := l.stopKA[id]; stop != nil {
		stop()
	}
}

// TestReRegistrationDoesNotWaitForTheOldLease: when the client loses its lease's
// keep-alive while etcd still holds the lease (and revoking it fails), the registration
// moves its key to a new lease at once: it does not wait for its own old lease to expire,
// and the bookie never drops out of the writable set.
func TestReRegistrationDoesNotWaitForTheOldLease(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	d := open(t, uri)
	faults := &unreachableLease{stopKA: map[clientv3.LeaseID]context.CancelFunc{}, lost: map[clientv3.LeaseID]bool{}}
	etcd.WrapLeaseAPI(d, func(l clientv3.Lease) clientv3.Lease { faults.Lease = l; return faults })
	const ttl = 2 * time.Second
	r, err := d.Bookies().Register(ctx, bookie("partitioned:1", metadata.BookieWritable), ttl)
	if err != nil {
		t.Fatal(err)
	}
	key := etcd.BookieKey(d, metadata.BookieWritable, "partitioned:1")
	raw := etcd.RawClient(d)
	resp, err := raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("registration not written: %v %v", resp, err)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	deletes := raw.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut())

	old := etcd.LeaseOf(r)
	faults.lose(old)
	took := waitFor(t, 3*ttl, "re-registration", func() bool {
		l := etcd.LeaseOf(r)
		return l != old && l != 0
	})
	t.Logf("re-registered after %v", took)
	// Past the old lease's expiry: had the key stayed on it, etcd has deleted it by now.
	time.Sleep(ttl + time.Second)
	resp, err = raw.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != int64(etcd.LeaseOf(r)) {
		t.Fatalf("key not bound to the new lease: %v %v", resp, err)
	}
	stopWatch()
	for wresp := range deletes {
		for _, ev := range wresp.Events {
			t.Errorf("the writable key was deleted at revision %d while the bookie was healthy", ev.Kv.ModRevision)
		}
	}
	if faults.revokes.Load() == 0 {
		t.Error("the old lease was never revoked: the failed revoke was not exercised")
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
