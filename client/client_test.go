package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
)

var password = []byte("secret")

func payload(ledger, entry int64) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%d:%d;", ledger, entry)), 1+int(entry%7))
}

// appendN appends n entries and returns the ids acknowledged.
// createLedger creates a ledger of (ensemble, write quorum, ack quorum) with the test password.
func createLedger(t testing.TB, cl *Client, ensemble, writeQuorum, ackQuorum int) *Ledger {
	t.Helper()
	lh, err := cl.CreateLedger(context.Background(), CreateOptions{EnsembleSize: ensemble, WriteQuorum: writeQuorum,
		AckQuorum: ackQuorum, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	return lh
}

func appendN(t *testing.T, lh *Ledger, n int) {
	t.Helper()
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		id, err := lh.Append(ctx, payload(lh.ID(), int64(i)))
		cancel()
		if err != nil || id != int64(i) {
			lh.mu.Lock()
			for _, op := range lh.pending {
				t.Logf("pending op %d acked %b count %d completed %v outstanding %d ens %v", op.entryID, op.acked, op.ackCount, op.completed, op.outstanding, op.ensemble)
			}
			t.Logf("lac %d next %d changing %v err %v", lh.lac, lh.nextEntry, lh.changing, lh.err)
			lh.mu.Unlock()
			t.Fatalf("append %d: id %d, %v", i, id, err)
		}
	}
}

func checkEntries(t *testing.T, lh *Ledger, last int64) {
	t.Helper()
	entries, err := lh.Read(context.Background(), 0, last)
	if err != nil {
		t.Fatalf("read 0..%d: %v", last, err)
	}
	if int64(len(entries)) != last+1 {
		t.Fatalf("read %d entries, want %d", len(entries), last+1)
	}
	for i, e := range entries {
		if e.EntryID != int64(i) || !bytes.Equal(e.Payload, payload(lh.ID(), int64(i))) {
			t.Fatalf("entry %d: id %d, payload %q", i, e.EntryID, e.Payload)
		}
	}
}

func TestWriteCloseOpenReadAtEveryQuorum(t *testing.T) {
	c := clustertest.Start(t, 5)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	for _, q := range [][3]int{{1, 1, 1}, {3, 3, 2}, {3, 2, 2}, {5, 3, 2}} {
		t.Run(fmt.Sprint(q), func(t *testing.T) {
			for _, digest := range []DigestType{DigestCRC32C, DigestCRC32, DigestHMAC, DigestDummy} {
				lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: q[0], WriteQuorum: q[1], AckQuorum: q[2], Digest: digest, Password: password})
				if err != nil {
					t.Fatal(err)
				}
				t.Log("digest", digest, "ledger", lh.ID(), lh.Metadata().Ensembles)
				appendN(t, lh, 50)
				if lh.LastAddConfirmed() != 49 {
					t.Fatalf("LAC %d", lh.LastAddConfirmed())
				}
				checkEntries(t, lh, 49)
				if err := lh.Close(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := lh.Append(ctx, []byte("x")); !errors.Is(err, ErrLedgerClosed) {
					t.Fatalf("append after close: %v", err)
				}
				rh, err := cl.OpenLedger(ctx, lh.ID(), password, false)
				if err != nil {
					t.Fatal(err)
				}
				if md := rh.Metadata(); md.State != metadata.StateClosed || md.LastEntryID != 49 {
					t.Fatalf("metadata after close: %+v", md)
				}
				checkEntries(t, rh, 49)
				if _, err := cl.OpenLedger(ctx, lh.ID(), []byte("wrong"), false); !errors.Is(err, ErrUnauthorized) {
					t.Fatalf("open with wrong password: %v", err)
				}
			}
		})
	}
}

func TestPipelinedAsyncAppendsCompleteInOrder(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c, nil)
	lh, err := cl.CreateLedger(context.Background(), CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	const n = 5000
	var wg sync.WaitGroup
	wg.Add(n)
	var mu sync.Mutex
	next := int64(0)
	for i := range n {
		lh.AppendAsync(payload(lh.ID(), int64(i)), func(id int64, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil || id != next {
				t.Errorf("completion %d: %v, expected %d", id, err, next)
			}
			next++
		})
	}
	wg.Wait()
	if err := lh.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkEntries(t, lh, n-1)
}

// TestAppendFromCallback: callbacks that send the next append (a pipeline kept full from its
// completions) run one at a time, in entry order, and never deadlock against deliveries from
// the other bookies' connections (they once did: a callback held the delivery lock while
// AppendAsync waited for the ledger's lock, held by a connection waiting to deliver).
func TestAppendFromCallback(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c, nil)
	lh, err := cl.CreateLedger(context.Background(), CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	const n, chains = 5000, 100
	var issued atomic.Int64
	next := int64(0) // only callbacks touch it: they must not run concurrently (-race)
	// sentAs[id] is the payload index entry id was appended with: the starting goroutine and
	// the callbacks append concurrently, so the order of issued is not the order of entry ids.
	sentAs := make([]int64, n)
	done := make(chan struct{})
	var appendNext func()
	appendNext = func() {
		i := issued.Add(1) - 1
		if i >= n {
			return
		}
		lh.AppendAsync(payload(lh.ID(), i), func(id int64, err error) {
			if err != nil || id != next {
				t.Errorf("completion %d: %v, expected %d", id, err, next)
			} else {
				sentAs[id] = i
			}
			next++
			if next == n {
				close(done)
			}
			appendNext()
		})
	}
	go func() { // not on the test goroutine: a deadlock must be reported, not hang the test
		for range chains {
			appendNext()
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%d of %d appends completed in a minute: deadlocked", issued.Load()-chains, n)
	}
	if err := lh.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	entries, err := lh.Read(context.Background(), 0, n-1)
	if err != nil || len(entries) != n {
		t.Fatalf("read 0..%d: %d entries, %v", n-1, len(entries), err)
	}
	seen := make([]bool, n)
	for k, e := range entries {
		i := sentAs[k]
		if e.EntryID != int64(k) || seen[i] || !bytes.Equal(e.Payload, payload(lh.ID(), i)) {
			t.Fatalf("entry %d: id %d, payload %q, appended as payload %d (seen before: %v)", k, e.EntryID, e.Payload, i, seen[i])
		}
		seen[i] = true
	}
}

func TestBookieStoppedDuringWritesChangesEnsemble(t *testing.T) {
	c := clustertest.Start(t, 4)
	cl := newClient(t, c, nil)
	ctx := context.Background()
	lh, err := cl.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	victim := lh.Metadata().Ensembles[0].Bookies[1]
	var acked sync.Map
	var wg sync.WaitGroup
	const n = 2000
	for i := range n {
		if i == n/2 {
			for j, addr := range c.BookieAddrs() {
				if addr == victim {
					if err := c.StopBookie(ctx, j); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		wg.Add(1)
		lh.AppendAsync(payload(lh.ID(), int64(i)), func(id int64, err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("append %d: %v", i, err)
				return
			}
			acked.Store(id, true)
		})
		if i%100 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	md := lh.Metadata()
	if len(md.Ensembles) < 2 {
		t.Fatalf("no ensemble change after stopping %s: %+v", victim, md.Ensembles)
	}
	if last := md.Ensembles[len(md.Ensembles)-1]; md.ContainsBookie(victim) && containsStr(last.Bookies, victim) {
		t.Fatalf("the stopped bookie is still in the last ensemble: %v", last.Bookies)
	}
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rh, err := cl.OpenLedger(ctx, lh.ID(), password, true)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, rh, n-1)
}

func containsStr(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// TestSecondWriterFencesFirst: a second client opens the ledger with recovery while the first
// keeps writing. The first gets fenced errors; the closed ledger holds every entry the first
// had acknowledged and nothing past its last entry.
func TestSecondWriterFencesFirst(t *testing.T) {
	c := clustertest.Start(t, 3)
	w1 := newClient(t, c, nil)
	w2 := newClient(t, c, nil)
	ctx := context.Background()
	lh, err := w1.CreateLedger(ctx, CreateOptions{EnsembleSize: 3, WriteQuorum: 3, AckQuorum: 2, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	maxAcked := int64(-1)
	var fenced bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := int64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id, err := lh.Append(ctx, payload(lh.ID(), i))
			mu.Lock()
			if err == nil {
				maxAcked = max(maxAcked, id)
			} else if errors.Is(err, ErrLedgerFenced) {
				fenced = true
				mu.Unlock()
				return
			} else {
				t.Errorf("append: %v", err)
				mu.Unlock()
				return
			}
			mu.Unlock()
		}
	})
	time.Sleep(200 * time.Millisecond)
	rh, err := w2.OpenLedger(ctx, lh.ID(), password, true)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		mu.Lock()
		f := fenced
		mu.Unlock()
		if f {
			break
		}
		select {
		case <-deadline:
			close(stop)
			t.Fatal("the first writer was never fenced")
		case <-time.After(10 * time.Millisecond):
		}
	}
	wg.Wait()
	md := rh.Metadata()
	mu.Lock()
	defer mu.Unlock()
	if md.State != metadata.StateClosed || md.LastEntryID < maxAcked {
		t.Fatalf("closed at %d (%v) but the first writer had %d acknowledged", md.LastEntryID, md.State, maxAcked)
	}
	if md.LastEntryID > maxAcked+int64(2000) {
		t.Fatalf("closed at %d, far beyond the first writer's last add %d", md.LastEntryID, maxAcked)
	}
	checkEntries(t, rh, md.LastEntryID)
	if _, err := rh.Read(ctx, 0, md.LastEntryID+1); !errors.Is(err, ErrNoSuchEntry) {
		t.Fatalf("read past the end: %v", err)
	}
	if err := lh.Close(ctx); !errors.Is(err, ErrLedgerFenced) {
		t.Fatalf("close by the fenced writer: %v", err)
	}
}
