// Command dhtkvctl is the command-line client of dhtkv, in the style of
// etcdctl and redis-cli, built on package client:
//
//	dhtkvctl [global flags] get [--meta] KEY
//	dhtkvctl [global flags] put [--file PATH] [--ttl DURATION] KEY [VALUE]
//	dhtkvctl [global flags] del KEY
//	dhtkvctl [global flags] scan [--start KEY] [--end KEY] [--limit N] [--keys-only] [--json] [--local]
//	dhtkvctl [global flags] status [--members] [--json]
//	dhtkvctl [global flags] snapshot --admin HOST:PORT --dir PATH [--json]
//	dhtkvctl [global flags] repair --admin HOST:PORT [--json]
//	dhtkvctl [global flags] cluster --admin HOST:PORT [--json]
//	dhtkvctl [global flags] join --admin HOST:PORT [--no-wait] URL
//	dhtkvctl [global flags] decommission --admin HOST:PORT [--no-wait] [--force] URL
//	dhtkvctl [global flags] remove --admin HOST:PORT [--no-wait] DEAD-URL
//	dhtkvctl [global flags] replace --admin HOST:PORT DEAD-URL NEW-URL
//	dhtkvctl [global flags] replicas --admin HOST:PORT [--no-wait] N
//	dhtkvctl [global flags] abort --admin HOST:PORT
//
// Its exit codes are a contract for scripts (see usage below and
// README.md).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/sizeflag"
	"github.com/dhtkv/dhtkv/internal/tlsconf"
)

// Exit codes.
const (
	exitOK                = 0 // done; for get, the key was found
	exitError             = 1 // anything else: no endpoint answered, a 5xx, a broken stream, an unreachable endpoint in status
	exitUsage             = 2 // bad flags, arguments or command
	exitNotFound          = 3 // get: the key is absent or deleted (404)
	exitNotEnoughReplicas = 4 // fewer than ack replicas answered (504)
	exitBadRequest        = 5 // the node refused the request (4xx), e.g. bad ack/from, key or value too large, no token (401) or a role too low (403)
)

const rootHelp = `Global flags may also be set by environment variables: DHTKV_ENDPOINTS,
DHTKV_ACK, DHTKV_FROM, DHTKV_TIMEOUT, DHTKV_CACERT, DHTKV_CERT, DHTKV_KEY,
DHTKV_TOKEN, DHTKV_TOKEN_FILE, DHTKV_MAX_ANSWER_BYTES (a flag on the command
line wins). Every
command also takes the global flags after its name. Flags come before
arguments.

Tokens: nodes started with --client-tokens want a bearer token of a role
that allows the command (read: get, scan; write: put, del; admin:
snapshot, repair, join, decommission, remove, replace, replicas, abort; status
needs none, cluster read). Give it in DHTKV_TOKEN or a file (--token-file,
one line) rather than --token, which other local users see in ps. A missing token is 401
and a role too low 403: exit 5.

TLS: nodes started with --tls-cert serve only TLS. Give --cacert (the CA
their certificates chain to; the system's roots without it) or --cert
and --key (a client certificate, where the nodes ask for one): the
endpoints are then https, host:port included (an http:// endpoint is an
error). The admin listener (--admin of snapshot and repair) serves plain
HTTP whatever the flags.

EXIT CODES
  0  ok; for get, the key was found
  1  other error (no endpoint answered, a 5xx, a broken scan stream,
     an endpoint status could not reach)
  2  usage error
  3  not found (get)
  4  not enough replicas answered (504)
  5  request refused (a 4xx: bad ack/from, key or value too large,
     401 without a token the node knows, 403 with a role too low);
     the membership commands exit 1 when their change is refused (409)
     or, waited for, does not complete (aborted), as their help says`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// globals are the flags every command takes.
type globals struct {
	endpoints string
	ack, from int
	timeout   time.Duration
	// TLS, etcdctl's names: the CA file, the client certificate and key.
	cacert, cert, key string
	// The bearer token, or the file holding it.
	token, tokenFile string
	// maxAnswer is client.Config.MaxRecordBytes.
	maxAnswer int
}

// register defines the global flags on fs, all bound to g: the root's
// flags, parsed first (command line, then environment), and each
// command's, which override them when given after the command's name.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.endpoints, "endpoints", g.endpoints, "comma-separated node `URLs` (host:port means http, or https with --cacert, --cert or --key); a call moves on to the next when one is down")
	fs.IntVar(&g.ack, "ack", g.ack, "replicas that must answer (0: the node's default, a majority of from)")
	fs.IntVar(&g.from, "from", g.from, "replicas of the key (0: the node's default, the replication factor)")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "deadline of the whole command, scans included (0: none)")
	fs.StringVar(&g.cacert, "cacert", g.cacert, "PEM `file` of the CA certificates the nodes' TLS certificates chain to (default: the system's roots); makes the endpoints https")
	fs.StringVar(&g.cert, "cert", g.cert, "PEM `file` of a client certificate to present over TLS (with --key)")
	fs.StringVar(&g.key, "key", g.key, "PEM `file` of --cert's private key")
	fs.StringVar(&g.token, "token", g.token, "bearer `token` for nodes with --client-tokens (other local users see it in ps: prefer DHTKV_TOKEN or --token-file)")
	fs.StringVar(&g.tokenFile, "token-file", g.tokenFile, "`file` holding the bearer token, one line")
	sizeflag.Var(fs, &g.maxAnswer, "max-answer-bytes", "the largest value, scanned record or other answer a command reads, a `size` (raise it for nodes whose --max-value-bytes is larger)")
}

// check refuses the values of the numeric flags that mean nothing, as a
// usage error (exit 2) like a malformed one: the flag package takes -1
// for an int and -1s for a duration, and the client would send a
// negative ack or from the node answers 400 to, or drop it for the
// node's default; a negative --timeout would mean no deadline, and a
// --max-answer-bytes of 0 the client's default.
func (g *globals) check() error {
	switch {
	case g.ack < 0:
		return usagef("--ack %d: want 0 (the node's default) or more", g.ack)
	case g.from < 0:
		return usagef("--from %d: want 0 (the node's default) or more", g.from)
	case g.timeout < 0:
		return usagef("--timeout %v: want 0 (no deadline) or more", g.timeout)
	case g.maxAnswer <= 0:
		return usagef("--max-answer-bytes %d: want 1 or more", g.maxAnswer)
	}
	return nil
}

// bearerToken is the token the flags give: --token, or the one line of
// --token-file ("" without either).
func (g *globals) bearerToken() (string, error) {
	switch {
	case g.token != "" && g.tokenFile != "":
		return "", usagef("--token and --token-file: give one")
	case g.tokenFile == "":
		return g.token, nil
	}
	b, err := os.ReadFile(g.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b)) // a trailing newline, CRLF included
	if tok == "" || strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("--token-file %s: want one non-empty line, the token", g.tokenFile)
	}
	return tok, nil
}

// tlsConfig is the TLS configuration the flags describe, or nil without
// any of them.
func (g *globals) tlsConfig() (*tls.Config, error) {
	if g.cacert == "" && g.cert == "" && g.key == "" {
		return nil, nil
	}
	if (g.cert == "") != (g.key == "") {
		return nil, usagef("--cert and --key go together")
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if g.cacert != "" {
		pool, err := tlsconf.LoadPool(g.cacert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		conf.RootCAs = pool
	}
	if g.cert != "" {
		c, err := tls.LoadX509KeyPair(g.cert, g.key)
		if err != nil {
			return nil, fmt.Errorf("--cert and --key: %w", err)
		}
		conf.Certificates = []tls.Certificate{c}
	}
	return conf, nil
}

// usageError is a mistake in the command line (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// env is what a command runs with.
type env struct {
	g      *globals
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer // warnings; errors go through run's exit
}

// client returns a client of the endpoints and the command's context.
func (e *env) client() (*client.Client, context.Context, context.CancelFunc, error) {
	var eps []string
	for _, s := range strings.Split(e.g.endpoints, ",") {
		if s = strings.TrimSpace(s); s != "" {
			eps = append(eps, s)
		}
	}
	if len(eps) == 0 {
		return nil, nil, nil, usagef("--endpoints is empty")
	}
	tlsConf, err := e.g.tlsConfig()
	if err != nil {
		return nil, nil, nil, err
	}
	token, err := e.g.bearerToken()
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := client.New(client.Config{Endpoints: eps, TLSConfig: tlsConf, Token: token, MaxRecordBytes: e.g.maxAnswer})
	if err != nil {
		return nil, nil, nil, usageError{err.Error()}
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if e.g.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, e.g.timeout)
	}
	return c, ctx, cancel, nil
}

// options are the replication options of a call.
func (e *env) options() []client.Option {
	var o []client.Option
	if e.g.ack > 0 {
		o = append(o, client.WithAck(e.g.ack))
	}
	if e.g.from > 0 {
		o = append(o, client.WithFrom(e.g.from))
	}
	return o
}

// run is the whole command: it parses args, runs the command and returns
// the exit code. Results go to stdout; errors, one line, to stderr; -h
// writes the help to stdout.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	g := &globals{endpoints: "127.0.0.1:8080", timeout: 5 * time.Second, maxAnswer: 64 << 20}
	e := &env{g: g, stdin: stdin, stdout: stdout, stderr: stderr}
	var help bytes.Buffer // the flag package's output: -h's help, or noise after a parse error
	root := newRoot(e, &help)
	err := root.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		_, _ = io.Copy(stdout, &help)
		return exitOK
	case err != nil: // a flag the command does not know, or a bad value
		err = usageError{err.Error()}
	default:
		if err = g.check(); err == nil {
			err = root.Run(context.Background())
		}
	}
	code := exitCode(err)
	if code != exitOK {
		msg := err.Error()
		switch {
		case code == exitUsage:
			msg += " (see dhtkvctl -h)"
		case errors.Is(err, client.ErrAnswerTooLarge):
			msg += " (--max-answer-bytes)"
		}
		fmt.Fprintf(stderr, "dhtkvctl: %s\n", msg)
	}
	return code
}

// exitCode maps a command's error to the exit code scripts rely on.
func exitCode(err error) int {
	var usage usageError
	var bad *client.BadRequestError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &usage):
		return exitUsage
	case errors.Is(err, client.ErrNotFound):
		return exitNotFound
	case errors.Is(err, client.ErrNotEnoughReplicas):
		return exitNotEnoughReplicas
	case errors.As(err, &bad):
		return exitBadRequest
	}
	return exitError
}

// newRoot builds the command tree; every flag set writes to out.
func newRoot(e *env, out io.Writer) *ffcli.Command {
	fs := func(name string) *flag.FlagSet {
		f := flag.NewFlagSet(name, flag.ContinueOnError)
		f.SetOutput(out)
		e.g.register(f)
		return f
	}
	cmds := []*ffcli.Command{getCmd(e, fs("get")), putCmd(e, fs("put")), delCmd(e, fs("del")), scanCmd(e, fs("scan")), statusCmd(e, fs("status")), snapshotCmd(e, fs("snapshot")), repairCmd(e, fs("repair"))}
	cmds = append(cmds, membershipCmds(e, fs)...)
	rootFS := fs("dhtkvctl")
	version := new(buildinfo.Flag)
	rootFS.Var(version, "version", "print the version and exit")
	return &ffcli.Command{
		Name:        "dhtkvctl",
		ShortUsage:  "dhtkvctl [global flags] <command> [flags] [args]",
		LongHelp:    rootHelp,
		FlagSet:     rootFS,
		Options:     []ff.Option{ff.WithEnvVarPrefix("DHTKV")},
		Subcommands: cmds,
		Exec: func(_ context.Context, args []string) error {
			switch {
			case version.Asked():
				fmt.Fprintf(e.stdout, "dhtkvctl %s (%s)\n", buildinfo.Version(), buildinfo.GoVersion())
				return nil
			case len(args) == 0:
				return usagef("no command")
			}
			return usagef("unknown command %q", args[0])
		},
	}
}
