package bookie

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// startHTTP serves /metrics (Prometheus), /heartbeat and, with httpServerEnabled, the admin
// API on prometheusStatsHttpPort (-1 = any free port, for tests).
func (b *Bookie) startHTTP() error {
	port := b.cfg.PrometheusStatsHTTPPort
	if port < 0 {
		port = 0
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(b.cfg.ListenAddress, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("bookie: listen on prometheusStatsHttpPort %d: %w", port, err)
	}
	b.httpAddr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(b.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /heartbeat", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("OK\n")) })
	if b.cfg.HTTPServerEnabled {
		b.addAdminRoutes(mux)
	}
	// Timeouts so that a client that sends half a request, or idles, does not hold a goroutine
	// and its buffers for ever; the scrape and admin calls are small.
	b.http = &http.Server{Handler: mux, ReadHeaderTimeout: httpReadTimeout, ReadTimeout: httpReadTimeout,
		WriteTimeout: httpWriteTimeout, IdleTimeout: httpIdleTimeout, MaxHeaderBytes: maxAdminBody}
	go func() {
		if err := b.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			b.log.Error("admin HTTP server", "err", err)
		}
	}()
	return nil
}

// Limits of the metrics and admin HTTP server.
const (
	httpReadTimeout  = 10 * time.Second
	httpWriteTimeout = 30 * time.Second
	httpIdleTimeout  = 2 * time.Minute
	// maxAdminBody bounds an admin request's body (and headers): the largest is a few fields.
	maxAdminBody = 64 << 10
)

// bodyRule says what decodeBody accepts besides one JSON object of at most maxAdminBody bytes.
type bodyRule int

const (
	// bodyRequired: a body with no unknown field (PUT state/readonly, strict in BookKeeper too).
	bodyRequired bodyRule = iota
	// bodyOptional: no body, or one whose unknown fields are ignored, as BookKeeper's GC routes
	// do (they read the body into a map).
	bodyOptional
)

// decodeBody decodes a JSON admin body into v: at most maxAdminBody bytes, one JSON object and
// nothing after it, as rule says. A bad body is refused whole, so that it changes nothing.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, rule bodyRule) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	optional := rule == bodyOptional
	if !optional {
		dec.DisallowUnknownFields()
	}
	err := dec.Decode(v)
	switch {
	case errors.Is(err, io.EOF) && optional:
		return nil
	case errors.Is(err, io.EOF):
		return errors.New("the body is empty")
	case err != nil:
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("the body holds more than one JSON value")
	}
	return nil
}

// badBody answers 413 for a body over maxAdminBody and 400 for any other bad body.
func badBody(w http.ResponseWriter, want string, err error) {
	code := http.StatusBadRequest
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		code = http.StatusRequestEntityTooLarge
	}
	http.Error(w, "body must be "+want+": "+err.Error(), code)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func (b *Bookie) handleState(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{"id": b.id, "readOnly": b.ReadOnly(), "forcedReadOnly": b.forcedReadOnly.Load(),
		"storageFailed": b.storageFailed.Load()})
}

// handleSetReadOnly takes {"readOnly": true|false} (the field is required). When the
// registration could not be moved (the metadata store is unreachable), the mode has changed
// all the same and the answer is 503 with the error; the bookie retries the registration.
func (b *Bookie) handleSetReadOnly(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ReadOnly *flag `json:"readOnly"`
	}
	const want = `{"readOnly": true|false}`
	if err := decodeBody(w, r, &req, bodyRequired); err != nil {
		badBody(w, want, err)
		return
	}
	if req.ReadOnly == nil {
		badBody(w, want, errors.New("readOnly is missing"))
		return
	}
	if err := b.SetReadOnly(bool(*req.ReadOnly)); err != nil {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case errors.Is(err, ErrStorageFailed):
			w.WriteHeader(http.StatusConflict)
		case errors.Is(err, ErrReadOnlyModeDisabled):
			w.WriteHeader(http.StatusBadRequest)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(map[string]any{"id": b.id, "readOnly": b.ReadOnly(),
			"forcedReadOnly": b.forcedReadOnly.Load(), "error": err.Error()})
		return
	}
	b.handleState(w, r)
}

func (b *Bookie) handleInfo(w http.ResponseWriter, _ *http.Request) {
	s := b.eng.Stats()
	usage, free, total, _ := b.eng.Usage()
	writeJSON(w, map[string]any{
		"id": b.id, "ledgers": b.eng.Ledgers(), "diskUsage": usage, "freeDiskBytes": free, "totalDiskBytes": total,
		"adds": s.Adds, "reads": s.Reads, "checkpoints": s.Checkpoints, "flushes": s.Flushes,
	})
}

// addAdminRoutes serves the admin API (httpServerEnabled); later subsystems hook in here.
func (b *Bookie) addAdminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/bookie/state", b.handleState)
	mux.HandleFunc("PUT /api/v1/bookie/state/readonly", b.handleSetReadOnly)
	mux.HandleFunc("GET /api/v1/bookie/info", b.handleInfo)
	b.addGCRoutes(mux)
}
