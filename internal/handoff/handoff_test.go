package handoff_test

import (
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/handoff"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countingPeer counts the writes sent over a link.
type countingPeer struct {
	*rpc.Direct
	applies atomic.Int32
}

func (p *countingPeer) Apply(key, env []byte, epoch uint64, deadline time.Time) (uint64, error) {
	p.applies.Add(1)
	return p.Direct.Apply(key, env, epoch, deadline)
}

// newReplica is a replica on real Pebble in a test directory, with a
// clock of node id.
func newReplica(t *testing.T, id int) *replica.Replica {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	clock, err := hlc.New(id, time.Now)
	require.NoError(t, err)
	return &replica.Replica{Store: st, Clock: clock}
}

// A hint kept while the link to its replica is cut is delivered once the
// link heals, through the replica's batch server (in-process, over
// rpc.Direct), and then forgotten; nothing is delivered while cut.
func TestHintDeliveredWhenLinkHeals(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, b := newReplica(t, 0), newReplica(t, 1)
	m, err := clustermap.Seed([]string{"http://a:1", "http://b:1"}, 0)
	require.NoError(t, err)
	link := &countingPeer{Direct: &rpc.Direct{URL: "http://b:1", Server: &rpc.Server{Replica: b, MaxKeyBytes: 1024, MaxValueBytes: 1 << 20, Log: log}}}
	link.Cut(true)
	v := view.New(m, 0, "http://a:1", func(string) view.Peer { return link }, time.Now())
	var dropped []int
	h, err := handoff.New(a.Store, func() *view.View { return v }, func(target int) { dropped = append(dropped, target) },
		handoff.Options{Interval: 10 * time.Millisecond}, log)
	require.NoError(t, err)

	version, err := a.Clock.Next()
	require.NoError(t, err)
	env := (&record.Record{Version: version, Value: []byte("v")}).Encode()
	h.Add(1, []byte("k"), env)
	require.Positive(t, h.Pending()["http://b:1"], "the hint is held for b")

	h.Start()
	defer h.Close()
	require.Eventually(t, func() bool { return link.applies.Load() >= 3 }, 10*time.Second, time.Millisecond,
		"delivery is tried every interval")
	e, err := b.Get([]byte("k"))
	require.NoError(t, err)
	require.False(t, e.Found, "nothing reaches b while the link is cut")
	require.Positive(t, h.Pending()["http://b:1"], "the hint is kept")

	link.Cut(false)
	require.Eventually(t, func() bool { return h.Pending()["http://b:1"] == 0 }, 10*time.Second, 10*time.Millisecond,
		"the hint is delivered and forgotten once the link heals")
	e, err = b.Get([]byte("k"))
	require.NoError(t, err)
	require.True(t, e.Found)
	require.Equal(t, version, e.Rec.Version)
	require.Empty(t, dropped, "nothing was dropped")
}
