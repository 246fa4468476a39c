package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/dhtkv/dhtkv/internal/probe"
)

func TestSharedSettingsRules(t *testing.T) {
	cfg := &Config{MaxClockSkew: 500 * time.Millisecond}
	cfg.Handoff.Window = 3 * time.Hour
	own := cfg.sharedSettings()
	assert.Equal(t, "gc-grace=4h0m0.5s hint-window=3h0m0s max-clock-skew=500ms", own, "the grace's default is said as the node uses it")
	for _, tc := range []struct {
		name, peer string
		want       []string
		grace      time.Duration
	}{
		{"the same", own, nil, 4*time.Hour + 500*time.Millisecond},
		{"an earlier release says nothing", "", nil, 4*time.Hour + 500*time.Millisecond},
		{"a shorter grace", "gc-grace=1h0m0s hint-window=3h0m0s max-clock-skew=500ms",
			[]string{"--gc-grace=1h0m0s (this node: 4h0m0.5s)"}, time.Hour},
		{"a longer grace counts in no shortest", "gc-grace=9h0m0s hint-window=3h0m0s max-clock-skew=500ms",
			[]string{"--gc-grace=9h0m0s (this node: 4h0m0.5s)"}, 4*time.Hour + 500*time.Millisecond},
		{"two differ, in the peer's order", "max-clock-skew=1s hint-window=1h0m0s gc-grace=4h0m0.5s",
			[]string{"--max-clock-skew=1s (this node: 500ms)", "--hint-window=1h0m0s (this node: 3h0m0s)"}, 4*time.Hour + 500*time.Millisecond},
		{"a setting this node does not know is not compared", own + " replicas-rule=v2", nil, 4*time.Hour + 500*time.Millisecond},
		{"nor one the peer does not say", "gc-grace=4h0m0.5s", nil, 4*time.Hour + 500*time.Millisecond},
		{"a malformed grace is no grace", "gc-grace=soon", []string{"--gc-grace=soon (this node: 4h0m0.5s)"}, 4*time.Hour + 500*time.Millisecond},
	} {
		assert.Equal(t, tc.want, otherSettings(own, tc.peer), tc.name)
		peers := []probe.PeerState{{URL: "http://a", Settings: own}, {URL: "http://b", Settings: tc.peer}}
		assert.Equal(t, tc.grace, shortestGrace(cfg.gcGrace(), peers), tc.name)
		ws := settingsWarnings(own, peers)
		if tc.want == nil {
			assert.Empty(t, ws, tc.name)
		} else {
			assert.Len(t, ws, 1, tc.name)
			assert.Contains(t, ws[0], "peer http://b runs with "+tc.want[0], tc.name)
		}
	}
}
