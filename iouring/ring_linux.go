//go:build linux

package iouring

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Options configures New. The zero value is valid: a plain ring whose CQ is twice the SQ,
// usable from any goroutine (one at a time; see the package doc).
type Options struct {
	// CQEntries, when non-zero, sizes the completion queue (IORING_SETUP_CQSIZE). The kernel
	// rounds it up to a power of two. It must be at least the SQ size and at most 65536.
	CQEntries uint32

	// SingleIssuer asks for IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
	// IORING_SETUP_TASKRUN_FLAG: completions are processed only when the ring's owner calls
	// io_uring_enter (any Submit, Wait or Peek method here), which saves interrupts and
	// context switches. The kernel then binds the ring to the OS thread that created it and
	// fails io_uring_enter and io_uring_register from any other thread with EEXIST (reported
	// as ErrWrongThread). So the owner goroutine must call runtime.LockOSThread before New
	// and keep the thread locked until Close. If the kernel rejects these flags (before 6.1)
	// New silently falls back to a plain ring; Ring.Flags tells which one you got.
	SingleIssuer bool
}

// validate checks the options against the requested SQ size.
func (o Options) validate(entries uint32) error {
	if entries == 0 || entries > maxEntries {
		return fmt.Errorf("%w: entries %d not in [1, %d]", ErrInvalidArgument, entries, maxEntries)
	}
	if o.CQEntries != 0 && (o.CQEntries < entries || o.CQEntries > maxCQEntries) {
		return fmt.Errorf("%w: CQEntries %d not in [entries=%d, %d]",
			ErrInvalidArgument, o.CQEntries, entries, maxCQEntries)
	}
	return nil
}

// Ring is one io_uring instance: the submission queue (SQ), the completion queue (CQ) and
// the SQE array, all mapped from the kernel. A Ring is not safe for concurrent use: one owner
// goroutine prepares, submits and reaps (see the package doc).
type Ring struct {
	fd       int
	flags    SetupFlag // flags the kernel accepted
	features Feature
	closed   bool

	sqRing []byte // mmap of the SQ ring (and of the CQ ring too with FeatSingleMmap)
	cqRing []byte // separate mmap of the CQ ring; nil with FeatSingleMmap
	sqeMem []byte // mmap of the SQE array

	// Submission queue. sqHead is written by the kernel, sqTail by us.
	sqHead    *uint32
	sqTail    *uint32
	sqFlags   *uint32
	sqMask    uint32
	sqEntries uint32
	sqes      []SQE
	sqeHead   uint32 // first SQE handed out but not yet published in *sqTail
	sqeTail   uint32 // next SQE to hand out

	// Completion queue. cqTail is written by the kernel, cqHead by us.
	cqHead     *uint32
	cqTail     *uint32
	cqOverflow *uint32
	cqMask     uint32
	cqEntries  uint32
	cqes       []CQE

	// bufs are the registered buffers, referenced here so that GC memory stays reachable
	// while the kernel has it pinned.
	bufs [][]byte
}

// New sets up a ring with at least entries SQ slots (rounded up to a power of two by the
// kernel; clamped to the kernel maximum). If io_uring is blocked or missing the error wraps
// ErrUnavailable and the unix.Errno (EPERM, ENOSYS or EACCES).
func New(entries uint32, opts Options) (*Ring, error) {
	if err := opts.validate(entries); err != nil {
		return nil, err
	}
	base := SetupClamp
	if opts.CQEntries != 0 {
		base |= SetupCQSize
	}
	// Optional groups, dropped newest-first when the kernel answers EINVAL.
	optional := []SetupFlag{SetupSubmitAll} // 5.18
	if opts.SingleIssuer {
		optional = append(optional, SetupSingleIssuer|SetupDeferTaskrun|SetupTaskrunFlag) // 6.1
	}
	for {
		flags := base
		for _, f := range optional {
			flags |= f
		}
		p := Params{Flags: flags, CQEntries: opts.CQEntries}
		fd, err := setup(entries, &p)
		if errors.Is(err, unix.EINVAL) && len(optional) > 0 {
			optional = optional[:len(optional)-1]
			continue
		}
		if err != nil {
			return nil, setupError(err)
		}
		r := &Ring{fd: fd, flags: flags, features: p.Features}
		if err := r.mapRings(&p); err != nil {
			r.unmap()
			unix.Close(fd)
			return nil, err
		}
		return r, nil
	}
}

// setup calls io_uring_setup(2).
func setup(entries uint32, p *Params) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// setupError wraps an io_uring_setup failure, marking the "disabled here" errnos with
// ErrUnavailable and naming the likely cause.
func setupError(err error) error {
	switch {
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%w: io_uring_setup: %w (kernel built without io_uring, or blocked by seccomp)",
			ErrUnavailable, err)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: io_uring_setup: %w (%s)", ErrUnavailable, err, disabledHint())
	}
	return fmt.Errorf("iouring: io_uring_setup: %w", err)
}

// disabledHint names the sysctl value when it explains an EPERM.
func disabledHint() string {
	b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled")
	if err == nil {
		if v := strings.TrimSpace(string(b)); v != "0" {
			return "kernel.io_uring_disabled=" + v
		}
	}
	return "blocked by a seccomp profile or kernel.io_uring_disabled"
}

// mapRings maps the SQ ring, the CQ ring (shared with the SQ ring when the kernel has
// FeatSingleMmap) and the SQE array, and resolves the pointers into them.
func (r *Ring) mapRings(p *Params) error {
	if !p.Features.Has(FeatNoDrop) {
		// Without NODROP (kernels before 5.5) completions are lost on CQ overflow.
		return fmt.Errorf("%w: kernel lacks IORING_FEAT_NODROP", ErrUnavailable)
	}
	sqSize := int(p.sqOff.array) + int(p.SQEntries)*4
	cqSize := int(p.cqOff.cqes) + int(p.CQEntries)*int(unsafe.Sizeof(CQE{}))
	if p.Features.Has(FeatSingleMmap) {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqRing, err = mmap(r.fd, offSQRing, sqSize); err != nil {
		return err
	}
	cqMem := r.sqRing
	if !p.Features.Has(FeatSingleMmap) {
		if r.cqRing, err = mmap(r.fd, offCQRing, cqSize); err != nil {
			return err
		}
		cqMem = r.cqRing
	}
	if r.sqeMem, err = mmap(r.fd, offSQEs, int(p.SQEntries)*int(unsafe.Sizeof(SQE{}))); err != nil {
		return err
	}

	r.sqMask = *u32At(r.sqRing, p.sqOff.ringMask)
	r.sqEntries = *u32At(r.sqRing, p.sqOff.ringEntries)
	r.cqMask = *u32At(cqMem, p.cqOff.ringMask)
	r.cqEntries = *u32At(cqMem, p.cqOff.ringEntries)
	if r.sqEntries != p.SQEntries || r.cqEntries != p.CQEntries ||
		r.sqMask != r.sqEntries-1 || r.cqMask != r.cqEntries-1 {
		return fmt.Errorf("iouring: inconsistent ring geometry: sq %d/%d mask %#x, cq %d/%d mask %#x",
			r.sqEntries, p.SQEntries, r.sqMask, r.cqEntries, p.CQEntries, r.cqMask)
	}

	r.sqHead = u32At(r.sqRing, p.sqOff.head)
	r.sqTail = u32At(r.sqRing, p.sqOff.tail)
	r.sqFlags = u32At(r.sqRing, p.sqOff.flags)
	r.sqes = unsafe.Slice((*SQE)(unsafe.Pointer(&r.sqeMem[0])), r.sqEntries)
	// The SQ index array maps ring slots to SQEs; keep it the identity so that slot
	// i always holds sqes[i]. The kernel reads it only during io_uring_enter.
	array := unsafe.Slice(u32At(r.sqRing, p.sqOff.array), r.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}

	r.cqHead = u32At(cqMem, p.cqOff.head)
	r.cqTail = u32At(cqMem, p.cqOff.tail)
	r.cqOverflow = u32At(cqMem, p.cqOff.overflow)
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&cqMem[p.cqOff.cqes])), r.cqEntries)
	return nil
}

// mmap maps length bytes of the ring fd at the given magic offset.
func mmap(fd int, off int64, length int) ([]byte, error) {
	b, err := unix.Mmap(fd, off, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("iouring: mmap ring offset %#x (%d bytes): %w", off, length, err)
	}
	return b, nil
}

// u32At points at the 32-bit word at off in mem; the index expression bounds-checks off.
func u32At(mem []byte, off uint32) *uint32 {
	_ = mem[off+3]
	return (*uint32)(unsafe.Pointer(&mem[off]))
}

// unmap releases whatever mapRings mapped and clears the pointers into it, so that a use
// after Close is a nil dereference rather than a fault on unmapped memory.
func (r *Ring) unmap() error {
	var errs []error
	for _, m := range []*[]byte{&r.sqeMem, &r.cqRing, &r.sqRing} {
		if *m != nil {
			if err := unix.Munmap(*m); err != nil {
				errs = append(errs, fmt.Errorf("iouring: munmap: %w", err))
			}
			*m = nil
		}
	}
	r.sqHead, r.sqTail, r.sqFlags, r.sqes = nil, nil, nil, nil
	r.cqHead, r.cqTail, r.cqOverflow, r.cqes = nil, nil, nil, nil
	return errors.Join(errs...)
}

// Close unmaps the rings and closes the ring fd. It does not wait for operations in flight:
// reap every CQE you expect before Close, and keep buffers alive until then. Registered
// buffers are released with the ring. A second Close returns ErrClosed.
func (r *Ring) Close() error {
	if r.closed {
		return ErrClosed
	}
	r.closed = true
	r.bufs = nil
	err := r.unmap()
	if cerr := unix.Close(r.fd); cerr != nil {
		err = errors.Join(err, fmt.Errorf("iouring: close ring fd: %w", cerr))
	}
	r.fd = -1
	return err
}

// Fd returns the ring's file descriptor.
func (r *Ring) Fd() int { return r.fd }

// Flags returns the setup flags the kernel accepted.
func (r *Ring) Flags() SetupFlag { return r.flags }

// Features returns the kernel's IORING_FEAT_* bits for this ring.
func (r *Ring) Features() Feature { return r.features }

// SQEntries returns the SQ size (a power of two).
func (r *Ring) SQEntries() uint32 { return r.sqEntries }

// CQEntries returns the CQ size (a power of two).
func (r *Ring) CQEntries() uint32 { return r.cqEntries }
