package etcd_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/etcd"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

// compactAll compacts d's etcd history up to the present and checks that a
// watch from rev+1 now fails with ErrCompacted, so that a watch resuming
// there must resynchronise.
func compactAll(t *testing.T, ctx context.Context, d metadata.Driver, key string, rev int64) {
	t.Helper()
	cli := etcd.RawClient(d)
	resp, err := cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wresp := <-cli.Watch(wctx, key, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	if !errors.Is(wresp.Err(), rpctypes.ErrCompacted) {
		t.Fatalf("a watch from revision %d after compaction: %v, want ErrCompacted", rev+1, wresp.Err())
	}
}

// TestBookieWatchResumesAfterCompaction: a bookie watch that resumes from a
// revision etcd has compacted away (it fell behind, or its connection broke
// while history was compacted) reloads the registry and reports the present
// set, missing none of the changes made in the gap.
func TestBookieWatchResumesAfterCompaction(t *testing.T) {
	t.Parallel()
	uri := metadatatest.StartEmbedded(t) // compaction is server-wide
	ctx := ctxFor(t, 20*time.Second)
	d, watcher := open(t, uri), open(t, uri)
	ra, err := d.Bookies().Register(ctx, bookie("a:1", metadata.BookieWritable), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close(ctx)
	rb, err := d.Bookies().Register(ctx, bookie("b:1", metadata.BookieWritable), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := etcd.RawClient(d).Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	behind := resp.Header.Revision

	// In the gap: a turns read-only, b goes, c comes.
	if err := ra.Update(ctx, bookie("a:1", metadata.BookieReadOnly)); err != nil {
		t.Fatal(err)
	}
	if err := rb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rc, err := d.Bookies().Register(ctx, bookie("c:1", metadata.BookieWritable), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close(ctx)
	ch, start, err := etcd.BehindBookieWatch(ctx, watcher, behind)
	if err != nil {
		t.Fatal(err)
	}
	compactAll(t, ctx, d, etcd.BookieKey(d, metadata.BookieWritable, ""), behind)
	if got := ids(<-ch); !slices.Equal(got, []string{"a:1/writable", "b:1/writable"}) {
		t.Fatalf("set at revision %d: %v", behind, got)
	}
	if err := start(); err != nil {
		t.Fatal(err)
	}
	want := []string{"a:1/readonly", "c:1/writable"}
	for {
		select {
		case set, ok := <-ch:
			if !ok {
				t.Fatal("watch closed")
			}
			if got := ids(set); slices.Equal(got, want) {
				return
			}
		case <-ctx.Done():
			t.Fatalf("the watch never reported %v after resuming from a compacted revision", want)
		}
	}
}

// TestLedgerWatchResumesAfterCompaction: a ledger watch that resumes from a
// compacted revision reads the ledger again and reports its present
// metadata, or that it was deleted in the gap, and then follows changes as
// before.
func TestLedgerWatchResumesAfterCompaction(t *testing.T) {
	t.Parallel()
	uri := metadatatest.StartEmbedded(t) // compaction is server-wide
	ctx := ctxFor(t, 20*time.Second)
	d, watcher := open(t, uri), open(t, uri)
	next := func(ch <-chan metadata.LedgerChange) metadata.LedgerChange {
		t.Helper()
		select {
		case c, ok := <-ch:
			if !ok {
				t.Fatal("channel closed early")
			}
			return c
		case <-ctx.Done():
			t.Fatal("no change delivered")
		}
		return metadata.LedgerChange{}
	}
	md := metadatatest.Ledger()
	v0, err := d.Ledgers().Create(ctx, 7, md)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := d.Ledgers().Create(ctx, 8, md)
	if err != nil {
		t.Fatal(err)
	}
	behind := int64(max(v0, gone))
	closed := md.Clone()
	closed.State, closed.LastEntryID, closed.Length = metadata.StateClosed, 9, 900
	v1, err := d.Ledgers().Update(ctx, 7, closed, v0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Ledgers().Delete(ctx, 8, gone); err != nil {
		t.Fatal(err)
	}
	ch7, start7, err := etcd.BehindLedgerWatch(ctx, watcher, 7, behind)
	if err != nil {
		t.Fatal(err)
	}
	ch8, start8, err := etcd.BehindLedgerWatch(ctx, watcher, 8, behind)
	if err != nil {
		t.Fatal(err)
	}
	compactAll(t, ctx, d, etcd.LedgerKey(d, 7), behind)
	if c := next(ch7); c.Version != v0 || c.Metadata.State != metadata.StateOpen {
		t.Fatalf("ledger 7 at revision %d: %+v", behind, c)
	}
	if c := next(ch8); c.Version != gone {
		t.Fatalf("ledger 8 at revision %d: %+v", behind, c)
	}
	if err := start7(); err != nil {
		t.Fatal(err)
	}
	if err := start8(); err != nil {
		t.Fatal(err)
	}
	if c := next(ch7); c.Err != nil || c.Version != v1 || !c.Metadata.Equal(closed) {
		t.Fatalf("ledger 7 after resuming: %+v, want version %d, CLOSED at 9", c, v1)
	}
	if c := next(ch8); !c.Deleted {
		t.Fatalf("ledger 8, deleted in the compacted gap, after resuming: %+v", c)
	}
	if _, ok := <-ch8; ok {
		t.Fatal("ledger 8's channel not closed after Deleted")
	}
	// It goes on following the ledger.
	if err := d.Ledgers().Delete(ctx, 7, v1); err != nil {
		t.Fatal(err)
	}
	if c := next(ch7); !c.Deleted {
		t.Fatalf("ledger 7 after delete: %+v", c)
	}
}
