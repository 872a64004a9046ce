package entrylog

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// BenchmarkAdd measures Add of 1 KiB stored entries on the real file system in a temp dir,
// with a Flush every 16 MiB (a checkpoint) and old logs removed as it goes. Run with -benchmem:
// steady state must not allocate.
func BenchmarkAdd(b *testing.B) {
	for _, engine := range []diskio.Engine{diskio.EngineAuto, diskio.EnginePsync} {
		b.Run(engine.String(), func(b *testing.B) {
			cfg := DefaultConfig(b.TempDir())
			cfg.Engine = engine
			cfg.LogSizeLimit = 64 << 20
			e, err := Open(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			entry := make([]byte, 1024)
			const ledgers = 64
			flushEvery := (16 << 20) / (len(entry) + recordHeaderSize)
			b.SetBytes(int64(len(entry)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := e.Add(int64(i%ledgers), int64(i/ledgers), entry); err != nil {
					b.Fatal(err)
				}
				if i%flushEvery == flushEvery-1 {
					if err := e.Flush(); err != nil {
						b.Fatal(err)
					}
					if logs := e.Logs(); len(logs) > 3 {
						e.Remove(logs[0])
					}
				}
			}
			if err := e.Flush(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// discardFS is the in-memory FS with the writes of log files discarded: BenchmarkAddCPU
// measures the add path without a device.
type discardFS struct{ *diskio.Mem }

type discardFile struct{ diskio.File }

func (f discardFile) WriteAt(p []byte, off int64) (int, error) {
	if off == 0 {
		return f.File.WriteAt(p, off) // the header
	}
	return len(p), nil
}

func (fs discardFS) Create(name string, opts diskio.Options) (diskio.File, error) {
	f, err := fs.Mem.Create(name, opts)
	if err != nil || filepath.Ext(name) != ".log" {
		return f, err
	}
	return discardFile{f}, nil
}

// BenchmarkAddCPU is BenchmarkAdd without a device: what Add itself costs (checksum, copy,
// ledgers map, buffer hand-off).
func BenchmarkAddCPU(b *testing.B) {
	cfg := DefaultConfig("/bench")
	cfg.FS = discardFS{diskio.NewMem(4096)}
	cfg.LogSizeLimit = 64 << 20
	e, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	entry := make([]byte, 1024)
	const ledgers = 64
	b.SetBytes(int64(len(entry)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := e.Add(int64(i%ledgers), int64(i/ledgers), entry); err != nil {
			b.Fatal(err)
		}
		if i%16384 == 16383 {
			if err := e.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkRead measures random O_DIRECT reads of 1 KiB entries from flushed logs, from
// several goroutines.
func BenchmarkRead(b *testing.B) {
	cfg := DefaultConfig(b.TempDir())
	cfg.LogSizeLimit = 64 << 20
	e, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	entry := make([]byte, 1024)
	const n = 100000
	locs := make([]Location, n)
	for i := range n {
		if locs[i], err = e.Add(1, int64(i), entry); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Flush(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(entry)))
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
		buf := make([]byte, 0, 2048)
		for pb.Next() {
			i := rng.IntN(n)
			if _, err := e.Read(locs[i], 1, int64(i), buf[:0]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
