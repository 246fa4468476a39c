package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/clustermap"
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
                        runs a write needs ack of each set (all of a smaller
                        one), and a read's ack is at most the factor of the
                        set it reads (docs/membership.md)
  abort                 end the change under way with the old set of nodes
                        (before its read-new stage; needs the map's log)
  cluster               print the cluster map and the change under way

join, decommission, remove and replicas wait until the change is
complete (every stage, the partitions copied; a remove asked during
another change, until that one and the removal after it), printing each
stage and then "<change> completed", unless --no-wait; --wait-timeout
bounds the wait (the change goes on without the command). Exit 1 when the
change is refused (another one runs, except for a replace or a remove; a
member has not acknowledged the current map, being down or behind; the
node to replace or remove answers, a refusal included; the factor
is out of range or unchanged; a decommission or a remove would leave fewer
nodes than the factor), when it does not complete (aborted by a
dhtkvctl abort, from here or elsewhere: "join of node 5 (URL) aborted at
epoch 20"; a decommission whose node a remove counted dead ends as that
remove), or when the wait times out.`

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

// changeAnswer is the least a membership command waits for the node's
// answer to its request, whatever --timeout: the node proposes the change
// to the map's log for up to 30 s before it answers that the outcome is
// not known (package membership's logCallTimeout).
const changeAnswer = 35 * time.Second

// changeCmd is a membership command: begin asks for the change, and own,
// for a command that waits (nil: replace and abort, which are over as they
// begin), identifies the change begin began, from the map the node
// answered with and the command's arguments, so that the wait tells that
// change's outcome from what the cluster did next.
func changeCmd(e *env, fs *flag.FlagSet, name, usage, short string, nargs int,
	begin func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error),
	own func(m *client.ClusterMap, args []string) (ownChange, error)) *ffcli.Command {
	f := newMembershipFlags(fs, own != nil)
	shortUsage := "dhtkvctl " + name + " --admin HOST:PORT"
	if own != nil {
		shortUsage += " [--no-wait]"
	}
	if usage != "" { // abort takes no arguments
		shortUsage += " " + usage
	}
	return &ffcli.Command{
		Name: name, ShortUsage: shortUsage, ShortHelp: short,
		LongHelp: membershipHelp, FlagSet: fs,
		Exec: func(_ context.Context, args []string) error {
			if err := f.check(name, args, nargs); err != nil {
				return err
			}
			c, _, cancel, err := e.client()
			if err != nil {
				return err
			}
			defer cancel()
			defer c.Close()
			// The node answers once the map's log took the change or
			// refused it, or after changeAnswer with a 503 saying the
			// outcome is not known: a shorter --timeout would give up
			// on a change the node goes on to make.
			bctx, bcancel := context.Background(), context.CancelFunc(func() {})
			if e.g.timeout > 0 {
				bctx, bcancel = context.WithTimeout(bctx, max(e.g.timeout, changeAnswer))
			}
			m, err := begin(bctx, c, *f.admin, args)
			bcancel()
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%s: the outcome is unknown: %s did not answer in time, and the change may still be made (see dhtkvctl cluster --admin %s): %w",
					name, *f.admin, *f.admin, err)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			verb := "begun"
			if name == "abort" {
				verb = "done"
			}
			fmt.Fprintf(e.stdout, "%s %s: %s\n", name, verb, describeMap(m))
			if next := nextStep(name, args); next != "" {
				fmt.Fprintln(e.stdout, next)
			}
			if f.noWait == nil || *f.noWait {
				return nil
			}
			ch, err := own(m, args)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return waitChange(e.stdout, c, *f.admin, ch, *f.waitTimeout)
		},
	}
}

// nextStep is what the operator does next after a join or a replace
// began (a line of its own after the change's; stderr holds only the
// error), "" after the others. A join's node may not run yet (either order is
// allowed), and until it answers the writes that need it in the new
// replica sets fail at factor 1 or 2; a replace is over as it begins,
// before its new machine ever started, so its output alone looks like
// nothing happened.
func nextStep(name string, args []string) string {
	switch name {
	case "join":
		return fmt.Sprintf("next: if %s is not running yet, start it now with an empty --data-dir and --join naming a member: "+
			"until it answers, the writes that need it fail at a replication factor of 1 or 2 (dhtkvctl status says so)", args[0])
	case "replace":
		return fmt.Sprintf("next: start the new machine at %s with an empty --data-dir and --join naming a member: "+
			"it rebuilds the node's data from the other replicas before it serves reads", args[1])
	}
	return ""
}

func (f membershipFlags) check(name string, args []string, nargs int) error {
	switch {
	case len(args) != nargs && nargs == 0:
		return usagef("%s takes no arguments, got %d", name, len(args))
	case len(args) != nargs && nargs == 1:
		return usagef("%s takes 1 argument, got %d", name, len(args))
	case len(args) != nargs:
		return usagef("%s takes %d arguments, got %d", name, nargs, len(args))
	case *f.admin == "":
		return usagef("%s needs --admin, a member's admin listener", name)
	case f.waitTimeout != nil && !*f.noWait && *f.waitTimeout <= 0:
		return usagef("--wait-timeout %v: want more than 0 (--no-wait does not wait)", *f.waitTimeout)
	}
	return nil
}

// ownChange is the change a command began, as the cluster records its
// outcome (client.ChangeOutcome, the admin answer's "last"): its kind, its
// node, and the epoch of the map the request was answered with. No join
// gets an id another node had (a map's next_id only grows, an abort
// included), and the changes that have stages follow one another, each
// over its own epochs, so kind, node and epoch name one change: not the
// one an operator asks for next, nor one of the same node before.
type ownChange struct {
	// what names the change in messages: "join of node 5
	// (http://10.0.0.5:8080)", "replicas change to 3".
	what string
	// kinds are the outcome kinds that are this change: its own, and for
	// a decommission "remove", which it ends as once a remove counted its
	// node dead (superseded).
	kinds []string
	// node is the outcome's node: the node joined, decommissioned or
	// removed, or for a replicas change its driver (-1: not known).
	node int
	// epoch is the epoch of the map the node answered the request with:
	// the change's first map (a request the log answered again after an
	// uncertain outcome may get a later one of the same change).
	epoch uint64
	// remove: the change is a remove, whose outcome may begin before
	// epoch (during the decommission of its node, which it finishes) or
	// after it (during another change, the removal after that one).
	remove bool
	// done reports whether a map with no change under way shows the
	// change's effect, and if not what it shows instead: the verdict when
	// the change's outcome record was overwritten before the command saw
	// it (a later change ended between two polls).
	done func(m *client.ClusterMap) (bool, string)
}

// is reports whether outcome o is this change's.
func (c ownChange) is(o *client.ChangeOutcome) bool {
	switch {
	case o == nil || !slices.Contains(c.kinds, o.Kind) || (c.node >= 0 && o.Node != c.node):
		return false
	case o.Ended <= c.epoch:
		// Ended before the request was answered: another change's. A
		// remove during another change records itself as ended at the
		// epoch it counts the node dead in: only the removal after it,
		// later, is the remove's outcome.
		return false
	}
	// A remove's outcome may have begun before epoch: the decommission
	// of its node, which it marked dead and finished. Any other began at
	// or before epoch: a later one is a change of the same node asked
	// after this one ended.
	return c.remove || o.Began <= c.epoch
}

// verdict is the command's error for its change's outcome o: nil when
// the change completed as asked.
func (c ownChange) verdict(o *client.ChangeOutcome) error {
	switch {
	case o.Aborted:
		return fmt.Errorf("%w at epoch %d", c.failed("aborted"), o.Ended)
	case !c.remove && o.Kind == "remove":
		return fmt.Errorf("%w at epoch %d: a remove counted the node dead, its partitions were copied from the other replicas", c.failed("ended as a remove"), o.Ended)
	}
	return nil
}

// failed is the error of a change that did not complete: how it ended.
func (c ownChange) failed(how string) error {
	return fmt.Errorf("%s %s", c.what, how)
}

// ownJoin, ownDecommission, ownRemove and ownReplicas identify the
// change their command began from the node's answer (ownChange).
func ownJoin(m *client.ClusterMap, args []string) (ownChange, error) {
	id, u, err := nodeAt(m, args[0])
	if err != nil {
		return ownChange{}, err
	}
	return ownChange{
		what: fmt.Sprintf("join of node %d (%s)", id, u), kinds: []string{"join"}, node: id, epoch: m.Epoch,
		done: func(m *client.ClusterMap) (bool, string) {
			return m.NodeURL(id) == u, fmt.Sprintf("node %d is not a member", id)
		},
	}, nil
}

func ownDecommission(m *client.ClusterMap, args []string) (ownChange, error) {
	id, u, err := nodeAt(m, args[0])
	if err != nil {
		return ownChange{}, err
	}
	return ownChange{
		what: fmt.Sprintf("decommission of node %d (%s)", id, u), kinds: []string{"decommission", "remove"}, node: id, epoch: m.Epoch,
		done: func(m *client.ClusterMap) (bool, string) {
			return m.NodeURL(id) == "", fmt.Sprintf("node %d is still a member", id)
		},
	}, nil
}

func ownRemove(m *client.ClusterMap, args []string) (ownChange, error) {
	id, u, err := nodeAt(m, args[0])
	if err != nil {
		return ownChange{}, err
	}
	return ownChange{
		what: fmt.Sprintf("remove of node %d (%s)", id, u), kinds: []string{"remove"}, node: id, epoch: m.Epoch, remove: true,
		done: func(m *client.ClusterMap) (bool, string) {
			return m.NodeURL(id) == "", fmt.Sprintf("node %d is still a member", id)
		},
	}, nil
}

func ownReplicas(m *client.ClusterMap, args []string) (ownChange, error) {
	n, err := strconv.Atoi(args[0]) // checked by the command before it began
	if err != nil {
		return ownChange{}, err
	}
	driver := -1
	if ch := m.Change; ch != nil && ch.Kind == "replicas" {
		driver = ch.Node
	}
	return ownChange{
		what: fmt.Sprintf("replicas change to %d", n), kinds: []string{"replicas"}, node: driver, epoch: m.Epoch,
		done: func(m *client.ClusterMap) (bool, string) {
			return m.Replicas == n, fmt.Sprintf("the replication factor is %d", m.Replicas)
		},
	}, nil
}

// nodeAt returns the id of the node at url in m, and its URL as the map
// spells it.
func nodeAt(m *client.ClusterMap, url string) (int, string, error) {
	u, err := clustermap.NormalizeURL(url)
	if err != nil {
		return 0, "", err
	}
	for _, n := range m.Nodes {
		if n.URL == u {
			return n.ID, u, nil
		}
	}
	return 0, "", fmt.Errorf("the node's answer, %s, does not name %s: see dhtkvctl cluster", describeMap(m), u)
}

// waitChange polls the driver until its map has no change under way,
// printing every stage it sees, and returns nil if the change ch
// completed, or an error naming how it ended otherwise. The end of "a
// change under way" alone does not tell: an aborted change ends in a map
// without one as a completed one does. The outcome is the driver's record
// of the last change that ended ("last"), matched to ch; an abort is
// reported as soon as it is seen, while the rest of the wait (a removal
// counted dead during the change) would go on. Should a later change's
// record overwrite ch's between two polls, the final map says whether
// ch's effect is there (its node a member, or not; the factor).
func waitChange(w io.Writer, c *client.Client, admin string, ch ownChange, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	seen, completed := ch.epoch, false
	var st *client.ClusterStatus
	for {
		s, err := c.Cluster(ctx, admin)
		if err != nil && ch.takesAway(st) && leftEverywhere(ctx, c, st.Map, st.Map.NodeURL(st.Self)) {
			// The node asked is the one the change takes away: it stops
			// once its map no longer has it, which every other member's
			// says too.
			_, err := fmt.Fprintf(w, "%s completed (the node asked left the cluster and stopped; no other member's map has it)\n", ch.what)
			return err
		}
		if err == nil {
			st = s
			if st.Map.Epoch > seen {
				seen = st.Map.Epoch
				fmt.Fprintf(w, "%s\n", describeMap(st.Map))
			}
			if ch.is(st.Last) {
				if err := ch.verdict(st.Last); err != nil {
					return err
				}
				completed = true
			}
			// A map older than the answer's (the driver installs it a
			// moment after the log applied it) still shows the map
			// before the change.
			if st.Map.Epoch >= ch.epoch && st.Map.Change == nil && len(st.Map.Removing) == 0 {
				return ended(w, ch, st, completed)
			}
		}
		select {
		case <-ctx.Done():
			last := ""
			if st != nil {
				last = st.Driver
			}
			return fmt.Errorf("%s did not complete within %v (it goes on): %s", ch.what, timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// takesAway reports whether st, the last answer of the node asked, is
// the answer of the node ch removes from the cluster (a decommission or
// remove of the admin node itself).
func (c ownChange) takesAway(st *client.ClusterStatus) bool {
	return st != nil && st.Map != nil && c.node >= 0 && st.Self == c.node && slices.ContainsFunc(c.kinds, func(k string) bool {
		return k == "decommission" || k == "remove"
	})
}

// leftEverywhere asks the other members of m for their status
// (GET /v0/status?verbose) and reports whether one answers with no
// change under way and without u among its members, and none answers
// with u among them.
func leftEverywhere(ctx context.Context, c *client.Client, m *client.ClusterMap, u string) bool {
	answered := false
	for _, n := range m.Nodes {
		if n.URL == u {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.Status(sctx, n.URL)
		cancel()
		if err != nil {
			continue
		}
		if st.Change != "" || slices.ContainsFunc(st.Members, func(mb client.Member) bool { return mb.URL == u }) {
			return false
		}
		answered = true
	}
	return answered
}

// ended is waitChange's verdict once the driver's map has no change under
// way: completed, if ch's outcome said so; else what the map shows.
func ended(w io.Writer, ch ownChange, st *client.ClusterStatus, completed bool) error {
	if !completed {
		ok, instead := ch.done(st.Map)
		if !ok {
			last := "none recorded"
			if o := st.Last; o != nil {
				last = fmt.Sprintf("%s, epochs %d-%d", outcomeName(o, st.Map), o.Began, o.Ended)
			}
			return fmt.Errorf("%w at epoch %d: %s (the last change the cluster recorded: %s; see dhtkvctl cluster)",
				ch.failed("did not complete"), st.Map.Epoch, instead, last)
		}
	}
	_, err := fmt.Fprintf(w, "%s completed\n", ch.what)
	return err
}

// outcomeName names a recorded change: its kind and node ("join of node
// 4 at URL", the URL while m has the node: ids are the map's, not the
// operator's numbering), or for a replicas change, whose node is only the
// one that drove it, the kind.
func outcomeName(o *client.ChangeOutcome, m *client.ClusterMap) string {
	if o.Kind == "replicas" {
		return fmt.Sprintf("replicas change (driven by node %d)", o.Node)
	}
	if u := m.NodeURL(o.Node); u != "" {
		return fmt.Sprintf("%s of node %d at %s", o.Kind, o.Node, u)
	}
	return fmt.Sprintf("%s of node %d", o.Kind, o.Node)
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
		fmt.Fprintf(w, "last change: %s, epochs %d-%d, %s\n", outcomeName(o, st.Map), o.Began, o.Ended, how)
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
			}, ownJoin),
		changeCmd(e, decommission, "decommission", "[--force] URL", "move a node's partitions to the others and stop it", 1,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				var opts []client.ChangeOption
				if *force {
					opts = append(opts, client.Force())
				}
				return c.Decommission(ctx, admin, args[0], opts...)
			}, ownDecommission),
		changeCmd(e, fs("remove"), "remove", "DEAD-URL", "remove a dead node from the cluster; its partitions are copied from the other replicas", 1,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				return c.Remove(ctx, admin, args[0])
			}, ownRemove),
		changeCmd(e, fs("replace"), "replace", "DEAD-URL NEW-URL", "give a dead node's identity to a new machine", 2,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				return c.Replace(ctx, admin, args[0], args[1])
			}, nil),
		changeCmd(e, fs("replicas"), "replicas", "N", "change the replication factor to N", 1,
			func(ctx context.Context, c *client.Client, admin string, args []string) (*client.ClusterMap, error) {
				n, err := strconv.Atoi(args[0])
				if err != nil || n < 1 {
					return nil, usagef("replicas takes the new replication factor, a whole number from 1 to the number of nodes, got %q", args[0])
				}
				return c.SetReplicas(ctx, admin, n)
			}, ownReplicas),
		changeCmd(e, fs("abort"), "abort", "", "end the membership change under way with the old set of nodes", 0,
			func(ctx context.Context, c *client.Client, admin string, _ []string) (*client.ClusterMap, error) {
				return c.Abort(ctx, admin)
			}, nil),
	}
}
