package dlog

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// TestTruncateInsideTheWritersNextEntry: a truncation point at a slot past 0 of the entry the
// writer sends next is past what it has written too: the records of that entry, written and
// acknowledged after the truncation, would lie before the point and be hidden from readers.
func TestTruncateInsideTheWritersNextEntry(t *testing.T) {
	c := clustertest.Start(t, 3)
	ns := newNamespace(t, newClient(t, c), testConfig())
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "tnext")
	defer w.Close(ctx)
	if _, err := w.Write(ctx, Record{TxID: 1, Payload: payloadFor(1, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil { // the control entry is acknowledged: nothing in flight
		t.Fatal(err)
	}
	w.mu.Lock()
	seq, next := w.seg.meta.SeqNo, w.seg.nextEntry
	w.mu.Unlock()
	point := DLSN{SegmentSeqNo: seq, EntryID: next, SlotID: 1}
	if err := w.Truncate(ctx, point); !errors.Is(err, ErrTruncateBeyondEnd) {
		t.Errorf("truncate at %s with the writer's next entry %d: %v, want ErrTruncateBeyondEnd", point.Text(), next, err)
	}
	d2, err := w.Write(ctx, Record{TxID: 2, Payload: payloadFor(2, 10)})
	if err != nil {
		t.Fatal(err)
	}
	if d2 != (DLSN{SegmentSeqNo: seq, EntryID: next}) {
		t.Fatalf("tx 2 at %s, want %d/%d/0", d2.Text(), seq, next)
	}
	if _, err := w.Write(ctx, Record{TxID: 3, Payload: payloadFor(3, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rec, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec.TxID > 2 {
		t.Fatalf("the head reader starts at tx %d (%s): acknowledged tx 2 at %s is hidden", rec.TxID, rec.DLSN.Text(), d2.Text())
	}
	if r2, err := l.OpenReader(ctx, AtDLSN(d2)); err != nil {
		t.Fatalf("a reader at acknowledged tx 2's %s: %v", d2.Text(), err)
	} else {
		r2.Close()
	}
}

// envelope builds a data entry of the given records (payloadFor(tx, 10) each).
func envelope(recordsBefore, firstTxID int64, txIDs ...int64) []byte {
	buf := make([]byte, envelopeHeaderSize)
	for _, tx := range txIDs {
		buf = appendRecord(buf, tx, payloadFor(tx, 10))
	}
	sealEnvelope(buf, entryHeader{count: len(txIDs), recordsBefore: recordsBefore, firstTxID: firstTxID, lastTxID: txIDs[len(txIDs)-1]})
	return buf
}

// TestReaderDoesNotSkipAnEntryOutOfOrder: an entry whose transaction ids go back (appended to
// the in-progress segment's ledger behind the writer's back, a valid envelope otherwise) is
// ErrCorrupt, also when the reader decoded records before it in the same read: those come
// first, then the error, every time; the reader must not go on past the entry.
func TestReaderDoesNotSkipAnEntryOutOfOrder(t *testing.T) {
	const n = 5
	ctx, r := readerPastRecords(t, "backwards", n, 10,
		envelope(n, 1, 3),    // back to tx 3
		envelope(n+1, 1, 10), // a valid entry after it
		envelope(n+2, 1, 11), // carries the previous one in its LAC
	)
	for i := range 2 {
		if rec, err := r.Next(ctx); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Next %d at the entry going back to tx 3: tx %d (%s), %v; want ErrCorrupt", i+1, rec.TxID, rec.DLSN.Text(), err)
		}
	}
}

// TestTailingReaderFollowsFailover: a reader caught up in the first writer's in-progress segment
// goes on through the takeover: the second writer recovers that segment (keeping the records
// acknowledged after the reader caught up, which may not have reached readers through a
// last-add-confirmed), completes it and writes its own. The reader returns every record once,
// in order, at its acknowledged position, and none of the old writer's after the takeover.
func TestTailingReaderFollowsFailover(t *testing.T) {
	c := clustertest.Start(t, 3)
	cfg := testConfig()
	ns1, ns2 := newNamespace(t, newClient(t, c), cfg), newNamespace(t, newClient(t, c), cfg)
	ns1.ignoreLockLoss = true // the first writer is abandoned, not stopped
	ctx := ctxFor(t, 60*time.Second)
	const size = 30
	l1, w1 := createWriting(t, ctx, ns1, "failover-tail")
	a := newAcks()
	write := func(w *Writer, from, to int64) {
		for tx := from; tx <= to; tx++ {
			w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, size)}, a.callback(tx))
		}
	}
	write(w1, 1, 50)
	if err := w1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := l1.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	readN(t, ctx, r, 50, size, a.byTx)
	// More records, acknowledged, with no flush: the last ones' entry may not be covered by a
	// last-add-confirmed the reader can read.
	write(w1, 51, 120)
	a.wg.Wait()
	if len(a.failed) > 0 {
		t.Fatalf("first writer: %d records failed", len(a.failed))
	}
	revokeLocks(t, c.MetadataURI())
	l2, err := ns2.OpenLog(ctx, "failover-tail")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := l2.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if w2.LastTxID() != 120 {
		t.Fatalf("second writer's last txid %d, want 120", w2.LastTxID())
	}
	// The old writer is fenced.
	if _, err := w1.Write(ctx, Record{TxID: 121, Payload: payloadFor(121, size)}); !errors.Is(err, ErrFenced) {
		t.Fatalf("old writer after the takeover: %v, want ErrFenced", err)
	}
	write(w2, 200, 260)
	if err := w2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a.wg.Wait()
	if len(a.failed) > 0 {
		t.Fatalf("second writer: %d records failed", len(a.failed))
	}
	got := readN(t, ctx, r, 70+61, size, a.byTx)
	for i, rec := range got {
		want := int64(51 + i)
		if i >= 70 {
			want = int64(200 + i - 70)
		}
		if rec.TxID != want {
			t.Fatalf("record %d after the first 50: tx %d, want %d", i, rec.TxID, want)
		}
	}
	if got[69].DLSN.SegmentSeqNo != 1 || got[70].DLSN.SegmentSeqNo != 2 {
		t.Fatalf("tx 120 at %s, tx 200 at %s", got[69].DLSN.Text(), got[70].DLSN.Text())
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if rec, err := r.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a record past tx 260: tx %d, %v", rec.TxID, err)
	}
	if err := w2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	w1.Close(ctx)
}

// TestRecordsCompleteInOrderWhenTheWriterFails: records complete in the order they were
// written, also when the writer fails with an entry in flight: the records it had not sent
// fail only after the in-flight entry's records have completed (here the first in-flight
// record's callback waits a while for a later record's, which must not come).
func TestRecordsCompleteInOrderWhenTheWriterFails(t *testing.T) {
	c := clustertest.Start(t, 3)
	cfg := testConfig()
	cfg.PeriodicFlushFrequency = time.Hour // a record written while one is in flight waits
	cfg.OutputBufferSize = 64 << 10
	ns := newNamespace(t, newClient(t, c), cfg)
	ctx := ctxFor(t, 30*time.Second)
	_, w := createWriting(t, ctx, ns, "order")
	defer w.Close(ctx)
	entered, release := make(chan struct{}), make(chan struct{})
	// Record 1's callback holds the client's delivery of later acknowledgements.
	w.WriteAsync(ctx, Record{TxID: 1, Payload: payloadFor(1, 10)}, func(_ DLSN, err error) {
		close(entered)
		<-release
	})
	<-entered
	var mu sync.Mutex
	var order []int64
	third := make(chan struct{})
	w.WriteAsync(ctx, Record{TxID: 2, Payload: payloadFor(2, 10)}, func(_ DLSN, err error) {
		select {
		case <-third: // the later record completed first
		case <-time.After(time.Second):
		}
		mu.Lock()
		order = append(order, 2)
		mu.Unlock()
	})
	// Record 2 is sent (nothing else carries records); wait until it is in flight.
	for {
		w.mu.Lock()
		sent := w.dataInFlight == 1 && w.open == nil
		w.mu.Unlock()
		if sent {
			break
		}
		time.Sleep(time.Millisecond)
	}
	w.WriteAsync(ctx, Record{TxID: 3, Payload: payloadFor(3, 10)}, func(_ DLSN, err error) {
		if err == nil {
			t.Error("record 3 acknowledged after the writer failed")
		}
		mu.Lock()
		order = append(order, 3)
		mu.Unlock()
		close(third)
	})
	errStop := errors.New("test: the writer stops")
	w.fail(errStop) // as a lost lock does, with record 2 in flight and record 3 not sent
	close(release)
	<-third
	w.Close(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 2 || order[0] != 2 {
		t.Fatalf("records completed in the order %v, want [2 3]", order)
	}
}

// TestReaderOfADeletedLogDoesNotReadItsSuccessor: a reader of a log that is deleted and
// created again under the same name fails; it must not go on into the new log's segments (here
// it would skip the new log's first segment and return the second's records as the old log's).
func TestReaderOfADeletedLogDoesNotReadItsSuccessor(t *testing.T) {
	c := clustertest.Start(t, 3)
	ns := newNamespace(t, newClient(t, c), testConfig())
	ctx := ctxFor(t, 30*time.Second)
	writeAndClose := func(l *Log, txIDs ...int64) {
		t.Helper()
		w, err := l.OpenWriter(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tx := range txIDs {
			if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l, err := ns.CreateLog(ctx, "again")
	if err != nil {
		t.Fatal(err)
	}
	writeAndClose(l, 1, 2, 3)
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	readN(t, ctx, r, 3, 10, nil)
	if err := ns.DeleteLog(ctx, "again"); err != nil {
		t.Fatal(err)
	}
	l2, err := ns.CreateLog(ctx, "again")
	if err != nil {
		t.Fatal(err)
	}
	writeAndClose(l2, 4, 5) // segment 1
	writeAndClose(l2, 6, 7) // segment 2
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if rec, err := r.Next(short); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the deleted log's reader: tx %d at %s, %v; want an error", rec.TxID, rec.DLSN.Text(), err)
	} else {
		t.Logf("the deleted log's reader: %v", err)
	}
}

// TestSegmentLedgerMismatchStaysAnError: a completed segment whose ledger ends elsewhere than
// the segment says is ErrCorrupt at every Next, not only the first: the reader used to take
// the segment before checking it and read on past the mismatch at the next call.
func TestSegmentLedgerMismatchStaysAnError(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	ns := newNamespace(t, cl, testConfig())
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "mismatch")
	for tx := int64(1); tx <= 20; tx++ {
		if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)}); err != nil {
			t.Fatal(err)
		}
		if tx%5 == 0 {
			if err := w.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	segs, err := l.Segments(ctx)
	if err != nil || len(segs) != 1 || segs[0].State != Completed || segs[0].LastEntryID < 1 {
		t.Fatalf("segments %+v, %v: want one completed segment of several entries", segs, err)
	}
	s := segs[0]
	s.LastEntryID-- // the segment now ends one entry before its ledger
	if _, err := ns.kv.Commit(ctx, nil, metadata.Put(segmentKey(l.name, s.SeqNo), encodeSegment(&s), s.version)); err != nil {
		t.Fatal(err)
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range 3 {
		if rec, err := r.Next(ctx); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Next %d on a segment that ends before its ledger: tx %d, %v; want ErrCorrupt", i+1, rec.TxID, err)
		}
	}
}

// TestConcurrentCloseWaitsForTheFirst: a Close while another runs returns only once the first
// has finished (the segment completed), with its result; it used to return nil at once.
func TestConcurrentCloseWaitsForTheFirst(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	ns := newNamespace(t, cl, testConfig())
	ctx := ctxFor(t, 30*time.Second)
	l, w := createWriting(t, ctx, ns, "closes")
	for tx := int64(1); tx <= 50; tx++ {
		if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 100)}); err != nil {
			t.Fatal(err)
		}
	}
	first := make(chan error, 1)
	go func() { first <- w.Close(ctx) }()
	for closing := false; !closing; {
		w.mu.Lock()
		closing = w.closed
		w.mu.Unlock()
		runtime.Gosched()
	}
	if err := w.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	segs, err := l.Segments(ctx)
	if err != nil || len(segs) != 1 || segs[0].State != Completed {
		t.Fatalf("after the second Close returned: segments %+v, %v; want the segment completed", segs, err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first Close: %v", err)
	}
}
