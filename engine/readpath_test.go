package engine

import (
	"bytes"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// TestReadCacheServesAnOverwrittenEntry: a read that read ahead cached entries of a ledger; a
// recovery add then wrote one of them again with other bytes. Reads returned the new bytes from
// the write cache, but once a checkpoint flushed them (and recycled the half) the read cache
// still held the old copy, which it served before the index: stale bytes after a newer add.
func TestReadCacheServesAnOverwrittenEntry(t *testing.T) {
	fs := diskio.NewMem(4096)
	cfg := testConfig(t, fs, 1)
	cfg.ReadAheadBatchSize = 100
	e := openTest(t, cfg)
	defer e.Close()
	const l = int64(4)
	for en := range int64(10) {
		if err := addSync(e, testKey, storedEntry(l, en), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	for en := range int64(2) { // a sequential read reads 2..9 ahead into the read cache
		mustRead(t, e, l, en)
	}
	if _, ok := e.dir(l).reads.get(l, 5, nil); !ok {
		t.Fatal("entry 5 was not read ahead")
	}
	newer := versionedEntry(l, 5, 1)
	if err := addSync(e, testKey, newer, true); err != nil { // a recovery add rewrites entry 5
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		got, err := e.Read(l, 5, nil)
		if err != nil {
			t.Fatalf("%s: read %d/5: %v", when, l, err)
		}
		if !bytes.Equal(got, newer) {
			t.Fatalf("%s: read %d/5 returned the bytes of the older copy (%v)", when, l, bytes.Equal(got, storedEntry(l, 5)))
		}
	}
	check("in the write cache")
	if err := e.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	check("after the checkpoint")
}
