package server

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// stuckAddStorage never takes an add without waiting (a full write cache), and its blocking
// Add waits until gate is closed (the journal is stuck behind a slow disk).
type stuckAddStorage struct {
	*servertest.MemStorage
	gate    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (s *stuckAddStorage) TryAdd(key, stored []byte, recovery bool, done func(any, error), ctx any) (bool, error) {
	return false, nil
}

func (s *stuckAddStorage) Add(key, stored []byte, recovery bool, done func(any, error), ctx any) error {
	s.once.Do(func() { close(s.entered) })
	<-s.gate
	return s.MemStorage.Add(key, stored, recovery, done, ctx)
}

// TestStopBoundedWithAnAddWaitingForStorage: Stop's wait is bounded by its context, even
// when a blocking-add worker is waiting in Storage.Add.
func TestStopBoundedWithAnAddWaitingForStorage(t *testing.T) {
	st := &stuckAddStorage{MemStorage: servertest.NewMemStorage(), gate: make(chan struct{}), entered: make(chan struct{})}
	defer st.MemStorage.Close()
	defer close(st.gate)
	cfg := DefaultConfig()
	cfg.Addr = "127.0.0.1:0"
	cfg.Logger = testLogger()
	srv := mustStart(t, cfg, st)
	c, err := servertest.Dial(srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SendAdd(keyA, entry(1, 0, "x"), 0)
	_ = c.Flush()
	<-st.entered
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		stopped <- srv.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop: %v, want DeadlineExceeded", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Stop(ctx with 100ms) still running after 3s: it waits for the blocking-add worker stuck in Storage.Add")
	}
}

// TestStopBoundedWithAReadStuckInStorage: Stop's wait is bounded by its context, even when a
// read worker is blocked in Storage.Read and more reads are queued behind it.
func TestStopBoundedWithAReadStuckInStorage(t *testing.T) {
	env := startEnv(t, withConfig(func(c *Config) { c.NumReadWorkerThreads = 1 }),
		withStorage(func(st *servertest.MemStorage) { st.DisableCache = true }))
	c := env.dial(t)
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
	entered, release := blockReads(env.storage)
	defer release()
	for range 4 {
		_ = c.SendRead(1, 0, 0, nil)
	}
	_ = c.Flush()
	<-entered
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		stopped <- env.srv.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Stop: %v, want DeadlineExceeded", err)
		}
	case <-time.After(3 * time.Second):
		release()
		t.Fatal("Stop(ctx with 100ms) still running after 3s: it waits for the read worker stuck in Storage.Read")
	}
}
