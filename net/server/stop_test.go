package server

import (
	"context"
	"errors"
	"net"
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

// TestStartFailureWithAConnectionDoesNotHang: when the TLS listener cannot start, Start
// undoes the gnet listener; a client that connected to it meanwhile must not make Start hang.
func TestStartFailureWithAConnectionDoesNotHang(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	pki := newTestPKI(t)
	for round := range 20 {
		addr, err := pickPort("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
					defer c.Close()
				}
			}
		})
		cfg := DefaultConfig()
		cfg.Addr = addr
		cfg.TLSAddr = busy.Addr().String()
		cfg.TLSConfig = pki.serverConfig(false)
		cfg.Logger = testLogger()
		srv, err := New(cfg, servertest.NewMemStorage())
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan error, 1)
		go func() { started <- srv.Start() }()
		time.Sleep(20 * time.Millisecond)
		select {
		case err := <-started:
			if err == nil {
				t.Fatal("Start succeeded with the TLS address taken")
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Start still running after 5s: abortStartLocked holds s.mu while gnet closes a connection (OnOpen/OnClose need s.mu)", round)
		}
		close(stop)
		wg.Wait()
	}
}
