package bookie

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
	"github.com/ringkeeper/ringkeeper/net/server"
)

// TestListeningInterfaceNamesANetworkInterface: as in BookKeeper, listeningInterface names a
// network interface ("lo", "eth0"); the bookie binds that interface's address and, without
// advertisedAddress, names it in its id. An unknown interface is a config error naming the key.
func TestListeningInterfaceNamesANetworkInterface(t *testing.T) {
	if _, err := net.InterfaceByName("lo"); err != nil {
		t.Skipf("no loopback interface named lo: %v", err)
	}
	uri := metadatatest.URI(t)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.ListenAddress = ""
	if _, err := cfg.Apply(map[string]string{"listeningInterface": "lo"}); err != nil {
		t.Fatal(err)
	}
	b := start(t, cfg)
	if host, _, _ := net.SplitHostPort(b.ID()); host != "127.0.0.1" {
		t.Fatalf("listeningInterface=lo: bookie id %q, want lo's address 127.0.0.1", b.ID())
	}
	if ip := b.Addr().(*net.TCPAddr).IP; !ip.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Fatalf("listeningInterface=lo: listening on %v, want 127.0.0.1", b.Addr())
	}
	if host, _, _ := net.SplitHostPort(b.HTTPAddr()); host != "127.0.0.1" {
		t.Fatalf("listeningInterface=lo: HTTP on %s, want 127.0.0.1", b.HTTPAddr())
	}
	b.Close(context.Background())

	// advertisedAddress still names the id; the bookie binds the interface.
	adv := testConfig(t, uri, t.TempDir())
	adv.ListenAddress = ""
	if _, err := adv.Apply(map[string]string{"listeningInterface": "lo", "advertisedAddress": "localhost"}); err != nil {
		t.Fatal(err)
	}
	b = start(t, adv)
	if host, _, _ := net.SplitHostPort(b.ID()); host != "localhost" {
		t.Fatalf("advertisedAddress=localhost with listeningInterface=lo: bookie id %q", b.ID())
	}
	b.Close(context.Background())

	bad := testConfig(t, uri, t.TempDir())
	bad.ListenAddress = ""
	if _, err := bad.Apply(map[string]string{"listeningInterface": "no-such-interface0"}); err != nil {
		t.Fatal(err)
	}
	if b, err := Start(context.Background(), bad); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "listeningInterface") {
		if err == nil {
			b.Close(context.Background())
		}
		t.Fatalf("listeningInterface=no-such-interface0: %v, want ErrBadConfig naming listeningInterface", err)
	}
}

// TestHTTPServerEnabledFalseLeavesOutTheAdminAPI: httpServerEnabled=false (BookKeeper's switch
// for its admin HTTP API) leaves the admin routes out; /metrics and /heartbeat are still
// served on prometheusStatsHttpPort. By default (ringkeeper's default: true) they are served.
func TestHTTPServerEnabledFalseLeavesOutTheAdminAPI(t *testing.T) {
	uri := metadatatest.URI(t)
	get := func(b *Bookie, method, path, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+b.HTTPAddr()+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	cfg := testConfig(t, uri, t.TempDir())
	if _, err := cfg.Apply(map[string]string{"httpServerEnabled": "false"}); err != nil {
		t.Fatal(err)
	}
	b := start(t, cfg)
	for _, r := range [][3]string{
		{"PUT", "/api/v1/bookie/state/readonly", `{"readOnly": true}`},
		{"GET", "/api/v1/bookie/state", ""},
		{"GET", "/api/v1/bookie/info", ""},
		{"PUT", "/api/v1/bookie/gc", `{}`},
		{"PUT", "/api/v1/bookie/gc/suspend_compaction", `{"suspendMajor": true}`},
	} {
		if code := get(b, r[0], r[1], r[2]); code != http.StatusNotFound {
			t.Errorf("httpServerEnabled=false: %s %s answered %d, want 404", r[0], r[1], code)
		}
	}
	if b.ReadOnly() {
		t.Fatal("httpServerEnabled=false: the admin API turned the bookie read-only")
	}
	for _, path := range []string{"/metrics", "/heartbeat"} {
		if code := get(b, "GET", path, ""); code != http.StatusOK {
			t.Errorf("httpServerEnabled=false: GET %s answered %d, want 200", path, code)
		}
	}

	def := start(t, testConfig(t, uri, t.TempDir()))
	if code := get(def, "GET", "/api/v1/bookie/state", ""); code != http.StatusOK {
		t.Fatalf("default config: GET /api/v1/bookie/state answered %d, want 200", code)
	}
}

// TestJournalDirectoriesWinsOverDeprecatedJournalDirectory: as in BookKeeper, journalDirectory
// counts only when journalDirectories is not set, whatever the order of the keys.
func TestJournalDirectoriesWinsOverDeprecatedJournalDirectory(t *testing.T) {
	props, err := ParseProperties(strings.NewReader("journalDirectory=/old/journal\njournalDirectories=/new/j1,/new/j2\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	warnings, err := cfg.Apply(props)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Engine.JournalDirs; len(got) != 2 || got[0] != "/new/j1" || got[1] != "/new/j2" {
		t.Fatalf("journalDirectories=/new/j1,/new/j2 with journalDirectory=/old/journal: journal dirs %q", got)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "journalDirectory") {
		t.Fatalf("the ignored journalDirectory was not reported: warnings %q", warnings)
	}

	alone := DefaultConfig()
	if _, err := alone.Apply(map[string]string{"journalDirectory": "/old/journal"}); err != nil {
		t.Fatal(err)
	}
	if got := alone.Engine.JournalDirs; len(got) != 1 || got[0] != "/old/journal" {
		t.Fatalf("journalDirectory=/old/journal alone: journal dirs %q", got)
	}
}

// TestContinuationOnTheLastLine: a last line ending in a continuation backslash ends at the
// end of the file, as in java.util.Properties; three trailing backslashes continue too (an
// escaped one, then the continuation), two do not.
func TestContinuationOnTheLastLine(t *testing.T) {
	props, err := ParseProperties(strings.NewReader("bookiePort=3999\nledgerDirectories=/data/l1,\\"))
	if err != nil {
		t.Fatal(err)
	}
	if got := props["ledgerDirectories"]; got != "/data/l1," {
		t.Fatalf("ledgerDirectories on the last line, ending in a continuation: %q (props %v)", got, props)
	}
	props, err = ParseProperties(strings.NewReader("a=x\\\\\\\n  y\nb=z\\\\\nc=w\n"))
	if err != nil {
		t.Fatal(err)
	}
	if props["a"] != `x\\y` || props["b"] != `z\\` || props["c"] != "w" {
		t.Fatalf("trailing backslashes: %q", props)
	}
}

// TestRepeatedDirsAreRefused: a journal or ledger dir named twice, however spelt, is a config
// error naming the key; a journal dir may also be a ledger dir.
func TestRepeatedDirsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		key              string
		journals, ledger []string
	}{
		{"journalDirectories", []string{"/a", "/a"}, []string{"/l"}},
		{"journalDirectories", []string{"/a", "/b", "/a/"}, []string{"/l"}},
		{"ledgerDirectories", []string{"/j"}, []string{"/l1", "/x/../l1"}},
	} {
		cfg := DefaultConfig()
		cfg.Engine.JournalDirs, cfg.Engine.LedgerDirs = tc.journals, tc.ledger
		if err := cfg.Validate(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("journal dirs %q, ledger dirs %q: %v, want ErrBadConfig naming %s", tc.journals, tc.ledger, err, tc.key)
		}
	}
	cfg := DefaultConfig()
	cfg.Engine.JournalDirs, cfg.Engine.LedgerDirs = []string{"/d"}, []string{"/d/"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a journal dir that is also the ledger dir: %v", err)
	}
}

// TestRepeatedDirsRefusedBeforeCookies: a bookie whose journal or ledger dir is named twice
// does not start, and writes nothing (no cookie, locally or in the metadata store), so the
// corrected config then starts as a new bookie.
func TestRepeatedDirsRefusedBeforeCookies(t *testing.T) {
	uri := metadatatest.URI(t)
	dir := t.TempDir()
	cfg := testConfig(t, uri, dir)
	j, l := cfg.Engine.JournalDirs[0], cfg.Engine.LedgerDirs[0]
	for _, tc := range []struct{ journals, ledgers []string }{
		{[]string{j, j + "/"}, []string{l}},
		{[]string{j}, []string{l, l}},
	} {
		cfg.Engine.JournalDirs, cfg.Engine.LedgerDirs = tc.journals, tc.ledgers
		b, err := Start(context.Background(), cfg)
		if err == nil {
			b.Close(context.Background())
		}
		if !errors.Is(err, ErrBadConfig) {
			t.Fatalf("journal dirs %q, ledger dirs %q: %v, want ErrBadConfig", tc.journals, tc.ledgers, err)
		}
		for _, d := range []string{j, l} {
			if _, err := os.Stat(filepath.Join(d, "current", "VERSION")); !os.IsNotExist(err) {
				t.Fatalf("journal dirs %q, ledger dirs %q refused, but %s has a cookie (%v)", tc.journals, tc.ledgers, d, err)
			}
		}
	}
	cfg.Engine.JournalDirs, cfg.Engine.LedgerDirs = []string{j}, []string{l}
	start(t, cfg)
}

// TestDirsNamedRelativelyAreTheSameDirsAbsolutely: the cookies record the journal and ledger
// dirs made absolute, so the same dirs named from another working directory, or absolutely,
// are the bookie's own.
func TestDirsNamedRelativelyAreTheSameDirsAbsolutely(t *testing.T) {
	uri := metadatatest.URI(t)
	root := t.TempDir()
	t.Chdir(root)
	cfg := testConfig(t, uri, root)
	cfg.Engine.JournalDirs, cfg.Engine.LedgerDirs = []string{"data/journal"}, []string{"./data/ledgers"}
	b := start(t, cfg)
	b.Close(context.Background())

	cfg.Engine.JournalDirs = []string{filepath.Join(root, "data", "journal")}
	cfg.Engine.LedgerDirs = []string{filepath.Join(root, "data", "ledgers")}
	b = start(t, cfg)
	b.Close(context.Background())

	t.Chdir(filepath.Join(root, "data"))
	cfg.Engine.JournalDirs, cfg.Engine.LedgerDirs = []string{"journal"}, []string{"ledgers/"}
	start(t, cfg)
}

// bookieAuthToken and bookieAuthTokenFile name the same setting: both in one set is refused
// (applied in key order, the file silently won).
func TestAuthTokenAndTokenFileBothSetIsRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	if _, err := cfg.Apply(map[string]string{"bookieAuthToken": "inline", "bookieAuthTokenFile": file}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("both set: %v, want ErrBadConfig", err)
	}
	if _, err := cfg.Apply(map[string]string{"bookieAuthTokenFile": file}); err != nil || cfg.AuthToken != "from-file" {
		t.Fatalf("file alone: token %q, err %v", cfg.AuthToken, err)
	}
}

// TestEmptyAuthTokenFileIsRefused: bookieAuthTokenFile naming an empty (or blank) file is a
// config error naming the key. It left AuthToken empty, which turns authentication off: a
// bookie whose token secret was not yet in place served every client unauthenticated.
func TestEmptyAuthTokenFileIsRefused(t *testing.T) {
	for _, content := range []string{"", " \n\t\n"} {
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		_, err := cfg.Apply(map[string]string{"bookieAuthTokenFile": file})
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "bookieAuthTokenFile") {
			t.Fatalf("bookieAuthTokenFile with %q: %v (token %q), want ErrBadConfig naming the key", content, err, cfg.AuthToken)
		}
	}
}

// TestMaxUnwrittenReadBytesKey: maxUnwrittenReadBytes sets the server's bound on unwritten
// read response bytes.
func TestMaxUnwrittenReadBytesKey(t *testing.T) {
	c := DefaultConfig()
	if c.Server.MaxUnwrittenReadBytes <= 0 {
		t.Fatalf("default MaxUnwrittenReadBytes %d", c.Server.MaxUnwrittenReadBytes)
	}
	if _, err := c.Apply(map[string]string{"maxUnwrittenReadBytes": "1048576"}); err != nil {
		t.Fatal(err)
	}
	if c.Server.MaxUnwrittenReadBytes != 1<<20 {
		t.Fatalf("maxUnwrittenReadBytes=1048576: MaxUnwrittenReadBytes %d", c.Server.MaxUnwrittenReadBytes)
	}
}

// nettyMaxFrameSizeBytes above the server's per-connection inbound limit (16 MiB) raises the
// limits that must hold a whole frame: the bookie refused to start with it.
func TestLargeFrameSizeRaisesTheLimitsThatHoldAFrame(t *testing.T) {
	cfg := testConfig(t, "etcd://127.0.0.1:1/ledgers", t.TempDir())
	if _, err := cfg.Apply(map[string]string{"nettyMaxFrameSizeBytes": strconv.Itoa(32 << 20), "dbStorage_writeCacheMaxSizeMb": "128", "journalMaxSizeMB": "256"}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("nettyMaxFrameSizeBytes=32 MiB: %v", err)
	}
	srv := cfg.Server
	srv.EnsureDefaults()
	if err := srv.Validate(); err != nil {
		t.Fatalf("the server's config with a 32 MiB frame: %v", err)
	}
}

// TestMemoryBudgetCountsUnwrittenReads: the budget the garbage-collection limit starts from
// holds every configured bound on held bytes, the unwritten read responses included (they were
// left out, so a bookie holding its whole read budget left the rest of the process half its
// headroom).
func TestMemoryBudgetCountsUnwrittenReads(t *testing.T) {
	c := DefaultConfig()
	c.Engine.LedgerDirs = []string{"a", "b"}
	if _, err := c.Apply(map[string]string{"dbStorage_writeCacheMaxSizeMb": "64", "dbStorage_readAheadCacheMaxSizeMb": "32",
		"maxUnwrittenReadBytes": strconv.Itoa(16 << 20)}); err != nil {
		t.Fatal(err)
	}
	want := int64(64<<20) + 32<<20 + 2*c.Engine.IndexBlockCacheSize + 16<<20
	if got := c.MemoryBudget(); got != want {
		t.Fatalf("MemoryBudget %d, want %d (write 64 MiB + read-ahead 32 MiB + 2 index caches of %d + unwritten reads 16 MiB)",
			got, want, c.Engine.IndexBlockCacheSize)
	}
	// maxUnwrittenReadBytes=0 means the server's default (128 MiB), which the budget counted
	// as 0 bytes.
	if _, err := c.Apply(map[string]string{"maxUnwrittenReadBytes": "0"}); err != nil {
		t.Fatal(err)
	}
	want += server.DefaultMaxUnwrittenReadBytes - 16<<20
	if got := c.MemoryBudget(); got != want {
		t.Fatalf("with maxUnwrittenReadBytes=0: MemoryBudget %d, want %d (the server's default of %d counted)",
			got, want, server.DefaultMaxUnwrittenReadBytes)
	}
}

// TestServerKeysCheckedByValidate: a bad value of a key that sets the network server is a
// config error naming the key at Validate, before the engine opens and the cookie is written.
// Validate left the server's settings out: such a value passed, the engine opened and the
// cookie went to the metadata store, and only then did the server refuse it, naming a Go
// field (NumEventLoops, MaxFrameSize) instead of the key, outside ErrBadConfig.
func TestServerKeysCheckedByValidate(t *testing.T) {
	for _, kv := range [][2]string{
		{"serverNumIOThreads", "-1"},
		{"numReadWorkerThreads", "-1"},
		{"numReadWorkerThreads", "1025"},
		{"numReadWorkerThreads", "1000000000"},
		{"maxPendingAddRequestsPerThread", "-1"},
		{"maxPendingReadRequestsPerThread", "-1"},
		{"maxAddsInProgressLimit", "-1"},
		{"maxReadsInProgressLimit", "-1"},
		{"maxUnwrittenReadBytes", "-1"},
		{"nettyMaxFrameSizeBytes", "1"},
		{"nettyMaxFrameSizeBytes", "-1"},
	} {
		c := testConfig(t, "etcd://127.0.0.1:1/ledgers", t.TempDir())
		if _, err := c.Apply(map[string]string{kv[0]: kv[1]}); err != nil {
			if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), kv[0]) {
				t.Errorf("%s=%s: Apply: %v, want ErrBadConfig naming the key", kv[0], kv[1], err)
			}
			continue
		}
		if err := c.Validate(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), kv[0]) {
			t.Errorf("%s=%s: Validate: %v, want ErrBadConfig naming the key", kv[0], kv[1], err)
		}
	}
	// Zero keeps each one's default, as in the server's config.
	c := testConfig(t, "etcd://127.0.0.1:1/ledgers", t.TempDir())
	if _, err := c.Apply(map[string]string{"serverNumIOThreads": "0", "numReadWorkerThreads": "0",
		"maxAddsInProgressLimit": "0", "maxReadsInProgressLimit": "0"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("zeros: %v", err)
	}
	if _, err := c.Apply(map[string]string{"numReadWorkerThreads": "1024"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("numReadWorkerThreads=1024: %v", err)
	}
}
