package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

func kvOf(t *testing.T, d metadata.Driver) metadata.KV {
	t.Helper()
	kv, err := metadata.KVOf(d)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestKVGetCommitDelete(t *testing.T) {
	t.Parallel()
	kv := kvOf(t, open(t, metadatatest.URI(t)))
	ctx := ctxFor(t, 20*time.Second)

	if _, err := kv.Get(ctx, "a"); !errors.Is(err, metadata.ErrNoSuchKey) {
		t.Fatalf("get missing: %v", err)
	}
	v1, err := kv.Commit(ctx, nil, metadata.Put("a", []byte("1"), metadata.NoVersion))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := kv.Get(ctx, "a"); err != nil || string(got.Value) != "1" || got.Version != v1 || got.Key != "a" {
		t.Fatalf("get: %+v %v", got, err)
	}
	// Create of an existing key and a stale update both fail with the stored version.
	_, err = kv.Commit(ctx, nil, metadata.Put("a", []byte("x"), metadata.NoVersion))
	var bv *metadata.BadVersionError
	if !errors.As(err, &bv) || bv.Current != v1 || bv.Expected != metadata.NoVersion {
		t.Fatalf("create twice: %v", err)
	}
	v2, err := kv.Commit(ctx, nil, metadata.Put("a", []byte("2"), v1))
	if err != nil || v2 <= v1 {
		t.Fatalf("update: %v", err)
	}
	if _, err := kv.Commit(ctx, nil, metadata.Put("a", []byte("3"), v1)); !errors.Is(err, metadata.ErrBadVersion) {
		t.Fatalf("stale update: %v", err)
	}
	// Several keys at once: all or nothing.
	_, err = kv.Commit(ctx, nil, metadata.Put("b", []byte("b"), metadata.NoVersion), metadata.Put("a", []byte("4"), v1))
	if !errors.As(err, &bv) || bv.What != "key a" {
		t.Fatalf("multi-key commit with a stale version: %v", err)
	}
	if _, err := kv.Get(ctx, "b"); !errors.Is(err, metadata.ErrNoSuchKey) {
		t.Fatalf("half a commit applied: %v", err)
	}
	v3, err := kv.Commit(ctx, nil, metadata.Put("b", []byte("b"), metadata.NoVersion), metadata.Put("a", []byte("4"), v2))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := kv.Get(ctx, "b"); got.Version != v3 {
		t.Fatalf("b has version %d, commit returned %d", got.Version, v3)
	}
	// Deletes.
	if _, err := kv.Commit(ctx, nil, metadata.Delete("a", v2)); !errors.Is(err, metadata.ErrBadVersion) {
		t.Fatalf("stale delete: %v", err)
	}
	if _, err := kv.Commit(ctx, nil, metadata.Delete("a", v3), metadata.Delete("zz", metadata.AnyVersion)); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := kv.Get(ctx, "a"); !errors.Is(err, metadata.ErrNoSuchKey) {
		t.Fatalf("get deleted: %v", err)
	}
	// Bad arguments.
	for _, ops := range [][]metadata.KVOp{
		nil,
		{metadata.Put("", nil, metadata.AnyVersion)},
		{metadata.Put("a b", nil, metadata.AnyVersion)},
		{metadata.Put("a", nil, metadata.AnyVersion), metadata.Put("a", nil, metadata.AnyVersion)},
		{metadata.Delete("a", metadata.NoVersion)},
		make([]metadata.KVOp, metadata.MaxKVOps+1),
	} {
		if _, err := kv.Commit(ctx, nil, ops...); !errors.Is(err, metadata.ErrInvalidKey) {
			t.Fatalf("commit %v: %v", ops, err)
		}
	}
}

func TestKVListPages(t *testing.T) {
	t.Parallel()
	kv := kvOf(t, open(t, metadatatest.URI(t)))
	ctx := ctxFor(t, 20*time.Second)
	for i := range 25 {
		if _, err := kv.Commit(ctx, nil, metadata.Put(fmt.Sprintf("p/%03d", i), []byte{byte(i)}, metadata.NoVersion)); err != nil {
			t.Fatal(err)
		}
	}
	// Keys outside the prefix, before and after it.
	for _, k := range []string{"o", "p", "q/1", "pz"} {
		if _, err := kv.Commit(ctx, nil, metadata.Put(k, nil, metadata.NoVersion)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	after := ""
	for {
		page, more, err := kv.List(ctx, "p/", after, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			got = append(got, e.Key)
		}
		if !more {
			break
		}
		after = page[len(page)-1].Key
	}
	if len(got) != 25 {
		t.Fatalf("listed %d keys: %v", len(got), got)
	}
	for i, k := range got {
		if k != fmt.Sprintf("p/%03d", i) {
			t.Fatalf("key %d is %q", i, k)
		}
	}
	if _, _, err := kv.List(ctx, "p/", "q", 10); !errors.Is(err, metadata.ErrInvalidKey) {
		t.Fatalf("list after a key outside the prefix: %v", err)
	}
}

func TestKVLockGuardsCommits(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	d1, d2 := open(t, uri), open(t, uri)
	kv1, kv2 := kvOf(t, d1), kvOf(t, d2)
	ctx := ctxFor(t, 30*time.Second)

	l1, err := kv1.Lock(ctx, "log/a", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv1.Commit(ctx, l1, metadata.Put("k", []byte("1"), metadata.NoVersion)); err != nil {
		t.Fatalf("guarded commit: %v", err)
	}
	// A second contender waits.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = kv2.Lock(short, "log/a", 2*time.Second)
	cancel()
	if err == nil {
		t.Fatal("second lock granted while the first is held")
	}
	// A lock whose name extends the first one's is another lock.
	l3, err := kv2.Lock(ctx, "log/a/b", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l3.Unlock(ctx)

	got := make(chan metadata.Lock, 1)
	go func() {
		l, err := kv2.Lock(ctx, "log/a", 2*time.Second)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	// The holder dies without unlocking: its lease expires and the waiter gets the lock.
	start := time.Now()
	d1.Close()
	select {
	case <-l1.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after the driver closed")
	}
	l2 := <-got
	if l2 == nil {
		return
	}
	t.Logf("lock passed on %v after the holder died", time.Since(start))
	if _, err := kv2.Commit(ctx, l2, metadata.Put("k", []byte("2"), metadata.AnyVersion)); err != nil {
		t.Fatalf("commit guarded by the new lock: %v", err)
	}
	// A commit guarded by the dead lock fails with ErrLockLost, even through another driver.
	if _, err := kv2.Commit(ctx, l1, metadata.Put("k", []byte("3"), metadata.AnyVersion)); err == nil {
		t.Fatal("commit guarded by a lock of another driver succeeded")
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatalf("second unlock: %v", err)
	}
	select {
	case <-l2.Lost():
	default:
		t.Fatal("Lost not closed after Unlock")
	}
	if _, err := kv2.Commit(ctx, l2, metadata.Put("k", []byte("4"), metadata.AnyVersion)); !errors.Is(err, metadata.ErrLockLost) {
		t.Fatalf("commit guarded by an unlocked lock: %v", err)
	}
	if v, _ := kv2.Get(ctx, "k"); string(v.Value) != "2" {
		t.Fatalf("k = %q", v.Value)
	}
	if _, err := kv2.Lock(ctx, "x", 10*time.Millisecond); !errors.Is(err, metadata.ErrInvalidOptions) {
		t.Fatalf("lock with a tiny TTL: %v", err)
	}
}

func TestKVWatch(t *testing.T) {
	t.Parallel()
	kv := kvOf(t, open(t, metadatatest.URI(t)))
	ctx := ctxFor(t, 20*time.Second)
	wctx, cancel := context.WithCancel(ctx)
	ch, err := kv.Watch(wctx, "w/")
	if err != nil {
		t.Fatal(err)
	}
	expect := func(want bool) {
		t.Helper()
		select {
		case _, ok := <-ch:
			if !want || !ok {
				t.Fatalf("unexpected signal (open %v)", ok)
			}
		case <-time.After(300 * time.Millisecond):
			if want {
				t.Fatal("no signal")
			}
		}
	}
	kv.Commit(ctx, nil, metadata.Put("other", nil, metadata.AnyVersion))
	expect(false)
	kv.Commit(ctx, nil, metadata.Put("w/1", nil, metadata.AnyVersion))
	expect(true)
	kv.Commit(ctx, nil, metadata.Delete("w/1", metadata.AnyVersion))
	expect(true)
	cancel()
	select {
	case _, ok := <-ch:
		for ok {
			_, ok = <-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch channel not closed")
	}
}
