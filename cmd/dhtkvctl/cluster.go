package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/dhtkv/dhtkv/client"
)

const membershipHelp = `Membership changes are asked of one member's admin listener (--admin,
its --admin-listen), which drives them (docs/membership.md):

  join URL              add the node at URL, and start it with --join
                        naming a member, before or after (started before,
                        it waits for the join: --join-wait)
  decommission URL      move the node's partitions to the others; it then
                        stops by itself. Refused when fewer nodes than the
                        replication factor would be left (lower it first
                        with replicas N, or --force)
  remove DEAD           shrink the cluster by a dead node whose machine
                        will not come back (no spare to replace it with):
                        a decommission that waits for nothing from it, the
                        others copying its partitions from the remaining
                        replicas. A write acknowledged by the dead node
                        alone (ack=1) is lost. Refused while it answers,
                        and below the replication factor. During another
                        change it counts the node dead there: the change
                        finishes without it, and the node is removed
                        next (so two dead nodes are removed one after the
                        other); during the decommission of that node, the
                        decommission finishes without it
  replace DEAD NEW      give a dead node's identity to a new, empty machine
                        at NEW; start it with --join: it rebuilds the data.
                        Also during a change, for a member of it that died
                        (from read-new on, the only way to finish the
                        change): the change goes on once NEW has rebuilt
                        its partitions of both sets
  replicas N            change the replication factor to N (1 to the number
                        of nodes) over the same nodes: growing copies each
                        partition to its next-ranked node, shrinking drops
                        it from its last-ranked one at the end; while it
                        runs a request's ack is at most the smaller factor
                        (docs/membership.md)
  abort                 end the change under way with the old set of nodes
                        (before its read-new stage; needs the map's log)
  cluster               print the cluster map and the change under way

join, decommission, remove and replicas wait until the change is
complete (every stage, the partitions copied; a remove asked during
another change, until that one and the removal after it), printing each
stage, unless --no-wait; --wait-timeout bounds the wait (the change goes
on without the command). Exit 1 when the change is refused (another one
runs, except for a replace or a remove; a member does not answer; the node to
replace or remove answers; the factor is out of range or unchanged; a
decommission or a remove would leave fewer nodes than the factor) or
the wait times out.`

// membershipFlags are the flags of the membership commands.
type membershipFlags struct {
	admin       *string
	noWait      *bool
	waitTimeout *time.Duration
	asJSON      *bool
}

func newMembershipFlags(fs *flag.FlagSet, waits bool) membershipFlags {
	f := membershipFlags{
		admin:  fs.String("admin", "", "a member's admin listener, `host:port`: the node that drives the change"),
		asJSON: fs.Bool("json", false, "print maps as JSON"),
	}
	if waits {
		f.noWait = fs.Bool("no-wait", false, "return once the change has begun")
		f.waitTimeout = fs.Duration("wait-timeout", 30*time.Minute, "how long to wait for the change to complete")
	}
	return f
}

func clusterCmd(e *env, fs *flag.FlagSet) *ffcli.Command {
	f := newMembershipFlags(fs, false)
	return &ffcli.Command{
		Name: "cluster", ShortUsage: "dhtkvctl cluster --admin HOST:PORT [--json]",
		ShortHelp: "print a node's cluster map and the membership change under way",
		LongHelp:  membershipHelp, FlagSet: fs,
		Exec: func(_ context.Context, args []string) error {
			if err := f.check("cluster", args, 0); err != nil {
				return err
			}
			return e.withClient(func(ctx context.Context, c *client.Client) error {
				st, err := c.Cluster(ctx, *f.admin)
				if err != nil {
					return err
				}
				return printCluster(e.stdout, st, *f.asJSON)
			})
		},
	}
}

func changeCmd(e *env, fs *flag.FlagSet, name, usage, short string, nargs int,
	begin func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error)) *ffcli.Command {
	f := newMembershipFlags(fs, name != "replace" && name != "abort")
	return &ffcli.Command{
		Name: name, ShortUsage: "dhtkvctl " + name + " --admin HOST:PORT " + usage, ShortHelp: short,
		LongHelp: membershipHelp, FlagSet: fs,
		Exec: func(_ context.Context, args []string) error {
			if err := f.check(name, args, nargs); err != nil {
				return err
			}
			c, ctx, cancel, err := e.client()
			if err != nil {
				return err
			}
			defer cancel()
			defer c.Close()
			m, err := begin(ctx, c, *f.admin, args)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			verb := "begun"
			if name == "abort" {
				verb = "done"
			}
			fmt.Fprintf(e.stdout, "%s %s: %s\n", name, verb, describeMap(m))
			if f.noWait == nil || *f.noWait {
				return nil
			}
			return waitChange(e.stdout, c, *f.admin, m.Epoch, *f.waitTimeout)
		},
	}
}

func (f membershipFlags) check(name string, args []string, nargs int) error {
	switch {
	case len(args) != nargs:
		return usagef("%s takes %d arguments, got %d", name, nargs, len(args))
	case *f.admin == "":
		return usagef("%s needs --admin, a member's admin listener", name)
	}
	return nil
}

// waitChange polls the driver until its map has no change under way,
// printing every stage it sees.
func waitChange(w io.Writer, c *client.Client, admin string, from uint64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	seen := from
	for {
		st, err := c.Cluster(ctx, admin)
		if err == nil && st.Map.Epoch > seen {
			seen = st.Map.Epoch
			fmt.Fprintf(w, "%s\n", describeMap(st.Map))
			if st.Map.Change == nil && len(st.Map.Removing) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			last := ""
			if st != nil {
				last = st.Driver
			}
			return fmt.Errorf("the change did not complete within %v (it goes on): %s", timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func describeMap(m *client.ClusterMap) string {
	s := fmt.Sprintf("epoch %d, %d nodes, replication factor %d", m.Epoch, len(m.Nodes), m.Replicas)
	if ch := m.Change; ch != nil && ch.Kind == "replicas" {
		s += fmt.Sprintf(", changing to %d at stage %s", ch.Replicas, ch.Stage)
	} else if ch != nil && ch.Dead {
		s += fmt.Sprintf(", %s of %s (dead) at stage %s", ch.Kind, m.NodeURL(ch.Node), ch.Stage)
	} else if ch != nil {
		s += fmt.Sprintf(", %s of %s at stage %s", ch.Kind, m.NodeURL(ch.Node), ch.Stage)
	} else {
		s += ", no change under way"
	}
	for _, id := range m.Removing {
		s += fmt.Sprintf("; %s dead, removed next", m.NodeURL(id))
	}
	return s
}

func printCluster(w io.Writer, st *client.ClusterStatus, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(st)
	}
	fmt.Fprintf(w, "%s\n", describeMap(st.Map))
	if st.Driver != "" {
		fmt.Fprintf(w, "driver: %s\n", st.Driver)
	}
	if o := st.Last; o != nil {
		how := "completed"
		if o.Aborted {
			how = "aborted"
		}
		fmt.Fprintf(w, "last change: %s of node %d, epochs %d-%d, %s\n", o.Kind, o.Node, o.Began, o.Ended, how)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tSELF")
	for _, n := range st.Map.Nodes {
		self := ""
		if n.ID == st.Self {
			self = "*"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", n.ID, n.URL, self)
	}
	return tw.Flush()
}

func membershipCmds(e *env, fs func(string) *flag.FlagSet) []*ffcli.Command {
	decommission := fs("decommission")
	force := decommission.Bool("force", false, "decommission even when fewer nodes than the replication factor are left (each then holds every partition; refused without it)")
	return []*ffcli.Command{
		clusterCmd(e, fs("cluster")),
		changeCmd(e, fs("join"), "join", "URL", "add the node at URL to the cluster", 1,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				return c.Join(ctx, admin, args[0])
			}),
		changeCmd(e, decommission, "decommission", "URL", "move a node's partitions to the others and stop it", 1,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				var opts []client.ChangeOption
				if *force {
					opts = append(opts, client.Force())
				}
				return c.Decommission(ctx, admin, args[0], opts...)
			}),
		changeCmd(e, fs("remove"), "remove", "DEAD-URL", "remove a dead node from the cluster; its partitions are copied from the other replicas", 1,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				return c.Remove(ctx, admin, args[0])
			}),
		changeCmd(e, fs("replace"), "replace", "DEAD-URL NEW-URL", "give a dead node's identity to a new machine", 2,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				return c.Replace(ctx, admin, args[0], args[1])
			}),
		changeCmd(e, fs("replicas"), "replicas", "N", "change the replication factor to N", 1,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				n, err := strconv.Atoi(args[0])
				if err != nil || n < 1 {
					return nil, usagef("replicas takes the new replication factor, a whole number from 1 to the number of nodes, got %q", args[0])
				}
				return c.SetReplicas(ctx, admin, n)
			}),
		changeCmd(e, fs("abort"), "abort", "", "end the membership change under way with the old set of nodes", 0,
			func(ctx context.Context, c *client.Client, admin string, _ []string) (*client.ClusterMap, error) {
				return c.Abort(ctx, admin)
			}),
	}
}
