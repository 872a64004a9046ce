//go:build linux

package iouring

import (
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestABILayout(t *testing.T) {
	sizes := []struct {
		name      string
		got, want uintptr
	}{
		{"SQE", unsafe.Sizeof(SQE{}), 64},
		{"CQE", unsafe.Sizeof(CQE{}), 16},
		{"Params", unsafe.Sizeof(Params{}), 120},
		{"sqringOffsets", unsafe.Sizeof(sqringOffsets{}), 40},
		{"cqringOffsets", unsafe.Sizeof(cqringOffsets{}), 40},
		{"probeHeader", unsafe.Sizeof(probeHeader{}), 16},
		{"probeOp", unsafe.Sizeof(probeOp{}), 8},
		{"probeBuf", unsafe.Sizeof(probeBuf{}), 16 + 8*probeOpsMax},
	}
	for _, s := range sizes {
		if s.got != s.want {
			t.Errorf("sizeof(%s) = %d, want %d", s.name, s.got, s.want)
		}
	}
	var s SQE
	var c CQE
	var p Params
	offsets := []struct {
		name      string
		got, want uintptr
	}{
		{"sqe.fd", unsafe.Offsetof(s.fd), 4},
		{"sqe.off", unsafe.Offsetof(s.off), 8},
		{"sqe.addr", unsafe.Offsetof(s.addr), 16},
		{"sqe.len", unsafe.Offsetof(s.len), 24},
		{"sqe.opFlags", unsafe.Offsetof(s.opFlags), 28},
		{"sqe.userData", unsafe.Offsetof(s.userData), 32},
		{"sqe.bufIndex", unsafe.Offsetof(s.bufIndex), 40},
		{"sqe.spliceFdIn", unsafe.Offsetof(s.spliceFdIn), 44},
		{"sqe.addr3", unsafe.Offsetof(s.addr3), 48},
		{"cqe.Res", unsafe.Offsetof(c.Res), 8},
		{"cqe.Flags", unsafe.Offsetof(c.Flags), 12},
		{"params.Features", unsafe.Offsetof(p.Features), 20},
		{"params.sqOff", unsafe.Offsetof(p.sqOff), 40},
		{"params.cqOff", unsafe.Offsetof(p.cqOff), 80},
	}
	for _, o := range offsets {
		if o.got != o.want {
			t.Errorf("offsetof(%s) = %d, want %d", o.name, o.got, o.want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		entries uint32
		opts    Options
	}{
		{0, Options{}},
		{maxEntries + 1, Options{}},
		{8, Options{CQEntries: 4}},
		{8, Options{CQEntries: maxCQEntries + 1}},
	} {
		if _, err := New(tc.entries, tc.opts); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("New(%d, %+v) = %v, want ErrInvalidArgument", tc.entries, tc.opts, err)
		}
	}
}

func TestSetupErrorWrapping(t *testing.T) {
	for _, errno := range []unix.Errno{unix.EPERM, unix.EACCES, unix.ENOSYS} {
		err := setupError(errno)
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errno) {
			t.Errorf("setupError(%v) = %v: want ErrUnavailable and the errno", errno, err)
		}
	}
	if err := setupError(unix.ENOMEM); errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.ENOMEM) {
		t.Errorf("setupError(ENOMEM) = %v", err)
	}
	if err := enterError(unix.EEXIST); !errors.Is(err, ErrWrongThread) {
		t.Errorf("enterError(EEXIST) = %v", err)
	}
	if err := enterError(unix.EBADR); !errors.Is(err, ErrCQEDropped) {
		t.Errorf("enterError(EBADR) = %v", err)
	}
}

func TestCQEErr(t *testing.T) {
	if err := (CQE{Res: 4096}).Err(); err != nil {
		t.Errorf("Res 4096: %v", err)
	}
	if err := (CQE{Res: -int32(unix.EIO)}).Err(); err != unix.EIO {
		t.Errorf("Res -EIO: %v", err)
	}
}

func TestAvailableAndFeatures(t *testing.T) {
	r := newRing(t, 8, Options{})
	t.Logf("sq=%d cq=%d flags=%#x features=%#x", r.SQEntries(), r.CQEntries(), r.Flags(), r.Features())
	if !r.Features().Has(FeatNoDrop) {
		t.Error("ring without FeatNoDrop")
	}
	if r.SQEntries() != 8 || r.CQEntries() != 16 {
		t.Errorf("sq=%d cq=%d, want 8 and 16", r.SQEntries(), r.CQEntries())
	}
}

func TestProbe(t *testing.T) {
	r := newRing(t, 4, Options{})
	p, err := r.Probe()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []Opcode{OpNop, OpWrite, OpRead, OpWritev, OpReadv, OpWriteFixed,
		OpReadFixed, OpFsync, OpFallocate} {
		if !p.Supported(op) {
			t.Errorf("probe: %v not supported", op)
		}
	}
	if p.LastOp() < OpMsgRing {
		t.Errorf("LastOp = %v", p.LastOp())
	}
	if OpFsync.String() != "FSYNC" || Opcode(200).String() != "OP(200)" {
		t.Errorf("Opcode.String: %q %q", OpFsync, Opcode(200))
	}
}

func TestNopRoundTrip(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		r := newRing(t, 4, opts)
		sqe := getSQE(t, r)
		sqe.PrepNop()
		sqe.SetUserData(42)
		if n, err := r.Submit(); n != 1 || err != nil {
			t.Fatalf("Submit = %d, %v", n, err)
		}
		c, err := r.WaitCQE()
		if err != nil {
			t.Fatal(err)
		}
		if c.UserData != 42 || c.Res != 0 {
			t.Fatalf("CQE %+v", *c)
		}
		r.CQESeen(c)
		if c, err := r.PeekCQE(); c != nil || err != nil {
			t.Fatalf("PeekCQE on empty ring = %v, %v", c, err)
		}
	})
}

func TestManyOpsUserData(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		const total = 5000
		r := newRing(t, 32, opts)
		seen := make([]bool, total)
		cqes := make([]CQE, 64)
		next, reaped := 0, 0
		for reaped < total {
			for next < total {
				sqe := r.GetSQE()
				if sqe == nil {
					break
				}
				sqe.PrepNop()
				sqe.SetUserData(uint64(next) + 1000)
				next++
			}
			if _, err := r.SubmitAndWait(1); err != nil {
				t.Fatal(err)
			}
			n, err := r.PeekBatchCQE(cqes)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cqes[:n] {
				id := int(c.UserData) - 1000
				if id < 0 || id >= next || seen[id] || c.Res != 0 {
					t.Fatalf("unexpected CQE %+v", c)
				}
				seen[id] = true
			}
			reaped += n
		}
	})
}

func TestSQFullAndPrepZeroes(t *testing.T) {
	r := newRing(t, 4, Options{})
	var sqes []*SQE
	for range 4 {
		sqes = append(sqes, getSQE(t, r))
	}
	if r.GetSQE() != nil || r.SQSpaceLeft() != 0 || r.SQReady() != 4 {
		t.Fatalf("full SQ: space %d ready %d", r.SQSpaceLeft(), r.SQReady())
	}
	buf := make([]byte, 8)
	s := sqes[0]
	s.PrepWriteFixed(3, buf, 99, 7)
	s.SetUserData(5)
	s.SetFlags(SQEIOLink | SQEIODrain)
	s.SetOpFlags(1)
	s.PrepNop()
	if *s != (SQE{opcode: OpNop, fd: -1}) {
		t.Fatalf("PrepNop left state behind: %+v", *s)
	}
	s.PrepFsync(3, true)
	if s.opFlags != FsyncDatasync || s.Opcode() != OpFsync || s.fd != 3 || s.Flags() != 0 {
		t.Fatalf("PrepFsync: %+v", *s)
	}
	for _, s := range sqes {
		s.PrepNop()
	}
	if got := submitAndReap(t, r, 4); len(got) != 4 {
		t.Fatal(got)
	}
	if r.SQSpaceLeft() != 4 {
		t.Fatalf("space after submit %d", r.SQSpaceLeft())
	}
}

func TestClose(t *testing.T) {
	requireIOUring(t)
	r, err := New(4, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v", err)
	}
	if r.GetSQE() != nil {
		t.Error("GetSQE after Close")
	}
	if _, err := r.Submit(); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Close = %v", err)
	}
	if _, err := r.WaitCQE(); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitCQE after Close = %v", err)
	}
	if _, err := r.PeekBatchCQE(make([]CQE, 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("PeekBatchCQE after Close = %v", err)
	}
	if err := r.RegisterBuffers([][]byte{make([]byte, 1)}); !errors.Is(err, ErrClosed) {
		t.Errorf("RegisterBuffers after Close = %v", err)
	}
}

// TestCQOverflow puts many more completions in flight than the CQ holds; with NODROP all
// of them must still arrive.
func TestCQOverflow(t *testing.T) {
	forModes(t, func(t *testing.T, opts Options) {
		const rounds = 16
		opts.CQEntries = 4
		r := newRing(t, 4, opts)
		if r.CQEntries() != 4 {
			t.Fatalf("CQEntries = %d", r.CQEntries())
		}
		for i := range rounds * 4 {
			sqe := r.GetSQE()
			if sqe == nil {
				if _, err := r.Submit(); err != nil {
					t.Fatalf("Submit after %d: %v", i, err)
				}
				sqe = getSQE(t, r)
			}
			sqe.PrepNop()
			sqe.SetUserData(uint64(i))
		}
		if _, err := r.Submit(); err != nil {
			t.Fatal(err)
		}
		if atomic.LoadUint32(r.sqFlags)&sqCQOverflow == 0 {
			t.Errorf("IORING_SQ_CQ_OVERFLOW not set with %d completions for a 4-slot CQ", rounds*4)
		}
		seen := make(map[uint64]bool)
		cqes := make([]CQE, 3) // smaller than the CQ, to exercise partial flushes
		for len(seen) < rounds*4 {
			n, err := r.PeekBatchCQE(cqes)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				t.Fatalf("stalled after %d completions", len(seen))
			}
			for _, c := range cqes[:n] {
				if seen[c.UserData] || c.Res != 0 {
					t.Fatalf("unexpected CQE %+v", c)
				}
				seen[c.UserData] = true
			}
		}
		if d := r.CQDropped(); d != 0 {
			t.Errorf("kernel dropped %d completions", d)
		}
		if c, err := r.PeekCQE(); c != nil || err != nil {
			t.Fatalf("extra CQE %v, %v", c, err)
		}
	})
}

// TestSingleIssuerWrongThread checks that a single-issuer ring entered from another OS
// thread fails with ErrWrongThread and leaves the SQE queued for the owner.
func TestSingleIssuerWrongThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := newRing(t, 4, Options{SingleIssuer: true})
	if r.Flags()&SetupSingleIssuer == 0 {
		t.Skip("kernel has no IORING_SETUP_SINGLE_ISSUER")
	}
	sqe := getSQE(t, r)
	sqe.PrepNop()
	sqe.SetUserData(7)
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // a thread other than the owner's
		defer runtime.UnlockOSThread()
		_, err := r.Submit()
		errc <- err
	}()
	if err := <-errc; !errors.Is(err, ErrWrongThread) {
		t.Fatalf("Submit from another thread = %v, want ErrWrongThread", err)
	}
	got := submitAndReap(t, r, 1)
	if got[0].UserData != 7 {
		t.Fatalf("CQE %+v", got[0])
	}
}
