package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Exchange is what one anti-entropy exchange between the asked node and a
// peer found and did: the JSON a node's admin listener answers to POST
// /repair, one per peer. The node encodes this type, so the two cannot
// disagree.
type Exchange struct {
	Peer    string    `json:"peer"`
	Started time.Time `json:"started"`
	// DurationSeconds is how long the exchange took.
	DurationSeconds float64 `json:"duration_seconds"`
	// Partitions were compared; PartitionsDiffering and SegmentsDiffering
	// had different hashes.
	Partitions          int `json:"partitions"`
	PartitionsDiffering int `json:"partitions_differing"`
	SegmentsDiffering   int `json:"segments_differing"`
	// Pulled keys were repaired on the asked node, Pushed on the peer;
	// Failed were left differing.
	Pulled int `json:"pulled"`
	Pushed int `json:"pushed"`
	Failed int `json:"failed"`
	// SummaryBytes went to hashes and key lists, RecordBytes to the
	// records moved.
	SummaryBytes int `json:"summary_bytes"`
	RecordBytes  int `json:"record_bytes"`
	// Error is why the exchange did not complete ("" if it did).
	Error string `json:"error,omitempty"`
}

// RepairState is anti-entropy's state with one peer: the JSON a node's
// admin listener answers to GET /repair, one per peer. Last is the last
// exchange with the peer, in POST /repair's form (its duration in
// seconds too).
type RepairState struct {
	Peer string `json:"peer"`
	// LastSuccess is when the last exchange that left nothing differing
	// started (zero: none since the node started).
	LastSuccess time.Time `json:"last_success"`
	// Running is whether an exchange with the peer runs; Progress is how
	// far it got, 0 to 1.
	Running  bool    `json:"running"`
	Progress float64 `json:"progress"`
	// Last is the last exchange that ended (nil: none yet).
	Last *Exchange `json:"last,omitempty"`
}

// Repair asks the node whose admin listener is at admin (host:port, or
// http://host:port) to compare its data with every peer's now and exchange
// what differs, and returns one Exchange per peer once all ended. There is
// no failover: it is that node's exchanges. An exchange that did not
// complete has its Error set; the call itself fails only when the node
// does not answer.
func (c *Client) Repair(ctx context.Context, admin string) ([]Exchange, error) {
	ep, err := normalize(admin)
	if err != nil {
		return nil, err
	}
	a, err := c.try(ctx, ep, http.MethodPost, "/repair", nil, nil, false)
	if err != nil {
		return nil, fmt.Errorf("dhtkv: repair by %s: %w", ep, err)
	}
	if err := authRefusal(a); err != nil {
		return nil, fmt.Errorf("dhtkv: repair by %s: %w", ep, err)
	}
	if a.code != http.StatusOK {
		return nil, fmt.Errorf("dhtkv: repair by %s: %d %s", ep, a.code, reason(a.body))
	}
	var xs []Exchange
	if err := json.Unmarshal(a.body, &xs); err != nil {
		return nil, fmt.Errorf("dhtkv: repair by %s: %w", ep, err)
	}
	return xs, nil
}
