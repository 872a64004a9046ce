package journal

import (
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// failNextFilePrep returns an injector that fails, with ENOSPC and once, the op-th operation
// of kind on the second file the journal creates: the file prepared ahead of the writer at
// Open, long before any record is written to it. fired is closed once it has failed one.
func failNextFilePrep(kind diskio.OpKind, op int) (inject diskio.Injector, fired <-chan struct{}) {
	failed := make(chan struct{})
	var mu sync.Mutex
	var creates, ops int
	var next string
	done := false
	return func(o diskio.Op) error {
		mu.Lock()
		defer mu.Unlock()
		if o.Kind == diskio.OpCreate {
			if creates++; creates == 2 {
				next = o.Name
			}
		}
		if done || o.Kind != kind || (next == "" && kind != diskio.OpCreate) {
			return nil
		}
		if kind == diskio.OpCreate && creates != 2 || kind != diskio.OpCreate && o.Name != next {
			return nil
		}
		if ops++; ops == op {
			done = true
			close(failed)
			return unix.ENOSPC
		}
		return nil
	}, failed
}

// TestTransientENOSPCPreparingTheNextFile: a disk briefly full while the next file was prepared
// ahead (its creation, fallocate, header or zero-fill failed) killed the journal at the next
// rollover, minutes later, with ENOSPC, although no acknowledged record was involved and the
// disk had room again: every later add failed until restart. The writer now prepares the file
// again when it needs it, under the same id (a leftover of the failed attempt is removed), so
// the records go on, and the journal replays: no stray file sits between a file and the file
// its file-end record names.
func TestTransientENOSPCPreparingTheNextFile(t *testing.T) {
	for _, c := range []struct {
		name string
		kind diskio.OpKind
		op   int
		// keepLeftover fails the first removal too: the failed attempt's file stays until the
		// retry.
		keepLeftover bool
	}{
		{"create", diskio.OpCreate, 1, false},
		{"fallocate", diskio.OpAllocate, 1, false},
		{"header", diskio.OpWrite, 1, false},
		{"zero-fill", diskio.OpWrite, 2, false},
		{"zero-fill, leftover kept", diskio.OpWrite, 2, true},
		{"sync", diskio.OpSync, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := diskio.NewMem(4096)
			inject, fired := failNextFilePrep(c.kind, c.op)
			if c.keepLeftover {
				failPrep, failRemove := inject, diskio.FailNth(diskio.OpRemove, 0, unix.EIO)
				inject = func(o diskio.Op) error {
					if err := failRemove(o); err != nil {
						return err
					}
					return failPrep(o)
				}
			}
			fs.SetInjector(inject)
			cfg := memConfig(fs)
			cfg.MaxFileSize = 1 << 20
			cfg.Prealloc = PreallocZero
			j, err := Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The preparation fails before the writer needs the file: otherwise, on a busy
			// machine, the writer could take the file first and the failure hit a record's write.
			<-fired
			var next int64
			if err := appendUntilRoll(t, j, 3, &next); err != nil {
				j.Close()
				t.Fatalf("records after a failed preparation of a future file: %v", err)
			}
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			var data int
			_, err = Replay(t0(), ReplayOptions{FS: fs, Dir: cfg.Dir}, func(r *Record) error {
				if r.Type == RecordData {
					data++
				}
				return nil
			})
			if err != nil {
				t.Fatalf("replay after the retried preparation: %v (files %v)", err, journalFiles(t, fs, cfg.Dir))
			}
			if data != int(next) {
				t.Fatalf("replayed %d of %d records", data, next)
			}
		})
	}
}

// TestLeftoverOfAFailedPreparationReplaysAfterACrash: a crash after the preparation of the next
// file failed, before any retry, leaves its file (here its removal failed too) after the
// session's last file; replay treats it as an empty file, and the next session goes on past it.
func TestLeftoverOfAFailedPreparationReplaysAfterACrash(t *testing.T) {
	fs := diskio.NewMem(4096)
	failPrep, _ := failNextFilePrep(diskio.OpWrite, 2)
	failRemove := diskio.FailNth(diskio.OpRemove, 0, unix.EIO)
	leftover := make(chan struct{})
	var once sync.Once
	fs.SetInjector(func(o diskio.Op) error {
		if err := failRemove(o); err != nil {
			once.Do(func() { close(leftover) })
			return err
		}
		return failPrep(o)
	})
	cfg := memConfig(fs)
	cfg.Prealloc = PreallocZero
	j, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	<-leftover
	for e := range int64(10) {
		if err := appendSync(t, j, RecordData, 1, e, testPayload(1, e, payloadSize(1, e))); err != nil {
			t.Fatal(err)
		}
	}
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	j.Close()
	if n := len(journalFiles(t, crashed, cfg.Dir)); n != 2 {
		t.Fatalf("%d files after the crash, want the written one and the leftover", n)
	}
	cfg.FS = crashed
	j, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for e := int64(10); e < 20; e++ {
		if err := appendSync(t, j, RecordData, 1, e, testPayload(1, e, payloadSize(1, e))); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	seen, _, err := replayAll(t, crashed, cfg.Dir, Mark{})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 20 {
		t.Fatalf("replayed %d of 20 acknowledged records", len(seen))
	}
}
