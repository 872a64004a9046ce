package journal

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

// fileHeaderMagic starts every journal file. Wire format: do not change.
var fileHeaderMagic = [8]byte{'R', 'K', 'J', 'O', 'U', 'R', 'N', 'L'}

// fileFormatVersion is the newest journal file format; versions only move forward.
const fileFormatVersion = 1

// fileHeaderFields is the size of the header's fields; the header block is padded to the
// file's alignment with zeros.
const fileHeaderFields = 52

var (
	errBadFileMagic   = errors.New("journal: bad file magic")
	errBadFileVersion = errors.New("journal: unsupported file format version")
	errBadFileCRC     = errors.New("journal: file header checksum mismatch")
	errBadFileHeader  = errors.New("journal: inconsistent file header")
)

// fileHeader is the first block of a journal file.
type fileHeader struct {
	version   uint32
	alignment uint32 // size of the header block; records start here
	fileID    uint64
	createdNs int64
	// The writer's limits, so that replay can bound how far an unacknowledged group may lie
	// past a torn one (see doc.go).
	pipelineDepth uint32
	groupCapacity uint32
	maxPayload    uint32
	flags         uint32
}

// File header flags.
const (
	// fileFlagSessionStart marks the first file a writer wrote after it was opened: the file
	// before it may legitimately end in a torn tail (the previous writer crashed).
	fileFlagSessionStart = 1 << 0
	// fileFlagUnsynced marks a file written with journalSyncData off: groups complete without a
	// sync, so any number of them (not only PipelineDepth) may be unsynced at a power loss, and
	// only the groups' durable claims tell a torn tail from corruption.
	fileFlagUnsynced = 1 << 1
)

func (h fileHeader) encode(dst []byte) {
	clear(dst)
	copy(dst[0:8], fileHeaderMagic[:])
	binary.LittleEndian.PutUint32(dst[8:], h.version)
	binary.LittleEndian.PutUint32(dst[12:], h.alignment)
	binary.LittleEndian.PutUint64(dst[16:], h.fileID)
	binary.LittleEndian.PutUint64(dst[24:], uint64(h.createdNs))
	binary.LittleEndian.PutUint32(dst[32:], h.pipelineDepth)
	binary.LittleEndian.PutUint32(dst[36:], h.groupCapacity)
	binary.LittleEndian.PutUint32(dst[40:], h.maxPayload)
	binary.LittleEndian.PutUint32(dst[44:], h.flags)
	binary.LittleEndian.PutUint32(dst[48:], crc32.Checksum(dst[:48], castagnoli))
}

func decodeFileHeader(b []byte) (fileHeader, error) {
	if len(b) < fileHeaderFields {
		return fileHeader{}, errShortRecord
	}
	if [8]byte(b[0:8]) != fileHeaderMagic {
		return fileHeader{}, errBadFileMagic
	}
	if crc32.Checksum(b[:48], castagnoli) != binary.LittleEndian.Uint32(b[48:]) {
		return fileHeader{}, errBadFileCRC
	}
	h := fileHeader{
		version:       binary.LittleEndian.Uint32(b[8:]),
		alignment:     binary.LittleEndian.Uint32(b[12:]),
		fileID:        binary.LittleEndian.Uint64(b[16:]),
		createdNs:     int64(binary.LittleEndian.Uint64(b[24:])),
		pipelineDepth: binary.LittleEndian.Uint32(b[32:]),
		groupCapacity: binary.LittleEndian.Uint32(b[36:]),
		maxPayload:    binary.LittleEndian.Uint32(b[40:]),
		flags:         binary.LittleEndian.Uint32(b[44:]),
	}
	if h.version == 0 || h.version > fileFormatVersion {
		return h, fmt.Errorf("%w: %d", errBadFileVersion, h.version)
	}
	a := h.alignment
	if a < 512 || a&(a-1) != 0 || h.pipelineDepth == 0 || h.groupCapacity == 0 || h.groupCapacity%a != 0 {
		return h, errBadFileHeader
	}
	return h, nil
}

// fileSuffix is the journal file name suffix, as in BookKeeper.
const fileSuffix = ".txn"

// FileName returns the name of journal file id: lower-case hex without padding, then ".txn".
func FileName(id uint64) string { return strconv.FormatUint(id, 16) + fileSuffix }

// ParseFileName returns the id of a journal file name, or false if name is not one.
func ParseFileName(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(filepath.Base(name), fileSuffix)
	if !ok || hex == "" || len(hex) > 16 || strings.ToLower(hex) != hex {
		return 0, false
	}
	id, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || FileName(id) != filepath.Base(name) {
		return 0, false
	}
	return id, true
}

// listFileIDs returns the ids of the journal files in dir, ascending.
func listFileIDs(names []string) []uint64 {
	var ids []uint64
	for _, n := range names {
		if id, ok := ParseFileName(n); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids) // names sort as strings, ids numerically
	return ids
}
