//go:build linux

package iouring

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWriteFixedLinkedFdatasync writes 4 KiB blocks with O_DIRECT from a registered mmap'd
// buffer, each linked to an fdatasync, then reads the file back with read_fixed.
func TestWriteFixedLinkedFdatasync(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		iterations := 500
		if testing.Short() {
			iterations = 50
		}
		r := newRing(t, 8, opts)
		fd := openFile(t, "journal", unix.O_DIRECT)
		wbuf := mmapBuf(t, blockSize)
		rbuf := mmapBuf(t, blockSize)
		if err := r.RegisterBuffers([][]byte{wbuf, rbuf}); err != nil {
			t.Fatal(err)
		}
		for i := range iterations {
			fill(wbuf, i)
			w := getSQE(t, r)
			w.PrepWriteFixed(fd, wbuf, int64(i)*blockSize, 0)
			w.SetUserData(uint64(2 * i))
			w.SetFlags(SQEIOLink)
			s := getSQE(t, r)
			s.PrepFsync(fd, true)
			s.SetUserData(uint64(2*i + 1))
			got := submitAndReap(t, r, 2)
			// Linked ops complete in order.
			if got[0].UserData != uint64(2*i) || got[0].Res != blockSize ||
				got[1].UserData != uint64(2*i+1) || got[1].Res != 0 {
				t.Fatalf("iteration %d: CQEs %+v", i, got)
			}
		}
		want := make([]byte, blockSize)
		for i := range iterations {
			sqe := getSQE(t, r)
			sqe.PrepReadFixed(fd, rbuf, int64(i)*blockSize, 1)
			if c := submitAndReap(t, r, 1)[0]; c.Res != blockSize {
				t.Fatalf("read_fixed block %d: %+v (%v)", i, c, c.Err())
			}
			fill(want, i)
			if !bytes.Equal(rbuf, want) {
				t.Fatalf("block %d differs after read back", i)
			}
		}
		if err := r.UnregisterBuffers(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWriteReadPlain uses the unregistered write and read opcodes on a buffered file.
func TestWriteReadPlain(t *testing.T) {
	r := newRing(t, 4, Options{})
	fd := openFile(t, "plain", 0)
	data := []byte("hello, io_uring")
	sqe := getSQE(t, r)
	sqe.PrepWrite(fd, data, 100)
	if c := submitAndReap(t, r, 1)[0]; c.Res != int32(len(data)) {
		t.Fatalf("write: %+v (%v)", c, c.Err())
	}
	got := make([]byte, len(data)+10)
	sqe = getSQE(t, r)
	sqe.PrepRead(fd, got, 100)
	c := submitAndReap(t, r, 1)[0]
	if c.Res != int32(len(data)) || !bytes.Equal(got[:c.Res], data) {
		t.Fatalf("read: %+v %q", c, got)
	}
}

// TestWritevReadv writes three iovecs in one op and reads them back scattered.
func TestWritevReadv(t *testing.T) {
	r := newRing(t, 4, Options{})
	fd := openFile(t, "vec", 0)
	parts := [][]byte{[]byte("alpha-"), []byte("beta-"), []byte("gamma")}
	iov := make([]unix.Iovec, len(parts))
	for i, p := range parts {
		iov[i].Base = &p[0]
		iov[i].SetLen(len(p))
	}
	sqe := getSQE(t, r)
	sqe.PrepWritev(fd, iov, 0)
	if c := submitAndReap(t, r, 1)[0]; c.Res != 16 {
		t.Fatalf("writev: %+v (%v)", c, c.Err())
	}
	all := make([]byte, 16)
	if n, err := unix.Pread(fd, all, 0); n != 16 || err != nil || string(all) != "alpha-beta-gamma" {
		t.Fatalf("pread after writev: %d %v %q", n, err, all)
	}
	a, b := make([]byte, 10), make([]byte, 6)
	riov := []unix.Iovec{{Base: &a[0]}, {Base: &b[0]}}
	riov[0].SetLen(len(a))
	riov[1].SetLen(len(b))
	sqe = getSQE(t, r)
	sqe.PrepReadv(fd, riov, 0)
	if c := submitAndReap(t, r, 1)[0]; c.Res != 16 || string(a)+string(b) != "alpha-beta-gamma" {
		t.Fatalf("readv: %+v %q %q", c, a, b)
	}
}

// TestFallocate preallocates with and without FALLOC_FL_KEEP_SIZE.
func TestFallocate(t *testing.T) {
	r := newRing(t, 4, Options{})
	fd := openFile(t, "prealloc", 0)
	const size = 1 << 20
	sqe := getSQE(t, r)
	sqe.PrepFallocate(fd, 0, 0, size)
	sqe.SetFlags(SQEIOLink)
	sqe = getSQE(t, r)
	sqe.PrepFallocate(fd, unix.FALLOC_FL_KEEP_SIZE, size, size)
	for _, c := range submitAndReap(t, r, 2) {
		if err := c.Err(); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				t.Skip("file system does not support fallocate")
			}
			t.Fatalf("fallocate: %+v: %v", c, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks*512 < 2*size {
		t.Fatalf("after fallocate: size %d, %d bytes allocated", st.Size, st.Blocks*512)
	}
}

// TestLinkFailureCancels checks that a failing link member cancels the rest of its chain.
func TestLinkFailureCancels(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		r := newRing(t, 8, opts)
		// A read-only fd: the write fails when it runs (EBADF).
		ro, err := unix.Open("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(ro)
		buf := mmapBuf(t, blockSize)
		for _, tc := range []struct {
			name string
			fd   int
		}{
			{"read-only fd", ro},
			{"invalid fd", -1}, // fails at submission time instead
		} {
			w := getSQE(t, r)
			w.PrepWrite(tc.fd, buf, 0)
			w.SetUserData(1)
			w.SetFlags(SQEIOLink)
			s := getSQE(t, r)
			s.PrepFsync(tc.fd, true)
			s.SetUserData(2)
			s.SetFlags(SQEIOLink)
			n := getSQE(t, r)
			n.PrepNop()
			n.SetUserData(3)
			want := map[uint64]unix.Errno{1: unix.EBADF, 2: unix.ECANCELED, 3: unix.ECANCELED}
			for _, c := range submitAndReap(t, r, 3) {
				if err := c.Err(); err != want[c.UserData] {
					t.Errorf("%s: op %d: %v, want %v", tc.name, c.UserData, err, want[c.UserData])
				}
			}
		}
	})
}

// TestRegisterBuffersArgs covers argument checks and re-registration.
func TestRegisterBuffersArgs(t *testing.T) {
	r := newRing(t, 4, Options{})
	if err := r.RegisterBuffers(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("no buffers: %v", err)
	}
	if err := r.RegisterBuffers([][]byte{{}}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("empty buffer: %v", err)
	}
	b := mmapBuf(t, blockSize)
	if err := r.RegisterBuffers([][]byte{b}); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterBuffers([][]byte{b}); !errors.Is(err, unix.EBUSY) {
		t.Errorf("second registration = %v, want EBUSY", err)
	}
	if err := r.UnregisterBuffers(); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterBuffers(); !errors.Is(err, unix.ENXIO) {
		t.Errorf("second unregister = %v, want ENXIO", err)
	}
	// GC memory works too; the Ring keeps it referenced while registered.
	if err := r.RegisterBuffers([][]byte{make([]byte, blockSize)}); err != nil {
		t.Fatal(err)
	}
}

// TestPeekFindsAsyncCompletion submits an O_DIRECT write without waiting and polls PeekCQE
// until it completes; with SingleIssuer (DEFER_TASKRUN) the completion only appears because
// PeekCQE enters the kernel when IORING_SQ_TASKRUN is set.
func TestPeekFindsAsyncCompletion(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		r := newRing(t, 4, opts)
		fd := openFile(t, "async", unix.O_DIRECT)
		buf := mmapBuf(t, blockSize)
		fill(buf, 1)
		sqe := getSQE(t, r)
		sqe.PrepWrite(fd, buf, 0)
		sqe.SetUserData(9)
		if _, err := r.Submit(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := r.PeekCQE()
			if err != nil {
				t.Fatal(err)
			}
			if c != nil {
				if c.UserData != 9 || c.Res != blockSize {
					t.Fatalf("CQE %+v", *c)
				}
				r.CQESeen(c)
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no completion within 5s of polling")
			}
			time.Sleep(20 * time.Microsecond)
		}
	})
}
