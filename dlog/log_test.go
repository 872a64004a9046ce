package dlog

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/cluster/clustertest"
)

func TestNamespaceLogs(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	ns := newNamespace(t, cl, testConfig())
	ctx := ctxFor(t, 30*time.Second)

	for _, name := range []string{"b", "a", "a.b", "c-1"} {
		if _, err := ns.CreateLog(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ns.CreateLog(ctx, "a"); !errors.Is(err, ErrLogExists) {
		t.Fatalf("create twice: %v", err)
	}
	if _, err := ns.CreateLog(ctx, "x/y"); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := ns.OpenLog(ctx, "nope"); !errors.Is(err, ErrNoSuchLog) {
		t.Fatalf("open missing: %v", err)
	}
	names, err := ns.ListLogs(ctx)
	if err != nil || !slices.Equal(names, []string{"a", "a.b", "b", "c-1"}) {
		t.Fatalf("list: %v %v", names, err)
	}

	// A log with data: written, closed, deleted with its ledgers.
	l, err := ns.OpenLog(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for tx := int64(1); tx <= 10; tx++ {
		if _, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 20)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	segs, err := l.Segments(ctx)
	if err != nil || len(segs) != 1 || segs[0].State != Completed || segs[0].RecordCount != 10 ||
		segs[0].FirstTxID != 1 || segs[0].LastTxID != 10 {
		t.Fatalf("segments %+v %v", segs, err)
	}
	if last, _ := l.LastTxID(ctx); last != 10 {
		t.Fatalf("last txid %d", last)
	}
	if err := ns.DeleteLog(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.LedgerMetadata(ctx, segs[0].LedgerID); err == nil {
		t.Fatal("the deleted log's ledger is still there")
	}
	if ok, err := ns.LogExists(ctx, "a"); ok || err != nil {
		t.Fatalf("exists after delete: %v %v", ok, err)
	}
	if _, err := ns.CreateLog(ctx, "a"); err != nil {
		t.Fatalf("create again: %v", err)
	}
	if err := ns.DeleteLog(ctx, "zz"); !errors.Is(err, ErrNoSuchLog) {
		t.Fatalf("delete missing: %v", err)
	}
}

func TestWriterRules(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	ns := newNamespace(t, cl, testConfig())
	ctx := ctxFor(t, 30*time.Second)
	l, err := ns.CreateLog(ctx, "rules")
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := w.Write(ctx, Record{TxID: 5, Payload: []byte("five")})
	if err != nil || d != InitialDLSN {
		t.Fatalf("first write at %s: %v", d.Text(), err)
	}
	for _, tx := range []int64{5, 4, -1} {
		if _, err := w.Write(ctx, Record{TxID: tx}); !errors.Is(err, ErrTxIDNotIncreasing) {
			t.Fatalf("txid %d after 5: %v", tx, err)
		}
	}
	if _, err := w.Write(ctx, Record{TxID: 9, Payload: make([]byte, MaxRecordSize+1)}); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("large record: %v", err)
	}
	// The writer is still usable; a record of the largest size goes through.
	if _, err := w.Write(ctx, Record{TxID: 6, Payload: make([]byte, MaxRecordSize)}); err != nil {
		t.Fatal(err)
	}
	// A second writer waits for the first.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = l.OpenWriter(short)
	cancel()
	if err == nil {
		t.Fatal("a second writer opened while the first is open")
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, Record{TxID: 7}); !errors.Is(err, ErrWriterClosed) {
		t.Fatalf("write after close: %v", err)
	}
	// The next writer continues after the last txid.
	w2, err := l.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if w2.LastTxID() != 6 {
		t.Fatalf("second writer's last txid %d", w2.LastTxID())
	}
	if _, err := w2.Write(ctx, Record{TxID: 6}); !errors.Is(err, ErrTxIDNotIncreasing) {
		t.Fatalf("second writer, txid 6: %v", err)
	}
	d, err = w2.Write(ctx, Record{TxID: 7, Payload: []byte("seven")})
	if err != nil || d.SegmentSeqNo != 2 {
		t.Fatalf("second writer's record at %s: %v", d.Text(), err)
	}
	if err := w2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, want := range []int64{5, 6, 7} {
		rec, err := r.Next(ctx)
		if err != nil || rec.TxID != want {
			t.Fatalf("read %d: %v", rec.TxID, err)
		}
	}
}

// TestWriteReadAcrossRolls writes 100k records through several segment rolls, then reads them
// back from the head, from a DLSN in the middle, by transaction id, and at the tail.
func TestWriteReadAcrossRolls(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	cfg := testConfig()
	cfg.MaxLogSegmentBytes = 1 << 20
	cfg.OutputBufferSize = 8 << 10
	ns := newNamespace(t, cl, cfg)
	ctx := ctxFor(t, 60*time.Second)
	l, err := ns.CreateLog(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 100_000, 50
	a := newAcks()
	start := time.Now()
	for i := range int64(n) {
		tx := 1000 + 3*i // increasing, not contiguous
		w.WriteAsync(ctx, Record{TxID: tx, Payload: payloadFor(tx, size)}, a.callback(tx))
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a.wg.Wait()
	t.Logf("wrote %d records in %v", n, time.Since(start))
	if len(a.failed) > 0 || len(a.byTx) != n {
		t.Fatalf("%d acknowledged, %d failed", len(a.byTx), len(a.failed))
	}
	segs, err := l.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) < 4 {
		t.Fatalf("only %d segments", len(segs))
	}
	total := int64(0)
	for _, s := range segs[:len(segs)-1] {
		if s.State != Completed {
			t.Fatalf("segment %+v", s)
		}
		total += s.RecordCount
	}
	t.Logf("%d segments; %d records in completed ones", len(segs), total)

	// From the head: everything, at the acknowledged positions, then a tailing wait.
	start = time.Now()
	r, err := l.OpenReader(ctx, Head())
	if err != nil {
		t.Fatal(err)
	}
	all := readN(t, ctx, r, n, size, a.byTx)
	t.Logf("read %d records in %v", n, time.Since(start))
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if rec, err := r.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read past the end: %+v %v", rec, err)
	}
	cancel()
	r.Close()
	if _, err := r.Next(ctx); !errors.Is(err, ErrReaderClosed) {
		t.Fatalf("next after close: %v", err)
	}

	// From a DLSN in the middle (a slot inside an entry), and by a txid between records.
	mid := all[n/2+7]
	r, err = l.OpenReader(ctx, AtDLSN(mid.DLSN))
	if err != nil {
		t.Fatal(err)
	}
	got := readN(t, ctx, r, n-(n/2+7), size, a.byTx)
	if got[0].TxID != mid.TxID {
		t.Fatalf("reader at %s starts at tx %d, want %d", mid.DLSN.Text(), got[0].TxID, mid.TxID)
	}
	r.Close()
	r, err = l.OpenReader(ctx, AtTxID(all[60_000].TxID-1))
	if err != nil {
		t.Fatal(err)
	}
	got = readN(t, ctx, r, n-60_000, size, a.byTx)
	if got[0].TxID != all[60_000].TxID {
		t.Fatalf("reader at txid %d starts at %d", all[60_000].TxID-1, got[0].TxID)
	}
	r.Close()

	// At the tail: only records written after it opened.
	r, err = l.OpenReader(ctx, Tail())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	last := all[n-1].TxID
	for i := int64(1); i <= 3; i++ {
		if _, err := w.Write(ctx, Record{TxID: last + i, Payload: payloadFor(last+i, size)}); err != nil {
			t.Fatal(err)
		}
	}
	got = readN(t, ctx, r, 3, size, nil)
	if got[0].TxID != last+1 {
		t.Fatalf("tail reader starts at tx %d, want %d", got[0].TxID, last+1)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRollByAgeAndImmediateFlush: a segment older than the rolling interval is rolled at the
// next write; with ImmediateFlush every record is its own entry.
func TestRollByAgeAndImmediateFlush(t *testing.T) {
	c := clustertest.Start(t, 3)
	cl := newClient(t, c)
	cfg := testConfig()
	cfg.LogSegmentRollingInterval = 100 * time.Millisecond
	cfg.ImmediateFlush = true
	ns := newNamespace(t, cl, cfg)
	ctx := ctxFor(t, 30*time.Second)
	l, err := ns.CreateLog(ctx, "age")
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.OpenWriter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var prev DLSN
	for tx := int64(1); tx <= 12; tx++ {
		d, err := w.Write(ctx, Record{TxID: tx, Payload: payloadFor(tx, 10)})
		if err != nil {
			t.Fatal(err)
		}
		if d.SlotID != 0 || !prev.Less(d) {
			t.Fatalf("record %d at %s after %s", tx, d.Text(), prev.Text())
		}
		prev = d
		time.Sleep(25 * time.Millisecond)
	}
	if err := w.Close(ctx); err != nil {
		t.Fatal(err)
	}
	segs, err := l.Segments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(segs) < 3 {
		t.Fatalf("%d segments after 300 ms with a 100 ms rolling interval", len(segs))
	}
	recs := readAll(t, ctx, l)
	if len(recs) != 12 {
		t.Fatalf("read %d records", len(recs))
	}
}
