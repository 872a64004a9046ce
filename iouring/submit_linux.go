//go:build linux

package iouring

import (
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// maxBusyRetries bounds how often one Submit call lets the kernel flush its overflow list
// after EBUSY/EAGAIN before handing ErrBusy to the caller.
const maxBusyRetries = 3

// GetSQE returns the next free SQE, zeroed (a zero SQE is a NOP with user data 0), or nil
// when the SQ is full (submit first) or the ring is closed. The SQE is sent to the kernel by
// the next Submit or SubmitAndWait; fill it before calling either.
func (r *Ring) GetSQE() *SQE {
	if r.closed || r.sqeTail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		return nil
	}
	sqe := &r.sqes[r.sqeTail&r.sqMask]
	r.sqeTail++
	*sqe = SQE{}
	return sqe
}

// SQSpaceLeft returns how many more SQEs GetSQE can hand out before a Submit.
func (r *Ring) SQSpaceLeft() uint32 {
	if r.closed {
		return 0
	}
	return r.sqEntries - (r.sqeTail - atomic.LoadUint32(r.sqHead))
}

// SQReady returns how many SQEs were handed out by GetSQE and not yet consumed by the kernel.
func (r *Ring) SQReady() uint32 {
	if r.closed {
		return 0
	}
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}

// Submit hands every SQE obtained from GetSQE since the last submission to the kernel and
// returns how many the kernel consumed. It does not wait for completions. Errors of single
// operations arrive in their CQEs, not here. On ErrBusy the unsubmitted SQEs stay queued:
// reap completions and call Submit again.
func (r *Ring) Submit() (int, error) { return r.submit(0) }

// SubmitAndWait is Submit followed by waiting until at least n CQEs are ready in the CQ
// (n is capped at the CQ size). Completions held back in the kernel's overflow list are
// flushed into the CQ as room allows; reap with PeekCQE or PeekBatchCQE afterwards.
func (r *Ring) SubmitAndWait(n uint32) (int, error) { return r.submit(n) }

// submit is the loop behind Submit and SubmitAndWait: publish, enter, and retry on EINTR, on
// partial submission and on a wait cut short by a signal.
func (r *Ring) submit(waitNr uint32) (int, error) {
	if r.closed {
		return 0, ErrClosed
	}
	waitNr = min(waitNr, r.cqEntries)
	submitted, busy, stalls := 0, 0, 0
	for {
		pending := r.flushSQ()
		wait := waitNr > 0 && r.CQReady() < waitNr
		if pending == 0 && !wait {
			return submitted, nil
		}
		var flags, minComplete uint32
		if wait {
			flags, minComplete = enterGetEvents, waitNr
		}
		n, err := r.enter(pending, minComplete, flags)
		submitted += n
		switch {
		case err == nil:
			if pending > 0 && n == 0 && !wait {
				// Defensive: the kernel took nothing and reported nothing.
				if stalls++; stalls > maxBusyRetries {
					return submitted, fmt.Errorf("%w: io_uring_enter consumed 0 of %d SQEs", ErrBusy, pending)
				}
			}
		case errors.Is(err, unix.EINTR):
			// Nothing was consumed (the kernel reports a count, not EINTR, once it took SQEs).
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EAGAIN):
			// Completions are backed up (older kernels refuse submission while the CQ
			// overflow list is non-empty) or request allocation failed. If the CQ holds
			// entries only the caller can make room; otherwise let the kernel flush.
			if r.CQReady() > 0 || busy >= maxBusyRetries {
				return submitted, fmt.Errorf("%w: io_uring_enter: %w", ErrBusy, err)
			}
			busy++
			if err := r.getEvents(0); err != nil {
				return submitted, err
			}
		default:
			return submitted, enterError(err)
		}
	}
}

// flushSQ publishes the SQEs handed out since the last call by moving the kernel-visible SQ
// tail, and returns how many published SQEs the kernel has not consumed yet.
func (r *Ring) flushSQ() uint32 {
	if r.sqeHead != r.sqeTail {
		r.sqeHead = r.sqeTail
		// The atomic store orders the plain SQE writes before the tail (release).
		atomic.StoreUint32(r.sqTail, r.sqeTail)
	}
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}

// getEvents enters with GETEVENTS and no submission, waiting for minComplete CQEs (0: just
// run deferred completion work and flush the overflow list). It retries EINTR.
func (r *Ring) getEvents(minComplete uint32) error {
	for {
		_, err := r.enter(0, minComplete, enterGetEvents)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINTR) {
			return enterError(err)
		}
		if minComplete > 0 && r.CQReady() >= minComplete {
			return nil
		}
	}
}

// enter calls io_uring_enter(2) once.
func (r *Ring) enter(toSubmit, minComplete, flags uint32) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd),
		uintptr(toSubmit), uintptr(minComplete), uintptr(flags), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// enterError wraps an io_uring_enter failure, mapping the errnos that have a meaning here.
func enterError(err error) error {
	switch {
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%w: io_uring_enter: %w", ErrWrongThread, err)
	case errors.Is(err, unix.EBADR):
		return fmt.Errorf("%w: io_uring_enter: %w", ErrCQEDropped, err)
	}
	return fmt.Errorf("iouring: io_uring_enter: %w", err)
}
