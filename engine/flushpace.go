package engine

import (
	"time"
)

// Flush pacing. A checkpoint's flush writes the sealed half to the entry log as fast as the
// disk takes it. Where the journal shares that disk (one device, as on most small machines),
// such a burst starves the journal's group commits: with the index no longer costing the
// flusher CPU, a 256 MiB half went out at 1.1 GB/s and, at half load, add latency p99 went
// from 39 ms to 173 ms (BENCHMARKS.md). So the flush is paced to take flushPaceFraction of the
// time the sealed half took to fill: it still ends well before the active half fills at the same
// rate, and the journal keeps part of the disk meanwhile. Pacing stops (the rest goes at full
// speed) once the active half is flushPaceValve full, so adds are never throttled by it, and when
// the engine is closing.
const (
	flushPaceFraction = 0.5
	flushPaceValve    = 0.5
	// flushPaceMinRate bounds how slow a paced flush may be, so that a half filled slowly (or a
	// checkpoint of the flush interval's timer) does not hold the checkpoint for long.
	flushPaceMinRate = 64 << 20 // bytes/s
	// flushPaceStep is how many bytes a paced flush writes between two looks at the clock.
	flushPaceStep = 1 << 20
)

// flushPacer spreads one flush over time. The zero value (or nil) does not pace.
type flushPacer struct {
	start   time.Time
	rate    float64 // bytes/s
	next    int64   // bytes written at the next look at the clock
	active  *cacheHalf
	valve   int64 // the active half's offset at which pacing stops
	closing <-chan struct{}
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
	rate := max(float64(bytes)/(fill.Seconds()*flushPaceFraction), flushPaceMinRate)
	return &flushPacer{
		start: now, rate: rate, next: flushPaceStep, active: active,
		valve: int64(float64(active.capacity) * flushPaceValve), closing: closing, sleep: sleepOrClosing,
	}
}

// wait is called with the bytes flushed so far; it sleeps until they are due.
func (p *flushPacer) wait(written int64, now func() time.Time) {
	if p == nil || p.rate == 0 || written < p.next {
		return
	}
	p.next = written + flushPaceStep
	if p.active.offset.Load() >= p.valve {
		p.rate = 0 // the adds catch up with the flush: finish at full speed
		return
	}
	select {
	case <-p.closing:
		p.rate = 0
		return
	default:
	}
	due := p.start.Add(time.Duration(float64(written) / p.rate * float64(time.Second)))
	if d := due.Sub(now()); d > 0 {
		p.sleep(d, p.closing)
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
