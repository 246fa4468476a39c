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

// TestDefaultQuorumsDuringShrinkTo1: four nodes at factor 3 shrink to
// factor 1 (dhtkvctl replicas 1), write-both stage, and a client uses the
// defaults (httpapi.parseReplication over Coordinator.Factors): from=3,
// ack 2 for a write and for a read. Key k's old set is {A,B,C}, its new
// set {A}. A write's ack was bounded by the smaller factor, 1, and A alone
// was one replica of each set: acknowledged with B and C unreachable, the
// write was then missed by a default read that B and C answered. Now a
// write needs 2 of the old set and the one replica of the new.
func TestDefaultQuorumsDuringShrinkTo1(t *testing.T) {

	m, err := clustermap.Seed([]string{"http://a:1", "http://b:1", "http://c:1", "http://d:1"}, 3)
	require.NoError(t, err)
	m, err = m.BeginReplicas(1, 0)
	require.NoError(t, err)
	peers := map[string]*memPeer{}
	peerOf := func(url string) view.Peer {
		if peers[url] == nil {
			peers[url] = &memPeer{recs: map[string]record.Record{}}
		}
		return peers[url]
	}
	const self = 3
	v := view.New(m, self, "", peerOf, time.Now())
	c, _ := memCoordinator(t, 3, func() *view.View { return v }, time.Second)

	from, readMaxAck := c.Factors()
	wAck, rAck := from/2+1, min(from/2+1, readMaxAck) // parseReplication's defaults
	t.Logf("defaults: from=%d, write ack=%d, read ack=%d", from, wAck, rAck)

	// Writes with some of B and C unreachable; then reads that A does not
	// answer. Whatever was acknowledged must be read back.
	for down := range 3 {
		var key []byte
		var old, nw []int
		for i := 0; ; i++ { // a key whose replicas are all remote
			key = fmt.Appendf(nil, "k%d/%d", down, i)
			old, nw = v.WriteSets(key, from, nil, nil)
			if !slices.Contains(old, self) {
				break
			}
		}
		a := peers[v.URL(nw[0])]
		var others []*memPeer
		for _, n := range old {
			if n != nw[0] {
				others = append(others, peers[v.URL(n)])
			}
		}
		for i, p := range others {
			p.setDown(i < down)
		}
		werr := c.Write(key, []byte("v1"), false, 0, wAck, from)
		c.inflight.Wait()
		t.Logf("%d of B, C down: write err %v", down, werr)
		for _, p := range others {
			p.setDown(false)
		}
		a.setDown(true)
		res, err := c.Get(key, rAck, from)
		a.setDown(false)
		c.inflight.Wait()
		// A read may fail (the new set's one replica is down, and read
		// repair before read-new must reach it); it must not miss an
		// acknowledged write.
		t.Logf("%d of B, C down: read err %v", down, err)
		if werr == nil && err == nil {
			require.True(t, res.Found && string(res.Rec.Value) == "v1", "%d of B, C down: a default read after an acknowledged default write: found=%v %q", down, res.Found, res.Rec.Value)
		}
	}
}

// TestReadRepairDuringShrinkTo1: two nodes at factor 2 shrink to factor
// 1 (the change docs/membership.md walks through), write-both stage. A
// default read (from=2, ack 2) finds one replica stale and repairs it
// (blocking, the default). Before read-new the repair must leave ack
// replicas of each set holding best, and the new set has one replica:
// "2 of a set of 1" was out of reach from the start (fanOut's hopeless),
// and the read failed although both replicas answered. A set smaller
// than ack now gives all it has.
func TestReadRepairDuringShrinkTo1(t *testing.T) {

	m, err := clustermap.Seed([]string{"http://a:1", "http://b:1"}, 2)
	require.NoError(t, err)
	m, err = m.BeginReplicas(1, 0)
	require.NoError(t, err)
	peer := &memPeer{recs: map[string]record.Record{}}
	v := view.New(m, 0, "", func(string) view.Peer { return peer }, time.Now())
	c, st := memCoordinator(t, 0, func() *view.View { return v }, time.Second)
	from, readMaxAck := c.Factors()
	rAck := min(from/2+1, readMaxAck)

	key := []byte("k")
	v1 := record.Record{Version: hlc.VersionAt(time.Now().Add(-time.Second)), Value: []byte("v1")}
	require.NoError(t, st.Apply(key, &v1)) // this node has it, the peer not
	res, err := c.Get(key, rAck, from)
	require.NoError(t, err, "both replicas answered")
	require.Equal(t, "v1", string(res.Rec.Value))
}
