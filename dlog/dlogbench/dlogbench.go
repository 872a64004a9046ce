// Package dlogbench holds the distributed-log workloads of `ringkeeper bench dlog`: write
// (records per second through one log writer, with batching) and tail (append-to-read latency
// of readers following the writer). Their results are bench.Results, with the same JSON shape
// as every other workload.
//
// It lives beside package dlog rather than in package bench so that the bench harness does
// not depend on the log API and the log API does not depend on the harness.
package dlogbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/bench"
	"github.com/ringkeeper/ringkeeper/client"
	"github.com/ringkeeper/ringkeeper/cluster"
	"github.com/ringkeeper/ringkeeper/dlog"
)

// Options configures both workloads.
type Options struct {
	bench.Target
	// Ensemble, WriteQuorum and AckQuorum of the log's segments.
	Ensemble, WriteQuorum, AckQuorum int
	// RecordSize is the payload size of each record (at least 8 for tail: a time stamp).
	RecordSize int
	// Outstanding bounds the records written and not yet acknowledged.
	Outstanding int
	// InFlight is the writer's MaxInFlightEntries: ledger entries in flight.
	InFlight int
	// BufferSize is writerOutputBufferSize; FlushInterval is periodicFlushFrequency;
	// Immediate sends every record as its own entry (no batching).
	BufferSize    int
	FlushInterval time.Duration
	Immediate     bool
	// MaxSegmentBytes is maxLogSegmentBytes (rolls happen during the run when small).
	MaxSegmentBytes int64
	// Rate is records per second (open loop); 0 is closed loop (write) or 10000 (tail).
	Rate float64
	// Readers follow the log (tail only); PollInterval is their TailPollInterval.
	Readers      int
	PollInterval time.Duration
	Duration     time.Duration
	Warmup       time.Duration
	// Baseline also runs plain ledger appends of RecordSize-byte entries with InFlight in
	// flight on the same cluster, first, as Result.Baseline (write only).
	Baseline bool
	Progress io.Writer
}

// DefaultWriteOptions returns the defaults of `ringkeeper bench dlog write`.
func DefaultWriteOptions() Options {
	return Options{
		Target: bench.Target{Bookies: 3}, Ensemble: 3, WriteQuorum: 3, AckQuorum: 2, RecordSize: 100,
		Outstanding: 20000, InFlight: 1000, BufferSize: 16 << 10, FlushInterval: 2 * time.Millisecond,
		MaxSegmentBytes: dlog.DefaultMaxLogSegmentBytes, Readers: 1, PollInterval: time.Millisecond,
		Duration: 10 * time.Second,
	}
}

// DefaultTailOptions returns the defaults of `ringkeeper bench dlog tail`.
func DefaultTailOptions() Options {
	o := DefaultWriteOptions()
	o.Rate = 10000
	o.Outstanding = 1000
	return o
}

func (o Options) validate() error {
	if o.RecordSize < 0 || o.RecordSize > dlog.MaxRecordSize || o.Outstanding < 1 || o.InFlight < 1 ||
		o.Duration <= 0 || !(o.Rate >= 0) || o.Readers < 0 {
		return fmt.Errorf("bench: dlog: record size %d (0..%d), outstanding %d and in-flight %d (positive), duration %v, rate %v, readers %d",
			o.RecordSize, dlog.MaxRecordSize, o.Outstanding, o.InFlight, o.Duration, o.Rate, o.Readers)
	}
	return nil
}

func (o Options) config() map[string]any {
	return map[string]any{
		"metadata": o.MetadataURI, "standalone": o.Standalone, "bookies": o.Bookies, "ensemble": o.Ensemble,
		"write_quorum": o.WriteQuorum, "ack_quorum": o.AckQuorum, "record_size": o.RecordSize,
		"outstanding": o.Outstanding, "in_flight": o.InFlight, "buffer_size": o.BufferSize,
		"flush_interval_ms": float64(o.FlushInterval) / 1e6, "immediate": o.Immediate,
		"max_segment_bytes": o.MaxSegmentBytes, "rate": o.Rate, "readers": o.Readers,
		"poll_interval_ms": float64(o.PollInterval) / 1e6, "duration_s": o.Duration.Seconds(),
		"warmup_s": o.Warmup.Seconds(), "baseline": o.Baseline,
	}
}

// env is a connected target: a client, the cluster when standalone, and a namespace.
type env struct {
	cl      *client.Client
	ns      *dlog.Namespace
	cleanup func()
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func connect(ctx context.Context, o Options) (*env, error) {
	e := &env{cleanup: func() {}}
	uri := o.MetadataURI
	if o.Standalone {
		dir := o.DataDir
		if dir == "" {
			tmp, err := os.MkdirTemp("", "ringkeeper-bench-dlog-")
			if err != nil {
				return nil, err
			}
			dir = tmp
			e.cleanup = func() { os.RemoveAll(tmp) }
		}
		c, err := cluster.Start(ctx, cluster.Config{DataDir: dir, Bookies: max(o.Bookies, 1), Bookie: o.Bookie, Logger: quietLogger()})
		if err != nil {
			e.cleanup()
			return nil, err
		}
		uri = c.MetadataURI()
		prev := e.cleanup
		e.cleanup = func() { c.Close(context.Background()); prev() }
	}
	if uri == "" {
		e.cleanup()
		return nil, errors.New("bench: give --metadata URI or --standalone")
	}
	cl, err := o.Target.NewClient(ctx, uri)
	if err != nil {
		e.cleanup()
		return nil, err
	}
	prev := e.cleanup
	e.cleanup = func() { cl.Close(); prev() }
	e.cl = cl
	e.ns, err = dlog.NewNamespace(cl, dlog.Config{
		EnsembleSize: o.Ensemble, WriteQuorum: o.WriteQuorum, AckQuorum: o.AckQuorum,
		MaxLogSegmentBytes: o.MaxSegmentBytes, OutputBufferSize: o.BufferSize, PeriodicFlushFrequency: o.FlushInterval,
		ImmediateFlush: o.Immediate, MaxInFlightEntries: o.InFlight, TailPollInterval: o.PollInterval,
		Logger: quietLogger(),
	})
	if err != nil {
		e.cleanup()
		return nil, err
	}
	return e, nil
}

// newLog creates a log with a fresh name and opens its writer.
func (e *env) newLog(ctx context.Context) (*dlog.Log, *dlog.Writer, error) {
	name := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	l, err := e.ns.CreateLog(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	w, err := l.OpenWriter(ctx)
	if err != nil {
		return nil, nil, err
	}
	return l, w, nil
}

// RunWrite writes records through one log writer and reports records per second and the
// write-to-acknowledgement latency of each record; Extra has the entries sent and records per
// entry. With Baseline, Result.Baseline is plain ledger appends of the same size.
func RunWrite(ctx context.Context, o Options) (*bench.Result, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	e, err := connect(ctx, o)
	if err != nil {
		return nil, err
	}
	defer e.cleanup()
	var baseline *bench.Result
	if o.Baseline {
		if baseline, err = runBaseline(ctx, e.cl, o); err != nil {
			return nil, err
		}
	}
	l, w, err := e.newLog(ctx)
	if err != nil {
		return nil, err
	}
	defer e.ns.DeleteLog(context.WithoutCancel(ctx), l.Name())
	rec := bench.NewRecorder()
	written, err := produce(ctx, w, o, rec, false)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if cerr := w.Close(cctx); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	res := rec.Result("dlog-write", o.config())
	res.Baseline = baseline
	segs, _ := l.Segments(cctx)
	entries := int64(0)
	for _, s := range segs {
		entries += s.LastEntryID + 1
	}
	res.Extra = map[string]float64{"written": float64(written), "segments": float64(len(segs)), "entries": float64(entries)}
	if entries > 0 {
		res.Extra["records_per_entry"] = float64(written) / float64(entries)
	}
	if baseline != nil && baseline.OpsPerSec > 0 {
		res.Extra["records_per_baseline_entry_per_s"] = res.OpsPerSec / baseline.OpsPerSec
	}
	return res, nil
}

// produce writes records until the duration ends, closed loop (Outstanding in flight) or at
// Rate, recording each acknowledged record; stamp puts the send time (Unix ns; in open loop the
// time the record was due) in the first 8 bytes. It returns the records acknowledged.
func produce(ctx context.Context, w *dlog.Writer, o Options, rec *bench.Recorder, stamp bool) (int64, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	size := o.RecordSize
	if stamp {
		size = max(size, 8)
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	var acked atomic.Int64
	var failed atomic.Pointer[error]
	sem := make(chan struct{}, o.Outstanding)
	var inflight sync.WaitGroup
	var interval time.Duration // 0: closed loop
	if o.Rate > 0 {
		// At least 1 ns: a rate beyond what the clock can pace stays open loop (as fast as it
		// can go, latency from each due time), never silently closed loop.
		interval = max(1, time.Duration(float64(time.Second)/o.Rate))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sched := time.Now()
		for tx := w.LastTxID() + 1; runCtx.Err() == nil; tx++ {
			select {
			case sem <- struct{}{}:
			case <-runCtx.Done():
				return
			}
			sent := time.Now()
			if interval > 0 {
				if wait := sched.Sub(sent); wait > 0 {
					time.Sleep(wait)
				}
				sent, sched = sched, sched.Add(interval)
			}
			if stamp { // the due time, as the acknowledgement latency counts from
				binary.LittleEndian.PutUint64(payload, uint64(sent.UnixNano()))
			}
			inflight.Add(1)
			w.WriteAsync(runCtx, dlog.Record{TxID: tx, Payload: payload}, func(_ dlog.DLSN, err error) {
				if err != nil {
					if runCtx.Err() == nil {
						rec.Error()
						failed.CompareAndSwap(nil, &err)
					}
				} else {
					rec.Record(time.Since(sent), size)
					acked.Add(1)
				}
				<-sem
				inflight.Done()
			})
		}
	}()
	rec.Measure(ctx, o.Warmup, o.Duration, o.Progress)
	cancel()
	<-done
	inflight.Wait()
	if p := failed.Load(); p != nil && acked.Load() == 0 {
		return 0, fmt.Errorf("bench: dlog: every write failed: %w", *p)
	}
	return acked.Load(), nil
}

// runBaseline appends RecordSize-byte entries to one ledger with InFlight in flight, closed
// loop, for the same duration.
func runBaseline(ctx context.Context, cl *client.Client, o Options) (*bench.Result, error) {
	lh, err := cl.CreateLedger(ctx, client.CreateOptions{EnsembleSize: o.Ensemble, WriteQuorum: o.WriteQuorum, AckQuorum: o.AckQuorum})
	if err != nil {
		return nil, err
	}
	defer cl.DeleteLedger(context.WithoutCancel(ctx), lh.ID())
	rec := bench.NewRecorder()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	payload := make([]byte, o.RecordSize)
	sem := make(chan struct{}, o.InFlight)
	var inflight sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		for runCtx.Err() == nil {
			select {
			case sem <- struct{}{}:
			case <-runCtx.Done():
				return
			}
			sent := time.Now()
			inflight.Add(1)
			lh.AppendAsync(payload, func(_ int64, err error) {
				if err != nil {
					rec.Error()
				} else {
					rec.Record(time.Since(sent), len(payload))
				}
				<-sem
				inflight.Done()
			})
		}
	}()
	if o.Warmup > 0 {
		bench.Sleep(ctx, o.Warmup)
		rec.Restart()
	}
	bench.Sleep(ctx, o.Duration)
	rec.Stop()
	cancel()
	<-done
	inflight.Wait()
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer ccancel()
	lh.Close(cctx)
	return rec.Result("ledger-append", map[string]any{"entry_size": o.RecordSize, "in_flight": o.InFlight,
		"ensemble": o.Ensemble, "write_quorum": o.WriteQuorum, "ack_quorum": o.AckQuorum}), nil
}

// RunTail writes records at Rate while Readers follow the log from its tail; the result's ops
// are records read (by all readers) and its latency is from the write call (the time the
// record was due at Rate) to the reader's Next returning the record. Extra has the writer's
// acknowledgement latency.
func RunTail(ctx context.Context, o Options) (*bench.Result, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.Readers < 1 {
		o.Readers = 1
	}
	e, err := connect(ctx, o)
	if err != nil {
		return nil, err
	}
	defer e.cleanup()
	l, w, err := e.newLog(ctx)
	if err != nil {
		return nil, err
	}
	defer e.ns.DeleteLog(context.WithoutCancel(ctx), l.Name())
	rec := bench.NewRecorder()    // append to read
	writes := bench.NewRecorder() // append to acknowledgement
	readCtx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	var rw sync.WaitGroup
	for range o.Readers {
		r, err := l.OpenReader(ctx, dlog.Tail())
		if err != nil {
			return nil, err
		}
		rw.Go(func() {
			defer r.Close()
			for {
				record, err := r.Next(readCtx)
				if err != nil {
					if readCtx.Err() == nil {
						rec.Error()
					}
					return
				}
				sent := int64(binary.LittleEndian.Uint64(record.Payload))
				rec.Record(time.Duration(time.Now().UnixNano()-sent), len(record.Payload))
			}
		})
	}
	wo := o
	wo.Progress = nil
	if wo.Rate == 0 {
		wo.Rate = 10000
	}
	// The readers' figures have the writer's measured period: the same warm-up, then the same
	// duration; records read before or after it (the drain of the last writes) are not counted.
	var written int64
	var pw sync.WaitGroup
	pw.Go(func() { written, err = produce(ctx, w, wo, writes, true) })
	rec.Measure(ctx, o.Warmup, o.Duration, o.Progress)
	pw.Wait()
	stopReaders()
	rw.Wait()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if cerr := w.Close(cctx); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	res := rec.Result("dlog-tail", o.config())
	wr := writes.Result("dlog-write", nil)
	res.Errors += wr.Errors
	res.Extra = map[string]float64{"written": float64(written), "write_per_s": wr.OpsPerSec,
		"ack_p50_us": wr.LatencyUs.P50, "ack_p99_us": wr.LatencyUs.P99}
	return res, nil
}
