package diskio

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/iouring"
)

// IOUringAvailable reports whether io_uring can be used here (nil) or why not.
func IOUringAvailable() error { return iouring.Available() }

// EngineFor resolves engine for files of fs: io_uring needs real file descriptors, so any FS
// other than OS (the in-memory test FS) is served by psync; auto becomes io_uring when it is
// available.
func EngineFor(fs FS, engine Engine) Engine {
	if _, ok := fs.(*OS); !ok {
		return EnginePsync
	}
	if engine == EngineAuto {
		if IOUringAvailable() != nil {
			return EnginePsync
		}
		return EngineIOUring
	}
	return engine
}

// uringWriteSyncer serves requests with one ring. The owner's Submit prepares the request's
// SQEs and enters the ring itself: a write (write_fixed for registered buffers), with
// RWF_DSYNC for SyncWrite or linked to an fdatasync for SyncFile. A completer goroutine sleeps
// in the netpoller on an eventfd that the ring signals for every completion, drains the CQ and
// delivers each request's Completion.
//
// Why not one goroutine that owns the ring on a locked thread (SINGLE_ISSUER|DEFER_TASKRUN,
// sleeping in io_uring_enter)? Measured at one record in flight: a goroutine it readies with a
// completion lands on the P that the thread takes into its next blocking io_uring_enter and
// waits for the scheduler's monitor to retake that P, 66 µs (p50) per journal group on a
// 2-vCPU VM, plus 13 µs to ring a doorbell eventfd that woke the thread for each submission.
// A goroutine parked in the netpoller gives its P to the goroutine it readied at once.
type uringWriteSyncer struct {
	depth       int
	ring        *iouring.Ring
	fixed       bool     // buffers are registered: writes use write_fixed
	efd         *os.File // non-blocking eventfd, registered with the ring: pollable
	completions chan Completion
	// free holds the indices of free slots; Submit takes one, the completer returns it before
	// delivering the Completion, so a caller that received it can submit again.
	free    chan int
	exited  chan struct{} // closed by the completer when it is done
	closing atomic.Bool
	// err is the sticky submission error: once a submission failed, nothing is submitted
	// again (an SQE the kernel did not take must never be submitted later). Only the owner
	// reads and writes it.
	err error

	// mu guards slots and broken: the owner fills a slot, the completer reads and clears it.
	mu    sync.Mutex
	slots []uringSlot
	// broken is set when the completer stopped reaping (the ring failed).
	broken error
}

// uringSlot is a request in flight; the user data of its SQEs is slot index*2 (write) and
// slot index*2+1 (sync).
type uringSlot struct {
	req    WriteRequest
	err    error
	needed int // CQEs still expected
}

func newUringWriteSyncer(depth int, registered [][]byte) (WriteSyncer, error) {
	// Each request takes at most 2 SQEs and posts at most 2 CQEs; the CQ is twice the SQ, so
	// it never overflows.
	ring, efd, err := newPolledRing(uint32(2*depth), "io_uring-write-eventfd")
	if err != nil {
		return nil, err
	}
	w := &uringWriteSyncer{
		depth:       depth,
		ring:        ring,
		efd:         efd,
		completions: make(chan Completion, depth),
		free:        make(chan int, depth),
		exited:      make(chan struct{}),
		slots:       make([]uringSlot, depth),
	}
	for i := range depth {
		w.free <- i
	}
	if len(registered) > 0 && len(registered) <= 1<<16 {
		// Without registration every write pins its pages: still correct.
		w.fixed = ring.RegisterBuffers(registered) == nil
	}
	go w.complete()
	return w, nil
}

func (w *uringWriteSyncer) Completions() <-chan Completion { return w.completions }
func (w *uringWriteSyncer) Depth() int                     { return w.depth }
func (w *uringWriteSyncer) Engine() Engine                 { return EngineIOUring }

func (w *uringWriteSyncer) Submit(req WriteRequest) error {
	f, ok := req.File.(interface{ Fd() int })
	if !ok {
		return fmt.Errorf("diskio: io_uring engine needs an OS file, not %T: %w", req.File, ErrUnsupported)
	}
	if w.closing.Load() {
		return errSyncerClosed
	}
	if w.err != nil {
		return w.err
	}
	var i int
	select {
	case i = <-w.free:
	default:
		return ErrTooManyOutstanding
	}
	fd := f.Fd()
	w.mu.Lock()
	if w.broken != nil {
		w.mu.Unlock()
		w.free <- i
		return w.broken
	}
	sqes := 1
	if req.Sync == SyncFile {
		sqes = 2
	}
	w.slots[i] = uringSlot{req: req, needed: sqes}
	sqe := w.ring.GetSQE() // never nil: at most depth requests, 2 SQEs each, are outstanding
	if w.fixed && req.BufIndex >= 0 {
		sqe.PrepWriteFixed(fd, req.Buf, req.Offset, uint16(req.BufIndex))
	} else {
		sqe.PrepWrite(fd, req.Buf, req.Offset)
	}
	sqe.SetUserData(uint64(i * 2))
	switch req.Sync {
	case SyncWrite:
		sqe.SetOpFlags(unix.RWF_DSYNC)
	case SyncFile:
		sqe.SetFlags(iouring.SQEIOLink)
		sync := w.ring.GetSQE()
		sync.PrepFsync(fd, true)
		sync.SetUserData(uint64(i*2 + 1))
	}
	w.mu.Unlock()
	n, err := w.ring.Submit()
	if err == nil {
		return nil
	}
	// The kernel consumes SQEs in order and took the first n of this request's.
	w.err = fmt.Errorf("diskio: io_uring submit: %w", err)
	w.mu.Lock()
	defer w.mu.Unlock()
	if n == 0 {
		w.slots[i] = uringSlot{}
		w.free <- i
		return w.err
	}
	// Only the write went in: its completion carries the failure (it may have come already).
	s := &w.slots[i]
	s.err = cmp.Or(s.err, w.err)
	s.needed -= sqes - n
	if s.needed == 0 {
		w.finish(i)
	}
	return nil
}

// Close waits for the requests in flight, then stops the completer and releases the ring.
func (w *uringWriteSyncer) Close() error {
	if w.closing.Swap(true) {
		<-w.exited
		return nil
	}
	// Wake the completer to look at closing. It may have seen it already and closed efd.
	if _, err := w.efd.Write(one); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("diskio: eventfd write: %w", err)
	}
	<-w.exited
	return nil
}

var errSyncerClosed = errors.New("diskio: write syncer is closed")

var one = func() []byte { b := make([]byte, 8); binary.NativeEndian.PutUint64(b, 1); return b }()

// complete is the completer goroutine: it reaps CQEs whenever the eventfd fires and delivers
// a request's Completion once all its CQEs arrived. It exits once Close was called and nothing
// is in flight.
func (w *uringWriteSyncer) complete() {
	defer close(w.exited)
	defer close(w.completions)
	defer w.efd.Close()
	defer w.ring.Close()
	var counter [8]byte
	cqes := make([]iouring.CQE, 2*w.depth)
	for {
		n, err := w.ring.PeekBatchCQE(cqes)
		if err != nil {
			w.failAll(fmt.Errorf("diskio: io_uring: %w", err))
			return
		}
		w.mu.Lock()
		for _, c := range cqes[:n] {
			w.reaped(c)
		}
		w.mu.Unlock()
		if n == len(cqes) {
			continue
		}
		if w.closing.Load() && len(w.free) == w.depth {
			return
		}
		if _, err := w.efd.Read(counter[:]); err != nil {
			w.failAll(fmt.Errorf("diskio: io_uring eventfd: %w", err))
			return
		}
	}
}

// reaped accounts one CQE to its slot. The caller holds w.mu.
func (w *uringWriteSyncer) reaped(c iouring.CQE) {
	i := int(c.UserData / 2)
	s := &w.slots[i]
	if c.UserData%2 == 0 { // the write
		if err := c.Err(); err != nil {
			s.err = cmp.Or(s.err, fmt.Errorf("diskio: write %s at %d: %w", s.req.File.Name(), s.req.Offset, err))
		} else if int(c.Res) != len(s.req.Buf) {
			s.err = cmp.Or(s.err, fmt.Errorf("diskio: short write %s at %d: %d of %d bytes: %w",
				s.req.File.Name(), s.req.Offset, c.Res, len(s.req.Buf), unix.EIO))
		}
	} else if err := c.Err(); err != nil {
		s.err = cmp.Or(s.err, fmt.Errorf("diskio: fdatasync %s: %w", s.req.File.Name(), err))
	}
	s.needed--
	if s.needed == 0 {
		w.finish(i)
	}
}

// finish frees slot i and delivers its Completion. The caller holds w.mu.
func (w *uringWriteSyncer) finish(i int) {
	s := &w.slots[i]
	done := Completion{ID: s.req.ID, Err: s.err}
	*s = uringSlot{}
	w.free <- i
	w.completions <- done // never blocks: at most depth requests are outstanding
}

// failAll fails every request in flight when the completer can no longer reap, and every
// later Submit.
func (w *uringWriteSyncer) failAll(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.broken = err
	for i := range w.slots {
		if s := &w.slots[i]; s.needed > 0 {
			s.err = err
			w.finish(i)
		}
	}
}
