package engine

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// downgradeIndex makes the index in dir a format-2 store, as a build before the checkpoint
// record left it: format record version 2, no checkpoint record.
func downgradeIndex(t *testing.T, dir string) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("\x00format"), []byte("RKIX\x00\x00\x00\x02"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete([]byte("\x00checkpoint"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestUpgradeFromFormat2SurvivesAFailedOpen: an Open that upgrades a format-2 index and then
// fails (here: another ledger dir's index cannot be opened; a crash at the same point is
// alike) must leave the bookie able to open once the cause is gone. The upgrade writes
// format 3 and an empty checkpoint record at once, and only the engine's later baseline
// commit gives it marks; if that commit never happens, the next Open must still know the
// store was upgraded, or it takes the empty record for a lost index and refuses forever.
func TestUpgradeFromFormat2SurvivesAFailedOpen(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 2)
	e := openTest(t, cfg)
	for en := int64(0); en < 20; en++ {
		if err := addSync(e, testKey, storedEntry(5, en), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	ix0, ix1 := filepath.Join(cfg.IndexDir, "index0"), filepath.Join(cfg.IndexDir, "index1")
	downgradeIndex(t, ix0)
	downgradeIndex(t, ix1)

	// The second index is unreachable for one Open (a file where its dir belongs).
	if err := os.Rename(ix1, ix1+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ix1, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := Open(cfg); err == nil {
		e.Close()
		t.Fatal("Open succeeded without the second index")
	}
	if err := os.Remove(ix1); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(ix1+".away", ix1); err != nil {
		t.Fatal(err)
	}

	e, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open after the cause was removed: %v (ErrIO: %v)", err, errors.Is(err, ErrIO))
	}
	defer e.Close()
	for en := int64(0); en < 20; en++ {
		mustRead(t, e, 5, en)
	}
}
