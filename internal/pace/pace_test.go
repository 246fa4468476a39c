package pace

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The control rule, interval by interval.
func TestNext(t *testing.T) {
	const target = time.Millisecond
	for _, c := range []struct {
		name   string
		factor float64
		p99    time.Duration
		want   float64
	}{
		{"above the target halves", 1, 2 * target, 0.5},
		{"down to the floor", Floor * 1.5, 10 * target, Floor},
		{"at the floor stays", Floor, 10 * target, Floor},
		{"at the target creeps up", 0.5, target, 0.5 * Creep},
		{"between half and the target creeps up", 0.5, 3 * target / 4, 0.5 * Creep},
		{"creeping up to 1", 0.99, 3 * target / 4, 1},
		{"below half grows by a quarter", 0.5, target / 4, 0.625},
		{"idle grows", 0.5, -1, 0.625},
		{"up to 1", 0.9, 0, 1},
		{"1 stays", 1, target / 4, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.InDelta(t, c.want, next(c.factor, c.p99, target, -1, 0.2), 1e-9, "no pressure known")
			require.InDelta(t, c.want, next(c.factor, c.p99, target, 0.05, 0), 1e-9, "pressure not used")
			require.InDelta(t, c.want, next(c.factor, c.p99, target, 0.05, 0.2), 1e-9, "pressure below half its bound")
		})
	}
	// The CPU pressure share, with the latency low (target/4).
	for _, c := range []struct {
		name     string
		factor   float64
		pressure float64
		want     float64
	}{
		{"above its bound halves", 1, 0.5, 0.5},
		{"between half and the bound creeps up", 0.5, 0.15, 0.5 * Creep},
		{"below half grows", 0.5, 0.05, 0.625},
		{"down to the floor", Floor, 0.9, Floor},
	} {
		t.Run("pressure "+c.name, func(t *testing.T) {
			require.InDelta(t, c.want, next(c.factor, target/4, target, c.pressure, 0.2), 1e-9)
		})
	}
}

// A PSI file's "some" total, in microseconds.
func TestParsePressure(t *testing.T) {
	d, err := parsePressure([]byte("some avg10=2.94 avg60=4.87 avg300=33.77 total=28746590660\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"))
	require.NoError(t, err)
	require.Equal(t, 28746590660*time.Microsecond, d)
	for _, bad := range []string{"", "full avg10=0 total=5\n", "some avg10=1 total=x\n", "some avg10=1\n"} {
		_, err := parsePressure([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
}

// The cgroup's cpu.pressure is found where the cgroup2 file system is
// mounted: /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a
// hybrid one (cgroup v1 controllers beside it), below a mount's root when
// the mount is of a cgroup inside the hierarchy; none without a v2 line
// or mount.
func TestPressurePath(t *testing.T) {
	const (
		unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
		hybrid  = "25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n" +
			"26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw\n" +
			"27 25 0:24 / /sys/fs/cgroup/cpu rw,relatime shared:6 - cgroup cgroup rw,cpu\n"
		inner = "40 30 0:26 /system.slice/dhtkv.service /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
	)
	for _, tc := range []struct {
		name, cgroup, mountinfo, want string
	}{
		{"unified", "0::/system.slice/dhtkv.service\n", unified, "/sys/fs/cgroup/system.slice/dhtkv.service/cpu.pressure"},
		{"hybrid", "4:cpu:/\n1:name=systemd:/\n0::/dhtkv-g1\n", hybrid, "/sys/fs/cgroup/unified/dhtkv-g1/cpu.pressure"},
		{"the mount is the cgroup", "0::/system.slice/dhtkv.service\n", inner, "/sys/fs/cgroup/cpu.pressure"},
		{"a cgroup below the mount's", "0::/system.slice/dhtkv.service/x\n", inner, "/sys/fs/cgroup/x/cpu.pressure"},
		{"not under the mount", "0::/system.slice/dhtkv.serviceX\n", inner, ""},
		{"no v2 line", "4:cpu:/\n", hybrid, ""},
		{"outside a namespace's root", "0::/../other.slice/x\n", unified, ""},
		{"an escaped mount point", "0::/a\n", "29 23 0:26 / /run/cg\\040v2 rw - cgroup2 cgroup2 rw\n", "/run/cg v2/a/cpu.pressure"},
		{"no cgroup2 mount", "0::/a\n", "27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", ""},
		// a container's runtime mounted the hierarchy again on the same
		// point, its own cgroup as the root: the later mount is the one seen
		{"shadowed by a later mount", "0::/kubepods/pod1/c1\n", unified +
			"50 29 0:26 /kubepods/pod1/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "/sys/fs/cgroup/cpu.pressure"},
		// a tmpfs over /sys/fs/cgroup hides the cgroup2 mount there
		{"hidden by a tmpfs above it", "0::/a\n", unified +
			"51 23 0:40 / /sys/fs rw - tmpfs tmpfs rw\n", ""},
		// the initrd mounted /sys and the cgroup2 under it, then moved them
		// under the real root, listed after them: the root hides nothing
		{"the root listed after the mounts on it", "0::/user.slice/u\n",
			"22 98 0:21 / /sys rw - sysfs sysfs rw\n" +
				"29 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n" +
				"98 1 253:0 / / rw - ext4 /dev/vda1 rw\n", "/sys/fs/cgroup/user.slice/u/cpu.pressure"},
		{"a later mount beside it", "0::/a\n", unified +
			"52 23 0:41 / /sys/fs/cgroupx rw - tmpfs tmpfs rw\n", "/sys/fs/cgroup/a/cpu.pressure"},
	} {
		require.Equal(t, tc.want, pressurePath(tc.cgroup, tc.mountinfo), tc.name)
	}
}

// On a kernel with PSI the reader finds a file and reports a share in
// [0, 1] of the time since its last read.
func TestPressureReader(t *testing.T) {
	r, ok := newPressureReader()
	if !ok {
		t.Skip("no PSI on this kernel")
	}
	time.Sleep(20 * time.Millisecond) // the behaviour under test: an interval to measure
	s := r.share(time.Now())
	require.True(t, s >= 0 && s <= 1, "share %v of %s", s, r.path)
}

// The kernel's file and the hierarchy's root cgroup (no cgroup.type) are
// the whole machine's pressure; any other cgroup's is its own.
func TestMachinePressure(t *testing.T) {
	require.True(t, (&pressureReader{path: machinePressure}).machine())
	dir := t.TempDir() // a cgroup's directory, and the root's (no cgroup.type)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cpu.pressure"), nil, 0o644))
	require.True(t, (&pressureReader{path: filepath.Join(dir, "cpu.pressure")}).machine())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.type"), []byte("domain\n"), 0o644))
	require.False(t, (&pressureReader{path: filepath.Join(dir, "cpu.pressure")}).machine())
}

// hist is a cumulative scheduler latency histogram in the runtime's shape,
// with buckets at 0, 100µs, 500µs, 1ms, 2ms, 8ms and +Inf.
type hist struct{ counts []uint64 }

var buckets = []float64{0, 100e-6, 500e-6, 1e-3, 2e-3, 8e-3, posInf()}

func posInf() float64 { var z float64; return 1 / z }

// add records n latencies in bucket i (0: under 100µs ... 5: 8ms or more)
// and returns the cumulative histogram.
func (h *hist) add(n uint64, i int) *metrics.Float64Histogram {
	if h.counts == nil {
		h.counts = make([]uint64, len(buckets)-1)
	}
	h.counts[i] += n
	return &metrics.Float64Histogram{Counts: append([]uint64(nil), h.counts...), Buckets: buckets}
}

// The governor reads the interval's p99 from the cumulative histogram and
// sets every governed limiter to its full rate times the factor.
func TestGovernorObserve(t *testing.T) {
	g := New(Options{Target: time.Millisecond}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	a, b := rate.NewLimiter(8<<20, 8<<20), rate.NewLimiter(1000, 100)
	g.Govern(a)
	g.Govern(b)
	var h hist
	rates := func() (rate.Limit, rate.Limit) { return a.Limit(), b.Limit() }

	// 1,000 quick latencies and 20 of 2-8 ms: the p99 is in the 2-8 ms
	// bucket, above the target: halved.
	h.add(1000, 0)
	g.Observe(h.add(20, 4), -1)
	require.Equal(t, 0.5, g.Factor())
	ra, rb := rates()
	require.Equal(t, rate.Limit(4<<20), ra)
	require.Equal(t, rate.Limit(500), rb)

	// The next interval's latencies alone count: 1,000 quick ones, and the
	// earlier slow ones are not the interval's. Grows by a quarter.
	g.Observe(h.add(1000, 0), -1)
	require.Equal(t, 0.625, g.Factor())

	// A latency beyond the last finite bucket: above the target.
	h.add(500, 0)
	g.Observe(h.add(10, 5), -1)
	require.Equal(t, 0.3125, g.Factor())
	for range 5 {
		h.add(500, 0)
		g.Observe(h.add(10, 5), -1)
	}
	require.Equal(t, Floor, g.Factor(), "no lower than the floor")
	ra, _ = rates()
	require.Equal(t, rate.Limit(1<<20), ra)

	// p99 between half the target and the target (500µs-1ms): creeps up.
	g.Observe(h.add(1000, 2), -1)
	require.InDelta(t, Floor*Creep, g.Factor(), 1e-12)

	// Idle: too few samples; grows back to the full rates.
	for range 20 {
		g.Observe(h.add(3, 4), -1)
	}
	require.Equal(t, 1.0, g.Factor())
	ra, rb = rates()
	require.Equal(t, rate.Limit(8<<20), ra)
	require.Equal(t, rate.Limit(1000), rb)

	// A limiter governed later starts at the current factor.
	g.Observe(h.add(1000, 4), -1)
	c := rate.NewLimiter(100, 10)
	g.Govern(c)
	require.Equal(t, rate.Limit(50), c.Limit())
}

// Start runs on the runtime's own histogram and Close stops it; Target 0
// runs nothing.
func TestGovernorStartClose(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	off := New(Options{}, log)
	off.Start()
	off.Close()

	g := New(DefaultOptions(), log)
	l := rate.NewLimiter(100, 10)
	g.Govern(l)
	g.Start()
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.prev != nil // one interval observed
	}, 10*time.Second, 10*time.Millisecond)
	g.Close()
	f := g.Factor()
	require.True(t, f >= Floor && f <= 1, "factor %v", f)
	require.InDelta(t, 100*f, float64(l.Limit()), 1e-9)
}

// WaitBytes takes more than a burst in steps, and fails as WaitN does
// when the wait would outlast the context.
func TestWaitBytes(t *testing.T) {
	fast := rate.NewLimiter(1<<30, 10)
	require.NoError(t, WaitBytes(t.Context(), fast, 25), "three steps of at most the burst")
	slow := rate.NewLimiter(1, 10) // full at first, then a byte a second
	require.NoError(t, WaitBytes(t.Context(), slow, 10))
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	require.Error(t, WaitBytes(ctx, slow, 25), "25 more bytes take 25 s")
}
