package iouring

import "errors"

// Sentinel errors. Every error returned by this package wraps one of these (and, where a
// system call failed, the unix.Errno as well), so callers branch with errors.Is only.
var (
	// ErrUnavailable: io_uring cannot be used here (kernel without io_uring, a seccomp
	// profile that blocks the io_uring system calls, or kernel.io_uring_disabled). Callers
	// fall back to pread/pwrite.
	ErrUnavailable = errors.New("iouring: io_uring unavailable")
	// ErrClosed: the Ring was used after Close.
	ErrClosed = errors.New("iouring: ring closed")
	// ErrSQFull: no free submission queue entry; submit (and reap) first.
	ErrSQFull = errors.New("iouring: submission queue full")
	// ErrBusy: the kernel refused new submissions (EBUSY or EAGAIN) because completions
	// are backed up; reap completions and call Submit again. Unsubmitted SQEs stay queued.
	ErrBusy = errors.New("iouring: kernel busy, reap completions and retry")
	// ErrWrongThread: a Ring set up with Options.SingleIssuer was entered from an OS thread
	// other than the one that created it (EEXIST); see Options.SingleIssuer.
	ErrWrongThread = errors.New("iouring: single-issuer ring used from another OS thread")
	// ErrCQEDropped: the kernel dropped completions (EBADR) because it could not allocate
	// an overflow entry. Completions were lost; the ring's state can no longer be trusted.
	ErrCQEDropped = errors.New("iouring: kernel dropped completions")
	// ErrInvalidArgument: a caller-supplied argument was rejected before any system call.
	ErrInvalidArgument = errors.New("iouring: invalid argument")
)
