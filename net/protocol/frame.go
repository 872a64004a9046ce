package protocol

import (
	"encoding/binary"
	"fmt"
	"math"
)

// SplitFrame looks at the start of a byte stream (for example bytes peeked from a connection's
// inbound buffer) and finds the first frame.
//
// With fewer than LengthPrefixSize bytes it returns (0, false, nil): read more. Otherwise size is
// the whole frame's size, length prefix included, and complete reports whether all of it is in
// buf; the frame's contents, for DecodeRequest or DecodeResponse, are buf[LengthPrefixSize:size].
//
// The length is checked before anything is allocated or read further: a negative length or one
// below MinFrameLength gives ErrBadFrame; a frame whose size (prefix included, as Netty counts
// it) exceeds maxFrameSize gives ErrFrameTooLarge. maxFrameSize ≤ 0 means DefaultMaxFrameSize.
// Either error leaves the stream unsynchronised: close the connection.
func SplitFrame(buf []byte, maxFrameSize int) (size int, complete bool, err error) {
	if len(buf) < LengthPrefixSize {
		return 0, false, nil
	}
	if maxFrameSize <= 0 {
		maxFrameSize = DefaultMaxFrameSize
	}
	length := int32(binary.BigEndian.Uint32(buf))
	if length < 0 {
		return 0, false, fmt.Errorf("%w: negative length %d", ErrBadFrame, length)
	}
	if length < MinFrameLength {
		return 0, false, fmt.Errorf("%w: length %d is shorter than the %d-byte packet header",
			ErrBadFrame, length, MinFrameLength)
	}
	total := int64(length) + LengthPrefixSize
	if total > int64(maxFrameSize) {
		return 0, false, fmt.Errorf("%w: %d bytes with the length prefix, the limit is %d",
			ErrFrameTooLarge, total, maxFrameSize)
	}
	size = int(total)
	return size, len(buf) >= size, nil
}

// PatchFrameLength writes the length prefix of the frame that starts at buf[start]: the frame
// runs to the end of buf. It lets a caller append a frame piece by piece (for example a batch
// read response and then its entries with AppendBatchEntry) and fix the length afterwards.
func PatchFrameLength(buf []byte, start int) error {
	if start < 0 || len(buf)-start < LengthPrefixSize+HeaderSize {
		return fmt.Errorf("%w: no frame at offset %d of a %d-byte buffer", ErrMalformed, start, len(buf))
	}
	n := len(buf) - start - LengthPrefixSize
	if n > math.MaxInt32 {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	binary.BigEndian.PutUint32(buf[start:], uint32(n))
	return nil
}

func appendUint32(dst []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(dst, v) }
func appendUint64(dst []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(dst, v) }

func getInt32(b []byte) int32 { return int32(binary.BigEndian.Uint32(b)) }
func getInt64(b []byte) int64 { return int64(binary.BigEndian.Uint64(b)) }

// frameLength checks that a frame of n bytes after its length prefix fits the int32 prefix.
func frameLength(n int) (uint32, error) {
	if n > math.MaxInt32 {
		return 0, fmt.Errorf("%w: a %d-byte frame does not fit the int32 length prefix", ErrFrameTooLarge, n)
	}
	return uint32(n), nil
}
