package cache

import "github.com/prometheus/client_golang/prometheus"

// cacheCollector reads ristretto's counters at scrape time.
type cacheCollector struct {
	c                                *Cache
	hits, misses, evictions, dropped *prometheus.Desc
	rejected, cost, maxCost          *prometheus.Desc
}

// Collector exports the cache's counters, read at scrape time (zeros for a
// disabled cache). Register it once per cache.
func (c *Cache) Collector() prometheus.Collector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &cacheCollector{
		c:         c,
		hits:      d("dhtkv_cache_hits_total", "Read cache hits."),
		misses:    d("dhtkv_cache_misses_total", "Read cache misses."),
		evictions: d("dhtkv_cache_evictions_total", "Entries evicted from the read cache."),
		dropped:   d("dhtkv_cache_sets_dropped_total", "Cache fills dropped because ristretto's buffer was full."),
		rejected:  d("dhtkv_cache_sets_rejected_total", "Cache fills rejected by the admission policy."),
		cost:      d("dhtkv_cache_bytes", "Bytes held by the read cache (key + value + overhead)."),
		maxCost:   d("dhtkv_cache_max_bytes", "Read cache capacity in bytes (--cache-bytes)."),
	}
}

func (c *cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hits, c.misses, c.evictions, c.dropped, c.rejected, c.cost, c.maxCost} {
		ch <- d
	}
}

func (c *cacheCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.c.Metrics()
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(c.hits, m.Hits)
	counter(c.misses, m.Misses)
	counter(c.evictions, m.Evictions)
	counter(c.dropped, m.SetsDropped)
	counter(c.rejected, m.SetsRejected)
	ch <- prometheus.MustNewConstMetric(c.cost, prometheus.GaugeValue, float64(m.CostAdded-m.CostEvicted))
	ch <- prometheus.MustNewConstMetric(c.maxCost, prometheus.GaugeValue, float64(m.MaxCost))
}
