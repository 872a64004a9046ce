package bookie

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ringkeeper/ringkeeper/engine"
	"github.com/ringkeeper/ringkeeper/journal"
)

// metrics are the bookie's own Prometheus series; the network server registers its own
// (bookkeeper_server_*). Names are BookKeeper's Prometheus names where the meaning is the same
// (the journal's under bookie_journal_, DbLedgerStorage's and the garbage collector's under
// bookie_), latencies in seconds; ringkeeper_* series have no BookKeeper counterpart.
type metrics struct {
	groupEntries prometheus.Histogram
	groupBytes   prometheus.Histogram
	groupSync    prometheus.Histogram
	queueWait    prometheus.Histogram
	groupWait    prometheus.Histogram
	cbDelay      prometheus.Histogram
	diskUsage    prometheus.Gauge
}

func newMetrics(reg *prometheus.Registry) *metrics {
	latency := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help,
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16)})
	}
	m := &metrics{
		groupEntries: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
			Help:    "Records per journal group commit.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 16),
		}),
		groupBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_BYTES",
			Help:    "Bytes per journal group commit, padding included.",
			Buckets: prometheus.ExponentialBuckets(4096, 2, 12),
		}),
		groupSync: latency("bookie_journal_JOURNAL_SYNC",
			"Time from submitting a journal group to its durable completion (write and sync), seconds."),
		queueWait: latency("bookie_journal_JOURNAL_QUEUE_LATENCY",
			"Time the oldest record of each journal group waited in the journal's queue, seconds."),
		groupWait: latency("ringkeeper_journal_group_wait_seconds",
			"Time from the journal writer taking a group's oldest record to submitting the group (filling, group wait, a free pipeline slot)."),
		cbDelay: latency("ringkeeper_journal_callback_delay_seconds",
			"Time from a journal group's durable completion to its first callback."),
		diskUsage: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringkeeper_bookie_disk_usage_ratio",
			Help: "Used fraction of the fullest journal or ledger file system.",
		}),
	}
	reg.MustRegister(m.groupEntries, m.groupBytes, m.groupSync, m.queueWait, m.groupWait, m.cbDelay, m.diskUsage,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observeGroup(g journal.GroupStats) {
	m.groupEntries.Observe(float64(g.Records))
	m.groupBytes.Observe(float64(g.Bytes))
	m.groupSync.Observe(g.Sync.Seconds())
	m.queueWait.Observe(g.QueueWait.Seconds())
	m.groupWait.Observe(g.GroupWait.Seconds())
	m.cbDelay.Observe(g.CallbackDelay.Seconds())
}

// registerEngine exposes the engine's counters, read when scraped.
func (m *metrics) registerEngine(reg *prometheus.Registry, e *engine.Engine) {
	gauge := func(name, help string, f func(engine.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(e.Stats()) })
	}
	counter := func(name, help string, f func(engine.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return f(e.Stats()) })
	}
	reg.MustRegister(
		gauge("bookie_write_cache_size", "Bytes in the active write-cache halves.",
			func(s engine.Stats) float64 { return float64(s.WriteCacheBytes) }),
		gauge("ringkeeper_engine_write_cache_capacity_bytes", "Capacity of the write cache (both halves of every ledger dir).",
			func(s engine.Stats) float64 { return float64(s.WriteCacheCapacity) }),
		counter("ringkeeper_engine_flushes_total", "Write-cache flushes to entry logs and the index.",
			func(s engine.Stats) float64 { return float64(s.Flushes) }),
		counter("ringkeeper_engine_flush_seconds_total", "Time spent flushing write-cache halves.",
			func(s engine.Stats) float64 { return s.FlushSeconds }),
		counter("ringkeeper_engine_flushed_bytes_total", "Entry bytes flushed to entry logs.",
			func(s engine.Stats) float64 { return float64(s.FlushedBytes) }),
		counter("ringkeeper_engine_checkpoints_total", "Completed checkpoints.",
			func(s engine.Stats) float64 { return float64(s.Checkpoints) }),
		counter("bookie_throttled_write_requests", "Adds that waited for write-cache space.",
			func(s engine.Stats) float64 { return float64(s.ThrottledAdds) }),
		counter("bookie_rejected_write_requests", "Adds refused because the write cache stayed full.",
			func(s engine.Stats) float64 { return float64(s.RejectedAdds) }),
		counter("ringkeeper_engine_read_cache_hits_total", "Reads served from memory on the event loop.",
			func(s engine.Stats) float64 { return float64(s.ReadCacheHits) }),
		counter("ringkeeper_engine_read_errors_total", "Reads that failed on damaged or unreadable data "+
			"(a checksum mismatch, a read error), never on a missing entry.",
			func(s engine.Stats) float64 { return float64(s.ReadErrors) }),
		gauge("ringkeeper_engine_ledgers", "Ledgers held.", func(engine.Stats) float64 { return float64(e.Ledgers()) }),
	)
}
