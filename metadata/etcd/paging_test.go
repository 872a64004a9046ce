package etcd_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/etcd"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

// bulkLoad writes n ledgers (ids 0..n-1) straight into etcd, 128 puts per
// transaction (etcd's default MaxTxnOps), from a few goroutines. Every
// ledger in which i%every == 0 has bookie "marked:1" in its ensemble.
func bulkLoad(t *testing.T, d metadata.Driver, n, every int) {
	t.Helper()
	plain, err := metadata.EncodeLedgerMetadata(metadatatest.Ledger("a:1", "b:1", "c:1"))
	if err != nil {
		t.Fatal(err)
	}
	marked, err := metadata.EncodeLedgerMetadata(metadatatest.Ledger("a:1", "marked:1", "c:1"))
	if err != nil {
		t.Fatal(err)
	}
	const opsPerTxn, writers = 128, 4
	cli := etcd.RawClient(d)
	batches := make(chan int, writers)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := range batches {
				ops := make([]clientv3.Op, 0, opsPerTxn)
				for id := start; id < min(start+opsPerTxn, n); id++ {
					v := plain
					if id%every == 0 {
						v = marked
					}
					ops = append(ops, clientv3.OpPut(etcd.LedgerKey(d, int64(id)), string(v)))
				}
				if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for start := 0; start < n; start += opsPerTxn {
		batches <- start
	}
	close(batches)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestPaging100k pages through 100,000 ledgers, keys only and with
// metadata, and finds the ledgers that contain a given bookie.
func TestPaging100k(t *testing.T) {
	t.Parallel()
	const n, page, every = 100_000, 1000, 97
	d := open(t, metadatatest.URI(t))
	ctx := ctxFor(t, 50*time.Second)
	start := time.Now()
	bulkLoad(t, d, n, every)
	t.Logf("wrote %d ledgers in %v", n, time.Since(start))

	start = time.Now()
	var next int64
	pages, total := 0, 0
	for {
		ids, more, err := d.Ledgers().List(ctx, next, page)
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if id != next+int64(i) {
				t.Fatalf("page %d: id %d at position %d, want %d", pages, id, i, next+int64(i))
			}
		}
		pages++
		total += len(ids)
		if !more {
			break
		}
		next = ids[len(ids)-1] + 1
	}
	if total != n || pages != n/page {
		t.Fatalf("listed %d ids in %d pages, want %d in %d", total, pages, n, n/page)
	}
	t.Logf("listed %d ids in %d pages in %v", total, pages, time.Since(start))

	start = time.Now()
	withBookie, err := metadata.LedgersWithBookie(ctx, d.Ledgers(), "marked:1")
	if err != nil {
		t.Fatal(err)
	}
	if want := (n + every - 1) / every; len(withBookie) != want {
		t.Fatalf("%d ledgers contain the bookie, want %d", len(withBookie), want)
	}
	for i, id := range withBookie {
		if id != int64(i*every) {
			t.Fatalf("ledger %d listed at %d, want %d", id, i, i*every)
		}
	}
	t.Logf("scanned %d ledgers' metadata in %v", n, time.Since(start))

	// A page in the middle, and past the end.
	ids, more, err := d.Ledgers().List(ctx, 54_321, 3)
	if err != nil || !more || fmt.Sprint(ids) != "[54321 54322 54323]" {
		t.Fatalf("middle page %v %v %v", ids, more, err)
	}
	ids, more, err = d.Ledgers().List(ctx, n, 10)
	if err != nil || more || len(ids) != 0 {
		t.Fatalf("past the end %v %v %v", ids, more, err)
	}
}

// TestForEachLedgerWhileLedgersChange: ledgers created and deleted while
// ForEachLedger pages through the store neither make it skip a ledger that
// exists throughout, nor visit one twice: it visits every ledger that
// outlives the listing once, in increasing id order, also those created
// ahead of it, and none deleted before it got there.
func TestForEachLedgerWhileLedgersChange(t *testing.T) {
	t.Parallel()
	d := open(t, metadatatest.URI(t))
	ls := d.Ledgers()
	ctx := ctxFor(t, 20*time.Second)
	versions := map[int64]metadata.Version{}
	create := func(id int64) {
		t.Helper()
		v, err := ls.Create(ctx, id, metadatatest.Ledger())
		if err != nil {
			t.Fatal(err)
		}
		versions[id] = v
	}
	const n = 60 // even ids 0..2n-2 exist at the start
	for id := int64(0); id < 2*n; id += 2 {
		create(id)
	}
	deleted := map[int64]bool{}
	var visited []int64
	err := metadata.ForEachLedger(ctx, ls, 3, func(l metadata.VersionedLedger) error {
		if len(visited) > 0 && l.ID <= visited[len(visited)-1] {
			return fmt.Errorf("visited %d after %d", l.ID, visited[len(visited)-1])
		}
		visited = append(visited, l.ID)
		if l.Version != versions[l.ID] {
			return fmt.Errorf("ledger %d at version %d, want %d", l.ID, l.Version, versions[l.ID])
		}
		if l.ID >= 2*n {
			return nil // one created ahead
		}
		// Behind the listing: a new ledger with an odd id (another client's
		// id batch), and the deletion of one already visited.
		if l.ID > 0 {
			create(l.ID - 1)
		}
		if l.ID >= 4 && !deleted[l.ID-4] {
			if err := ls.Delete(ctx, l.ID-4, versions[l.ID-4]); err != nil {
				return err
			}
			deleted[l.ID-4] = true
		}
		// Ahead of it, beyond the page it holds (3 ids span 6): a deletion
		// and a creation.
		if ahead := l.ID + 10; ahead < 2*n && ahead%4 == 2 && !deleted[ahead] {
			if err := ls.Delete(ctx, ahead, versions[ahead]); err != nil {
				return err
			}
			deleted[ahead] = true
		}
		create(1000 + l.ID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, id := range visited {
		seen[id] = true
	}
	for id := int64(0); id < 2*n; id += 2 {
		aheadDeleted := id >= 10 && id%4 == 2 // deleted by the visit of id-10
		switch {
		case aheadDeleted && seen[id]:
			t.Errorf("ledger %d, deleted before the listing got there, was visited", id)
		case !aheadDeleted && !seen[id]:
			t.Errorf("ledger %d, which existed when the listing got there, was skipped", id)
		}
		if !aheadDeleted && !seen[1000+id] {
			t.Errorf("ledger %d, created ahead of the listing, was skipped", 1000+id)
		}
	}
	for _, id := range visited {
		if id%2 == 1 && id < 2*n {
			t.Errorf("ledger %d, created behind the listing, was visited", id)
		}
	}
}
