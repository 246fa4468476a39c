package membership

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/dhtkv/dhtkv/internal/clustermap"
)

// State is what a node answers on rpc.MapPath and with a refusal: its
// id, its map, and the epoch of the last stream stage whose partitions it
// has finished copying (move.go).
type State struct {
	Node  int             `json:"node"`
	Map   *clustermap.Map `json:"map"`
	Moved uint64          `json:"moved"`
}

// Encode returns s as JSON.
func (s State) Encode() []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("membership: encode map state: %v", err)) // plain data
	}
	return b
}

// ParseState parses and validates a State: every node reads one from
// another by it.
func ParseState(b []byte) (State, error) {
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("cluster map state: %w", err)
	}
	if s.Map == nil {
		return s, errors.New("cluster map state without a map")
	}
	if err := s.Map.Validate(); err != nil {
		return s, fmt.Errorf("cluster map state: %w", err)
	}
	return s, nil
}
