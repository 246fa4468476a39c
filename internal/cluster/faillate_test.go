package cluster

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/replica"
	"github.com/dhtkv/dhtkv/internal/store"
	"github.com/dhtkv/dhtkv/internal/view"
)

// removingPeer fails every write and, as it does, installs next: this node
// learns, while its write is out, a map in which it is no longer a member.
type removingPeer struct {
	newerPeer
	views *atomic.Pointer[view.View]
	next  *view.View
}

func (p removingPeer) Apply([]byte, []byte, uint64, time.Time) (uint64, error) {
	p.views.Store(p.next)
	return 0, errors.New("cut off")
}

// TestFailedWriteRoutedAgainAnswersLate: a write stored here (the
// local replica) fails on both peers, and meanwhile the map changes so
// that this node is not a member. The retry loop in Coordinator.Write
// answered ErrNotAMember at once ("nothing was sent"), but the first try
// was sent and stored: the failed write must still answer only once its
// version is --max-clock-skew in this clock's past (failLate), or a write
// the client begins after the answer, through a node whose clock is up to
// the bound behind, gets a lower version and loses to the failed one.
func TestFailedWriteRoutedAgainAnswersLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock, err := hlc.New(0, nil)
		require.NoError(t, err)
		st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
		require.NoError(t, err)
		defer st.Close()
		local := &replica.Replica{Store: st, Clock: clock, Versions: replica.NewVersionFilter(1<<10, 0)}
		m, err := clustermap.Seed([]string{"http://a:1", "http://b:1", "http://c:1"}, 0)
		require.NoError(t, err)
		var views atomic.Pointer[view.View]
		gone := view.New(m, 0, "http://old:1", func(string) view.Peer { return newerPeer{} }, time.Now())
		require.Equal(t, -1, gone.Self)
		views.Store(view.New(m, 0, "", func(string) view.Peer { return removingPeer{views: &views, next: gone} }, time.Now()))
		c := New(Deps{Views: views.Load, Gate: openGate{}, Clock: clock, Local: local},
			Options{Timeout: time.Minute}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		defer c.Close()

		start := time.Now()
		err = c.Write([]byte("k"), []byte("v"), false, 0, 2, 3)
		require.Error(t, err)
		t.Logf("answer: %v after %v", err, time.Since(start))
		e, gerr := local.Get([]byte("k"))
		require.NoError(t, gerr)
		require.True(t, e.Found, "the failed write is stored here")
		require.GreaterOrEqual(t, time.Since(start), clock.MaxAhead(),
			"a failed write that was stored answered before its version was the skew bound in the past")
	})
}
