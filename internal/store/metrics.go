package store

import (
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// pebbleCollector exports a few of Pebble's own metrics, the ones that
// explain latency under write load: compaction debt, L0 shape, memtables,
// WAL and disk usage.
type pebbleCollector struct {
	store   *Store
	metrics func() *pebble.Metrics
	stalls  func() (uint64, time.Duration)
	iters   func() int64
	jobs    jobTimes
	descs   map[string]*prometheus.Desc
}

// Collector exports Pebble's metrics and the store's write stalls (count,
// total duration), read at scrape time. Register it once per store.
func (s *Store) Collector() prometheus.Collector {
	pc := &pebbleCollector{store: s, metrics: s.db.Metrics, stalls: s.Stalls, iters: s.RangeIters, jobs: s.jobs, descs: map[string]*prometheus.Desc{}}
	for name, help := range map[string]string{
		"dhtkv_pebble_compactions_total":         "Compactions completed.",
		"dhtkv_pebble_compaction_debt_bytes":     "Estimated bytes to compact for the LSM to reach a stable state.",
		"dhtkv_pebble_flushes_total":             "Memtable flushes completed.",
		"dhtkv_pebble_background_jobs":           "Flushes and compactions in progress.",
		"dhtkv_pebble_l0_sublevels":              "L0 sublevels: read amplification of L0.",
		"dhtkv_pebble_l0_files":                  "Files in L0.",
		"dhtkv_pebble_read_amplification":        "Read amplification of the whole LSM.",
		"dhtkv_pebble_memtable_bytes":            "Bytes allocated by memtables (including queued ones).",
		"dhtkv_pebble_memtables":                 "Memtables in memory.",
		"dhtkv_pebble_zombie_memtable_bytes":     "Bytes of memtables already flushed that open iterators still pin in memory.",
		"dhtkv_pebble_zombie_table_bytes":        "Bytes of sstables already compacted away that open iterators still pin on disk.",
		"dhtkv_store_range_iterators":            "Range iterators on the store (scans, summaries) holding a snapshot: neither ended, released nor closed.",
		"dhtkv_pebble_wal_bytes_written_total":   "Bytes written to the WAL.",
		"dhtkv_pebble_wal_files":                 "Live WAL files.",
		"dhtkv_pebble_disk_usage_bytes":          "Bytes on disk used by the store.",
		"dhtkv_pebble_block_cache_bytes":         "Bytes held by Pebble's block cache.",
		"dhtkv_pebble_block_cache_hits_total":    "Block cache hits.",
		"dhtkv_pebble_block_cache_misses_total":  "Block cache misses.",
		"dhtkv_pebble_wal_fsync_seconds":         "Latency of the WAL's fsyncs (each covers every commit waiting for it).",
		"dhtkv_pebble_write_stalls_total":        "Write stalls begun: commits wait while memtables or L0 are full.",
		"dhtkv_pebble_write_stall_seconds_total": "Total duration of ended write stalls.",
		"dhtkv_pebble_background_errors_total":   "Errors of Pebble's background work (flushes, compactions), which it retries.",
		"dhtkv_disk_free_bytes":                  "Free bytes of the data directory's volume available to the node, at the last reading (statfs).",
		"dhtkv_disk_total_bytes":                 "Size of the data directory's volume in bytes, at the last reading.",
		"dhtkv_disk_min_free_bytes":              "Free bytes below which the node refuses writes (--min-free-space of the volume).",
		"dhtkv_disk_full":                        "1 while the node refuses writes because its data volume is below --min-free-space (or Pebble met ENOSPC), else 0.",
		"dhtkv_disk_ballast_bytes":               "Size of the emergency ballast file in the data directory (0: none; delete it to free its space).",
		"dhtkv_store_failed":                     "1 once the store failed a write (an I/O error on the WAL, a sync, the MANIFEST): writes refused, /readyz 503 until restart.",
	} {
		pc.descs[name] = prometheus.NewDesc(name, help, nil, nil)
	}
	pc.descs["dhtkv_store_writes_refused_total"] = prometheus.NewDesc("dhtkv_store_writes_refused_total",
		"Writes the store refused (a client's write at its coordinator, a replica write, a hint), by reason: disk_full (below --min-free-space) or store_failed.",
		[]string{"reason"}, nil)
	return pc
}

func (p *pebbleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range p.descs {
		ch <- d
	}
	p.jobs.flush.Describe(ch)
	p.jobs.compaction.Describe(ch)
}

func (p *pebbleCollector) Collect(ch chan<- prometheus.Metric) {
	emit := func(name string, t prometheus.ValueType, v float64) {
		ch <- prometheus.MustNewConstMetric(p.descs[name], t, v)
	}
	s := p.store
	sp := s.Space()
	if sp.Known {
		emit("dhtkv_disk_free_bytes", prometheus.GaugeValue, float64(sp.Free))
		emit("dhtkv_disk_total_bytes", prometheus.GaugeValue, float64(sp.Total))
		emit("dhtkv_disk_min_free_bytes", prometheus.GaugeValue, float64(sp.MinFree))
	}
	emit("dhtkv_disk_full", prometheus.GaugeValue, b2f(sp.Full))
	emit("dhtkv_disk_ballast_bytes", prometheus.GaugeValue, float64(sp.BallastBytes))
	emit("dhtkv_store_failed", prometheus.GaugeValue, b2f(s.Failure() != nil))
	ch <- prometheus.MustNewConstMetric(p.descs["dhtkv_store_writes_refused_total"], prometheus.CounterValue, float64(s.health.refusedFull.Load()), "disk_full")
	ch <- prometheus.MustNewConstMetric(p.descs["dhtkv_store_writes_refused_total"], prometheus.CounterValue, float64(s.health.refusedFailed.Load()), "store_failed")
	emit("dhtkv_pebble_background_errors_total", prometheus.CounterValue, float64(s.health.background.Load()))
	if s.Failure() != nil {
		// Pebble's metrics take the database's mutex, which a fatal error
		// may have left held for good (slogLogger.Fatalf): a scrape must
		// not hang on it.
		return
	}
	pm := p.metrics()
	emit("dhtkv_pebble_compactions_total", prometheus.CounterValue, float64(pm.Compact.Count))
	emit("dhtkv_pebble_compaction_debt_bytes", prometheus.GaugeValue, float64(pm.Compact.EstimatedDebt))
	emit("dhtkv_pebble_flushes_total", prometheus.CounterValue, float64(pm.Flush.Count))
	emit("dhtkv_pebble_background_jobs", prometheus.GaugeValue, float64(pm.Flush.NumInProgress+pm.Compact.NumInProgress))
	emit("dhtkv_pebble_l0_sublevels", prometheus.GaugeValue, float64(pm.Levels[0].Sublevels))
	emit("dhtkv_pebble_l0_files", prometheus.GaugeValue, float64(pm.Levels[0].TablesCount))
	emit("dhtkv_pebble_read_amplification", prometheus.GaugeValue, float64(pm.ReadAmp()))
	emit("dhtkv_pebble_memtable_bytes", prometheus.GaugeValue, float64(pm.MemTable.Size))
	emit("dhtkv_pebble_memtables", prometheus.GaugeValue, float64(pm.MemTable.Count))
	emit("dhtkv_pebble_zombie_memtable_bytes", prometheus.GaugeValue, float64(pm.MemTable.ZombieSize))
	emit("dhtkv_pebble_zombie_table_bytes", prometheus.GaugeValue, float64(pm.Table.ZombieSize))
	emit("dhtkv_store_range_iterators", prometheus.GaugeValue, float64(p.iters()))
	emit("dhtkv_pebble_wal_bytes_written_total", prometheus.CounterValue, float64(pm.WAL.BytesWritten))
	emit("dhtkv_pebble_wal_files", prometheus.GaugeValue, float64(pm.WAL.Files))
	emit("dhtkv_pebble_disk_usage_bytes", prometheus.GaugeValue, float64(pm.DiskSpaceUsage()))
	emit("dhtkv_pebble_block_cache_bytes", prometheus.GaugeValue, float64(pm.BlockCache.Size))
	emit("dhtkv_pebble_block_cache_hits_total", prometheus.CounterValue, float64(pm.BlockCache.Hits))
	emit("dhtkv_pebble_block_cache_misses_total", prometheus.CounterValue, float64(pm.BlockCache.Misses))
	if h := pm.LogWriter.FsyncLatency; h != nil {
		var d dto.Metric
		if err := h.Write(&d); err == nil && d.Histogram != nil {
			count, sum, buckets := rebucket(d.Histogram, 1e-9)
			ch <- prometheus.MustNewConstHistogram(p.descs["dhtkv_pebble_wal_fsync_seconds"], count, sum, buckets)
		}
	}
	n, total := p.stalls()
	emit("dhtkv_pebble_write_stalls_total", prometheus.CounterValue, float64(n))
	emit("dhtkv_pebble_write_stall_seconds_total", prometheus.CounterValue, total.Seconds())
	p.jobs.flush.Collect(ch)
	p.jobs.compaction.Collect(ch)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// fsyncBuckets are the upper bounds, in seconds, that the WAL fsync
// histogram is exported with: Pebble's own has about a hundred.
var fsyncBuckets = prometheus.ExponentialBuckets(100e-6, 2, 17) // 100µs .. ~6.5s

// rebucket converts a Pebble histogram (in units of scale seconds) to
// fsyncBuckets. A bucket's count is the cumulative count at the largest of
// Pebble's bounds that does not exceed it, so no observation is counted
// below its true value.
func rebucket(h *dto.Histogram, scale float64) (count uint64, sum float64, buckets map[float64]uint64) {
	buckets = make(map[float64]uint64, len(fsyncBuckets))
	src := h.GetBucket()
	i := 0
	var cum uint64
	for _, le := range fsyncBuckets {
		for i < len(src) && src[i].GetUpperBound()*scale <= le {
			cum = src[i].GetCumulativeCount()
			i++
		}
		buckets[le] = cum
	}
	return h.GetSampleCount(), h.GetSampleSum() * scale, buckets
}
