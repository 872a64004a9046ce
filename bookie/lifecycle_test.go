package bookie

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// TestFailedStartLeavesNoCookieInTheStore: a new bookie that cannot listen (its port is taken)
// never served, so it holds no data; it must not leave its cookie in the metadata store. It
// wrote the cookie before it listened, and the cookie stayed: a new bookie under that id on
// other (empty) dirs was refused as a bookie whose disks were wiped (and a standalone cluster,
// which moves such a bookie to another port, left the stale cookie behind).
func TestFailedStartLeavesNoCookieInTheStore(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := taken.Addr().(*net.TCPAddr).Port
	cfg := testConfig(t, uri, t.TempDir())
	cfg.BookiePort = port
	if b, err := Start(context.Background(), cfg); err == nil {
		b.Close(context.Background())
		taken.Close()
		t.Fatal("started on a taken port")
	}
	taken.Close()
	id := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if stored, _, err := md.Cookies().Read(context.Background(), id); !errors.Is(err, metadata.ErrNoSuchCookie) {
		t.Errorf("after a start that never listened, the store holds a cookie for %s: %q (err %v)", id, stored, err)
	}
	// The same id, the port free now, new dirs: a new bookie.
	fresh := testConfig(t, uri, t.TempDir())
	fresh.BookiePort = port
	b, err := Start(context.Background(), fresh)
	if err != nil {
		t.Fatalf("a new bookie under the id of one that never served: %v", err)
	}
	b.Close(context.Background())
}

// TestDirsOfAnotherRunAreRefused: the metadata store's cookie names the dirs the bookie last ran
// on; the bookie, same id and cluster, is pointed at other dirs whose cookies are its own from
// an earlier run (an old disk set, a config reverted). BookKeeper refuses it (the cookies'
// directories differ): it would serve the old dirs' data as its current data, without the
// ledgers it stored since. Start instead overwrote the store's cookie with the new dirs and
// served.
func TestDirsOfAnotherRunAreRefused(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	ctx := context.Background()
	port := freePort(t)
	old := testConfig(t, uri, t.TempDir())
	old.BookiePort = port
	b := start(t, old) // the earlier run, on the old dirs
	id := b.ID()
	b.Close(ctx)
	// The store forgot the cookie (TestCookieMissingFromTheMetadataStore), the bookie then ran
	// on a new set of dirs and stored ledger 21 there.
	if err := md.Cookies().Delete(ctx, id, metadata.AnyVersion); err != nil {
		t.Fatal(err)
	}
	cur := testConfig(t, uri, t.TempDir())
	cur.BookiePort = port
	b = start(t, cur)
	c := dial(t, b)
	if rc, err := c.Add(key, entry(21, 0), 0); err != nil || rc != protocol.EOK {
		t.Fatalf("add: %v %v", rc, err)
	}
	c.Close()
	want := b.Engine().Cookie().Encode()
	b.Close(ctx)

	b, err := Start(ctx, old)
	if err == nil {
		b.Close(ctx)
		t.Fatal("the bookie started on the dirs of an earlier run, not those the store's cookie names")
	}
	if !errors.Is(err, engine.ErrCookie) {
		t.Errorf("start on the old dirs: %v, want engine.ErrCookie", err)
	}
	if stored, _, err := md.Cookies().Read(ctx, id); err != nil || !bytes.Equal(stored, want) {
		t.Errorf("the store's cookie after the refused start: %q %v, want the current dirs' %q", stored, err, want)
	}
}

// TestReadOnlyForcedBeforeRegistrationIsRegistered: the admin API serves before the bookie has
// registered (Register waits while a previous process's lease on the id lives, as after a
// kill -9). An operator forcing read-only then got 200 and the bookie turned read-only, but the
// registration filed it writable (its info was taken before) and nothing ever corrected it:
// clients went on choosing it for new ensembles, each add failing with EREADONLY.
func TestReadOnlyForcedBeforeRegistrationIsRegistered(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	ctx := context.Background()
	cfg := testConfig(t, uri, t.TempDir())
	cfg.PrometheusStatsHTTPPort = freePort(t)
	cfg.RegistrationTTL = 10 * time.Second
	id := net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.BookiePort))
	// The previous process's registration, its lease still alive.
	prev, err := md.Bookies().Register(ctx, metadata.BookieInfo{ID: id, State: metadata.BookieWritable,
		Endpoints: []metadata.Endpoint{{ID: metadata.EndpointBookie, Protocol: "bookie-rpc", Host: "127.0.0.1", Port: cfg.BookiePort}}}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		b   *Bookie
		err error
	}
	started := make(chan result, 1)
	go func() {
		b, err := Start(ctx, cfg)
		started <- result{b, err}
	}()
	url := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.PrometheusStatsHTTPPort)) + "/api/v1/bookie/state/readonly"
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest("PUT", url, strings.NewReader(`{"readOnly": true}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("PUT readonly while registering: %d", resp.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admin API never answered: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	prev.Close(ctx) // the old lease goes: the new bookie registers
	r := <-started
	if r.err != nil {
		t.Fatal(r.err)
	}
	b := r.b
	t.Cleanup(func() { b.Close(ctx) })
	if !b.ReadOnly() {
		t.Fatal("the forced read-only mode was lost")
	}
	waitReadOnly(t, b, md, true)
}
