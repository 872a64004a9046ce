package diskio

import (
	"testing"
	"time"
)

// Close waits for the requests in flight (WriteSyncer.Close): the psync engine returned at once,
// so a caller could close the file under a write still running.
func TestPsyncWriteSyncerCloseWaitsForRequestsInFlight(t *testing.T) {
	m := NewMem(0)
	_ = m.MkdirAll("/d")
	f, _ := m.Create("/d/a", Options{})
	started, release := make(chan struct{}), make(chan struct{})
	m.SetInjector(func(op Op) error {
		if op.Kind == OpWrite {
			close(started)
			<-release
		}
		return nil
	})
	ws, err := NewWriteSyncer(EnginePsync, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Submit(WriteRequest{File: f, Buf: []byte("x"), BufIndex: -1, Sync: SyncFile, ID: 7}); err != nil {
		t.Fatal(err)
	}
	<-started
	closed := make(chan error, 1)
	go func() { closed <- ws.Close() }()
	select {
	case err := <-closed:
		close(release)
		t.Fatalf("Close returned (%v) while a write was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	n := 0
	for c := range ws.Completions() {
		if c.ID != 7 || c.Err != nil {
			t.Fatalf("completion %+v", c)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d completions, want 1", n)
	}
	if err := ws.Close(); err != nil { // a second Close is harmless, as with io_uring
		t.Fatalf("second Close: %v", err)
	}
}
