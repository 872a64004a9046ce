//go:build linux

package iouring

import (
	"errors"
	"fmt"
)

// Available reports whether io_uring works here: it sets up a tiny ring and round-trips a
// NOP through it. A nil result means New and the ring's system calls work; otherwise the
// error wraps ErrUnavailable (and the unix.Errno: EPERM, ENOSYS or EACCES when io_uring is
// disabled by seccomp or kernel.io_uring_disabled), and callers should fall back to
// pread/pwrite.
func Available() error {
	r, err := New(2, Options{})
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer r.Close()
	sqe := r.GetSQE()
	sqe.PrepNop()
	sqe.SetUserData(0x10c)
	if _, err := r.SubmitAndWait(1); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	c, err := r.PeekCQE()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if c == nil || c.UserData != 0x10c || c.Res != 0 {
		return fmt.Errorf("%w: NOP round trip returned %+v", ErrUnavailable, c)
	}
	r.CQESeen(c)
	return nil
}
