package protocol

import (
	"encoding/binary"
	"fmt"
	"iter"
	"math"
)

// AddResponse answers an add: header, rc, ledgerId, entryId (ResponseHeaderSize bytes).
// BookKeeper writes responses with the request's version and flags 0.
type AddResponse struct {
	Header   Header
	RC       ReturnCode
	LedgerID int64
	EntryID  int64
}

// ReadResponse answers a read: the 24-byte response header, then, for a successful read, the
// stored entry. A decoded Entry aliases the frame.
type ReadResponse struct {
	Header   Header
	RC       ReturnCode
	LedgerID int64
	EntryID  int64
	Entry    []byte
}

// BatchReadResponse answers a batch read: the 24-byte response header (EntryID is the start
// entry), the request id, then the entries, each as [int32 length][stored entry].
type BatchReadResponse struct {
	Header       Header
	RC           ReturnCode
	LedgerID     int64
	StartEntryID int64
	RequestID    int64
	// Data is the entries in wire form, [int32 length][entry] repeated; build it with
	// AppendBatchEntry. A decoded Data aliases the frame. Iterate it with Entries.
	Data []byte
	// Count is the number of entries in Data, set by the decoder; the encoder ignores it.
	Count int
}

// Entries iterates over the entries in r.Data. Each yielded slice aliases Data. Data that is not
// well formed (possible only if it was not decoded or built with AppendBatchEntry) ends the
// iteration early.
func (r *BatchReadResponse) Entries() iter.Seq[[]byte] {
	data := r.Data
	return func(yield func([]byte) bool) {
		for rest := data; len(rest) > 0; {
			entry, next, ok := nextBatchEntry(rest)
			if !ok || !yield(entry) {
				return
			}
			rest = next
		}
	}
}

// AuthResponse answers an AUTH: the header (the bookie uses its current version) and an
// AuthMessage. It has no return code.
type AuthResponse struct {
	Header  Header
	Message AuthMessage
}

// Response is a decoded response. Header.Op says which one of Add, Read, BatchRead and Auth
// DecodeResponse filled in.
type Response struct {
	Header    Header
	Add       AddResponse
	Read      ReadResponse
	BatchRead BatchReadResponse
	Auth      AuthResponse
}

// DecodeResponse decodes one response frame (the bytes after the length prefix) in place; the
// entries and AUTH fields alias frame, and after an error the contents of resp are unspecified. Every error is a *DecodeError with ActionClose: a client
// that cannot parse a response cannot tell which request it answers.
//
// An add response must be exactly 24 bytes; a read response's entry is everything after its 24
// bytes; a batch read response's entries must tile the rest of the frame exactly. Return codes
// are not checked: unknown codes are passed on.
func DecodeResponse(frame []byte, resp *Response) error {
	if len(frame) < HeaderSize {
		return closeError(ErrMalformed, "frame shorter than the packet header", Header{})
	}
	h := ParseHeader(binary.BigEndian.Uint32(frame))
	resp.Header = h
	switch h.Op {
	case OpAddEntry:
		if len(frame) != ResponseHeaderSize {
			return closeError(ErrMalformed, "add response is not 24 bytes", h)
		}
		rc, ledgerID, entryID := parseResponseHeader(frame)
		resp.Add = AddResponse{Header: h, RC: rc, LedgerID: ledgerID, EntryID: entryID}
		return nil
	case OpReadEntry:
		if len(frame) < ResponseHeaderSize {
			return closeError(ErrMalformed, "read response shorter than 24 bytes", h)
		}
		rc, ledgerID, entryID := parseResponseHeader(frame)
		resp.Read = ReadResponse{Header: h, RC: rc, LedgerID: ledgerID, EntryID: entryID,
			Entry: frame[ResponseHeaderSize:]}
		return nil
	case OpBatchReadEntry:
		return decodeBatchReadResponse(h, frame, &resp.BatchRead)
	case OpAuth:
		m, err := parseAuthMessage(frame[HeaderSize:])
		if err != nil {
			return closeError(ErrMalformed, "bad AuthMessage in AUTH response", h)
		}
		resp.Auth = AuthResponse{Header: h, Message: m}
		return nil
	}
	return closeError(ErrUnknownOp, "response opcode not carried by the v2 protocol", h)
}

func parseResponseHeader(frame []byte) (ReturnCode, int64, int64) {
	return ReturnCode(getInt32(frame[HeaderSize:])), getInt64(frame[HeaderSize+4:]), getInt64(frame[HeaderSize+12:])
}

func decodeBatchReadResponse(h Header, frame []byte, r *BatchReadResponse) error {
	if len(frame) < ResponseHeaderSize+8 {
		return closeError(ErrMalformed, "batch read response shorter than 32 bytes", h)
	}
	data := frame[ResponseHeaderSize+8:]
	count, ok := countBatchEntries(data)
	if !ok {
		return closeError(ErrMalformed, "batch read response entries do not tile the frame", h)
	}
	rc, ledgerID, entryID := parseResponseHeader(frame)
	*r = BatchReadResponse{
		Header: h, RC: rc, LedgerID: ledgerID, StartEntryID: entryID,
		RequestID: getInt64(frame[ResponseHeaderSize:]), Data: data, Count: count,
	}
	return nil
}

// nextBatchEntry splits the first [int32 length][entry] off data.
func nextBatchEntry(data []byte) (entry, rest []byte, ok bool) {
	if len(data) < 4 {
		return nil, nil, false
	}
	n := getInt32(data)
	if n < 0 || int64(n) > int64(len(data)-4) {
		return nil, nil, false
	}
	end := 4 + int(n)
	return data[4:end:end], data[end:], true
}

func countBatchEntries(data []byte) (int, bool) {
	count := 0
	for len(data) > 0 {
		_, rest, ok := nextBatchEntry(data)
		if !ok {
			return 0, false
		}
		data = rest
		count++
	}
	return count, true
}

func appendResponseHeader(dst []byte, frameLen uint32, h Header, rc ReturnCode, ledgerID, entryID int64) []byte {
	dst = appendUint32(dst, frameLen)
	dst = appendUint32(dst, h.Uint32())
	dst = appendUint32(dst, uint32(rc))
	dst = appendUint64(dst, uint64(ledgerID))
	return appendUint64(dst, uint64(entryID))
}

// AppendAddResponse appends an add response frame (28 bytes with the length prefix; opcode
// OpAddEntry). It does not allocate when dst has room. Like every response encoder it writes
// r.Header's version and flags; a bookie answers with the request's version and flags 0
// (AddRequest.AppendResponse does that).
func AppendAddResponse(dst []byte, r AddResponse) []byte {
	h := r.Header
	h.Op = OpAddEntry
	return appendResponseHeader(dst, ResponseHeaderSize, h, r.RC, r.LedgerID, r.EntryID)
}

// AppendReadResponse appends a read response frame (opcode OpReadEntry) followed by r.Entry.
func AppendReadResponse(dst []byte, r ReadResponse) ([]byte, error) {
	n, err := frameLength(ResponseHeaderSize + len(r.Entry))
	if err != nil {
		return dst, err
	}
	h := r.Header
	h.Op = OpReadEntry
	dst = appendResponseHeader(dst, n, h, r.RC, r.LedgerID, r.EntryID)
	return append(dst, r.Entry...), nil
}

// AppendBatchReadResponse appends a batch read response frame (opcode OpBatchReadEntry) with
// r.Data, which must be well-formed entries (AppendBatchEntry). To build a large response
// without a second copy, append it with an empty Data, append the entries to dst with
// AppendBatchEntry, then fix the length with PatchFrameLength.
func AppendBatchReadResponse(dst []byte, r BatchReadResponse) ([]byte, error) {
	if _, ok := countBatchEntries(r.Data); !ok {
		return dst, fmt.Errorf("%w: batch read response data is not [int32 length][entry] records", ErrMalformed)
	}
	n, err := frameLength(ResponseHeaderSize + 8 + len(r.Data))
	if err != nil {
		return dst, err
	}
	h := r.Header
	h.Op = OpBatchReadEntry
	dst = appendResponseHeader(dst, n, h, r.RC, r.LedgerID, r.StartEntryID)
	dst = appendUint64(dst, uint64(r.RequestID))
	return append(dst, r.Data...), nil
}

// AppendBatchEntry appends one batch read entry, [int32 length][entry].
func AppendBatchEntry(dst, entry []byte) ([]byte, error) {
	if len(entry) > math.MaxInt32 {
		return dst, fmt.Errorf("%w: a %d-byte entry", ErrFrameTooLarge, len(entry))
	}
	dst = appendUint32(dst, uint32(len(entry)))
	return append(dst, entry...), nil
}

// AppendAuthResponse appends an AUTH response frame: the header (opcode OpAuth) and the
// AuthMessage; there is no return code.
func AppendAuthResponse(dst []byte, r AuthResponse) ([]byte, error) {
	return appendAuth(dst, r.Header, r.Message)
}
