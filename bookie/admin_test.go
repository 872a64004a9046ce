package bookie

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
)

// adminDo sends an admin request and returns the status and body.
func adminDo(t *testing.T, b *Bookie, method, path string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+b.HTTPAddr()+path, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// An admin request body is bounded (maxAdminBody): a larger one is refused (413) and changes
// nothing. Bodies were read whole, any size, and acted on.
func TestAdminBodyIsBounded(t *testing.T) {
	b := start(t, testConfig(t, metadatatest.URI(t), t.TempDir()))
	const pad = 32 << 20
	padding := strings.Repeat("a", pad) // made before measuring: the client's share
	body := io.MultiReader(strings.NewReader(`{"pad": "`), strings.NewReader(padding),
		strings.NewReader(`", "readOnly": true}`))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	code, resp := adminDo(t, b, "PUT", "/api/v1/bookie/state/readonly", body)
	runtime.ReadMemStats(&after)
	t.Logf("PUT of a %d MiB body: %d %q; the process (the bookie's HTTP handler, mostly) allocated %d MiB meanwhile", pad>>20, code, strings.TrimSpace(resp),
		(after.TotalAlloc-before.TotalAlloc)>>20)
	if code != http.StatusRequestEntityTooLarge && code != http.StatusBadRequest {
		t.Errorf("a %d MiB admin request body was accepted (%d), want 413 or 400", pad>>20, code)
	}
	if b.ReadOnly() {
		t.Errorf("the oversized request changed the bookie's state")
	}
}

// A body that is not exactly one JSON value is refused and changes nothing (the decoder used to
// stop after the first value and act on it).
func TestAdminReadOnlyTrailingGarbageRefused(t *testing.T) {
	b := start(t, testConfig(t, metadatatest.URI(t), t.TempDir()))
	code, resp := adminDo(t, b, "PUT", "/api/v1/bookie/state/readonly", strings.NewReader(`{"readOnly": true} rm -rf /`))
	if code != http.StatusBadRequest || b.ReadOnly() {
		t.Fatalf("body %q: answered %d %q, readOnly now %v; want 400 and no change",
			`{"readOnly": true} rm -rf /`, code, strings.TrimSpace(resp), b.ReadOnly())
	}
}

// A body without "readOnly" (a typo, another API's body, {} or null) is refused and changes
// nothing: it was taken as {"readOnly": false} and turned a forced read-only bookie writable.
func TestAdminReadOnlyBodyWithoutTheFieldChangesNothing(t *testing.T) {
	b := start(t, testConfig(t, metadatatest.URI(t), t.TempDir()))
	b.SetReadOnly(true)
	for _, body := range []string{`{"readOnyl": true}`, `{"state": "readonly"}`, `{}`, `null`} {
		code, resp := adminDo(t, b, "PUT", "/api/v1/bookie/state/readonly", strings.NewReader(body))
		if code == http.StatusOK || !b.ReadOnly() {
			t.Errorf("body %s: answered %d %q; readOnly now %v (want 400 and still read-only)", body, code,
				strings.TrimSpace(resp), b.ReadOnly())
			b.SetReadOnly(true)
		}
	}
}

// A suspend or resume body that names both kinds as false acts on neither (the "names neither
// kind applies to both" rule looked at the values, not at whether the keys were given).
func TestAdminSuspendCompactionExplicitFalse(t *testing.T) {
	b := start(t, testConfig(t, metadatatest.URI(t), t.TempDir()))
	code, resp := adminDo(t, b, "PUT", "/api/v1/bookie/gc/suspend_compaction",
		strings.NewReader(`{"suspendMajor": false, "suspendMinor": false}`))
	st := b.eng.GCStatus()
	if st.MajorSuspended || st.MinorSuspended {
		t.Errorf(`suspend {"suspendMajor": false, "suspendMinor": false}: %d %q; major suspended %v, minor suspended %v`,
			code, strings.TrimSpace(resp), st.MajorSuspended, st.MinorSuspended)
	}
	b.eng.SuspendCompaction(true, true)
	code, resp = adminDo(t, b, "PUT", "/api/v1/bookie/gc/resume_compaction",
		strings.NewReader(`{"resumeMajor": false, "resumeMinor": false}`))
	st = b.eng.GCStatus()
	if !st.MajorSuspended || !st.MinorSuspended {
		t.Errorf(`resume {"resumeMajor": false, "resumeMinor": false}: %d %q; major suspended %v, minor suspended %v`,
			code, strings.TrimSpace(resp), st.MajorSuspended, st.MinorSuspended)
	}
}

// flakyRegistration fails the next n Updates, as a metadata store briefly unreachable would.
type flakyRegistration struct {
	metadata.Registration
	fail atomic.Int32
}

func (f *flakyRegistration) Update(ctx context.Context, info metadata.BookieInfo) error {
	if f.fail.Add(-1) >= 0 {
		return errors.New("etcdserver: request timed out")
	}
	return f.Registration.Update(ctx, info)
}

// When moving the registration fails once (a metadata store blip), the bookie is read-only at
// once and the registration follows when the store answers again (the disk checker retries
// it); the admin call says the registration lagged (503). Nothing retried it before: the
// bookie refused adds while registered writable for good, and the call answered 200.
func TestReadOnlyReachesTheRegistryAfterAFailedUpdate(t *testing.T) {
	uri := metadatatest.URI(t)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.DiskCheckInterval = 50 * time.Millisecond
	b := start(t, cfg)
	flaky := &flakyRegistration{}
	b.stateMu.Lock()
	flaky.Registration = b.reg
	b.reg = flaky
	b.stateMu.Unlock()
	flaky.fail.Store(1)

	code, resp := adminDo(t, b, "PUT", "/api/v1/bookie/state/readonly", strings.NewReader(`{"readOnly": true}`))
	if code != http.StatusServiceUnavailable {
		t.Errorf("PUT readOnly true while the registry update fails: %d %s, want 503", code, strings.TrimSpace(resp))
	}
	if !b.ReadOnly() {
		t.Fatal("the bookie did not turn read-only")
	}
	md := metadatatest.Open(t, uri)
	deadline := time.Now().Add(3 * time.Second)
	for {
		ro, err := md.Bookies().List(context.Background(), metadata.ListReadOnly)
		if err == nil && len(ro) == 1 {
			return
		}
		if time.Now().After(deadline) {
			w, _ := md.Bookies().List(context.Background(), metadata.ListWritable)
			t.Fatalf("3 s later the bookie refuses adds (read-only) but the registry still lists it writable: "+
				"writable %v, read-only %v; the admin call answered %d", ids(w), ids(ro), code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ids(bs []metadata.BookieInfo) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return out
}

// The journal's, the storage's and the garbage collector's series carry BookKeeper's
// Prometheus names (bookie_journal_*, bookie_*), so that BookKeeper dashboards read them; they
// were exported under bookkeeper_server_, which is only the request processor's scope.
func TestMetricNamesAreBookKeepers(t *testing.T) {
	b := start(t, testConfig(t, metadatatest.URI(t), t.TempDir()))
	code, body := adminDo(t, b, "GET", "/metrics", nil)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
	for ours, bk := range map[string]string{
		"bookkeeper_server_JOURNAL_SYNC":                      "bookie_journal_JOURNAL_SYNC",
		"bookkeeper_server_JOURNAL_QUEUE_LATENCY":             "bookie_journal_JOURNAL_QUEUE_LATENCY",
		"bookkeeper_server_JOURNAL_FORCE_WRITE_BATCH_ENTRIES": "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
		"bookkeeper_server_WRITE_CACHE_SIZE":                  "bookie_write_cache_size",
		"bookkeeper_server_THROTTLED_WRITE_total":             "bookie_throttled_write_requests",
		"bookkeeper_server_MAJOR_COMPACTION_total":            "bookie_gc_MAJOR_COMPACTION_COUNT",
		"bookkeeper_server_REJECTED_WRITE_total":              "bookie_rejected_write_requests",
		"bookkeeper_server_DELETED_LEDGER_total":              "bookie_DELETED_LEDGER_COUNT",
	} {
		if !strings.Contains(body, "\n"+bk) {
			t.Errorf("no %s (BookKeeper's name); ours is %s (present: %v)", bk, ours, strings.Contains(body, "\n"+ours))
		}
	}
}

// The metrics and admin server cuts off a client that sends half a request or idles: it held a
// goroutine and its buffers for ever.
func TestHTTPServerHasTimeouts(t *testing.T) {
	b := start(t, testConfig(t, metadatatest.URI(t), t.TempDir()))
	if b.http.ReadHeaderTimeout <= 0 && b.http.ReadTimeout <= 0 {
		t.Fatalf("http.Server has ReadHeaderTimeout %v, ReadTimeout %v: a slow or idle client is never cut off",
			b.http.ReadHeaderTimeout, b.http.ReadTimeout)
	}
}

// The GC routes ignore fields they do not know, as BookKeeper's do (they read the body into a
// map), while PUT state/readonly refuses them, as BookKeeper's does.
func TestAdminGCRoutesIgnoreUnknownFields(t *testing.T) {
	b := start(t, testConfig(t, metadatatest.URI(t), t.TempDir()))
	if code, resp := adminDo(t, b, "PUT", "/api/v1/bookie/gc", strings.NewReader(`{"forceMajor": true, "extra": 1}`)); code != http.StatusOK {
		t.Errorf("gc with an unknown field: %d %s", code, strings.TrimSpace(resp))
	}
	if code, _ := adminDo(t, b, "PUT", "/api/v1/bookie/state/readonly", strings.NewReader(`{"readOnly": true, "extra": 1}`)); code != http.StatusBadRequest || b.ReadOnly() {
		t.Errorf("readonly with an unknown field: %d, read-only %v; want 400 and no change", code, b.ReadOnly())
	}
}
