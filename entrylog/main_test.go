package entrylog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

// testEntry is the deterministic stored entry of (ledger, entry): read bytes can be checked
// without remembering them.
func testEntry(ledger, entry int64) []byte {
	b := make([]byte, entrySize(ledger, entry))
	var seed [16]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(ledger))
	binary.LittleEndian.PutUint64(seed[8:], uint64(entry))
	for i := range b {
		b[i] = seed[i%16] ^ byte(i*31+7)
	}
	return b
}

// entrySize spreads sizes over [0, 9000): most fit a small read buffer, some straddle blocks.
func entrySize(ledger, entry int64) int {
	x := uint64(ledger)*0x9e3779b97f4a7c15 + uint64(entry)*0xbf58476d1ce4e5b9
	x ^= x >> 29
	switch x % 16 {
	case 0:
		return 0
	case 1:
		return int(6000 + x%3000)
	default:
		return int(x % 1600)
	}
}

// memConfig is a small configuration for the in-memory FS: logs roll after a few hundred
// entries, buffers fill after a handful.
func memConfig(fs diskio.FS) Config {
	cfg := DefaultConfig("/data/current")
	cfg.FS = fs
	cfg.LogSizeLimit = 192 << 10
	cfg.MaxEntrySize = 16 << 10
	cfg.WriteBufferSize = 16 << 10
	cfg.WriteBuffers = 3
	cfg.ReadBufferSize = 16 << 10
	cfg.ReadBuffers = 8
	cfg.LargeReadBuffers = 2
	cfg.ReadHint = 512
	cfg.MaxOpenReadFiles = 4
	return cfg
}

// engines are the I/O engines to test on the real file system.
func engines(t testing.TB) []diskio.Engine {
	es := []diskio.Engine{diskio.EnginePsync}
	if err := diskio.IOUringAvailable(); err == nil {
		es = append(es, diskio.EngineIOUring)
	} else {
		t.Logf("io_uring unavailable, testing psync only: %v", err)
	}
	return es
}

func mustOpen(t testing.TB, cfg Config) *EntryLog {
	t.Helper()
	e, err := Open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return e
}

type key struct{ ledger, entry int64 }

// added is an entry that Add returned a location for.
type added struct {
	key
	loc Location
}

// addRange adds entries [from, to) of each ledger, interleaved, and returns them.
func addRange(t testing.TB, e *EntryLog, ledgers []int64, from, to int64) []added {
	t.Helper()
	var out []added
	for entry := from; entry < to; entry++ {
		for _, ledger := range ledgers {
			loc, err := e.Add(ledger, entry, testEntry(ledger, entry))
			if err != nil {
				t.Fatalf("add %d/%d: %v", ledger, entry, err)
			}
			out = append(out, added{key{ledger, entry}, loc})
		}
	}
	return out
}

// checkRead reads every entry back and compares it byte for byte.
func checkRead(t testing.TB, e *EntryLog, entries []added) {
	t.Helper()
	var buf []byte
	for _, a := range entries {
		var err error
		buf, err = e.Read(a.loc, a.ledger, a.entry, buf[:0])
		if err != nil {
			t.Fatalf("read %v at %v: %v", a.key, a.loc, err)
		}
		if !bytes.Equal(buf, testEntry(a.ledger, a.entry)) {
			t.Fatalf("read %v at %v: wrong bytes (%d, want %d)", a.key, a.loc, len(buf), entrySize(a.ledger, a.entry))
		}
	}
}

// expectedMaps computes each log's ledgers map from what was added.
func expectedMaps(entries []added) map[uint64]map[int64]uint64 {
	maps := make(map[uint64]map[int64]uint64)
	for _, a := range entries {
		m := maps[a.loc.LogID()]
		if m == nil {
			m = make(map[int64]uint64)
			maps[a.loc.LogID()] = m
		}
		m[a.ledger] += uint64(recordHeaderSize + entrySize(a.ledger, a.entry))
	}
	return maps
}

func equalMaps(a, b map[int64]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// flipByte flips the bits of the byte at off of file path (opened without O_DIRECT).
func flipByte(t testing.TB, fs diskio.FS, path string, off int64, mask byte) {
	t.Helper()
	f, err := fs.Open(path, diskio.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// readFileBytes reads a whole file.
func readFileBytes(t testing.TB, fs diskio.FS, path string) []byte {
	t.Helper()
	b, err := diskio.ReadFile(fs, path, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
