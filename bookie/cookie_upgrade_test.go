package bookie

import (
	"path/filepath"
	"testing"

	"github.com/ringkeeper/ringkeeper/engine"
)

// A bookie upgraded from a version that recorded its dirs in the cookies as configured
// ("/data/journal/", not clean) still finds them its own: Start now cleans the dirs (filepath.Abs),
// and the cookie check accepted another spelling only for a relative cookie dir, so the bookie
// refused to start with no configuration that could match.
func TestUpgradedCookieWithUncleanDirsStillMatches(t *testing.T) {
	base := t.TempDir()
	cfg := DefaultConfig()
	cfg.Engine.JournalDirs = []string{filepath.Join(base, "journal") + "/"}
	cfg.Engine.LedgerDirs = []string{filepath.Join(base, "ledgers") + "/"}
	cfg.Engine.WriteCacheMaxSize = 32 << 20
	cfg.Engine.ReadAheadCacheMaxSize = 8 << 20
	cfg.Engine.IndexBlockCacheSize = 8 << 20
	cfg.Engine.Journal.MaxFileSize = 64 << 20
	cfg.Engine.EntryLogSizeLimit = 64 << 20
	cfg.Engine.BookieID, cfg.Engine.InstanceID = "127.0.0.1:3181", "instance"

	// The previous version: the engine opened on the dirs as configured writes the cookies.
	old, err := engine.Open(cfg.Engine)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	// This version, same configuration: Start resolves it, then opens the engine.
	if err := cfg.resolve(); err != nil {
		t.Fatal(err)
	}
	e, err := engine.Open(cfg.Engine)
	if err != nil {
		t.Fatalf("the same bookie, same configuration, after the upgrade: %v", err)
	}
	e.Close()
}
