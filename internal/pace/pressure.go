package pace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The CPU pressure signal
//
// The scheduler's latency sees only this process's goroutines waiting
// for its Ps. Where the process shares its cores (the other nodes of a
// test cluster, a load generator, a neighbour) or runs more Ps than it
// has cores (--min-procs), its threads wait for the kernel's CPUs without
// the Go scheduler seeing it, and requests queue while background work
// goes on at its full rate. Linux's pressure stall information (PSI)
// counts that time: "some" is the time at least one runnable task of the
// cgroup waited for a CPU. Its share of an interval is a second signal:
// above Options.CPUPressure the factor halves as for a latency above the
// target, and it grows only while the share is below half of it.

// pressureReader reads the cumulative "some" stall time of CPU pressure
// of this process's cgroup (cgroup v2's cpu.pressure), or of the whole
// machine (/proc/pressure/cpu) where the cgroup has none.
type pressureReader struct {
	path string
	last time.Duration // the stall total at the last read
	at   time.Time     // when it was read
}

// machinePressure is the whole machine's CPU pressure.
const machinePressure = "/proc/pressure/cpu"

// newPressureReader finds the file to read; ok is false where the kernel
// has no PSI (before Linux 4.20, or psi=0).
func newPressureReader() (r *pressureReader, ok bool) {
	for _, p := range []string{cgroupPressurePath(), machinePressure} {
		if p == "" {
			continue
		}
		if total, err := readPressure(p); err == nil {
			return &pressureReader{path: p, last: total, at: time.Now()}, true
		}
	}
	return nil, false
}

// machine reports whether r reads the whole machine's pressure: the
// kernel's own file, or the cgroup hierarchy's root (which has no
// cgroup.type file, unlike every other cgroup, the root of a cgroup
// namespace, as in a container, included).
func (r *pressureReader) machine() bool {
	if r.path == machinePressure {
		return true
	}
	_, err := os.Stat(filepath.Join(filepath.Dir(r.path), "cgroup.type"))
	return errors.Is(err, fs.ErrNotExist)
}

// share returns the share of the time since the last call during which
// some task waited for a CPU, or -1 if the file could not be read.
func (r *pressureReader) share(now time.Time) float64 {
	total, err := readPressure(r.path)
	if err != nil {
		return -1
	}
	d := now.Sub(r.at)
	stalled := total - r.last
	r.last, r.at = total, now
	if d <= 0 {
		return -1
	}
	return min(1, max(0, float64(stalled)/float64(d)))
}

// cgroupPressurePath is the cpu.pressure file of this process's cgroup v2
// ("0::/path" in /proc/self/cgroup) in the cgroup2 file system's mount
// (/proc/self/mountinfo): /sys/fs/cgroup on a unified host, and
// /sys/fs/cgroup/unified on a hybrid one (cgroup v1 controllers beside a
// v2 hierarchy, systemd's hybrid mode), where a path built under
// /sys/fs/cgroup would not exist and the machine's pressure would be read
// instead of the cgroup's. "" where there is none.
func cgroupPressurePath() string {
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	return pressurePath(string(cg), string(mi))
}

// pressurePath joins the cgroup2 mount found in mountinfo with the cgroup
// path of the "0::" line of cgroup, made relative to the mount's root (a
// mount of a cgroup below the hierarchy's root, as in a container without
// a cgroup namespace, shows that cgroup as its root). mountinfo lists
// mounts about in the order they were made, so a mount is taken as hidden
// by a later one on its mount point or on a directory above it, unless
// that one is among its ancestors (a mount it sits on: where the initrd
// mounted /sys and /sys/fs/cgroup and then moved them under the real
// root, / is listed after them); of the cgroup2 mounts that fit, the last
// one not hidden is used.
func pressurePath(cgroup, mountinfo string) string {
	var path string
	found := false
	for _, line := range strings.Split(cgroup, "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			path, found = rest, true
			break
		}
	}
	if !found {
		return ""
	}
	type mount struct {
		id, parent string
		point      string
		cgroup2    bool
		root       string
	}
	var mounts []mount
	for _, line := range strings.Split(mountinfo, "\n") {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 {
			continue
		}
		mounts = append(mounts, mount{
			id:      f[0],
			parent:  f[1],
			point:   unescapeMount(f[4]),
			cgroup2: strings.HasPrefix(post, "cgroup2 "),
			root:    unescapeMount(f[3]),
		})
	}
	byID := make(map[string]int, len(mounts))
	for i, m := range mounts {
		byID[m.id] = i
	}
	ancestor := func(a, i int) bool { // a is a mount i sits on, directly or not
		for seen := 0; seen < len(mounts); seen++ { // a cycle ends the walk
			p, ok := byID[mounts[i].parent]
			if !ok || p == i {
				return false
			}
			if p == a {
				return true
			}
			i = p
		}
		return false
	}
	hidden := func(i int) bool {
		for j := i + 1; j < len(mounts); j++ {
			if under(mounts[i].point, mounts[j].point) && !ancestor(j, i) {
				return true
			}
		}
		return false
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if !m.cgroup2 || hidden(i) {
			continue
		}
		rel, ok := strings.CutPrefix(path, m.root)
		if !ok || (rel != "" && m.root != "/" && !strings.HasPrefix(rel, "/")) || strings.Contains(rel, "..") {
			// not under that mount (a cgroup outside a namespace's root
			// shows as /../x)
			continue
		}
		return filepath.Join(m.point, rel, "cpu.pressure")
	}
	return ""
}

// under reports whether the directory p is dir or below it.
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, \011,
// \012, \134).
func unescapeMount(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// readPressure reads the "some" line's total (microseconds) from a PSI
// file: "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345".
func readPressure(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parsePressure(b)
}

func parsePressure(b []byte) (time.Duration, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "some" {
			continue
		}
		for _, f := range fields[1:] {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				us, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("cpu pressure: %q: %w", f, err)
				}
				return time.Duration(us) * time.Microsecond, nil
			}
		}
	}
	return 0, fmt.Errorf("cpu pressure: no \"some ... total=\" line in %q", b)
}
