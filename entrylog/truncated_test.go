package entrylog

import (
	"errors"
	"strings"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// twoRunLog writes two flushed runs of entries to one log and returns them with the offset
// where the second run starts (the end of the first Flush). finalize closes the instance (the
// log gets its map and a header naming it); otherwise the FS is crashed after the second Flush,
// leaving the log unfinalized. It returns the FS to reopen.
func twoRunLog(t *testing.T, finalize bool) (fs *diskio.Mem, id uint64, first, second []added, cut int64) {
	t.Helper()
	fs = diskio.NewMem(4096)
	e := mustOpen(t, memConfig(fs))
	id = e.CurrentLogID()
	first = addRange(t, e, []int64{1, 2}, 0, 5)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	if first[len(first)-1].loc.LogID() != id {
		t.Fatal("rolled too early")
	}
	// The end of the first flush: the aligned offset after the last record and its padding.
	last := first[len(first)-1]
	cut = diskio.AlignUp(last.loc.Offset()+recordHeaderSize+int64(entrySize(last.ledger, last.entry))+recordHeaderSize, 4096)
	second = addRange(t, e, []int64{1, 2}, 5, 10)
	if second[len(second)-1].loc.LogID() != id {
		t.Fatal("rolled too early")
	}
	if second[0].loc.Offset() != cut {
		t.Fatalf("second run starts at %d, want %d", second[0].loc.Offset(), cut)
	}
	if finalize {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		return fs, id, first, second, cut
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	e.Close()
	return crashed, id, first, second, cut
}

// truncate cuts file path of fs at size, durably.
func truncate(t *testing.T, fs *diskio.Mem, path string, size int64) {
	t.Helper()
	f, err := fs.Open(path, diskio.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestFinalizedLogCutShortOfItsMapIsCorrupt: a finalized log's header names its map only once
// the data and the map are durable, so a file that ends before the map offset (here cut at a
// flush boundary, where the data before the cut is all valid) lost durable data: Scan and
// LedgersMap report ErrCorrupt naming the file, and Scan delivers nothing.
func TestFinalizedLogCutShortOfItsMapIsCorrupt(t *testing.T) {
	fs, id, _, _, cut := twoRunLog(t, true)
	truncate(t, fs, "/data/current/"+FileName(id), cut)

	e := mustOpen(t, memConfig(fs))
	defer e.Close()
	n := 0
	err := e.Scan(id, func(int64, int64, []byte, Location) error { n++; return nil })
	if !errors.Is(err, ErrCorrupt) || n != 0 {
		t.Errorf("Scan of a finalized log cut short of its map offset: err = %v after %d entries, want ErrCorrupt before any", err, n)
	}
	m, scannedTo, err := e.LedgersMapScanned(id)
	if !errors.Is(err, ErrCorrupt) || m != nil {
		t.Errorf("LedgersMap of a finalized log cut short of its map offset: map %v (scanned to %d), err = %v, want ErrCorrupt",
			m, scannedTo, err)
	}
	if err != nil && !strings.Contains(err.Error(), e.Path(id)) {
		t.Errorf("the error does not name the file: %v", err)
	}
}

// TestUnfinalizedLogCutAtAFlushEndsCleanly: a log a crash left unfinalized has no map offset to
// prove its durable end, so a file that ends at a flush boundary is a torn tail (doc.go): the
// scan ends there cleanly with the entries before it, and LedgersMapScanned says where.
func TestUnfinalizedLogCutAtAFlushEndsCleanly(t *testing.T) {
	fs, id, first, _, cut := twoRunLog(t, false)
	truncate(t, fs, "/data/current/"+FileName(id), cut)

	e := mustOpen(t, memConfig(fs))
	defer e.Close()
	n := 0
	if err := e.Scan(id, func(int64, int64, []byte, Location) error { n++; return nil }); err != nil || n != len(first) {
		t.Errorf("Scan of an unfinalized log cut at a flush: err = %v after %d entries, want %d and no error", err, n, len(first))
	}
	m, scannedTo, err := e.LedgersMapScanned(id)
	if err != nil || scannedTo != cut || !equalMaps(m, expectedMaps(first)[id]) {
		t.Errorf("LedgersMapScanned: %v, scanned to %d, %v; want the first run's map, scanned to %d", m, scannedTo, err, cut)
	}
}

// TestLogBeingWrittenCutShortOfItsFlushIsCorrupt: in a log this instance writes, everything
// before the end of the last completed Flush is durable: a file cut short of it (here at the
// end of the Flush before) lost durable data, and a scan reports ErrCorrupt.
func TestLogBeingWrittenCutShortOfItsFlushIsCorrupt(t *testing.T) {
	fs := diskio.NewMem(4096)
	e := mustOpen(t, memConfig(fs))
	defer e.Close()
	id := e.CurrentLogID()
	addRange(t, e, []int64{1}, 0, 5)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	cut := e.w.pos()
	addRange(t, e, []int64{1}, 5, 10)
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	if e.CurrentLogID() != id {
		t.Fatal("rolled too early")
	}
	truncate(t, fs, e.Path(id), cut)
	n := 0
	err := e.Scan(id, func(int64, int64, []byte, Location) error { n++; return nil })
	if !errors.Is(err, ErrCorrupt) || n != 0 {
		t.Errorf("Scan of a log being written, cut short of its last Flush: err = %v after %d entries, want ErrCorrupt before any", err, n)
	}
}
