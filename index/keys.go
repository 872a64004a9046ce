package index

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// Keyspace prefixes: the first byte of every key. Wire format: do not change.
const (
	prefixMeta   byte = 0x00
	prefixLedger byte = 0x01
	// prefixLocation holds format 1's one location per entry; Open converts them to runs.
	prefixLocation byte = 0x02
	prefixRun      byte = 0x03
	// prefixFencedDeleted holds the tombstones of ledgers deleted while fenced (format 3, added
	// without a version bump: see doc.go).
	prefixFencedDeleted byte = 0x04
)

// Key and value sizes. Wire format: do not change.
const (
	ledgerKeyLen = 1 + 8     // prefix ‖ BE(ledgerId)
	locationLen  = 8         // BE(location) (format 1)
	runKeyLen    = 1 + 8 + 8 // prefix ‖ BE(ledgerId) ‖ BE(last entryId of the run)
)

// The fenced-deleted tombstone: key prefixFencedDeleted ‖ BE(ledgerId) (ledgerKeyLen bytes),
// value version ‖ BE int64 wall-clock time of the deletion in Unix nanoseconds. Wire format:
// do not change.
const (
	fencedDeletedV1       byte = 1
	fencedDeletedValueLen      = 1 + 8
)

// The format record: key formatKey, value formatMagic ‖ BE uint32 version.
// Wire format: do not change; formatVersion only moves forward.
const (
	formatMagic   = "RKIX"
	formatVersion = 3
	// formatVersionRuns is format 2: runs, but no checkpoint record. Open adds an empty one.
	formatVersionRuns = 2
	// formatVersionLocations is format 1: one key per entry location. Open converts it.
	formatVersionLocations = 1
	formatLen              = len(formatMagic) + 4
)

var formatKey = []byte{prefixMeta, 'f', 'o', 'r', 'm', 'a', 't'}

// The checkpoint record (format 3): key checkpointKey, value opaque to the index (the
// engine's journal marks as of its last checkpoint), at most MaxCheckpointLen bytes; empty
// until the first checkpoint. Every format-3 store has one: its absence means writes were
// lost. Wire format: do not change.
var checkpointKey = []byte{prefixMeta, 'c', 'h', 'e', 'c', 'k', 'p', 'o', 'i', 'n', 't'}

// upgradedKey marks a store converted from format 1 or 2 until its first checkpoint record is
// committed (its value is empty). Wire format: do not change.
var upgradedKey = []byte{prefixMeta, 'u', 'p', 'g', 'r', 'a', 'd', 'e', 'd'}

// MaxCheckpointLen bounds a checkpoint record.
const MaxCheckpointLen = 1 << 16

// The ledger state value, version 1. Wire format: do not change.
const (
	ledgerStateV1 byte = 1

	flagExists   byte = 1 << 0
	flagFenced   byte = 1 << 1
	flagLimbo    byte = 1 << 2
	flagDeleted  byte = 1 << 3
	flagHasLAC   byte = 1 << 4
	flagsKnownV1      = flagExists | flagFenced | flagLimbo | flagDeleted | flagHasLAC

	ledgerStateHeaderLen = 1 + 1 + 2 // version, flags, BE uint16 master key length
)

// Limits of a ledger state's fields: a caller refuses longer ones up front (Batch.Commit would
// fail with ErrTooLarge).
const (
	MaxMasterKeyLen   = math.MaxUint16
	MaxExplicitLACLen = 1 << 20 // far above a LAC packet; guards the decoder's allocations
)

// putIDKey encodes prefix ‖ BE(ledgerID) ‖ BE(entryID) into k (17 bytes): a run key (entryID
// is the run's last entry) or a format-1 location key. Ids are non-negative, so their
// big-endian bytes sort like the numbers.
func putIDKey(k []byte, prefix byte, ledgerID, entryID int64) {
	_ = k[runKeyLen-1]
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:9], uint64(ledgerID))
	binary.BigEndian.PutUint64(k[9:17], uint64(entryID))
}

// putLedgerBounds encodes into b (2*runKeyLen long) the range of ledgerID's runs that end at
// fromEntry or later, [(ledgerID, fromEntry), (ledgerID+1, 0)), and returns the two bounds.
func putLedgerBounds(b []byte, ledgerID, fromEntry int64) (lower, upper []byte) {
	lower, upper = b[:runKeyLen:runKeyLen], b[runKeyLen:2*runKeyLen]
	putIDKey(lower, prefixRun, ledgerID, fromEntry)
	// ledgerID ≤ MaxInt64, so ledgerID+1 as a uint64 never wraps.
	upper[0] = prefixRun
	binary.BigEndian.PutUint64(upper[1:9], uint64(ledgerID)+1)
	binary.BigEndian.PutUint64(upper[9:17], 0)
	return lower, upper
}

// decodeIDKey returns the ids in a run key (prefixRun) or a format-1 location key.
func decodeIDKey(k []byte, prefix byte) (ledgerID, entryID int64, err error) {
	if len(k) != runKeyLen || k[0] != prefix {
		return 0, 0, fmt.Errorf("%w: key %x is not a %#x key", ErrCorrupt, k, prefix)
	}
	l, e := binary.BigEndian.Uint64(k[1:9]), binary.BigEndian.Uint64(k[9:17])
	if l > math.MaxInt64 || e > math.MaxInt64 {
		return 0, 0, fmt.Errorf("%w: key %x has a negative id", ErrCorrupt, k)
	}
	return int64(l), int64(e), nil
}

// decodeLocation decodes a location value.
func decodeLocation(v []byte, ledgerID, entryID int64) (uint64, error) {
	if len(v) != locationLen {
		return 0, fmt.Errorf("%w: location of ledger %d entry %d is %d bytes, want %d",
			ErrCorrupt, ledgerID, entryID, len(v), locationLen)
	}
	return binary.BigEndian.Uint64(v), nil
}

// putLedgerKey encodes ledgerID's state key into k, which must be ledgerKeyLen long.
func putLedgerKey(k []byte, ledgerID int64) { putLedgerIDKey(k, prefixLedger, ledgerID) }

// putFencedDeletedKey encodes ledgerID's tombstone key into k, which must be ledgerKeyLen long.
func putFencedDeletedKey(k []byte, ledgerID int64) { putLedgerIDKey(k, prefixFencedDeleted, ledgerID) }

// putLedgerIDKey encodes prefix ‖ BE(ledgerID), the layout of the keyspaces keyed by ledger alone.
func putLedgerIDKey(k []byte, prefix byte, ledgerID int64) {
	_ = k[ledgerKeyLen-1]
	k[0] = prefix
	binary.BigEndian.PutUint64(k[1:9], uint64(ledgerID))
}

// decodeLedgerIDKey returns the id in a prefix ‖ BE(ledgerId) key; what names the keyspace in errors.
func decodeLedgerIDKey(k []byte, prefix byte, what string) (int64, error) {
	if len(k) != ledgerKeyLen || k[0] != prefix {
		return 0, fmt.Errorf("%w: %s key %x", ErrCorrupt, what, k)
	}
	l := binary.BigEndian.Uint64(k[1:9])
	if l > math.MaxInt64 {
		return 0, fmt.Errorf("%w: %s key %x has a negative id", ErrCorrupt, what, k)
	}
	return int64(l), nil
}

// appendFencedDeleted appends the version-1 tombstone value of a deletion at deletedAt.
func appendFencedDeleted(dst []byte, deletedAt time.Time) []byte {
	dst = append(dst, fencedDeletedV1)
	return binary.BigEndian.AppendUint64(dst, uint64(deletedAt.UnixNano()))
}

// decodeFencedDeleted decodes a tombstone value: the wall-clock time of the deletion.
func decodeFencedDeleted(v []byte) (time.Time, error) {
	if len(v) != fencedDeletedValueLen || v[0] != fencedDeletedV1 {
		return time.Time{}, fmt.Errorf("%w: fenced-deleted value %x", ErrCorrupt, v)
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v[1:]))), nil
}

// LedgerState is what the index keeps about one ledger (BookKeeper's LedgerData).
type LedgerState struct {
	// Exists is set once the ledger was created on this bookie (its first add or its
	// ledger-key record).
	Exists bool
	// Fenced is permanent: a fenced ledger refuses normal adds.
	Fenced bool
	// Limbo is reserved (BookKeeper's LedgerData.limbo): the ledger's state is uncertain after
	// data loss and it must be recovered before it is served.
	Limbo bool
	// Deleted is reserved: the ledger was deleted and its locations may still be awaiting
	// removal.
	Deleted bool
	// MasterKey is the ledger's master key (usually 20 bytes), at most 65535 bytes.
	MasterKey []byte
	// ExplicitLAC is the last explicit LAC packet; nil means none was set (an empty non-nil
	// slice is kept as present and empty). At most 1 MiB.
	ExplicitLAC []byte
}

// appendLedgerState appends the version-1 encoding of st to dst.
func appendLedgerState(dst []byte, st *LedgerState) ([]byte, error) {
	if len(st.MasterKey) > MaxMasterKeyLen {
		return dst, fmt.Errorf("%w: master key of %d bytes (max %d)", ErrTooLarge, len(st.MasterKey), MaxMasterKeyLen)
	}
	if len(st.ExplicitLAC) > MaxExplicitLACLen {
		return dst, fmt.Errorf("%w: explicit LAC of %d bytes (max %d)", ErrTooLarge, len(st.ExplicitLAC), MaxExplicitLACLen)
	}
	var flags byte
	if st.Exists {
		flags |= flagExists
	}
	if st.Fenced {
		flags |= flagFenced
	}
	if st.Limbo {
		flags |= flagLimbo
	}
	if st.Deleted {
		flags |= flagDeleted
	}
	if st.ExplicitLAC != nil {
		flags |= flagHasLAC
	}
	dst = append(dst, ledgerStateV1, flags)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(st.MasterKey)))
	dst = append(dst, st.MasterKey...)
	if st.ExplicitLAC != nil {
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(st.ExplicitLAC)))
		dst = append(dst, st.ExplicitLAC...)
	}
	return dst, nil
}

// decodeLedgerState decodes a ledger state value. The returned slices are copies: v may be
// reused by the caller.
func decodeLedgerState(v []byte) (LedgerState, error) {
	var st LedgerState
	corrupt := func(what string) (LedgerState, error) {
		return LedgerState{}, fmt.Errorf("%w: ledger state %s (value %d bytes)", ErrCorrupt, what, len(v))
	}
	if len(v) < ledgerStateHeaderLen {
		return corrupt("too short")
	}
	if v[0] != ledgerStateV1 {
		return corrupt(fmt.Sprintf("has unknown version %d", v[0]))
	}
	flags := v[1]
	if flags&^flagsKnownV1 != 0 {
		return corrupt(fmt.Sprintf("has unknown flags %#x", flags))
	}
	st.Exists = flags&flagExists != 0
	st.Fenced = flags&flagFenced != 0
	st.Limbo = flags&flagLimbo != 0
	st.Deleted = flags&flagDeleted != 0
	rest := v[ledgerStateHeaderLen:]
	n := int(binary.BigEndian.Uint16(v[2:4]))
	if len(rest) < n {
		return corrupt("has a truncated master key")
	}
	st.MasterKey = append([]byte(nil), rest[:n]...)
	rest = rest[n:]
	if flags&flagHasLAC != 0 {
		if len(rest) < 4 {
			return corrupt("has a truncated explicit LAC length")
		}
		m := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if m > MaxExplicitLACLen || uint64(len(rest)) < uint64(m) {
			return corrupt("has a truncated explicit LAC")
		}
		st.ExplicitLAC = append(make([]byte, 0, m), rest[:m]...)
		rest = rest[m:]
	}
	if len(rest) != 0 {
		return corrupt(fmt.Sprintf("has %d trailing bytes", len(rest)))
	}
	return st, nil
}
