package probe

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/clustermap"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/view"
)

// clockPeer is a peer whose clock was measured off by offset, at at.
type clockPeer struct {
	offset time.Duration
	at     time.Time
}

func (p clockPeer) Get([]byte, uint64, time.Time) (record.Record, bool, error) {
	return record.Record{}, false, nil
}
func (p clockPeer) Apply([]byte, []byte, uint64, time.Time) (uint64, error) { return 0, nil }
func (p clockPeer) Ping(uint64, time.Time) (bool, error)                    { return true, nil }
func (p clockPeer) Summary([]byte, uint64, time.Time) ([]byte, error)       { return nil, nil }
func (p clockPeer) Map([]byte, time.Time) ([]byte, error)                   { return nil, nil }
func (p clockPeer) Close()                                                  {}
func (p clockPeer) ClockOffset() (time.Duration, time.Time, bool) {
	return p.offset, p.at, !p.at.IsZero()
}

// TestJudge: this node refuses writes when the median of its peers'
// offsets (its own counting as 0) is beyond the bound; with an even count
// the median nearer 0 is taken, and offsets older than three intervals do
// not count.
func TestJudge(t *testing.T) {
	now := time.Now()
	stale := now.Add(-4 * time.Second)
	for _, tc := range []struct {
		name    string
		offsets []clockPeer
		off     bool
	}{
		{"all close", []clockPeer{{time.Second, now}, {-time.Second, now}}, false},
		{"this clock 30 s ahead: both peers behind", []clockPeer{{-30 * time.Second, now}, {-30 * time.Second, now}}, true},
		{"one peer ahead: the median is 0", []clockPeer{{30 * time.Second, now}, {0, now}}, false},
		{"two nodes cannot tell which is wrong", []clockPeer{{30 * time.Second, now}}, false},
		{"stale offsets do not count", []clockPeer{{-30 * time.Second, stale}, {-30 * time.Second, stale}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			urls := []string{"http://a:1"}
			for i := range tc.offsets {
				urls = append(urls, "http://p:"+string(rune('1'+i)))
			}
			m, err := clustermap.Seed(urls, 0)
			require.NoError(t, err)
			peers := map[string]view.Peer{}
			for i, o := range tc.offsets {
				peers[urls[i+1]] = o
			}
			v := view.New(m, 0, urls[0], func(url string) view.Peer { return peers[url] }, now)
			p := New(func() *view.View { return v }, Options{Interval: time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			p.judge(v, now)
			if tc.off {
				require.ErrorIs(t, p.Check(), ErrClockSkew)
				require.NotEmpty(t, p.ClockWarning())
			} else {
				require.NoError(t, p.Check())
			}
		})
	}
}
