package dlog

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
)

// DLSN is a record's position in a log: the sequence number of its segment, the id of the
// ledger entry that holds it, and its slot in that entry (BookKeeper DistributedLog's
// DistributedLog Sequence Number). DLSNs of a log's records increase in the order the records
// were written; compare them with Compare or Less. The first position of a log is
// InitialDLSN.
type DLSN struct {
	SegmentSeqNo int64
	EntryID      int64
	SlotID       int64
}

// InitialDLSN is the first position of every log: segment 1, entry 0, slot 0.
var InitialDLSN = DLSN{SegmentSeqNo: 1}

// dlsnVersion is the version byte of the binary form (wire format, do not change).
const dlsnVersion = 1

// DLSNSize is the length of the binary form: a version byte and three big-endian int64s.
const DLSNSize = 1 + 3*8

// Compare returns -1, 0 or +1 as d is before, at or after o.
func (d DLSN) Compare(o DLSN) int {
	switch {
	case d.SegmentSeqNo != o.SegmentSeqNo:
		return cmpInt(d.SegmentSeqNo, o.SegmentSeqNo)
	case d.EntryID != o.EntryID:
		return cmpInt(d.EntryID, o.EntryID)
	default:
		return cmpInt(d.SlotID, o.SlotID)
	}
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Less reports whether d is before o.
func (d DLSN) Less(o DLSN) bool { return d.Compare(o) < 0 }

// Bytes returns the binary form: version byte 1, then SegmentSeqNo, EntryID and SlotID as
// big-endian int64s (BookKeeper DistributedLog's DLSN serialisation).
func (d DLSN) Bytes() []byte {
	b := make([]byte, DLSNSize)
	b[0] = dlsnVersion
	binary.BigEndian.PutUint64(b[1:], uint64(d.SegmentSeqNo))
	binary.BigEndian.PutUint64(b[9:], uint64(d.EntryID))
	binary.BigEndian.PutUint64(b[17:], uint64(d.SlotID))
	return b
}

// DLSNFromBytes decodes the binary form.
func DLSNFromBytes(b []byte) (DLSN, error) {
	if len(b) != DLSNSize {
		return DLSN{}, fmt.Errorf("%w: DLSN of %d bytes, want %d", ErrInvalidDLSN, len(b), DLSNSize)
	}
	if b[0] != dlsnVersion {
		return DLSN{}, fmt.Errorf("%w: DLSN version %d, want %d", ErrInvalidDLSN, b[0], dlsnVersion)
	}
	d := DLSN{
		SegmentSeqNo: int64(binary.BigEndian.Uint64(b[1:])),
		EntryID:      int64(binary.BigEndian.Uint64(b[9:])),
		SlotID:       int64(binary.BigEndian.Uint64(b[17:])),
	}
	if err := d.check(); err != nil {
		return DLSN{}, err
	}
	return d, nil
}

// check refuses a DLSN with a negative field: no record has one.
func (d DLSN) check() error {
	if d.SegmentSeqNo < 0 || d.EntryID < 0 || d.SlotID < 0 {
		return fmt.Errorf("%w: negative field in %s", ErrInvalidDLSN, d.Text())
	}
	return nil
}

// String returns the binary form in standard base64 (36 characters), as DistributedLog's
// DLSN.serialize does; ParseDLSN reads it back.
func (d DLSN) String() string { return base64.StdEncoding.EncodeToString(d.Bytes()) }

// Text returns a readable form, "seq/entry/slot", for messages.
func (d DLSN) Text() string { return fmt.Sprintf("%d/%d/%d", d.SegmentSeqNo, d.EntryID, d.SlotID) }

// ParseDLSN decodes the form String returns.
func ParseDLSN(s string) (DLSN, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return DLSN{}, fmt.Errorf("%w: %q: %w", ErrInvalidDLSN, s, err)
	}
	return DLSNFromBytes(b)
}

// MarshalBinary implements encoding.BinaryMarshaler.
func (d DLSN) MarshalBinary() ([]byte, error) { return d.Bytes(), nil }

// UnmarshalBinary implements encoding.BinaryUnmarshaler.
func (d *DLSN) UnmarshalBinary(b []byte) (err error) {
	*d, err = DLSNFromBytes(b)
	return err
}

// MarshalText implements encoding.TextMarshaler (the base64 form).
func (d DLSN) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *DLSN) UnmarshalText(b []byte) (err error) {
	*d, err = ParseDLSN(string(b))
	return err
}
