package loadgen

import (
	"fmt"
	"math"
	"reflect"
	"testing"
)

// Minimal assertions. testify is not usable here: v1.12.1 imports
// go.yaml.in/yaml/v3, which go.sum does not cover.

type number interface {
	~int | ~int64 | ~uint64 | ~float64
}

// near fails the test unless |want-got| <= delta.
func near[A, B number](t *testing.T, want A, got B, delta float64, what string, args ...any) {
	t.Helper()
	if d := math.Abs(float64(want) - float64(got)); !(d <= delta) {
		t.Errorf("%s: got %v, want %v ± %v", fmt.Sprintf(what, args...), got, want, delta)
	}
}

// eq fails the test unless want and got are deeply equal (same types).
func eq(t *testing.T, want, got any, what string, args ...any) {
	t.Helper()
	if !reflect.DeepEqual(want, got) {
		t.Errorf("%s:\n got  %#v\n want %#v", fmt.Sprintf(what, args...), got, want)
	}
}

// ok fails the test unless cond holds.
func ok(t *testing.T, cond bool, what string, args ...any) {
	t.Helper()
	if !cond {
		t.Errorf(what, args...)
	}
}

// noErr stops the test on an unexpected error.
func noErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
}
