package server

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringkeeper/ringkeeper/net/protocol"
	"github.com/ringkeeper/ringkeeper/net/server/servertest"
)

// histogramSeriesCount is the observations of a histogram's series whose success label is
// success ("true" or "false").
func histogramSeriesCount(t *testing.T, reg *prometheus.Registry, name, success string) uint64 {
	t.Helper()
	for _, m := range gather(t, reg, name).Metric {
		for _, l := range m.Label {
			if l.GetName() == "success" && l.GetValue() == success {
				return m.Histogram.GetSampleCount()
			}
		}
	}
	return 0
}

// TestReadLatencyObservesEveryRead: bookkeeper_server_READ_ENTRY_REQUEST observes every read,
// as BookKeeper's does: those answered from Storage.ReadCached on the reader (the common
// tailing-read case) as successes, and those refused on the reader or by a worker as failures.
func TestReadLatencyObservesEveryRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	env := startEnv(t, withConfig(func(c *Config) { c.Metrics = NewMetrics(reg) }))
	c := env.dial(t)
	mustAdd(t, c, keyA, entry(1, 0, "x"), 0, protocol.EOK)
	for range 3 {
		mustRead(t, c, 1, 0, protocol.EOK)
	}
	if st := env.srv.Stats(); st.CachedReads != 3 {
		t.Fatalf("CachedReads %d, want the 3 reads served from the cache", st.CachedReads)
	}
	if got := histogramSeriesCount(t, reg, "bookkeeper_server_READ_ENTRY_REQUEST", "true"); got != 3 {
		t.Fatalf("bookkeeper_server_READ_ENTRY_REQUEST{success=true} observations = %d after 3 cached reads, want 3", got)
	}
	mustRead(t, c, -1, 0, protocol.EBADREQ)
	if got := histogramSeriesCount(t, reg, "bookkeeper_server_READ_ENTRY_REQUEST", "false"); got != 1 {
		t.Fatalf("bookkeeper_server_READ_ENTRY_REQUEST{success=false} observations = %d after a read answered EBADREQ, want 1", got)
	}
}

// TestReadLatencyObservesWorkerRefusals: a read a worker refuses before reading, its connection
// being over MaxOutboundBytesPerConnection, is observed as a failed read.
func TestReadLatencyObservesWorkerRefusals(t *testing.T) {
	reg := prometheus.NewRegistry()
	env := startEnv(t, withConfig(func(c *Config) {
		c.Metrics = NewMetrics(reg)
		c.MaxFrameSize = 64 << 10
		c.MaxOutboundBytesPerConnection = 1
		c.SocketSendBufferBytes = 4 << 10
	}), withStorage(func(st *servertest.MemStorage) { st.DisableCache = true }))
	c := env.dial(t)
	mustAdd(t, c, keyA, entry(1, 0, string(make([]byte, 32<<10))), 0, protocol.EOK)
	entered, release := blockReads(env.storage)
	defer release()
	nc := dialSmallRecv(t, env.srv.Addr().String())
	var req []byte
	for range 8 {
		req = protocol.AppendReadRequest(req, protocol.ReadRequest{
			Header: protocol.Header{Version: protocol.CurrentVersion}, LedgerID: 1, EntryID: 0})
	}
	if _, err := nc.Write(req); err != nil {
		t.Fatal(err)
	}
	// Every read decoded (held in storage, or refused at once) before any is answered: once a
	// response is queued over the outbound limit the reader stops decoding the rest.
	<-entered
	eventually(t, 5*time.Second, "8 reads decoded", func() bool {
		st := env.srv.Stats()
		return st.ReadsInFlight+st.Rejected == 8
	})
	release() // the first read goes out; the others find a backlog over the limit of 1 byte
	// No reads in flight is not enough: the later requests may not have been decoded yet.
	var ok, failed uint64
	eventually(t, 5*time.Second, "8 reads observed", func() bool {
		ok = histogramSeriesCount(t, reg, "bookkeeper_server_READ_ENTRY_REQUEST", "true")
		failed = histogramSeriesCount(t, reg, "bookkeeper_server_READ_ENTRY_REQUEST", "false")
		return ok+failed == 8 && env.srv.Stats().ReadsInFlight == 0
	})
	st := env.srv.Stats()
	if st.Rejected == 0 || failed < uint64(st.Rejected) {
		t.Fatalf("8 reads, %d refused: observed %d successes and %d failures", st.Rejected, ok, failed)
	}
}

// TestAddLatencyObservesRefusedAdds: adds answered at once on the reader (EREADONLY on a
// read-only bookie, EBADREQ, ETOOMANYREQUESTS) are observed in
// bookkeeper_server_ADD_ENTRY_REQUEST{success="false"}, as BookKeeper's WriteEntryProcessor
// records them.
func TestAddLatencyObservesRefusedAdds(t *testing.T) {
	reg := prometheus.NewRegistry()
	env := startEnv(t, withConfig(func(c *Config) { c.Metrics = NewMetrics(reg); c.MaxPendingAddRequestsPerThread = 1 }))
	c := env.dial(t)
	failed := func() uint64 {
		return histogramSeriesCount(t, reg, "bookkeeper_server_ADD_ENTRY_REQUEST", "false")
	}
	env.storage.SetReadOnly(true)
	for i := range int64(3) {
		mustAdd(t, c, keyA, entry(1, i, "x"), 0, protocol.EREADONLY)
	}
	if got := failed(); got != 3 {
		t.Fatalf("ADD_ENTRY_REQUEST{success=false} observations = %d after 3 adds answered EREADONLY, want 3", got)
	}
	env.storage.SetReadOnly(false)
	mustAdd(t, c, keyA, entry(-1, 0, "x"), 0, protocol.EBADREQ)
	if got := failed(); got != 4 {
		t.Fatalf("ADD_ENTRY_REQUEST{success=false} observations = %d after an add answered EBADREQ, want 4", got)
	}
	env.storage.Hold()
	_ = c.SendAdd(keyA, entry(1, 0, "x"), 0)
	_ = c.SendAdd(keyA, entry(1, 1, "x"), 0)
	_ = c.Flush()
	if resp, err := c.Recv(); err != nil || resp.Add.RC != protocol.ETOOMANYREQUESTS {
		t.Fatalf("want ETOOMANYREQUESTS first, got %+v %v", resp.Add, err)
	}
	if got := failed(); got != 5 {
		t.Fatalf("ADD_ENTRY_REQUEST{success=false} observations = %d after an add answered ETOOMANYREQUESTS, want 5", got)
	}
	env.storage.Release()
	if resp, err := c.Recv(); err != nil || resp.Add.RC != protocol.EOK {
		t.Fatalf("held add: %+v %v", resp.Add, err)
	}
	if ok := histogramSeriesCount(t, reg, "bookkeeper_server_ADD_ENTRY_REQUEST", "true"); ok != 1 {
		t.Fatalf("ADD_ENTRY_REQUEST{success=true} observations = %d, want 1", ok)
	}
}

// TestReadRejectedCountsStorageTooManyRequests: a read answered ETOOMANYREQUESTS because
// Storage's error maps to it is counted in bookkeeper_server_READ_ENTRY_REJECTED, as an add is.
func TestReadRejectedCountsStorageTooManyRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	env := startEnv(t, withConfig(func(c *Config) {
		c.Metrics = NewMetrics(reg)
		c.ErrorCode = func(error) protocol.ReturnCode { return protocol.ETOOMANYREQUESTS }
	}))
	c := env.dial(t)
	mustRead(t, c, 1, 0, protocol.ETOOMANYREQUESTS) // no such entry: Storage.Read fails
	if got := metricValue(t, reg, "bookkeeper_server_READ_ENTRY_REJECTED"); got != 1 || env.srv.Stats().Rejected != 1 {
		t.Fatalf("READ_ENTRY_REJECTED %v, Rejected %d after a read answered ETOOMANYREQUESTS, want 1", got, env.srv.Stats().Rejected)
	}
}
