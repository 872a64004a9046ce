package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// RecordType is the kind of a journal record. Wire format: do not renumber.
type RecordType uint8

const (
	recordInvalid RecordType = 0
	// RecordData holds a stored entry (BookKeeper's add).
	RecordData RecordType = 1
	// RecordLedgerKey holds a ledger's master key; it precedes the ledger's first data record.
	RecordLedgerKey RecordType = 2
	// RecordFence marks a ledger fenced.
	RecordFence RecordType = 3
	// RecordExplicitLAC holds an explicit last-add-confirmed packet.
	RecordExplicitLAC RecordType = 4
	// recordPadding ends every group: it fills the group to the alignment and carries the
	// durable claim (see doc.go).
	recordPadding RecordType = 5
	// recordFileEnd is the last record of a file that was rolled over cleanly.
	recordFileEnd   RecordType = 6
	recordTypeLimit RecordType = 7
)

func (t RecordType) String() string {
	switch t {
	case RecordData:
		return "data"
	case RecordLedgerKey:
		return "ledger-key"
	case RecordFence:
		return "fence"
	case RecordExplicitLAC:
		return "explicit-lac"
	case recordPadding:
		return "padding"
	case recordFileEnd:
		return "file-end"
	}
	return fmt.Sprintf("RecordType(%d)", uint8(t))
}

// recordHeaderSize is the size of a record header. Wire format: do not change.
const recordHeaderSize = 32

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors that describe why bytes are not a valid record.
var (
	errShortRecord   = errors.New("journal: record extends past the end of the data")
	errBadRecordType = errors.New("journal: bad record type")
	errBadReserved   = errors.New("journal: reserved record bytes are not zero")
	errRecordTooBig  = errors.New("journal: record length exceeds the maximum")
	errRecordCRC     = errors.New("journal: record header checksum mismatch")
	errPayloadCRC    = errors.New("journal: record payload checksum mismatch")
)

// recordHeader is a decoded record header.
type recordHeader struct {
	crc        uint32
	length     uint32
	typ        RecordType
	ledgerID   uint64
	entryID    uint64
	payloadCRC uint32
}

// fileSalt is the CRC32C of the file id: every record CRC of a file starts from it, so bytes
// written for another file id (a recycled file, stale preallocated space) never verify.
func fileSalt(fileID uint64) uint32 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], fileID)
	return crc32.Update(0, castagnoli, b[:])
}

// payloadChecksum is the CRC32C of a record payload. Producers compute it in Append, in
// parallel (or hand it in with Entry.SetPayloadCRC), so that the writer goroutine only
// checksums the 28 header bytes.
func payloadChecksum(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// putRecordHeader encodes and seals a record header at dst[:recordHeaderSize].
func putRecordHeader(dst []byte, salt uint32, typ RecordType, ledgerID, entryID uint64, length int, payloadCRC uint32) {
	_ = dst[recordHeaderSize-1]
	binary.LittleEndian.PutUint32(dst[4:], uint32(length))
	dst[8], dst[9], dst[10], dst[11] = byte(typ), 0, 0, 0
	binary.LittleEndian.PutUint64(dst[12:], ledgerID)
	binary.LittleEndian.PutUint64(dst[20:], entryID)
	binary.LittleEndian.PutUint32(dst[28:], payloadCRC)
	binary.LittleEndian.PutUint32(dst[0:], crc32.Update(salt, castagnoli, dst[4:recordHeaderSize]))
}

// appendRecord encodes a record at dst[0:] and returns its size. dst must have room.
func appendRecord(dst []byte, salt uint32, typ RecordType, ledgerID, entryID uint64, payload []byte, payloadCRC uint32) int {
	putRecordHeader(dst, salt, typ, ledgerID, entryID, len(payload), payloadCRC)
	return recordHeaderSize + copy(dst[recordHeaderSize:], payload)
}

// decodeRecordHeader parses and verifies the header at b (not the payload).
func decodeRecordHeader(b []byte, salt uint32, maxPayload int) (recordHeader, error) {
	if len(b) < recordHeaderSize {
		return recordHeader{}, errShortRecord
	}
	h := recordHeader{
		crc:        binary.LittleEndian.Uint32(b[0:]),
		length:     binary.LittleEndian.Uint32(b[4:]),
		typ:        RecordType(b[8]),
		ledgerID:   binary.LittleEndian.Uint64(b[12:]),
		entryID:    binary.LittleEndian.Uint64(b[20:]),
		payloadCRC: binary.LittleEndian.Uint32(b[28:]),
	}
	if h.typ == recordInvalid || h.typ >= recordTypeLimit {
		return h, errBadRecordType
	}
	if b[9]|b[10]|b[11] != 0 {
		return h, errBadReserved
	}
	if crc32.Update(salt, castagnoli, b[4:recordHeaderSize]) != h.crc {
		return h, errRecordCRC
	}
	if uint64(h.length) > uint64(maxPayload) {
		return h, errRecordTooBig
	}
	return h, nil
}

// decodeRecord parses and verifies the record at the start of b. It returns the header, the
// payload (aliasing b) and the record's total size.
func decodeRecord(b []byte, salt uint32, maxPayload int) (recordHeader, []byte, int, error) {
	h, err := decodeRecordHeader(b, salt, maxPayload)
	if err != nil {
		return h, nil, 0, err
	}
	size := recordHeaderSize + int(h.length)
	if len(b) < size {
		return h, nil, 0, errShortRecord
	}
	payload := b[recordHeaderSize:size]
	if payloadChecksum(payload) != h.payloadCRC {
		return h, nil, 0, errPayloadCRC
	}
	return h, payload, size, nil
}
