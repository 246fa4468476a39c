// Package loadgen is dhtkv's HTTP load generator: closed-loop (wrk-like) and
// constant-rate (wrk2-like, coordinated-omission corrected) runs against the
// entity API, with HdrHistogram latency reports in wrk2's layout (with or
// without its detailed percentile spectrum), in JSON, or as vegeta's JSON
// report.
//
// The generator is a library so that its scheduler and accounting can be
// tested against real in-process servers; cmd/dhtkv-load is a thin flag
// wrapper around Fill and Run.
package loadgen

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

// Workload names which requests a run sends.
type Workload string

// The workloads understood by Run.
const (
	WorkloadPut    Workload = "put"
	WorkloadGet    Workload = "get"
	WorkloadMixed  Workload = "mixed"
	WorkloadDelete Workload = "delete"
)

// Dist names how keys are drawn from the keyspace.
type Dist string

// The key distributions understood by Run.
const (
	DistUniform Dist = "uniform"
	DistZipf    Dist = "zipf"
)

// Limits that keep every run bounded (a workplace rule) and inside what the
// latency histogram can represent.
const (
	MaxDuration    = time.Hour
	MaxTimeout     = time.Minute
	MaxConnections = 10000
	MaxValueSize   = 16 << 20
)

// Config describes one run. Zero values are not defaults: start from
// DefaultConfig so that omitted settings match the command's flags.
type Config struct {
	Targets     []string // base URLs, e.g. http://127.0.0.1:8080 or https://; loopback only
	Workload    Workload
	ReadRatio   float64 // fraction of GETs in the mixed workload
	Dist        Dist
	ZipfS       float64 // zipf exponent, > 1
	ZipfV       float64 // zipf offset, >= 1
	Keyspace    uint64  // keys are k0..k(Keyspace-1)
	ValueSize   int     // PUT body size in bytes
	Ack, From   int     // replication parameters; 0 omits them from the URL
	Connections int     // workers = connections, spread round-robin over Targets
	Rate        float64 // total requests/s; 0 selects the closed loop
	Duration    time.Duration
	Warmup      time.Duration // runs before Duration; sent but not recorded
	// Drain bounds how long, after Duration, a constant-rate run keeps sending
	// requests that were scheduled inside Duration but could not be sent yet
	// because every connection was busy. Dropping them silently would hide
	// exactly the queueing a constant-rate run exists to show; whatever is
	// still unsent when Drain expires is reported as Result.Unsent.
	Drain       time.Duration
	MaxRequests int64         // hard bound on requests sent by Run (0 = none)
	Timeout     time.Duration // per request, from the moment it is sent
	Seed        uint64        // 0 picks a time-based seed
	// TLSCA names a PEM file of the CA certificates https:// targets'
	// certificates must chain to (--tls-ca). Each connection handshakes
	// once, when it is first used. Empty: the system's roots.
	TLSCA string
	// Timeline adds the run's latency second by second to the result
	// (Result.Timeline, --timeline). Default off.
	Timeline bool
	// Mark, if not nil, is a window that whoever runs the load may open
	// and close during the run; its requests are summed up apart
	// (Result.Marked). Default nil.
	Mark *Mark
}

// DefaultConfig returns the settings the command uses when no flag is given.
func DefaultConfig() Config {
	return Config{
		Targets:     []string{"http://127.0.0.1:8080"},
		Workload:    WorkloadGet,
		ReadRatio:   0.9,
		Dist:        DistUniform,
		ZipfS:       1.1,
		ZipfV:       1,
		Keyspace:    100000,
		ValueSize:   1024,
		Connections: 64,
		Duration:    30 * time.Second,
		Drain:       10 * time.Second,
		Timeout:     2 * time.Second,
	}
}

// Mode is "rate" for a constant-rate run and "closed" for a closed loop.
func (c *Config) Mode() string {
	if c.Rate > 0 {
		return "rate"
	}
	return "closed"
}

// Validate checks every setting, including the loopback-only rule for
// targets, and reports all problems at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if len(c.Targets) == 0 {
		bad("no targets given")
	}
	for _, t := range c.Targets {
		if _, err := TargetAddr(t); err != nil {
			errs = append(errs, err)
		}
	}
	switch c.Workload {
	case WorkloadPut, WorkloadGet, WorkloadDelete:
	case WorkloadMixed:
		if !(c.ReadRatio >= 0 && c.ReadRatio <= 1) {
			bad("read ratio %v: must be in [0, 1]", c.ReadRatio)
		}
	default:
		bad("workload %q: must be put, get, mixed or delete", c.Workload)
	}
	switch c.Dist {
	case DistUniform:
	case DistZipf:
		// math/rand/v2.NewZipf returns nil outside these bounds.
		if !(c.ZipfS > 1) {
			bad("zipf s %v: must be > 1", c.ZipfS)
		}
		if !(c.ZipfV >= 1) {
			bad("zipf v %v: must be >= 1", c.ZipfV)
		}
	default:
		bad("dist %q: must be uniform or zipf", c.Dist)
	}
	if c.Keyspace == 0 {
		bad("keyspace must be > 0")
	}
	if c.ValueSize < 0 || c.ValueSize > MaxValueSize {
		bad("value size %d: must be in [0, %d]", c.ValueSize, MaxValueSize)
	}
	if c.Ack < 0 || c.From < 0 {
		bad("ack %d / from %d: must be >= 0", c.Ack, c.From)
	}
	if c.Connections < 1 || c.Connections > MaxConnections {
		bad("connections %d: must be in [1, %d]", c.Connections, MaxConnections)
	} else if c.Connections < len(c.Targets) {
		bad("connections %d: fewer than the %d targets, some would get no traffic", c.Connections, len(c.Targets))
	}
	// A slot interval beyond MaxDuration schedules one request at most,
	// and one beyond MaxInt64 ns overflows the schedule's arithmetic.
	if !(c.Rate >= 0) || c.Rate > 1e8 || c.Rate > 0 && c.Rate < 1/MaxDuration.Seconds() {
		bad("rate %v: must be 0 (closed loop) or in [1/%v, 1e8] requests/s", c.Rate, MaxDuration)
	}
	if c.Duration <= 0 || c.Duration > MaxDuration {
		bad("duration %v: must be > 0 and <= %v", c.Duration, MaxDuration)
	}
	if c.Warmup < 0 || c.Warmup > MaxDuration {
		bad("warmup %v: must be in [0, %v]", c.Warmup, MaxDuration)
	}
	if c.Drain < 0 || c.Drain > MaxDuration {
		bad("drain %v: must be in [0, %v]", c.Drain, MaxDuration)
	}
	if c.MaxRequests < 0 {
		bad("max requests %d: must be >= 0", c.MaxRequests)
	}
	if c.Timeout <= 0 || c.Timeout > MaxTimeout {
		bad("timeout %v: must be > 0 and <= %v", c.Timeout, MaxTimeout)
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid load config: %w", errors.Join(errs...))
	}
	return nil
}

// TargetAddr validates a target base URL and returns its host:port. Only
// http or https to a loopback host is accepted: this generator must never
// be pointed at another machine.
func TargetAddr(target string) (string, error) {
	addr, _, err := parseTarget(target)
	return addr, err
}

// parseTarget is TargetAddr, and whether the target is https.
func parseTarget(target string) (addr string, https bool, err error) {
	u, err := url.Parse(target)
	if err != nil {
		return "", false, fmt.Errorf("target %q: %w", target, err)
	}
	port := "80"
	switch u.Scheme {
	case "http":
	case "https":
		https, port = true, "443"
	default:
		return "", false, fmt.Errorf("target %q: scheme must be http or https", target)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return "", false, fmt.Errorf("target %q: must be a base URL like http://127.0.0.1:8080", target)
	}
	host := u.Hostname()
	if !isLoopbackHost(host) {
		return "", false, fmt.Errorf("target %q: host %q is not a loopback address (127.0.0.0/8, localhost, ::1); load may only be sent to this machine", target, host)
	}
	if u.Port() != "" {
		port = u.Port()
	}
	return net.JoinHostPort(host, port), https, nil
}

// tlsConfig is the configuration of connections to https targets.
func (c *Config) tlsConfig() (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLSCA == "" {
		return conf, nil
	}
	var err error
	if conf.RootCAs, err = tlsconf.LoadPool(c.TLSCA); err != nil {
		return nil, fmt.Errorf("tls ca: %w", err)
	}
	return conf, nil
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	return ip.Unmap().IsLoopback()
}
