package diskio

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/iouring"
)

// uringReader serves the reads of every OS file through one shared ring, so that a read
// waiting for the disk holds no Go P. A blocking pread keeps its P until the scheduler's
// monitor retakes it (up to milliseconds later), so with few Ps concurrent cold reads queue
// behind one another: on 2 cores, 32 random reads in flight ran at a quarter of the disk's
// random-read rate with pread, and most of it with more Ps than cores.
//
// A reader takes a slot (the slots bound reads in flight), queues its request and, unless
// another reader is submitting already, becomes the submitter: it submits whatever requests
// have queued up with one io_uring_enter (on a VM each submission is an exit to the host:
// batching them matters) until none is left, then waits on its slot. Readers come back in
// waves (the completer wakes every reader of a batch of completions, and they run one after
// another), so a would-be submitter that sees woken readers not yet resumed yields once first:
// their next reads then go out in its submission instead of one io_uring_enter each (cold
// random reads at 32 in flight: 13-19% more reads/s, BENCHMARKS.md). No goroutine sits between
// a reader and the ring (a hand-off to a submitter goroutine cost a wake-up per read). The
// completer goroutine sleeps in the netpoller on an eventfd that the ring signals for every
// completion, drains the CQ and wakes each slot's reader. Ring and completer live as long as
// the process (one for all files; see sharedReader).
type uringReader struct {
	ring  *iouring.Ring
	efd   *os.File // non-blocking eventfd, registered with the ring: pollable
	slots []readSlot
	free  chan int // free slot indices

	// mu guards queued, spare and submitting: the requests waiting for a submitter, and
	// whether a reader is submitting (it alone touches the ring's submission side).
	mu         sync.Mutex
	queued     []readReq
	spare      []readReq
	submitting bool
	// broken is set when a submission fails: its SQEs may still be queued, so the ring is not
	// trusted again and reads fall back to pread.
	broken atomic.Bool
	// brokenCh is closed when broken is set (markBroken): reads waiting for a slot then fall
	// back to pread instead of waiting for slots that a broken ring never gives back.
	brokenCh   chan struct{}
	brokenOnce sync.Once
	// woken counts the readers handed a completion that have not yet resumed (see enqueue).
	// Once the ring is broken it may stay above zero (a late completion for a read told it
	// was not submitted): harmless, since a broken ring takes no more reads.
	woken atomic.Int64
}

type readReq struct {
	fd   int
	p    []byte
	off  int64
	slot int
}

// notSubmitted is the result a reader gets when its read could not be submitted.
const notSubmitted = math.MinInt32

type readSlot struct {
	// buf is the read's buffer while the kernel may write to it. Storing it in a heap object
	// also makes every caller's buffer escape to the heap: a goroutine stack can move while
	// its goroutine waits, a heap object cannot.
	buf []byte
	// done carries the read's result (bytes or -errno) from the completer; capacity 1.
	done chan int32
}

// uringReadSlots bounds the reads in flight through the shared ring (more wait for a slot).
const uringReadSlots = 256

var (
	sharedReaderOnce sync.Once
	sharedReader     *uringReader // nil when io_uring is unavailable
)

// readerFor returns the shared io_uring reader, or nil if reads should use pread.
func readerFor() *uringReader {
	sharedReaderOnce.Do(func() {
		if IOUringAvailable() != nil {
			return
		}
		r, err := newURingReader(uringReadSlots)
		if err != nil {
			return
		}
		sharedReader = r
	})
	if r := sharedReader; r != nil && !r.broken.Load() {
		return r
	}
	return nil
}

// newPolledRing sets up a ring of entries SQEs whose completions signal a non-blocking
// eventfd, returned as a file that a goroutine can wait on in the netpoller.
func newPolledRing(entries uint32, name string) (*iouring.Ring, *os.File, error) {
	ring, err := iouring.New(entries, iouring.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("diskio: io_uring setup: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		ring.Close()
		return nil, nil, fmt.Errorf("diskio: eventfd: %w", err)
	}
	if err := ring.RegisterEventFD(efd); err != nil {
		unix.Close(efd)
		ring.Close()
		return nil, nil, err
	}
	return ring, os.NewFile(uintptr(efd), name), nil
}

func newURingReader(slots int) (*uringReader, error) {
	ring, efd, err := newPolledRing(uint32(slots), "io_uring-read-eventfd")
	if err != nil {
		return nil, err
	}
	r := &uringReader{
		ring:     ring,
		efd:      efd,
		slots:    make([]readSlot, slots),
		free:     make(chan int, slots),
		queued:   make([]readReq, 0, slots),
		spare:    make([]readReq, 0, slots),
		brokenCh: make(chan struct{}),
	}
	for i := range r.slots {
		r.slots[i].done = make(chan int32, 1)
		r.free <- i
	}
	go r.complete()
	return r, nil
}

// pread reads into p at off from fd once (a short read is possible, as with pread(2)); ok is
// false if the ring could not take the read, which the caller then does with pread.
func (r *uringReader) pread(fd int, p []byte, off int64) (n int, err error, ok bool) {
	var i int
	select {
	case i = <-r.free:
	case <-r.brokenCh:
		return 0, nil, false
	}
	s := &r.slots[i]
	s.buf = p
	r.enqueue(readReq{fd: fd, p: p, off: off, slot: i})
	res := <-s.done
	s.buf = nil
	if res == notSubmitted {
		return 0, nil, false // the slot stays taken: a late completion for it must not reach a new read
	}
	r.woken.Add(-1)
	r.free <- i
	if res < 0 {
		return 0, unix.Errno(-res), true
	}
	return int(res), nil, true
}

// markBroken stops the ring taking reads, and wakes the reads waiting for a slot.
func (r *uringReader) markBroken() {
	r.broken.Store(true)
	r.brokenOnce.Do(func() { close(r.brokenCh) })
}

// enqueue queues req and, if no reader is submitting, submits everything queued until the
// queue is empty (requests queued meanwhile by other readers included).
func (r *uringReader) enqueue(req readReq) {
	r.mu.Lock()
	r.queued = append(r.queued, req)
	if !r.submitting && r.woken.Load() > 0 {
		// Readers that the completer has woken are about to queue their next reads: let them
		// run first, once, and submit theirs with this one.
		r.mu.Unlock()
		runtime.Gosched()
		r.mu.Lock()
	}
	if r.submitting || len(r.queued) == 0 {
		r.mu.Unlock()
		return
	}
	r.submitting = true
	for len(r.queued) > 0 {
		batch := r.queued
		r.queued, r.spare = r.spare, nil
		r.mu.Unlock()
		r.submit(batch)
		r.mu.Lock()
		r.spare = batch[:0]
	}
	r.submitting = false
	r.mu.Unlock()
}

// submit prepares an SQE for each request of batch and submits them together; one reader at
// a time calls it. If a submission fails, the reads the kernel took still complete normally;
// the others are told they were not submitted, and from then on nothing is submitted again
// (an SQE left in the ring must never be submitted after its reader gave up on it).
func (r *uringReader) submit(batch []readReq) {
	if r.broken.Load() {
		for _, req := range batch {
			r.slots[req.slot].done <- notSubmitted
		}
		return
	}
	for _, req := range batch {
		sqe := r.ring.GetSQE() // never nil: at most len(slots) reads are outstanding
		sqe.PrepRead(req.fd, req.p, req.off)
		sqe.SetUserData(uint64(req.slot))
	}
	// Each Submit hands the kernel everything queued (it retries until it took it all or
	// fails), so the kernel consumes a batch in order: the first n.
	n, err := r.ring.Submit()
	if err != nil {
		r.markBroken()
		for _, req := range batch[min(n, len(batch)):] {
			r.slots[req.slot].done <- notSubmitted
		}
	}
}

// complete is the completer goroutine.
func (r *uringReader) complete() {
	var counter [8]byte
	cqes := make([]iouring.CQE, 64)
	for {
		if _, err := r.efd.Read(counter[:]); err != nil {
			r.markBroken()
			return
		}
		for {
			n, err := r.ring.PeekBatchCQE(cqes)
			for _, c := range cqes[:n] {
				r.woken.Add(1)
				select {
				case r.slots[c.UserData].done <- c.Res:
				default: // a read already told it was not submitted (the ring broke)
					r.woken.Add(-1)
				}
			}
			if err != nil || n < len(cqes) {
				break
			}
		}
	}
}
