package store

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// stallCounter accounts for Pebble's write stalls: while one lasts, every
// commit waits (memtables or L0 are full and flushes or compactions lag),
// which is the first thing to look at when writes are slow or time out.
type stallCounter struct {
	count atomic.Uint64
	nanos atomic.Int64 // total duration of ended stalls
	begin atomic.Int64 // unix nanoseconds of the stall under way, 0 if none
}

// Stalls returns how many write stalls began and how long the ended ones
// lasted in total.
func (s *Store) Stalls() (count uint64, total time.Duration) {
	return s.stalls.count.Load(), time.Duration(s.stalls.nanos.Load())
}

// jobTimes times Pebble's background jobs, the flushes and compactions
// whose seconds a latency timeline is matched against (loadtest/tail.sh).
type jobTimes struct {
	flush, compaction prometheus.Histogram
}

func newJobTimes() jobTimes {
	buckets := prometheus.ExponentialBuckets(1e-3, 2, 15) // 1 ms .. 16 s
	return jobTimes{
		flush: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dhtkv_pebble_flush_duration_seconds", Buckets: buckets,
			Help: "Wall time of each memtable flush, from its start to its result applied.",
		}),
		compaction: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dhtkv_pebble_compaction_duration_seconds", Buckets: buckets,
			Help: "Wall time of each compaction, from its start to its result applied.",
		}),
	}
}

// eventListener logs what an operator needs to see: write stalls (with
// their duration), disk operations that Pebble found slow, and the errors
// of its background work (Store.backgroundError); it times
// every flush and compaction, and logs each at debug level with its
// duration. Pebble calls these from its own goroutines; none of them
// blocks.
func (s *Store) eventListener(log *slog.Logger) *pebble.EventListener {
	return &pebble.EventListener{
		WriteStallBegin: func(info pebble.WriteStallBeginInfo) {
			s.stalls.count.Add(1)
			s.stalls.begin.Store(time.Now().UnixNano())
			log.Warn("write stall began", "reason", info.Reason, "dir", s.dir)
		},
		WriteStallEnd: func() {
			begin := s.stalls.begin.Swap(0)
			if begin == 0 {
				return
			}
			d := time.Duration(time.Now().UnixNano() - begin)
			s.stalls.nanos.Add(int64(d))
			log.Warn("write stall ended", "duration", d, "dir", s.dir)
		},
		FlushEnd: func(info pebble.FlushInfo) {
			if info.Err != nil || info.Ingest {
				return
			}
			s.jobs.flush.Observe(info.TotalDuration.Seconds())
			log.Debug("flush", "duration", info.TotalDuration, "memtables", info.Input, "bytes", info.InputBytes)
		},
		CompactionEnd: func(info pebble.CompactionInfo) {
			if info.Err != nil {
				return
			}
			s.jobs.compaction.Observe(info.TotalDuration.Seconds())
			log.Debug("compaction", "duration", info.TotalDuration, "reason", info.Reason, "output_level", info.Output.Level)
		},
		DiskSlow: func(info pebble.DiskSlowInfo) {
			log.Warn("slow disk operation", "op", info.OpType.String(), "path", info.Path, "duration", info.Duration)
		},
		BackgroundError: func(err error) { s.backgroundError(log, err) },
	}
}
