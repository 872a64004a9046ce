//go:build linux

package iouring

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RegisterBuffers registers bufs as the ring's fixed buffers (IORING_REGISTER_BUFFERS);
// buffer i is then used by PrepWriteFixed and PrepReadFixed with bufIndex i. The kernel pins
// the pages until UnregisterBuffers or Close. Use anonymous memory (unix.Mmap with
// MAP_ANONYMOUS, or GC memory, which the Ring keeps referenced while registered); file-backed
// mappings are refused by the kernel. At most 16384 buffers of at most 1 GiB each.
func (r *Ring) RegisterBuffers(bufs [][]byte) error {
	if r.closed {
		return ErrClosed
	}
	if len(bufs) == 0 || len(bufs) > maxRegBuffers {
		return fmt.Errorf("%w: %d buffers (want 1 to %d)", ErrInvalidArgument, len(bufs), maxRegBuffers)
	}
	iov := make([]unix.Iovec, len(bufs))
	for i, b := range bufs {
		if len(b) == 0 || len(b) > maxRegBufferSize {
			return fmt.Errorf("%w: buffer %d has %d bytes (want 1 to %d)", ErrInvalidArgument, i, len(b), maxRegBufferSize)
		}
		iov[i].Base = &b[0]
		iov[i].SetLen(len(b))
	}
	if err := r.register(registerBuffers, unsafe.Pointer(&iov[0]), uint32(len(iov))); err != nil {
		return fmt.Errorf("iouring: register %d buffers: %w", len(bufs), err)
	}
	r.bufs = append([][]byte(nil), bufs...)
	return nil
}

// UnregisterBuffers releases the fixed buffers. Operations using them must have completed.
func (r *Ring) UnregisterBuffers() error {
	if r.closed {
		return ErrClosed
	}
	if err := r.register(unregisterBuffers, nil, 0); err != nil {
		return fmt.Errorf("iouring: unregister buffers: %w", err)
	}
	r.bufs = nil
	return nil
}

// Probe lists the opcodes a kernel supports (IORING_REGISTER_PROBE, 5.6+).
type Probe struct {
	lastOp Opcode
	ops    [probeOpsMax]bool
}

// Supported reports whether the kernel supports op.
func (p *Probe) Supported(op Opcode) bool { return p.ops[op] }

// LastOp returns the highest opcode the kernel knows.
func (p *Probe) LastOp() Opcode { return p.lastOp }

// Probe asks the kernel which opcodes it supports.
func (r *Ring) Probe() (*Probe, error) {
	if r.closed {
		return nil, ErrClosed
	}
	buf := new(probeBuf)
	if err := r.register(registerProbe, unsafe.Pointer(buf), probeOpsMax); err != nil {
		return nil, fmt.Errorf("iouring: probe: %w", err)
	}
	p := &Probe{lastOp: Opcode(buf.lastOp)}
	for _, o := range buf.ops[:buf.opsLen] {
		if o.flags&opSupported != 0 {
			p.ops[o.op] = true
		}
	}
	return p, nil
}

// RegisterEventFD makes the kernel signal the eventfd efd whenever it posts a completion, so
// that a waiter can sleep in a poller (Go's netpoller) instead of in io_uring_enter.
func (r *Ring) RegisterEventFD(efd int) error {
	fd := int32(efd)
	if err := r.register(registerEventFD, unsafe.Pointer(&fd), 1); err != nil {
		return fmt.Errorf("iouring: register eventfd: %w", err)
	}
	return nil
}

// register calls io_uring_register(2), retrying EINTR. The memory at arg is only read or
// written during the call.
func (r *Ring) register(op uintptr, arg unsafe.Pointer, n uint32) error {
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), op,
			uintptr(arg), uintptr(n), 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		case unix.EEXIST:
			if r.flags&SetupSingleIssuer != 0 {
				return fmt.Errorf("%w: %w", ErrWrongThread, errno)
			}
		}
		return errno
	}
}
