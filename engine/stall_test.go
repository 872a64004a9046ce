package engine

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/internal/diskio"
)

// stallFS holds every journal write while armed (a journal disk that stopped answering).
type stallFS struct {
	*diskio.Mem
	armed atomic.Bool
	gate  chan struct{}
}

type stallFile struct {
	diskio.File
	fs *stallFS
}

func (f *stallFS) Create(name string, opts diskio.Options) (diskio.File, error) {
	file, err := f.Mem.Create(name, opts)
	if err != nil || !strings.HasPrefix(name, "/journal/") {
		return file, err
	}
	return &stallFile{File: file, fs: f}, nil
}

func (f *stallFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fs.armed.Load() {
		<-f.fs.gate
	}
	return f.File.WriteAt(p, off)
}

// TestTryAddNeverWaitsForTheJournal: TryAdd runs on the server's event loops and must never
// block; with the journal's disk stalled and its queue full, it used to block in
// journal.Append. It now says the add must wait (queued false), for the blocking workers.
func TestTryAddNeverWaitsForTheJournal(t *testing.T) {
	fs := &stallFS{Mem: diskio.NewMem(4096), gate: make(chan struct{})}
	cfg := testConfig(t, fs, 1)
	cfg.Journal.QueueSize = 100
	e := openTest(t, cfg)
	defer e.Close()
	defer close(fs.gate)
	fs.armed.Store(true)
	done := make(chan int64, 1)
	go func() {
		en := int64(0)
		for ; en < 1000; en++ {
			queued, err := e.TryAdd(testKey, storedEntry(9, en), false, func(any, error) {}, nil)
			if err != nil || !queued {
				break
			}
		}
		done <- en
	}()
	select {
	case n := <-done:
		if n == 1000 {
			t.Fatal("1000 adds queued behind a stalled journal with a queue of 100")
		}
	case <-time.After(3 * time.Second):
		t.Fatal("TryAdd blocked for 3s: the journal's queue is full")
	}
}
