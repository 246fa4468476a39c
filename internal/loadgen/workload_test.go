package loadgen

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

func genFor(t *testing.T, cfg Config) *requestGen {
	t.Helper()
	g, err := newRequestGen(&cfg, cfg.Targets[0], 7, 1)
	noErr(t, err)
	return g
}

func TestMixedReadRatio(t *testing.T) {
	for _, ratio := range []float64{0, 0.5, 0.9, 1} {
		cfg := testConfig("http://127.0.0.1:8080")
		cfg.Workload = WorkloadMixed
		cfg.ReadRatio = ratio
		g := genFor(t, cfg)
		const n = 100000
		gets := 0
		for range n {
			if o, _ := g.next(); o == opGet {
				gets++
			}
		}
		near(t, ratio, float64(gets)/n, 0.01, "GET share at ratio %v", ratio)
	}
}

// End to end: the server sees GETs and PUTs in the configured proportion.
func TestMixedWorkloadOnTheWire(t *testing.T) {
	l := newRequestLog()
	cfg := testConfig(startServer(t, okHandler(l)))
	cfg.Workload = WorkloadMixed
	cfg.MaxRequests = 2000
	cfg.Duration = 20 * time.Second
	res, err := Run(context.Background(), cfg)
	noErr(t, err)

	eq(t, int64(2000), res.Requests, "requests")
	// A GET after a PUT once kept the PUT's Content-Length and stalled.
	eq(t, ErrorCounts{}, res.Errors, "errors")
	near(t, 0.9, float64(l.methods["GET"])/2000, 0.03, "GET share")
	eq(t, 2000, l.methods["GET"]+l.methods["PUT"], "GET+PUT")
	eq(t, res.Status["200"], int64(l.methods["GET"]), "200s = GETs")
	eq(t, res.Status["201"], int64(l.methods["PUT"]), "201s = PUTs")
}

func TestWorkloadMethods(t *testing.T) {
	for wl, method := range map[Workload]string{WorkloadGet: "GET", WorkloadPut: "PUT", WorkloadDelete: "DELETE"} {
		l := newRequestLog()
		cfg := testConfig(startServer(t, okHandler(l)))
		cfg.Workload = wl
		cfg.MaxRequests = 20
		res, err := Run(context.Background(), cfg)
		noErr(t, err)
		eq(t, map[string]int{method: 20}, l.methods, "methods of %s", wl)
		eq(t, int64(0), res.Non2xx, "non-2xx of %s", wl)
	}
}

// topShare is the fraction of draws that fell on the `top` most drawn keys.
func topShare(g *requestGen, draws, top int) float64 {
	counts := map[uint64]int{}
	for range draws {
		counts[g.keys.next()]++
	}
	c := make([]int, 0, len(counts))
	for _, n := range counts {
		c = append(c, n)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(c)))
	sum := 0
	for _, n := range c[:min(top, len(c))] {
		sum += n
	}
	return float64(sum) / float64(draws)
}

func TestZipfConcentratesTraffic(t *testing.T) {
	cfg := testConfig("http://127.0.0.1:8080")
	cfg.Keyspace = 100000
	cfg.Dist = DistZipf
	zipf := topShare(genFor(t, cfg), 200000, 100)
	cfg.Dist = DistUniform
	uniform := topShare(genFor(t, cfg), 200000, 100)

	// s=1.1 over 100000 keys puts ~58% of the mass on the first 100 keys;
	// uniform puts ~0.1% there.
	ok(t, zipf > 0.45, "zipf top-100 share %.3f", zipf)
	ok(t, uniform < 0.01, "uniform top-100 share %.3f", uniform)

	cfg.Dist = DistZipf
	g := genFor(t, cfg)
	for range 10000 {
		if k := g.keys.next(); k >= cfg.Keyspace {
			t.Fatalf("key %d outside keyspace %d", k, cfg.Keyspace)
		}
	}
}

func TestURIs(t *testing.T) {
	cfg := testConfig("http://localhost:9000")
	g := genFor(t, cfg)
	eq(t, "http://localhost:9000/v0/entity?id=k17", string(g.uriFor(17)), "plain")

	cfg.Ack, cfg.From = 2, 3
	g = genFor(t, cfg)
	eq(t, "http://localhost:9000/v0/entity?id=k17&ack=2&from=3", string(g.uriFor(17)), "with ack/from")
	_, uri := g.next()
	re := regexp.MustCompile(`^http://localhost:9000/v0/entity\?id=k\d+&ack=2&from=3$`)
	ok(t, re.Match(uri), "uri %s", uri)

	eq(t, "&from=3", string(ackFromSuffix(0, 3)), "from only")
}

// The server receives ack and from when they are set, and neither when not.
func TestAckFromOnTheWire(t *testing.T) {
	for _, af := range [][2]int{{2, 3}, {0, 0}} {
		l := newRequestLog()
		cfg := testConfig(startServer(t, okHandler(l)))
		cfg.Ack, cfg.From = af[0], af[1]
		cfg.MaxRequests = 10
		_, err := Run(context.Background(), cfg)
		noErr(t, err)
		eq(t, 10, len(l.queries), "queries")
		for _, q := range l.queries {
			if af[0] > 0 {
				ok(t, strings.HasSuffix(q, fmt.Sprintf("&ack=%d&from=%d", af[0], af[1])), "query %q", q)
			} else {
				ok(t, !strings.Contains(q, "ack") && !strings.Contains(q, "from"), "query %q", q)
			}
		}
	}
}

func TestLoopbackOnly(t *testing.T) {
	for _, good := range []string{"http://127.0.0.1:8080", "http://127.1.2.3:80", "http://localhost:8080",
		"http://[::1]:8080", "http://127.0.0.1", "http://127.0.0.1:8080/", "https://127.0.0.1:8443", "https://localhost"} {
		_, err := TargetAddr(good)
		ok(t, err == nil, "%s refused: %v", good, err)
	}
	for _, bad := range []string{"http://10.0.0.1:80", "http://192.168.1.1:8080", "http://example.com:80",
		"http://0.0.0.0:8080", "http://[::]:8080", "https://10.0.0.1:8443", "ftp://127.0.0.1:21", "127.0.0.1:8080",
		"http://127.0.0.1:8080/v0/entity"} {
		_, err := TargetAddr(bad)
		ok(t, err != nil, "%s accepted", bad)
	}

	cfg := testConfig("http://127.0.0.1:8080", "http://10.0.0.1:80")
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), `host "10.0.0.1" is not a loopback address`) {
		t.Errorf("Run with a non-loopback target: err = %v", err)
	}
	_, err = Fill(context.Background(), cfg, 10)
	ok(t, err != nil, "Fill accepted a non-loopback target")
}

func TestValidateBoundsTheRun(t *testing.T) {
	mutate := map[string]func(*Config){
		"zero duration": func(c *Config) { c.Duration = 0 },
		"too long":      func(c *Config) { c.Duration = 2 * time.Hour },
		"no targets":    func(c *Config) { c.Targets = nil },
		"bad workload":  func(c *Config) { c.Workload = "scan" },
		"bad dist":      func(c *Config) { c.Dist = "pareto" },
		"zipf s":        func(c *Config) { c.Dist, c.ZipfS = DistZipf, 1 },
		"read ratio":    func(c *Config) { c.Workload, c.ReadRatio = WorkloadMixed, 1.5 },
		"connections":   func(c *Config) { c.Connections = 0 },
		"fewer conns": func(c *Config) {
			c.Targets = []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}
		},
		"negative rate":     func(c *Config) { c.Rate = -1 },
		"timeout":           func(c *Config) { c.Timeout = 0 },
		"keyspace":          func(c *Config) { c.Keyspace = 0 },
		"negative max reqs": func(c *Config) { c.MaxRequests = -1 },
	}
	for name, m := range mutate {
		cfg := testConfig("http://127.0.0.1:8080")
		m(&cfg)
		ok(t, cfg.Validate() != nil, "%s accepted", name)
	}
	cfg := testConfig("http://127.0.0.1:8080")
	noErr(t, cfg.Validate())
}

// Workers are spread round-robin over targets: with 4 connections on 2
// targets each target gets 2 workers and about half of the load.
func TestTargetsShareTheLoad(t *testing.T) {
	l1, l2 := newRequestLog(), newRequestLog()
	cfg := testConfig(startServer(t, okHandler(l1)), startServer(t, okHandler(l2)))
	cfg.Connections = 4
	cfg.Rate = 400
	cfg.Duration = 500 * time.Millisecond
	res, err := Run(context.Background(), cfg)
	noErr(t, err)

	near(t, 200, res.Requests, 2, "requests")
	eq(t, int(res.Requests), l1.total()+l2.total(), "requests seen")
	near(t, 100, l1.total(), 30, "first target")
	near(t, 100, l2.total(), 30, "second target")
}
