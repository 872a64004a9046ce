package client

import (
	"context"
	"errors"
	"testing"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestWriteAfterDeleteFails replays BookKeeper #4462: a second client opens the ledger with
// recovery (fencing it) and deletes it while the writer is idle; the writer's next append must
// fail with a clear error, also after the bookies have garbage-collected the ledger (then they
// no longer hold its fence: the add would create the ledger anew and be acknowledged, though
// nothing can ever read it), and also after they restarted since (BookKeeper's fix remembers
// the fenced deletion in memory only: a restarted bookie acknowledges the add).
func TestWriteAfterDeleteFails(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		collected, restarted bool
	}{
		{"before GC", false, false},
		{"after GC", true, false},
		{"after GC and restart", true, true},
	} {
		collected := tc.collected
		t.Run(tc.name, func(t *testing.T) {
			c := clustertest.Start(t, 3)
			ctx := context.Background()
			w := newClient(t, c, nil)
			lh := createLedger(t, w, 3, 3, 2)
			appendN(t, lh, 3)
			other := newClient(t, c, nil)
			if _, err := other.OpenLedger(ctx, lh.ID(), password, true); err != nil {
				t.Fatal(err)
			}
			if err := other.DeleteLedger(ctx, lh.ID()); err != nil {
				t.Fatal(err)
			}
			if collected {
				for i := range c.Size() {
					eng := c.Bookie(i).Engine()
					if err := eng.RunGC(ctx, nil); err != nil {
						t.Fatal(err)
					}
					if eng.Exists(lh.ID()) {
						t.Fatalf("bookie %d still holds the deleted ledger after GC", i)
					}
					// The first checkpoint commits the deletion, the second frees the id.
					for range 2 {
						if err := eng.Checkpoint(); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			if tc.restarted {
				for i := range c.Size() {
					if err := c.StopBookie(ctx, i); err != nil {
						t.Fatal(err)
					}
					if err := c.StartBookie(ctx, i); err != nil {
						t.Fatal(err)
					}
				}
			}
			id, err := lh.Append(ctx, payload(lh.ID(), 3))
			if err == nil {
				t.Fatalf("entry %d was acknowledged to the writer of a deleted ledger: nothing can read it", id)
			}
			if !errors.Is(err, ErrLedgerFenced) && !errors.Is(err, ErrNoSuchLedger) {
				t.Fatalf("append after the ledger was deleted: %v, want ErrLedgerFenced or ErrNoSuchLedger", err)
			}
		})
	}
}
