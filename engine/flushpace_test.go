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
	expect := func(want ...time.Duration) {
		t.Helper()
		if len(slept) != len(want) {
			t.Fatalf("slept %v, want %v", slept, want)
		}
		for i := range want {
			if d := slept[i] - want[i]; d < -time.Microsecond || d > time.Microsecond {
				t.Fatalf("slept %v, want %v", slept, want)
			}
		}
	}

	// A 64 MiB half filled in 1 s; the active half (64 MiB) is expected to reach 48 MiB
	// (flushPaceDone) 0.75 s on. 16 MiB written at once leave 48 MiB for 0.75 s: 64 MiB/s,
	// so the 16 MiB are due at 250 ms.
	active := half(64*mib, 0)
	p := newFlushPacer(half(64*mib, 64*mib), active, t0.Add(-time.Second), t0, nil)
	p.sleep = record
	p.wait(mib/2, at(0)) // below the first step: no look at the clock
	p.wait(16*mib, at(0))
	expect(250 * time.Millisecond)
	// The adds speed up: 24 MiB in 250 ms is 96 MiB/s, so 48 MiB is 250 ms away and the
	// last 32 MiB must go at 128 MiB/s: the next 16 MiB are due 125 ms on.
	active.offset.Store(24 * mib)
	p.wait(32*mib, at(250*time.Millisecond))
	expect(250*time.Millisecond, 125*time.Millisecond)
	// Late: no wait, and no sleeps owed from before.
	p.wait(33*mib, at(time.Second))
	p.wait(34*mib, at(time.Second+time.Millisecond))
	if len(slept) != 3 || slept[2] > 20*time.Millisecond {
		t.Fatalf("slept %v after being late", slept)
	}
	// Once the active half reaches flushPaceDone, the rest goes at full speed.
	active.offset.Store(48 * mib)
	p.wait(40*mib, at(2*time.Second))
	active.offset.Store(0)
	p.wait(50*mib, at(2*time.Second))
	if len(slept) != 3 {
		t.Fatalf("slept %v after the active half reached flushPaceDone", slept)
	}

	// A half filled slowly is still flushed at flushPaceMinRate: 8 MiB due at 125 ms.
	slept = nil
	p = newFlushPacer(half(128*mib, 10*mib), half(128*mib, 0), t0.Add(-time.Minute), t0, nil)
	p.sleep = record
	p.wait(8*mib, at(0))
	expect(125 * time.Millisecond)

	// Closing stops the pacing.
	slept = nil
	closing := make(chan struct{})
	p = newFlushPacer(half(128*mib, 64*mib), half(128*mib, 0), t0.Add(-time.Second), t0, closing)
	p.sleep = record
	close(closing)
	p.wait(16*mib, at(0))
	expect()

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
