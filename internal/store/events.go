package store

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
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

// eventListener logs what an operator needs to see: write stalls (with
// their duration) and disk operations that Pebble found slow. Pebble calls
// these from its own goroutines; none of them blocks.
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
		DiskSlow: func(info pebble.DiskSlowInfo) {
			log.Warn("slow disk operation", "op", info.OpType.String(), "path", info.Path, "duration", info.Duration)
		},
	}
}
