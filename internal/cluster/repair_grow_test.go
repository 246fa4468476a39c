package cluster

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/view"
)

// TestReadRepairDuringGrowMeetsNewSetReads: six nodes grow from factor 2
// to 5, stream stage (the key's partition already copied). Defaults
// (parseReplication over Factors): from=5, a read's ack min(3, 2) = 2
// before read-new and 3 after. A default read meets P (holding v1, left
// by a write that failed for want of new replicas) and Q (without it):
// it answers v1, and read repair is to leave enough holders in the new
// set that a read after read-new cannot answer older. The repair needed
// the read's ack, 2, of the new set, which P and Q (both in it)
// satisfied; a default read after read-new asks 3 of the 5 new replicas
// and could meet X, Y and Z, none of which held v1. It now needs a
// majority of from of the new set (or the read fails, which keeps reads
// monotonic too). The variant where P and Q agree (a failed write that
// reached the whole old set) is the gap docs/replication.md names: the
// answers agree, and no repair runs.
func TestReadRepairDuringGrowMeetsNewSetReads(t *testing.T) {

	var urls []string
	for i := range 6 {
		urls = append(urls, fmt.Sprintf("http://n%d:1", i))
	}
	m, err := clustermap.Seed(urls, 2)
	require.NoError(t, err)
	m, err = m.BeginReplicas(5, 0)
	require.NoError(t, err)
	m, err = m.Advance() // stream
	require.NoError(t, err)
	peers := map[string]*memPeer{}
	peerOf := func(url string) view.Peer {
		if peers[url] == nil {
			peers[url] = &memPeer{recs: map[string]record.Record{}}
		}
		return peers[url]
	}
	const self = 5
	var cur atomic.Pointer[view.View]
	cur.Store(view.New(m, self, "", peerOf, time.Now()))
	c, _ := memCoordinator(t, 5, func() *view.View { return cur.Load() }, time.Second)

	v := cur.Load()
	from, readMax := c.Factors()
	rAck := min(from/2+1, readMax)
	var key []byte
	var old, nw []int
	for i := 0; ; i++ { // a key of which this node is no replica
		key = fmt.Appendf(nil, "k%d", i)
		old, nw = v.WriteSets(key, from, nil, nil)
		if !slices.Contains(nw, self) {
			break
		}
	}
	p, q := peers[v.URL(old[0])], peers[v.URL(old[1])]
	var newOnly []*memPeer
	for _, n := range nw {
		if !slices.Contains(old, n) {
			newOnly = append(newOnly, peers[v.URL(n)])
		}
	}
	require.Len(t, newOnly, 3)
	p.recs[string(key)] = record.Record{Version: hlc.VersionAt(time.Now().Add(-time.Second)), Value: []byte("v1")}
	for _, x := range newOnly {
		x.setDown(true)
	}
	res, err := c.Get(key, rAck, from)
	c.inflight.Wait()
	if err != nil {
		// The repair could not reach enough of the new set: failing
		// the read is what keeps reads monotonic.
		t.Logf("the read before read-new failed: %v", err)
		return
	}
	require.Equal(t, "v1", string(res.Rec.Value), "the read before read-new")

	m, err = m.Advance() // read-new
	require.NoError(t, err)
	cur.Store(view.New(m, self, "", peerOf, time.Now()))
	for _, x := range newOnly {
		x.setDown(false)
	}
	p.setDown(true)
	q.setDown(true)
	from, readMax = c.Factors()
	rAck = min(from/2+1, readMax)
	res, err = c.Get(key, rAck, from)
	require.NoError(t, err)
	require.True(t, res.Found && string(res.Rec.Value) == "v1",
		"a default read (ack %d of %d) after read-new answers found=%v %q, older than the read before it", rAck, len(nw), res.Found, res.Rec.Value)
}
