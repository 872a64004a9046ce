package entrylog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// scanWindow is the least a scan reads at a time.
const scanWindow = 1 << 20

// errNoMap says that a log has no usable ledgers map (not finalized).
var errNoMap = errors.New("entrylog: log has no ledgers map")

// Scan calls fn for every valid entry of log id, in file order, with its location, and stops at
// the first error fn returns (and returns it). entry aliases the scan buffer: it is valid only
// during the call.
//
// The scan ends cleanly at the end of the valid data: the ledgers map, padding up to the end of
// the file, zeros (preallocated space) or a torn tail left by a crash. A torn tail can only hold
// data written after the log's last completed Flush, so an invalid record is corruption (an
// error wrapping ErrCorrupt that names the file and offset) when the log proves that it was
// durable: it lies before the header's map offset (a finalized log), before the last Flush of
// a log this instance is writing, or before the durable offset that a later valid padding
// record claims (doc.go). A file that ends before the offset it proves durable (a finalized log
// cut short of its map offset) is corruption too, reported before fn is called, never a shorter
// clean scan. Only the flushed part of a log being written is scanned. Safe for concurrent use.
func (e *EntryLog) Scan(id uint64, fn func(ledgerID, entryID int64, entry []byte, loc Location) error) error {
	_, err := e.scan(id, func(rh *recordHeader, payload []byte, off int64) error {
		return fn(int64(rh.a), int64(rh.b), payload, NewLocation(id, off))
	})
	return err
}

// LedgersMap returns the ledgers of log id with the bytes of their records in it (header plus
// stored entry, BookKeeper's "size" for garbage collection). It reads the ledgers map when the
// log is finalized and the map is valid; otherwise (a crash before finalization, a damaged map
// or header, a log still being written) it rebuilds the map by scanning, with Scan's rules.
// Rebuilding reads the whole log: callers should keep the result. Safe for concurrent use.
func (e *EntryLog) LedgersMap(id uint64) (map[int64]uint64, error) {
	m, _, err := e.LedgersMapScanned(id)
	return m, err
}

// LedgersMapScanned is LedgersMap that also says where a rebuilding scan found the end of the
// valid data (scannedTo; -1 when the map was read). Records at or after it were not counted: a
// torn tail, or damage in the last run of an unfinalized log that nothing after it proves
// durable, which a caller holding other evidence (an index pointing there) must treat as
// corruption. For a finalized log whose map is damaged, scannedTo is its map offset: a scan
// that cannot reach it (damage before it, or a file that ends before it) fails with ErrCorrupt.
func (e *EntryLog) LedgersMapScanned(id uint64) (m map[int64]uint64, scannedTo int64, err error) {
	m, err = e.readLedgersMap(id)
	if err == nil {
		return m, -1, nil
	}
	if errors.Is(err, ErrNoSuchLog) || errors.Is(err, ErrClosed) || !errors.Is(err, ErrCorrupt) && !errors.Is(err, errNoMap) {
		return nil, 0, err
	}
	if errors.Is(err, ErrCorrupt) {
		e.log.Warn("entry log's ledgers map is unusable; rebuilding it by scanning", "err", err)
	}
	m = make(map[int64]uint64)
	scannedTo, err = e.scan(id, func(rh *recordHeader, _ []byte, _ int64) error {
		m[int64(rh.a)] += uint64(rh.size())
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return m, scannedTo, nil
}

// logReader reads one log for a scan or a map read.
type logReader struct {
	e        *EntryLog
	h        *readHandle
	limit    int64
	size     int64
	maxEntry int
	slab     *diskio.Slab
	c        cursor
	hdr      logHeader
	// hdrErr is why the header is not valid (nil when it is).
	hdrErr error
}

// openLogReader takes a handle on log id, reads its header and maps a buffer large enough for
// any of its records. The caller must call close.
func (e *EntryLog) openLogReader(id uint64) (*logReader, error) {
	h, limit, err := e.acquire(id)
	if err != nil {
		return nil, err
	}
	r := &logReader{e: e, h: h, limit: limit, maxEntry: e.cfg.MaxEntrySize}
	if r.size, err = h.f.Size(); err != nil {
		e.release(h)
		return nil, fmt.Errorf("entrylog: size of %s: %w", h.path, err)
	}
	i, buf := e.small.get()
	c := cursor{f: h.f, align: int64(e.align), limit: math.MaxInt64, buf: buf}
	b := c.at(0, logHeaderFields, minHeaderBlock)
	e.small.put(i)
	if c.err != nil {
		e.release(h)
		return nil, fmt.Errorf("entrylog: read header of %s: %w", h.path, c.err)
	}
	r.hdr, r.hdrErr = decodeLogHeader(b)
	if r.hdrErr == nil && r.hdr.logID != id {
		r.hdrErr = fmt.Errorf("%w: it names log %x", errBadHeader, r.hdr.logID)
	}
	if r.hdrErr == nil {
		r.maxEntry = max(r.maxEntry, int(min(r.hdr.maxEntrySize, 1<<30)))
	}
	size := max(scanWindow, largeBufferSize(max(r.maxEntry, mapChunkLedgers*mapPairSize), e.align))
	if r.slab, err = diskio.NewSlab(size, 1); err != nil {
		e.release(h)
		return nil, err
	}
	r.c = cursor{f: h.f, align: int64(e.align), limit: limit, buf: r.slab.Buffer(0)}
	return r, nil
}

func (r *logReader) close() {
	r.slab.Close()
	r.e.release(r.h)
}

// record decodes and verifies the record at pos, which must end by end.
func (r *logReader) record(pos, end int64) (recordHeader, []byte, error) {
	b := r.c.at(pos, recordHeaderSize, len(r.c.buf))
	rh, err := decodeRecordHeader(b, r.h.salt, r.maxEntry)
	if err != nil {
		return rh, nil, err
	}
	if pos+rh.size() > end {
		return rh, nil, errShortRecord
	}
	return decodeRecord(r.c.at(pos, int(rh.size()), len(r.c.buf)), r.h.salt, r.maxEntry)
}

// readLedgersMap reads the ledgers map that a finalized log's header points at.
func (e *EntryLog) readLedgersMap(id uint64) (map[int64]uint64, error) {
	r, err := e.openLogReader(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	path := r.h.path
	switch {
	case errors.Is(r.hdrErr, errNoHeader):
		return nil, errNoMap
	case r.hdrErr != nil:
		return nil, corruptf(path, 0, r.hdrErr)
	case r.hdr.mapOffset == 0:
		return nil, errNoMap
	}
	count := int(r.hdr.mapCount)
	pos := int64(r.hdr.mapOffset)
	if int64(count)*mapPairSize > r.size-pos {
		return nil, corruptf(path, 0, fmt.Errorf("%w: a map of %d ledgers at offset %d does not fit a file of %d bytes",
			errBadHeader, count, pos, r.size))
	}
	m := make(map[int64]uint64, count)
	for chunk := uint64(0); ; chunk++ {
		rh, payload, err := r.record(pos, r.size)
		if r.c.err != nil {
			return nil, fmt.Errorf("entrylog: read %s at %d: %w", path, pos, r.c.err)
		}
		if err == nil && (rh.typ != recordLedgersMap || rh.a != uint64(count) || rh.b != chunk) {
			err = fmt.Errorf("%w: a %v record (count %d, chunk %d) where chunk %d of a map of %d ledgers belongs",
				errBadMapRecord, rh.typ, rh.a, rh.b, chunk, count)
		}
		if err != nil {
			return nil, corruptf(path, pos, err)
		}
		for p := payload; len(p) > 0; p = p[mapPairSize:] {
			ledger := int64(binary.LittleEndian.Uint64(p))
			if _, dup := m[ledger]; dup {
				return nil, corruptf(path, pos, fmt.Errorf("%w: ledger %d appears twice", errBadMapRecord, ledger))
			}
			m[ledger] = binary.LittleEndian.Uint64(p[8:])
		}
		pos += rh.size()
		if len(m) >= count {
			break
		}
	}
	if len(m) != count {
		return nil, corruptf(path, int64(r.hdr.mapOffset), fmt.Errorf("%w: %d ledgers, the header says %d", errBadMapRecord, len(m), count))
	}
	return m, nil
}

// scan calls fn for each valid data record of log id (see Scan) and returns the offset where
// the valid data ended.
func (e *EntryLog) scan(id uint64, fn func(rh *recordHeader, payload []byte, off int64) error) (end int64, err error) {
	r, err := e.openLogReader(id)
	if err != nil {
		return 0, err
	}
	defer r.close()
	path := r.h.path
	dataStart, end := int64(e.align), r.size
	// Every record below durable must be valid, and the file must reach it.
	durable, what := int64(0), ""
	switch {
	case r.hdrErr == nil:
		dataStart = int64(r.hdr.headerSize)
		if r.hdr.mapOffset != 0 {
			end = min(end, int64(r.hdr.mapOffset))
			durable, what = int64(r.hdr.mapOffset), "the ledgers map offset its header names"
		}
	case !errors.Is(r.hdrErr, errNoHeader):
		e.log.Warn("entry log header is damaged; scanning without it", "file", path, "err", r.hdrErr)
	}
	if r.limit != math.MaxInt64 {
		end = min(end, r.limit)
		durable, what = r.limit, "the end of its last completed flush"
	}
	if end < durable {
		// The data and the map are durable before the header names the map, and a flush's
		// data before the flush returns: nothing legitimate leaves the file short of either.
		return 0, corruptf(path, end, fmt.Errorf("%w: the file ends at %d, before %s (%d): durable data is lost",
			errShortFile, r.size, what, durable))
	}
	for pos := dataStart; pos < end; {
		rh, payload, err := r.record(pos, end)
		if r.c.err != nil {
			return 0, fmt.Errorf("entrylog: read %s at %d: %w", path, pos, r.c.err)
		}
		if err != nil {
			if pos < durable {
				return 0, corruptf(path, pos, err)
			}
			at, claim, ok := r.findClaim(pos)
			if r.c.err != nil {
				return 0, fmt.Errorf("entrylog: read %s: %w", path, r.c.err)
			}
			if ok {
				return 0, corruptf(path, pos, fmt.Errorf("%w; the padding record at offset %d says the log was durable up to offset %d",
					err, at, claim))
			}
			return pos, nil // the end of the valid data: never written, or a torn tail
		}
		switch rh.typ {
		case recordData:
			if err := fn(&rh, payload, pos); err != nil {
				return 0, err
			}
		case recordLedgersMap:
			if pos < durable {
				return 0, corruptf(path, pos, fmt.Errorf("%w: inside the durable data, which ends at %d", errBadMapRecord, durable))
			}
			return pos, nil // an unfinalized log's map ends its data
		}
		pos += rh.size()
	}
	return end, nil
}

// findClaim looks after pos for a valid padding record whose durable claim is beyond pos: proof
// that the record at pos was durable. Runs of records start at aligned offsets (the log's start
// and after each padding), so it tries each aligned offset and follows the records from there.
func (r *logReader) findClaim(pos int64) (at, claim int64, ok bool) {
	align := int64(r.e.align)
	for b := diskio.AlignUp(pos+1, r.e.align); b < r.size; b += align {
		hb := r.c.at(b, recordHeaderSize, len(r.c.buf))
		if len(hb) < recordHeaderSize {
			return 0, 0, false
		}
		if t := recordType(hb[8]); t == recordInvalid || t >= recordTypeLimit {
			continue // cheap: preallocated space is zeros
		}
		p := b
		for p < r.size {
			rh, _, err := r.record(p, r.size)
			if err != nil {
				break
			}
			if rh.typ == recordPadding && int64(rh.a) > pos {
				return p, int64(rh.a), true
			}
			p += rh.size()
			if rh.typ == recordPadding {
				break
			}
		}
		if p > b {
			b = diskio.AlignUp(p, r.e.align) - align
		}
	}
	return 0, 0, false
}
