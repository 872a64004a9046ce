package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// GCRequest is an operator's request for a garbage collection run now.
type GCRequest struct {
	// ForceMajor runs a major compaction whatever majorCompactionInterval says; ForceMinor a
	// minor one (when ForceMajor is not set). With neither, a forced run compacts as if the
	// major interval were due (BookKeeper's forced GC), or minor if major is disabled.
	ForceMajor bool
	ForceMinor bool
}

// GCStatus is the state of the garbage collector (GET /api/v1/bookie/gc_details).
type GCStatus struct {
	// Running says a run is in progress; Forced that it was requested by an operator.
	Running bool `json:"running"`
	Forced  bool `json:"forceCompacting"`
	// MajorCompacting and MinorCompacting say which compaction is running.
	MajorCompacting bool `json:"majorCompacting"`
	MinorCompacting bool `json:"minorCompacting"`
	// MajorSuspended and MinorSuspended are the operator's suspensions.
	MajorSuspended bool `json:"isMajorGcSuspended"`
	MinorSuspended bool `json:"isMinorGcSuspended"`
	// LastRun is when the last run ended; LastRunSeconds how long it took.
	LastRun             time.Time `json:"lastRunTime"`
	LastRunSeconds      float64   `json:"lastRunSeconds"`
	LastMajorCompaction time.Time `json:"lastMajorCompactionTime"`
	LastMinorCompaction time.Time `json:"lastMinorCompactionTime"`
	Runs                uint64    `json:"runs"`
	MajorCompactions    uint64    `json:"majorCompactionCounter"`
	MinorCompactions    uint64    `json:"minorCompactionCounter"`
	// DeletedLedgers counts ledgers deleted because the metadata store no longer has them.
	DeletedLedgers uint64 `json:"deletedLedgers"`
	// MetadataErrors counts metadata reads and listings that failed (nothing was deleted).
	MetadataErrors uint64 `json:"metadataErrors"`
	// RemovedLogs counts entry logs removed whole (no live ledger); CompactedLogs those
	// removed after compaction copied their live entries out.
	RemovedLogs   uint64 `json:"removedLogs"`
	CompactedLogs uint64 `json:"compactedLogs"`
	// ReclaimedBytes is the size on disk of every log removed.
	ReclaimedBytes uint64 `json:"reclaimedBytes"`
	// CompactionReadBytes and CompactionWrittenBytes are what compaction read from old logs
	// and copied into new ones; CompactionSeconds the time spent compacting.
	CompactionReadBytes    uint64  `json:"compactionReadBytes"`
	CompactionWrittenBytes uint64  `json:"compactionWrittenBytes"`
	CompactionSeconds      float64 `json:"compactionSeconds"`
	// Paused says why compaction last stopped early (disk usage, time limit), if it did.
	Paused string `json:"paused,omitempty"`
	// LastError is the last error a run met.
	LastError string `json:"lastError,omitempty"`
	// CorruptLogs are logs that could not be read for garbage collection; they are kept (their
	// readable entries stay readable) and skipped until the bookie restarts.
	CorruptLogs []string `json:"corruptLogs,omitempty"`
	// Logs is the usage of each completed entry log, as of the last run.
	Logs []LogUsage `json:"logs"`
}

// LogUsage is one entry log's share of live data.
type LogUsage struct {
	Dir int    `json:"dir"`
	ID  uint64 `json:"id"`
	// FileBytes is the file's size on disk; TotalBytes the data its ledgers map counts and
	// LiveBytes the part of it that belongs to live ledgers.
	FileBytes  int64   `json:"fileBytes"`
	TotalBytes uint64  `json:"totalBytes"`
	LiveBytes  uint64  `json:"liveBytes"`
	Usage      float64 `json:"usage"`
}

// gc is the garbage collector's state: one background goroutine (runLoop) or an explicit
// RunGC runs at a time (runMu).
type gc struct {
	e   *Engine
	cfg GCConfig

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	kick   chan GCRequest
	done   chan struct{}

	// runMu makes runs one at a time; everything below it is used by the run only.
	runMu       sync.Mutex
	readLimit   *rate.Limiter // compaction reads (nil: unlimited)
	writeLimit  *rate.Limiter // compaction writes (nil: unlimited)
	metaLimit   *rate.Limiter // metadata reads (nil: unlimited)
	nextMajorAt time.Time
	nextMinorAt time.Time

	suspendMajor atomic.Bool
	suspendMinor atomic.Bool
	forcePending atomic.Bool

	// mu guards status.
	mu     sync.Mutex
	status GCStatus
}

// compactionChunkBytes bounds the live data copied between two index commits: the lock that
// checkpoints also take is held for one chunk at a time.
const compactionChunkBytes = 1 << 20

func newGC(e *Engine) *gc {
	cfg := e.cfg.GC
	g := &gc{e: e, cfg: cfg, kick: make(chan GCRequest, 1), done: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	if cfg.RateBytes > 0 {
		// A burst of about 1/8 s (waitBytes splits larger waits), so that compaction's I/O
		// stays smooth rather than arriving in seconds-long bursts.
		burst := int(min(max(cfg.RateBytes/8, 4096), compactionChunkBytes))
		g.readLimit = rate.NewLimiter(rate.Limit(cfg.RateBytes), burst)
		g.writeLimit = rate.NewLimiter(rate.Limit(cfg.RateBytes), burst)
	}
	if cfg.MetadataOpRate > 0 {
		g.metaLimit = rate.NewLimiter(rate.Limit(cfg.MetadataOpRate), max(1, cfg.MetadataOpRate/10))
	}
	now := time.Now()
	g.nextMajorAt = now.Add(cfg.MajorInterval)
	g.nextMinorAt = now.Add(cfg.MinorInterval)
	return g
}

// runLoop runs the garbage collector every WaitTime and whenever TriggerGC asks.
func (g *gc) runLoop() {
	defer close(g.done)
	t := time.NewTimer(g.cfg.WaitTime)
	defer t.Stop()
	for {
		var req *GCRequest
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		case r := <-g.kick:
			req = &r
		}
		if err := g.run(g.ctx, req); err != nil && g.ctx.Err() == nil && !errors.Is(err, ErrFailed) {
			g.e.log.Error("garbage collection", "err", err)
		}
		t.Reset(g.cfg.WaitTime)
	}
}

// stop interrupts a run in progress and waits for the goroutine and any RunGC to end.
func (g *gc) stop() {
	g.cancel()
	<-g.done
	g.runMu.Lock()
	g.runMu.Unlock() // (empty on purpose: this waits for a RunGC in progress)
}

// TriggerGC asks for a garbage collection run now, in the background (PUT /api/v1/bookie/gc).
// A request made while one is pending replaces it.
func (e *Engine) TriggerGC(req GCRequest) {
	g := e.gc
	g.forcePending.Store(true)
	for {
		select {
		case g.kick <- req:
			return
		default:
		}
		select {
		case <-g.kick: // drop the older request
		default:
		}
	}
}

// RunGC runs one garbage collection now, in the caller's goroutine, and returns when it ends:
// delete the ledgers the metadata store no longer has, remove entry logs with no live ledger,
// then compact as req says (a nil req: only what is due). It waits for a run in progress.
func (e *Engine) RunGC(ctx context.Context, req *GCRequest) error {
	g := e.gc
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(g.ctx, cancel)
	defer stop()
	return g.run(ctx, req)
}

// SuspendCompaction suspends major and/or minor compaction until ResumeCompaction; a
// compaction in progress stops at its next chunk. Deleting ledgers and removing dead logs go
// on.
func (e *Engine) SuspendCompaction(major, minor bool) {
	if major {
		e.gc.suspendMajor.Store(true)
	}
	if minor {
		e.gc.suspendMinor.Store(true)
	}
}

// ResumeCompaction lifts SuspendCompaction.
func (e *Engine) ResumeCompaction(major, minor bool) {
	if major {
		e.gc.suspendMajor.Store(false)
	}
	if minor {
		e.gc.suspendMinor.Store(false)
	}
}

// GCStatus returns the garbage collector's state.
func (e *Engine) GCStatus() GCStatus {
	g := e.gc
	g.mu.Lock()
	s := g.status
	s.Logs = slices.Clone(s.Logs)
	s.CorruptLogs = slices.Clone(s.CorruptLogs)
	g.mu.Unlock()
	s.MajorSuspended = g.suspendMajor.Load()
	s.MinorSuspended = g.suspendMinor.Load()
	s.Forced = s.Forced || g.forcePending.Load()
	return s
}

func (g *gc) update(fn func(s *GCStatus)) {
	g.mu.Lock()
	fn(&g.status)
	g.mu.Unlock()
}

func (g *gc) noteError(err error) {
	g.update(func(s *GCStatus) { s.LastError = err.Error() })
}

// compactionKind is what a run compacts.
type compactionKind int

const (
	compactNone compactionKind = iota
	compactMinor
	compactMajor
)

func (k compactionKind) String() string {
	return [...]string{"none", "minor", "major"}[k]
}

// run is one garbage collection: (1) delete ledgers gone from the metadata store and forget
// expired fenced deletions, (2) remove entry logs with no live ledger, (3) a major compaction
// if due, else a minor one if due.
func (g *gc) run(ctx context.Context, req *GCRequest) error {
	g.runMu.Lock()
	defer g.runMu.Unlock()
	e := g.e
	if err := e.Err(); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ErrClosed
	}
	forced := req != nil
	if forced {
		g.forcePending.Store(false)
	}
	start := time.Now()
	g.update(func(s *GCStatus) { s.Running, s.Forced, s.Paused = true, forced, "" })
	defer g.update(func(s *GCStatus) {
		s.Running, s.Forced, s.MajorCompacting, s.MinorCompacting = false, false, false, false
		s.LastRun = time.Now()
		s.LastRunSeconds = time.Since(start).Seconds()
		s.Runs++
	})

	var errs []error
	if err := g.deleteGoneLedgers(ctx); err != nil {
		errs = append(errs, err)
	}
	e.expireFencedDeleted() // committed by refresh's commitDeletes, just below
	for _, d := range e.dirs {
		if err := d.gc.refresh(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if err := g.removeDeadLogs(); err != nil {
		errs = append(errs, err)
	}
	g.publishLogs()
	if ctx.Err() == nil {
		if err := g.compact(ctx, req); err != nil {
			errs = append(errs, err)
		}
		g.publishLogs()
	}
	err := errors.Join(errs...)
	if err != nil {
		g.noteError(err)
	}
	return err
}

// deleteGoneLedgers deletes the local ledgers that the metadata store says for certain are
// gone: each is point-read (LedgerExists) at MetadataOpRate; with a LedgerLister only those
// missing from the listing are. Any error stops the scan and deletes nothing more.
func (g *gc) deleteGoneLedgers(ctx context.Context) error {
	checker := g.cfg.Checker
	if checker == nil {
		return nil
	}
	var listed map[int64]struct{}
	if lister, ok := checker.(LedgerLister); ok {
		listed = make(map[int64]struct{})
		err := lister.ListLedgers(ctx, func(id int64) { listed[id] = struct{}{} })
		if err != nil {
			g.update(func(s *GCStatus) { s.MetadataErrors++ })
			return fmt.Errorf("engine: gc: list ledgers in the metadata store (nothing deleted): %w", err)
		}
	}
	var candidates []int64
	g.e.ledgers.each(func(l *ledgerInfo) bool {
		if _, ok := listed[l.id]; listed == nil || !ok {
			candidates = append(candidates, l.id)
		}
		return true
	})
	slices.Sort(candidates)
	deleted := 0
	defer func() {
		if deleted > 0 {
			g.e.log.Info("garbage collection deleted ledgers gone from the metadata store", "ledgers", deleted)
		}
	}()
	for _, id := range candidates {
		if g.metaLimit != nil {
			if err := g.metaLimit.Wait(ctx); err != nil {
				return nil // closing, or out of time
			}
		}
		opCtx, cancel := context.WithTimeout(ctx, g.cfg.MetadataOpTimeout)
		exists, err := checker.LedgerExists(opCtx, id)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			g.update(func(s *GCStatus) { s.MetadataErrors++ })
			return fmt.Errorf("engine: gc: read ledger %d from the metadata store (nothing more deleted this run): %w", id, err)
		}
		if exists {
			continue
		}
		if err := g.e.DeleteLedger(id); err == nil {
			deleted++
			g.update(func(s *GCStatus) { s.DeletedLedgers++ })
		}
	}
	return nil
}

// removeDeadLogs removes the completed logs of every dir that hold no live ledger.
func (g *gc) removeDeadLogs() error {
	var errs []error
	for _, d := range g.e.dirs {
		var dead []uint64
		for id, u := range d.gc.usage {
			if u.live == 0 {
				dead = append(dead, id)
			}
		}
		slices.Sort(dead)
		if len(dead) == 0 {
			continue
		}
		n, bytes, err := d.removeLogs(dead)
		g.update(func(s *GCStatus) {
			s.RemovedLogs += uint64(n)
			s.ReclaimedBytes += uint64(bytes)
		})
		if n > 0 {
			g.e.log.Info("garbage collection removed entry logs with no live ledger", "dir", d.path, "logs", n, "bytes", bytes)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// publishLogs copies every dir's log usage into the status.
func (g *gc) publishLogs() {
	var logs []LogUsage
	var corrupt []string
	for _, d := range g.e.dirs {
		for id, u := range d.gc.usage {
			logs = append(logs, LogUsage{Dir: d.index, ID: id, FileBytes: u.size, TotalBytes: u.total, LiveBytes: u.live, Usage: u.ratio()})
		}
		for id, err := range d.gc.bad {
			corrupt = append(corrupt, fmt.Sprintf("%s/%x.log: %v", d.path, id, err))
		}
	}
	slices.SortFunc(logs, func(a, b LogUsage) int { return cmp.Or(cmp.Compare(a.Dir, b.Dir), cmp.Compare(a.ID, b.ID)) })
	slices.Sort(corrupt)
	g.update(func(s *GCStatus) { s.Logs, s.CorruptLogs = logs, corrupt })
}

// compactionDue decides what this run compacts: a major compaction when it is due (or forced),
// else a minor one when due, else nothing; suspended kinds are skipped.
func (g *gc) compactionDue(req *GCRequest, now time.Time) compactionKind {
	major := g.cfg.majorEnabled() && !g.suspendMajor.Load()
	minor := g.cfg.minorEnabled() && !g.suspendMinor.Load()
	switch {
	case req != nil && req.ForceMajor:
		if major {
			return compactMajor
		}
		return compactNone
	case req != nil && req.ForceMinor:
		if minor {
			return compactMinor
		}
		return compactNone
	case major && (req != nil || !now.Before(g.nextMajorAt)):
		return compactMajor
	case minor && (req != nil || !now.Before(g.nextMinorAt)):
		return compactMinor
	}
	return compactNone
}

// diskPause says why compaction of kind must pause for disk space ("" if it need not): major
// above diskUsageWarnThreshold, minor above diskUsageThreshold.
func (g *gc) diskPause(kind compactionKind, forced bool) string {
	if forced && g.cfg.ForceAllowWhenNoSpace {
		return ""
	}
	usage, _, _, err := g.e.Usage()
	if err != nil {
		return fmt.Sprintf("disk usage unknown: %v", err)
	}
	limit, name := g.cfg.DiskUsageThreshold, "diskUsageThreshold"
	if kind == compactMajor {
		limit, name = g.cfg.DiskUsageWarnThreshold, "diskUsageWarnThreshold"
	}
	if usage >= limit {
		return fmt.Sprintf("disk usage %.3f is at or above %s %.3f", usage, name, limit)
	}
	return ""
}

// errCompactionPaused stops a compaction that must pause (disk usage, suspension).
var errCompactionPaused = errors.New("engine: compaction paused")

// compact runs the compaction this run is due for over the logs whose live share is below its
// threshold, emptiest first, within its time limit.
func (g *gc) compact(ctx context.Context, req *GCRequest) error {
	kind := g.compactionDue(req, time.Now())
	if kind == compactNone {
		return nil
	}
	maxTime := g.cfg.MinorMaxTime
	if kind == compactMajor {
		maxTime = g.cfg.MajorMaxTime
	}
	forced := req != nil
	if reason := g.diskPause(kind, forced); reason != "" {
		g.e.log.Warn("compaction paused", "kind", kind.String(), "reason", reason)
		g.update(func(s *GCStatus) { s.Paused = reason })
		return nil
	}
	if maxTime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxTime)
		defer cancel()
	}
	g.update(func(s *GCStatus) {
		s.MajorCompacting = kind == compactMajor
		s.MinorCompacting = kind == compactMinor
	})
	start := time.Now()
	compacted, timeUp, err := g.compactLogs(ctx, kind, forced)
	if timeUp && g.ctx.Err() == nil && maxTime > 0 {
		g.update(func(s *GCStatus) { s.Paused = fmt.Sprintf("%s compaction reached its time limit %v", kind, maxTime) })
	}
	if errors.Is(err, ErrFailed) || errors.Is(err, ErrIO) {
		return err
	}
	end := time.Now()
	if kind == compactMajor {
		// A major compaction covers a minor one too.
		g.nextMajorAt, g.nextMinorAt = end.Add(g.cfg.MajorInterval), end.Add(g.cfg.MinorInterval)
	} else {
		g.nextMinorAt = end.Add(g.cfg.MinorInterval)
	}
	g.update(func(s *GCStatus) {
		if kind == compactMajor {
			s.LastMajorCompaction = end
			s.MajorCompactions++
		} else {
			s.LastMinorCompaction = end
			s.MinorCompactions++
		}
	})
	if compacted > 0 {
		g.e.log.Info("compaction done", "kind", kind.String(), "logs", compacted, "seconds", end.Sub(start).Seconds())
	}
	return err
}

// compactLogs compacts the candidate logs of every dir until they are done, the time is up, or
// compaction must pause. A log that cannot be read is kept and skipped (BookKeeper #4544: GC
// must not get stuck on it); the others are still compacted. An I/O error of the entry log
// being written or of the index (which stops the engine) ends the run. timeUp says the context
// ended it (the time limit, or closing).
func (g *gc) compactLogs(ctx context.Context, kind compactionKind, forced bool) (compacted int, timeUp bool, _ error) {
	threshold, suspended := g.cfg.MinorThreshold, &g.suspendMinor
	if kind == compactMajor {
		threshold, suspended = g.cfg.MajorThreshold, &g.suspendMajor
	}
	pause := func() string {
		if suspended.Load() {
			return "suspended by the operator"
		}
		return g.diskPause(kind, forced)
	}
	var errs []error
	for _, d := range g.e.dirs {
		for _, id := range d.gc.candidates(threshold) {
			if ctx.Err() != nil {
				return compacted, true, errors.Join(errs...)
			}
			if reason := pause(); reason != "" {
				g.update(func(s *GCStatus) { s.Paused = reason })
				return compacted, false, errors.Join(errs...)
			}
			err := d.compactLog(ctx, g, id, pause)
			switch {
			case err == nil:
				compacted++
			case errors.Is(err, errCompactionPaused):
				g.update(func(s *GCStatus) { s.Paused = err.Error() })
				return compacted, false, errors.Join(errs...)
			case ctx.Err() != nil || isWaitDeadline(err):
				return compacted, true, errors.Join(errs...)
			case errors.Is(err, ErrFailed), errors.Is(err, ErrIO), g.e.Err() != nil:
				return compacted, false, errors.Join(append(errs, err)...)
			default:
				d.gc.markBad(id, err)
				errs = append(errs, err)
			}
		}
	}
	return compacted, false, errors.Join(errs...)
}

// waitBytes waits until limiter l allows n more bytes (nil l: at once).
func waitBytes(ctx context.Context, l *rate.Limiter, n int) error {
	if l == nil {
		return ctx.Err()
	}
	for n > 0 {
		k := min(n, l.Burst())
		if err := l.WaitN(ctx, k); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: %w", errWouldExceedDeadline, err)
		}
		n -= k
	}
	return nil
}
