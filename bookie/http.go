package bookie

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"

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
	b.http = &http.Server{Handler: mux}
	go func() {
		if err := b.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			b.log.Error("admin HTTP server", "err", err)
		}
	}()
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func (b *Bookie) handleState(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{"id": b.id, "readOnly": b.ReadOnly(), "forcedReadOnly": b.forcedReadOnly.Load()})
}

// handleSetReadOnly takes {"readOnly": true|false}.
func (b *Bookie) handleSetReadOnly(w http.ResponseWriter, r *http.Request) {
	var req struct {
		ReadOnly bool `json:"readOnly"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "body must be {\"readOnly\": true|false}", http.StatusBadRequest)
		return
	}
	b.SetReadOnly(req.ReadOnly)
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
