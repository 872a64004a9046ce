package embedded

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestStartRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	t0 := time.Now()
	s, err := Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("start %v uri %s", time.Since(t0), s.URI())
	put(t, s, "k", "v")
	t0 = time.Now()
	s.Close()
	t.Logf("close %v", time.Since(t0))
	t0 = time.Now()
	s, err = Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restart %v uri %s", time.Since(t0), s.URI())
	defer s.Close()
	cli := client(t, s)
	defer cli.Close()
	r, err := cli.Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatal(err, r)
	}
}

func client(t *testing.T, s *Server) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.ClientURL()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

func put(t *testing.T, s *Server, k, v string) {
	cli := client(t, s)
	defer cli.Close()
	if _, err := cli.Put(context.Background(), k, v); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		{Dir: "x", ClientPort: -1},
		{Dir: "x", PeerPort: 70000},
		{Dir: "x", ClientPort: 5000, PeerPort: 5000},
		{Dir: "x", AutoCompactionRetention: -time.Second},
		{Dir: "x", Root: "ledgers"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
		if _, err := Start(context.Background(), c); err == nil {
			t.Errorf("%+v: Start succeeded", c)
		}
	}
}

func TestCloseTwice(t *testing.T) {
	s, err := Start(context.Background(), Config{Dir: t.TempDir(), UnsafeNoFsync: true, AutoCompactionRetention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Endpoints()) != 1 || s.URI() != "etcd://"+s.Endpoints()[0]+DefaultRoot {
		t.Fatalf("endpoints %v uri %s", s.Endpoints(), s.URI())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStartRefusesDirInUse: a second server on a data dir another one is using fails fast
// with ErrStart (etcd's backend waits for the db file's lock forever, whatever the context: a
// second `ringkeeper standalone` on the same --data-dir hung, deaf to Ctrl-C).
func TestStartRefusesDirInUse(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(context.Background(), Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s2, err := Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
		if err == nil {
			s2.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrStart) || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("second Start on a dir in use: %v, want ErrStart saying it is in use", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("second Start on a dir in use still waiting after 15 s (its context ended at 3 s)")
	}
}
