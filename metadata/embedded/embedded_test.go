package embedded

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestStartRefusesNewDirStartedTwiceAtOnce: two servers started at once on a new (empty)
// data dir: one starts, the other fails fast with ErrStart saying the dir is in use. Neither
// may wait on the other's files, and the two must never share the dir.
func TestStartRefusesNewDirStartedTwiceAtOnce(t *testing.T) {
	for round := 0; round < 3; round++ {
		dir := t.TempDir()
		type result struct {
			s   *Server
			err error
		}
		results := make(chan result, 2)
		start := make(chan struct{})
		for i := 0; i < 2; i++ {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				<-start
				s, err := Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
				results <- result{s, err}
			}()
		}
		close(start)
		var started []*Server
		var errs []error
		defer func() {
			for _, s := range started {
				s.Close()
			}
		}()
		for i := 0; i < 2; i++ {
			select {
			case r := <-results:
				if r.err == nil {
					started = append(started, r.s)
				} else {
					errs = append(errs, r.err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d: a Start on the new dir still waiting after 20 s (its context ended at 5 s); %d started, errors %v",
					round, len(started), errs)
			}
		}
		if len(started) != 1 {
			t.Fatalf("round %d: %d servers started on one dir, want 1 (errors: %v)", round, len(started), errs)
		}
		if !errors.Is(errs[0], ErrDirInUse) || !errors.Is(errs[0], ErrStart) || !strings.Contains(errs[0].Error(), "in use") {
			t.Fatalf("round %d: the second Start: %v, want ErrDirInUse (an ErrStart) saying the dir is in use", round, errs[0])
		}
	}
}

// TestStartRefusesDirWhoseDBIsLocked: a server that takes no LOCK (a plain etcd) but holds the
// db of the data dir is still seen, and Start fails fast with ErrDirInUse.
func TestStartRefusesDirWhoseDBIsLocked(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "member", "snap")
	if err := os.MkdirAll(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := os.Create(filepath.Join(snap, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := syscall.Flock(int(db.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
	if err == nil {
		s.Close()
	}
	if !errors.Is(err, ErrDirInUse) {
		t.Fatalf("Start on a dir whose db another server holds: %v, want ErrDirInUse", err)
	}
	// The refused start let go of LOCK: once the db is free, the dir can be used.
	db.Close()
	s, err = Start(ctx, Config{Dir: dir, UnsafeNoFsync: true})
	if err != nil {
		t.Fatalf("Start after the db was released: %v", err)
	}
	s.Close()
}
