//go:build race

package cluster

// raceEnabled: the race detector allocates on its own, so allocation
// counts are checked without it only.
const raceEnabled = true
