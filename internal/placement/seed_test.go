package placement

import (
	"testing"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partition"
)

// TestJoinAtAReplacedNodesURLGetsItsOwnSeed: a replace keeps the dead
// node's seed (the hash of the URL it joined with) and frees that URL; a
// machine that later joined at the freed URL got the same seed
// (BeginJoin hashed its URL). Two nodes with one seed tie on every
// partition's score: the later one was always ranked right behind the
// other, so it held exactly its twin's partitions and, at factor 1, none
// at all. The log applies the new seed from its rules 2 (maplog's
// TestJoinSeedByTheLogsRules).
func TestJoinAtAReplacedNodesURLGetsItsOwnSeed(t *testing.T) {
	urls := []string{"http://n0:1", "http://n1:1", "http://n2:1"}
	m, err := clustermap.Seed(urls, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m, err = m.Replace(2, "http://n2-new:1"); err != nil {
		t.Fatal(err)
	}
	if m, err = m.BeginJoin("http://n2:1", 0); err != nil { // the freed URL
		t.Fatal(err)
	}
	for m.Change != nil {
		if m, err = m.Advance(); err != nil {
			t.Fatal(err)
		}
	}
	seeds := map[uint64]int{}
	for _, n := range m.Nodes {
		if prev, dup := seeds[n.Seed]; dup {
			t.Errorf("nodes %d and %d share the seed %d", prev, n.ID, n.Seed)
		}
		seeds[n.Seed] = n.ID
	}
	p := New(m.Nodes)
	held := map[int]int{}
	for part := range partition.Count {
		for _, id := range p.PartitionReplicas(partition.ID(part), 1, nil) {
			held[id]++
		}
	}
	if held[3] == 0 {
		t.Errorf("the joined node 3 holds no partition at factor 1 (by node: %v)", held)
	}
}
