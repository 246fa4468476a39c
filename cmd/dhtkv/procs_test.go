package main

import "testing"

func TestMinProcs(t *testing.T) {
	for _, c := range []struct {
		name               string
		min, procs, numCPU int
		env                bool
		want               int
	}{
		{"few cores: raised", 8, 2, 2, false, 8},
		{"one core: raised", 8, 1, 1, false, 8},
		{"affinity mask of 2 on a larger machine: raised", 8, 2, 2, false, 8},
		{"enough cores: Go's choice", 8, 16, 16, false, 16},
		{"exactly the floor", 8, 8, 8, false, 8},
		{"a CPU quota chose fewer: kept", 8, 2, 16, false, 2},
		{"GOMAXPROCS in the environment: kept", 8, 2, 2, true, 2},
		{"off", 0, 2, 2, false, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := minProcs(c.min, c.procs, c.numCPU, c.env); got != c.want {
				t.Errorf("minProcs(%d, %d, %d, %v) = %d, want %d", c.min, c.procs, c.numCPU, c.env, got, c.want)
			}
		})
	}
}
