//go:build linux

package iouring

import (
	"math"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Every Prep method zeroes the whole SQE first (SQEs are reused), so call it before
// SetUserData and SetFlags. Buffers and iovec arrays are passed to the kernel by address:
// the Go code holds no reference for you, so the caller keeps them alive and unmoved until
// the CQE arrives (mmap'd memory, or GC memory that stays referenced). Never pass memory that
// may live on a goroutine stack. An offset of -1 means "the file position" where the kernel
// supports it. Lengths above math.MaxUint32 are clamped, which the kernel reports as a
// short transfer.

// PrepRW fills the SQE for any read/write-shaped opcode: fd, address, length and offset.
// addr must satisfy the same lifetime rules as the buffers of the other Prep methods.
func (s *SQE) PrepRW(op Opcode, fd int, addr unsafe.Pointer, n uint32, off int64) {
	*s = SQE{
		opcode: op,
		fd:     int32(fd),
		off:    uint64(off),
		addr:   uint64(uintptr(addr)),
		len:    n,
	}
}

// PrepNop fills a no-op, which completes with Res 0.
func (s *SQE) PrepNop() {
	*s = SQE{opcode: OpNop, fd: -1}
}

// PrepWrite writes buf to fd at off, like pwrite(2).
func (s *SQE) PrepWrite(fd int, buf []byte, off int64) {
	s.PrepRW(OpWrite, fd, bufAddr(buf), bufLen(len(buf)), off)
}

// PrepRead reads into buf from fd at off, like pread(2).
func (s *SQE) PrepRead(fd int, buf []byte, off int64) {
	s.PrepRW(OpRead, fd, bufAddr(buf), bufLen(len(buf)), off)
}

// PrepWriteFixed writes buf, which must lie inside registered buffer bufIndex (see
// Ring.RegisterBuffers), to fd at off. The kernel skips pinning the pages per operation.
func (s *SQE) PrepWriteFixed(fd int, buf []byte, off int64, bufIndex uint16) {
	s.PrepRW(OpWriteFixed, fd, bufAddr(buf), bufLen(len(buf)), off)
	s.bufIndex = bufIndex
}

// PrepReadFixed reads into buf, which must lie inside registered buffer bufIndex, from fd
// at off.
func (s *SQE) PrepReadFixed(fd int, buf []byte, off int64, bufIndex uint16) {
	s.PrepRW(OpReadFixed, fd, bufAddr(buf), bufLen(len(buf)), off)
	s.bufIndex = bufIndex
}

// PrepWritev writes the buffers described by iovecs to fd at off, like pwritev(2). The
// iovec array itself must stay valid until Submit returns (the kernel copies it at
// submission on kernels with FeatSubmitStable); the buffers until the CQE arrives.
func (s *SQE) PrepWritev(fd int, iovecs []unix.Iovec, off int64) {
	s.PrepRW(OpWritev, fd, iovecAddr(iovecs), bufLen(len(iovecs)), off)
}

// PrepReadv reads into the buffers described by iovecs from fd at off, like preadv(2).
// The same lifetime rules as for PrepWritev apply.
func (s *SQE) PrepReadv(fd int, iovecs []unix.Iovec, off int64) {
	s.PrepRW(OpReadv, fd, iovecAddr(iovecs), bufLen(len(iovecs)), off)
}

// PrepFsync syncs fd like fsync(2), or like fdatasync(2) when datasync is set. To order it
// after a write, link the write to it with SetFlags(SQEIOLink) on the write.
func (s *SQE) PrepFsync(fd int, datasync bool) {
	s.PrepRW(OpFsync, fd, nil, 0, 0)
	if datasync {
		s.opFlags = FsyncDatasync
	}
}

// PrepFallocate is fallocate(2): mode (unix.FALLOC_FL_*), offset and length.
func (s *SQE) PrepFallocate(fd int, mode uint32, off, length int64) {
	s.PrepRW(OpFallocate, fd, nil, mode, off)
	s.addr = uint64(length)
}

// SetUserData sets the value that comes back in the CQE's UserData.
func (s *SQE) SetUserData(v uint64) { s.userData = v }

// UserData returns the value set by SetUserData.
func (s *SQE) UserData() uint64 { return s.userData }

// SetFlags replaces the SQE's IOSQE_* flags, for example SQEIOLink or SQEIODrain.
func (s *SQE) SetFlags(f SQEFlag) { s.flags = f }

// Flags returns the SQE's IOSQE_* flags.
func (s *SQE) Flags() SQEFlag { return s.flags }

// SetOpFlags sets the opcode-specific flags word (rw_flags such as unix.RWF_DSYNC,
// fsync_flags, ...).
func (s *SQE) SetOpFlags(f uint32) { s.opFlags = f }

// SetBufIndex sets buf_index, for opcodes other than the fixed read/write helpers.
func (s *SQE) SetBufIndex(i uint16) { s.bufIndex = i }

// Opcode returns the SQE's operation.
func (s *SQE) Opcode() Opcode { return s.opcode }

// bufAddr returns the address of buf's first byte, or nil for an empty buffer.
func bufAddr(buf []byte) unsafe.Pointer {
	if len(buf) == 0 {
		return nil
	}
	return unsafe.Pointer(&buf[0])
}

// iovecAddr returns the address of the first iovec, or nil.
func iovecAddr(iov []unix.Iovec) unsafe.Pointer {
	if len(iov) == 0 {
		return nil
	}
	return unsafe.Pointer(&iov[0])
}

// bufLen clamps a Go length to the SQE's 32-bit length field.
func bufLen(n int) uint32 {
	if uint64(n) > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}
