package bookie

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/internal/diskio"
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

// listingStore is the metadata store with a listing that lacks some ledgers (an empty listing
// when keep is nil); point reads see every ledger.
type listingStore struct {
	metadata.LedgerStore
	keep func(id int64) bool
}

func (s listingStore) List(ctx context.Context, start int64, limit int) ([]int64, bool, error) {
	ids, more, err := s.LedgerStore.List(ctx, start, limit)
	var kept []int64
	for _, id := range ids {
		if s.keep != nil && s.keep(id) {
			kept = append(kept, id)
		}
	}
	return kept, more && len(kept) > 0, err
}

// TestGCWithAnIncompleteListingDeletesNoLiveLedger runs the engine's garbage collector on the
// bookie's ledgerChecker over a real metadata store whose listing lacks live ledgers (or lists
// none): only the ledger a point read finds gone is deleted; every other ledger's entries read
// back, after compaction and after a restart (reliability §5.12, BookKeeper #870).
func TestGCWithAnIncompleteListingDeletesNoLiveLedger(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	ctx := context.Background()
	var ids []int64
	for range 6 {
		id, _, err := metadata.CreateLedger(ctx, md, metadatatest.Ledger())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	gone, live := ids[0], ids[1:]
	if err := md.Ledgers().Delete(ctx, gone, metadata.AnyVersion); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		keep func(int64) bool
	}{
		{"empty listing", nil},
		{"listing lacks live ledgers", func(id int64) bool { return id != ids[2] && id != ids[4] }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, uri, t.TempDir())
			ecfg := cfg.Engine
			ecfg.FS = diskio.NewMem(4096)
			ecfg.BookieID, ecfg.InstanceID = "127.0.0.1:3181", "test-instance"
			ecfg.Journal.MaxRecordSize = 64 << 10
			ecfg.EntryLogSizeLimit = 1 << 20 // several logs, so compaction has work
			ecfg.GC.WaitTime = time.Hour
			ecfg.GC.MetadataOpRate = 0
			ecfg.GC.ForceAllowWhenNoSpace = true
			ecfg.GC.MajorThreshold = 0.9 // the logs end up 5/6 live
			ecfg.GC.Checker = ledgerChecker{listingStore{md.Ledgers(), tc.keep}}
			e, err := engine.Open(ecfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { e.Close() }()
			const n = 600
			for en := int64(0); en < n; en++ {
				for _, id := range ids {
					done := make(chan error, 1)
					if err := e.Add(key[:], entry(id, en), false, func(_ any, err error) { done <- err }, nil); err != nil {
						t.Fatal(err)
					}
					if err := <-done; err != nil {
						t.Fatal(err)
					}
				}
				if en%100 == 99 {
					if err := e.Checkpoint(); err != nil {
						t.Fatal(err)
					}
				}
			}
			check := func(when string) {
				t.Helper()
				for _, id := range live {
					for en := int64(0); en < n; en++ {
						if got, err := e.Read(id, en, nil); err != nil || !bytes.Equal(got, entry(id, en)) {
							t.Fatalf("%s: live ledger %d entry %d: %v", when, id, en, err)
						}
					}
				}
				if _, err := e.Read(gone, 0, nil); !errors.Is(err, engine.ErrNoLedger) {
					t.Fatalf("%s: ledger %d gone from metadata: read gives %v", when, gone, err)
				}
			}
			if err := e.RunGC(ctx, &engine.GCRequest{ForceMajor: true}); err != nil {
				t.Fatal(err)
			}
			check("after gc")
			// Not vacuous: the run deleted the gone ledger and compacted logs.
			if st := e.GCStatus(); st.DeletedLedgers != 1 || st.RemovedLogs+st.CompactedLogs == 0 {
				t.Fatalf("gc: deleted %d ledgers, removed %d and compacted %d logs; want 1 ledger deleted and logs reclaimed",
					st.DeletedLedgers, st.RemovedLogs, st.CompactedLogs)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if e, err = engine.Open(ecfg); err != nil {
				t.Fatal(err)
			}
			check("after a restart")
		})
	}
}

// foreignKeysStore answers List as the etcd driver does when keys under the ledgers prefix
// are not ledger keys.
type foreignKeysStore struct {
	metadata.LedgerStore
	foreign metadata.ForeignLedgerKeysError
}

func (s foreignKeysStore) List(ctx context.Context, start int64, limit int) ([]int64, bool, error) {
	ids, more, err := s.LedgerStore.List(ctx, start, limit)
	if err != nil {
		return nil, false, err
	}
	f := s.foreign
	return ids, more, &f
}

// TestGCListingWithForeignLedgerKeys: a key that names a ledger id in another width keeps that
// ledger and lets the others be collected; a key that names no id skips deletion.
func TestGCListingWithForeignLedgerKeys(t *testing.T) {
	uri := metadatatest.URI(t)
	md := metadatatest.Open(t, uri)
	ctx := context.Background()
	var ids []int64
	for range 2 {
		id, _, err := metadata.CreateLedger(ctx, md, metadatatest.Ledger())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	listed := map[int64]bool{}
	c := ledgerChecker{foreignKeysStore{md.Ledgers(), metadata.ForeignLedgerKeysError{IDs: []int64{77}}}}
	if err := c.ListLedgers(ctx, func(id int64) { listed[id] = true }); err != nil {
		t.Fatalf("list with a foreign key naming ledger 77: %v", err)
	}
	if !listed[ids[0]] || !listed[ids[1]] || !listed[77] || len(listed) != 3 {
		t.Fatalf("listed %v, want %v and 77", listed, ids)
	}
	c = ledgerChecker{foreignKeysStore{md.Ledgers(), metadata.ForeignLedgerKeysError{Unnamed: []string{"/x/ledgers/L0042"}}}}
	if err := c.ListLedgers(ctx, func(int64) {}); !errors.Is(err, metadata.ErrCorruptMetadata) || !strings.Contains(err.Error(), "L0042") {
		t.Fatalf("list with a key naming no id: %v, want an error naming it", err)
	}
}
