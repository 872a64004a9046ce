package server

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringkeeper/ringkeeper/internal/monotime"
)

// Metrics are the server's Prometheus collectors. Names follow BookKeeper's Prometheus
// provider (scope "bookkeeper_server", OpStatsLogger names) where the meaning is the same; the
// latencies are histograms in seconds (BookKeeper exports millisecond summaries) with the
// success label BookKeeper uses. A nil *Metrics disables every method.
//
//	bookkeeper_server_ADD_ENTRY_REQUEST{success}    add latency: decoded → response queued
//	bookkeeper_server_READ_ENTRY_REQUEST{success}   read and batch read latency, likewise
//	bookkeeper_server_ADD_ENTRY_IN_PROGRESS         adds in flight (gauge)
//	bookkeeper_server_READ_ENTRY_IN_PROGRESS        worker-pool reads in flight (gauge)
//	bookkeeper_server_ADD_ENTRY_REJECTED            adds answered ETOOMANYREQUESTS
//	bookkeeper_server_READ_ENTRY_REJECTED           reads answered ETOOMANYREQUESTS
//	ringkeeper_server_connections                   open connections (gauge)
//	ringkeeper_server_connections_closed_total{reason}  closes by the server: protocol, slow_client, panic, auth
//	ringkeeper_server_response_flushes_total        writes of queued responses (one per connection per flush)
//	ringkeeper_server_unwritten_read_bytes          read response bytes not yet taken by a socket (gauge)
//
// As in BookKeeper, the request histograms observe every add and read the server answers,
// those answered at once on the reader included: cached reads as successes, and requests
// refused there or by a read worker (EBADREQ, EREADONLY, EUA for a fencing read without a
// key, ETOOMANYREQUESTS) as failures. Requests refused for want of authentication (EUA before
// AUTH) are not observed, as BookKeeper's AuthHandler answers them before its processors.
type Metrics struct {
	addOK, addFail   prometheus.Observer
	readOK, readFail prometheus.Observer
	addsRejected     prometheus.Counter
	readsRejected    prometheus.Counter
	closed           *prometheus.CounterVec
	flushes          prometheus.Counter

	// src is the server whose counters the gauges read.
	src atomic.Pointer[Server]
}

// NewMetrics creates the collectors and registers them with reg (nil: not registered, e.g.
// for tests). It panics if registration fails, as prometheus.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{}
	buckets := prometheus.ExponentialBuckets(25e-6, 2, 20) // 25 µs … 13 s
	add := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "bookkeeper_server_ADD_ENTRY_REQUEST", Help: "Add request latency in seconds, from decode to response queued.",
		Buckets: buckets}, []string{"success"})
	read := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "bookkeeper_server_READ_ENTRY_REQUEST", Help: "Read and batch read request latency in seconds.",
		Buckets: buckets}, []string{"success"})
	m.addOK, m.addFail = add.WithLabelValues("true"), add.WithLabelValues("false")
	m.readOK, m.readFail = read.WithLabelValues("true"), read.WithLabelValues("false")
	m.addsRejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "bookkeeper_server_ADD_ENTRY_REJECTED", Help: "Adds answered ETOOMANYREQUESTS."})
	m.readsRejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "bookkeeper_server_READ_ENTRY_REJECTED", Help: "Reads answered ETOOMANYREQUESTS."})
	m.closed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ringkeeper_server_connections_closed_total", Help: "Connections closed by the server, by reason."},
		[]string{"reason"})
	m.flushes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ringkeeper_server_response_flushes_total", Help: "Writes of queued responses."})
	gauge := func(name, help string, f func(*Server) int64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			if s := m.src.Load(); s != nil {
				return float64(f(s))
			}
			return 0
		})
	}
	collectors := []prometheus.Collector{add, read, m.addsRejected, m.readsRejected, m.closed, m.flushes,
		gauge("bookkeeper_server_ADD_ENTRY_IN_PROGRESS", "Adds in flight.",
			func(s *Server) int64 { return s.addsInFlight.Load() }),
		gauge("bookkeeper_server_READ_ENTRY_IN_PROGRESS", "Worker-pool reads in flight.",
			func(s *Server) int64 { return s.readsInFlight.Load() }),
		gauge("ringkeeper_server_connections", "Open connections.",
			func(s *Server) int64 { return s.stats.connections.Load() }),
		gauge("ringkeeper_server_unwritten_read_bytes", "Read response bytes not yet taken by a socket, over all connections.",
			func(s *Server) int64 { return s.unwrittenReads.Load() }),
	}
	if reg != nil {
		for _, c := range collectors {
			reg.MustRegister(c)
		}
	}
	return m
}

func (m *Metrics) bind(s *Server) {
	if m != nil {
		m.src.Store(s)
	}
}

func (m *Metrics) observeAdd(start int64, ok bool) {
	if m == nil {
		return
	}
	observeSince(m.addOK, m.addFail, start, ok)
}

func (m *Metrics) observeRead(start int64, ok bool) {
	if m == nil {
		return
	}
	observeSince(m.readOK, m.readFail, start, ok)
}

// observeSince records the time since start (monotime) in ok's histogram or fail's.
func observeSince(okHist, failHist prometheus.Observer, start int64, ok bool) {
	h := failHist
	if ok {
		h = okHist
	}
	h.Observe(time.Duration(monotime.Now() - start).Seconds())
}

func (m *Metrics) addRejected() {
	if m != nil {
		m.addsRejected.Inc()
	}
}

func (m *Metrics) readRejected() {
	if m != nil {
		m.readsRejected.Inc()
	}
}

func (m *Metrics) connClosed(reason string) {
	if m != nil {
		m.closed.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) flushed() {
	if m != nil {
		m.flushes.Inc()
	}
}
