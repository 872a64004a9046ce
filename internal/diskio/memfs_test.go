package diskio

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// After a failed fdatasync Linux marks the pages that failed writeback clean: a later
// fdatasync succeeds without writing them, and a crash loses them. The Mem FS must not make
// them durable on the next successful sync.
func TestMemFailedSyncLosesItsData(t *testing.T) {
	m := NewMem(0)
	_ = m.MkdirAll("/d")
	f, _ := m.Create("/d/a", Options{})
	mustWrite(t, f, []byte("base"), 0)
	if err := f.SyncData(); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/d"); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, []byte("LOST"), 0)
	m.SetInjector(FailNth(OpSync, 1, unix.EIO))
	if err := f.SyncData(); !errors.Is(err, unix.EIO) {
		t.Fatalf("sync 1: got %v, want EIO", err)
	}
	if err := f.SyncData(); err != nil { // succeeds: nothing dirty is left
		t.Fatalf("sync 2: %v", err)
	}
	if got := readAll(t, m, "/d/a"); !bytes.Equal(got, []byte("LOST")) {
		t.Fatalf("before the crash the page cache holds %q, want %q", got, "LOST")
	}
	if got := readAll(t, m.Crash(CrashSyncedOnly, nil), "/d/a"); !bytes.Equal(got, []byte("base")) {
		t.Fatalf("after a crash: %q, want %q (the write whose sync failed became durable)", got, "base")
	}
}
