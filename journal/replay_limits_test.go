package journal

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// With journalSyncData off, any number of completed but unsynced groups lie after the last
// fdatasync, not just PipelineDepth of them. A power loss may keep a later page and lose an
// earlier one (CrashSubset). Nothing after the last sync was claimed durable, so replay takes the
// gap for a torn tail (the file header says the groups were unsynced); it used to call it
// corruption, past the depth × groupCapacity window, and the bookie could not restart.
func TestUnsyncedGroupsPowerLossReplaysAsATornTail(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	cfg.SyncData = false
	cfg.PageCacheFlushInterval = time.Hour
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 200 groups of one 4 KiB block each: ~800 KiB, far beyond 2 × groupCapacity (~264 KiB).
	for i := range int64(200) {
		if err := appendSync(t, j, RecordData, 1, i, testPayload(1, i, 100)); err != nil {
			t.Fatal(err)
		}
	}
	crashed := fs.Crash(diskio.CrashSubset, rand.New(rand.NewPCG(1, 2)))
	j.Close()
	_, err = Replay(t.Context(), ReplayOptions{FS: crashed, Dir: cfg.Dir, Truncate: true}, func(*Record) error { return nil })
	if errors.Is(err, ErrCorruption) {
		t.Fatalf("replay after a power loss with journalSyncData=false refuses to start: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// A group's padding record holds up to an alignment unit whatever MaxRecordSize is (the file
// header's maxPayload): replay must not hold it to that limit. With a MaxRecordSize below the
// alignment, every trailer failed the check and acknowledged records after the first group
// were dropped as a torn tail, and cut off the file.
func TestSmallMaxRecordSizeKeepsAckedRecords(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := memConfig(fs)
	cfg.MaxRecordSize = 1024
	cfg.BufferedWritesThreshold = 1024
	cfg.MaxFileSize = 1 << 20
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	for i := range int64(n) {
		if err := appendSync(t, j, RecordData, 1, i, testPayload(1, i, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	var got int
	_, err = Replay(t.Context(), ReplayOptions{FS: fs, Dir: cfg.Dir, Truncate: true}, func(r *Record) error {
		if r.Type == RecordData {
			got++
		}
		return nil
	})
	if err != nil || got != n {
		t.Fatalf("replayed %d of %d acknowledged records, err %v", got, n, err)
	}
}
