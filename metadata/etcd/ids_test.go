package etcd_test

import (
	"errors"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/etcd"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

// TestConcurrentLedgerIDs: several clients, each with several goroutines,
// take ids at once with a small batch (so reservations collide); every id is
// unique, and each client's ids increase.
func TestConcurrentLedgerIDs(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 30*time.Second)
	const clients, goroutines, perGoroutine = 4, 4, 60
	var (
		mu   sync.Mutex
		seen = make(map[int64]int)
		wg   sync.WaitGroup
	)
	for c := 0; c < clients; c++ {
		d := open(t, uri, metadata.Options{IDBatchSize: 7})
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				last := int64(-1)
				for i := 0; i < perGoroutine; i++ {
					id, err := d.NewLedgerID(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					if id <= last {
						t.Errorf("ids from one client went back: %d after %d", id, last)
					}
					last = id
					mu.Lock()
					seen[id]++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if len(seen) != clients*goroutines*perGoroutine {
		for id, n := range seen {
			if n > 1 {
				t.Errorf("id %d handed out %d times", id, n)
			}
		}
		t.Fatalf("%d distinct ids, want %d", len(seen), clients*goroutines*perGoroutine)
	}
}

// TestLedgerIDsNeverReused: ids of deleted ledgers, and ids reserved by a
// closed client, are never handed out again.
func TestLedgerIDsNeverReused(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	a := open(t, uri)
	var maxID int64 = -1
	for i := 0; i < 5; i++ {
		id, v, err := metadata.CreateLedger(ctx, a, metadatatest.Ledger())
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Ledgers().Delete(ctx, id, v); err != nil {
			t.Fatal(err)
		}
		maxID = max(maxID, id)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := open(t, uri)
	id, err := b.NewLedgerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if id <= maxID {
		t.Fatalf("new client got id %d, but %d was already used", id, maxID)
	}
	if id < metadata.DefaultIDBatchSize {
		t.Fatalf("new client got id %d from the closed client's reserved batch", id)
	}
	// An explicit id in the way is skipped by CreateLedger.
	if _, err := b.Ledgers().Create(ctx, id+1, metadatatest.Ledger()); err != nil {
		t.Fatal(err)
	}
	got, _, err := metadata.CreateLedger(ctx, b, metadatatest.Ledger())
	if err != nil || got != id+2 {
		t.Fatalf("CreateLedger got %d (%v), want %d", got, err, id+2)
	}
}

// TestLedgerIDCounterNeverRestarts: a counter that does not parse fails
// NewLedgerID with ErrCorruptMetadata and is left alone (starting again from
// 0 would hand out ids already used), and a counter at the end of the id
// space hands out the last ids and then fails with ErrLedgerIDsExhausted.
func TestLedgerIDCounterNeverRestarts(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	u, err := metadata.ParseURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 20*time.Second)
	key := u.Root + "/idgen"
	cli := etcd.RawClient(open(t, uri))
	for _, bad := range []string{"garbage", "-5", "", "99999999999999999999"} {
		if _, err := cli.Put(ctx, key, bad); err != nil {
			t.Fatal(err)
		}
		if id, err := open(t, uri).NewLedgerID(ctx); !errors.Is(err, metadata.ErrCorruptMetadata) {
			t.Fatalf("counter %q: got id %d, err %v; want ErrCorruptMetadata", bad, id, err)
		}
		if resp, err := cli.Get(ctx, key); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != bad {
			t.Fatalf("counter %q was changed: %v %v", bad, resp, err)
		}
	}
	if _, err := cli.Put(ctx, key, strconv.FormatInt(math.MaxInt64-2, 10)); err != nil {
		t.Fatal(err)
	}
	d := open(t, uri)
	for _, want := range []int64{math.MaxInt64 - 2, math.MaxInt64 - 1} {
		if id, err := d.NewLedgerID(ctx); err != nil || id != want {
			t.Fatalf("got id %d (%v), want %d", id, err, want)
		}
	}
	if id, err := d.NewLedgerID(ctx); !errors.Is(err, metadata.ErrLedgerIDsExhausted) {
		t.Fatalf("past the last id: got %d, %v; want ErrLedgerIDsExhausted", id, err)
	}
}

// TestLedgerIDCounterLost: when the idgen key is lost while ledgers exist, the counter starts
// again above the largest existing ledger id: no id of a deleted ledger below it (bookies may
// still hold its entries and fencing state) is handed out again, and no id of an existing one.
func TestLedgerIDCounterLost(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	u, err := metadata.ParseURI(uri)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 20*time.Second)
	a := open(t, uri)
	var created []int64
	for i := 0; i < 5; i++ {
		id, _, err := metadata.CreateLedger(ctx, a, metadatatest.Ledger())
		if err != nil {
			t.Fatal(err)
		}
		created = append(created, id)
	}
	// One deleted in the middle, and one made by a tool with an explicit id.
	_, v, err := a.Ledgers().Read(ctx, created[2])
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Ledgers().Delete(ctx, created[2], v); err != nil {
		t.Fatal(err)
	}
	const explicit = 5000
	if _, err := a.Ledgers().Create(ctx, explicit, metadatatest.Ledger()); err != nil {
		t.Fatal(err)
	}
	cli := etcd.RawClient(a)
	if _, err := cli.Delete(ctx, u.Root+"/idgen"); err != nil {
		t.Fatal(err)
	}
	b := open(t, uri)
	got, _, err := metadata.CreateLedger(ctx, b, metadatatest.Ledger())
	if err != nil || got <= explicit {
		t.Fatalf("CreateLedger after the counter was lost: %d (%v), want above the largest ledger %d (deleted: %d)",
			got, err, explicit, created[2])
	}
	// A client that starts again (its reserved batch is gone) keeps above it too.
	got, err = open(t, uri).NewLedgerID(ctx)
	if err != nil || got <= explicit {
		t.Fatalf("NewLedgerID from another client: %d (%v), want above %d", got, err, explicit)
	}
	resp, err := cli.Get(ctx, u.Root+"/idgen")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("counter not written again: %v %v", resp, err)
	}
	if n, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64); err != nil || n <= got {
		t.Fatalf("counter %q, want above the last id handed out %d", resp.Kvs[0].Value, got)
	}
	// A key under the ledgers prefix that is not a ledger id leaves the start unknown:
	// refuse rather than guess.
	if _, err := cli.Put(ctx, u.Root+"/ledgers/not-a-ledger", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, u.Root+"/idgen"); err != nil {
		t.Fatal(err)
	}
	if id, err := open(t, uri).NewLedgerID(ctx); !errors.Is(err, metadata.ErrCorruptMetadata) {
		t.Fatalf("counter lost beside a stray key: got id %d, err %v; want ErrCorruptMetadata", id, err)
	}
}
