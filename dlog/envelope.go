package dlog

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Entry envelope, version 1 (wire format, do not change; see doc.go for the diagram).
const (
	envelopeVersion = 1
	// envelopeHeaderSize is the fixed header before the records.
	envelopeHeaderSize = 34
	// recordHeaderSize is the per-record header: txid int64, length uint32.
	recordHeaderSize = 12
	// flagControl marks a control entry: it holds no records and only carries the writer's
	// last-add-confirmed to readers.
	flagControl = 1 << 0
	// knownFlags are the flags version 1 defines.
	knownFlags = flagControl
	// envelopeCRCOffset is where the CRC32C lies in the header.
	envelopeCRCOffset = 30
)

// MaxRecordSize is the largest record payload (DistributedLog's limit: 1 MiB − 8 KiB).
const MaxRecordSize = 1<<20 - 8<<10

// maxEntryRecordBytes bounds the record bytes (headers and payloads) of one entry: a batch is
// sent before a record would take it past this, or past what the client's entry limit leaves
// after the envelope's header, if that is less.
const maxEntryRecordBytes = 1 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// entryHeader is the decoded header of an entry envelope.
type entryHeader struct {
	control bool
	// count is the number of records in the entry.
	count int
	// recordsBefore is the number of records in the earlier entries of the segment.
	recordsBefore int64
	// firstTxID is the segment's first record's transaction id, lastTxID that of the last
	// record up to and including this entry (-1: no record yet).
	firstTxID, lastTxID int64
}

// entryRecord is one record decoded from an envelope; payload aliases the entry.
type entryRecord struct {
	txID    int64
	payload []byte
}

// appendRecord appends one record (header and payload) to an envelope being built.
func appendRecord(buf []byte, txID int64, payload []byte) []byte {
	buf = binary.BigEndian.AppendUint64(buf, uint64(txID))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(payload)))
	return append(buf, payload...)
}

// sealEnvelope writes the header, and the CRC over the whole envelope, into buf[:34]; the
// records follow from buf[34:].
func sealEnvelope(buf []byte, h entryHeader) {
	flags := byte(0)
	if h.control {
		flags |= flagControl
	}
	buf[0] = envelopeVersion
	buf[1] = flags
	binary.BigEndian.PutUint32(buf[2:], uint32(h.count))
	binary.BigEndian.PutUint64(buf[6:], uint64(h.recordsBefore))
	binary.BigEndian.PutUint64(buf[14:], uint64(h.firstTxID))
	binary.BigEndian.PutUint64(buf[22:], uint64(h.lastTxID))
	binary.BigEndian.PutUint32(buf[envelopeCRCOffset:], envelopeCRC(buf))
}

// envelopeCRC is the CRC32C of the envelope with its CRC field left out.
func envelopeCRC(buf []byte) uint32 {
	crc := crc32.Update(0, castagnoli, buf[:envelopeCRCOffset])
	return crc32.Update(crc, castagnoli, buf[envelopeHeaderSize:])
}

// decodeEnvelope checks and decodes an entry; the records' payloads alias b. dst is reused.
func decodeEnvelope(b []byte, dst []entryRecord) (entryHeader, []entryRecord, error) {
	bad := func(format string, args ...any) (entryHeader, []entryRecord, error) {
		return entryHeader{}, dst[:0], fmt.Errorf("%w: entry envelope: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) < envelopeHeaderSize {
		return bad("%d bytes, shorter than the %d-byte header", len(b), envelopeHeaderSize)
	}
	if b[0] != envelopeVersion {
		return bad("version %d, want %d", b[0], envelopeVersion)
	}
	if b[1]&^knownFlags != 0 {
		return bad("unknown flags %#x", b[1])
	}
	if got, want := envelopeCRC(b), binary.BigEndian.Uint32(b[envelopeCRCOffset:]); got != want {
		return bad("CRC32C %#08x, header says %#08x", got, want)
	}
	h := entryHeader{
		control:       b[1]&flagControl != 0,
		count:         int(binary.BigEndian.Uint32(b[2:])),
		recordsBefore: int64(binary.BigEndian.Uint64(b[6:])),
		firstTxID:     int64(binary.BigEndian.Uint64(b[14:])),
		lastTxID:      int64(binary.BigEndian.Uint64(b[22:])),
	}
	rest := b[envelopeHeaderSize:]
	switch {
	case h.control && (h.count != 0 || len(rest) != 0):
		return bad("control entry with %d records", h.count)
	case h.count > len(rest)/recordHeaderSize:
		return bad("%d records in %d bytes", h.count, len(rest))
	case h.recordsBefore < 0 || h.firstTxID < -1 || h.lastTxID < h.firstTxID:
		return bad("records before %d, first txid %d, last txid %d", h.recordsBefore, h.firstTxID, h.lastTxID)
	case (h.recordsBefore+int64(h.count) == 0) != (h.firstTxID == -1):
		return bad("%d records so far but first txid %d", h.recordsBefore+int64(h.count), h.firstTxID)
	}
	recs := dst[:0]
	prev := int64(-1)
	for i := range h.count {
		if len(rest) < recordHeaderSize {
			return bad("record %d truncated", i)
		}
		txID := int64(binary.BigEndian.Uint64(rest))
		n := binary.BigEndian.Uint32(rest[8:])
		rest = rest[recordHeaderSize:]
		if uint64(n) > uint64(len(rest)) {
			return bad("record %d of %d bytes, %d left", i, n, len(rest))
		}
		if txID <= prev || txID < h.firstTxID {
			return bad("record %d: txid %d after %d (segment's first %d)", i, txID, prev, h.firstTxID)
		}
		prev = txID
		recs = append(recs, entryRecord{txID: txID, payload: rest[:n:n]})
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return bad("%d bytes after the last record", len(rest))
	}
	if h.count > 0 && prev != h.lastTxID {
		return bad("last record's txid %d, header says %d", prev, h.lastTxID)
	}
	return h, recs, nil
}
