package httpapi

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/antientropy"
	"github.com/dhtkv/dhtkv/internal/buildinfo"
	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/probe"
	"github.com/dhtkv/dhtkv/internal/queryparam"
)

// Status is what /v0/status reports of the node's cluster parts (package
// node composes it from membership, the probe, hinted handoff,
// anti-entropy and the rebuild).
type Status interface {
	// Warnings are what an operator must know, one line each.
	Warnings() []string
	// Map is the installed cluster map and this node's id in it (-1: it
	// left the cluster).
	Map() (*clustermap.Map, int)
	Rebuilding() bool
	// Formed: this node has seen every member answer.
	Formed() bool
	PeerStates() []probe.PeerState
	// PendingHints are the hint bytes held per member URL.
	PendingHints() map[string]int64
	AntiEntropy() []antientropy.PeerSync
	// NoQuorum says which partitions lack a reachable majority of their
	// replicas, or "" (client.Status.NoQuorum).
	NoQuorum() string
}

// DiskStatus is what a Status that also reports the node's data volume
// implements (client.Status.Disk; package node's does).
type DiskStatus interface {
	Disk() *client.Disk
}

// WritesStatus is what a Status that also says which writes fail during a
// change implements (client.Status.WritesFailing; package node's does).
type WritesStatus interface {
	WritesFailing() string
}

// status serves GET /v0/status. Plain, it is the course's contract: 200
// and "OK", then one "warning: ..." line per thing an operator must know
// (Status.Warnings). With verbose (alone, or true: parseFlag) it is 200
// and the node's client.Status as JSON. Either way it answers 200 while
// the node serves: readiness is the admin port's /readyz. Another
// parameter, or a verbose that is not a boolean, is 400 with a one-line
// reason, as on the entity endpoints.
func (s *Server) status(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET, HEAD")
		return
	}
	args := ctx.QueryArgs()
	if aerr := checkQuery(ctx.URI().QueryString(), args, "verbose"); aerr != nil {
		fail(ctx, aerr)
		return
	}
	var given []string
	for _, v := range args.PeekMulti("verbose") {
		given = append(given, string(v))
	}
	verbose, err := queryparam.Bool("verbose", given, false)
	if err != nil {
		fail(ctx, badRequest("%s", err))
		return
	}
	warnings := s.Status.Warnings()
	if !verbose {
		ctx.SetBodyString("OK\n")
		for _, w := range warnings {
			ctx.Response.AppendBodyString("warning: " + w + "\n")
		}
		return
	}
	now := time.Now()
	m, self := s.Status.Map()
	st := client.Status{
		Node:          selfURL(m, self),
		Version:       buildinfo.Version(),
		GoVersion:     buildinfo.GoVersion(),
		Started:       s.Started,
		UptimeSeconds: now.Sub(s.Started).Seconds(),
		Rebuilding:    s.Status.Rebuilding(),
		ClusterFormed: s.Status.Formed(),
		Warnings:      append([]string{}, warnings...),
		NoQuorum:      s.Status.NoQuorum(),
		Members:       make([]client.Member, len(m.Nodes)),
		Epoch:         m.Epoch,
	}
	st.Change = changeLine(m)
	if d, ok := s.Status.(DiskStatus); ok {
		st.Disk = d.Disk()
	}
	if w, ok := s.Status.(WritesStatus); ok {
		st.WritesFailing = w.WritesFailing()
	}
	reachable := true
	index := map[string]int{}
	for i, n := range m.Nodes {
		st.Members[i] = client.Member{URL: n.URL, Self: n.ID == self}
		if n.ID == self {
			st.Members[i].Reachable = &reachable
		}
		index[n.URL] = i
	}
	for _, ps := range s.Status.PeerStates() {
		i, ok := index[ps.URL]
		if !ok {
			continue
		}
		m := &st.Members[i]
		if ps.Probed {
			m.Reachable = &ps.Reachable
		}
		m.LastSuccess, m.LastError, m.LastErrorAt = timeOrNil(ps.LastOK), ps.LastError, timeOrNil(ps.LastErrAt)
	}
	for u, n := range s.Status.PendingHints() {
		if i, ok := index[u]; ok {
			st.Members[i].HintsPendingBytes = n
		}
	}
	for _, ae := range s.Status.AntiEntropy() {
		i, ok := index[ae.Peer]
		if !ok {
			continue
		}
		m := &st.Members[i]
		m.AntiEntropy = &client.AntiEntropy{LastComplete: timeOrNil(ae.LastSuccess), Running: ae.Running, Progress: ae.Progress}
		if ae.Last != nil {
			m.AntiEntropy.LastError = ae.Last.Err
		}
	}
	body, err := json.Marshal(st)
	if err != nil { // a Status always encodes
		s.Log.Error("encode status", "err", err)
		ctx.Error("internal error\n", fasthttp.StatusInternalServerError)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(append(body, '\n'))
}

// selfURL is node id's URL in m, or a description if m has no such node
// (this node, decommissioned).
func selfURL(m *clustermap.Map, id int) string {
	if n := m.Node(id); n != nil {
		return n.URL
	}
	return fmt.Sprintf("node %d (not in the cluster map of epoch %d)", id, m.Epoch)
}

// changeLine describes the membership change under way in m for
// client.Status.Change, and the dead members to be removed after it
// (clustermap.Map.Removing); "" when there is neither.
func changeLine(m *clustermap.Map) string {
	var b strings.Builder
	if ch := m.Change; ch != nil && ch.Kind == clustermap.Replicas {
		fmt.Fprintf(&b, "replication factor %d to %d at stage %s", m.Replicas, ch.Replicas, ch.Stage)
	} else if ch != nil {
		fmt.Fprintf(&b, "%s of %s at stage %s", ch.Kind, selfURL(m, ch.Node), ch.Stage)
	}
	for _, id := range m.Removing {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(selfURL(m, id) + " dead, to be removed")
	}
	return b.String()
}

// timeOrNil is t, or nil for the zero time (omitted from the JSON).
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
