package diskio

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"

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

// uringWriteSyncer serves requests with one ring owned by one goroutine (locked to its OS
// thread, so the ring can use SINGLE_ISSUER|DEFER_TASKRUN). Each request is a write (write_fixed
// for registered buffers): with RWF_DSYNC for SyncWrite, linked to an fdatasync for SyncFile. The goroutine sleeps in the kernel waiting for
// completions; new requests wake it through a doorbell: a read on an eventfd that is always
// pending in the ring and that Submit makes readable.
type uringWriteSyncer struct {
	depth       int
	requests    chan WriteRequest
	completions chan Completion
	eventfd     int
	// doorbell is mmap'd memory for the pending eventfd read (the kernel writes it later).
	doorbell *Slab

	// mu guards closed.
	mu     sync.Mutex
	closed bool
}

const doorbellUserData = ^uint64(0)

// uringSlot is a request in flight; the user data of its SQEs is slot index*2 (write) and
// slot index*2+1 (sync).
type uringSlot struct {
	req    WriteRequest
	busy   bool
	err    error
	needed int // CQEs still expected
}

func newUringWriteSyncer(depth int, registered [][]byte) (WriteSyncer, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("diskio: eventfd: %w", err)
	}
	doorbell, err := NewSlab(8, 1)
	if err != nil {
		unix.Close(efd)
		return nil, err
	}
	w := &uringWriteSyncer{
		depth:       depth,
		requests:    make(chan WriteRequest, depth),
		completions: make(chan Completion, depth),
		eventfd:     efd,
		doorbell:    doorbell,
	}
	started := make(chan error, 1)
	go w.run(registered, started)
	if err := <-started; err != nil {
		unix.Close(efd)
		doorbell.Close()
		return nil, err
	}
	return w, nil
}

func (w *uringWriteSyncer) Completions() <-chan Completion { return w.completions }
func (w *uringWriteSyncer) Depth() int                     { return w.depth }
func (w *uringWriteSyncer) Engine() Engine                 { return EngineIOUring }

var one = func() []byte { b := make([]byte, 8); binary.NativeEndian.PutUint64(b, 1); return b }()

func (w *uringWriteSyncer) ring() error {
	for {
		_, err := unix.Write(w.eventfd, one)
		if err != unix.EINTR {
			if err != nil {
				return fmt.Errorf("diskio: eventfd write: %w", err)
			}
			return nil
		}
	}
}

func (w *uringWriteSyncer) Submit(req WriteRequest) error {
	if _, ok := req.File.(interface{ Fd() int }); !ok {
		return fmt.Errorf("diskio: io_uring engine needs an OS file, not %T: %w", req.File, ErrUnsupported)
	}
	select {
	case w.requests <- req:
	default:
		return ErrTooManyOutstanding
	}
	return w.ring()
}

func (w *uringWriteSyncer) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	close(w.requests)
	w.mu.Unlock()
	return w.ring()
}

// run owns the ring until the requests channel is closed and nothing is in flight.
func (w *uringWriteSyncer) run(registered [][]byte, started chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	entries := uint32(2*w.depth + 2)
	ring, err := iouring.New(entries, iouring.Options{SingleIssuer: true})
	if err != nil {
		started <- fmt.Errorf("diskio: io_uring setup: %w", err)
		return
	}
	fixed := len(registered) > 0 && len(registered) <= 1<<16
	if fixed {
		if err := ring.RegisterBuffers(registered); err != nil {
			fixed = false // still correct, just pins pages per write
		}
	}
	slots := make([]uringSlot, w.depth)
	inFlight := 0
	armed := false
	arm := func() {
		sqe := ring.GetSQE()
		sqe.PrepRead(w.eventfd, w.doorbell.Buffer(0)[:8], 0)
		sqe.SetUserData(doorbellUserData)
		armed = true
	}
	arm()
	if _, err := ring.Submit(); err != nil {
		ring.Close()
		started <- fmt.Errorf("diskio: io_uring submit: %w", err)
		return
	}
	started <- nil

	cqes := make([]iouring.CQE, 2*w.depth+2)
	open := true
	fail := func(err error) {
		// The ring itself broke: fail everything in flight and every later request.
		for i := range slots {
			if slots[i].busy {
				slots[i].busy = false
				inFlight--
				w.completions <- Completion{ID: slots[i].req.ID, Err: err}
			}
		}
	}
	var ringErr error
	for open || inFlight > 0 {
		if _, err := ring.SubmitAndWait(1); err != nil && ringErr == nil {
			ringErr = fmt.Errorf("diskio: io_uring: %w", err)
			fail(ringErr)
		}
		n, err := ring.PeekBatchCQE(cqes)
		if err != nil && ringErr == nil {
			ringErr = fmt.Errorf("diskio: io_uring: %w", err)
			fail(ringErr)
		}
		for _, c := range cqes[:n] {
			if c.UserData == doorbellUserData {
				armed = false
				continue
			}
			s := &slots[c.UserData/2]
			if c.UserData%2 == 0 { // the write
				if err := c.Err(); err != nil {
					s.err = fmt.Errorf("diskio: write %s at %d: %w", s.req.File.Name(), s.req.Offset, err)
				} else if int(c.Res) != len(s.req.Buf) {
					s.err = fmt.Errorf("diskio: short write %s at %d: %d of %d bytes: %w",
						s.req.File.Name(), s.req.Offset, c.Res, len(s.req.Buf), unix.EIO)
				}
			} else if err := c.Err(); err != nil && s.err == nil {
				s.err = fmt.Errorf("diskio: fdatasync %s: %w", s.req.File.Name(), err)
			}
			s.needed--
			if s.needed == 0 {
				s.busy = false
				inFlight--
				w.completions <- Completion{ID: s.req.ID, Err: s.err}
				s.req = WriteRequest{}
			}
		}
		if !open {
			continue
		}
		// Take new requests (the doorbell may or may not have fired for them yet).
	take:
		for inFlight < w.depth {
			select {
			case req, ok := <-w.requests:
				if !ok {
					open = false
					break take
				}
				if ringErr != nil {
					w.completions <- Completion{ID: req.ID, Err: ringErr}
					continue
				}
				i := 0
				for slots[i].busy {
					i++
				}
				s := &slots[i]
				*s = uringSlot{req: req, busy: true, needed: 1}
				inFlight++
				fd := req.File.(interface{ Fd() int }).Fd()
				sqe := ring.GetSQE()
				if fixed && req.BufIndex >= 0 {
					sqe.PrepWriteFixed(fd, req.Buf, req.Offset, uint16(req.BufIndex))
				} else {
					sqe.PrepWrite(fd, req.Buf, req.Offset)
				}
				sqe.SetUserData(uint64(i * 2))
				if req.Sync == SyncWrite {
					sqe.SetOpFlags(unix.RWF_DSYNC)
				}
				if req.Sync == SyncFile {
					sqe.SetFlags(iouring.SQEIOLink)
					sync := ring.GetSQE()
					sync.PrepFsync(fd, true)
					sync.SetUserData(uint64(i*2 + 1))
					s.needed = 2
				}
			default:
				break take
			}
		}
		if open && !armed {
			arm()
		}
	}
	ring.Close()
	unix.Close(w.eventfd)
	w.doorbell.Close()
	close(w.completions)
}
