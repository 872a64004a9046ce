package dlog

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

// TestTailingReaderLatency: a reader at the tail sees each record within the poll interval
// (plus a few round trips) of its acknowledgement, records written one at a time with pauses,
// so that each one waits for a control entry and a poll.
func TestTailingReaderLatency(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	cfg := testConfig()
	const interval = 50 * time.Millisecond
	cfg.TailPollInterval = interval
	ns := newNamespace(t, cl, cfg)
	ctx := ctxFor(t, 30*time.Second)
	l, err := ns.CreateLog(ctx, "tail")
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	r, err := l.OpenReader(ctx, Tail())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const n = 30
	var mu sync.Mutex // guards acked: the reader learns of a record through the bookies, which the race detector cannot see
	acked := make([]time.Time, n)
	seen := make(chan time.Duration, n)
	go func() {
		for i := range n {
			rec, err := r.Next(ctx)
			if err != nil || rec.TxID != int64(i+1) {
				t.Errorf("record %d: tx %d, %v", i, rec.TxID, err)
				close(seen)
				return
			}
			mu.Lock()
			seen <- time.Since(acked[i]) // acked[i] is set before the record is written
			mu.Unlock()
		}
		close(seen)
	}()
	for i := range n {
		tx := int64(i + 1)
		// acked[i] is set just before the write: the reader measures from then.
		mu.Lock()
		acked[i] = time.Now()
		mu.Unlock()
		if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 100)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%7) * 10 * time.Millisecond)
	}
	var lat []time.Duration
	for d := range seen {
		lat = append(lat, d)
	}
	if len(lat) != n {
		t.Fatalf("saw %d of %d records", len(lat), n)
	}
	slices.Sort(lat)
	t.Logf("write-to-read latency with a %v poll: min %v median %v max %v", interval, lat[0], lat[n/2], lat[n-1])
	// The bound: the poll interval, plus the write, the control entry, the LAC read and the
	// entry read (a few milliseconds here), plus slack for a loaded test machine.
	if bound := interval + 150*time.Millisecond; lat[n-1] > bound {
		t.Fatalf("a record took %v to reach the tailing reader (bound %v)", lat[n-1], bound)
	}
}
