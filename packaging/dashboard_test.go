package packaging

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// dashboard is the part of Grafana's dashboard model the test reads.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ X, Y, W, H int } `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// selectorRef is a metric a PromQL expression reads, with the labels its
// matchers name.
type selectorRef struct {
	metric string
	labels []string
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promOffset   = regexp.MustCompile(`\boffset\s+\S+`)
	promNumber   = regexp.MustCompile(`\b\d+(\.\d+)?(e[+-]?\d+)?\b`)
	// Words of PromQL that are neither metrics nor followed by "(".
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true}
)

// promRefs lists the metrics expr reads and the labels it groups by. It
// is a reader of the PromQL this dashboard uses (selectors, functions,
// aggregations with by, ranges, arithmetic), not a parser of all PromQL:
// a construct it does not know leaves an identifier that is no metric,
// and the test then fails, rather than passing unchecked.
func promRefs(expr string) (refs []selectorRef, grouping []string) {
	e := promString.ReplaceAllString(expr, `""`)
	e = promRange.ReplaceAllString(e, "")
	e = promOffset.ReplaceAllString(e, " ")
	for _, m := range promGrouping.FindAllStringSubmatch(e, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				grouping = append(grouping, l)
			}
		}
	}
	e = promGrouping.ReplaceAllString(e, " ")
	for _, m := range promSelector.FindAllStringSubmatch(e, -1) {
		ref := selectorRef{metric: m[1]}
		for _, lm := range promMatcher.FindAllStringSubmatch(m[2], -1) {
			ref.labels = append(ref.labels, lm[1])
		}
		refs = append(refs, ref)
	}
	e = promSelector.ReplaceAllString(e, " ")
	e = promNumber.ReplaceAllString(e, " ")
	for _, m := range promIdent.FindAllStringSubmatch(e, -1) {
		id := strings.TrimRight(strings.TrimSuffix(strings.TrimSpace(m[0]), "("), " ")
		if m[1] != "" || promKeywords[id] { // a function or aggregation, or a keyword
			continue
		}
		refs = append(refs, selectorRef{metric: id})
	}
	return refs, grouping
}

func TestPromRefs(t *testing.T) {
	for _, tc := range []struct {
		expr     string
		metrics  []string
		labels   []string
		grouping []string
	}{
		{`up`, []string{"up"}, nil, nil},
		{`sum by (op) (rate(a_total{instance=~"$instance"}[$__rate_interval]))`, []string{"a_total"}, []string{"instance"}, []string{"op"}},
		{`histogram_quantile(0.99, sum by (op, le) (rate(b_bucket{x="{}",y!~"a\"b"}[5m])))`, []string{"b_bucket"}, []string{"x", "y"}, []string{"op", "le"}},
		{`time() - (c_seconds{i="1"} > 0)`, []string{"c_seconds"}, []string{"i"}, nil},
		{`sum(rate(h[1m])) / (sum(rate(h[1m])) + sum without (peer) (m))`, []string{"h", "h", "m"}, nil, []string{"peer"}},
		{`a and on (instance) b offset 5m`, []string{"a", "b"}, nil, []string{"instance"}},
	} {
		refs, grouping := promRefs(tc.expr)
		var metrics, labels []string
		for _, r := range refs {
			metrics = append(metrics, r.metric)
			labels = append(labels, r.labels...)
		}
		slices.Sort(metrics)
		assert.Equal(t, tc.metrics, metrics, tc.expr)
		assert.Equal(t, tc.labels, labels, tc.expr)
		assert.Equal(t, tc.grouping, grouping, tc.expr)
	}
}

// family is what a node exports under one name.
type family struct {
	typ    dto.MetricType
	labels map[string]bool
}

// exported gathers every node's registry after traffic that touches every
// labelled family the dashboard reads (a vector without a child is not
// exported at all): reads, writes, deletes, scans (one cut short), a node down
// (failed replica calls, hints stored and, past --hint-max-bytes,
// dropped), its return (hints delivered), a read that finds it stale
// (read repair) and an anti-entropy exchange (what the dropped hints
// carried).
func exported(t *testing.T) map[string]family {
	c := testcluster.Start(t, 3, func(_ int, cfg *node.Config) {
		cfg.Handoff.Interval = 50 * time.Millisecond
		cfg.Handoff.MaxBytes = 1000
		cfg.Store.Sync = true // the WAL fsync histogram
	})
	cl := testcluster.NewClient(t)
	t.Cleanup(cl.HTTP.CloseIdleConnections)
	for i := range 20 {
		k := fmt.Sprintf("k%02d", i)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%3), k, []byte("v"), 0, 0))
		code, _ := cl.Get(t, c.URL((i+1)%3), k, 0, 0)
		require.Equal(t, http.StatusOK, code)
	}
	require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), "k00", 0, 0))
	code, _ := cl.Get(t, c.URL(0), "k00", 0, 0)
	require.Equal(t, http.StatusNotFound, code)
	code, _ = cl.Do(t, http.MethodGet, c.URL(0)+"/v0/entities?start=%00&scope=cluster&format=json&limit=1", nil)
	require.Equal(t, http.StatusOK, code)
	code, _ = cl.Do(t, http.MethodGet, c.URL(0)+"/v0/entities?ack=1", nil)
	require.Equal(t, http.StatusBadRequest, code)

	c.StopNode(2)
	const missed = 20
	for i := range missed {
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("m%02d", i), make([]byte, 300), 1, 3))
	}
	metric := func(i int, name string, labels ...string) float64 {
		return testcluster.Metric(t, c.Node(i).Registry(), name, labels...)
	}
	require.Eventually(t, func() bool {
		return metric(0, "dhtkv_hints_stored_total")+metric(0, "dhtkv_hints_dropped_total") == missed
	}, 10*time.Second, 20*time.Millisecond, "every write node 2 missed hinted or dropped")
	require.Positive(t, metric(0, "dhtkv_hints_dropped_total", "reason", "cap"))
	c.StartNode(2)
	require.Eventually(t, func() bool { return metric(0, "dhtkv_hints_pending_bytes") == 0 }, 10*time.Second, 20*time.Millisecond, "hints delivered")
	// The last write's hint was dropped (the cap was reached before it):
	// a read of all three replicas finds node 2 without it.
	code, _ = cl.Get(t, c.URL(1), fmt.Sprintf("m%02d", missed-1), 3, 3)
	require.Equal(t, http.StatusOK, code)
	require.Positive(t, metric(1, "dhtkv_read_repairs_total"))
	c.Repair(t, 0)
	require.Positive(t, metric(0, "dhtkv_antientropy_keys_total", "direction", "pushed"))

	// A scan cut short: the client closes while the node is still
	// writing, which takes more than the socket buffers hold (a separate
	// node, so that anti-entropy above has little to exchange).
	dir := filepath.Join(t.TempDir(), "filled")
	testcluster.FillStore(t, dir, 1000, 4096)
	one := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.DataDir = dir })
	rc := testcluster.RawGet(t, one.Config(0).Listen, "/v0/entities?start=%00&format=binary", 4096)
	require.Equal(t, http.StatusOK, rc.Status)
	_, err := io.ReadFull(rc.Wire, make([]byte, 10000))
	require.NoError(t, err)
	rc.Conn.Close()
	require.Eventually(t, func() bool { return one.Metric(t, 0, "dhtkv_scan_aborts_total") == 1 }, 10*time.Second, 10*time.Millisecond)

	out := map[string]family{}
	for _, n := range []*node.Node{c.Node(0), c.Node(1), c.Node(2), one.Node(0)} {
		families, err := n.Registry().Gather()
		require.NoError(t, err)
		for _, f := range families {
			fam, ok := out[f.GetName()]
			if !ok {
				fam = family{typ: f.GetType(), labels: map[string]bool{}}
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					fam.labels[l.GetName()] = true
				}
			}
			out[f.GetName()] = fam
		}
	}
	return out
}

// TestGrafanaDashboard: packaging/grafana-dashboard.json is a dashboard
// Grafana can import (unique panel ids, panels within the 24-column grid,
// every query on the dashboard's Prometheus variable), it covers what an
// operator watches (request rate and latency, replica failures, hints,
// anti-entropy, garbage collection, the read cache, Pebble), and every
// metric its queries read is one a node exports, with the labels the
// queries name: a renamed metric or label fails here instead of showing an
// empty panel.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	assert.NotEmpty(t, d.Title)
	assert.NotEmpty(t, d.UID)
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Type+":"+v.Name)
	}
	assert.Subset(t, vars, []string{"datasource:datasource", "query:instance"})

	all := allPanels(d)
	ids := map[int]bool{}
	var exprs []string
	for _, p := range all {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		assert.LessOrEqual(t, p.GridPos.X+p.GridPos.W, 24, "%q is wider than the grid", p.Title)
		if p.Type == "row" {
			continue
		}
		require.NotNil(t, p.Datasource, p.Title)
		assert.Equal(t, "${datasource}", p.Datasource.UID, p.Title)
		require.NotEmpty(t, p.Targets, "%q has no query", p.Title)
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	joined := strings.Join(exprs, "\n")
	for _, want := range []string{"dhtkv_requests_total", "dhtkv_request_duration_seconds_bucket", "dhtkv_replica_failures_total",
		"dhtkv_hints_", "dhtkv_antientropy_", "dhtkv_gc_", "dhtkv_cache_", "dhtkv_pebble_",
		"dhtkv_cluster_map_epoch", "dhtkv_cluster_members", "dhtkv_membership_change_stage", "dhtkv_membership_moved_records_total",
		"dhtkv_connections_open", "dhtkv_connections_max", "dhtkv_connections_refused_total",
		"dhtkv_request_body_bytes", "dhtkv_scans_open", "dhtkv_hints_max_bytes"} {
		assert.Contains(t, joined, want, "the dashboard shows %s", want)
	}

	fams := exported(t)
	for _, e := range exprs {
		refs, grouping := promRefs(e)
		require.NotEmpty(t, refs, e)
		var labels []string // of the metrics e reads: what its grouping may name
		for _, r := range refs {
			name, typ := r.metric, dto.MetricType_COUNTER
			f, ok := fams[name]
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if base, cut := strings.CutSuffix(name, suffix); !ok && cut {
					f, ok = fams[base]
					typ = dto.MetricType_HISTOGRAM
				}
			}
			if !assert.True(t, ok, "%s: a node exports no %s", e, name) {
				continue
			}
			if typ == dto.MetricType_HISTOGRAM {
				assert.Equal(t, dto.MetricType_HISTOGRAM, f.typ, "%s: %s is not a histogram's series", e, name)
			}
			have := map[string]bool{"instance": true, "job": true} // added by Prometheus
			for l := range f.labels {
				have[l] = true
			}
			if typ == dto.MetricType_HISTOGRAM {
				have["le"] = true
			}
			for _, l := range r.labels {
				assert.True(t, have[l], "%s: %s has no label %q", e, name, l)
			}
			for l := range have {
				labels = append(labels, l)
			}
		}
		for _, l := range grouping {
			assert.Contains(t, labels, l, "%s: groups by %q, which none of its metrics has", e, l)
		}
	}
}

// loadDashboard reads packaging/grafana-dashboard.json.
func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("grafana-dashboard.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	return d
}

// allPanels lists d's panels, those of collapsed rows included.
func allPanels(d dashboard) []panel {
	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	return all
}

// panelMetrics maps each metric the dashboard's queries read, histogram
// series by their histogram's name, to the titles of the panels that read
// it.
func panelMetrics(t *testing.T, d dashboard) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range allPanels(d) {
		for _, tg := range p.Targets {
			refs, _ := promRefs(tg.Expr)
			for _, r := range refs {
				name := r.metric
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					name = strings.TrimSuffix(name, suffix)
				}
				if !slices.Contains(out[name], p.Title) {
					out[name] = append(out[name], p.Title)
				}
			}
		}
	}
	return out
}

// Every dhtkv metric a panel reads is defined in the code: its name, as a
// string, is in a Go file of the module that is not a test; the go_ and
// process_ ones come from client_golang's collectors, which
// internal/metrics registers. A panel on a metric that was renamed or
// never written fails here, naming the panel, before any node runs.
func TestDashboardMetricsInCode(t *testing.T) {
	d := loadDashboard(t)
	var src strings.Builder
	err := filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && (e.Name() == ".git" || e.Name() == "packaging" || e.Name() == "docs") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		src.Write(b)
		return err
	})
	require.NoError(t, err)
	code := src.String()
	require.Contains(t, code, "collectors.NewGoCollector(")
	require.Contains(t, code, "collectors.NewProcessCollector(")
	for name, panels := range panelMetrics(t, d) {
		switch {
		case strings.HasPrefix(name, "go_"), strings.HasPrefix(name, "process_"):
			continue // client_golang's collectors
		case !strings.HasPrefix(name, "dhtkv_"):
			t.Errorf("%v read %s, which is not a dhtkv metric", panels, name)
		case !strings.Contains(code, `"`+name+`"`):
			t.Errorf("%v read %s, which no Go file of the module defines", panels, name)
		}
	}
}

// notBeforeExchange are the metrics a panel reads that a node exports for
// a peer only once it has run an anti-entropy exchange with it: before,
// there is no true value (no success time, no differences found, no
// progress). exported, after traffic, checks that they then appear.
var notBeforeExchange = map[string]bool{
	"dhtkv_antientropy_last_success_timestamp_seconds": true,
	"dhtkv_antientropy_partitions_differing":           true,
	"dhtkv_antientropy_exchange_progress_ratio":        true,
}

// A fresh cluster, before any request, exports every series the dashboard
// reads, on every node (but notBeforeExchange): panels show zeros, not
// "No data", until something happens. The counter vectors are the point:
// a vector exports nothing until a child is made, so each of them must
// make its known label values at the start (every peer's hints stored,
// replayed and dropped for each reason; each scan abort reason; read
// repairs; anti-entropy; connection refusals; each peer's replica calls).
func TestDashboardHasDataBeforeTraffic(t *testing.T) {
	d := loadDashboard(t)
	c := testcluster.Start(t, 3)
	wantSeries := map[string]int{ // on each node of 3: its 2 peers
		"dhtkv_hints_stored_total":          2,
		"dhtkv_hints_replayed_total":        2,
		"dhtkv_hints_dropped_total":         2 * 4, // window, cap, error, left
		"dhtkv_hints_pending_bytes":         2,
		"dhtkv_scan_aborts_total":           4,
		"dhtkv_read_repairs_total":          5,
		"dhtkv_antientropy_exchanges_total": 2,
		"dhtkv_antientropy_keys_total":      3,
		"dhtkv_antientropy_bytes_total":     2,
		"dhtkv_connections_refused_total":   2,
		"dhtkv_replica_failures_total":      2 * 2 * 3, // peer, get/put, timeout/silent/error
	}
	metrics := panelMetrics(t, d)
	for name := range wantSeries {
		require.Contains(t, metrics, name, "a panel reads %s", name)
	}
	for i := range c.Size() {
		families, err := c.Node(i).Registry().Gather()
		require.NoError(t, err)
		series := map[string][]*dto.Metric{}
		for _, f := range families {
			series[f.GetName()] = f.GetMetric()
		}
		for name, panels := range metrics {
			if notBeforeExchange[name] {
				continue
			}
			assert.NotEmpty(t, series[name], "node %d exports no %s before traffic: %v would say No data", i, name, panels)
		}
		for name, n := range wantSeries {
			assert.Len(t, series[name], n, "node %d: %s", i, name)
			for _, m := range series[name] {
				if name == "dhtkv_replica_failures_total" || name == "dhtkv_hints_pending_bytes" ||
					strings.HasPrefix(name, "dhtkv_hints_") || name == "dhtkv_scan_aborts_total" {
					v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
					assert.Zero(t, v, "node %d: %s %v before traffic", i, name, m.GetLabel())
				}
			}
		}
	}
}
