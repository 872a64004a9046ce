package protocol

import (
	"errors"
	"strconv"
)

// Sentinel errors. Callers branch with errors.Is.
var (
	// ErrBadFrame: a frame length prefix that is negative or smaller than MinFrameLength.
	ErrBadFrame = errors.New("protocol: bad frame length")
	// ErrFrameTooLarge: a frame (length prefix included) larger than the maximum frame size,
	// or a message too large for an int32 length.
	ErrFrameTooLarge = errors.New("protocol: frame too large")
	// ErrMalformed: a frame whose contents do not match the layout of its opcode.
	ErrMalformed = errors.New("protocol: malformed message")
	// ErrUnknownOp: an opcode the v2 protocol does not carry.
	ErrUnknownOp = errors.New("protocol: unknown opcode")
	// ErrBadVersion: a request whose protocol version the bookie does not serve.
	ErrBadVersion = errors.New("protocol: unsupported protocol version")
)

// Action tells a server what to do about a request it could not decode.
type Action uint8

const (
	// ActionClose: the frame cannot be answered (the bytes that address a response were not
	// there, the opcode is unknown, or the message is an AUTH): close the connection.
	ActionClose Action = iota
	// ActionRespond: answer with an error response carrying Code
	// (DecodeError.AppendResponse), then go on with the next frame.
	ActionRespond
)

func (a Action) String() string {
	if a == ActionRespond {
		return "respond"
	}
	return "close"
}

// DecodeError is the error of DecodeRequest and DecodeResponse. Err is one of the sentinels
// above; Reason is a fixed description of the check that failed.
//
// For requests, Action says whether the server answers (EBADREQ or EBADVERSION, addressed with
// the Header, LedgerID, EntryID and RequestID that were parsed) or closes the connection.
// Decoding a response always gives ActionClose.
type DecodeError struct {
	Err    error
	Reason string
	Action Action
	// Code is the return code to answer with when Action is ActionRespond.
	Code ReturnCode
	// Header is the parsed packet header; zero if the frame was shorter than a header.
	Header Header
	// LedgerID, EntryID (the start entry of a batch read) and RequestID (batch read only)
	// address the error response.
	LedgerID  int64
	EntryID   int64
	RequestID int64
}

func (e *DecodeError) Error() string {
	s := e.Err.Error() + ": " + e.Reason
	if e.Header != (Header{}) {
		s += " (op " + e.Header.Op.String() + ", version " + strconv.Itoa(int(e.Header.Version)) + ")"
	}
	if e.Action == ActionRespond {
		s += ", answer " + e.Code.String()
	}
	return s
}

func (e *DecodeError) Unwrap() error { return e.Err }

// AppendResponse appends the error response frame for a request that failed with
// ActionRespond: an add, read or batch-read response with Code, the request's version, flags 0,
// its ledger and entry ids (and request id), and no payload. With ActionClose it returns dst
// unchanged.
func (e *DecodeError) AppendResponse(dst []byte) []byte {
	if e.Action != ActionRespond {
		return dst
	}
	h := Header{Version: e.Header.Version, Op: e.Header.Op}
	switch e.Header.Op {
	case OpAddEntry:
		return AppendAddResponse(dst, AddResponse{Header: h, RC: e.Code, LedgerID: e.LedgerID, EntryID: e.EntryID})
	case OpReadEntry:
		return appendResponseHeader(dst, ResponseHeaderSize, h, e.Code, e.LedgerID, e.EntryID)
	case OpBatchReadEntry:
		dst = appendResponseHeader(dst, ResponseHeaderSize+8, h, e.Code, e.LedgerID, e.EntryID)
		return appendUint64(dst, uint64(e.RequestID))
	}
	return dst
}

// AsDecodeError returns the *DecodeError in err's chain, if any.
func AsDecodeError(err error) (*DecodeError, bool) {
	var de *DecodeError
	ok := errors.As(err, &de)
	return de, ok
}

// ShouldRespond reports whether a request decoding error is answered (ActionRespond) rather
// than ending the connection; it is false for nil and for errors that are not *DecodeError.
func ShouldRespond(err error) bool {
	de, ok := AsDecodeError(err)
	return ok && de.Action == ActionRespond
}

func closeError(sentinel error, reason string, h Header) *DecodeError {
	return &DecodeError{Err: sentinel, Reason: reason, Action: ActionClose, Header: h}
}

func respondError(sentinel error, code ReturnCode, reason string, h Header, ledgerID, entryID, requestID int64) *DecodeError {
	return &DecodeError{
		Err: sentinel, Reason: reason, Action: ActionRespond, Code: code,
		Header: h, LedgerID: ledgerID, EntryID: entryID, RequestID: requestID,
	}
}
