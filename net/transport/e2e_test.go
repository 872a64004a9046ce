package transport

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/bookie"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// TestRealBookie runs the transport against a real bookie (engine with journal fsyncs,
// embedded etcd), with token authentication: pipelined adds, reads, a fencing read.
func TestRealBookie(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and a bookie")
	}
	dir := t.TempDir()
	cfg := bookie.DefaultConfig()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.BookiePort = ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cfg.ListenAddress = "127.0.0.1"
	cfg.MetadataServiceURI = metadatatest.URI(t)
	cfg.PrometheusStatsHTTPPort = -1
	cfg.RegistrationTTL = 2 * time.Second
	cfg.AuthToken = "real-token"
	cfg.Engine.JournalDirs = []string{filepath.Join(dir, "journal")}
	cfg.Engine.LedgerDirs = []string{filepath.Join(dir, "ledgers")}
	cfg.Engine.WriteCacheMaxSize = 32 << 20
	cfg.Engine.ReadAheadCacheMaxSize = 8 << 20
	cfg.Engine.IndexBlockCacheSize = 8 << 20
	cfg.Engine.Journal.MaxFileSize = 64 << 20
	cfg.Server.NumEventLoops = 2
	cfg.Logger = testLogger()
	bk, err := bookie.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bk.Close(context.Background()) })

	p := newPool(t, Config{AuthPlugin: server.TokenAuthPluginName, AuthPayload: []byte("real-token")})
	conn := p.Conn(bk.Addr().String())
	const n = 2000
	col := newCollector(n)
	for e := range int64(n) {
		conn.Add(1, e, &keyA, 0, parts(1, e, payloadOf(1, e, 512)), col.onAdd, e)
	}
	for i, r := range col.wait(t, n) {
		if r.err != nil || r.rc != protocol.EOK || r.ctx != int64(i) {
			t.Fatalf("add %v: rc %v err %v (callback %d)", r.ctx, r.rc, r.err, i)
		}
	}
	for e := range int64(n) {
		conn.Read(1, e, 0, nil, col.onRead, e)
	}
	for _, r := range col.wait(t, n) {
		e := r.ctx.(int64)
		if r.err != nil || r.rc != protocol.EOK || !bytes.Equal(r.entry, servertest.Entry(1, e, e-1, payloadOf(1, e, 512))) {
			t.Fatalf("read %d: rc %v err %v", e, r.rc, r.err)
		}
	}
	conn.Read(1, protocol.LastAddConfirmedEntryID, protocol.FlagDoFencing, &keyA, col.onRead, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EOK || !bytes.Equal(r.entry, servertest.Entry(1, n-1, n-2, payloadOf(1, n-1, 512))) {
		t.Fatalf("fencing read: rc %v err %v", r.rc, r.err)
	}
	conn.Add(1, n, &keyA, 0, parts(1, n, nil), col.onAdd, nil)
	if r := col.one(t); r.err != nil || r.rc != protocol.EFENCED {
		t.Fatalf("add after fencing: rc %v err %v", r.rc, r.err)
	}
	st := conn.Stats()
	t.Logf("real bookie: %d requests in %d writes", st.Requests, st.Writes)
}
