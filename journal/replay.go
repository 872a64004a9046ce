package journal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// Record is a replayed record. Payload aliases replay's buffer: it is valid only during the
// callback.
type Record struct {
	Type     RecordType
	LedgerID int64
	EntryID  int64
	Payload  []byte
	// FileID and Offset locate the record.
	FileID uint64
	Offset int64
}

// ReplayOptions configures Replay.
type ReplayOptions struct {
	FS  diskio.FS
	Dir string
	// From is the persisted LastLogMark: replay starts there. Its file must exist unless From is
	// the zero Mark (replay everything).
	From Mark
	// SkipInvalidRecords skips corruption in the middle of a file instead of failing
	// (skipReplayJournalInvalidRecord). Acknowledged records in the damaged region are lost.
	SkipInvalidRecords bool
	// Truncate cuts a torn tail off its file, so that later replays see a clean end.
	Truncate bool
	Logger   *slog.Logger
}

// ReplayResult describes a replay.
type ReplayResult struct {
	// Records is the number of records passed to the callback.
	Records int
	// Files is the number of files scanned.
	Files int
	// TornFile and TornOffset locate a torn tail that was dropped (TornFile is 0 if none).
	TornFile   uint64
	TornOffset int64
	// Skipped counts corrupt regions skipped because of SkipInvalidRecords.
	Skipped int
}

// replayReadChunk is how much replay reads at a time.
const replayReadChunk = 1 << 20

// Replay calls fn for every record from opts.From on, in journal order, and stops at the first
// error fn returns. A torn tail (a short or invalid record with no acknowledged record after
// it) ends the replay and is dropped. An invalid record followed by records that must have
// been durable is corruption: Replay fails with an error wrapping ErrCorruption that names the
// file and offset, unless SkipInvalidRecords is set.
func Replay(ctx context.Context, opts ReplayOptions, fn func(*Record) error) (ReplayResult, error) {
	var res ReplayResult
	if opts.FS == nil {
		opts.FS = diskio.NewOS()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	names, err := opts.FS.List(opts.Dir)
	if err != nil {
		if errors.Is(err, diskio.ErrNotExist) && opts.From == (Mark{}) {
			return res, nil
		}
		return res, err
	}
	ids := listFileIDs(names)
	if opts.From.FileID != 0 && !slices.Contains(ids, opts.From.FileID) {
		return res, fmt.Errorf("%w: %s in %s (the persisted mark points into it)",
			ErrMissingFile, FileName(opts.From.FileID), opts.Dir)
	}
	var torn *fileScan
	var tornFiles []*fileScan
	// named is the file that the last file's file-end record names (0: none). The writer
	// prepares that file, header and directory entry synced, before it writes the record, and
	// GC never removes a file at or after the mark: if it is gone, so are the records it held.
	var named, namer uint64
	for _, id := range ids {
		if id < opts.From.FileID {
			continue
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if named != 0 && id != named {
			return res, missingNamed(opts.Dir, namer, named)
		}
		named = 0
		start := int64(-1)
		if id == opts.From.FileID {
			start = opts.From.Offset
		}
		fs := &fileScan{opts: &opts, id: id, path: filepath.Join(opts.Dir, FileName(id))}
		if torn != nil && fs.startsSession() {
			// A new writer session began after the torn file: the tear was that session's
			// crash, and this file continues the journal.
			torn = nil
		}
		if torn != nil {
			// After a torn tail nothing may be valid: the writer never writes a new file before
			// the previous one has ended with a synced file-end record.
			n, err := fs.run(ctx, start, nil)
			if err != nil {
				return res, err
			}
			if n > 0 {
				return res, fmt.Errorf("%w: %s ends without a file-end record at offset %d, but the later file %s holds records",
					ErrCorruption, torn.path, torn.end, fs.path)
			}
			continue
		}
		n, err := fs.run(ctx, start, fn)
		res.Records += n
		res.Files++
		res.Skipped += fs.skipped
		if err != nil {
			return res, err
		}
		if !fs.clean {
			torn = fs
			tornFiles = append(tornFiles, fs)
			res.TornFile, res.TornOffset = id, fs.end
		} else if fs.next > id {
			named, namer = fs.next, id
		}
	}
	if named != 0 {
		return res, missingNamed(opts.Dir, namer, named)
	}
	if opts.Truncate {
		for _, t := range tornFiles {
			if t.end <= t.dataStart {
				continue // no records (or no valid header): nothing to cut
			}
			if err := t.truncate(); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// missingNamed is the error for file named, which the file-end record of file namer names,
// missing from dir.
func missingNamed(dir string, namer, named uint64) error {
	return fmt.Errorf("%w: %s in %s (%s ends with a file-end record that names it as the next file)",
		ErrMissingFile, FileName(named), dir, FileName(namer))
}

// fileScan replays one file.
type fileScan struct {
	opts      *ReplayOptions
	id        uint64
	path      string
	hdr       fileHeader
	dataStart int64
	// results
	clean   bool   // ended with a file-end record
	next    uint64 // the next file's id, which the file-end record names
	end     int64  // offset where valid records end (the torn position)
	skipped int
}

// startsSession reports whether the file's header says a writer session began with it.
func (s *fileScan) startsSession() bool {
	f, err := s.opts.FS.Open(s.path, diskio.Options{ReadOnly: true})
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, fileHeaderFields)
	if _, err := f.ReadAt(b, 0); err != nil {
		return false
	}
	h, err := decodeFileHeader(b)
	return err == nil && h.fileID == s.id && h.flags&fileFlagSessionStart != 0
}

// run scans the file from start (-1: from the first record) and calls fn (if not nil) for each
// record. It returns the number of valid records.
func (s *fileScan) run(ctx context.Context, start int64, fn func(*Record) error) (int, error) {
	f, err := s.opts.FS.Open(s.path, diskio.Options{ReadOnly: true})
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return 0, err
	}
	sc := &scanner{f: f, size: size, salt: fileSalt(s.id)}
	hb := sc.bytesAt(0, fileHeaderFields)
	if sc.err != nil {
		return 0, sc.err
	}
	hdr, herr := decodeFileHeader(hb)
	if herr == nil && hdr.fileID != s.id {
		herr = fmt.Errorf("%w: header names file id %x", errBadFileHeader, hdr.fileID)
	}
	if herr != nil {
		// A file whose preparation was cut short by a crash (or a reused file renamed before
		// its header was rewritten) holds no record of its own id. Anything else is damage.
		sc.maxPayload = 1 << 30
		for _, a := range []int64{512, 1024, 2048, 4096, 8192, 16384, 65536} {
			if _, _, err := sc.recordAt(a); err == nil {
				return 0, fmt.Errorf("%w: %s: bad header (%v) but valid records at offset %d", ErrCorruption, s.path, herr, a)
			}
		}
		s.opts.Logger.Warn("journal file has no valid header and no records; treating it as empty", "file", s.path, "reason", herr)
		return 0, nil
	}
	s.hdr = hdr
	s.dataStart = int64(hdr.alignment)
	// A group's padding record holds up to an alignment unit, whatever the largest payload the
	// writer took: with a limit below that, every trailer would fail the check.
	sc.maxPayload = max(int(hdr.maxPayload), int(hdr.alignment))
	if start < 0 {
		start = s.dataStart
	}
	if start < s.dataStart || start > size {
		return 0, fmt.Errorf("%w: %s: replay start %d outside the file's records [%d, %d]", ErrCorruption, s.path, start, s.dataStart, size)
	}
	rec := Record{FileID: s.id}
	count := 0
	// Groups of a file carry consecutive sequence numbers in their trailers. Every record of
	// a misdirected block is valid, so only its group's number out of turn gives it away.
	var lastSeq uint64
	haveSeq := false
	groupStart := start
	for pos := start; ; {
		h, payload, err := sc.recordAt(pos)
		if err != nil {
			corrupt := s.classify(sc, pos, err)
			if sc.err != nil {
				return count, sc.err
			}
			if corrupt != nil {
				if !s.opts.SkipInvalidRecords || fn == nil {
					return count, corrupt
				}
				next, ok := s.nextValid(sc, pos)
				s.opts.Logger.Error("skipping corrupt journal region (skipReplayJournalInvalidRecord)", "err", corrupt, "resume", next)
				s.skipped++
				if ok {
					pos, groupStart, haveSeq = next, next, false
					continue
				}
			}
			s.end = pos
			return count, nil
		}
		size := int64(recordHeaderSize) + int64(h.length)
		switch h.typ {
		case recordPadding:
			if haveSeq && h.entryID != lastSeq+1 {
				corrupt := fmt.Errorf("%w: %s offset %d: group number %d follows group %d (a misdirected or lost write)",
					ErrCorruption, s.path, groupStart, h.entryID, lastSeq)
				if !s.opts.SkipInvalidRecords || fn == nil {
					return count, corrupt
				}
				s.opts.Logger.Error("skipping corrupt journal region (skipReplayJournalInvalidRecord)", "err", corrupt)
				s.skipped++
			}
			lastSeq, haveSeq, groupStart = h.entryID, true, pos+size
		case recordFileEnd:
			s.clean, s.end, s.next = true, pos+size, h.ledgerID
			return count, nil
		default:
			count++
			if fn != nil {
				rec.Type, rec.LedgerID, rec.EntryID, rec.Payload, rec.Offset = h.typ, int64(h.ledgerID), int64(h.entryID), payload, pos
				if err := fn(&rec); err != nil {
					return count, err
				}
				if count%4096 == 0 {
					if err := ctx.Err(); err != nil {
						return count, err
					}
				}
			}
		}
		pos += size
	}
}

// classify decides whether the invalid record at pos is a torn tail (nil) or corruption.
//
// At a crash up to PipelineDepth groups may be in flight, each at most groupCapacity long, and
// any of them may be partly written; so valid groups may follow a torn one, but only within
// depth × groupCapacity, and each of them claims (in its trailer) a durable end no later than
// the torn group's start. A valid group further away, or one claiming that bytes at or after
// pos were durable, proves that pos was once written and synced: corruption. In a file written
// with journalSyncData off (fileFlagUnsynced) any number of groups may be unsynced, so only
// the claims count.
func (s *fileScan) classify(sc *scanner, pos int64, cause error) error {
	align := int64(s.hdr.alignment)
	window := int64(s.hdr.pipelineDepth) * int64(s.hdr.groupCapacity)
	unsynced := s.hdr.flags&fileFlagUnsynced != 0
	limit := min(sc.size, pos+2*window+align)
	for b := diskio.AlignUp(pos+1, int(align)); b < limit; b += align {
		h, _, err := sc.recordAt(b)
		if err != nil {
			continue
		}
		if b >= pos+window && !unsynced {
			return fmt.Errorf("%w: %s offset %d: %v, but a valid %s record follows at offset %d, beyond what a crash can leave unsynced",
				ErrCorruption, s.path, pos, cause, h.typ, b)
		}
		claim, end, ok := s.groupClaim(sc, b)
		if ok && claim > pos {
			return fmt.Errorf("%w: %s offset %d: %v, but the group at offset %d records that the journal was durable up to offset %d",
				ErrCorruption, s.path, pos, cause, b, claim)
		}
		if ok {
			b = diskio.AlignUp(end, int(align)) - align
		}
	}
	return nil
}

// groupClaim walks valid records from b to the group's trailer and returns its durable claim
// and the group's end.
func (s *fileScan) groupClaim(sc *scanner, b int64) (claim, end int64, ok bool) {
	for pos := b; pos < b+int64(s.hdr.groupCapacity); {
		h, _, err := sc.recordAt(pos)
		if err != nil {
			return 0, 0, false
		}
		pos += int64(recordHeaderSize) + int64(h.length)
		if h.typ == recordPadding {
			return int64(h.ledgerID), pos, true
		}
	}
	return 0, 0, false
}

// nextValid finds the next aligned offset after pos that starts a valid record.
func (s *fileScan) nextValid(sc *scanner, pos int64) (int64, bool) {
	align := int64(s.hdr.alignment)
	for b := diskio.AlignUp(pos+1, int(align)); b < sc.size; b += align {
		if _, _, err := sc.recordAt(b); err == nil {
			return b, true
		}
	}
	return 0, false
}

// truncate cuts the file at the torn position.
func (s *fileScan) truncate() error {
	f, err := s.opts.FS.Open(s.path, diskio.Options{})
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(s.end); err != nil {
		return err
	}
	s.opts.Logger.Info("truncated torn journal tail", "file", s.path, "offset", s.end)
	return f.Sync()
}

// scanner reads records of one file through a buffer.
type scanner struct {
	f          diskio.File
	size       int64
	salt       uint32
	maxPayload int
	buf        []byte
	bufOff     int64
	// err is the first read error: an unreadable region is an error, never a torn tail.
	err error
}

// bytesAt returns up to n bytes of the file at off (fewer at the end of the file).
func (sc *scanner) bytesAt(off int64, n int) []byte {
	if off >= sc.size {
		return nil
	}
	n = int(min(int64(n), sc.size-off))
	if off >= sc.bufOff && off+int64(n) <= sc.bufOff+int64(len(sc.buf)) {
		return sc.buf[off-sc.bufOff : off-sc.bufOff+int64(n)]
	}
	want := int(min(int64(max(n, replayReadChunk)), sc.size-off))
	if cap(sc.buf) < want {
		sc.buf = make([]byte, want)
	}
	sc.buf = sc.buf[:want]
	m, err := sc.f.ReadAt(sc.buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		if sc.err == nil {
			sc.err = fmt.Errorf("journal: read %s at %d: %w", sc.f.Name(), off, err)
		}
		m = 0
	}
	sc.buf, sc.bufOff = sc.buf[:m], off
	return sc.buf[:min(n, m)]
}

// recordAt decodes and verifies the record at off.
func (sc *scanner) recordAt(off int64) (recordHeader, []byte, error) {
	h, err := decodeRecordHeader(sc.bytesAt(off, recordHeaderSize), sc.salt, sc.maxPayload)
	if err != nil {
		return h, nil, err
	}
	h, payload, _, err := decodeRecord(sc.bytesAt(off, recordHeaderSize+int(h.length)), sc.salt, sc.maxPayload)
	return h, payload, err
}
