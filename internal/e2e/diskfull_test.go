package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// fakeVolume is a data volume whose free space the test sets: a node's
// node.Config.StatFS.
type fakeVolume struct {
	mu          sync.Mutex
	free, total uint64
}

func (v *fakeVolume) statfs(string) (vfs.DiskUsage, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return vfs.DiskUsage{AvailBytes: v.free, TotalBytes: v.total, UsedBytes: v.total - v.free}, nil
}

func (v *fakeVolume) setFree(n uint64) {
	v.mu.Lock()
	v.free = n
	v.mu.Unlock()
}

// One node of three has its disk below --min-free-space (5%, the
// default). It refuses the writes it would coordinate with 507 and the
// reason, and the replica writes sent to it, which its coordinators count
// as not answered: ack=2 writes through the others keep succeeding, and
// they keep hints for it, within --hint-max-bytes. Its reads, as a
// replica and as a coordinator, go on, and it stays ready. Anti-entropy
// neither pulls into it nor pushes to it. Once space is back it takes
// writes again without a restart, the hints reach it, and an exchange
// brings what the dropped hints carried.
func TestFaultDiskFullNode(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		const full = 2
		vol := &fakeVolume{free: 500 << 20, total: 1000 << 20}
		c := testcluster.StartInMemory(t, 3, func(i int, cfg *node.Config) {
			if i == full {
				cfg.StatFS = vol.statfs
			}
			cfg.Handoff.MaxBytes = 2 << 10 // a few hints each: the cap is reached
		})
		c.AwaitFormed(10 * time.Second)
		cl := c.Client()
		for i := range 5 {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("before%d", i), []byte("old"), 3, 3))
		}

		vol.setFree(20 << 20)   // 2% free
		time.Sleep(time.Second) // past the guard's last reading (the bubble's clock)
		code, body := cl.Do(t, http.MethodPut, testcluster.EntityURL(c.URL(full), "through-full", 1, 3), []byte("v"))
		require.Equal(t, http.StatusInsufficientStorage, code)
		reason := strings.TrimSpace(string(body))
		require.NotContains(t, reason, "\n")
		require.Contains(t, reason, "insufficient storage: the data volume has 20 MiB free of 1000 MiB, below --min-free-space 5% (50 MiB): writes are refused until 62 MiB are free")
		code, _ = cl.Do(t, http.MethodDelete, testcluster.EntityURL(c.URL(full), "before0", 1, 3), nil)
		require.Equal(t, http.StatusInsufficientStorage, code)

		// Writes through the other nodes reach ack=2 on the two others.
		var during []string
		value := []byte(strings.Repeat("w", 200))
		for i := range 30 {
			k := fmt.Sprintf("during%02d", i)
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(i%2), k, value, 2, 3), k)
			during = append(during, k)
		}
		code, body = cl.Do(t, http.MethodPut, testcluster.EntityURL(c.URL(0), "all-three", 3, 3), []byte("v"))
		require.Equal(t, http.StatusGatewayTimeout, code, "ack=3 needs the full node")
		require.Contains(t, string(body), "insufficient storage")
		for _, e := range c.Replica(full) {
			require.False(t, strings.HasPrefix(e.Key, "during"), "the full node stored %s", e.Key)
		}
		for i := range 2 {
			hints := c.Hints(i)[full]
			require.NotEmpty(t, hints, "node %d keeps hints for the full node", i)
			require.Less(t, len(hints), 15, "within --hint-max-bytes")
			require.Positive(t, testcluster.Metric(t, c.Node(i).Registry(), "dhtkv_hints_dropped_total", "reason", "cap"))
		}

		// Reads go on: through the full node (its replica and the others'),
		// and of its replica through the others.
		for _, k := range during {
			code, body := cl.Get(t, c.URL(full), k, 2, 3)
			require.Equal(t, http.StatusOK, code, k)
			require.Equal(t, value, body)
		}
		for i := range 5 {
			code, body := cl.Get(t, c.URL(full), fmt.Sprintf("before%d", i), 1, 3)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "old", string(body))
			code, _ = cl.Get(t, c.URL(0), fmt.Sprintf("before%d", i), 3, 3)
			require.Equal(t, http.StatusOK, code, "the full node answers as a replica")
		}

		// It says so, stays ready, and exports it.
		require.NoError(t, c.Node(full).Ready(), "a full node serves reads: it stays ready")
		var st client.Status
		code, body = cl.Do(t, http.MethodGet, c.URL(full)+"/v0/status?verbose", nil)
		require.Equal(t, http.StatusOK, code)
		require.NoError(t, json.Unmarshal(body, &st))
		require.NotNil(t, st.Disk)
		require.True(t, st.Disk.Full)
		require.True(t, st.Disk.RefusesWrites())
		require.Equal(t, uint64(20<<20), st.Disk.FreeBytes)
		require.Equal(t, uint64(50<<20), st.Disk.MinFreeBytes)
		require.Len(t, st.Warnings, 1)
		require.Contains(t, st.Warnings[0], "disk full: insufficient storage")
		reg := c.Node(full).Registry()
		require.Equal(t, 1.0, testcluster.Metric(t, reg, "dhtkv_disk_full"))
		require.Equal(t, float64(20<<20), testcluster.Metric(t, reg, "dhtkv_disk_free_bytes"))
		require.Positive(t, testcluster.Metric(t, reg, "dhtkv_store_writes_refused_total", "reason", "disk_full"))

		// Anti-entropy from the full node pulls nothing, and from another
		// node pushes once and stops: the keys stay differing.
		for _, x := range c.Repair(full) {
			require.Zero(t, x.Pulled, "%+v", x)
			require.NotEmpty(t, x.Error, "%+v", x)
		}
		for _, x := range c.Repair(0) {
			if x.Peer == c.URL(full) {
				require.Zero(t, x.Pushed, "%+v", x)
				require.NotEmpty(t, x.Error, "%+v", x)
			}
		}

		// Space comes back: writes resume without a restart, the hints
		// are delivered, and an exchange brings what the dropped ones
		// carried.
		vol.setFree(100 << 20)
		time.Sleep(time.Second)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(full), "after", []byte("v"), 3, 3))
		c.Await(10*time.Second, "hints delivered", func() (bool, string) {
			h0, h1 := c.Hints(0)[full], c.Hints(1)[full]
			return len(h0)+len(h1) == 0, fmt.Sprint(h0, h1)
		})
		for _, x := range c.Repair(full) {
			require.Empty(t, x.Error, "%+v", x)
		}
		held := map[string]string{}
		for _, e := range c.Replica(full) {
			held[e.Key] = e.Value
		}
		for _, k := range during {
			require.Equal(t, string(value), held[k], k)
		}
		require.Equal(t, "v", held["after"])
		code, body = cl.Do(t, http.MethodGet, c.URL(full)+"/v0/status", nil)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "OK\n", string(body))
		require.Equal(t, 0.0, testcluster.Metric(t, reg, "dhtkv_disk_full"))
	})
}

// A node that lost its disk rebuilds onto a volume below
// --min-free-space: it copies nothing (every batch is refused), stays
// rebuilding and unready, and finishes by itself once space is back.
func TestFaultDiskFullRebuild(t *testing.T) {
	testcluster.InBubble(t, func(t *testing.T) {
		vol := &fakeVolume{free: 10 << 20, total: 1000 << 20}
		c := testcluster.StartInMemory(t, 3)
		c.AwaitFormed(10 * time.Second)
		cl := c.Client()
		for i := range 20 {
			require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), fmt.Sprintf("k%02d", i), []byte("v"), 3, 3))
		}
		c.StopNode(2)
		c.WipeNode(2)
		c.Reconfigure(2, func(cfg *node.Config) { cfg.StatFS = vol.statfs })
		c.StartNode(2)
		time.Sleep(5 * time.Second) // five of the rebuild's retries, on the bubble's clock
		require.True(t, c.Node(2).Rebuilding(), "nothing copied onto a full volume")
		require.Error(t, c.Node(2).Ready())
		for _, e := range c.Replica(2) {
			require.False(t, strings.HasPrefix(e.Key, "k"), "the full node stored %s", e.Key)
		}
		vol.setFree(500 << 20)
		c.Await(30*time.Second, "the rebuild", func() (bool, string) {
			err := c.Node(2).Ready()
			return err == nil, fmt.Sprint(err)
		})
		require.Equal(t, c.Replica(0), c.Replica(2))
	})
}
