package etcd_test

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/embedded"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

// TestRestartKeepsMetadata creates, updates and deletes ledgers through the
// driver, restarts the embedded server on the same directory, and checks
// that every ledger's metadata and version, the id counter, the instance id
// and the cookies survived.
func TestRestartKeepsMetadata(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 50*time.Second)
	srv := metadatatest.StartServer(t)
	uri := srv.URI()
	d, err := metadata.Open(ctx, uri, metadata.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	want := make(map[int64]metadata.VersionedLedger)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n/8; i++ {
				md := metadatatest.Ledger()
				md.CustomMetadata = map[string][]byte{"i": []byte{byte(i)}}
				id, v, err := metadata.CreateLedger(ctx, d, md)
				if err == nil && i%3 == 0 { // close a third of them
					md, v, err = metadata.UpdateLedger(ctx, d.Ledgers(), id, func(m *metadata.LedgerMetadata) error {
						m.State, m.LastEntryID, m.Length = metadata.StateClosed, int64(i), int64(i)*100
						return nil
					})
				}
				if err == nil && i%5 == 0 { // and delete some
					err = d.Ledgers().Delete(ctx, id, v)
					md = nil
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if md != nil {
					want[id] = metadata.VersionedLedger{ID: id, Metadata: md, Version: v}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	instance, err := d.InstanceID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Cookies().Write(ctx, "b:1", []byte("cookie"), metadata.NoVersion); err != nil {
		t.Fatal(err)
	}
	lastID, err := d.NewLedgerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	srv2, err := embedded.Start(ctx, embedded.Config{Dir: srv.Dir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	t.Logf("restarted in %v (%s -> %s)", time.Since(start), uri, srv2.URI())
	d2 := open(t, srv2.URI())
	got := 0
	err = metadata.ForEachLedger(ctx, d2.Ledgers(), 100, func(l metadata.VersionedLedger) error {
		w, ok := want[l.ID]
		if !ok {
			t.Errorf("ledger %d is back after restart", l.ID)
		} else if !l.Metadata.Equal(w.Metadata) || l.Version != w.Version {
			t.Errorf("ledger %d: got %+v at version %d, want %+v at %d", l.ID, l.Metadata, l.Version, w.Metadata, w.Version)
		}
		got++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got != len(want) {
		t.Fatalf("%d ledgers after restart, want %d", got, len(want))
	}
	if id, err := d2.InstanceID(ctx); err != nil || id != instance {
		t.Fatalf("instance id %q (%v), want %q", id, err, instance)
	}
	if c, _, err := d2.Cookies().Read(ctx, "b:1"); err != nil || string(c) != "cookie" {
		t.Fatalf("cookie %q %v", c, err)
	}
	if id, err := d2.NewLedgerID(ctx); err != nil || id <= lastID {
		t.Fatalf("id after restart %d (%v), last before %d", id, err, lastID)
	}
}

// TestCloseStopsGoroutines: after Close, no goroutine of this package is
// left, even with watches and registrations still open. It is not parallel:
// it counts every goroutine of the package.
func TestCloseStopsGoroutines(t *testing.T) {
	ctx := ctxFor(t, 20*time.Second)
	uri := metadatatest.URI(t)
	d, err := metadata.Open(ctx, uri, metadata.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Ledgers().Create(ctx, 1, metadatatest.Ledger()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Ledgers().Watch(ctx, 1); err != nil {
		t.Fatal(err)
	}
	bch, err := d.Bookies().Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Bookies().Register(ctx, bookie("leak:1", metadata.BookieWritable), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := ownGoroutines(); n < 3 {
		t.Fatalf("expected the driver's goroutines to run, found %d", n)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for range bch { // closed by Close
	}
	// The etcd client's own goroutines wind down asynchronously; ours must
	// be gone when Close returns.
	if n := ownGoroutines(); n != 0 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines of metadata/etcd left after Close:\n%s", n, buf[:runtime.Stack(buf, true)])
	}
}

// ownGoroutines counts goroutines running code of package metadata/etcd
// (not its tests).
func ownGoroutines() int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "ringkeeper/metadata/etcd.(") || strings.Contains(g, "ringkeeper/metadata/etcd.func") {
			if !strings.Contains(g, "etcd_test.") {
				n++
			}
		}
	}
	return n
}
