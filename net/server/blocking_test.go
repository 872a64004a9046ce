package server

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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

// stuckStorage never takes an add without waiting, and its Add waits until release is closed,
// so that the blocking-add workers and their queue fill up.
type stuckStorage struct {
	*servertest.MemStorage
	release chan struct{}
}

func (s stuckStorage) TryAdd([]byte, []byte, bool, func(any, error), any) (bool, error) {
	return false, nil
}

func (s stuckStorage) Add(key, stored []byte, recovery bool, done func(any, error), ctx any) error {
	<-s.release
	return s.MemStorage.Add(key, stored, recovery, done, ctx)
}

// TestBlockingAddQueueFullIsTooManyRequests: an add that finds the blocking-add workers and
// their queue full is the server's own back-pressure: it is answered ETOOMANYREQUESTS whatever
// Config.ErrorCode says of storage errors, and counted as rejected (Stats.Rejected,
// bookkeeper_server_ADD_ENTRY_REJECTED), as every other ETOOMANYREQUESTS the server decides.
// It went through ErrorCode (EIO with the default, or with one that does not know
// ErrTooManyAdds, making a client change ensembles) and was not counted.
func TestBlockingAddQueueFullIsTooManyRequests(t *testing.T) {
	st := stuckStorage{servertest.NewMemStorage(), make(chan struct{})}
	defer st.Close()
	cfg := DefaultConfig()
	cfg.Addr, cfg.Logger, cfg.ErrorCode = "127.0.0.1:0", testLogger(), servertest.ErrorCode
	reg := prometheus.NewRegistry()
	cfg.Metrics = NewMetrics(reg)
	srv := mustStart(t, cfg, st)
	defer srv.Stop(t.Context())
	released := false
	release := func() {
		if !released {
			released = true
			close(st.release)
		}
	}
	defer release() // before Stop, which waits for the adds in flight
	c, err := servertest.Dial(srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = blockingAddWorkers + blockingAddQueue + 100
	go func() {
		for e := int64(0); e < n; e++ {
			_ = c.SendAdd(keyA, entry(1, e, "x"), 0)
		}
		_ = c.Flush()
	}()
	// At most blockingAddWorkers+blockingAddQueue adds are taken, and they wait: the first 100
	// responses are refusals, answered at once.
	var refused int64
	recv := func(wantRefused bool) {
		t.Helper()
		resp, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		switch rc := resp.Add.RC; {
		case rc == protocol.ETOOMANYREQUESTS:
			refused++
		case rc != protocol.EOK || wantRefused:
			t.Fatalf("add %d: %v, want ETOOMANYREQUESTS", resp.Add.EntryID, rc)
		}
	}
	for range 100 {
		recv(true)
	}
	release()
	for range n - 100 {
		recv(false)
	}
	if got := srv.Stats().Rejected; got != refused {
		t.Fatalf("Stats.Rejected %d, want the %d adds answered ETOOMANYREQUESTS", got, refused)
	}
	if got := metricValue(t, reg, "bookkeeper_server_ADD_ENTRY_REJECTED"); got != float64(refused) {
		t.Fatalf("ADD_ENTRY_REJECTED %v, want %d", got, refused)
	}
}
