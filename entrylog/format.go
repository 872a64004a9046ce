package entrylog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Sizes and constants of the on-disk format (doc.go draws it). Wire format: do not change;
// versions only move forward.
const (
	// recordHeaderSize is the size of a record header.
	recordHeaderSize = 32
	// logHeaderFields is the size of the log header's fields; the header block is padded with
	// zeros to headerSize.
	logHeaderFields = 48
	// minHeaderBlock is the smallest header block: no record starts below it.
	minHeaderBlock = 4096
	// formatVersion is the newest log format.
	formatVersion = 1
	// mapChunkLedgers is the most (ledgerId, bytes) pairs in one ledgers-map record.
	mapChunkLedgers = 4096
	// mapPairSize is the size of one (ledgerId, bytes) pair.
	mapPairSize = 16
	// maxPaddingLen bounds a padding record's length (a padding fills less than one alignment
	// unit; the bound only rejects garbage before its CRC is trusted).
	maxPaddingLen = 1 << 20
	// lastIDName is the file that holds the highest log id ever allocated in a directory.
	lastIDName = "lastId"
	// lastIDSize is the size of the lastId file.
	lastIDSize = 20
	// logSuffix is the entry log file name suffix, as in BookKeeper.
	logSuffix = ".log"
)

// headerMagic starts every entry log. Wire format: do not change.
var headerMagic = [8]byte{'R', 'K', 'E', 'N', 'T', 'L', 'O', 'G'}

// lastIDMagic starts the lastId file. Wire format: do not change.
var lastIDMagic = [8]byte{'R', 'K', 'L', 'A', 'S', 'T', 'I', 'D'}

// recordType is the kind of a record. Wire format: do not renumber.
type recordType uint8

const (
	recordInvalid recordType = 0
	// recordData holds a stored entry.
	recordData recordType = 1
	// recordPadding fills the space up to the next aligned offset at a Flush and at a seal;
	// its ledgerId field carries the durable claim (doc.go).
	recordPadding recordType = 2
	// recordLedgersMap holds a chunk of the ledgers map.
	recordLedgersMap recordType = 3
	recordTypeLimit  recordType = 4
)

func (t recordType) String() string {
	switch t {
	case recordData:
		return "data"
	case recordPadding:
		return "padding"
	case recordLedgersMap:
		return "ledgers-map"
	}
	return fmt.Sprintf("recordType(%d)", uint8(t))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Reasons why bytes are not a valid record or header. They are wrapped in ErrCorrupt errors
// that name the file and offset.
var (
	errShortRecord   = errors.New("entrylog: record extends past the end of the data")
	errShortFile     = errors.New("entrylog: file ends inside its durable data")
	errBadRecordType = errors.New("entrylog: bad record type")
	errBadReserved   = errors.New("entrylog: reserved record bytes are not zero")
	errRecordCRC     = errors.New("entrylog: record header checksum mismatch")
	errPayloadCRC    = errors.New("entrylog: record payload checksum mismatch")
	errRecordTooBig  = errors.New("entrylog: record length exceeds the maximum entry size")
	errBadPadding    = errors.New("entrylog: malformed padding record")
	errBadMapRecord  = errors.New("entrylog: malformed ledgers-map record")

	errNoHeader      = errors.New("entrylog: log header block is empty")
	errBadMagic      = errors.New("entrylog: bad log header magic")
	errHeaderCRC     = errors.New("entrylog: log header checksum mismatch")
	errBadVersion    = errors.New("entrylog: unsupported log format version")
	errBadHeader     = errors.New("entrylog: inconsistent log header")
	errBadLastIDFile = errors.New("entrylog: damaged lastId file")
)

// recordHeader is a decoded record header. The meaning of a and b depends on the type:
//
//	data:        a = ledgerId, b = entryId
//	padding:     a = durable claim (offset), b = 0
//	ledgers map: a = number of ledgers in the whole map, b = chunk index
type recordHeader struct {
	crc        uint32
	length     uint32
	typ        recordType
	a, b       uint64
	payloadCRC uint32
}

// size is the record's total size on disk.
func (h *recordHeader) size() int64 { return recordHeaderSize + int64(h.length) }

// logSalt is the CRC32C of the log id: every record CRC of a log starts from it, so bytes
// written for another log never verify in this one.
func logSalt(logID uint64) uint32 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], logID)
	return crc32.Update(0, castagnoli, b[:])
}

// payloadChecksum is the CRC32C of a record payload.
func payloadChecksum(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// putRecordHeader encodes and seals a record header at dst[:recordHeaderSize].
func putRecordHeader(dst []byte, salt uint32, typ recordType, a, b uint64, length int, payloadCRC uint32) {
	_ = dst[recordHeaderSize-1]
	binary.LittleEndian.PutUint32(dst[4:], uint32(length))
	dst[8], dst[9], dst[10], dst[11] = byte(typ), 0, 0, 0
	binary.LittleEndian.PutUint64(dst[12:], a)
	binary.LittleEndian.PutUint64(dst[20:], b)
	binary.LittleEndian.PutUint32(dst[28:], payloadCRC)
	binary.LittleEndian.PutUint32(dst[0:], crc32.Update(salt, castagnoli, dst[4:recordHeaderSize]))
}

// decodeRecordHeader parses and verifies the record header at the start of b (not the
// payload). maxEntry bounds a data record's length.
func decodeRecordHeader(b []byte, salt uint32, maxEntry int) (recordHeader, error) {
	if len(b) < recordHeaderSize {
		return recordHeader{}, errShortRecord
	}
	h := recordHeader{
		crc:        binary.LittleEndian.Uint32(b[0:]),
		length:     binary.LittleEndian.Uint32(b[4:]),
		typ:        recordType(b[8]),
		a:          binary.LittleEndian.Uint64(b[12:]),
		b:          binary.LittleEndian.Uint64(b[20:]),
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
	switch h.typ {
	case recordData:
		if uint64(h.length) > uint64(maxEntry) {
			return h, errRecordTooBig
		}
	case recordPadding:
		if h.length > maxPaddingLen || h.b != 0 || h.payloadCRC != 0 {
			return h, errBadPadding
		}
	case recordLedgersMap:
		if h.length%mapPairSize != 0 || h.length > mapChunkLedgers*mapPairSize || h.b > h.a/mapChunkLedgers {
			return h, errBadMapRecord
		}
	}
	return h, nil
}

// decodeRecord parses and verifies the record at the start of b. It returns the header and the
// payload (aliasing b; nil for padding, whose bytes carry nothing and are not checked).
func decodeRecord(b []byte, salt uint32, maxEntry int) (recordHeader, []byte, error) {
	h, err := decodeRecordHeader(b, salt, maxEntry)
	if err != nil {
		return h, nil, err
	}
	if h.typ == recordPadding {
		return h, nil, nil
	}
	size := h.size()
	if int64(len(b)) < size {
		return h, nil, errShortRecord
	}
	payload := b[recordHeaderSize:size]
	if payloadChecksum(payload) != h.payloadCRC {
		return h, nil, errPayloadCRC
	}
	return h, payload, nil
}

// logHeader is the first block of an entry log.
type logHeader struct {
	version uint32
	// headerSize is the header block's size: the log's alignment; records start here.
	headerSize uint32
	logID      uint64
	// mapOffset is where the ledgers map starts; 0 until the log is finalized.
	mapOffset uint64
	// mapCount is the number of ledgers in the map.
	mapCount uint32
	// maxEntrySize is the writer's MaxEntrySize, so that a scan can bound record lengths.
	maxEntrySize uint32
	flags        uint32
}

func (h logHeader) encode(dst []byte) {
	clear(dst)
	copy(dst[0:8], headerMagic[:])
	binary.LittleEndian.PutUint32(dst[8:], h.version)
	binary.LittleEndian.PutUint32(dst[12:], h.headerSize)
	binary.LittleEndian.PutUint64(dst[16:], h.logID)
	binary.LittleEndian.PutUint64(dst[24:], h.mapOffset)
	binary.LittleEndian.PutUint32(dst[32:], h.mapCount)
	binary.LittleEndian.PutUint32(dst[36:], h.maxEntrySize)
	binary.LittleEndian.PutUint32(dst[40:], h.flags)
	binary.LittleEndian.PutUint32(dst[44:], crc32.Checksum(dst[:44], castagnoli))
}

// decodeLogHeader parses and verifies a log header. An all-zero (or missing) block gives
// errNoHeader: a log whose creation a crash cut short.
func decodeLogHeader(b []byte) (logHeader, error) {
	if len(b) < logHeaderFields || isZero(b[:logHeaderFields]) {
		return logHeader{}, errNoHeader
	}
	if [8]byte(b[0:8]) != headerMagic {
		return logHeader{}, errBadMagic
	}
	if crc32.Checksum(b[:44], castagnoli) != binary.LittleEndian.Uint32(b[44:]) {
		return logHeader{}, errHeaderCRC
	}
	h := logHeader{
		version:      binary.LittleEndian.Uint32(b[8:]),
		headerSize:   binary.LittleEndian.Uint32(b[12:]),
		logID:        binary.LittleEndian.Uint64(b[16:]),
		mapOffset:    binary.LittleEndian.Uint64(b[24:]),
		mapCount:     binary.LittleEndian.Uint32(b[32:]),
		maxEntrySize: binary.LittleEndian.Uint32(b[36:]),
		flags:        binary.LittleEndian.Uint32(b[40:]),
	}
	if h.version == 0 || h.version > formatVersion {
		return h, fmt.Errorf("%w: %d", errBadVersion, h.version)
	}
	hs := h.headerSize
	if hs < minHeaderBlock || hs&(hs-1) != 0 || (h.mapOffset != 0 && h.mapOffset < uint64(hs)) ||
		(h.mapOffset == 0 && h.mapCount != 0) || h.flags != 0 {
		return h, errBadHeader
	}
	return h, nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// encodeLastID returns the content of the lastId file.
func encodeLastID(id uint64) []byte {
	b := make([]byte, lastIDSize)
	copy(b, lastIDMagic[:])
	binary.LittleEndian.PutUint64(b[8:], id)
	binary.LittleEndian.PutUint32(b[16:], crc32.Checksum(b[:16], castagnoli))
	return b
}

func decodeLastID(b []byte) (uint64, error) {
	if len(b) != lastIDSize || [8]byte(b[0:8]) != lastIDMagic ||
		crc32.Checksum(b[:16], castagnoli) != binary.LittleEndian.Uint32(b[16:]) {
		return 0, errBadLastIDFile
	}
	return binary.LittleEndian.Uint64(b[8:]), nil
}

// putMapPairs encodes (ledgerId, bytes) pairs.
func putMapPairs(dst []byte, pairs []ledgerBytes) []byte {
	for _, p := range pairs {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(p.ledgerID))
		dst = binary.LittleEndian.AppendUint64(dst, p.bytes)
	}
	return dst
}

// ledgerBytes is one entry of a ledgers map.
type ledgerBytes struct {
	ledgerID int64
	bytes    uint64
}

// FileName returns the name of entry log id: lower-case hex without padding, then ".log".
func FileName(id uint64) string { return strconv.FormatUint(id, 16) + logSuffix }

// ParseFileName returns the id of an entry log file name, or false if name is not one.
func ParseFileName(name string) (uint64, bool) {
	base := filepath.Base(name)
	hex, ok := strings.CutSuffix(base, logSuffix)
	if !ok || hex == "" || len(hex) > 16 {
		return 0, false
	}
	id, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || FileName(id) != base {
		return 0, false
	}
	return id, true
}

// listLogIDs returns the ids of the entry logs among names, ascending.
func listLogIDs(names []string) []uint64 {
	var ids []uint64
	for _, n := range names {
		if id, ok := ParseFileName(n); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
