//go:build race

package httpapi_test

// raceEnabled: the race detector allocates on its own, so allocation
// counts are checked without it only.
const raceEnabled = true
