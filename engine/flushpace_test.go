package engine

import (
	"testing"
	"time"
)

func TestFlushPacer(t *testing.T) {
	const mib = 1 << 20
	t0 := time.Unix(1000, 0)
	half := func(capacity, used int64) *cacheHalf {
		h := &cacheHalf{capacity: capacity}
		h.offset.Store(used)
		return h
	}
	var slept []time.Duration
	record := func(d time.Duration, _ <-chan struct{}) { slept = append(slept, d) }
	at := func(d time.Duration) func() time.Time { return func() time.Time { return t0.Add(d) } }

	// A 64 MiB half filled in 1 s is flushed in 0.5 s: 128 MiB/s, 16 MiB due at 125 ms.
	active := half(128*mib, 0)
	p := newFlushPacer(half(128*mib, 64*mib), active, t0.Add(-time.Second), t0, nil)
	p.sleep = record
	p.wait(mib/2, at(0)) // below the first step: no look at the clock
	p.wait(16*mib, at(0))
	p.wait(17*mib, at(time.Second)) // late: no wait
	if len(slept) != 1 || slept[0] != 125*time.Millisecond {
		t.Fatalf("slept %v, want [125ms]", slept)
	}
	// Once the active half is half full, the rest goes at full speed.
	active.offset.Store(64 * mib)
	p.wait(20*mib, at(0))
	active.offset.Store(0)
	p.wait(30*mib, at(0))
	if len(slept) != 1 {
		t.Fatalf("slept %v after the valve opened", slept)
	}

	// A half filled slowly is still flushed at flushPaceMinRate: 8 MiB due at 125 ms.
	slept = nil
	p = newFlushPacer(half(128*mib, 10*mib), half(128*mib, 0), t0.Add(-time.Minute), t0, nil)
	p.sleep = record
	p.wait(8*mib, at(0))
	if len(slept) != 1 || slept[0] != 125*time.Millisecond {
		t.Fatalf("slept %v, want [125ms] at the minimum rate", slept)
	}

	// Closing stops the pacing.
	slept = nil
	closing := make(chan struct{})
	p = newFlushPacer(half(128*mib, 64*mib), half(128*mib, 0), t0.Add(-time.Second), t0, closing)
	p.sleep = record
	close(closing)
	p.wait(16*mib, at(0))
	if len(slept) != 0 {
		t.Fatalf("slept %v while closing", slept)
	}

	// No pacing without a known fill time (the first flush), or for an empty half.
	if p := newFlushPacer(half(mib, mib), half(mib, 0), time.Time{}, t0, nil); p != nil {
		t.Fatal("paced a half whose fill time is unknown")
	}
	if p := newFlushPacer(half(mib, 0), half(mib, 0), t0.Add(-time.Second), t0, nil); p != nil {
		t.Fatal("paced an empty half")
	}
	var none *flushPacer
	none.wait(64*mib, at(0)) // a nil pacer does nothing
}
