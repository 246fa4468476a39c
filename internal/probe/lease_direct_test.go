package probe

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// TestLeaseSlowWallReadInASampleIsNoStep is TestLeaseSlowWallReadIsNoStep
// at a sample: a right clock, read by an exchange's goroutine that is
// descheduled 2 ms right after reading it (between rpc's got, the
// answer's reading of this clock, and measured's time.Now, which becomes
// ClockSample.At). The round's own readings are close pairs (reading),
// the sample's are not, and nothing widens the bound for it: the round,
// which saw no step, verifies nothing.
func TestLeaseSlowWallReadInASampleIsNoStep(t *testing.T) {
	st, err := store.Open("db", store.Options{FS: vfs.NewMem()})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	peerClock, err := hlc.New(2, time.Now) // the peer's clock: right
	require.NoError(t, err)
	server := &rpc.Server{Replica: &replica.Replica{Store: st, Clock: peerClock}, MaxKeyBytes: 1024, MaxValueBytes: 1 << 20}

	wall := new(fakeWall) // this node's clock: right too, never stepped
	direct := &rpc.Direct{URL: "http://peer:1", Server: server, Now: func() time.Time {
		r := wall.now()
		time.Sleep(2 * time.Millisecond) // descheduled right after the read
		return r
	}}
	urls := []string{"http://self:1", "http://peer:1"}
	m, err := clustermap.Seed(urls, 0)
	require.NoError(t, err)
	v := view.New(m, 0, urls[0], func(string) view.Peer { return direct }, time.Now())
	p := New(func() *view.View { return v }, Options{Wall: wall.now, MaxClockSkew: testBound}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, p.Verify())
}
