package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/partition"
)

// nodeURLs returns n distinct node URLs in the form the topology keeps.
func nodeURLs(base, n int) []string {
	urls := make([]string, n)
	for i := range urls {
		urls[i] = "http://127.0.0.1:" + strconv.Itoa(base+i)
	}
	return urls
}

func testTopology(t testing.TB, urls []string, self int) []clustermap.Node {
	t.Helper()
	topo, err := clustermap.ParseTopology(strings.Join(urls, ","), urls[self])
	require.NoError(t, err)
	m, err := clustermap.Seed(topo.Nodes, 0)
	require.NoError(t, err)
	return m.Nodes
}

// referenceOrder is the definition of rendezvous hashing written the slow,
// obvious way: every node's score for the key, sorted descending.
func referenceOrder(urls []string, key []byte) []int {
	part, _ := partition.Of(key)
	h := partitionHash(part)
	idx := make([]int, len(urls))
	scores := make([]uint64, len(urls))
	for i, u := range urls {
		idx[i] = i
		scores[i] = partition.Mix(h ^ xxhash.Sum64String(u))
	}
	sort.SliceStable(idx, func(a, b int) bool { return scores[idx[a]] > scores[idx[b]] })
	return idx
}

func randomKey(r *rand.Rand) []byte {
	k := make([]byte, 1+r.IntN(40))
	for i := range k {
		k[i] = byte(r.IntN(256))
	}
	return k
}

// The insertion-sorted prefix that Replicas keeps must be exactly the first n
// of the full descending-score order, for every n (including n larger than
// the cluster, which is clamped).
func TestPlacementMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{1, 2, 3, 4, 5, 7, 16} {
		urls := nodeURLs(9000, size)
		p := New(testTopology(t, urls, 0))
		for range 2000 {
			key := randomKey(r)
			ref := referenceOrder(urls, key)
			for n := 0; n <= size+1; n++ {
				want := ref[:min(n, size)]
				got := p.Replicas(key, n, make([]int, 0, 4))
				require.Equal(t, want, got, "size %d n %d key %x", size, n, key)
			}
		}
	}
}

// The replica set for from=k is a prefix of the set for from=k+1, and the
// replicas are distinct nodes.
func TestPlacementPrefixProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{2, 3, 5, 8} {
		p := New(testTopology(t, nodeURLs(7000, size), 0))
		for range 5000 {
			key := randomKey(r)
			prev := p.Replicas(key, 1, nil)
			for k := 2; k <= size; k++ {
				cur := p.Replicas(key, k, nil)
				require.Len(t, cur, k)
				require.Equal(t, prev, cur[:k-1], "from=%d is not a prefix of from=%d", k-1, k)
				seen := map[int]bool{}
				for _, n := range cur {
					require.False(t, seen[n], "node %d twice in %v", n, cur)
					require.True(t, n >= 0 && n < size)
					seen[n] = true
				}
				prev = cur
			}
		}
	}
}

// Every node computes the same order: the placement does not depend on which
// node is --self, and (as URLs) not even on the order of --cluster.
func TestPlacementSameOnEveryNode(t *testing.T) {
	urls := nodeURLs(8080, 5)
	var places []*Placement
	for self := range urls {
		places = append(places, New(testTopology(t, urls, self)))
	}
	shuffled := slices.Clone(urls)
	slices.Reverse(shuffled)
	shuffledPlace := New(testTopology(t, shuffled, 0))

	r := rand.New(rand.NewPCG(5, 6))
	for range 5000 {
		key := randomKey(r)
		want := places[0].Replicas(key, 5, nil)
		for self, p := range places[1:] {
			require.Equal(t, want, p.Replicas(key, 5, nil), "node %d disagrees", self+1)
		}
		var wantURLs, gotURLs []string
		for _, n := range want {
			wantURLs = append(wantURLs, urls[n])
		}
		for _, n := range shuffledPlace.Replicas(key, 5, nil) {
			gotURLs = append(gotURLs, shuffled[n])
		}
		require.Equal(t, wantURLs, gotURLs, "listing order changed the placement")
	}
}

// Replicas appends to dst without allocating when dst has room: the
// coordinator calls it on every request with an on-stack buffer.
func TestPlacementReplicasAppends(t *testing.T) {
	p := New(testTopology(t, nodeURLs(8080, 5), 0))
	key := []byte("some-key")
	dst := p.Replicas(key, 3, []int{42})
	require.Equal(t, 42, dst[0], "existing elements are kept")
	require.Equal(t, p.Replicas(key, 3, nil), dst[1:])

	var buf [maxSet]int
	allocs := testing.AllocsPerRun(1000, func() {
		_ = p.Replicas(key, 3, buf[:0])
	})
	require.Zero(t, allocs)
}

// Adding a node moves only the keys that now score highest on it: no key moves
// between two old nodes, and about 1/(n+1) of the keys move.
func TestPlacementAddingNodeMovesFewKeys(t *testing.T) {
	old := nodeURLs(8080, 4)
	grown := append(slices.Clone(old), "http://127.0.0.1:9999")
	po := New(testTopology(t, old, 0))
	pg := New(testTopology(t, grown, 0))
	const keys = 100_000
	moved := 0
	var kb []byte
	for i := range keys {
		kb = strconv.AppendInt(kb[:0], int64(i), 10)
		a := po.Replicas(kb, 1, nil)[0]
		b := pg.Replicas(kb, 1, nil)[0]
		if a != b {
			require.Equal(t, 4, b, "key %s moved from node %d to old node %d", kb, a, b)
			moved++
		}
	}
	frac := float64(moved) / keys
	t.Logf("adding a 5th node moved %.2f%% of primaries (ideal 20%%)", 100*frac)
	require.InDelta(t, 0.2, frac, 0.01)
}

// balance is max/mean of the per-node key counts.
func balance(counts []int) (maxOverMean float64, minC, maxC int) {
	sum := 0
	minC, maxC = counts[0], counts[0]
	for _, c := range counts {
		sum += c
		minC, maxC = min(minC, c), max(maxC, c)
	}
	mean := float64(sum) / float64(len(counts))
	return float64(maxC) / mean, minC, maxC
}

// TestPlacementBalance measures how evenly 1M keys spread: for 3 and 5 nodes,
// the primary owner (from=1) and every replica for from=2 and from=3. The
// numbers are in docs/placement.md. Keys are placed by partition, so the
// spread is that of 4096 partitions, not of 1M keys: a uniform placement of
// 4096 partitions on 3 nodes has a standard deviation of 2.2% of the mean
// (binomial; 3.1% on 5 nodes), and the bound 1.10 is over three of them,
// so it fails only for a real skew.
func TestPlacementBalance(t *testing.T) {
	if testing.Short() {
		t.Skip("1M keys")
	}
	const keys = 1_000_000
	for _, size := range []int{3, 5} {
		urls := nodeURLs(8080, size)
		p := New(testTopology(t, urls, 0))
		counts := make([][]int, 4) // counts[from][node]
		for f := 1; f <= 3; f++ {
			counts[f] = make([]int, size)
		}
		var kb []byte
		var buf [maxSet]int
		for i := range keys {
			kb = strconv.AppendInt(append(kb[:0], "key"...), int64(i), 10)
			reps := p.Replicas(kb, 3, buf[:0])
			for f := 1; f <= 3; f++ {
				for _, n := range reps[:f] {
					counts[f][n]++
				}
			}
		}
		for f := 1; f <= 3; f++ {
			mm, lo, hi := balance(counts[f])
			mean := float64(keys*f) / float64(size)
			what := fmt.Sprintf("%d nodes, from=%d", size, f)
			if f == 1 {
				what += " (primary)"
			}
			t.Logf("%-26s mean %9.0f  min %7d  max %7d  max/mean %.4f  counts %v", what, mean, lo, hi, mm, counts[f])
			require.Less(t, mm, 1.10, what)
		}
	}
}

func BenchmarkPlacementReplicas(b *testing.B) {
	for _, size := range []int{3, 5} {
		p := New(testTopology(b, nodeURLs(8080, size), 0))
		b.Run(fmt.Sprintf("nodes=%d/from=%d", size, size), func(b *testing.B) {
			key := []byte("user:1234567890")
			var buf [maxSet]int
			b.ReportAllocs()
			for b.Loop() {
				_ = p.Replicas(key, size, buf[:0])
			}
		})
	}
}
