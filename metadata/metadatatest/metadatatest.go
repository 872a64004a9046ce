// Package metadatatest gives tests a real metadata service: an embedded etcd
// server (package metadata/embedded) and drivers opened on it.
//
// A test package that opens many drivers shares one server and gives every
// test its own root, so tests do not see each other's keys:
//
//	func TestMain(m *testing.M) { os.Exit(metadatatest.Main(m)) }
//
//	func TestX(t *testing.T) {
//		d := metadatatest.Open(t, metadatatest.URI(t))
//		...
//	}
//
// Without Main, URI starts a server for the test. StartEmbedded always does.
package metadatatest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/embedded"
	_ "github.com/ringkeeper/ringkeeper/metadata/etcd" // registers etcd://
)

// startTimeout bounds starting a server.
const startTimeout = 30 * time.Second

var shared struct {
	sync.Mutex // guards server
	server     *embedded.Server
}

var rootSeq atomic.Int64

// Main starts one embedded etcd server for the whole test binary, runs the
// tests, stops the server and returns the exit code for os.Exit.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "metadatatest-etcd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "metadatatest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	s, err := embedded.Start(ctx, embedded.Config{Dir: dir, UnsafeNoFsync: true})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "metadatatest:", err)
		return 1
	}
	shared.Lock()
	shared.server = s
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	shared.server = nil
	shared.Unlock()
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "metadatatest: closing server:", err)
	}
	return code
}

// StartServer starts an embedded etcd server in a temporary directory of
// t's and closes it when t ends. Tests that restart the server use
// embedded.Start with Server.Dir.
func StartServer(t testing.TB) *embedded.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	s, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), UnsafeNoFsync: true})
	if err != nil {
		t.Fatalf("metadatatest: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// StartEmbedded starts a server for t (see StartServer) and returns a
// metadata service URI on it with a root unique to t.
func StartEmbedded(t testing.TB) string {
	t.Helper()
	return StartServer(t).URIWithRoot(Root(t))
}

// URI returns a metadata service URI with a root unique to t, on the shared
// server when the test binary runs under Main, or else on a server started
// for t.
func URI(t testing.TB) string {
	t.Helper()
	shared.Lock()
	s := shared.server
	shared.Unlock()
	if s == nil {
		return StartEmbedded(t)
	}
	return s.URIWithRoot(Root(t))
}

// Root returns a root path unique within the test binary, derived from t's
// name: /t/<name>-<n>.
func Root(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '_'
	}, t.Name())
	if len(name) > 100 {
		name = name[:100]
	}
	return fmt.Sprintf("/t/%s-%d", name, rootSeq.Add(1))
}

// Open opens a driver on uri (with opts, if given) and closes it when t
// ends.
func Open(t testing.TB, uri string, opts ...metadata.Options) metadata.Driver {
	t.Helper()
	var o metadata.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	d, err := metadata.Open(ctx, uri, o)
	if err != nil {
		t.Fatalf("metadatatest: open %s: %v", uri, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// Ledger returns valid OPEN ledger metadata with one ensemble of the given
// bookies (3 made-up bookies if none), write quorum = ensemble size and ack
// quorum = write quorum - 1 (at least 1).
func Ledger(bookies ...string) *metadata.LedgerMetadata {
	if len(bookies) == 0 {
		bookies = []string{"127.0.0.1:3181", "127.0.0.2:3181", "127.0.0.3:3181"}
	}
	e := len(bookies)
	return &metadata.LedgerMetadata{
		EnsembleSize:    e,
		WriteQuorumSize: e,
		AckQuorumSize:   max(e-1, 1),
		State:           metadata.StateOpen,
		LastEntryID:     metadata.NoEntry,
		Ensembles:       []metadata.Ensemble{{FirstEntryID: 0, Bookies: bookies}},
		DigestType:      metadata.DigestCRC32C,
		Password:        []byte("secret"),
		CreationTime:    time.UnixMilli(time.Now().UnixMilli()).UTC(),
	}
}
