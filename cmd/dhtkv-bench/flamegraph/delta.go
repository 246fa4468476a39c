package flamegraph

import (
	"fmt"

	"github.com/google/pprof/profile"
)

// Delta returns after − before. The allocation profile a Go server exposes
// is cumulative since process start; a benchmark wants only what its measured
// window allocated, and the fill phase before it would otherwise dominate.
// before is copied, so neither input is modified.
func Delta(before, after *profile.Profile) (*profile.Profile, error) {
	neg := before.Copy()
	neg.Scale(-1)
	d, err := profile.Merge([]*profile.Profile{neg, after})
	if err != nil {
		return nil, fmt.Errorf("subtract profiles: %w", err)
	}
	// Merge keeps the header of its first input; the window is "after".
	d.TimeNanos = after.TimeNanos
	if after.TimeNanos > before.TimeNanos {
		d.DurationNanos = after.TimeNanos - before.TimeNanos
	}
	return d, nil
}
