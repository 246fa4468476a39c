// Command dhtkv runs one node of the dhtkv key-value store.
//
//	dhtkv --listen 127.0.0.1:8080 --data-dir ./data/node1 [--admin-listen 127.0.0.1:6060]
//	      [--cluster http://127.0.0.1:8080,http://127.0.0.1:8081 --self http://127.0.0.1:8080]
//
// Every flag can also come from a DHTKV_* environment variable or from the
// --config file; the command line wins over the environment, which wins
// over the file (parseFlags). See README.md for every flag. SIGTERM or
// SIGINT stops it gracefully: stop accepting, finish in-flight requests
// (bounded by --shutdown-timeout), close Pebble, exit 0. SIGHUP rereads
// the client token file (--client-tokens) and the TLS files (--tls-cert,
// --tls-key, --peer-tls-ca) without a restart; a file that does not load
// leaves what was in use, and the error is logged.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/peterbourgon/ff/v3"

	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/membership"
	"github.com/dhtkv/dhtkv/internal/node"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usage heads dhtkv -h, above the flags.
const usage = `usage: dhtkv [flags]

Every flag can also be set by an environment variable named after it
(--cache-bytes: DHTKV_CACHE_BYTES=64MiB) and by a line of the file that
--config names ("cache-bytes 64MiB"; blank lines and # comments are
ignored). A flag on the command line wins over the environment, which wins
over the file. An empty variable counts as unset.

flags:`

// settings are what one run is made of: the node's configuration and what
// the command itself does with it.
type settings struct {
	cfg       node.Config
	shutdown  time.Duration
	logLevel  slog.Level
	logFormat string
	version   buildinfo.Flag
	minProcs  int
	// unknownEnv are the DHTKV_* variables set that name no flag (ff
	// ignores them), sorted.
	unknownEnv []string
}

// parseFlags reads the flags from args, then from DHTKV_* environment
// variables, then from the --config file, each source setting only the
// flags the ones before it left unset. -h writes the help to stdout and
// returns flag.ErrHelp.
func parseFlags(args []string, stdout io.Writer) (*settings, error) {
	s := &settings{cfg: node.DefaultConfig()}
	cfg := &s.cfg
	fs := flag.NewFlagSet("dhtkv", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints one line itself
	fs.String("config", "", "read flags from this `file`, one per line: name, a space, the value (command-line flags and DHTKV_* variables win)")
	cfg.RegisterFlags(fs)
	fs.DurationVar(&s.shutdown, "shutdown-timeout", 10*time.Second, "how long to wait for in-flight requests on SIGTERM")
	logLevel := fs.String("log-level", "info", "`level`: debug, info, warn, error")
	fs.StringVar(&s.logFormat, "log-format", "text", "`format` of the log lines on stderr: text (key=value) or json (one object per line)")
	fs.Var(&s.version, "version", "print the version and exit")
	fs.IntVar(&s.minProcs, "min-procs", defaultMinProcs, "run at least this many Go Ps (GOMAXPROCS) when the process has fewer cores, so that requests need not wait behind Pebble's flushes and compactions; not under a CPU quota, nor when GOMAXPROCS is set; 0: Go's choice")
	err := ff.Parse(fs, args,
		ff.WithEnvVarPrefix("DHTKV"),
		ff.WithConfigFileFlag("config"),
		ff.WithConfigFileParser(configParser(fs)))
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stdout, usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil, err
	case err != nil:
		return nil, err
	case s.version.Asked():
		return s, nil
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case s.minProcs < 0:
		return nil, errors.New("--min-procs must not be negative")
	case s.shutdown <= 0:
		// A spent context: every stop would cut the requests in flight
		// and leave the store unclosed.
		return nil, fmt.Errorf("--shutdown-timeout %v: must be positive", s.shutdown)
	}
	s.unknownEnv = unknownEnv(fs, os.Environ())
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := s.logLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if _, err := newLogger(io.Discard, s.logFormat, s.logLevel); err != nil {
		return nil, err
	}
	return s, nil
}

// ctlEnv are dhtkvctl's variables (its global flags), which an operator
// may well have exported where a node starts: not dhtkv's, but not a
// mistake either.
var ctlEnv = []string{"DHTKV_ENDPOINTS", "DHTKV_ACK", "DHTKV_FROM", "DHTKV_TIMEOUT", "DHTKV_CACERT", "DHTKV_CERT", "DHTKV_KEY", "DHTKV_TOKEN", "DHTKV_TOKEN_FILE", "DHTKV_MAX_ANSWER_BYTES"}

// unknownEnv returns the DHTKV_* variables of environ (KEY=value) that
// name none of fs's flags (as ff names them: upper case, -, . and / as _)
// and are not dhtkvctl's, sorted, each once.
func unknownEnv(fs *flag.FlagSet, environ []string) []string {
	known := map[string]bool{}
	for _, v := range ctlEnv {
		known[v] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		known["DHTKV_"+strings.ToUpper(strings.NewReplacer("-", "_", ".", "_", "/", "_").Replace(f.Name))] = true
	})
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "DHTKV_") && !known[name] && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// configParser is ff.PlainParser, line by line, so that an error names
// the file (the value of --config, or DHTKV_CONFIG, when ff opens it) and
// the line: "node1.conf:4: error setting flag ...". A flag name alone on
// its line means true; for a flag that is not boolean, that is a missing
// value, said so rather than "true" refused or, worse, taken (--listen
// true).
func configParser(fs *flag.FlagSet) ff.ConfigFileParser {
	return func(r io.Reader, set func(name, value string) error) error {
		file := fs.Lookup("config").Value.String()
		sc := bufio.NewScanner(r)
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			err := ff.PlainParser(strings.NewReader(line), func(name, value string) error {
				if f := fs.Lookup(name); f != nil && !isBoolFlag(f) && !strings.Contains(strings.TrimSpace(line), " ") {
					return fmt.Errorf("%q has no value (only a boolean flag may stand alone)", name)
				}
				return set(name, value)
			})
			if err != nil {
				return fmt.Errorf("%s:%d: %w", file, n, err)
			}
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		return nil
	}
}

// isBoolFlag reports whether f is a boolean flag, which may be given
// without a value.
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// newLogger returns the logger writing to w in format (text or json) at
// level and above (a slog.Level, or a *slog.LevelVar to change later).
func newLogger(w io.Writer, format string, level slog.Leveler) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func run(args []string, stdout, stderr io.Writer) int {
	s, err := parseFlags(args, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "dhtkv: %v (see dhtkv -h)\n", err)
		return 2
	case s.version.Asked():
		fmt.Fprintf(stdout, "dhtkv %s (%s)\n", buildinfo.Version(), buildinfo.GoVersion())
		return 0
	}
	// Before the node starts: the store sets its WAL's sync interval from
	// GOMAXPROCS.
	procsBefore, procs := raiseProcs(s.minProcs)
	cfg := s.cfg
	// A level the admin listener's /log-level changes while the node runs.
	cfg.LogLevel = new(slog.LevelVar)
	cfg.LogLevel.Set(s.logLevel)
	cfg.Logger, _ = newLogger(stderr, s.logFormat, cfg.LogLevel) // checked by parseFlags
	// last is the node's last line when it does not start: one line of
	// text, or under --log-format json one record like all the others, so
	// that a log shipper reading JSON lines reads it too.
	last := func(level slog.Level, line string) {
		if s.logFormat == "json" {
			cfg.Logger.Log(context.Background(), level, line)
			return
		}
		fmt.Fprintf(stderr, "dhtkv: %s\n", line)
	}
	// Before the node derives its connection cap from the limit; logged
	// once it started, so that a refused configuration stays one line.
	nofile, nofileErr := raiseNoFile()
	// Before the node starts: SIGHUP's default action ends the process,
	// and a certificate renewal may signal a node that is still starting.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// And SIGTERM/SIGINT: a supervisor (or a test) may stop the node as
	// soon as it answers, before Start has returned here; the signal then
	// waits in the channel and the node shuts down cleanly at once.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)

	// Everything the node creates (data and snapshot directories, Pebble's
	// files, hints, the clock bound) is its own: 0700 directories and 0600
	// files, whatever the invoking shell's umask.
	syscall.Umask(0o077)
	// A stop asked while the node waits to be joined (--join-wait) ends
	// the wait: the signal is in sig as well, and the wait's end is not a
	// failure.
	startCtx, startDone := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	n, err := node.StartContext(startCtx, cfg)
	stopped := startCtx.Err() != nil
	startDone()
	if err != nil && stopped {
		last(slog.LevelWarn, err.Error())
		return 0
	}
	if errors.Is(err, membership.ErrLeft) {
		// Not a failure: the node is done (see membership.ErrLeft).
		last(slog.LevelWarn, err.Error())
		return 0
	}
	if err != nil {
		// Still one line; a misspelt variable may be why.
		note := ""
		if len(s.unknownEnv) > 0 {
			note = fmt.Sprintf("; the environment has variables no flag reads, misspelt perhaps: %s (dhtkv -h lists them)", strings.Join(s.unknownEnv, ", "))
		}
		last(slog.LevelError, err.Error()+note)
		return 1
	}
	if procs != procsBefore {
		cfg.Logger.Info("GOMAXPROCS raised to --min-procs", "cores", runtime.NumCPU(), "go_chose", procsBefore, "gomaxprocs", procs)
	}
	for _, name := range s.unknownEnv {
		cfg.Logger.Warn("environment variable ignored: no flag has its name (dhtkv -h lists them)", "name", name)
	}
	if nofileErr != nil {
		// Not fatal: the cap is derived from whatever limit there is.
		cfg.Logger.Warn("could not raise the descriptor limit", "err", nofileErr)
	} else {
		cfg.Logger.Info("descriptor limit (soft raised to hard)", "soft_before", nofile.before, "soft", nofile.soft, "hard", nofile.hard)
	}
	code := 0
	for stop := false; !stop; {
		select {
		case <-hup:
			// Logged either way; a failed reload keeps the files in use.
			_ = n.Reload()
		case got := <-sig:
			cfg.Logger.Info("shutting down", "signal", got.String())
			stop = true
		case <-n.Left():
			cfg.Logger.Info("shutting down: this node left the cluster (decommissioned, or removed as dead); its data directory is no longer used")
			stop = true
		case err := <-n.Failed():
			// A node that accepts no connections, or can no longer follow
			// the map's log, must not look alive to a supervisor: stop
			// cleanly, then exit non-zero.
			cfg.Logger.Error("shutting down: the node cannot go on", "err", err)
			code, stop = 1, true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.shutdown)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		cfg.Logger.Error("shutdown", "err", err)
		return 1
	}
	return code
}

// noFile is RLIMIT_NOFILE before and after raiseNoFile.
type noFile struct{ before, soft, hard uint64 }

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard limit, so that the
// connection cap derived from it (node.DefaultMaxConnections) is as high
// as the system allows. Go's runtime already raises the soft limit to one
// below the hard one at start-up (syscall's init, since Go 1.19); this
// takes the last descriptor and makes both limits visible in the log.
func raiseNoFile() (noFile, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return noFile{}, fmt.Errorf("getrlimit RLIMIT_NOFILE: %w", err)
	}
	l := noFile{before: lim.Cur, soft: lim.Cur, hard: lim.Max}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return l, fmt.Errorf("setrlimit RLIMIT_NOFILE to %d: %w", lim.Max, err)
		}
		l.soft = lim.Max
	}
	return l, nil
}
