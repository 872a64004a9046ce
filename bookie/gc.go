package bookie

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/metadata"
)

// ledgerChecker answers the garbage collector's questions from the metadata store: a ledger is
// gone only when a point read says there is no such ledger.
type ledgerChecker struct{ ledgers metadata.LedgerStore }

// listPage is how many ledger ids one List call returns.
const listPage = 1000

// LedgerExists implements engine.LedgerChecker. Metadata that exists but does not decode counts
// as existing.
func (c ledgerChecker) LedgerExists(ctx context.Context, id int64) (bool, error) {
	_, _, err := c.ledgers.Read(ctx, id)
	switch {
	case err == nil, errors.Is(err, metadata.ErrCorruptMetadata), errors.Is(err, metadata.ErrUnsupportedFormat):
		return true, nil
	case errors.Is(err, metadata.ErrNoSuchLedger):
		return false, nil
	}
	return false, err
}

// ListLedgers implements engine.LedgerLister: every ledger id, page by page. A foreign key that
// names an id (another width) lists that id, so its ledger is kept: its metadata may be there. A
// key that names no id fails the listing, so that no ledger is deleted while it exists: it may
// be a ledger's metadata in another layout (a restore, another tool), and no point read finds it.
func (c ledgerChecker) ListLedgers(ctx context.Context, fn func(int64)) error {
	for start := int64(0); ; {
		ids, more, err := c.ledgers.List(ctx, start, listPage)
		var foreign *metadata.ForeignLedgerKeysError
		if errors.As(err, &foreign) && len(foreign.Unnamed) == 0 {
			for _, id := range foreign.IDs {
				fn(id)
			}
			err = nil
		}
		if foreign != nil && err != nil {
			return fmt.Errorf("%w (no ledger is deleted until the keys are removed or repaired)", err)
		}
		if err != nil {
			return err
		}
		for _, id := range ids {
			fn(id)
		}
		if more && len(ids) == 0 {
			// A page of foreign keys only: the listing cannot go past it.
			return fmt.Errorf("%w: a page of %d foreign keys under the ledgers prefix from ledger %d", metadata.ErrCorruptMetadata, listPage, start)
		}
		if !more {
			return nil
		}
		start = ids[len(ids)-1] + 1
	}
}

// flag is a JSON boolean that BookKeeper's admin API also sends as a string ("true").
type flag bool

func (f *flag) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseBool(strings.Trim(string(b), `"`))
	if err != nil {
		return fmt.Errorf("%s is not a boolean", b)
	}
	*f = flag(v)
	return nil
}

// addGCRoutes serves BookKeeper's garbage-collection admin API:
//
//	PUT /api/v1/bookie/gc                    trigger a run: {"forceMajor": true, "forceMinor": true}
//	GET /api/v1/bookie/gc                    {"is_in_force_gc": "true"|"false"}
//	GET /api/v1/bookie/gc_details            the garbage collector's state (engine.GCStatus)
//	PUT /api/v1/bookie/gc/suspend_compaction {"suspendMajor": true, "suspendMinor": true}
//	PUT /api/v1/bookie/gc/resume_compaction  {"resumeMajor": true, "resumeMinor": true}
//	GET /api/v1/bookie/gc/suspend_compaction, resume_compaction: the suspensions
//
// A suspend or resume body that names neither kind (or is empty) applies to both; one that names
// a kind acts on the kinds set to true only.
func (b *Bookie) addGCRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /api/v1/bookie/gc", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ForceMajor flag `json:"forceMajor"`
			ForceMinor flag `json:"forceMinor"`
		}
		if err := decodeBody(w, r, &req, bodyOptional); err != nil {
			badBody(w, `{"forceMajor": bool, "forceMinor": bool}`, err)
			return
		}
		b.eng.TriggerGC(engine.GCRequest{ForceMajor: bool(req.ForceMajor), ForceMinor: bool(req.ForceMinor)})
		writeJSON(w, map[string]any{"triggered": true, "forceMajor": bool(req.ForceMajor), "forceMinor": bool(req.ForceMinor)})
	})
	mux.HandleFunc("GET /api/v1/bookie/gc", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]string{"is_in_force_gc": strconv.FormatBool(b.eng.GCStatus().Forced)})
	})
	mux.HandleFunc("GET /api/v1/bookie/gc_details", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, b.eng.GCStatus())
	})
	suspension := func(w http.ResponseWriter) {
		st := b.eng.GCStatus()
		writeJSON(w, map[string]bool{"isMajorGcSuspended": st.MajorSuspended, "isMinorGcSuspended": st.MinorSuspended})
	}
	mux.HandleFunc("GET /api/v1/bookie/gc/suspend_compaction", func(w http.ResponseWriter, _ *http.Request) { suspension(w) })
	mux.HandleFunc("GET /api/v1/bookie/gc/resume_compaction", func(w http.ResponseWriter, _ *http.Request) { suspension(w) })
	mux.HandleFunc("PUT /api/v1/bookie/gc/suspend_compaction", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Major *flag `json:"suspendMajor"`
			Minor *flag `json:"suspendMinor"`
		}
		if err := decodeBody(w, r, &req, bodyOptional); err != nil {
			badBody(w, `{"suspendMajor": bool, "suspendMinor": bool}`, err)
			return
		}
		major, minor := chosenKinds(req.Major, req.Minor)
		b.eng.SuspendCompaction(major, minor)
		b.log.Info("compaction suspended by an operator", "major", major, "minor", minor)
		suspension(w)
	})
	mux.HandleFunc("PUT /api/v1/bookie/gc/resume_compaction", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Major *flag `json:"resumeMajor"`
			Minor *flag `json:"resumeMinor"`
		}
		if err := decodeBody(w, r, &req, bodyOptional); err != nil {
			badBody(w, `{"resumeMajor": bool, "resumeMinor": bool}`, err)
			return
		}
		major, minor := chosenKinds(req.Major, req.Minor)
		b.eng.ResumeCompaction(major, minor)
		b.log.Info("compaction resumed by an operator", "major", major, "minor", minor)
		suspension(w)
	})
}

// chosenKinds reads a suspend or resume body: both kinds when it names neither, else those set
// to true ({"suspendMajor": false, "suspendMinor": false} acts on neither).
func chosenKinds(major, minor *flag) (bool, bool) {
	if major == nil && minor == nil {
		return true, true
	}
	return major != nil && bool(*major), minor != nil && bool(*minor)
}

// registerGC exposes the garbage collector's counters, read when scraped.
func registerGC(reg *prometheus.Registry, e *engine.Engine) {
	counter := func(name, help string, f func(engine.GCStatus) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return f(e.GCStatus()) })
	}
	reg.MustRegister(
		counter("bookie_gc_MAJOR_COMPACTION_COUNT", "Major compactions run.",
			func(s engine.GCStatus) float64 { return float64(s.MajorCompactions) }),
		counter("bookie_gc_MINOR_COMPACTION_COUNT", "Minor compactions run.",
			func(s engine.GCStatus) float64 { return float64(s.MinorCompactions) }),
		counter("bookie_DELETED_LEDGER_COUNT", "Ledgers deleted because the metadata store no longer has them.",
			func(s engine.GCStatus) float64 { return float64(s.DeletedLedgers) }),
		counter("ringkeeper_engine_gc_reclaimed_bytes_total", "Bytes of entry logs removed by garbage collection and compaction.",
			func(s engine.GCStatus) float64 { return float64(s.ReclaimedBytes) }),
		counter("ringkeeper_engine_compaction_read_bytes_total", "Bytes compaction read from old entry logs.",
			func(s engine.GCStatus) float64 { return float64(s.CompactionReadBytes) }),
		counter("ringkeeper_engine_compaction_written_bytes_total", "Bytes compaction copied into new entry logs.",
			func(s engine.GCStatus) float64 { return float64(s.CompactionWrittenBytes) }),
		counter("ringkeeper_engine_gc_metadata_errors_total", "Metadata reads and listings of garbage collection that failed.",
			func(s engine.GCStatus) float64 { return float64(s.MetadataErrors) }),
	)
}
