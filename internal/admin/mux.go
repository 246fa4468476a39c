package admin

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/clientauth"
)

// Parts are what the admin endpoints serve from.
type Parts struct {
	Registry *prometheus.Registry
	// Ready is /readyz's answer (nil: ready).
	Ready func() error
	// AntiEntropy serves /repair.
	AntiEntropy *antientropy.Service
	// Checkpointer serves /snapshot (nil: the store cannot checkpoint).
	Checkpointer Checkpointer
	// Cluster serves /cluster and below (membership.Service.Handler).
	Cluster http.Handler
	// SnapshotDir is the directory snapshots are written inside
	// (--snapshot-dir; absolute).
	SnapshotDir string
	// Tokens are the client tokens a request must carry one of, with the
	// role need gives its method and path (auth.go); nil: client
	// authentication off.
	Tokens *clientauth.Tokens
	// LogLevel serves /log-level (nil: 501, the level is fixed).
	LogLevel *slog.LevelVar
	Log      *slog.Logger
	// MaxProfile is the longest profile or trace /debug/pprof/ takes
	// (Options.MaxProfile; 0: its default).
	MaxProfile time.Duration
}

// Mux returns every admin endpoint on one mux (see the package comment).
// /repair answers the client package's types (client.Exchange to POST,
// client.RepairState to GET, one exchange written alike in both), so
// that dhtkvctl and the Go client read what the node writes.
func Mux(p Parts) http.Handler {
	return authorize(p.Tokens, p.Log, mux(p))
}

// mux is Mux's mux, before authorize.
func mux(p Parts) *recordingMux {
	mux := newMux()
	mux.Handle("/", Handler(p.Registry, p.Ready, p.MaxProfile))
	mux.Handle("/repair", RepairHandler(
		func(ctx context.Context) any {
			res := p.AntiEntropy.Repair(ctx)
			if res == nil {
				return nil // the client went away
			}
			out := make([]client.Exchange, len(res))
			for i, x := range res {
				out[i] = exchange(x)
			}
			return out
		},
		func() any {
			st := p.AntiEntropy.Status()
			out := make([]client.RepairState, len(st))
			for i, s := range st {
				out[i] = client.RepairState{Peer: s.Peer, LastSuccess: s.LastSuccess, Running: s.Running, Progress: s.Progress}
				if s.Last != nil {
					x := exchange(*s.Last)
					out[i].Last = &x
				}
			}
			return out
		}))
	mux.Handle("/snapshot", SnapshotHandler(p.Checkpointer, p.SnapshotDir, p.Log))
	mux.Handle("/log-level", LogLevelHandler(p.LogLevel, p.Log))
	mux.Handle("/cluster", p.Cluster)
	mux.Handle("/cluster/", unbounded(p.Cluster))
	return mux
}

// exchange is x as /repair answers it.
func exchange(x antientropy.ExchangeStats) client.Exchange {
	return client.Exchange{
		Peer: x.Peer, Started: x.Started, DurationSeconds: x.Duration.Seconds(),
		Partitions: x.Partitions, PartitionsDiffering: x.PartitionsDiffering, SegmentsDiffering: x.SegmentsDiffering,
		Pulled: x.Pulled, Pushed: x.Pushed, Failed: x.Failed,
		SummaryBytes: x.SummaryBytes, RecordBytes: x.RecordBytes, Error: x.Err,
	}
}
