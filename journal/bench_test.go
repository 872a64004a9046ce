package journal

import (
	"testing"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// BenchmarkAppend measures durable appends of 1 KiB records with many in flight, on the real
// file system in a temp dir. Run with -benchmem: steady state must not allocate per append.
func BenchmarkAppend(b *testing.B) {
	for _, engine := range []diskio.Engine{diskio.EngineAuto, diskio.EnginePsync} {
		b.Run(engine.String(), func(b *testing.B) {
			cfg := DefaultConfig(b.TempDir())
			cfg.Engine = engine
			cfg.MaxFileSize = 64 << 20
			cfg.MaxRecordSize = 4096
			j, err := Open(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			const inFlight = 1024
			free := make(chan *Entry, inFlight)
			payload := make([]byte, 1024)
			done := func(e *Entry, err error) {
				if err != nil {
					b.Error(err)
				}
				free <- e
			}
			for range inFlight {
				free <- &Entry{Type: RecordData, LedgerID: 1, Payload: payload, Done: done}
			}
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				e := <-free
				e.EntryID = int64(i)
				if err := j.Append(e); err != nil {
					b.Fatal(err)
				}
			}
			for range inFlight {
				<-free
			}
		})
	}
}
