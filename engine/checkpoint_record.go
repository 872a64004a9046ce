package engine

import (
	"encoding/binary"
	"fmt"

	"github.com/ringkeeper/ringkeeper/journal"
)

// checkpointRecordV1 is the version byte of the index's checkpoint record (see doc.go).
const checkpointRecordV1 = 1

// encodeCheckpoint is the checkpoint record of marks: version, count, then each journal's
// mark (file id, offset), little-endian like the mark files.
func encodeCheckpoint(marks []journal.Mark) []byte {
	b := make([]byte, 0, 3+16*len(marks))
	b = append(b, checkpointRecordV1)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(marks)))
	for _, m := range marks {
		b = binary.LittleEndian.AppendUint64(b, m.FileID)
		b = binary.LittleEndian.AppendUint64(b, uint64(m.Offset))
	}
	return b
}

func decodeCheckpoint(b []byte) ([]journal.Mark, error) {
	if len(b) < 3 || b[0] != checkpointRecordV1 {
		return nil, fmt.Errorf("bad checkpoint record %x", b)
	}
	n := int(binary.LittleEndian.Uint16(b[1:]))
	if len(b) != 3+16*n {
		return nil, fmt.Errorf("checkpoint record of %d bytes for %d marks", len(b), n)
	}
	marks := make([]journal.Mark, n)
	for i := range marks {
		at := 3 + 16*i
		marks[i] = journal.Mark{FileID: binary.LittleEndian.Uint64(b[at:]), Offset: int64(binary.LittleEndian.Uint64(b[at+8:]))}
	}
	return marks, nil
}

// checkIndexCheckpoints holds each ledger dir's index to the marks the engine persisted. A
// checkpoint writes its marks into every index in the batch of its index updates, and persists
// them only after: an index whose record is older than a persisted mark lost writes that no
// journal holds any more (pebble drops damage at the end of its newest log or manifest as a
// torn write), so replay cannot bring them back and the engine refuses to open rather than
// answer "no such entry" for acknowledged entries. So does a new, empty index (one that lost
// everything looks new) once a checkpoint was persisted. An index from an older build, which
// kept no marks, gets the persisted ones as its baseline.
func (e *Engine) checkIndexCheckpoints() error {
	persisted := make([]journal.Mark, len(e.markStores))
	checkpointed := false
	for i, s := range e.markStores {
		m, err := s.Load()
		if err != nil {
			return err
		}
		persisted[i] = m
		checkpointed = checkpointed || m != journal.Mark{}
	}
	for _, d := range e.dirs {
		rec, err := d.idx.Checkpoint()
		if err != nil {
			return fmt.Errorf("%w: index %s: %w", ErrIO, d.indexPath, err)
		}
		if len(rec) == 0 {
			if checkpointed && !d.idx.Upgraded() {
				return fmt.Errorf("%w: the index %s holds no checkpoint, but journal marks %v were "+
					"persisted: the index lost writes that the journals no longer hold (damage in its "+
					"write-ahead log or manifest, or its files were removed)", ErrIO, d.indexPath, persisted)
			}
			d.batch.PutCheckpoint(encodeCheckpoint(persisted))
			if err := d.batch.Commit(true); err != nil {
				return fmt.Errorf("%w: index %s: %w", ErrIO, d.indexPath, err)
			}
			continue
		}
		marks, err := decodeCheckpoint(rec)
		if err != nil {
			return fmt.Errorf("%w: index %s: %w", ErrIO, d.indexPath, err)
		}
		for i := range min(len(marks), len(persisted)) {
			if persisted[i].Compare(marks[i]) > 0 {
				return fmt.Errorf("%w: the index %s holds the checkpoint of journal %d's mark %v, but "+
					"mark %v was persisted: the index lost writes that the journal no longer holds "+
					"(damage in its write-ahead log or manifest)", ErrIO, d.indexPath, i, marks[i], persisted[i])
			}
		}
	}
	return nil
}
