package bookie

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/internal/diskio"
	"github.com/ringkeeper/ringkeeper/journal"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(metadatatest.Main(m))
}

// testConfig is a small bookie on free ports in dir.
func testConfig(t testing.TB, uri, dir string) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.BookiePort = freePort(t)
	cfg.ListenAddress = "127.0.0.1"
	cfg.MetadataServiceURI = uri
	cfg.PrometheusStatsHTTPPort = -1
	cfg.RegistrationTTL = 2 * time.Second
	cfg.Engine.JournalDirs = []string{filepath.Join(dir, "journal")}
	cfg.Engine.LedgerDirs = []string{filepath.Join(dir, "ledgers")}
	cfg.Engine.WriteCacheMaxSize = 32 << 20
	cfg.Engine.ReadAheadCacheMaxSize = 8 << 20
	cfg.Engine.IndexBlockCacheSize = 8 << 20
	cfg.Engine.Journal.MaxFileSize = 64 << 20
	cfg.Engine.EntryLogSizeLimit = 64 << 20
	cfg.Server.NumEventLoops = 2
	return cfg
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func start(t testing.TB, cfg Config) *Bookie {
	t.Helper()
	b, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close(context.Background()) })
	return b
}

func dial(t testing.TB, b *Bookie) *servertest.Client {
	t.Helper()
	c, err := servertest.Dial(b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var key = protocol.MasterKey([]byte("password"))

func entry(l, e int64) []byte {
	return servertest.Entry(l, e, e-1, bytes.Repeat([]byte{byte(l), byte(e)}, 300))
}

func TestProtocolAgainstTheRealEngine(t *testing.T) {
	uri := metadatatest.URI(t)
	b := start(t, testConfig(t, uri, t.TempDir()))
	c := dial(t, b)
	for e := int64(0); e < 20; e++ {
		if rc, err := c.Add(key, entry(1, e), 0); err != nil || rc != protocol.EOK {
			t.Fatalf("add %d: %v %v", e, rc, err)
		}
	}
	if rc, got, err := c.Read(1, 7); err != nil || rc != protocol.EOK || !bytes.Equal(got, entry(1, 7)) {
		t.Fatalf("read: %v %v", rc, err)
	}
	if rc, got, err := c.Read(1, -1); err != nil || rc != protocol.EOK || !bytes.Equal(got, entry(1, 19)) {
		t.Fatalf("read -1: %v %v", rc, err)
	}
	if rc, _, err := c.Read(99, 0); err != nil || rc != protocol.ENOLEDGER {
		t.Fatalf("missing ledger: %v %v", rc, err)
	}
	if rc, _, err := c.Read(1, 20); err != nil || rc != protocol.ENOENTRY {
		t.Fatalf("missing entry: %v %v", rc, err)
	}
	wrong := protocol.MasterKey([]byte("wrong"))
	if rc, err := c.Add(wrong, entry(1, 20), 0); err != nil || rc != protocol.EUA {
		t.Fatalf("wrong key: %v %v", rc, err)
	}
	if rc, _, err := c.FencingRead(1, -1, wrong); err != nil || rc != protocol.EUA {
		t.Fatalf("fence with wrong key: %v %v", rc, err)
	}
	rc, last, err := c.FencingRead(1, -1, key)
	if err != nil || rc != protocol.EOK || !bytes.Equal(last, entry(1, 19)) {
		t.Fatalf("fencing read: %v %v", rc, err)
	}
	if rc, err := c.Add(key, entry(1, 20), 0); err != nil || rc != protocol.EFENCED {
		t.Fatalf("add after fence: %v %v", rc, err)
	}
	if rc, err := c.Add(key, entry(1, 20), protocol.FlagRecoveryAdd); err != nil || rc != protocol.EOK {
		t.Fatalf("recovery add: %v %v", rc, err)
	}
	// An oversize frame closes that connection only: this one at its length prefix, which is
	// past any add the server would discard (an oversize add within that bound is answered
	// EBADREQ: net/server's TestOversizeAddAnswered).
	bad := dial(t, b)
	bad.SendRaw([]byte{0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	bad.Flush()
	if err := bad.ExpectClosed(5 * time.Second); err != nil {
		t.Fatalf("oversize frame: %v", err)
	}
	garbage := dial(t, b)
	garbage.SendRaw([]byte{0, 0, 0, 8, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4})
	garbage.Flush()
	if _, err := garbage.Recv(); err == nil {
		// EBADREQ is also a valid answer; the connection must not serve further garbage.
		t.Log("garbage frame answered")
	}
	if rc, _, err := c.Read(1, 0); err != nil || rc != protocol.EOK {
		t.Fatalf("other connection after garbage: %v %v", rc, err)
	}
	// Metrics are served.
	resp, err := http.Get("http://" + b.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := new(bytes.Buffer)
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"bookkeeper_server_ADD_ENTRY_REQUEST", "bookie_journal_JOURNAL_SYNC", "bookie_write_cache_size",
		"bookie_journal_JOURNAL_QUEUE_LATENCY", "ringkeeper_journal_group_wait_seconds", "ringkeeper_journal_callback_delay_seconds"} {
		if !strings.Contains(body.String(), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestRestartKeepsDataAndRegistration(t *testing.T) {
	uri := metadatatest.URI(t)
	dir := t.TempDir()
	cfg := testConfig(t, uri, dir)
	b := start(t, cfg)
	c := dial(t, b)
	for e := int64(0); e < 50; e++ {
		if rc, err := c.Add(key, entry(3, e), 0); err != nil || rc != protocol.EOK {
			t.Fatalf("add: %v %v", rc, err)
		}
	}
	md := metadatatest.Open(t, uri)
	bookies, err := md.Bookies().List(context.Background(), metadata.ListWritable)
	if err != nil || len(bookies) != 1 || bookies[0].ID != b.ID() {
		t.Fatalf("registration: %v %v", bookies, err)
	}
	c.Close()
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Graceful shutdown deregisters.
	if bookies, _ := md.Bookies().List(context.Background(), metadata.ListAll); len(bookies) != 0 {
		t.Fatalf("still registered after shutdown: %v", bookies)
	}
	b = start(t, cfg)
	c = dial(t, b)
	for e := int64(0); e < 50; e++ {
		if rc, got, err := c.Read(3, e); err != nil || rc != protocol.EOK || !bytes.Equal(got, entry(3, e)) {
			t.Fatalf("read %d after restart: %v %v", e, rc, err)
		}
	}
}

func TestWipedDisksAreRefused(t *testing.T) {
	uri := metadatatest.URI(t)
	dir := t.TempDir()
	cfg := testConfig(t, uri, dir)
	b := start(t, cfg)
	b.Close(context.Background())
	os.RemoveAll(dir)
	_, err := Start(context.Background(), cfg)
	if !errors.Is(err, engine.ErrCookie) {
		t.Fatalf("start on wiped disks: %v", err)
	}
	t.Log(err)
}

func TestReadOnlyWhenDiskAboveThreshold(t *testing.T) {
	uri := metadatatest.URI(t)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.DiskCheckInterval = 50 * time.Millisecond
	// Any real disk is above a 0.1% threshold.
	cfg.DiskUsageThreshold, cfg.DiskUsageWarnThreshold, cfg.DiskUsageLwmThreshold = 0.001, 0.001, 0.0005
	b := start(t, cfg)
	c := dial(t, b)
	waitReadOnly(t, b, metadatatest.Open(t, uri), true)
	if rc, err := c.Add(key, entry(4, 0), 0); err != nil || rc != protocol.EREADONLY {
		t.Fatalf("add on a read-only bookie: %v %v", rc, err)
	}
	if rc, err := c.Add(key, entry(4, 0), protocol.FlagRecoveryAdd|protocol.FlagHighPriority); err != nil || rc != protocol.EOK {
		t.Fatalf("recovery add on a read-only bookie: %v %v", rc, err)
	}
	if rc, _, err := c.Read(4, 0); err != nil || rc != protocol.EOK {
		t.Fatalf("read on a read-only bookie: %v %v", rc, err)
	}
}

func TestAuthToken(t *testing.T) {
	uri := metadatatest.URI(t)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.AuthToken = "s3cret"
	b := start(t, cfg)
	c := dial(t, b)
	if rc, err := c.Add(key, entry(5, 0), 0); err != nil || rc != protocol.EUA {
		t.Fatalf("add before auth: %v %v", rc, err)
	}
	if _, err := c.Auth("ringkeeper.token", []byte("s3cret")); err != nil {
		t.Fatalf("auth: %v", err)
	}
	if rc, err := c.Add(key, entry(5, 0), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("add after auth: %v %v", rc, err)
	}
}

func TestConfigFile(t *testing.T) {
	props, err := ParseProperties(strings.NewReader(`
# comment
bookiePort=3999
journalDirectories = /j1, /j2
ledgerDirectories: /l1
journalMaxGroupWaitMSec=1
dbStorage_writeCacheMaxSizeMb=64
journalSyncData=false
someUnknownKey=1
zkServers=localhost:2181
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	warnings, err := cfg.Apply(props)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "someUnknownKey") {
		t.Fatalf("warnings %v", warnings)
	}
	if cfg.BookiePort != 3999 || len(cfg.Engine.JournalDirs) != 2 || cfg.Engine.LedgerDirs[0] != "/l1" ||
		cfg.Engine.Journal.MaxGroupWait != time.Millisecond || cfg.Engine.WriteCacheMaxSize != 64<<20 || cfg.Engine.Journal.SyncData {
		t.Fatalf("config %+v", cfg)
	}
	for _, bad := range []string{"bookiePort=abc", "journalSyncData=maybe", "journalIOEngine=aio", "diskUsageThreshold=x",
		// NaN passes every range check; sizes whose bytes overflow would wrap to small ones.
		"diskUsageThreshold=NaN", "minorCompactionThreshold=+Inf", "dbStorage_writeCacheMaxSizeMb=17592186044480",
		"journalMaxSizeMB=17592186044480", "gcWaitTime=9223372036854775807"} {
		props, _ := ParseProperties(strings.NewReader(bad))
		c := DefaultConfig()
		if _, err := c.Apply(props); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), strings.Split(bad, "=")[0]) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	c := DefaultConfig()
	c.DiskUsageLwmThreshold = 0.99
	if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("lwm above threshold: %v", err)
	}
	c = DefaultConfig()
	c.BookiePort = 0 // the bookie id, registered and in the cookie, names the port
	if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("bookiePort 0: %v", err)
	}
	c = DefaultConfig()
	c.PrometheusStatsHTTPPort = 70000 // refused before the engine opens or a cookie is written
	if err := c.Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("prometheusStatsHttpPort 70000: %v", err)
	}
}

// metadataURIForChild is a metadata URI on the test binary's shared embedded etcd, with a root
// of its own, that child processes can reach too.
func metadataURIForChild(t *testing.T) string { return metadatatest.URI(t) }

// TestFailedStorageTurnsReadOnlyForGood: once a journal fsync fails (sticky), every add fails
// there, so the bookie registers read-only (clients stop picking it for new ensembles) and
// stays so: neither the disk checker nor an operator makes it writable before a restart.
// Reads go on.
func TestFailedStorageTurnsReadOnlyForGood(t *testing.T) {
	uri := metadatatest.URI(t)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.DiskCheckInterval = 50 * time.Millisecond
	fs := diskio.NewMem(4096)
	cfg.Engine.FS = fs
	b := start(t, cfg)
	c := dial(t, b)
	if rc, err := c.Add(key, entry(6, 0), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("add: %v %v", rc, err)
	}
	fs.SetInjector(func(op diskio.Op) error {
		if op.Kind == diskio.OpSync {
			return unix.EIO
		}
		return nil
	})
	if rc, err := c.Add(key, entry(6, 1), 0); err != nil || rc != protocol.EIO {
		t.Fatalf("add with a failing fsync: %v %v, want EIO", rc, err)
	}
	fs.SetInjector(nil)
	waitReadOnly(t, b, metadatatest.Open(t, uri), true)
	if err := b.SetReadOnly(false); !errors.Is(err, ErrStorageFailed) || !b.ReadOnly() {
		t.Fatalf("operator made a failed bookie writable: %v, read-only %v", err, b.ReadOnly())
	}
	time.Sleep(3 * cfg.DiskCheckInterval) // the disk checker must not either
	if !b.ReadOnly() {
		t.Fatal("the disk checker made a failed bookie writable")
	}
	if rc, data, err := c.Read(6, 0); err != nil || rc != protocol.EOK || !bytes.Equal(data, entry(6, 0)) {
		t.Fatalf("read on a failed bookie: %v %v", rc, err)
	}
}

// crash stops b as a power loss would: the returned FS holds only what was synced, and b's
// own FS fails every later operation (its Close writes nothing more: no final checkpoint).
func crash(t *testing.T, b *Bookie, fs *diskio.Mem) *diskio.Mem {
	t.Helper()
	crashed := fs.Crash(diskio.CrashSyncedOnly, nil)
	b.Close(context.Background())
	return crashed
}

// memUsed is how many bytes fs holds; it leaves fs unbounded (capacity 0) for the caller to
// bound again.
func memUsed(t *testing.T, fs *diskio.Mem) uint64 {
	t.Helper()
	fs.SetCapacity(0)
	total, free, err := fs.Usage("")
	if err != nil {
		t.Fatal(err)
	}
	return total - free
}

// TestJournalCorruptionInTheMiddleStopsStart: a journal record damaged where valid groups
// follow must stop the bookie with an error naming the file and offset; it must never come up
// and answer "no such entry" for the ledger (reliability §5.5).
func TestJournalCorruptionInTheMiddleStopsStart(t *testing.T) {
	uri := metadatatest.URI(t)
	cfg := testConfig(t, uri, t.TempDir())
	fs := diskio.NewMem(4096)
	cfg.Engine.FS = fs
	b := start(t, cfg)
	c := dial(t, b)
	for e := int64(0); e < 20; e++ { // one journal group each
		if rc, err := c.Add(key, entry(8, e), 0); err != nil || rc != protocol.EOK {
			t.Fatalf("add %d: %v %v", e, rc, err)
		}
	}
	c.Close()
	crashed := crash(t, b, fs)
	jdir := filepath.Join(cfg.Engine.JournalDirs[0], "current")
	names, err := crashed.List(jdir)
	if err != nil {
		t.Fatal(err)
	}
	var path string
	var off int64 = -1
	for _, name := range names {
		if !strings.HasSuffix(name, ".txn") {
			continue
		}
		path = filepath.Join(jdir, name)
		data, err := diskio.ReadFile(crashed, path, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(data, entry(8, 5)); i >= 0 {
			f, err := crashed.Open(path, diskio.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte{data[i+100] ^ 0x04}, int64(i+100)); err != nil {
				t.Fatal(err)
			}
			f.Close()
			off = int64(i) - 32 // the journal record's header precedes the stored entry
			break
		}
	}
	if off < 0 {
		t.Fatalf("entry 8/5 not found in the journal files %v", names)
	}
	cfg.Engine.FS = crashed
	b2, err := Start(context.Background(), cfg)
	if err == nil {
		c := dial(t, b2)
		rc, _, rerr := c.Read(8, 5)
		b2.Close(context.Background())
		t.Fatalf("the bookie started on a journal damaged in the middle (read 8/5: %v %v)", rc, rerr)
	}
	if !errors.Is(err, journal.ErrCorruption) {
		t.Fatalf("start: %v, want journal.ErrCorruption", err)
	}
	if want := fmt.Sprintf("%s offset %d", path, off); !strings.Contains(err.Error(), want) {
		t.Fatalf("start: %q does not name %q", err, want)
	}
	md := metadatatest.Open(t, uri)
	if all, err := md.Bookies().List(context.Background(), metadata.ListAll); err != nil || len(all) != 0 {
		t.Fatalf("registered after a failed start: %v %v", all, err)
	}
}

// waitReadOnly waits until b's mode is ro, then checks that its registration shows it.
func waitReadOnly(t *testing.T, b *Bookie, md metadata.Driver, ro bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for b.ReadOnly() != ro && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if b.ReadOnly() != ro {
		t.Fatalf("read-only %v, want %v", b.ReadOnly(), ro)
	}
	filter := metadata.ListWritable
	if ro {
		filter = metadata.ListReadOnly
	}
	for {
		got, err := md.Bookies().List(context.Background(), filter)
		if err == nil && len(got) == 1 && got[0].ID == b.ID() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("registration does not show read-only %v: %v %v", ro, got, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReplayOnAFullDiskAndReadOnlyModes: a bookie that crashed restarts on a disk above
// diskUsageThreshold: the journal replays, it comes up read-only and serves the replayed
// entries; below diskUsageLwmThreshold it turns writable again, unless an operator forced
// read-only mode, which the disk checker's ticks leave alone (reliability §5.11).
func TestReplayOnAFullDiskAndReadOnlyModes(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.DiskCheckInterval = 20 * time.Millisecond
	cfg.DiskUsageThreshold, cfg.DiskUsageWarnThreshold, cfg.DiskUsageLwmThreshold = 0.9, 0.85, 0.8
	fs := diskio.NewMem(4096)
	cfg.Engine.FS = fs
	b := start(t, cfg)
	c := dial(t, b)
	for e := int64(0); e < 20; e++ {
		if rc, err := c.Add(key, entry(9, e), 0); err != nil || rc != protocol.EOK {
			t.Fatalf("add %d: %v %v", e, rc, err)
		}
	}
	c.Close()
	crashed := crash(t, b, fs)
	// Above 90% full before the restart, and still after it (a restart writes about 2 MiB:
	// a checkpoint and the next journal file's first blocks).
	crashed.SetCapacity(memUsed(t, crashed) + 6<<20)
	cfg.Engine.FS = crashed
	b = start(t, cfg)
	if usage, _, _, _ := b.Engine().Usage(); usage < cfg.DiskUsageThreshold {
		t.Fatalf("usage %.3f after the restart, want above %.2f", usage, cfg.DiskUsageThreshold)
	}
	if !b.ReadOnly() {
		t.Fatal("bookie on a full disk came up writable")
	}
	waitReadOnly(t, b, md, true)
	c = dial(t, b)
	for e := int64(0); e < 20; e++ {
		if rc, got, err := c.Read(9, e); err != nil || rc != protocol.EOK || !bytes.Equal(got, entry(9, e)) {
			t.Fatalf("read 9/%d replayed on a full disk: %v %v", e, rc, err)
		}
	}
	if rc, err := c.Add(key, entry(9, 20), 0); err != nil || rc != protocol.EREADONLY {
		t.Fatalf("add on a full disk: %v %v", rc, err)
	}

	// Below the low-water mark: writable again.
	crashed.SetCapacity(0)
	waitReadOnly(t, b, md, false)
	if rc, err := c.Add(key, entry(9, 20), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("add after the disk drained: %v %v", rc, err)
	}

	// Forced read-only stays so when the disk is full, then drains, over many ticks.
	if err := b.SetReadOnly(true); err != nil {
		t.Fatal(err)
	}
	crashed.SetCapacity(memUsed(t, crashed) + 4<<20)
	time.Sleep(5 * cfg.DiskCheckInterval)
	crashed.SetCapacity(0)
	time.Sleep(10 * cfg.DiskCheckInterval)
	waitReadOnly(t, b, md, true)
	if rc, err := c.Add(key, entry(9, 21), 0); err != nil || rc != protocol.EREADONLY {
		t.Fatalf("add to a bookie forced read-only: %v %v", rc, err)
	}
	if rc, _, err := c.Read(9, 20); err != nil || rc != protocol.EOK {
		t.Fatalf("read on a bookie forced read-only: %v %v", rc, err)
	}
	// The operator lets go: writable.
	if err := b.SetReadOnly(false); err != nil {
		t.Fatal(err)
	}
	waitReadOnly(t, b, md, false)
	if rc, err := c.Add(key, entry(9, 21), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("add after the operator let go: %v %v", rc, err)
	}
}

// TestCookieMissingFromTheMetadataStore: a bookie whose cookie is gone from the metadata store
// but present in every one of its dirs is the same bookie (its dirs agree on it): it starts,
// puts the cookie back and serves its ledgers, never as absent (reliability §5.13).
func TestCookieMissingFromTheMetadataStore(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	cfg := testConfig(t, uri, t.TempDir())
	b := start(t, cfg)
	c := dial(t, b)
	for e := int64(0); e < 10; e++ {
		if rc, err := c.Add(key, entry(11, e), 0); err != nil || rc != protocol.EOK {
			t.Fatalf("add %d: %v %v", e, rc, err)
		}
	}
	c.Close()
	id := b.ID()
	b.Close(context.Background())
	ctx := context.Background()
	if err := md.Cookies().Delete(ctx, id, metadata.AnyVersion); err != nil {
		t.Fatal(err)
	}
	b = start(t, cfg)
	c = dial(t, b)
	for e := int64(0); e < 10; e++ {
		if rc, got, err := c.Read(11, e); err != nil || rc != protocol.EOK || !bytes.Equal(got, entry(11, e)) {
			t.Fatalf("read 11/%d after the store lost the cookie: %v %v", e, rc, err)
		}
	}
	stored, _, err := md.Cookies().Read(ctx, id)
	if err != nil || !bytes.Equal(stored, b.Engine().Cookie().Encode()) {
		t.Fatalf("the store's cookie after the restart: %q %v", stored, err)
	}
}

// TestEmptiedJournalDirIsRefused: a journal dir emptied while the ledger dirs keep their data
// (and cookies) stops the bookie with a cookie error naming the dir, whether or not the
// metadata store still holds the cookie: entries journaled since the last checkpoint are gone
// with it, so the bookie must not serve its ledgers as if whole (reliability §5.13).
func TestEmptiedJournalDirIsRefused(t *testing.T) {
	for _, storeLostCookie := range []bool{false, true} {
		t.Run(fmt.Sprintf("storeLostCookie=%v", storeLostCookie), func(t *testing.T) {
			uri := metadatatest.URI(t)
			md := metadatatest.Open(t, uri)
			cfg := testConfig(t, uri, t.TempDir())
			b := start(t, cfg)
			c := dial(t, b)
			if rc, err := c.Add(key, entry(12, 0), 0); err != nil || rc != protocol.EOK {
				t.Fatalf("add: %v %v", rc, err)
			}
			c.Close()
			id := b.ID()
			b.Close(context.Background())
			if storeLostCookie {
				if err := md.Cookies().Delete(context.Background(), id, metadata.AnyVersion); err != nil {
					t.Fatal(err)
				}
			}
			jdir := cfg.Engine.JournalDirs[0]
			names, err := os.ReadDir(jdir)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range names {
				if err := os.RemoveAll(filepath.Join(jdir, n.Name())); err != nil {
					t.Fatal(err)
				}
			}
			b2, err := Start(context.Background(), cfg)
			if err == nil {
				b2.Close(context.Background())
				t.Fatal("the bookie started with an emptied journal dir")
			}
			if !errors.Is(err, engine.ErrCookie) || !strings.Contains(err.Error(), jdir) {
				t.Fatalf("start: %v, want a cookie error naming %s", err, jdir)
			}
		})
	}
}

// TestDiskFullWithReadOnlyModeDisabledStops: with readOnlyModeEnabled=false, BookKeeper shuts
// a bookie down where it would turn read-only. A disk that fills past diskUsageThreshold stops
// the bookie (Done, Err is ErrDisksFull, deregistered, port closed), never read-only; a start
// on a full disk fails; an operator cannot force read-only mode.
func TestDiskFullWithReadOnlyModeDisabledStops(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.DiskCheckInterval = 20 * time.Millisecond
	cfg.DiskUsageThreshold, cfg.DiskUsageWarnThreshold, cfg.DiskUsageLwmThreshold = 0.5, 0.4, 0.3
	cfg.ReadOnlyModeEnabled = false
	fs := diskio.NewMem(4096)
	cfg.Engine.FS = fs
	b := start(t, cfg)
	c := dial(t, b)
	if rc, err := c.Add(key, entry(10, 0), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("add: %v %v", rc, err)
	}
	if err := b.SetReadOnly(true); !errors.Is(err, ErrReadOnlyModeDisabled) || b.ReadOnly() {
		t.Fatalf("forced read-only with readOnlyModeEnabled=false: %v, read-only %v", err, b.ReadOnly())
	}
	if code, resp := adminDo(t, b, "PUT", "/api/v1/bookie/state/readonly", strings.NewReader(`{"readOnly": true}`)); code != http.StatusBadRequest || b.ReadOnly() {
		t.Fatalf("admin PUT readOnly=true: %d %s, read-only %v; want 400 and no change", code, resp, b.ReadOnly())
	}

	used := memUsed(t, fs)
	fs.SetCapacity(used + used/2) // about 67% full, room left for a clean shutdown
	select {
	case <-b.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("bookie still running on a full disk with readOnlyModeEnabled=false (read-only %v)", b.ReadOnly())
	}
	if !errors.Is(b.Err(), ErrDisksFull) {
		t.Fatalf("Err %v, want ErrDisksFull", b.Err())
	}
	t.Log(b.Err())
	if b.ReadOnly() {
		t.Fatal("the bookie turned read-only before stopping")
	}
	if all, err := md.Bookies().List(context.Background(), metadata.ListAll); err != nil || len(all) != 0 {
		t.Fatalf("still registered after stopping: %v %v", all, err)
	}
	if c2, err := servertest.Dial(b.Addr().String()); err == nil {
		c2.Close()
		t.Fatal("still listening after stopping")
	}

	// A start on the full disk fails the same way, and registers nothing.
	if b2, err := Start(context.Background(), cfg); !errors.Is(err, ErrDisksFull) {
		if err == nil {
			b2.Close(context.Background())
		}
		t.Fatalf("start on a full disk with readOnlyModeEnabled=false: %v, want ErrDisksFull", err)
	}
	if all, err := md.Bookies().List(context.Background(), metadata.ListAll); err != nil || len(all) != 0 {
		t.Fatalf("registered after a failed start: %v %v", all, err)
	}
}

// TestFailedStorageWithReadOnlyModeDisabledStops: failed storage turns a bookie read-only for
// good; with readOnlyModeEnabled=false it stops instead, with the storage error.
func TestFailedStorageWithReadOnlyModeDisabledStops(t *testing.T) {
	uri := metadatatest.URI(t)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.DiskCheckInterval = 20 * time.Millisecond
	cfg.ReadOnlyModeEnabled = false
	fs := diskio.NewMem(4096)
	cfg.Engine.FS = fs
	b := start(t, cfg)
	c := dial(t, b)
	fs.SetInjector(func(op diskio.Op) error {
		if op.Kind == diskio.OpSync {
			return unix.EIO
		}
		return nil
	})
	if rc, err := c.Add(key, entry(11, 0), 0); err != nil || rc != protocol.EIO {
		t.Fatalf("add with a failing fsync: %v %v, want EIO", rc, err)
	}
	fs.SetInjector(nil)
	select {
	case <-b.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("bookie still running on failed storage with readOnlyModeEnabled=false (read-only %v)", b.ReadOnly())
	}
	if !errors.Is(b.Err(), unix.EIO) {
		t.Fatalf("Err %v, want the storage failure (EIO)", b.Err())
	}
	t.Log(b.Err())
}
