//go:build linux

package iouring

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// benchFileBlocks is the size, in 4 KiB blocks, of the preallocated and pre-written file the
// benchmark overwrites in a cycle, so that no fdatasync has to commit extent changes.
const benchFileBlocks = 1024

// BenchmarkWriteFixedFdatasync measures one 4 KiB O_DIRECT write followed by fdatasync, one
// op in flight, through io_uring (write_fixed linked to fsync(DATASYNC)), plain and with
// SingleIssuer, and, as the baseline, through pwrite + fdatasync. It reports p50 and p99.
func BenchmarkWriteFixedFdatasync(b *testing.B) {
	b.Run("iouring", func(b *testing.B) { benchRing(b, Options{}) })
	b.Run("iouring-single-issuer", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		benchRing(b, Options{SingleIssuer: true})
	})
	b.Run("pwrite", func(b *testing.B) {
		fd, buf := benchFile(b)
		runLatency(b, func(i int) {
			if n, err := unix.Pwrite(fd, buf, int64(i%benchFileBlocks)*blockSize); n != blockSize || err != nil {
				b.Fatal(n, err)
			}
			if err := unix.Fdatasync(fd); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// benchRing is the io_uring part of BenchmarkWriteFixedFdatasync.
func benchRing(b *testing.B, opts Options) {
	r := newRing(b, 8, opts)
	fd, buf := benchFile(b)
	if err := r.RegisterBuffers([][]byte{buf}); err != nil {
		b.Fatal(err)
	}
	cqes := make([]CQE, 2)
	runLatency(b, func(i int) {
		w := r.GetSQE()
		w.PrepWriteFixed(fd, buf, int64(i%benchFileBlocks)*blockSize, 0)
		w.SetFlags(SQEIOLink)
		r.GetSQE().PrepFsync(fd, true)
		if _, err := r.SubmitAndWait(2); err != nil {
			b.Fatal(err)
		}
		n, err := r.PeekBatchCQE(cqes)
		if n != 2 || err != nil || cqes[0].Res != blockSize || cqes[1].Res != 0 {
			b.Fatalf("CQEs %d %v %+v", n, err, cqes)
		}
	})
}

// benchFile opens an O_DIRECT file, writes it in full and syncs it, and returns it with a
// 4 KiB aligned buffer.
func benchFile(b *testing.B) (int, []byte) {
	fd := openFile(b, "bench", unix.O_DIRECT)
	buf := mmapBuf(b, blockSize)
	fill(buf, 3)
	for i := range benchFileBlocks {
		if _, err := unix.Pwrite(fd, buf, int64(i)*blockSize); err != nil {
			b.Fatal(err)
		}
	}
	if err := unix.Fsync(fd); err != nil {
		b.Fatal(err)
	}
	return fd, buf
}

// runLatency runs op b.N times and reports its p50 and p99 in microseconds.
func runLatency(b *testing.B, op func(i int)) {
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(blockSize)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		op(i)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}
