package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Status is a node's account of itself and of the cluster as it sees it:
// the JSON that GET /v0/status?verbose answers. The node encodes this very
// type (internal/httpapi), so the server and this package cannot disagree
// about it.
type Status struct {
	// Node is the node's URL as --cluster lists it (its --self).
	Node string `json:"node"`
	// Version is the node's build, as dhtkv --version prints it.
	Version string `json:"version"`
	// GoVersion is the Go release the node was built with.
	GoVersion string `json:"go_version"`
	// Started is when the node started.
	Started time.Time `json:"started"`
	// UptimeSeconds is how long the node had been running when it
	// answered, in seconds.
	UptimeSeconds float64 `json:"uptime_seconds"`
	// Rebuilding is true while the node copies its share of the data from
	// its peers, after it started with an empty data directory in a
	// cluster that had data; its own replica is not read meanwhile.
	Rebuilding bool `json:"rebuilding"`
	// ClusterFormed is true once the node has seen every member answer
	// (it is remembered across restarts).
	ClusterFormed bool `json:"cluster_formed"`
	// Epoch is the epoch of the cluster map the node has installed; every
	// member reaches the same once a change has propagated.
	Epoch uint64 `json:"epoch"`
	// Change is the membership change under way as the node's map has
	// it ("join of http://... at stage stream"), "" when none is.
	Change string `json:"change,omitempty"`
	// Warnings are what an operator must know about the node, one line
	// each: the lines plain /v0/status prints after OK. Never null.
	Warnings []string `json:"warnings"`
	// NoQuorum says which partitions the node cannot reach a majority of
	// the replicas of, so that requests at the default ack fail for their
	// keys through it ("" when it reaches a majority of every partition's
	// replicas). Its /readyz answers 503 meanwhile, and dhtkvctl status
	// exits 1.
	NoQuorum string `json:"no_quorum,omitempty"`
	// WritesFailing says, during a membership change, for how many
	// partitions writes at the default ack fail through the node because
	// a node of one of the two replica sets does not answer it (a joining
	// node not started yet, a member down), and which; "" otherwise.
	// dhtkvctl status exits 1 meanwhile; /readyz is not affected (reads
	// are, only as NoQuorum says).
	WritesFailing string `json:"writes_failing,omitempty"`
	// Disk is the node's data volume and whether its store takes writes
	// (absent from a node that does not report it).
	Disk *Disk `json:"disk,omitempty"`
	// Members are every node of the cluster map, by node id, this one
	// included.
	Members []Member `json:"members"`
}

// Disk is a node's data volume as the node last read it, and the state
// of its store's writes. A node refuses PUT and DELETE, and replica
// writes, with 507 Insufficient Storage while Full or StoreError.
type Disk struct {
	// Dir is the node's data directory.
	Dir string `json:"dir"`
	// FreeBytes and TotalBytes are the volume's bytes available to the
	// node and its size; MinFreeBytes is its --min-free-space, below
	// which writes are refused, and ResumeFreeBytes the free space at
	// which they are taken again. All absent when the volume cannot be
	// read.
	FreeBytes       uint64 `json:"free_bytes,omitempty"`
	TotalBytes      uint64 `json:"total_bytes,omitempty"`
	MinFreeBytes    uint64 `json:"min_free_bytes,omitempty"`
	ResumeFreeBytes uint64 `json:"resume_free_bytes,omitempty"`
	// Full: writes are refused for want of space.
	Full bool `json:"full"`
	// StoreError is why the store failed a write, if it did: writes are
	// refused until the node restarts.
	StoreError string `json:"store_error,omitempty"`
	// Ballast is the path of the emergency ballast file on the node's
	// machine, and BallastBytes its size (0: there is none now):
	// deleting it frees that much at once.
	Ballast      string `json:"ballast,omitempty"`
	BallastBytes uint64 `json:"ballast_bytes"`
}

// RefusesWrites reports whether the node refuses writes (507) now.
func (d *Disk) RefusesWrites() bool { return d != nil && (d.Full || d.StoreError != "") }

// Member is one node of the cluster as the answering node sees it.
type Member struct {
	// URL is the member's URL as --cluster lists it.
	URL string `json:"url"`
	// Self marks the answering node.
	Self bool `json:"self"`
	// Reachable is whether the member answered the answering node's last
	// probe (it probes every peer every second); absent (nil) when that
	// node cannot tell. A node always reaches itself.
	Reachable *bool `json:"reachable,omitempty"`
	// LastSuccess is when the member last answered a probe; LastError and
	// LastErrorAt the last probe that failed. Absent for the node itself
	// and for what has not happened since it started.
	LastSuccess *time.Time `json:"last_success,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// AntiEntropy is the answering node's anti-entropy with the member
	// (absent for the node itself).
	AntiEntropy *AntiEntropy `json:"anti_entropy,omitempty"`
	// HintsPendingBytes is how many bytes of hints the answering node
	// holds for the member (writes it missed, to be replayed).
	HintsPendingBytes int64 `json:"hints_pending_bytes"`
}

// MemberState is what the answering node knows of a member's
// reachability: Member.State.
type MemberState string

// The states of a member.
const (
	// MemberUp: the member answered the answering node's last probe (or
	// is the answering node).
	MemberUp MemberState = "up"
	// MemberDown: its last probe failed (LastError says why).
	MemberDown MemberState = "down"
	// MemberUnknown: the answering node has not reached it since it
	// started: no probe has ended yet, or the node cannot tell.
	MemberUnknown MemberState = "unknown"
)

// State is the member's state as the answering node sees it. Only a
// member that has answered counts as up: the answering node itself, or
// one whose last probe succeeded and that has a LastSuccess. Reachable
// absent, or true without a LastSuccess (a member never reached), is
// MemberUnknown; Reachable false is MemberDown.
func (m Member) State() MemberState {
	switch {
	case m.Self:
		return MemberUp
	case m.Reachable == nil:
		return MemberUnknown
	case !*m.Reachable:
		return MemberDown
	case m.LastSuccess == nil:
		return MemberUnknown
	}
	return MemberUp
}

// AntiEntropy is one node's comparison of its data with a peer's.
type AntiEntropy struct {
	// LastComplete is when the last exchange that left nothing differing
	// started; absent if none under the node's current cluster map (since
	// it installed the map: an exchange under an earlier one compared
	// other replica sets), nor since it started.
	LastComplete *time.Time `json:"last_complete,omitempty"`
	// Running is true while an exchange runs; Progress is how far the
	// running (or last) one got, 0 to 1.
	Running  bool    `json:"running"`
	Progress float64 `json:"progress"`
	// LastError is why the last exchange did not complete ("" if it did).
	LastError string `json:"last_error,omitempty"`
}

// Status asks the node at endpoint for its account of itself (GET
// /v0/status?verbose). endpoint need not be one of the client's (host:port
// alone is https when Config.TLSConfig is set, as for those); there is no
// failover: it is that node's status that is asked.
func (c *Client) Status(ctx context.Context, endpoint string) (*Status, error) {
	ep, err := normalizeScheme(endpoint, c.scheme)
	if err != nil {
		return nil, err
	}
	a, err := c.try(ctx, ep, http.MethodGet, "/v0/status", url.Values{"verbose": {""}}, nil, false)
	if err != nil {
		return nil, fmt.Errorf("dhtkv: status of %s: %w", ep, err)
	}
	if err := authRefusal(a); err != nil {
		return nil, fmt.Errorf("dhtkv: status of %s: %w", ep, err)
	}
	if a.code != http.StatusOK {
		return nil, fmt.Errorf("dhtkv: status of %s: %d %s", ep, a.code, reason(a.body))
	}
	var st Status
	if err := json.Unmarshal(a.body, &st); err != nil {
		return nil, fmt.Errorf("dhtkv: status of %s: %w", ep, err)
	}
	return &st, nil
}
