package bookie

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/metadata"
	"github.com/ringkeeper/ringkeeper/metadata/metadatatest"
	"github.com/ringkeeper/ringkeeper/net/protocol"
)

// adminJSON sends an admin request and decodes the JSON answer into out.
func adminJSON(t *testing.T, b *Bookie, method, path, body string, out any) {
	t.Helper()
	code, resp := adminDo(t, b, method, path, strings.NewReader(body))
	if code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, code, resp)
	}
	if err := json.Unmarshal([]byte(resp), out); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
}

// TestGarbageCollectionFollowsTheMetadataStore deletes ledgers from the metadata store,
// triggers garbage collection through the admin API and checks that exactly those ledgers are
// gone from the bookie; it also drives the suspend and resume endpoints.
func TestGarbageCollectionFollowsTheMetadataStore(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	cfg := testConfig(t, uri, t.TempDir())
	cfg.Engine.GC.ForceAllowWhenNoSpace = true // however full the test machine's disk is
	b := start(t, cfg)
	c := dial(t, b)
	ctx := context.Background()
	var ids []int64
	for range 6 {
		id, _, err := metadata.CreateLedger(ctx, md, metadatatest.Ledger(b.ID()))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		for e := int64(0); e < 10; e++ {
			if rc, err := c.Add(key, entry(id, e), 0); err != nil || rc != protocol.EOK {
				t.Fatalf("add %d/%d: %v %v", id, e, rc, err)
			}
		}
	}
	gone, live := ids[:4], ids[4:]
	for _, id := range gone {
		if err := md.Ledgers().Delete(ctx, id, metadata.AnyVersion); err != nil {
			t.Fatal(err)
		}
	}
	var trig map[string]any
	adminJSON(t, b, "PUT", "/api/v1/bookie/gc", `{"forceMajor": "true"}`, &trig)
	if trig["triggered"] != true || trig["forceMajor"] != true {
		t.Fatalf("trigger answered %v", trig)
	}
	deadline := time.Now().Add(20 * time.Second)
	var st engine.GCStatus
	for {
		adminJSON(t, b, "GET", "/api/v1/bookie/gc_details", "", &st)
		if st.Runs > 0 && !st.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the triggered run did not finish: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st.DeletedLedgers != uint64(len(gone)) || st.MajorCompactions != 1 {
		t.Fatalf("gc details %+v", st)
	}
	resp, err := http.Get("http://" + b.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	scraped, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(scraped), "bookie_DELETED_LEDGER_COUNT 4") {
		t.Errorf("/metrics lacks the deleted ledgers")
	}
	var inForce map[string]string
	adminJSON(t, b, "GET", "/api/v1/bookie/gc", "", &inForce)
	if inForce["is_in_force_gc"] != "false" {
		t.Fatalf("is_in_force_gc after the run: %v", inForce)
	}
	for _, id := range gone {
		if rc, _, err := c.Read(id, 0); err != nil || rc != protocol.ENOLEDGER {
			t.Fatalf("ledger %d deleted from metadata: read %v %v", id, rc, err)
		}
	}
	for _, id := range live {
		for e := int64(0); e < 10; e++ {
			if rc, _, err := c.Read(id, e); err != nil || rc != protocol.EOK {
				t.Fatalf("live ledger %d entry %d: %v %v", id, e, rc, err)
			}
		}
	}

	var susp map[string]bool
	adminJSON(t, b, "PUT", "/api/v1/bookie/gc/suspend_compaction", `{"suspendMajor": true}`, &susp)
	if !susp["isMajorGcSuspended"] || susp["isMinorGcSuspended"] {
		t.Fatalf("suspend major: %v", susp)
	}
	adminJSON(t, b, "PUT", "/api/v1/bookie/gc/suspend_compaction", ``, &susp)
	if !susp["isMajorGcSuspended"] || !susp["isMinorGcSuspended"] {
		t.Fatalf("suspend both: %v", susp)
	}
	adminJSON(t, b, "PUT", "/api/v1/bookie/gc/resume_compaction", `{"resumeMinor": "true"}`, &susp)
	if !susp["isMajorGcSuspended"] || susp["isMinorGcSuspended"] {
		t.Fatalf("resume minor: %v", susp)
	}
	adminJSON(t, b, "GET", "/api/v1/bookie/gc/suspend_compaction", "", &susp)
	if !susp["isMajorGcSuspended"] {
		t.Fatalf("suspension state: %v", susp)
	}
	if st := b.Engine().GCStatus(); !st.MajorSuspended || st.MinorSuspended {
		t.Fatalf("engine suspension state %+v", st)
	}
}

func TestGCConfigKeys(t *testing.T) {
	props, err := ParseProperties(strings.NewReader(`
gcWaitTime=1000
minorCompactionThreshold=0.1
minorCompactionInterval=60
majorCompactionThreshold=0.7
majorCompactionInterval=600
compactionRateByBytes=2000000
majorCompactionMaxTimeMillis=5000
minorCompactionMaxTimeMillis=-1
gcMetadataOpRateLimit=50
isForceGCAllowWhenNoSpace=true
isThrottleByBytes=true
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	warnings, err := cfg.Apply(props)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("apply: %v %v", warnings, err)
	}
	gc := cfg.Engine.GC
	want := engine.GCConfig{
		WaitTime: time.Second, MinorThreshold: 0.1, MinorInterval: time.Minute, MajorThreshold: 0.7,
		MajorInterval: 10 * time.Minute, RateBytes: 2000000, MajorMaxTime: 5 * time.Second, MinorMaxTime: -time.Millisecond,
		MetadataOpRate: 50, MetadataOpTimeout: gc.MetadataOpTimeout, DiskUsageWarnThreshold: gc.DiskUsageWarnThreshold,
		DiskUsageThreshold: gc.DiskUsageThreshold, ForceAllowWhenNoSpace: true,
	}
	if gc != want {
		t.Fatalf("gc config %+v, want %+v", gc, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Engine.GC.MinorThreshold = 0.9
	if err := cfg.Validate(); err == nil {
		t.Fatal("a minor threshold above the major one was accepted")
	}
}
