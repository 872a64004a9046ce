package server

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// slowStorage refuses to take every other add without waiting (TryAdd queued=false), as an
// engine with a full write cache does; those adds must still succeed, through the blocking-add
// workers, with their own copy of the entry.
type slowStorage struct {
	*servertest.MemStorage
	tries atomic.Int64
}

func (s *slowStorage) TryAdd(key, stored []byte, recovery bool, done func(any, error), ctx any) (bool, error) {
	if s.tries.Add(1)%2 == 0 {
		return false, nil
	}
	return true, s.MemStorage.Add(key, stored, recovery, done, ctx)
}

func TestAddsThatWouldBlockGoToWorkers(t *testing.T) {
	st := &slowStorage{MemStorage: servertest.NewMemStorage()}
	cfg := DefaultConfig()
	cfg.Addr = "127.0.0.1:0"
	srv := mustStart(t, cfg, st)
	defer srv.Stop(t.Context())
	c, err := servertest.Dial(srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := protocol.MasterKey([]byte("k"))
	for e := int64(0); e < 200; e++ {
		if err := c.SendAdd(key, servertest.Entry(1, e, e-1, []byte{byte(e)}), 0); err != nil {
			t.Fatal(err)
		}
	}
	c.Flush()
	for range 200 {
		resp, err := c.Recv()
		if err != nil || resp.Add.RC != protocol.EOK {
			t.Fatalf("add: %v %v", resp.Add.RC, err)
		}
	}
	for e := int64(0); e < 200; e++ {
		rc, got, err := c.Read(1, e)
		if err != nil || rc != protocol.EOK || got[len(got)-1] != byte(e) {
			t.Fatalf("read %d: %v %v", e, rc, err)
		}
	}
	if st.tries.Load() < 200 {
		t.Fatalf("TryAdd called %d times", st.tries.Load())
	}
}

// waitingStorage never takes an add without waiting (TryAdd queued=false), so that every add
// goes to the blocking-add workers.
type waitingStorage struct{ *servertest.MemStorage }

func (s waitingStorage) TryAdd([]byte, []byte, bool, func(any, error), any) (bool, error) {
	return false, nil
}

// TestPanicInABlockingAddContained: a Storage.Add that panics on a blocking-add worker is
// contained as on the event loop (TestPanicContained): its connection is closed, the add's
// reservation is given back, and the process goes on serving the other connections. The
// worker's panic was not recovered, and it took the whole process down.
func TestPanicInABlockingAddContained(t *testing.T) {
	st := waitingStorage{servertest.NewMemStorage()}
	defer st.Close()
	cfg := DefaultConfig()
	cfg.Addr, cfg.Logger, cfg.ErrorCode = "127.0.0.1:0", testLogger(), servertest.ErrorCode
	srv := mustStart(t, cfg, st)
	defer srv.Stop(t.Context())
	dial := func() *servertest.Client {
		c, err := servertest.Dial(srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	good, bad := dial(), dial()
	st.PanicOnAdd(666)
	_ = bad.SendAdd(keyA, entry(666, 0, "boom"), 0)
	_ = bad.Flush()
	if err := bad.ExpectClosed(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, good, keyA, entry(1, 0, "fine"), 0, protocol.EOK)
	eventually(t, 5*time.Second, "the panicked add's reservation given back", func() bool {
		return srv.Stats().AddsInFlight == 0
	})
	if n := srv.Stats().Panics; n != 1 {
		t.Fatalf("Panics %d, want 1", n)
	}
	// The worker that recovered still serves adds.
	for e := int64(1); e <= blockingAddWorkers; e++ {
		mustAdd(t, good, keyA, entry(1, e, "still fine"), 0, protocol.EOK)
	}
}
