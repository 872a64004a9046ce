//go:build linux

package iouring

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Err returns nil for a non-negative Res and the unix.Errno for a negative one.
func (c CQE) Err() error {
	if c.Res >= 0 {
		return nil
	}
	return unix.Errno(-c.Res)
}

// CQReady returns how many CQEs are in the CQ ring, ready to be reaped. Completions still
// held by the kernel (overflow list, deferred task work) are not counted.
func (r *Ring) CQReady() uint32 {
	if r.closed {
		return 0
	}
	return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
}

// CQDropped returns the kernel's cq.overflow counter: completions that were lost. With
// IORING_FEAT_NODROP (required by New) completions that do not fit the CQ are kept in an
// overflow list and not counted here; the counter moves only if the kernel could not
// allocate an overflow entry, in which case waits also fail with ErrCQEDropped.
func (r *Ring) CQDropped() uint32 {
	if r.closed {
		return 0
	}
	return atomic.LoadUint32(r.cqOverflow)
}

// needsFlush reports whether the kernel holds completions outside the CQ ring: overflowed
// ones, or (with Options.SingleIssuer) deferred task work that only io_uring_enter runs.
func (r *Ring) needsFlush() bool {
	return atomic.LoadUint32(r.sqFlags)&(sqCQOverflow|sqTaskrun) != 0
}

// PeekCQE returns the oldest ready CQE without waiting, or nil, nil when there is none.
// The CQE points into the ring: read it, then call CQESeen (or Advance(1)) before the next
// Peek or Wait; do not keep the pointer. If the ring is empty but the kernel holds
// completions back, PeekCQE enters the kernel once to flush them.
func (r *Ring) PeekCQE() (*CQE, error) {
	if r.closed {
		return nil, ErrClosed
	}
	if c := r.head(); c != nil {
		return c, nil
	}
	if !r.needsFlush() {
		return nil, nil
	}
	if err := r.getEvents(0); err != nil {
		return nil, err
	}
	return r.head(), nil
}

// WaitCQE returns the oldest CQE, blocking until one arrives. The same rules as for PeekCQE
// apply. It blocks forever if nothing is in flight.
func (r *Ring) WaitCQE() (*CQE, error) {
	for {
		c, err := r.PeekCQE()
		if c != nil || err != nil {
			return c, err
		}
		if err := r.getEvents(1); err != nil {
			return nil, err
		}
	}
}

// CQESeen marks c, which must be the CQE just returned by PeekCQE or WaitCQE, as consumed so
// that the kernel can reuse its slot.
func (r *Ring) CQESeen(c *CQE) {
	if c != r.head() {
		panic(fmt.Errorf("%w: CQESeen on a CQE that is not the oldest ready one", ErrInvalidArgument))
	}
	r.Advance(1)
}

// Advance marks the n oldest ready CQEs as consumed. n must not exceed CQReady.
func (r *Ring) Advance(n uint32) {
	if n > r.CQReady() {
		panic(fmt.Errorf("%w: Advance(%d) with %d CQEs ready", ErrInvalidArgument, n, r.CQReady()))
	}
	// The atomic store orders our reads of the CQEs before the kernel may overwrite them.
	atomic.StoreUint32(r.cqHead, atomic.LoadUint32(r.cqHead)+n)
}

// PeekBatchCQE copies up to len(dst) ready CQEs into dst, marks them consumed, and returns how
// many it copied, without waiting. It flushes completions the kernel holds back (CQ overflow,
// deferred task work) when the ring alone cannot fill dst. The copies do not alias the ring.
func (r *Ring) PeekBatchCQE(dst []CQE) (int, error) {
	if r.closed {
		return 0, ErrClosed
	}
	n := r.copyOut(dst)
	for n < len(dst) && r.needsFlush() {
		if err := r.getEvents(0); err != nil {
			return n, err
		}
		k := r.copyOut(dst[n:])
		if k == 0 {
			break
		}
		n += k
	}
	return n, nil
}

// head returns the oldest ready CQE in the ring, or nil.
func (r *Ring) head() *CQE {
	if r.closed {
		return nil
	}
	h := atomic.LoadUint32(r.cqHead)
	// The atomic load of the tail orders the kernel's CQE writes before our reads (acquire).
	if h == atomic.LoadUint32(r.cqTail) {
		return nil
	}
	return &r.cqes[h&r.cqMask]
}

// copyOut copies ready CQEs from the ring into dst and consumes them.
func (r *Ring) copyOut(dst []CQE) int {
	h := atomic.LoadUint32(r.cqHead)
	n := min(atomic.LoadUint32(r.cqTail)-h, uint32(len(dst)))
	for i := range n {
		dst[i] = r.cqes[(h+i)&r.cqMask]
	}
	if n > 0 {
		atomic.StoreUint32(r.cqHead, h+n)
	}
	return int(n)
}
