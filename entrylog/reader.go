package entrylog

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// errWrongEntry says that a location holds another entry than the one asked for.
var errWrongEntry = errors.New("entrylog: record holds another entry")

// errNotEntry says that a location holds a record that is not an entry.
var errNotEntry = errors.New("entrylog: record is not an entry")

// Read reads the stored entry of (ledgerID, entryID) at loc and appends it to dst. It reads the
// aligned sectors that hold the record with O_DIRECT, verifies both checksums and that the record
// is that entry. Damage of any kind (a checksum mismatch, another entry, no record at loc) is an
// error wrapping ErrCorrupt that names the file and offset: never "not found". A location in a
// log that does not exist gives ErrNoSuchLog; one outside the log's readable data (inside the
// header block, whose size is the alignment the log was created with, past the end of the file,
// past the last Flush of the log being written) gives ErrBadLocation. Safe for concurrent use.
func (e *EntryLog) Read(loc Location, ledgerID, entryID int64, dst []byte) ([]byte, error) {
	h, limit, err := e.acquire(loc.LogID())
	if err != nil {
		return dst, err
	}
	defer e.release(h)
	small, buf := e.small.get()
	large := -1
	defer e.putBuffers(small, &large)
	c := cursor{f: h.f, align: int64(h.align), limit: limit, buf: buf}
	off := loc.Offset()
	rh, payload, err := e.readRecord(&c, h, off, recordHeaderSize+e.cfg.ReadHint, &large)
	if err != nil {
		return dst, err
	}
	if rh.typ != recordData {
		return dst, corruptf(h.path, off, fmt.Errorf("%w: a %v record", errNotEntry, rh.typ))
	}
	if int64(rh.a) != ledgerID || int64(rh.b) != entryID {
		return dst, corruptf(h.path, off, fmt.Errorf("%w: ledger %d entry %d, want ledger %d entry %d",
			errWrongEntry, int64(rh.a), int64(rh.b), ledgerID, entryID))
	}
	return append(dst, payload...), nil
}

// ReadAhead reads an aligned range of about maxBytes from loc and calls fn for the entry at loc
// and then for the consecutive valid entries after it (padding is skipped), until fn returns
// false, the next record would end beyond loc+maxBytes, or the valid data ends (the end of the
// file or of the flushed data, a ledgers map, anything invalid). The entry at loc is always
// delivered (whatever maxBytes says) and must be valid: damage there is an ErrCorrupt error as
// for Read. Damage after it only ends the read-ahead; a later Read of that location reports it.
// entry aliases a read buffer: it is valid only during the call to fn. Safe for concurrent use.
func (e *EntryLog) ReadAhead(loc Location, maxBytes int, fn func(ledgerID, entryID int64, entry []byte, loc Location) bool) error {
	h, limit, err := e.acquire(loc.LogID())
	if err != nil {
		return err
	}
	defer e.release(h)
	small, buf := e.small.get()
	large := -1
	defer e.putBuffers(small, &large)
	c := cursor{f: h.f, align: int64(h.align), limit: limit, buf: buf}
	off := loc.Offset()
	end := off + int64(max(maxBytes, 0))
	rh, payload, err := e.readRecord(&c, h, off, max(recordHeaderSize+e.cfg.ReadHint, maxBytes), &large)
	if err != nil {
		return err
	}
	if rh.typ != recordData {
		return corruptf(h.path, off, fmt.Errorf("%w: a %v record", errNotEntry, rh.typ))
	}
	if !fn(int64(rh.a), int64(rh.b), payload, loc) {
		return nil
	}
	for pos := off + rh.size(); pos < end; {
		b := c.at(pos, recordHeaderSize, int(end-pos))
		rh, err := decodeRecordHeader(b, h.salt, e.cfg.MaxEntrySize)
		if err != nil || pos+rh.size() > end || pos+rh.size() > limit || rh.typ == recordLedgersMap {
			break
		}
		if large < 0 && diskio.AlignUp(pos+rh.size(), h.align)-diskio.AlignDown(pos, h.align) > int64(len(c.buf)) {
			i, buf := e.large.get()
			large = i
			c.buf, c.n = buf, 0
		}
		full := c.at(pos, int(rh.size()), int(end-pos))
		_, payload, err := decodeRecord(full, h.salt, e.cfg.MaxEntrySize)
		if err != nil {
			break
		}
		if rh.typ == recordData && !fn(int64(rh.a), int64(rh.b), payload, NewLocation(h.id, pos)) {
			return nil
		}
		pos += rh.size()
	}
	if c.err != nil {
		return fmt.Errorf("entrylog: read %s: %w", h.path, c.err)
	}
	return nil
}

func (e *EntryLog) putBuffers(small int, large *int) {
	e.small.put(small)
	if *large >= 0 {
		e.large.put(*large)
	}
}

// readRecord reads and verifies the record at off through c, switching c to a large buffer
// (its index stored in *large) if the record does not fit the small one. minRead is how much
// the first read covers.
func (e *EntryLog) readRecord(c *cursor, h *readHandle, off int64, minRead int, large *int) (recordHeader, []byte, error) {
	if off < minHeaderBlock || off >= c.limit {
		return recordHeader{}, nil, fmt.Errorf("%w: %s offset %d (readable below %d)", ErrBadLocation, h.path, off, c.limit)
	}
	b := c.at(off, recordHeaderSize, minRead)
	if c.err != nil {
		return recordHeader{}, nil, fmt.Errorf("entrylog: read %s at %d: %w", h.path, off, c.err)
	}
	if len(b) == 0 {
		return recordHeader{}, nil, fmt.Errorf("%w: %s offset %d is past the end of the file", ErrBadLocation, h.path, off)
	}
	rh, err := decodeRecordHeader(b, h.salt, e.cfg.MaxEntrySize)
	if err != nil {
		return rh, nil, e.corruptOrHeader(c, h, off, err)
	}
	size := rh.size()
	if off+size > c.limit {
		return rh, nil, e.corruptOrHeader(c, h, off, fmt.Errorf("%w: the record ends at %d, past the flushed data at %d",
			errShortRecord, off+size, c.limit))
	}
	if need := diskio.AlignUp(off+size, h.align) - diskio.AlignDown(off, h.align); need > int64(len(c.buf)) {
		i, buf := e.large.get()
		*large = i
		c.buf, c.n = buf, 0
	}
	full := c.at(off, int(size), int(size))
	if c.err != nil {
		return rh, nil, fmt.Errorf("entrylog: read %s at %d: %w", h.path, off, c.err)
	}
	rh, payload, err := decodeRecord(full, h.salt, e.cfg.MaxEntrySize)
	if err != nil {
		return rh, nil, e.corruptOrHeader(c, h, off, err)
	}
	return rh, payload, nil
}

// corruptOrHeader returns the error for an invalid record at off: ErrBadLocation when off lies
// inside the log's header block (larger than minHeaderBlock where the log was created with a
// larger alignment), an ErrCorrupt error with cause otherwise. It is called only when a read
// fails, so that reads of valid records never read the header.
func (e *EntryLog) corruptOrHeader(c *cursor, h *readHandle, off int64, cause error) error {
	if start := e.headerBlock(c, h); off < start {
		return fmt.Errorf("%w: %s offset %d is inside the log's %d-byte header block", ErrBadLocation, h.path, off, start)
	}
	return corruptf(h.path, off, cause)
}

// headerBlock returns the size of log h's header block (where its records start), reading the
// header through c the first time. It returns minHeaderBlock, without remembering it, when the
// header cannot be read or is not valid: then every offset from there on may hold a record.
func (e *EntryLog) headerBlock(c *cursor, h *readHandle) int64 {
	if start := h.dataStart.Load(); start != 0 {
		return start
	}
	b := c.at(0, logHeaderFields, logHeaderFields)
	if c.err != nil {
		c.err = nil // the record's damage is the error to report
		return minHeaderBlock
	}
	hdr, err := decodeLogHeader(b)
	if err != nil || hdr.logID != h.id {
		return minHeaderBlock
	}
	h.dataStart.Store(int64(hdr.headerSize))
	return int64(hdr.headerSize)
}

// cursor reads a file through one aligned buffer with aligned O_DIRECT reads, keeping a window
// [bufOff, bufOff+n) of it. It never reads past limit (rounded up to the alignment).
type cursor struct {
	f      diskio.File
	align  int64
	limit  int64
	buf    []byte
	bufOff int64
	n      int
	// err is the first read error.
	err error
}

// at returns the bytes [off, off+need) of the file, or fewer if the file (below the limit) ends
// first or the range does not fit the buffer. When it has to read, it reads at least minRead
// bytes from off (as the buffer allows), extending the window in place when off is in it.
func (c *cursor) at(off int64, need, minRead int) []byte {
	if c.err != nil {
		return nil
	}
	readEnd := int64(math.MaxInt64)
	if c.limit != math.MaxInt64 {
		readEnd = diskio.AlignUp(c.limit, int(c.align))
	}
	rel := off - c.bufOff
	if c.n > 0 && rel >= 0 && rel+int64(need) <= int64(c.n) {
		return c.clip(off, need)
	}
	want := off + int64(max(need, minRead))
	// Extend the window in place when off is inside it and the needed bytes fit.
	if c.n > 0 && rel >= 0 && rel <= int64(c.n) && int64(c.n)%c.align == 0 &&
		diskio.AlignUp(off+int64(need), int(c.align))-c.bufOff <= int64(len(c.buf)) {
		to := min(diskio.AlignUp(want, int(c.align))-c.bufOff, int64(len(c.buf)), readEnd-c.bufOff)
		if to > int64(c.n) {
			c.n += c.read(c.buf[c.n:to], c.bufOff+int64(c.n))
		}
		return c.clip(off, need)
	}
	start := diskio.AlignDown(off, int(c.align))
	to := min(diskio.AlignUp(want, int(c.align))-start, int64(len(c.buf)), readEnd-start)
	c.bufOff, c.n = start, 0
	if to > 0 {
		c.n = c.read(c.buf[:to], start)
	}
	return c.clip(off, need)
}

// clip returns what the window holds of [off, off+need), below the limit.
func (c *cursor) clip(off int64, need int) []byte {
	end := min(off+int64(need), c.bufOff+int64(c.n), c.limit)
	if c.err != nil || end <= off {
		return nil
	}
	return c.buf[off-c.bufOff : end-c.bufOff]
}

// read reads p at off; a short read at the end of the file is not an error.
func (c *cursor) read(p []byte, off int64) int {
	n, err := c.f.ReadAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		c.err = err
		return 0
	}
	return n
}
