package cluster

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/view"
)

// slowDownPeer is a down peer whose writes fail only after delay (a
// timeout rather than a refusal); its reads fail at once.
type slowDownPeer struct {
	*memPeer
	delay time.Duration
}

func (p *slowDownPeer) Apply(key, env []byte, epoch uint64, d time.Time) (uint64, error) {
	time.Sleep(p.delay)
	return p.memPeer.Apply(key, env, epoch, d)
}

// TestReadRepairDuringShrinkCountsFailuresSafely: five nodes shrink from
// factor 5 to 2, write-both stage; a default read (from=5, ack 3) through
// X, which holds v2, meets B (stale) and Y (v2), A being down. The repair
// goes to all five and needs 3 of the old set and 2 of the new {A, B}.
// A's failure (last, a timeout) makes it hopeless after B, Y, Z and X
// took it: n = 4 successes against 3 targets, and the failed repairs'
// counter was given len(targets) - n = -1, which panics in a Prometheus
// counter: in a fasthttp handler, which does not recover, the node
// process died. The failures counted are now the ReplicasError's.
func TestReadRepairDuringShrinkCountsFailuresSafely(t *testing.T) {

	var urls []string
	for i := range 5 {
		urls = append(urls, fmt.Sprintf("http://n%d:1", i))
	}
	m, err := clustermap.Seed(urls, 5)
	require.NoError(t, err)
	m, err = m.BeginReplicas(2, 0)
	require.NoError(t, err)

	const self = 4
	// A key whose new set {A, B} does not hold this node (X).
	probe := view.New(m, self, "", func(string) view.Peer { return &memPeer{recs: map[string]record.Record{}} }, time.Now())
	var key []byte
	var old, nw []int
	for i := 0; ; i++ {
		key = fmt.Appendf(nil, "k%d", i)
		old, nw = probe.WriteSets(key, 5, nil, nil)
		if !slices.Contains(nw, self) {
			break
		}
	}
	a, b := nw[0], nw[1]
	peers := map[string]view.Peer{}
	mem := map[int]*memPeer{}
	for _, n := range old {
		if n == self {
			continue
		}
		mp := &memPeer{recs: map[string]record.Record{}}
		mem[n] = mp
		peers[urls[n]] = mp
	}
	mem[a].setDown(true)
	peers[urls[a]] = &slowDownPeer{memPeer: mem[a], delay: 300 * time.Millisecond}
	v := view.New(m, self, "", func(u string) view.Peer { return peers[u] }, time.Now())
	c, st := memCoordinator(t, 9, func() *view.View { return v }, 2*time.Second)

	v2 := record.Record{Version: hlc.VersionAt(time.Now().Add(-time.Second)), Value: []byte("v2")}
	require.NoError(t, st.Apply(key, &v2))
	for _, n := range old {
		if n != self && n != a && n != b {
			mem[n].recs[string(key)] = v2
		}
	}
	from, readMax := c.Factors()
	rAck := min(from/2+1, readMax)
	require.Equal(t, 3, rAck)
	var gerr error
	require.NotPanics(t, func() { _, gerr = c.Get(key, rAck, from) })
	c.inflight.Wait()
	t.Logf("read: %v", gerr)
}
