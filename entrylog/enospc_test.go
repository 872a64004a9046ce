package entrylog

import (
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// failSecondLogPrep returns an injector that fails, with ENOSPC and once, the first operation
// of kind on the second log the entry log creates (prepared in the background while the first
// one fills), or, with kind OpRename, the persisting of its id in lastId.
func failSecondLogPrep(kind diskio.OpKind) diskio.Injector {
	var mu sync.Mutex
	var logs, lastIDs int
	var second string
	done := false
	return func(o diskio.Op) error {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return nil
		}
		switch {
		case o.Kind == diskio.OpRename && strings.Contains(o.Name, lastIDName):
			if lastIDs++; kind == diskio.OpRename && lastIDs == 2 {
				done = true
				return unix.ENOSPC
			}
			return nil
		case o.Kind == diskio.OpCreate && strings.HasSuffix(o.Name, ".log"):
			if logs++; logs == 2 {
				second = o.Name
			}
		}
		if o.Kind == kind && o.Name == second && second != "" {
			done = true
			return unix.ENOSPC
		}
		return nil
	}
}

// TestTransientENOSPCPreparingTheNextLog: a disk briefly full while the next log was prepared
// in the background (from half way through the current one) failed the writer, for good, at
// the roll that took the log, however much later that came and whatever space there was by
// then: the engine failed and the bookie stayed read-only until restart, for a log that held
// nothing yet. The roll now prepares the log again once before it gives up.
func TestTransientENOSPCPreparingTheNextLog(t *testing.T) {
	for _, c := range []struct {
		name string
		kind diskio.OpKind
	}{
		{"lastId", diskio.OpRename},
		{"create", diskio.OpCreate},
		{"fallocate", diskio.OpAllocate},
		{"header", diskio.OpWrite},
		{"sync", diskio.OpSync},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := diskio.NewMem(4096)
			fs.SetInjector(failSecondLogPrep(c.kind))
			cfg := memConfig(fs)
			e := mustOpen(t, cfg)
			var all []added
			for round := range 8 {
				for entry := int64(round * 100); entry < int64(round*100+100); entry++ {
					loc, err := e.Add(1, entry, testEntry(1, entry))
					if err != nil {
						e.Close()
						t.Fatalf("add %d after a failed preparation of a future log: %v", entry, err)
					}
					all = append(all, added{key{1, entry}, loc})
				}
				if err := e.Flush(); err != nil {
					e.Close()
					t.Fatalf("flush after a failed preparation of a future log: %v", err)
				}
			}
			if n := len(e.Logs()); n < 3 {
				t.Fatalf("only %d logs: the test should roll several times", n)
			}
			checkRead(t, e, all)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = mustOpen(t, cfg)
			defer e.Close()
			checkRead(t, e, all)
		})
	}
}
