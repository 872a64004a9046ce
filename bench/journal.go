package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/internal/monotime"
	"github.com/ringkeeper/ringkeeper/journal"
)

// JournalOptions configures the journal workload (BookKeeper's `bkperf journal append`).
type JournalOptions struct {
	// Dirs are the journal directories; each run works in a fresh subdirectory that is removed
	// afterwards.
	Dirs []string
	// Writers issue appends; each keeps up to Outstanding appends in flight.
	Writers     int
	Outstanding int
	EntrySize   int
	// Ledgers are spread over the journals (ledger L goes to journal L mod len(Dirs)).
	Ledgers int
	// Rate is the total appends per second (open loop); 0 means closed loop.
	Rate float64
	// Duration is the measured time; Warmup runs before it and is not measured.
	Duration time.Duration
	Warmup   time.Duration
	// Journal settings.
	Sync          bool
	GroupWait     time.Duration
	GroupBytes    int
	PipelineDepth int
	Engine        diskio.Engine
	Prealloc      journal.PreallocMode
	ReuseFiles    bool
	MaxFileSize   int64
	MaxBackups    int
	MaxRecycled   int
	// Progress receives one line per second (nil: none).
	Progress io.Writer
}

// DefaultJournalOptions returns the defaults of `ringkeeper bench journal`.
func DefaultJournalOptions() JournalOptions {
	jc := journal.DefaultConfig("")
	return JournalOptions{
		Dirs: []string{os.TempDir()}, Writers: 1, Outstanding: 1, EntrySize: 1024, Ledgers: 1,
		Duration: 10 * time.Second, Sync: true, GroupWait: jc.MaxGroupWait, GroupBytes: jc.BufferedWritesThreshold,
		PipelineDepth: jc.PipelineDepth, Prealloc: jc.Prealloc, ReuseFiles: jc.ReuseFiles, MaxFileSize: jc.MaxFileSize,
		MaxBackups: jc.MaxBackups, MaxRecycled: jc.MaxRecycled,
	}
}

func (o JournalOptions) validate() error {
	switch {
	case len(o.Dirs) == 0:
		return errors.New("bench: no journal directory")
	case o.Writers < 1 || o.Outstanding < 1 || o.Ledgers < 1:
		return fmt.Errorf("bench: writers (%d), outstanding (%d) and ledgers (%d) must be positive", o.Writers, o.Outstanding, o.Ledgers)
	case o.EntrySize < 0:
		return fmt.Errorf("bench: negative entry size %d", o.EntrySize)
	case o.Duration <= 0:
		return fmt.Errorf("bench: duration %v must be positive", o.Duration)
	case !(o.Rate >= 0):
		return fmt.Errorf("bench: rate %v must be 0 (closed loop) or positive", o.Rate)
	}
	return nil
}

func (o JournalOptions) config() map[string]any {
	return map[string]any{
		"dirs": o.Dirs, "writers": o.Writers, "outstanding": o.Outstanding, "entry_size": o.EntrySize,
		"ledgers": o.Ledgers, "rate": o.Rate, "duration_s": o.Duration.Seconds(), "warmup_s": o.Warmup.Seconds(),
		"sync": o.Sync, "group_wait_ms": float64(o.GroupWait) / 1e6, "group_bytes": o.GroupBytes,
		"pipeline_depth": o.PipelineDepth, "engine": o.Engine.String(), "prealloc": o.Prealloc.String(),
		"reuse_files": o.ReuseFiles, "max_file_size": o.MaxFileSize, "max_backups": o.MaxBackups,
		"max_recycled": o.MaxRecycled,
	}
}

// benchEntry is a reusable journal entry with its send time.
type benchEntry struct {
	journal.Entry
	sent int64 // monotime nanoseconds: intended start (open loop) or send time
	w    *appendWriter
}

// appendWriter keeps Outstanding entries; completed entries come back on free.
type appendWriter struct {
	free chan *benchEntry
	rec  *Recorder
}

// pacer spaces one goroutine's operations so that goroutines of them together run at rate per
// second (open loop); a rate of 0 is a closed loop. Each operation's latency counts from the
// time it was due, so a system that falls behind is not hidden by waiting for it.
type pacer struct{ interval, next int64 }

func newPacer(rate float64, goroutines int) pacer {
	p := pacer{next: monotime.Now()}
	if rate > 0 {
		// At least 1 ns: a rate beyond what a nanosecond clock can pace stays open loop (as fast
		// as it can go, latency from each due time), never silently closed loop.
		p.interval = max(1, int64(float64(time.Second)*float64(goroutines)/rate))
	}
	return p
}

// closedLoop says that operations go out as soon as the previous ones complete.
func (p *pacer) closedLoop() bool { return p.interval == 0 }

// wait waits until the next operation is due and returns when it was due (now, in a closed loop).
func (p *pacer) wait() int64 {
	now := monotime.Now()
	if p.interval == 0 {
		return now
	}
	if d := p.next - now; d > 0 {
		time.Sleep(time.Duration(d))
	}
	due := p.next
	p.next += p.interval
	return due
}

func journalDone(e *journal.Entry, err error) {
	be := e.Ctx.(*benchEntry)
	if err != nil {
		be.w.rec.Error()
	} else {
		be.w.rec.Record(time.Duration(monotime.Now()-be.sent), len(e.Payload))
	}
	be.w.free <- be
}

// RunJournal runs the journal append workload.
func RunJournal(ctx context.Context, o JournalOptions) (*Result, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	var cfgs []journal.Config
	var workDirs []string
	defer func() {
		for _, d := range workDirs {
			os.RemoveAll(d)
		}
	}()
	for _, dir := range o.Dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		wd, err := os.MkdirTemp(dir, "ringkeeper-bench-journal-")
		if err != nil {
			return nil, err
		}
		workDirs = append(workDirs, wd)
		cfg := journal.DefaultConfig(wd)
		cfg.Engine = o.Engine
		cfg.SyncData = o.Sync
		cfg.MaxGroupWait = o.GroupWait
		cfg.BufferedWritesThreshold = o.GroupBytes
		cfg.PipelineDepth = o.PipelineDepth
		cfg.Prealloc = o.Prealloc
		cfg.ReuseFiles = o.ReuseFiles
		cfg.MaxFileSize = o.MaxFileSize
		cfg.MaxBackups = o.MaxBackups
		cfg.MaxRecycled = o.MaxRecycled
		cfg.MaxRecordSize = max(o.EntrySize, 1)
		cfgs = append(cfgs, cfg)
	}
	set, err := journal.OpenSet(cfgs)
	if err != nil {
		return nil, err
	}
	defer set.Close()
	journals := set.Journals()
	// The mark and GC keep disk use bounded during long runs, as a bookie's checkpoints do.
	stopGC := make(chan struct{})
	var gcDone sync.WaitGroup
	gcDone.Go(func() { collectJournals(journals, stopGC) })
	defer func() { close(stopGC); gcDone.Wait() }()

	payload := make([]byte, o.EntrySize)
	for i := range payload {
		payload[i] = byte(rand.Uint32())
	}
	rec := NewRecorder()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	writers := make([]*appendWriter, o.Writers)
	var wg sync.WaitGroup
	for w := range writers {
		aw := &appendWriter{free: make(chan *benchEntry, o.Outstanding), rec: rec}
		for range o.Outstanding {
			be := &benchEntry{w: aw}
			be.Type, be.Payload, be.Done, be.Ctx = journal.RecordData, payload, journalDone, be
			aw.free <- be
		}
		writers[w] = aw
		wg.Go(func() { runAppendWriter(runCtx, o, w, aw, set) })
	}
	if o.Warmup > 0 {
		select {
		case <-time.After(o.Warmup):
		case <-ctx.Done():
		}
		rec.Restart()
	}
	stopProgress := make(chan struct{})
	var progressDone sync.WaitGroup
	progressDone.Go(func() { rec.Progress(o.Progress, time.Second, stopProgress) })
	select {
	case <-time.After(o.Duration):
	case <-ctx.Done():
	}
	rec.Stop()
	cancel()
	wg.Wait()
	close(stopProgress)
	progressDone.Wait()
	// Wait for every outstanding append so that nothing is in flight when journals close.
	for _, aw := range writers {
		for range o.Outstanding {
			<-aw.free
		}
	}
	res := rec.Result("journal", o.config())
	res.Config["engine"] = journals[0].Engine().String()
	res.Extra = journalExtra(journals)
	return res, nil
}

// maxSharedClockReads is how many appends a journal bench writer times from one clock read.
const maxSharedClockReads = 32

func runAppendWriter(ctx context.Context, o JournalOptions, index int, aw *appendWriter, set *journal.Set) {
	var interval int64 // 0: closed loop
	if o.Rate > 0 {
		// At least 1 ns, as newPacer's: a huge rate stays open loop.
		interval = max(1, int64(float64(time.Second)*float64(o.Writers)/o.Rate))
	}
	next := monotime.Now()
	ledger := int64(index % o.Ledgers)
	var entryID int64
	var now int64
	sharedClock := 0 // appends sent since now was read
	for {
		var be *benchEntry
		select {
		case be = <-aw.free:
			// Entries that come back together (one journal group) share one clock read, but
			// only a few: a writer that never waits would otherwise time every append from
			// one ever older reading.
		default:
			be = <-aw.free // every outstanding entry comes back, so this never waits forever
			now = 0
		}
		if now == 0 || sharedClock >= maxSharedClockReads {
			now, sharedClock = monotime.Now(), 0
		}
		sharedClock++
		if ctx.Err() != nil {
			aw.free <- be
			return
		}
		be.sent = now
		if interval > 0 {
			if wait := next - now; wait > 0 {
				select {
				case <-time.After(time.Duration(wait)):
				case <-ctx.Done():
					aw.free <- be
					return
				}
			}
			be.sent = next // open loop: latency counts from the intended start
			next += interval
			now = 0
		}
		be.LedgerID, be.EntryID = ledger, entryID
		entryID++
		ledger += int64(o.Writers)
		if ledger >= int64(o.Ledgers) {
			ledger = int64(index % o.Ledgers)
		}
		if err := set.For(be.LedgerID).Append(&be.Entry); err != nil {
			aw.rec.Error()
			aw.free <- be
			return
		}
	}
}

// collectJournals persists nothing (the benchmark has no storage to checkpoint) but deletes old
// journal files behind the durable mark, so long runs do not fill the disk.
func collectJournals(js []*journal.Journal, stop <-chan struct{}) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			for _, j := range js {
				j.GC(j.LastLogMark())
			}
		}
	}
}

// journalExtra reports group-commit figures summed over the journals.
func journalExtra(js []*journal.Journal) map[string]float64 {
	var groups, entries, bytes, syncs, syncNs, created, reused uint64
	for _, j := range js {
		s := j.Stats()
		groups += s.Groups.Load()
		entries += s.Entries.Load()
		bytes += s.Bytes.Load()
		syncs += s.Syncs.Load()
		syncNs += s.SyncNanos.Load()
		created += s.FilesCreated.Load()
		reused += s.FilesReused.Load()
	}
	extra := map[string]float64{"groups": float64(groups), "files_created": float64(created), "files_reused": float64(reused)}
	if groups > 0 {
		extra["entries_per_group"] = float64(entries) / float64(groups)
		extra["bytes_per_group"] = float64(bytes) / float64(groups)
	}
	if syncs > 0 {
		extra["write_sync_us"] = float64(syncNs) / float64(syncs) / 1e3
	}
	return extra
}
