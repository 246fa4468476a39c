package admin

import (
	"flag"
	"fmt"
	"net/http"
	"time"
)

// Options bound what a client may make the admin listener hold. The
// probes and /metrics need no token, so whoever reaches the port could
// otherwise keep connections, a goroutine and a descriptor each, open
// for good, and a profile runs as long as its client asks. Zero fields
// take the defaults noted.
type Options struct {
	// ReadTimeout is the time to read a whole request, headers and body
	// (--admin-read-timeout; default 10 s). Admin requests are a line and
	// a few headers: no endpoint reads a body.
	ReadTimeout time.Duration
	// WriteTimeout is the time from the end of a request's headers to the
	// end of its answer (--admin-write-timeout; default 1 min).
	// net/http/pprof adds a profile's or a trace's seconds to it (since
	// Go 1.23 it no longer refuses a longer one): MaxProfile bounds
	// those. POST /repair, POST /snapshot and the membership changes
	// (POST /cluster/...) are not bounded by it: they answer when the
	// exchanges, the checkpoint or the map's log end, however long that
	// takes.
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request before it is closed (--admin-idle-timeout; default
	// 1 min, longer than Prometheus' scrape interval).
	IdleTimeout time.Duration
	// MaxProfile is the longest CPU profile, trace or delta profile
	// (/debug/pprof/...?seconds=N) the port takes; a longer one is
	// refused with 400 (--admin-max-profile; default 10 min). The longest
	// the project takes are dhtkv-bench's, --duration long (30 s by
	// default), and loadtest/pinned.sh's, a third of HOLD (20 s by
	// default).
	MaxProfile time.Duration
	// MaxConnections is how many connections the admin port holds open at
	// once; one more is answered 503 and closed (--admin-max-connections;
	// default 64, 0: the default). Each holds a descriptor, which the
	// public port's default cap (--max-connections 0) leaves to Pebble,
	// the process and the admin port together: the default fits in that
	// reserve (node.reservedFiles). The node applies it (node.Serve).
	MaxConnections int
}

// DefaultOptions returns the defaults Options documents.
func DefaultOptions() Options {
	return Options{ReadTimeout: 10 * time.Second, WriteTimeout: time.Minute, IdleTimeout: time.Minute, MaxProfile: 10 * time.Minute, MaxConnections: 64}
}

// RegisterFlags defines the options' flags, with their current values as
// defaults.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.ReadTimeout, "admin-read-timeout", o.ReadTimeout, "time to read a whole request on the admin port (0: the default)")
	fs.DurationVar(&o.WriteTimeout, "admin-write-timeout", o.WriteTimeout, "time to answer a request on the admin port, a profile's seconds added; POST /repair, /snapshot and /cluster/... are not bounded by it (0: the default)")
	fs.DurationVar(&o.IdleTimeout, "admin-idle-timeout", o.IdleTimeout, "how long an idle keep-alive connection to the admin port stays open (0: the default)")
	fs.DurationVar(&o.MaxProfile, "admin-max-profile", o.MaxProfile, "longest CPU profile, trace or delta profile (/debug/pprof/...?seconds=N) the admin port takes; longer, 400 (0: the default)")
	fs.IntVar(&o.MaxConnections, "admin-max-connections", o.MaxConnections, "most `connections` open at once to the admin port; beyond, 503 and closed (0: the default)")
}

// Validate refuses negative durations and caps, and a MaxProfile under a
// second.
func (o *Options) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"--admin-read-timeout", o.ReadTimeout}, {"--admin-write-timeout", o.WriteTimeout}, {"--admin-idle-timeout", o.IdleTimeout}, {"--admin-max-profile", o.MaxProfile}} {
		if f.d < 0 {
			return fmt.Errorf("%s %v: must not be negative (0: the default)", f.name, f.d)
		}
	}
	if o.MaxConnections < 0 {
		return fmt.Errorf("--admin-max-connections %d: must not be negative (0: the default)", o.MaxConnections)
	}
	if o.MaxProfile > 0 && o.MaxProfile < time.Second {
		return fmt.Errorf("--admin-max-profile %v: at least 1s, profiles are taken in whole seconds (0: the default)", o.MaxProfile)
	}
	return nil
}

// EnsureDefaults fills the zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	d := DefaultOptions()
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = d.ReadTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = d.WriteTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = d.IdleTimeout
	}
	if o.MaxProfile <= 0 {
		o.MaxProfile = d.MaxProfile
	}
	if o.MaxConnections <= 0 {
		o.MaxConnections = d.MaxConnections
	}
}

// NewServer returns the admin listener's server for h (Mux's handler),
// with o's timeouts (zero fields: the defaults). ReadTimeout covers the
// headers too: net/http uses it when ReadHeaderTimeout is 0. Once a
// request is read, body and all, net/http clears the read deadline (its
// background read only watches for the client going away), so a
// request's context is not cancelled when ReadTimeout passes during a
// long profile.
func NewServer(h http.Handler, o Options) *http.Server {
	o.EnsureDefaults()
	return &http.Server{Handler: h, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, IdleTimeout: o.IdleTimeout}
}

// unbounded serves h's requests other than GET with unboundedWrite: a
// membership change's answer waits for the map's log (up to a minute and
// more when it has no leader, whose 503 says so), and an answer cut off by
// the write timeout would hide whether the change was made.
func unbounded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			unboundedWrite(w)
		}
		h.ServeHTTP(w, r)
	})
}

// unboundedWrite lifts the server's WriteTimeout from the answer being
// written on w: for handlers whose work ends by itself (a repair, a
// checkpoint) and may take longer than a profile. A ResponseWriter that
// cannot (a test's recorder) has no deadline to lift.
func unboundedWrite(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
}
