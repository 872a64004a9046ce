package client

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/cluster"
	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestEntryOverTheBookiesFrameLimit (BookKeeper #2357, reliability.md §5 item 22): the
// client's frame limit (5 MiB) is above the bookies' (1 MiB), and it appends an entry that
// fits its own limit but not theirs. That add must fail with ErrEntryTooLarge, without an
// ensemble change; the entries acknowledged before stay readable and the ledger closes at its
// LAC; another ledger's adds, in flight on the same connections, must succeed, and that
// ledger must not change its ensemble.
func TestEntryOverTheBookiesFrameLimit(t *testing.T) {
	const bookieFrame = 1 << 20
	c, err := cluster.Start(context.Background(), cluster.Config{
		DataDir: t.TempDir(), Bookies: 4, UnsafeNoFsync: true,
		Bookie: func(i int, cfg *bookie.Config) {
			clustertest.SmallBookie(i, cfg)
			cfg.Server.MaxFrameSize = bookieFrame
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	cl := newClient(t, c, nil)
	ctx := context.Background()
	big := createLedger(t, cl, 3, 3, 2)
	other := createLedger(t, cl, 4, 3, 2) // on every bookie: shares each of big's connections
	appendN(t, big, 3)

	var wg sync.WaitGroup
	const n = 200
	for i := range n {
		if i == n/2 {
			wg.Add(1)
			big.AppendAsync(bytes.Repeat([]byte{'x'}, 2*bookieFrame), func(id int64, err error) {
				defer wg.Done()
				if !errors.Is(err, ErrEntryTooLarge) {
					t.Errorf("oversize append: id %d, %v; want ErrEntryTooLarge", id, err)
				}
			})
		}
		wg.Add(1)
		other.AppendAsync(payload(other.ID(), int64(i)), func(id int64, err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("other ledger's append %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	t.Logf("big: %+v", big.Metadata().Ensembles)
	t.Logf("other: %+v", other.Metadata().Ensembles)
	if got := len(big.Metadata().Ensembles); got != 1 {
		t.Errorf("the oversize entry changed its ledger's ensemble: %+v", big.Metadata().Ensembles)
	}
	if got := len(other.Metadata().Ensembles); got != 1 {
		t.Errorf("the oversize entry changed another ledger's ensemble: %+v", other.Metadata().Ensembles)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := big.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if md := big.Metadata(); md.LastEntryID != 2 {
		t.Fatalf("closed at %d, want 2 (the entries acknowledged before)", md.LastEntryID)
	}
	checkEntries(t, big, 2)
	if err := other.Close(cctx); err != nil {
		t.Fatal(err)
	}
	checkEntries(t, other, n-1)
}
