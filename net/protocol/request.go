package protocol

import (
	"encoding/binary"
	"fmt"
)

// AddRequest is an ADDENTRY request: the master key, then the stored entry.
type AddRequest struct {
	Header    Header
	MasterKey [MasterKeyLength]byte
	// LedgerID and EntryID are the first 16 bytes of Entry. The decoder fills them in;
	// AppendAddRequest ignores them and writes Entry as it is.
	LedgerID int64
	EntryID  int64
	// Entry is the stored entry (ledgerId, entryId, lastAddConfirmed, length, digest, payload),
	// at least StoredEntryHeaderSize bytes. A decoded Entry aliases the frame.
	Entry []byte
}

// IsRecoveryAdd reports FlagRecoveryAdd: the add is allowed on a fenced ledger.
func (r *AddRequest) IsRecoveryAdd() bool { return r.Header.Flags.Has(FlagRecoveryAdd) }

// IsHighPriority reports FlagHighPriority.
func (r *AddRequest) IsHighPriority() bool { return r.Header.Flags.Has(FlagHighPriority) }

// AppendResponse appends the response to this add: rc, the request's version and ids.
func (r *AddRequest) AppendResponse(dst []byte, rc ReturnCode) []byte {
	return AppendAddResponse(dst, AddResponse{
		Header: Header{Version: r.Header.Version, Op: OpAddEntry}, RC: rc, LedgerID: r.LedgerID, EntryID: r.EntryID,
	})
}

// ReadRequest is a READENTRY request.
type ReadRequest struct {
	Header   Header
	LedgerID int64
	// EntryID is the entry to read; LastAddConfirmedEntryID (-1) asks for the last entry.
	EntryID int64
	// MasterKey is present (HasMasterKey) when the client sent one; a version-2 fencing read
	// must carry it. A key on a read without FlagDoFencing is decoded and re-encoded but has
	// no meaning (BookKeeper ignores it).
	MasterKey    [MasterKeyLength]byte
	HasMasterKey bool
}

// IsFencing reports FlagDoFencing: fence the ledger, then answer with the read.
func (r *ReadRequest) IsFencing() bool { return r.Header.Flags.Has(FlagDoFencing) }

// IsHighPriority reports FlagHighPriority.
func (r *ReadRequest) IsHighPriority() bool { return r.Header.Flags.Has(FlagHighPriority) }

// AppendResponse appends the response to this read: rc, the request's version and ids, and
// entry (nil for an error).
func (r *ReadRequest) AppendResponse(dst []byte, rc ReturnCode, entry []byte) ([]byte, error) {
	return AppendReadResponse(dst, ReadResponse{
		Header: Header{Version: r.Header.Version, Op: OpReadEntry}, RC: rc,
		LedgerID: r.LedgerID, EntryID: r.EntryID, Entry: entry,
	})
}

// BatchReadRequest is a BATCH_READ_ENTRY request: read up to MaxCount entries and MaxSize
// bytes starting at StartEntryID. MaxCount 0 means no count limit (as BookKeeper reads a
// count ≤ 0); negative counts and sizes are rejected by the decoder.
type BatchReadRequest struct {
	Header       Header
	LedgerID     int64
	StartEntryID int64
	// RequestID is the client's transaction id, echoed by the response.
	RequestID    int64
	MaxCount     int32
	MaxSize      int64
	MasterKey    [MasterKeyLength]byte
	HasMasterKey bool
}

// IsFencing reports FlagDoFencing.
func (r *BatchReadRequest) IsFencing() bool { return r.Header.Flags.Has(FlagDoFencing) }

// AuthRequest is an AUTH request.
type AuthRequest struct {
	Header  Header
	Message AuthMessage
}

// Request is a decoded request. Header.Op says which one of Add, Read, BatchRead and Auth
// DecodeRequest filled in; the others are left as they were.
type Request struct {
	Header    Header
	Add       AddRequest
	Read      ReadRequest
	BatchRead BatchReadRequest
	Auth      AuthRequest
}

// Layout sizes after the packet header.
const (
	idsSize            = 16           // ledgerId, entryId
	batchReadFixedSize = idsSize + 20 // + requestId i64, maxCount i32, maxSize i64
)

// DecodeRequest decodes one request frame (the bytes after the length prefix) in place: the
// stored entry and the AUTH fields alias frame, so the caller must copy what it keeps before
// the buffer is reused. Decoding an add or read request does not allocate.
//
// Errors are *DecodeError: ActionRespond with EBADREQ for a malformed add, read or batch read
// whose ids were parsed, ActionRespond with EBADVERSION for one whose version the bookie does
// not serve, and ActionClose for everything else (frames too short to address a response,
// unknown opcodes, bad AUTH messages). After an error the contents of req are unspecified.
func DecodeRequest(frame []byte, req *Request) error {
	if len(frame) < HeaderSize {
		return closeError(ErrMalformed, "frame shorter than the packet header", Header{})
	}
	h := ParseHeader(binary.BigEndian.Uint32(frame))
	body := frame[HeaderSize:]
	req.Header = h
	switch h.Op {
	case OpAddEntry:
		return decodeAddRequest(h, body, &req.Add)
	case OpReadEntry:
		return decodeReadRequest(h, body, &req.Read)
	case OpBatchReadEntry:
		return decodeBatchReadRequest(h, body, &req.BatchRead)
	case OpAuth:
		m, err := parseAuthMessage(body)
		if err != nil {
			return closeError(ErrMalformed, "bad AuthMessage in AUTH request", h)
		}
		req.Auth = AuthRequest{Header: h, Message: m}
		return nil
	}
	return closeError(ErrUnknownOp, "opcode not served by the v2 protocol", h)
}

func decodeAddRequest(h Header, body []byte, r *AddRequest) error {
	if len(body) < MasterKeyLength+idsSize {
		return closeError(ErrMalformed, "add request too short for the master key and the entry's ids", h)
	}
	entry := body[MasterKeyLength:]
	ledgerID, entryID := getInt64(entry), getInt64(entry[8:])
	if !h.Compatible() {
		return respondError(ErrBadVersion, EBADVERSION, "add request version not served", h, ledgerID, entryID, 0)
	}
	if len(entry) < StoredEntryHeaderSize {
		return respondError(ErrMalformed, EBADREQ, "stored entry shorter than its 32-byte header", h, ledgerID, entryID, 0)
	}
	r.Header = h
	copy(r.MasterKey[:], body[:MasterKeyLength])
	r.LedgerID, r.EntryID = ledgerID, entryID
	r.Entry = entry
	return nil
}

// decodeTrailingKey applies the master-key rule shared by read and batch-read requests: after
// the fixed fields come either nothing or a 20-byte key; a key is read only from version 2 on
// (as BookKeeper does), and a version-2 fencing read must carry one.
func decodeTrailingKey(h Header, rest []byte, key *[MasterKeyLength]byte) (has bool, reason string) {
	switch len(rest) {
	case 0:
		if h.Version >= 2 && h.Flags.Has(FlagDoFencing) {
			return false, "fencing read without a master key"
		}
		return false, ""
	case MasterKeyLength:
		if h.Version < 2 {
			return false, "master key in a read request older than version 2"
		}
		copy(key[:], rest)
		return true, ""
	}
	return false, "read request length is neither with nor without a master key"
}

func decodeReadRequest(h Header, body []byte, r *ReadRequest) error {
	if len(body) < idsSize {
		return closeError(ErrMalformed, "read request too short for ledger and entry ids", h)
	}
	ledgerID, entryID := getInt64(body), getInt64(body[8:])
	if !h.Compatible() {
		return respondError(ErrBadVersion, EBADVERSION, "read request version not served", h, ledgerID, entryID, 0)
	}
	var key [MasterKeyLength]byte
	has, reason := decodeTrailingKey(h, body[idsSize:], &key)
	if reason != "" {
		return respondError(ErrMalformed, EBADREQ, reason, h, ledgerID, entryID, 0)
	}
	*r = ReadRequest{Header: h, LedgerID: ledgerID, EntryID: entryID, MasterKey: key, HasMasterKey: has}
	return nil
}

func decodeBatchReadRequest(h Header, body []byte, r *BatchReadRequest) error {
	if len(body) < idsSize+8 {
		return closeError(ErrMalformed, "batch read request too short for its ids and request id", h)
	}
	ledgerID, startEntryID, requestID := getInt64(body), getInt64(body[8:]), getInt64(body[16:])
	if !h.Compatible() {
		return respondError(ErrBadVersion, EBADVERSION, "batch read request version not served", h,
			ledgerID, startEntryID, requestID)
	}
	bad := func(reason string) error {
		return respondError(ErrMalformed, EBADREQ, reason, h, ledgerID, startEntryID, requestID)
	}
	if len(body) < batchReadFixedSize {
		return bad("batch read request too short for maxCount and maxSize")
	}
	maxCount, maxSize := getInt32(body[24:]), getInt64(body[28:])
	if maxCount < 0 {
		return bad("batch read request with a negative maxCount")
	}
	if maxSize < 0 {
		return bad("batch read request with a negative maxSize")
	}
	var key [MasterKeyLength]byte
	has, reason := decodeTrailingKey(h, body[batchReadFixedSize:], &key)
	if reason != "" {
		return bad(reason)
	}
	*r = BatchReadRequest{
		Header: h, LedgerID: ledgerID, StartEntryID: startEntryID, RequestID: requestID,
		MaxCount: maxCount, MaxSize: maxSize, MasterKey: key, HasMasterKey: has,
	}
	return nil
}

// AppendAddRequest appends an add request frame: r.Header's version and flags (the opcode is
// always OpAddEntry), r.MasterKey, then r.Entry copied as it is. The entry must be at least
// StoredEntryHeaderSize bytes.
func AppendAddRequest(dst []byte, r AddRequest) ([]byte, error) {
	if len(r.Entry) < StoredEntryHeaderSize {
		return dst, fmt.Errorf("%w: stored entry of %d bytes is shorter than its %d-byte header",
			ErrMalformed, len(r.Entry), StoredEntryHeaderSize)
	}
	n, err := frameLength(HeaderSize + MasterKeyLength + len(r.Entry))
	if err != nil {
		return dst, err
	}
	h := r.Header
	h.Op = OpAddEntry
	dst = appendUint32(dst, n)
	dst = appendUint32(dst, h.Uint32())
	dst = append(dst, r.MasterKey[:]...)
	return append(dst, r.Entry...), nil
}

// AppendReadRequest appends a read request frame: r.Header's version and flags (the opcode is
// always OpReadEntry), the ids, and the master key if r.HasMasterKey. A version-2 fencing read
// needs the key; a key on a read older than version 2 is not decodable.
func AppendReadRequest(dst []byte, r ReadRequest) []byte {
	n := HeaderSize + idsSize
	if r.HasMasterKey {
		n += MasterKeyLength
	}
	h := r.Header
	h.Op = OpReadEntry
	dst = appendUint32(dst, uint32(n))
	dst = appendUint32(dst, h.Uint32())
	dst = appendUint64(dst, uint64(r.LedgerID))
	dst = appendUint64(dst, uint64(r.EntryID))
	if r.HasMasterKey {
		dst = append(dst, r.MasterKey[:]...)
	}
	return dst
}

// AppendBatchReadRequest appends a batch read request frame (opcode OpBatchReadEntry), with
// the master key if r.HasMasterKey.
func AppendBatchReadRequest(dst []byte, r BatchReadRequest) []byte {
	n := HeaderSize + batchReadFixedSize
	if r.HasMasterKey {
		n += MasterKeyLength
	}
	h := r.Header
	h.Op = OpBatchReadEntry
	dst = appendUint32(dst, uint32(n))
	dst = appendUint32(dst, h.Uint32())
	dst = appendUint64(dst, uint64(r.LedgerID))
	dst = appendUint64(dst, uint64(r.StartEntryID))
	dst = appendUint64(dst, uint64(r.RequestID))
	dst = appendUint32(dst, uint32(r.MaxCount))
	dst = appendUint64(dst, uint64(r.MaxSize))
	if r.HasMasterKey {
		dst = append(dst, r.MasterKey[:]...)
	}
	return dst
}

// AppendAuthRequest appends an AUTH request frame: the header (opcode OpAuth) and the
// AuthMessage in protobuf encoding.
func AppendAuthRequest(dst []byte, r AuthRequest) ([]byte, error) {
	return appendAuth(dst, r.Header, r.Message)
}

func appendAuth(dst []byte, h Header, m AuthMessage) ([]byte, error) {
	n, err := frameLength(HeaderSize + authMessageSize(m))
	if err != nil {
		return dst, err
	}
	h.Op = OpAuth
	dst = appendUint32(dst, n)
	dst = appendUint32(dst, h.Uint32())
	return appendAuthMessage(dst, m), nil
}
