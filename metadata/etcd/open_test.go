package etcd_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

func TestOpenMalformedURI(t *testing.T) {
	t.Parallel()
	for _, uri := range []string{
		"etcd://127.0.0.1:2379",          // no root
		"etcd://127.0.0.1:99999/ledgers", // bad port
		"etcd:/127.0.0.1:2379/ledgers",
		"etcd://127.0.0.1:2379/ledgers/",
		"etcd://127.0.0.1:2379,/ledgers",
	} {
		start := time.Now()
		_, err := metadata.Open(context.Background(), uri, metadata.Options{})
		if !errors.Is(err, metadata.ErrBadURI) || !strings.Contains(err.Error(), uri) {
			t.Errorf("%s: want ErrBadURI naming the URI, got %v", uri, err)
		}
		if time.Since(start) > time.Second {
			t.Errorf("%s: took %v", uri, time.Since(start))
		}
	}
}

// freePort returns a port that nothing listens on (just closed).
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

func TestOpenUnreachable(t *testing.T) {
	t.Parallel()
	uri := "etcd://127.0.0.1:" + freePort(t) + "/ledgers"
	start := time.Now()
	_, err := metadata.Open(context.Background(), uri, metadata.Options{DialTimeout: 500 * time.Millisecond})
	took := time.Since(start)
	if !errors.Is(err, metadata.ErrUnreachable) || !strings.Contains(err.Error(), "did not answer within 500ms") {
		t.Fatalf("want ErrUnreachable, got %v", err)
	}
	if took > 3*time.Second {
		t.Fatalf("took %v with a 500ms dial timeout", took)
	}
	t.Logf("unreachable after %v: %v", took, err)

	// The caller's deadline wins when it is shorter.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = metadata.Open(ctx, uri, metadata.Options{DialTimeout: time.Minute})
	if !errors.Is(err, metadata.ErrUnreachable) || time.Since(start) > 3*time.Second {
		t.Fatalf("ctx deadline: %v after %v", err, time.Since(start))
	}
}

func TestClosedDriver(t *testing.T) {
	t.Parallel()
	d, err := metadata.Open(ctxFor(t, 10*time.Second), metadatatest.URI(t), metadata.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := context.Background()
	if _, err := d.NewLedgerID(ctx); !errors.Is(err, metadata.ErrClosed) {
		t.Errorf("NewLedgerID: %v", err)
	}
	if _, _, err := d.Ledgers().Read(ctx, 1); !errors.Is(err, metadata.ErrClosed) {
		t.Errorf("Read: %v", err)
	}
	if _, err := d.Bookies().List(ctx, metadata.ListAll); !errors.Is(err, metadata.ErrClosed) {
		t.Errorf("List: %v", err)
	}
}

func TestInstanceID(t *testing.T) {
	t.Parallel()
	uri := metadatatest.URI(t)
	ctx := ctxFor(t, 20*time.Second)
	const n = 4
	ids := make(chan string, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		d := open(t, uri)
		go func() {
			id, err := d.InstanceID(ctx)
			ids <- id
			errs <- err
		}()
	}
	first := ""
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		id := <-ids
		if first == "" {
			first = id
		}
		if id != first || len(id) != 36 {
			t.Fatalf("instance ids differ or malformed: %q vs %q", id, first)
		}
	}
	if id, _ := open(t, uri).InstanceID(ctx); id != first {
		t.Fatalf("a later client sees %q, want %q", id, first)
	}
}
