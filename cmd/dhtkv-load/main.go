// Command dhtkv-load is dhtkv's load generator: closed-loop (like wrk) or
// constant-rate with coordinated-omission correction (like wrk2) runs of PUT,
// GET, mixed or DELETE requests against one or more local dhtkv nodes.
//
//	dhtkv-load --targets http://127.0.0.1:8080 --workload get --rate 20000 \
//	    --connections 64 --duration 30s --fill 100000 --keyspace 100000
//
// --targets takes base URLs or host:port. The report goes to stdout in the
// --output format: text (wrk2's layout), wrk2 (the same with wrk2
// --latency's detailed percentile spectrum), json (one object, dhtkv-load's
// own schema; --json is short for it) or vegeta (the object vegeta report
// -type=json prints); logs go to stderr. The exit
// code is 0 when some request succeeded (a 2xx, or a 404 for a GET), 1
// when none did (no answer, 5xx, other 4xx) or the run failed, 2 for bad
// arguments.
//
// SIGUSR1 (or --marked-from-start) opens a marked window of the run and
// SIGUSR2 closes it: the requests due inside it are also summed up apart
// ("marked" in the JSON, a line of the text report), so that a script can
// report the clients' latency while something it started (a membership
// change, a rebuild) was at work, from the same run as the rest
// (loadgen.Mark). Go ignores SIGUSR1 and SIGUSR2 in a program that does
// not listen to them, so one sent before main listens is lost, not fatal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dhtkv/dhtkv/internal/loadgen"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the flags that are not part of loadgen.Config.
type options struct {
	fill     int64
	readAll  int64
	fillOnly bool
	output   loadgen.Output
	// markedFromStart opens the marked window as the run starts.
	markedFromStart bool
}

func parseFlags(args []string, stderr io.Writer) (loadgen.Config, options, error) {
	cfg := loadgen.DefaultConfig()
	var opt options
	fs := flag.NewFlagSet("dhtkv-load", flag.ContinueOnError)
	fs.SetOutput(stderr)

	targets := fs.String("targets", strings.Join(cfg.Targets, ","), "comma-separated base URLs (http:// or https://) or host:port (loopback only); workers are spread round-robin over them")
	fs.StringVar(&cfg.TLSCA, "tls-ca", "", "PEM `file` of the CA certificates https:// targets' certificates must chain to (default: the system's roots)")
	workload := fs.String("workload", string(cfg.Workload), "put, get, mixed or delete")
	dist := fs.String("dist", string(cfg.Dist), "key distribution: uniform or zipf")
	fs.Float64Var(&cfg.ReadRatio, "read-ratio", cfg.ReadRatio, "mixed workload: fraction of GETs (the rest are PUTs)")
	fs.Float64Var(&cfg.ZipfS, "zipf-s", cfg.ZipfS, "zipf exponent s (> 1)")
	fs.Float64Var(&cfg.ZipfV, "zipf-v", cfg.ZipfV, "zipf offset v (>= 1)")
	fs.Uint64Var(&cfg.Keyspace, "keyspace", cfg.Keyspace, "number of keys: k0..k<keyspace-1>")
	fs.IntVar(&cfg.ValueSize, "value-size", cfg.ValueSize, "PUT body size in bytes")
	fs.IntVar(&cfg.Ack, "ack", 0, "ack parameter sent with every request (0 = omitted)")
	fs.IntVar(&cfg.From, "from", 0, "from parameter sent with every request (0 = omitted)")
	fs.IntVar(&cfg.Connections, "connections", cfg.Connections, "connections = workers, in total over all targets")
	fs.Float64Var(&cfg.Rate, "rate", 0, "total requests/s on a constant schedule (latency from intended send time); 0 = closed loop")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured duration (> 0, <= 1h)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "warm-up before the measured duration: requests are sent but not recorded")
	fs.DurationVar(&cfg.Drain, "drain", cfg.Drain, "constant rate: how long after --duration requests scheduled inside it may still be sent late")
	fs.Int64Var(&cfg.MaxRequests, "max-requests", 0, "hard upper bound on requests sent, warm-up included (0 = none)")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "per-request timeout")
	fs.BoolVar(&cfg.Timeline, "timeline", false, "add the latency second by second (requests, failures, p50, p99, max) to --json's output, to see stalls when they happen")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "random seed for keys and operations (0 = time-based)")
	fs.Int64Var(&opt.fill, "fill", 0, "before the run, PUT keys k0..k<fill-1> once each with --connections workers")
	fs.Int64Var(&opt.readAll, "read-all", 0, "before the run (after --fill), GET keys k0..k<read-all-1> once each with --connections workers, so that the read caches hold them (with --ack and --from at the replication factor, every replica's)")
	fs.BoolVar(&opt.markedFromStart, "marked-from-start", false, "open the marked window (else opened by SIGUSR1) as the run starts, for a script that began what it measures before the load; SIGUSR2 closes it")
	fs.BoolVar(&opt.fillOnly, "fill-only", false, "exit after --fill and --read-all without a run (prefills a server for other tools, such as the wrk scripts)")
	output := fs.String("output", string(loadgen.OutputText), "report `format`: text (wrk2's summary), wrk2 (text and wrk2 --latency's detailed percentile spectrum), json (one object, dhtkv-load's schema) or vegeta (vegeta report -type=json's object)")
	asJSON := fs.Bool("json", false, "short for --output json")

	err := fs.Parse(args)
	if err != nil {
		return cfg, opt, err
	}
	if fs.NArg() > 0 {
		return cfg, opt, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cfg.Targets = nil
	for _, t := range strings.Split(*targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			cfg.Targets = append(cfg.Targets, targetURL(t))
		}
	}
	if opt.output, err = loadgen.ParseOutput(*output); err != nil {
		return cfg, opt, err
	}
	if *asJSON {
		outputSet := false
		fs.Visit(func(f *flag.Flag) { outputSet = outputSet || f.Name == "output" })
		if outputSet && opt.output != loadgen.OutputJSON {
			return cfg, opt, fmt.Errorf("--json and --output %s: choose one", opt.output)
		}
		opt.output = loadgen.OutputJSON
	}
	cfg.Workload = loadgen.Workload(*workload)
	cfg.Dist = loadgen.Dist(*dist)
	if opt.fill < 0 || opt.fill > loadgen.MaxFill {
		return cfg, opt, fmt.Errorf("--fill %d: must be in [0, %d]", opt.fill, loadgen.MaxFill)
	}
	if opt.readAll < 0 || opt.readAll > loadgen.MaxFill {
		return cfg, opt, fmt.Errorf("--read-all %d: must be in [0, %d]", opt.readAll, loadgen.MaxFill)
	}
	if opt.fillOnly && opt.fill == 0 && opt.readAll == 0 {
		return cfg, opt, errors.New("--fill-only needs --fill N or --read-all N")
	}
	return cfg, opt, cfg.Validate()
}

// targetURL makes a --targets entry a base URL: host:port (as dhtkvctl
// and the nodes' --listen take it) means http://host:port. url.Parse
// cannot take host:port itself: it reads "localhost:8080" as a scheme
// and an opaque part, and refuses "127.0.0.1:8080".
func targetURL(t string) string {
	if !strings.Contains(t, "://") {
		t = "http://" + t
	}
	return strings.TrimSuffix(t, "/")
}

func run(args []string, stdout, stderr io.Writer) int {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cfg, opt, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		log.Error("bad arguments", "err", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg.Mark = new(loadgen.Mark)
	defer markOnSignals(cfg.Mark)()

	for _, pre := range []struct {
		name string
		keys int64
		pass func(context.Context, loadgen.Config, int64) (loadgen.FillResult, error)
	}{{"fill", opt.fill, loadgen.Fill}, {"read-all", opt.readAll, loadgen.ReadAll}} {
		if pre.keys == 0 {
			continue
		}
		log.Info(pre.name+" starting", "keys", pre.keys, "connections", cfg.Connections)
		res, err := pre.pass(ctx, cfg, pre.keys)
		if err != nil {
			log.Error(pre.name+" failed", "err", err, "retried", res.Retried)
			return 1
		}
		log.Info(pre.name+" done", "keys", res.Keys, "elapsed", res.Elapsed.Round(1e6).String(),
			"keys_per_s", fmt.Sprintf("%.0f", res.Rate()), "retried", res.Retried)
	}
	if opt.fillOnly {
		return 0
	}

	if opt.markedFromStart {
		cfg.Mark.Open(time.Now())
	}
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		log.Error("run failed", "err", err)
		return 1
	}
	if ctx.Err() != nil {
		log.Warn("run interrupted: the result covers only the time before the signal")
	}
	if res.Unsent > 0 {
		log.Warn("constant-rate schedule not kept: requests scheduled in the window were never sent",
			"unsent", res.Unsent, "drain", cfg.Drain.String())
	}
	if err := res.Write(stdout, opt.output); err != nil {
		log.Error("write result", "err", err)
		return 1
	}
	succeeded := res.Succeeded()
	if cfg.Workload != loadgen.WorkloadGet && cfg.Workload != loadgen.WorkloadMixed {
		succeeded -= res.Status["404"] // a 404 answers a GET only
	}
	if succeeded == 0 {
		// The report is written first: it says how they failed.
		log.Error("every request failed: no 2xx or 404 answer", "requests", res.Requests,
			"connect_errors", res.Errors.Connect, "timeouts", res.Errors.Timeout, "other_errors", res.Errors.Other,
			"non_2xx", res.Non2xx)
		return 1
	}
	return 0
}

// markOnSignals opens m on SIGUSR1 and closes it on SIGUSR2, until the
// function it returns is called.
func markOnSignals(m *loadgen.Mark) (stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGUSR1 {
					m.Open(time.Now())
				} else {
					m.Close(time.Now())
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
		<-exited
	}
}
