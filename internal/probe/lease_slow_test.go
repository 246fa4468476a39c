package probe

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/view"
)

// hangPeer does not answer: its ping returns at its deadline (a
// partitioned or blackholed machine, not a refused connection).
type hangPeer struct{ clockPeer }

func (hangPeer) Ping(_ uint64, deadline time.Time) (view.PingAnswer, error) {
	time.Sleep(time.Until(deadline))
	return view.PingAnswer{}, errors.New("i/o timeout")
}
func (hangPeer) ClockOffset() (view.ClockSample, bool) { return view.ClockSample{}, false }

// TestLeaseWithASlowDownPeer: in a cluster of three, one peer agrees with
// this clock at once and the other hangs until the ping's deadline. A
// majority (this node and the agreeing peer) vouches for the clock, so
// Verify must succeed. With the ping deadline (the node's
// --replica-timeout) at or above --clock-lease, each round's lease was
// stored already expired (its start is the round's start, and the round
// waited for the hanging peer): every write with ack >= 2 was refused for
// as long as the one peer was unreachable, although Options.Validate
// accepted the settings. A ping's deadline is now within the interval.
func TestLeaseWithASlowDownPeer(t *testing.T) {
	urls := []string{"http://self:1", "http://peer:1", "http://peer:2"}
	m, err := clustermap.Seed(urls, 0)
	require.NoError(t, err)
	good := offsetPeer(0, 0)
	good.pings = new(atomic.Int32)
	peers := map[string]view.Peer{urls[1]: good, urls[2]: hangPeer{}}
	v := view.New(m, 0, urls[0], func(url string) view.Peer { return peers[url] }, time.Now())
	o := Options{Interval: 100 * time.Millisecond, Lease: 300 * time.Millisecond, Timeout: 400 * time.Millisecond, MaxClockSkew: testBound}
	require.NoError(t, o.Validate(), "the settings are accepted")
	p := New(func() *view.View { return v }, o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	err = p.Verify()
	require.NoError(t, err, fmt.Sprintf("a majority agreed, yet: %v", err))
}
