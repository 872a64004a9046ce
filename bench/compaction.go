package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringkeeper/ringkeeper/engine"
)

// ledgerRoller gives the compaction workload's writers their ledgers: slot s writes ledger
// ids s, s+n, s+2n, ... (n slots), each for LedgerEntries entries, and the full ledgers are
// deleted (DeleteFraction of them, spread evenly) once two checkpoints have passed since they
// filled, so that their entries lie in entry logs, which fill with garbage.
type ledgerRoller struct {
	eng      *engine.Engine
	slots    []rollSlot
	perLedge int64
	fraction float64

	// mu guards full and deleted.
	mu      sync.Mutex
	full    []fullLedger
	deleted int
}

type rollSlot struct {
	// mu guards id and next.
	mu   sync.Mutex
	id   int64
	next int64
	_    [40]byte
}

type fullLedger struct {
	id          int64
	checkpoints uint64
}

func newLedgerRoller(eng *engine.Engine, o StorageOptions) *ledgerRoller {
	r := &ledgerRoller{eng: eng, slots: make([]rollSlot, o.Ledgers), perLedge: o.LedgerEntries, fraction: o.DeleteFraction}
	for i := range r.slots {
		r.slots[i].id = int64(i)
	}
	return r
}

// next returns the ledger and entry id of slot's next add.
func (r *ledgerRoller) next(slot int) (ledger, entry int64) {
	s := &r.slots[slot]
	s.mu.Lock()
	if s.next == r.perLedge {
		r.mu.Lock()
		r.full = append(r.full, fullLedger{s.id, r.eng.Stats().Checkpoints})
		r.mu.Unlock()
		s.id += int64(len(r.slots))
		s.next = 0
	}
	ledger, entry = s.id, s.next
	s.next++
	s.mu.Unlock()
	return ledger, entry
}

// doomed says whether a full ledger is deleted: the first `fraction` of every 100 ledgers, by
// a multiplicative hash of the id, so that deleted and kept ledgers interleave in entry logs.
func (r *ledgerRoller) doomed(id int64) bool {
	return float64((uint64(id)*0x9e3779b97f4a7c15)>>40%1000) < r.fraction*1000
}

// deleteLoop deletes full ledgers once they are flushed, until ctx is done.
func (r *ledgerRoller) deleteLoop(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cps := r.eng.Stats().Checkpoints
		r.mu.Lock()
		keep := r.full[:0]
		var ready []int64
		for _, f := range r.full {
			if cps >= f.checkpoints+2 {
				if r.doomed(f.id) {
					ready = append(ready, f.id)
				}
			} else {
				keep = append(keep, f)
			}
		}
		r.full = keep
		r.mu.Unlock()
		for _, id := range ready {
			if r.eng.DeleteLedger(id) == nil {
				r.mu.Lock()
				r.deleted++
				r.mu.Unlock()
			}
		}
	}
}

// alternateCompaction runs the compaction workload's two phases in alternating slices: off
// (recorded by off, the recorder of the warm-up), on (major compaction running back to back),
// off, on, ... for o.Duration per phase. It returns the phase without compaction's result, the
// recorder of the phase with it, and the garbage collector's state before and after.
func alternateCompaction(ctx context.Context, eng *engine.Engine, o StorageOptions, off *Recorder,
	current *atomic.Pointer[Recorder]) (baseline *Result, on *Recorder, before, after engine.GCStatus) {
	slices := max(o.CompactionSlices, 1)
	slice := o.Duration / time.Duration(slices)
	on = NewRecorder()
	on.Pause()
	before = eng.GCStatus()
	for i := 0; i < 2*slices && ctx.Err() == nil; i++ {
		compacting := i%2 == 1
		r := off
		if compacting {
			r = on
		}
		r.Resume()
		current.Store(r)
		var stopGC func()
		if compacting {
			stopGC = runCompactions(eng)
		}
		ops, start := r.Ops(), time.Now()
		Sleep(ctx, slice)
		if stopGC != nil {
			stopGC()
		}
		r.Pause()
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "slice %d/%d, compaction %s: %10.0f ops/s\n", i+1, 2*slices,
				map[bool]string{false: "off", true: "on "}[compacting], float64(r.Ops()-ops)/time.Since(start).Seconds())
		}
	}
	after = eng.GCStatus()
	off.Stop()
	on.Stop()
	return off.Result("storage-no-compaction", o.config()), on, before, after
}

// runCompactions runs major compactions back to back (pausing briefly when there is nothing
// to compact) until the returned stop function is called.
func runCompactions(eng *engine.Engine) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			before := eng.GCStatus()
			eng.RunGC(ctx, &engine.GCRequest{ForceMajor: true})
			after := eng.GCStatus()
			if after.CompactionReadBytes == before.CompactionReadBytes && after.RemovedLogs == before.RemovedLogs {
				Sleep(ctx, 200*time.Millisecond)
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// compactionExtra adds the compaction phase's figures to res: compaction throughput, space
// reclaimed, and the add throughput and p99 relative to the phase without compaction.
func compactionExtra(res, baseline *Result, before, after engine.GCStatus, r *ledgerRoller, o StorageOptions) {
	secs := res.DurationS
	x := res.Extra
	x["compaction_written_mb_per_sec"] = float64(after.CompactionWrittenBytes-before.CompactionWrittenBytes) / secs / 1e6
	x["compaction_read_mb_per_sec"] = float64(after.CompactionReadBytes-before.CompactionReadBytes) / secs / 1e6
	x["compaction_rate_limit_mb_per_sec"] = float64(o.CompactionRate) / 1e6
	x["reclaimed_mb"] = float64(after.ReclaimedBytes-before.ReclaimedBytes) / 1e6
	x["compacted_logs"] = float64(after.CompactedLogs - before.CompactedLogs)
	x["removed_logs"] = float64(after.RemovedLogs - before.RemovedLogs)
	x["compaction_seconds"] = after.CompactionSeconds - before.CompactionSeconds
	r.mu.Lock()
	x["deleted_ledgers"] = float64(r.deleted)
	r.mu.Unlock()
	if baseline.OpsPerSec > 0 {
		x["throughput_ratio"] = res.OpsPerSec / baseline.OpsPerSec
	}
	if baseline.LatencyUs.P99 > 0 {
		x["p99_ratio"] = res.LatencyUs.P99 / baseline.LatencyUs.P99
	}
	x["baseline_ops_per_sec"] = baseline.OpsPerSec
	x["baseline_p99_us"] = baseline.LatencyUs.P99
}
