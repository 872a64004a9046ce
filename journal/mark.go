package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"sync"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// Mark is a position in a journal: everything before Offset in file FileID, and every earlier
// file, is covered. The zero Mark is before everything.
type Mark struct {
	FileID uint64
	Offset int64
}

// Compare returns -1, 0 or +1 as m is before, equal to or after o.
func (m Mark) Compare(o Mark) int {
	switch {
	case m.FileID < o.FileID:
		return -1
	case m.FileID > o.FileID:
		return 1
	case m.Offset < o.Offset:
		return -1
	case m.Offset > o.Offset:
		return 1
	}
	return 0
}

func (m Mark) String() string { return fmt.Sprintf("%s@%d", FileName(m.FileID), m.Offset) }

// markMagic starts a persisted mark file. Wire format: do not change.
var markMagic = [8]byte{'R', 'K', 'L', 'O', 'G', 'M', 'R', 'K'}

const (
	markFormatVersion = 1
	markFileSize      = 36
)

var (
	// ErrBadMark is returned for a mark file that is not valid.
	ErrBadMark = errors.New("journal: bad mark file")
)

func encodeMark(m Mark) []byte {
	b := make([]byte, markFileSize)
	copy(b[0:8], markMagic[:])
	binary.LittleEndian.PutUint32(b[8:], markFormatVersion)
	binary.LittleEndian.PutUint64(b[16:], m.FileID)
	binary.LittleEndian.PutUint64(b[24:], uint64(m.Offset))
	binary.LittleEndian.PutUint32(b[32:], crc32.Checksum(b[:32], castagnoli))
	return b
}

func decodeMark(b []byte) (Mark, error) {
	if len(b) != markFileSize || [8]byte(b[0:8]) != markMagic {
		return Mark{}, fmt.Errorf("%w: wrong size or magic", ErrBadMark)
	}
	if crc32.Checksum(b[:32], castagnoli) != binary.LittleEndian.Uint32(b[32:]) {
		return Mark{}, fmt.Errorf("%w: checksum mismatch", ErrBadMark)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != markFormatVersion {
		return Mark{}, fmt.Errorf("%w: unsupported version %d", ErrBadMark, v)
	}
	m := Mark{FileID: binary.LittleEndian.Uint64(b[16:]), Offset: int64(binary.LittleEndian.Uint64(b[24:]))}
	if m.Offset < 0 {
		return Mark{}, fmt.Errorf("%w: negative offset", ErrBadMark)
	}
	return m, nil
}

// MarkFileName is the name of journal index's mark file in a ledger dir: "lastMark" with one
// journal, "lastMark.<index>" with several, as in BookKeeper.
func MarkFileName(index, journals int) string {
	if journals <= 1 {
		return "lastMark"
	}
	return fmt.Sprintf("lastMark.%d", index)
}

// MarkStore persists one journal's LastLogMark in several directories. The persisted mark never
// moves backwards. Safe for concurrent use.
type MarkStore struct {
	fs   diskio.FS
	dirs []string
	name string

	// mu serialises persists and guards persisted.
	mu        sync.Mutex
	persisted Mark
}

// NewMarkStore returns a store for the mark file name in each of dirs.
func NewMarkStore(fs diskio.FS, dirs []string, name string) *MarkStore {
	return &MarkStore{fs: fs, dirs: dirs, name: name}
}

// Load reads the mark from every dir and returns the highest. A missing file counts as the zero
// Mark. A corrupt file is an error: silently ignoring it could resurrect an older mark.
func (s *MarkStore) Load() (Mark, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best Mark
	for _, dir := range s.dirs {
		m, err := readMarkFile(s.fs, filepath.Join(dir, s.name))
		if errors.Is(err, diskio.ErrNotExist) {
			continue
		}
		if err != nil {
			return Mark{}, err
		}
		if m.Compare(best) > 0 {
			best = m
		}
	}
	if best.Compare(s.persisted) > 0 {
		s.persisted = best
	}
	return best, nil
}

func readMarkFile(fs diskio.FS, path string) (Mark, error) {
	b, err := diskio.ReadFile(fs, path, markFileSize)
	if err != nil {
		return Mark{}, err
	}
	m, err := decodeMark(b)
	if err != nil {
		return Mark{}, fmt.Errorf("journal: mark %s: %w", path, err)
	}
	return m, nil
}

// Persisted returns the highest mark persisted or loaded so far.
func (s *MarkStore) Persisted() Mark {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.persisted
}

// Persist writes m to every dir (temp file, fsync, rename, fsync dir) unless it is not after the
// mark already persisted, in which case it does nothing and returns the persisted one. It returns
// the mark that is now persisted.
func (s *MarkStore) Persist(m Mark) (Mark, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.Compare(s.persisted) <= 0 {
		return s.persisted, nil
	}
	data := encodeMark(m)
	for _, dir := range s.dirs {
		if err := diskio.WriteFileAtomic(s.fs, filepath.Join(dir, s.name), data); err != nil {
			return s.persisted, err
		}
	}
	s.persisted = m
	return m, nil
}
