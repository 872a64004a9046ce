//go:build !linux

package iouring

import (
	"errors"
	"fmt"
)

// Available reports that io_uring exists only on Linux.
func Available() error {
	return fmt.Errorf("%w: %w", ErrUnavailable, errors.ErrUnsupported)
}
