package client

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"

	"github.com/ringkeeper/ringkeeper/metadata"
)

// DigestType is a ledger's per-entry digest (BookKeeper's DigestType; values as in metadata).
type DigestType = metadata.DigestType

const (
	DigestCRC32  = metadata.DigestCRC32
	DigestHMAC   = metadata.DigestHMAC
	DigestCRC32C = metadata.DigestCRC32C
	DigestDummy  = metadata.DigestDummy
)

// entryHeaderSize is the stored entry's header: ledgerId, entryId, lastAddConfirmed, length.
const entryHeaderSize = 32

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// digester computes BookKeeper's per-entry digest over the 32-byte header and the payload.
// The stored entry is header ‖ digest ‖ payload.
type digester struct {
	typ  DigestType
	size int
	// macKey is SHA1("mac" ‖ password), the HMAC-SHA1 key.
	macKey []byte
}

func newDigester(typ DigestType, password []byte) (*digester, error) {
	d := &digester{typ: typ}
	switch typ {
	case DigestCRC32:
		d.size = 8
	case DigestCRC32C:
		d.size = 4
	case DigestHMAC:
		d.size = 20
		h := sha1.New()
		h.Write([]byte("mac"))
		h.Write(password)
		d.macKey = h.Sum(nil)
	case DigestDummy:
		d.size = 0
	default:
		return nil, fmt.Errorf("%w: unknown digest type %d", ErrBadArgument, typ)
	}
	return d, nil
}

// headerSize is the size of header plus digest.
func (d *digester) headerSize() int { return entryHeaderSize + d.size }

// seal writes the header fields into hdr[:32] and the digest of hdr[:32] ‖ payload after them.
// hdr must have headerSize bytes. mac is a reusable HMAC state (nil for other digests).
func (d *digester) seal(hdr []byte, mac hash.Hash, ledgerID, entryID, lac, length int64, payload []byte) {
	binary.BigEndian.PutUint64(hdr[0:], uint64(ledgerID))
	binary.BigEndian.PutUint64(hdr[8:], uint64(entryID))
	binary.BigEndian.PutUint64(hdr[16:], uint64(lac))
	binary.BigEndian.PutUint64(hdr[24:], uint64(length))
	d.compute(hdr[entryHeaderSize:entryHeaderSize+d.size], hdr[:entryHeaderSize], payload, mac)
}

func (d *digester) compute(dst, header, payload []byte, mac hash.Hash) {
	switch d.typ {
	case DigestCRC32:
		c := crc32.Update(crc32.ChecksumIEEE(header), crc32.IEEETable, payload)
		binary.BigEndian.PutUint64(dst, uint64(c))
	case DigestCRC32C:
		c := crc32.Update(crc32.Checksum(header, castagnoli), castagnoli, payload)
		binary.BigEndian.PutUint32(dst, c)
	case DigestHMAC:
		if mac == nil {
			mac = d.newMAC()
		}
		mac.Reset()
		mac.Write(header)
		mac.Write(payload)
		mac.Sum(dst[:0])
	}
}

func (d *digester) newMAC() hash.Hash {
	if d.typ != DigestHMAC {
		return nil
	}
	return hmac.New(sha1.New, d.macKey)
}

// Entry is a verified entry read from a ledger.
type Entry struct {
	LedgerID int64
	EntryID  int64
	// LastAddConfirmed is the LAC the writer had when it wrote this entry.
	LastAddConfirmed int64
	// Length is the ledger's length in bytes up to and including this entry.
	Length  int64
	Payload []byte
}

// verify checks a stored entry's digest and that it is entry (ledgerID, entryID); the
// returned entry's Payload aliases stored.
func (d *digester) verify(stored []byte, ledgerID, entryID int64) (Entry, error) {
	if len(stored) < d.headerSize() {
		return Entry{}, fmt.Errorf("%w: entry %d/%d is %d bytes, shorter than its header", ErrDigestMismatch, ledgerID, entryID, len(stored))
	}
	e := Entry{
		LedgerID:         int64(binary.BigEndian.Uint64(stored[0:])),
		EntryID:          int64(binary.BigEndian.Uint64(stored[8:])),
		LastAddConfirmed: int64(binary.BigEndian.Uint64(stored[16:])),
		Length:           int64(binary.BigEndian.Uint64(stored[24:])),
		Payload:          stored[d.headerSize():],
	}
	if e.LedgerID != ledgerID || (entryID >= 0 && e.EntryID != entryID) {
		return Entry{}, fmt.Errorf("%w: asked for %d/%d, got %d/%d", ErrDigestMismatch, ledgerID, entryID, e.LedgerID, e.EntryID)
	}
	if d.size > 0 {
		var want [20]byte
		d.compute(want[:d.size], stored[:entryHeaderSize], e.Payload, nil)
		if !hmac.Equal(want[:d.size], stored[entryHeaderSize:d.headerSize()]) {
			return Entry{}, fmt.Errorf("%w: entry %d/%d", ErrDigestMismatch, ledgerID, e.EntryID)
		}
	}
	return e, nil
}

// MasterKey is the master key bookies check on writes and fencing: SHA1("ledger" ‖ password).
func MasterKey(password []byte) [20]byte {
	h := sha1.New()
	h.Write([]byte("ledger"))
	h.Write(password)
	var k [20]byte
	h.Sum(k[:0])
	return k
}
