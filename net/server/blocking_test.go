package server

import (
	"sync/atomic"
	"testing"

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
