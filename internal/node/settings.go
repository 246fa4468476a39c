package node

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dhtkv/dhtkv/internal/probe"
)

// Settings every node of a cluster must share. Each is a node's own
// flag, but the safety arguments that use it assume one value cluster
// wide (docs/replication.md, "Settings every node shares"):
//
//   - --gc-grace: a node restored from a snapshot weighs the snapshot's
//     age against it, and the others collect deletes after their own;
//   - --hint-window: every node's grace must exceed every node's hint
//     window (plus the skew bound), or a hint arrives below its
//     replica's garbage-collection horizon and is dropped;
//   - --max-clock-skew: the bound on how far a version may be ahead of
//     a clock, which every node applies to the versions it accepts.
//
// A ping's answer says this node's (rpc.Server.Settings); /v0/status
// warns of each peer whose differ, and a snapshot records the shortest
// grace among them (shortestGrace).

// sharedSettings says cfg's shared settings as "name=value" words, in
// the flags' own notation.
func (cfg *Config) sharedSettings() string {
	return fmt.Sprintf("gc-grace=%v hint-window=%v max-clock-skew=%v", cfg.gcGrace(), cfg.Handoff.Window, cfg.MaxClockSkew)
}

// settingWords parses sharedSettings' notation: name → value. Words
// without "=" are skipped.
func settingWords(s string) map[string]string {
	m := map[string]string{}
	for _, w := range strings.Fields(s) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}

// otherSettings returns peer's settings that differ from own's, each as
// "--name=value (this node: value)". A setting only one of them says (a
// release with more or fewer) is not compared.
func otherSettings(own, peer string) []string {
	mine := settingWords(own)
	var out []string
	for _, w := range strings.Fields(peer) {
		k, v, ok := strings.Cut(w, "=")
		if mv, known := mine[k]; ok && known && mv != v {
			out = append(out, fmt.Sprintf("--%s=%s (this node: %s)", k, v, mv))
		}
	}
	return out
}

// settingsWarnings returns a status line for each peer whose last ping
// answer gave other shared settings than own.
func settingsWarnings(own string, peers []probe.PeerState) []string {
	var ws []string
	for _, p := range peers {
		if d := otherSettings(own, p.Settings); len(d) > 0 {
			ws = append(ws, fmt.Sprintf("peer %s runs with %s: --gc-grace, --hint-window and --max-clock-skew must be the same on every node",
				p.URL, strings.Join(d, ", ")))
		}
	}
	return ws
}

// shortestGrace returns the shortest --gc-grace among own and the
// peers' last ping answers (a peer that did not say is not counted).
func shortestGrace(own time.Duration, peers []probe.PeerState) time.Duration {
	g := own
	for _, p := range peers {
		if d, err := time.ParseDuration(settingWords(p.Settings)["gc-grace"]); err == nil && d > 0 && d < g {
			g = d
		}
	}
	return g
}

// settingsMetric counts the peers whose shared settings differ from this
// node's, at scrape time.
func (n *Node) settingsMetric() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "dhtkv_peers_with_other_settings",
		Help: "Peers whose last ping answer gave another --gc-grace, --hint-window or --max-clock-skew than this node's, which every node must share (/v0/status names them).",
	}, func() float64 { return float64(len(settingsWarnings(n.settings, n.probe.PeerStates()))) })
}
