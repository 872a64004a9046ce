package index

import (
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestFullDiskUnderTheWALFailsCommitsNotTheProcess: pebble treats a failed WAL write as fatal
// (Logger.Fatalf), which panicked in the committing goroutine (the engine's checkpoint): a
// full index disk killed the whole bookie, which should go read-only and keep serving reads.
// The commit now fails with ErrFailed (wrapping the cause), as does every later one, and what
// was committed before stays readable.
func TestFullDiskUnderTheWALFailsCommitsNotTheProcess(t *testing.T) {
	var full atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && (op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt) && strings.HasSuffix(op.Path, ".log") {
			return syscall.ENOSPC
		}
		return nil
	}))
	cfg := DefaultConfig("/ix")
	cfg.FS = fs
	cfg.BlockCacheSize = 8 << 20
	cfg.MemTableSize = 8 << 20
	ix, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	b := ix.NewBatch()
	b.PutLocation(1, 0, loc(1, 0))
	commit(t, b, true)

	full.Store(true)
	b.PutLocation(1, 1, loc(1, 1))
	err = b.Commit(true)
	if !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("commit onto a full disk: %v, want ErrFailed wrapping ENOSPC", err)
	}
	full.Store(false)
	b.PutLocation(1, 2, loc(1, 2))
	if err := b.Commit(true); !errors.Is(err, ErrFailed) {
		t.Fatalf("the next commit, space back: %v, want ErrFailed (pebble cannot go on after a failed WAL write)", err)
	}
	if got, err := ix.Location(1, 0); err != nil || got != loc(1, 0) {
		t.Fatalf("entry committed before: location %d, err %v; want %d", got, err, loc(1, 0))
	}
}
