package dlog

import (
	"errors"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestDeleteLogFencesAbandonedWriter: DeleteLog fences the segment of a writer that lost its
// lock without noticing (a long pause), as a new writer would: its appends fail from then on.
// They used to be acknowledged, into the ledger of a deleted log.
func TestDeleteLogFencesAbandonedWriter(t *testing.T) {
	c := clustertest.Start(t, 3)
	cfg := testConfig()
	ns1, ns2 := newNamespace(t, newClient(t, c), cfg), newNamespace(t, newClient(t, c), cfg)
	ns1.ignoreLockLoss = true // the writer does not notice its lock going
	ctx := ctxFor(t, 60*time.Second)
	_, w := createWriting(t, ctx, ns1, "failover-delw")
	defer w.Close(ctx)
	if _, err := w.Write(ctx, Record{TxID: 1, Payload: payloadFor(1, 10)}); err != nil {
		t.Fatal(err)
	}
	revokeLocks(t, c.MetadataURI())
	if err := ns2.DeleteLog(ctx, "failover-delw"); err != nil {
		t.Fatal(err)
	}
	for tx := int64(2); tx <= 3; tx++ {
		if d, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}); !errors.Is(err, ErrFenced) {
			t.Fatalf("write of tx %d after the delete: at %s, %v; want ErrFenced", tx, d.Text(), err)
		}
	}
}
