package diskio

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// errEOF is io.EOF: a read past the end of a file.
var errEOF = io.EOF

// Slab is a set of equally sized, page-aligned buffers carved out of one anonymous mapping.
// Page alignment (4096) satisfies every direct-I/O alignment up to a page. The memory is outside
// the Go heap, so the kernel may write from it asynchronously (io_uring) without pinning.
// A Slab does not track which buffers are in use: its owner does.
type Slab struct {
	mem     []byte
	bufSize int
	buffers [][]byte
}

const pageSize = 4096

// NewSlab maps count buffers of bufSize bytes each (bufSize is rounded up to a page).
func NewSlab(bufSize, count int) (*Slab, error) {
	if bufSize <= 0 || count <= 0 {
		return nil, fmt.Errorf("diskio: slab of %d buffers of %d bytes: %w", count, bufSize, errors.ErrUnsupported)
	}
	bufSize = int(AlignUp(int64(bufSize), pageSize))
	mem, err := unix.Mmap(-1, 0, bufSize*count, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("diskio: mmap slab of %d bytes: %w", bufSize*count, err)
	}
	s := &Slab{mem: mem, bufSize: bufSize, buffers: make([][]byte, count)}
	for i := range s.buffers {
		s.buffers[i] = mem[i*bufSize : (i+1)*bufSize : (i+1)*bufSize]
	}
	return s, nil
}

// Buffer returns buffer i (0 ≤ i < Count). Its length is BufferSize.
func (s *Slab) Buffer(i int) []byte { return s.buffers[i] }

// Buffers returns all buffers, indexed as for io_uring buffer registration.
func (s *Slab) Buffers() [][]byte { return s.buffers }

// Count is the number of buffers.
func (s *Slab) Count() int { return len(s.buffers) }

// BufferSize is the size of each buffer.
func (s *Slab) BufferSize() int { return s.bufSize }

// Close unmaps the slab. No buffer may be used afterwards.
func (s *Slab) Close() error {
	if s.mem == nil {
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem, s.buffers = nil, nil
	if err != nil {
		return fmt.Errorf("diskio: munmap slab: %w", err)
	}
	return nil
}
