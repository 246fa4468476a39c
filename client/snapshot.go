package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Snapshot is the JSON a node's admin listener answers to POST
// /snapshot?dir=PATH: where the checkpoint of its store was written, how
// big it is and how long it took. The admin listener encodes this type,
// so the two cannot disagree.
type Snapshot struct {
	// Dir is the checkpoint's directory on the node's machine.
	Dir string `json:"dir"`
	// Files and Bytes count what Dir holds. Pebble hard-links its
	// sstables into a checkpoint on the same filesystem, so Bytes is the
	// checkpoint's size, not what it took from the disk.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// DurationSeconds is how long the checkpoint took.
	DurationSeconds float64 `json:"duration_seconds"`
	// CompleteAsOf is the time up to which the snapshot holds every write
	// the cluster acknowledged (the earliest start of the node's last
	// anti-entropy exchanges with its peers); nil when not known, and
	// Warning says so: a node started on it then refuses to without
	// --restore-old-snapshot (README, Backup and restore).
	CompleteAsOf *time.Time `json:"complete_as_of,omitempty"`
	// Warning is what an operator must know of the snapshot, or empty.
	Warning string `json:"warning,omitempty"`
}

// Snapshot asks the node whose admin listener is at admin (host:port, or
// http://host:port) for a consistent checkpoint of its store in dir, a
// directory on that node's machine inside its --snapshot-dir (a path
// relative to it, or an absolute one under it) that must not exist yet
// (its parents are created). Snapshot.Dir is where it went, absolute. There is no failover: it is that node's data. A refused
// request (a dir outside the node's --snapshot-dir or one that exists, a
// snapshot already running, a token missing or of a role below admin) is
// a *BadRequestError. See README.md, Backup and restore, for what to do
// with the directory.
func (c *Client) Snapshot(ctx context.Context, admin, dir string) (*Snapshot, error) {
	ep, err := normalize(admin)
	if err != nil {
		return nil, err
	}
	a, err := c.try(ctx, ep, http.MethodPost, "/snapshot", url.Values{"dir": {dir}}, nil, false)
	if err != nil {
		return nil, fmt.Errorf("dhtkv: snapshot of %s: %w", ep, err)
	}
	switch {
	case a.code >= 400 && a.code < 500:
		return nil, fmt.Errorf("dhtkv: snapshot of %s: %w", ep, a.err(http.MethodPost))
	case a.code != http.StatusOK: // 501: the node's store cannot checkpoint; 500: the checkpoint failed
		return nil, fmt.Errorf("dhtkv: snapshot of %s: %d %s", ep, a.code, reason(a.body))
	}
	var s Snapshot
	if err := json.Unmarshal(a.body, &s); err != nil {
		return nil, fmt.Errorf("dhtkv: snapshot of %s: %w", ep, err)
	}
	return &s, nil
}
