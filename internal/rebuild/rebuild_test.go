package rebuild

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dhtkv/dhtkv/internal/logbuf"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/view"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pinged is a peer whose ping answers a (err nil) or fails with err.
type pinged struct {
	view.Peer
	a   view.PingAnswer
	err error
}

func (p pinged) Ping(uint64, time.Time) (view.PingAnswer, error) { return p.a, p.err }

// The rules by which a node with an empty directory learns whether it
// lost its disk: at its start (Needed) any peer that knows the cluster,
// or routes by a newer map, says so, and "all" says whether every peer
// answered; later, unconfirmed (ask), only a peer formed before the
// directory was made, by more than the skew bound, or routing by a newer
// map says so, and every peer must answer once before it was a new
// cluster.
func TestLostDiskRules(t *testing.T) {
	made := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	const skew = 500 * time.Millisecond
	silent := pinged{err: errors.New("ping: connection refused")}
	stale := pinged{err: fmt.Errorf("ping: %w", rpc.ErrStaleEpoch)}
	notFormed := pinged{}
	formedAt := func(at time.Time) pinged {
		return pinged{a: view.PingAnswer{Formed: true, FormedAt: at, Incarnation: 9}}
	}
	formedUnknown := pinged{a: view.PingAnswer{Formed: true}}           // a release that says neither when nor its incarnation
	hasData := pinged{a: view.PingAnswer{Formed: true, Incarnation: 9}} // not formed, holding records: this release
	formedLongAgo := formedAt(time.UnixMilli(1))                        // formed under a release before the times
	for _, tc := range []struct {
		name        string
		peers       []pinged
		needed, all bool // Needed at the start
		lost, asked bool // ask, unconfirmed: lost, and every peer answered
	}{
		{"every peer new", []pinged{notFormed, notFormed}, false, true, false, true},
		{"one peer silent", []pinged{notFormed, silent}, false, false, false, false},
		{"every peer silent", []pinged{silent, silent}, false, false, false, false},
		{"formed long before", []pinged{formedAt(made.Add(-time.Hour)), silent}, true, true, true, true},
		{"formed since, with this node", []pinged{formedAt(made.Add(time.Second)), notFormed}, true, true, false, true},
		{"formed within the skew bound before", []pinged{formedAt(made.Add(-skew / 2)), notFormed}, true, true, false, true},
		{"formed just beyond the skew bound before", []pinged{formedAt(made.Add(-skew - time.Millisecond)), notFormed}, true, true, true, true},
		{"formed under an earlier release, saying neither", []pinged{formedUnknown, notFormed}, true, true, true, true},
		{"formed before this release recorded when", []pinged{formedLongAgo, silent}, true, true, true, true},
		{"holding records, not formed", []pinged{hasData, notFormed}, true, true, false, true},
		{"a newer map", []pinged{stale, silent}, true, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			urls := []string{"http://n1:1"}
			for i := range tc.peers {
				urls = append(urls, fmt.Sprintf("http://n%d:1", i+2))
			}
			m, err := clustermap.Seed(urls, 0)
			require.NoError(t, err)
			peers := map[string]view.Peer{}
			for i, p := range tc.peers {
				peers[urls[i+1]] = p
			}
			v := view.New(m, 0, urls[0], func(u string) view.Peer { return peers[u] }, made)
			needed, all := Needed(v, time.Second)
			require.Equal(t, tc.needed, needed, "Needed")
			require.Equal(t, tc.all, all, "all answered at the start")

			r := New(func() *view.View { return v }, nil, Options{Unconfirmed: true, Created: made, Skew: skew}, slog.New(slog.DiscardHandler))
			answered := map[int]bool{}
			lost, asked := r.ask(answered)
			require.Equal(t, tc.lost, lost, "lost, unconfirmed")
			require.Equal(t, tc.asked, asked, "every peer answered")
		})
	}
}

// An unconfirmed node asks again only the peers that have not answered
// yet, and once the last of them answers without knowing the cluster from
// before, it was a new cluster.
func TestAskRemembersWhoAnswered(t *testing.T) {
	made := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	m, err := clustermap.Seed(urls, 0)
	require.NoError(t, err)
	peers := map[string]view.Peer{urls[1]: pinged{}, urls[2]: pinged{err: errors.New("silent")}}
	v := view.New(m, 0, urls[0], func(u string) view.Peer { return peers[u] }, made)
	r := New(func() *view.View { return v }, nil, Options{Unconfirmed: true, Created: made}, slog.New(slog.DiscardHandler))
	answered := map[int]bool{}
	lost, all := r.ask(answered)
	require.False(t, lost)
	require.False(t, all)
	require.Equal(t, map[int]bool{1: true}, answered)

	// Node 2 has since been formed (with this node); node 3 answers at last.
	peers[urls[1]] = pinged{err: errors.New("not asked again")}
	peers[urls[2]] = pinged{a: view.PingAnswer{Formed: true, FormedAt: made.Add(time.Minute), Incarnation: 9}}
	v = view.New(m, 0, urls[0], func(u string) view.Peer { return peers[u] }, made)
	lost, all = r.ask(answered)
	require.False(t, lost)
	require.True(t, all, "a new cluster")
}

// TestConfirmWarnsOnlyOfPeersSilentForLong: a new cluster's node, whose
// peers start after it, logs no warning (every node of every fresh
// `make run-cluster` logged one); one whose peer stays silent past
// WarnAfter warns once, naming it.
func TestConfirmWarnsOnlyOfPeersSilentForLong(t *testing.T) {
	made := time.Now()
	urls := []string{"http://n1:1", "http://n2:1", "http://n3:1"}
	m, err := clustermap.Seed(urls, 0)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		late pinged // node 3, once node 2 answered
		warn bool
	}{
		{"a new cluster's peers start", pinged{}, false},
		{"a peer stays silent", pinged{err: errors.New("connection refused")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			peers := map[string]view.Peer{urls[1]: pinged{}, urls[2]: pinged{err: errors.New("connection refused")}}
			views := func() *view.View {
				mu.Lock()
				defer mu.Unlock()
				return view.New(m, 0, urls[0], func(u string) view.Peer { return peers[u] }, made)
			}
			var logs logbuf.Buffer
			r := New(views, nil, Options{Unconfirmed: true, Created: made, WarnAfter: 300 * time.Millisecond},
				slog.New(slog.NewTextHandler(&logs, nil)))
			r.Start()
			defer r.Close()
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "started with an empty data directory") }, 5*time.Second, time.Millisecond)
			mu.Lock()
			peers[urls[2]] = tc.late
			mu.Unlock()
			if !tc.warn {
				require.Eventually(t, func() bool { return !r.Unconfirmed() }, 5*time.Second, time.Millisecond)
				require.NotContains(t, logs.String(), "level=WARN")
				require.Contains(t, logs.String(), "a new cluster, nothing to rebuild")
				return
			}
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "level=WARN") }, 5*time.Second, time.Millisecond)
			require.Contains(t, logs.String(), `silent=[http://n3:1]`)
			require.True(t, r.Unconfirmed())
			r.Close()
			require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), "once")
		})
	}
}
