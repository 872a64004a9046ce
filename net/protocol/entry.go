package protocol

import (
	"crypto/sha1"
	"crypto/subtle"
	"fmt"
)

// EntryHeader is the 32-byte header that starts every stored entry. The digest (its length
// depends on the ledger's digest type) and the payload follow it; the bookie stores the entry
// as opaque bytes and never checks the digest.
type EntryHeader struct {
	LedgerID         int64
	EntryID          int64
	LastAddConfirmed int64
	// Length is the ledger's cumulative length in bytes up to and including this entry.
	Length int64
}

// ParseEntryHeader reads the header of a stored entry.
func ParseEntryHeader(entry []byte) (EntryHeader, error) {
	if len(entry) < StoredEntryHeaderSize {
		return EntryHeader{}, fmt.Errorf("%w: stored entry of %d bytes is shorter than its %d-byte header",
			ErrMalformed, len(entry), StoredEntryHeaderSize)
	}
	return EntryHeader{
		LedgerID: getInt64(entry), EntryID: getInt64(entry[8:]),
		LastAddConfirmed: getInt64(entry[16:]), Length: getInt64(entry[24:]),
	}, nil
}

// AppendEntryHeader appends the 32-byte stored entry header.
func AppendEntryHeader(dst []byte, h EntryHeader) []byte {
	dst = appendUint64(dst, uint64(h.LedgerID))
	dst = appendUint64(dst, uint64(h.EntryID))
	dst = appendUint64(dst, uint64(h.LastAddConfirmed))
	return appendUint64(dst, uint64(h.Length))
}

// MasterKey derives a ledger's master key from its password: SHA-1("ledger" ‖ password), as
// BookKeeper's MacDigestManager.genDigest("ledger", password) does. There is no special case
// for an empty password: it gives SHA-1("ledger"), the same key for every password-less ledger
// (BookKeeper's decoder merely shares one array for that key).
func MasterKey(password []byte) [MasterKeyLength]byte {
	h := sha1.New()
	h.Write([]byte("ledger"))
	h.Write(password)
	var key [MasterKeyLength]byte
	h.Sum(key[:0])
	return key
}

// MasterKeyEqual compares two master keys in constant time (for keys of the same length).
// Keys of any length other than MasterKeyLength never match.
func MasterKeyEqual(a, b []byte) bool {
	return len(a) == MasterKeyLength && len(b) == MasterKeyLength && subtle.ConstantTimeCompare(a, b) == 1
}
