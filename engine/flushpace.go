package engine

import (
	"time"
)

// Flush pacing. A checkpoint's flush writes the sealed half to the entry log as fast as the
// disk takes it. Where the journal shares that disk (one device, as on most small machines),
// such a burst starves the journal's group commits: with the index no longer costing the
// flusher CPU, a 256 MiB half went out at 1.1 GB/s and, at half load, add latency p99 went
// from 39 ms to 173 ms (BENCHMARKS.md). So the flush is paced to end when the active half
// reaches flushPaceDone of its capacity: before every step it estimates when that will be (from
// the rate the adds fill the active half at, at least the rate the sealed half filled at) and
// writes the rest at the rate that ends then. The flush so spreads over most of the fill time
// and speeds up as soon as the adds do, keeping a quarter of the half as margin against
// throttling. Once the active half is past that point, or the engine is closing, the rest goes
// at full speed.
const (
	flushPaceDone = 0.75
	// flushPaceMinRate bounds how slow a paced flush may be, so that a half filled slowly (or a
	// checkpoint of the flush interval's timer) does not hold the checkpoint for long.
	flushPaceMinRate = 64 << 20 // bytes/s
	// flushPaceStep is how many bytes a paced flush writes between two looks at the clock.
	flushPaceStep = 1 << 20
)

// flushPacer spreads one flush over time. The zero value (or nil) does not pace.
type flushPacer struct {
	start    time.Time
	last     time.Time // when the bytes written at the previous look were due
	lastN    int64     // bytes written at the previous look
	total    int64     // bytes to flush
	fillRate float64   // bytes/s the sealed half filled at
	next     int64     // bytes written at the next look at the clock
	active   *cacheHalf
	doneAt   int64 // the active half's offset by which the flush should have ended
	paced    bool
	closing  <-chan struct{}
	// sleep waits d or until closing; a variable so tests can record the waits.
	sleep func(d time.Duration, closing <-chan struct{})
}

// newFlushPacer paces the flush of sealed, which was active from filledFrom until now, while
// active takes the adds. It returns nil (no pacing) when the fill time is unknown.
func newFlushPacer(sealed, active *cacheHalf, filledFrom, now time.Time, closing <-chan struct{}) *flushPacer {
	fill := now.Sub(filledFrom)
	bytes := sealed.offset.Load()
	if filledFrom.IsZero() || fill <= 0 || bytes <= 0 {
		return nil
	}
	return &flushPacer{
		start: now, last: now, total: bytes, fillRate: float64(bytes) / fill.Seconds(), next: flushPaceStep,
		active: active, doneAt: int64(float64(active.capacity) * flushPaceDone), paced: true,
		closing: closing, sleep: sleepOrClosing,
	}
}

// wait is called with the bytes flushed so far; it sleeps until they are due.
func (p *flushPacer) wait(written int64, now func() time.Time) {
	if p == nil || !p.paced || written < p.next {
		return
	}
	p.next = written + flushPaceStep
	filled := p.active.offset.Load()
	if filled >= p.doneAt {
		p.paced = false // the adds caught up with the flush: finish at full speed
		return
	}
	select {
	case <-p.closing:
		p.paced = false
		return
	default:
	}
	t := now()
	fillRate := p.fillRate
	if elapsed := t.Sub(p.start).Seconds(); elapsed > 0 {
		fillRate = max(fillRate, float64(filled)/elapsed)
	}
	untilDone := float64(p.doneAt-filled) / fillRate // seconds
	rate := max(float64(p.total-written)/untilDone, flushPaceMinRate)
	due := p.last.Add(time.Duration(float64(written-p.lastN) / rate * float64(time.Second)))
	p.lastN = written
	if d := due.Sub(t); d > 0 {
		p.last = due
		p.sleep(d, p.closing)
	} else {
		p.last = t // late: no catching up with sleeps owed from before
	}
}

func sleepOrClosing(d time.Duration, closing <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-closing:
	}
}
