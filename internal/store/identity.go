package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// Identity says whose data a directory holds, so that a node never takes
// another cluster's or another node's data for its own, and whether the
// node has finished copying its share from the others after it started
// with an empty directory (see package rebuild).
type Identity struct {
	Cluster    uint64 // clustermap.Map.Cluster of the cluster it belongs to
	Node       int    // this node's id in that cluster (clustermap.Node.ID)
	Rebuilding bool   // still copying its share; its reads are not to be trusted
	// Formed is set once this node has seen every other node answer: the
	// cluster exists, and a member starting empty later is a lost disk,
	// not a new cluster.
	Formed bool
}

// identityKey holds the Identity; it sorts before every data key.
const identityKey = "\x00identity"

// Identity returns the stored identity; ok is false for a directory that
// has none yet.
func (s *Store) Identity() (id Identity, ok bool, err error) {
	v, closer, err := s.db.Get([]byte(identityKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return Identity{}, false, nil
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("read identity in %s: %w", s.dir, err)
	}
	defer closer.Close()
	if len(v) != 10 {
		return Identity{}, false, fmt.Errorf("read identity in %s: %d bytes, want 10", s.dir, len(v))
	}
	return Identity{Cluster: binary.BigEndian.Uint64(v), Node: int(v[8]), Rebuilding: v[9]&1 != 0, Formed: v[9]&2 != 0}, true, nil
}

// SetIdentity durably records id.
func (s *Store) SetIdentity(id Identity) error {
	v := binary.BigEndian.AppendUint64(nil, id.Cluster)
	v = append(v, byte(id.Node), 0)
	if id.Rebuilding {
		v[9] |= 1
	}
	if id.Formed {
		v[9] |= 2
	}
	if err := s.write(func() error { return s.db.Set([]byte(identityKey), v, pebble.Sync) }); err != nil {
		return fmt.Errorf("write identity in %s: %w", s.dir, err)
	}
	return nil
}
