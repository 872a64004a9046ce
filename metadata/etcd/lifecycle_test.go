package etcd_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/embedded"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

// TestCommitAfterTheLockWasLostFails: once a lock's Lost is closed (its lease could not be kept
// alive while the server was down), a commit guarded by it fails, although the restarted server
// renewed the lease and still holds the lock's key.
func TestCommitAfterTheLockWasLostFails(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 40*time.Second)
	port, err := strconv.Atoi(freePort(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := embedded.Config{Dir: t.TempDir(), ClientPort: port, UnsafeNoFsync: true}
	srv, err := embedded.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	kv := kvOf(t, open(t, srv.URIWithRoot("/r")))
	l, err := kv.Lock(ctx, "x", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost not closed while the server was down")
	}
	if srv, err = embedded.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := kv.Commit(cctx, l, metadata.Put("k", []byte("v"), metadata.AnyVersion)); !errors.Is(err, metadata.ErrLockLost) {
		t.Fatalf("commit guarded by a lost lock: %v, want ErrLockLost", err)
	}
}

// TestRegistrationCloseCanBeRetried: a Close whose context had ended can be called again, and
// the second one deregisters the bookie.
func TestRegistrationCloseCanBeRetried(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 20*time.Second)
	d := open(t, metadatatest.URI(t))
	r, err := d.Bookies().Register(ctx, bookie("cr:1", metadata.BookieWritable), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	_ = r.Close(dead)
	if err := r.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := listed(t, d, metadata.ListAll); len(got) != 0 {
		t.Fatalf("still registered after a successful Close: %v", got)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatalf("Close after a successful one: %v", err)
	}
}

// TestRegisterOfAHeldIDWhenTheContextEnds: Register of an id another live process holds fails
// with ErrBookieExists also when its context ends first (so a starting bookie can tell it from
// an unreachable service).
func TestRegisterOfAHeldIDWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	holder, other := open(t, uri), open(t, uri)
	if _, err := holder.Bookies().Register(ctx, bookie("held:1", metadata.BookieWritable), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := other.Bookies().Register(short, bookie("held:1", metadata.BookieWritable), 10*time.Second); !errors.Is(err, metadata.ErrBookieExists) {
		t.Fatalf("register of a held id, context done: %v, want ErrBookieExists", err)
	}
}
