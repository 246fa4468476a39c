package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/scan/framing"
)

// withClient runs do with a client of the endpoints and the command's
// context.
func (e *env) withClient(do func(ctx context.Context, c *client.Client) error) error {
	c, ctx, cancel, err := e.client()
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	return do(ctx, c)
}

// call runs one request on key with a client of the endpoints and writes
// what it returns to stdout.
func (e *env) call(name, key string, do func(ctx context.Context, c *client.Client) ([]byte, error)) error {
	return e.withClient(func(ctx context.Context, c *client.Client) error {
		out, err := do(ctx, c)
		if err != nil {
			return fmt.Errorf("%s %q: %w", name, key, err)
		}
		_, err = e.stdout.Write(out)
		return err
	})
}

// ok is what put and del print when done, as etcdctl and redis-cli do.
const ok = "OK\n"

// keyCmd is a command on one KEY: do is its request.
func keyCmd(e *env, fs *flag.FlagSet, name, help string, do func(ctx context.Context, c *client.Client, key string) ([]byte, error)) *ffcli.Command {
	return &ffcli.Command{
		Name:       name,
		ShortUsage: "dhtkvctl " + name + " KEY",
		ShortHelp:  help,
		FlagSet:    fs,
		Exec: func(_ context.Context, args []string) error {
			if len(args) != 1 {
				return usagef("%s takes one KEY, not %d arguments", name, len(args))
			}
			return e.call(name, args[0], func(ctx context.Context, c *client.Client) ([]byte, error) {
				return do(ctx, c, args[0])
			})
		},
	}
}

const getHelp = `Without --meta, the value's exact bytes (no newline added). With --meta,
the value is not sent (a HEAD request) and one line per field is printed
instead:

  version     the write's version (the HTTP ETag): unique per write, higher
              for a later write of the key
  size        the value's length in bytes
  expires_at  when a value written with --ttl expires (RFC 3339, UTC), or
              "never"
  ttl         the whole seconds left until then, rounded up, a number
              (3600 for an hour; omitted with "never")

An absent, deleted or expired key exits 3 either way.`

func getCmd(e *env, fs *flag.FlagSet) *ffcli.Command {
	meta := fs.Bool("meta", false, "print the key's version, size and expiry instead of its value (the value is not transferred)")
	cmd := keyCmd(e, fs, "get", "write KEY's value to stdout, exactly its bytes, or with --meta its version, size and expiry (exit 3 if absent)",
		func(ctx context.Context, c *client.Client, key string) ([]byte, error) {
			if !*meta {
				return c.Get(ctx, key, e.options()...)
			}
			m, err := c.Stat(ctx, key, e.options()...)
			if err != nil {
				return nil, err
			}
			return formatMeta(m), nil
		})
	cmd.ShortUsage = "dhtkvctl get [--meta] KEY"
	cmd.LongHelp = getHelp
	return cmd
}

// formatMeta is get --meta's output (getHelp): ttl in whole seconds, the
// node's X-Dhtkv-TTL as it sent it (client.Meta.TTL is whole seconds
// already), a number a script reads without parsing Go's durations.
func formatMeta(m client.Meta) []byte {
	out := fmt.Appendf(nil, "version %d\nsize %d\n", m.Version, m.Size)
	if m.ExpiresAt.IsZero() {
		return append(out, "expires_at never\n"...)
	}
	return fmt.Appendf(out, "expires_at %s\nttl %d\n", m.ExpiresAt.UTC().Format("2006-01-02T15:04:05.000Z07:00"), int64(m.TTL/time.Second))
}

func delCmd(e *env, fs *flag.FlagSet) *ffcli.Command {
	return keyCmd(e, fs, "del", "delete KEY (deleting an absent key succeeds)",
		func(ctx context.Context, c *client.Client, key string) ([]byte, error) {
			return []byte(ok), c.Delete(ctx, key, e.options()...)
		})
}

// ttlFlag is put's --ttl: a duration in Go's syntax (90s, 1h30m) or a
// bare number of seconds, as the API's ttl takes it; whole seconds, 1 s
// or more.
type ttlFlag struct{ d time.Duration }

func (f *ttlFlag) String() string {
	if f == nil || f.d == 0 {
		return ""
	}
	return f.d.String()
}

func (f *ttlFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if n, nerr := strconv.ParseInt(s, 10, 64); nerr == nil {
		d, err = time.Duration(n)*time.Second, nil
		if n > int64(math.MaxInt64/time.Second) {
			err = errors.New("too long")
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("want a duration (60s, 1h30m) or a number of seconds: %w", err)
	case d < time.Second || d%time.Second != 0:
		return fmt.Errorf("%v: want whole seconds, 1s or more", d)
	}
	f.d = d
	return nil
}

func putCmd(e *env, fs *flag.FlagSet) *ffcli.Command {
	file := fs.String("file", "", "read the value from this `path`")
	var ttl ttlFlag
	fs.Var(&ttl, "ttl", "expire the value after this `duration` (60s, 1h30m, or seconds: 60); whole seconds, up to ten years (default: never)")
	return &ffcli.Command{
		Name:       "put",
		ShortUsage: "dhtkvctl put [--file PATH] [--ttl DURATION] KEY [VALUE]",
		ShortHelp:  "store a value: VALUE, the file's bytes, or stdin when neither is given",
		FlagSet:    fs,
		Exec: func(_ context.Context, args []string) error {
			var value []byte
			var err error
			switch {
			case len(args) == 0 || len(args) > 2:
				return usagef("put takes KEY [VALUE], not %d arguments", len(args))
			case len(args) == 2 && *file != "":
				return usagef("put: give the value as an argument or with --file, not both")
			case len(args) == 2:
				value = []byte(args[1])
			case *file != "":
				if value, err = os.ReadFile(*file); err != nil {
					return fmt.Errorf("put: %w", err)
				}
			default:
				if value, err = io.ReadAll(e.stdin); err != nil {
					return fmt.Errorf("put: reading stdin: %w", err)
				}
			}
			return e.call("put", args[0], func(ctx context.Context, c *client.Client) ([]byte, error) {
				opts := e.options()
				if ttl.d > 0 {
					opts = append(opts, client.WithTTL(ttl.d))
				}
				return []byte(ok), c.Put(ctx, args[0], value, opts...)
			})
		},
	}
}

const scanHelp = `Without --json, each record is two lines: the key, then the value (a
value or key holding a newline makes that ambiguous: use --json). With
--json, each record is one JSON object on its own line, as the API's
format=json writes it: "key" and "value" as strings when they are valid
UTF-8, else "key_base64" or "value_base64" (standard base64) instead.
The records are the whole cluster's, merged, newest version of each key
(--local: one node's own). --limit is applied by the node, which ends the
stream after that many records (at most 1000000000). A scan that fails
midway exits 1 after the records it received.`

func scanCmd(e *env, fs *flag.FlagSet) *ffcli.Command {
	start := fs.String("start", "", "first `key` (default: the first key)")
	end := fs.String("end", "", "`key` to stop before (default: past the last key)")
	limit := fs.Int("limit", 0, "at most this many records (0: all)")
	keysOnly := fs.Bool("keys-only", false, "print the keys only")
	asJSON := fs.Bool("json", false, "one JSON object per record")
	local := fs.Bool("local", false, "one node's own records (the first endpoint that answers), not the cluster's")
	return &ffcli.Command{
		Name:       "scan",
		ShortUsage: "dhtkvctl scan [--start KEY] [--end KEY] [--limit N] [--keys-only] [--json] [--local]",
		ShortHelp:  "list the records with start <= key < end, in key order",
		LongHelp:   scanHelp,
		FlagSet:    fs,
		Exec: func(_ context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("scan takes no arguments (flags come before arguments)")
			}
			if *limit < 0 {
				return usagef("--limit must not be negative")
			}
			opts := e.options()
			if *limit > 0 {
				opts = append(opts, client.WithLimit(*limit))
			}
			if *local {
				opts = append(opts, client.WithLocal())
			}
			return e.withClient(func(ctx context.Context, c *client.Client) error {
				var line []byte
				for rec, err := range c.Scan(ctx, *start, *end, opts...) {
					if err != nil {
						return fmt.Errorf("scan: %w", err)
					}
					switch {
					case *asJSON && *keysOnly:
						line = framing.AppendJSONKey(line[:0], rec.Key)
					case *asJSON:
						line = framing.AppendJSON(line[:0], rec.Key, rec.Value)
					case *keysOnly:
						line = fmt.Appendf(line[:0], "%s\n", rec.Key)
					default:
						line = fmt.Appendf(line[:0], "%s\n%s\n", rec.Key, rec.Value)
					}
					if _, err := e.stdout.Write(line); err != nil {
						return err // stdout closed (a pipe into head): stop
					}
				}
				return nil
			})
		},
	}
}

// endpointStatus is one line of status: an endpoint and what it answered.
type endpointStatus struct {
	Endpoint  string         `json:"endpoint"`
	Reachable bool           `json:"reachable"`
	Error     string         `json:"error,omitempty"`
	Status    *client.Status `json:"status,omitempty"`
	// MemberStates is each member's client.Member.State, by URL.
	MemberStates map[string]client.MemberState `json:"member_states,omitempty"`
}

func statusCmd(e *env, fs *flag.FlagSet) *ffcli.Command {
	asJSON := fs.Bool("json", false, "one JSON object per endpoint: endpoint, reachable, error, its /v0/status?verbose answer, and member_states (each member's up, down or unknown)")
	members := fs.Bool("members", false, "a row per member of each endpoint's cluster: its state as that endpoint sees it, last success, last error")
	return &ffcli.Command{
		Name:       "status",
		ShortUsage: "dhtkvctl status [--members] [--json]",
		ShortHelp:  "ask every endpoint for its status (exit 1 if one does not answer, cannot reach a quorum or refuses writes)",
		LongHelp: `Each endpoint is asked for /v0/status?verbose: whether it answers, its
version, uptime, the epoch of its cluster map (EPOCH: every member shows
the same once a change has spread), whether it is rebuilding, how many
members of its cluster are up as it sees them (UP, itself included, of
all), the hints it holds for members that missed writes (HINTS), when its
anti-entropy last
completed an exchange with every peer (SYNCED: the oldest of its peers'
last complete exchanges under its current cluster map; "never" if one
has none yet, as after every membership change), its data volume
(DISK: the share of it free; "full" while it refuses writes (507) for
having less than its --min-free-space free, "failed" once its store
failed a write, until it restarts), and its warnings (a full disk and
the emergency ballast whose deletion frees space at once, a clock off
from its peers', a rebuild, a peer not compared for two intervals).
It exits 1 when an endpoint does not answer, has no quorum, or refuses
writes.

A member is up when it answered the endpoint's last probe; down when that
probe failed; unknown when the endpoint has not reached it since it
started (no probe has ended, or none ever succeeded and the endpoint does
not say it failed). Only up counts in UP. With --members, a second table
lists each member with its state, the last probe that succeeded and the
last that failed.`,
		FlagSet: fs,
		Exec: func(_ context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("status takes no arguments")
			}
			return e.withClient(func(ctx context.Context, c *client.Client) error {
				// Every endpoint at once, each with the whole deadline: a
				// hung one must not use it up and make the endpoints
				// after it read as unreachable.
				eps := c.Endpoints()
				all := make([]endpointStatus, len(eps))
				var wg sync.WaitGroup
				for i, ep := range eps {
					wg.Go(func() {
						st, err := c.Status(ctx, ep)
						es := endpointStatus{Endpoint: ep, Reachable: err == nil, Status: st}
						if err != nil {
							es.Error = err.Error()
						} else {
							es.MemberStates = map[string]client.MemberState{}
							for _, m := range st.Members {
								es.MemberStates[m.URL] = m.State()
							}
						}
						all[i] = es
					})
				}
				wg.Wait()
				down := 0
				for _, es := range all {
					if !es.Reachable {
						down++
					}
				}
				if err := printStatus(e.stdout, all, *asJSON); err != nil {
					return err
				}
				if *members && !*asJSON {
					if err := printMembers(e.stdout, all); err != nil {
						return err
					}
				}
				if down > 0 {
					return fmt.Errorf("status: %d of %d endpoints did not answer", down, len(all))
				}
				for _, es := range all {
					if es.Status != nil && es.Status.NoQuorum != "" {
						return fmt.Errorf("status: %s has no quorum: %s", es.Endpoint, es.Status.NoQuorum)
					}
				}
				for _, es := range all {
					if es.Status != nil && es.Status.WritesFailing != "" {
						return fmt.Errorf("status: writes fail through %s: %s", es.Endpoint, es.Status.WritesFailing)
					}
				}
				for _, es := range all {
					if es.Status == nil || !es.Status.Disk.RefusesWrites() {
						continue
					}
					why := "its data volume is below --min-free-space"
					if d := es.Status.Disk; d.StoreError != "" {
						why = d.StoreError
					}
					return fmt.Errorf("status: %s refuses writes (507): %s", es.Endpoint, why)
				}
				return nil
			})
		},
	}
}

func printStatus(w io.Writer, all []endpointStatus, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, es := range all {
			if err := enc.Encode(es); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENDPOINT\tREACHABLE\tVERSION\tUPTIME\tEPOCH\tREBUILDING\tUP\tHINTS\tSYNCED\tDISK\tWARNINGS")
	for _, es := range all {
		if es.Status == nil {
			fmt.Fprintf(tw, "%s\tno\t-\t-\t-\t-\t-\t-\t-\t-\t%s\n", es.Endpoint, es.Error)
			continue
		}
		st := es.Status
		warnings := "-"
		if len(st.Warnings) > 0 {
			warnings = strings.Join(st.Warnings, "; ")
		}
		uptime := (time.Duration(st.UptimeSeconds) * time.Second).String()
		up, synced, hints := 0, "", int64(0)
		for _, m := range st.Members {
			if m.State() == client.MemberUp {
				up++
			}
			hints += m.HintsPendingBytes
			switch ae := m.AntiEntropy; {
			case ae == nil || synced == "never":
			case ae.LastComplete == nil:
				synced = "never"
			case synced == "" || ae.LastComplete.UTC().Format(time.RFC3339) < synced:
				synced = ae.LastComplete.UTC().Format(time.RFC3339)
			}
		}
		if synced == "" {
			synced = "-" // a cluster of one
		}
		fmt.Fprintf(tw, "%s\tyes\t%s\t%s\t%d\t%t\t%d/%d\t%s\t%s\t%s\t%s\n", es.Endpoint, st.Version, uptime, st.Epoch, st.Rebuilding, up, len(st.Members), strings.ReplaceAll(humanize.IBytes(uint64(hints)), " ", ""), synced, diskCell(st.Disk), warnings)
	}
	return tw.Flush()
}

// diskCell is the DISK column: the share of the node's data volume free,
// or why it refuses writes ("full", "failed"), or "-" when it does not
// say.
func diskCell(d *client.Disk) string {
	switch {
	case d == nil:
		return "-"
	case d.StoreError != "":
		return "failed"
	case d.Full:
		return "full"
	case d.TotalBytes == 0:
		return "-"
	}
	return fmt.Sprintf("%d%%", d.FreeBytes*100/d.TotalBytes)
}

// printMembers writes the --members table: each endpoint's members, their
// state as it sees them, and its last probes of them.
func printMembers(w io.Writer, all []endpointStatus) error {
	stamp := func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		return t.UTC().Format(time.RFC3339)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nENDPOINT\tMEMBER\tSTATE\tLAST SUCCESS\tLAST ERROR")
	for _, es := range all {
		if es.Status == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\n", es.Endpoint, es.Error)
			continue
		}
		for _, m := range es.Status.Members {
			last, lastErr := stamp(m.LastSuccess), "-"
			if m.Self {
				last = "(itself)"
			}
			if m.LastError != "" {
				lastErr = stamp(m.LastErrorAt) + " " + m.LastError
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", es.Endpoint, m.URL, m.State(), last, lastErr)
		}
	}
	return tw.Flush()
}

const snapshotHelp = `Asks the node whose admin listener is at --admin (its --admin-listen,
not its public address) for a consistent checkpoint of its store in
--dir, a new directory on the node's machine inside the node's
--snapshot-dir (default: its data directory's path with -snapshots
appended): a path relative to it, or an absolute one under it. On the
same filesystem as the node's data directory the checkpoint hard-links
the data files and takes well under a second; elsewhere it copies them:
raise --timeout (the node finishes the checkpoint even if dhtkvctl gave
up waiting). README.md, Backup and restore, says how to restore one and
which checkpoints must not be restored: the line printed says up to when
the snapshot holds every write the cluster acknowledged ("complete as
of"), which decides whether a node may start on it; a snapshot taken
before the node completed an anti-entropy exchange with every peer since
its start is of unknown completeness (a warning says so: run dhtkvctl
repair first). Exit 5 when the node refuses the
request (dir outside --snapshot-dir or existing, a snapshot already
running, no token of the admin role where the node has --client-tokens).`

func snapshotCmd(e *env, fs *flag.FlagSet) *ffcli.Command {
	admin := fs.String("admin", "", "the node's admin listener, `host:port`")
	dir := fs.String("dir", "", "`path` of the new directory on the node's machine: relative to its --snapshot-dir, or absolute inside it")
	asJSON := fs.Bool("json", false, "print the node's answer as JSON: dir, files, bytes, duration_seconds, complete_as_of, warning")
	return &ffcli.Command{
		Name:       "snapshot",
		ShortUsage: "dhtkvctl snapshot --admin HOST:PORT --dir PATH [--json]",
		ShortHelp:  "checkpoint one node's store into a new directory on its machine (a backup)",
		LongHelp:   snapshotHelp,
		FlagSet:    fs,
		Exec: func(_ context.Context, args []string) error {
			switch {
			case len(args) > 0:
				return usagef("snapshot takes no arguments")
			case *admin == "":
				return usagef("snapshot needs --admin, the node's admin listener")
			case *dir == "":
				return usagef("snapshot needs --dir")
			}
			return e.withClient(func(ctx context.Context, c *client.Client) error {
				s, err := c.Snapshot(ctx, *admin, *dir)
				if err != nil {
					return fmt.Errorf("snapshot: %w", err)
				}
				if *asJSON {
					return json.NewEncoder(e.stdout).Encode(s)
				}
				complete := "completeness unknown"
				if s.CompleteAsOf != nil {
					complete = "complete as of " + s.CompleteAsOf.UTC().Format(time.RFC3339)
				}
				if s.Warning != "" {
					fmt.Fprintf(e.stderr, "dhtkvctl: warning: %s\n", s.Warning)
				}
				_, err = fmt.Fprintf(e.stdout, "snapshot in %s: %d files, %d bytes, %.3f s; %s\n", s.Dir, s.Files, s.Bytes, s.DurationSeconds, complete)
				return err
			})
		},
	}
}

const repairHelp = `Asks the node whose admin listener is at --admin (its --admin-listen,
not its public address) to run an anti-entropy exchange with every peer
now, one after another (--ae-concurrency on the node), and waits for them:
each compares the two nodes' data partition by partition and moves only
the records that differ, newest version winning (docs/replication.md).
Prints one line per peer; exits 1 if an exchange did not complete (a peer
down, say), with the reason in the ERROR column. A large difference may
take longer than --timeout: the node finishes the exchanges anyway.`

func repairCmd(e *env, fs *flag.FlagSet) *ffcli.Command {
	admin := fs.String("admin", "", "the node's admin listener, `host:port`")
	asJSON := fs.Bool("json", false, "print the node's answer as JSON, one object per peer")
	return &ffcli.Command{
		Name:       "repair",
		ShortUsage: "dhtkvctl repair --admin HOST:PORT [--json]",
		ShortHelp:  "compare one node's data with every peer's now and exchange what differs",
		LongHelp:   repairHelp,
		FlagSet:    fs,
		Exec: func(_ context.Context, args []string) error {
			switch {
			case len(args) > 0:
				return usagef("repair takes no arguments")
			case *admin == "":
				return usagef("repair needs --admin, the node's admin listener")
			}
			return e.withClient(func(ctx context.Context, c *client.Client) error {
				xs, err := c.Repair(ctx, *admin)
				if err != nil {
					return fmt.Errorf("repair: %w", err)
				}
				if err := printRepair(e.stdout, xs, *asJSON); err != nil {
					return err
				}
				failed := 0
				for _, x := range xs {
					if x.Error != "" {
						failed++
					}
				}
				if failed > 0 {
					return fmt.Errorf("repair: %d of %d exchanges did not complete", failed, len(xs))
				}
				return nil
			})
		},
	}
}

func printRepair(w io.Writer, xs []client.Exchange, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		for _, x := range xs {
			if err := enc.Encode(x); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tDIFFERING\tPULLED\tPUSHED\tFAILED\tBYTES\tSECONDS\tERROR")
	for _, x := range xs {
		errText := "-"
		if x.Error != "" {
			errText = x.Error
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%d\t%d\t%.3f\t%s\n", x.Peer, x.PartitionsDiffering, x.Partitions,
			x.Pulled, x.Pushed, x.Failed, x.SummaryBytes+x.RecordBytes, x.DurationSeconds, errText)
	}
	return tw.Flush()
}
