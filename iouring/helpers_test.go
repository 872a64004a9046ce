//go:build linux

package iouring

import (
	"errors"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// blockSize is the O_DIRECT unit the tests use; mmap'd buffers are page aligned.
const blockSize = 4096

// requireIOUring skips the test when io_uring is unavailable here.
func requireIOUring(tb testing.TB) {
	tb.Helper()
	if err := Available(); err != nil {
		tb.Skipf("io_uring unavailable: %v", err)
	}
}

// newRing sets up a ring that is closed when the test ends.
func newRing(tb testing.TB, entries uint32, opts Options) *Ring {
	tb.Helper()
	requireIOUring(tb)
	r, err := New(entries, opts)
	if err != nil {
		tb.Fatalf("New(%d, %+v): %v", entries, opts, err)
	}
	tb.Cleanup(func() {
		if err := r.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return r
}

// forModes runs fn once with a plain ring and once with a single-issuer ring. The
// single-issuer run locks its goroutine to its OS thread, as the contract requires.
func forModes(t *testing.T, fn func(t *testing.T, opts Options)) {
	t.Run("plain", func(t *testing.T) { fn(t, Options{}) })
	t.Run("single-issuer", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		fn(t, Options{SingleIssuer: true})
	})
}

// mmapBuf returns page-aligned anonymous memory, unmapped when the test ends.
func mmapBuf(tb testing.TB, size int) []byte {
	tb.Helper()
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		tb.Fatalf("mmap %d: %v", size, err)
	}
	tb.Cleanup(func() { unix.Munmap(b) })
	return b
}

// openFile opens a new file in the test's temp dir with extra flags (e.g. O_DIRECT),
// skipping if the file system refuses O_DIRECT.
func openFile(tb testing.TB, name string, flags int) int {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), name)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|flags, 0o644)
	if errors.Is(err, unix.EINVAL) && flags&unix.O_DIRECT != 0 {
		tb.Skipf("O_DIRECT not supported on %s", path)
	}
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return fd
}

// getSQE returns an SQE or fails the test.
func getSQE(tb testing.TB, r *Ring) *SQE {
	tb.Helper()
	sqe := r.GetSQE()
	if sqe == nil {
		tb.Fatal("GetSQE: SQ full")
	}
	return sqe
}

// submitAndReap submits, waits for n completions and returns them in arrival order.
func submitAndReap(tb testing.TB, r *Ring, n int) []CQE {
	tb.Helper()
	if _, err := r.SubmitAndWait(uint32(n)); err != nil {
		tb.Fatalf("SubmitAndWait(%d): %v", n, err)
	}
	out := make([]CQE, n)
	got := 0
	for got < n {
		k, err := r.PeekBatchCQE(out[got:])
		if err != nil {
			tb.Fatalf("PeekBatchCQE: %v", err)
		}
		got += k
		if got < n {
			c, err := r.WaitCQE()
			if err != nil {
				tb.Fatalf("WaitCQE: %v", err)
			}
			out[got] = *c
			r.CQESeen(c)
			got++
		}
	}
	return out
}

// fill writes a pattern derived from seed into b.
func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*31 + i*7 + i>>8)
	}
}
