// Package iouring is ringkeeper's own io_uring binding, written on golang.org/x/sys/unix
// alone. It covers what a journal and an entry log need: ring setup, submission and
// completion, registered (fixed) buffers, the file I/O prep helpers, linked SQEs, and a
// feature/opcode probe. It knows nothing about journals or ledgers. It is Linux-only; on
// other systems only Available (always failing) and the error sentinels exist.
//
// # Ring layout
//
// io_uring_setup returns an fd and fills Params with offsets into three shared mappings:
//
//	SQ ring (IORING_OFF_SQ_RING)        CQ ring (IORING_OFF_CQ_RING)
//	+---------------------------+       +---------------------------+
//	| head   (kernel advances)  |       | head   (we advance)       |
//	| tail   (we advance)       |       | tail   (kernel advances)  |
//	| ring_mask, ring_entries   |       | ring_mask, ring_entries   |
//	| flags  (CQ_OVERFLOW,      |       | overflow (count)          |
//	|         TASKRUN)          |       | cqes[cq_entries]          |
//	| array[sq_entries] ------+ |       |   16 B each: user_data,   |
//	+-------------------------|-+       |   res, flags              |
//	                          |         +---------------------------+
//	SQE array (IORING_OFF_SQES)
//	+-------------------------v-+
//	| sqes[sq_entries], 64 B each: opcode, flags, ioprio, fd, off, addr,
//	| len, op_flags, user_data, buf_index, ...
//	+---------------------------+
//
// With IORING_FEAT_SINGLE_MMAP (5.4+) the SQ and CQ rings share one mapping, which this
// package then maps once; otherwise it maps them separately. The index array is kept as
// the identity, so ring slot i always holds sqes[i]. Head and tail words are read and
// written with sync/atomic: a producer writes its entries and then stores the tail
// (release), a consumer loads the tail (acquire) before reading entries and stores the
// head after. Go's atomics are sequentially consistent, which is stronger than the
// kernel needs.
//
// # Life of an operation
//
//	sqe := r.GetSQE()                  // nil when the SQ is full
//	sqe.PrepWriteFixed(fd, buf, off, 0) // each Prep zeroes the SQE first
//	sqe.SetUserData(id)
//	sqe.SetFlags(iouring.SQEIOLink)     // optional
//	r.SubmitAndWait(1)                  // or Submit, then WaitCQE later
//	n, _ := r.PeekBatchCQE(cqes)        // copies CQEs out and consumes them
//
// A CQE carries the SQE's user data and the result: bytes transferred or 0, or -errno
// (CQE.Err turns that into a unix.Errno). Operations complete in any order; match them by
// user data.
//
// # Contract
//
// One owner goroutine per Ring. A Ring has no locks: GetSQE, the Prep methods, Submit, the
// Wait and Peek methods and Close must all be called by one goroutine (or be otherwise
// serialized). Completion pointers from PeekCQE and WaitCQE point into the ring and are
// valid only until CQESeen or Advance; PeekBatchCQE copies instead.
//
// Thread binding (Options.SingleIssuer). By default the ring is set up without
// IORING_SETUP_SINGLE_ISSUER and IORING_SETUP_DEFER_TASKRUN, so the owner goroutine may
// migrate between OS threads as Go schedules it. With SingleIssuer the kernel binds the
// ring to the OS thread that created it and runs completion work only when that thread
// enters the kernel with GETEVENTS (which every Submit, Wait and Peek method here does when
// needed); the owner must call runtime.LockOSThread before New and stay locked until
// Close, or calls fail with ErrWrongThread. Kernels without these flags (before 6.1) get a
// plain ring; Ring.Flags reports what was set up.
//
// Buffer lifetime. The kernel reads and writes buffers by address, after the Prep call
// returns and possibly after Submit returns. The caller keeps every buffer alive and in
// place until its CQE has been reaped: ringkeeper uses mmap'd, aligned memory, which the
// garbage collector neither moves nor frees. Never hand the kernel memory that might live
// on a goroutine stack. Registered buffers (RegisterBuffers) stay pinned until
// UnregisterBuffers or Close. Close does not wait for operations in flight.
//
// Linked SQEs. SQEIOLink on an SQE makes the next SQE in the same submission start only
// after it completes successfully; the last SQE of a chain has no link flag. A chain ends
// with its Submit call, so check SQSpaceLeft for the whole chain before starting it (GetSQE
// returns nil when the SQ is full, and submitting half a chain breaks it). If a member
// fails (a negative Res, or a short read or write), every later member of the chain
// completes with -ECANCELED and does nothing. A write linked to an fdatasync therefore
// never reports a sync that did not cover the write. SQEIODrain makes an SQE wait for all
// earlier ones.
//
// Completion overflow. New requires IORING_FEAT_NODROP (5.5+): when more completions arrive
// than the CQ holds, the kernel keeps the rest in an overflow list and sets
// IORING_SQ_CQ_OVERFLOW. PeekCQE, PeekBatchCQE and the waits enter the kernel to flush that
// list into the CQ as room is made, so no completion is lost. Older kernels refuse new
// submissions with EBUSY while the list is non-empty: Submit then lets the kernel flush if
// the CQ is empty and retries, and otherwise returns ErrBusy, with the unsubmitted SQEs
// still queued, so that the caller reaps and calls Submit again. If the kernel could not even allocate an overflow entry
// it reports EBADR, returned as ErrCQEDropped.
//
// Availability. io_uring is often unavailable: container seccomp profiles block its system
// calls and the kernel.io_uring_disabled sysctl can turn it off. Available sets up a tiny
// ring and round-trips a NOP; callers use it at start-up to choose a pread/pwrite fallback.
//
// Not covered: SQPOLL and IOPOLL rings, SQE128/CQE32, registered files, provided buffers,
// timeouts and networking helpers (PrepRW reaches other opcodes).
package iouring
