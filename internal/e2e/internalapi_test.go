package e2e_test

// The internal endpoint: it carries versions (last-write-wins at the
// replica), the public API cannot forge one, and --cluster-secret guards it.

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/hlc"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/partition"
	"github.com/dhtkv/dhtkv/internal/record"
	"github.com/dhtkv/dhtkv/internal/rpc"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// versionAt builds a version the way the HLC lays it out.
func versionAt(t time.Time, logical, nodeID int) uint64 {
	return uint64(t.UnixMilli())<<20 | uint64(logical)<<8 | uint64(nodeID)
}

// TestReplicaLastWriteWins: an internal write with an older version never
// replaces a newer one, for values and tombstones alike, whatever the
// arrival order and whether the key was cached.
func TestReplicaLastWriteWins(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 1)
	cl := testcluster.NewClient(t)
	base := c.URL(0)
	now := time.Now()
	older, newer, newest := versionAt(now, 0, 3), versionAt(now, 1, 3), versionAt(now.Add(time.Millisecond), 0, 1)

	put := func(key string, rec record.Record) {
		t.Helper()
		code := internalPut(t, cl, base, key, rec, "")
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, code,
			"201 applied; 409 refused because a newer version is here")
	}
	state := func(key string) record.Record {
		t.Helper()
		code, rec := internalGet(t, cl, base, key, "")
		require.Equal(t, http.StatusOK, code)
		return rec
	}

	// Newer value first, then an older one.
	put("k1", record.Record{Version: newer, Value: []byte("new")})
	expectValue(t, cl, base, "k1", 1, 1, "new") // cache it
	put("k1", record.Record{Version: older, Value: []byte("old")})
	require.Equal(t, record.Record{Version: newer, Value: []byte("new")}, state("k1"))
	expectValue(t, cl, base, "k1", 1, 1, "new")

	// An older tombstone does not delete a newer value.
	put("k1", record.Record{Version: older, Tombstone: true})
	expectValue(t, cl, base, "k1", 1, 1, "new")
	// A newer tombstone does; an older value does not resurrect the key.
	put("k1", record.Record{Version: newest, Tombstone: true})
	expectAbsent(t, cl, base, "k1", 1, 1)
	put("k1", record.Record{Version: newer, Value: []byte("zombie")})
	require.Equal(t, record.Record{Version: newest, Tombstone: true, Value: []byte{}}, state("k1"))
	expectAbsent(t, cl, base, "k1", 1, 1)

	// Out of order arrival of three versions converges on the newest.
	put("k2", record.Record{Version: newer, Value: []byte("b")})
	put("k2", record.Record{Version: newest, Value: []byte("c")})
	put("k2", record.Record{Version: older, Value: []byte("a")})
	require.Equal(t, "c", string(state("k2").Value))

	// Same millisecond and logical counter: the node id breaks the tie.
	put("k3", record.Record{Version: versionAt(now, 5, 7), Value: []byte("node7")})
	put("k3", record.Record{Version: versionAt(now, 5, 2), Value: []byte("node2")})
	require.Equal(t, "node7", string(state("k3").Value))

	// Never-written keys are 404 on the internal endpoint.
	code, _ := internalGet(t, cl, base, "never", "")
	require.Equal(t, http.StatusNotFound, code)

}

// TestInternalBatch: one batch mixes reads and writes and gets one result
// per operation in order; a malformed batch is refused whole (400, nothing
// stored), a wrong method gets 405.
func TestInternalBatch(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 1)
	cl := testcluster.NewClient(t)
	base := c.URL(0)
	now := time.Now()
	v1, v2 := versionAt(now, 1, 3), versionAt(now, 2, 3)
	require.Equal(t, http.StatusCreated, internalPut(t, cl, base, "held", record.Record{Version: v2, Value: []byte("held")}, ""))

	var body []byte
	body = rpc.AppendBatchOp(body, rpc.OpWrite, []byte("a"), (&record.Record{Version: v1, Value: []byte("A")}).Encode())
	body = rpc.AppendBatchOp(body, rpc.OpRead, []byte("held"), nil)
	body = rpc.AppendBatchOp(body, rpc.OpWrite, []byte("held"), (&record.Record{Version: v1, Value: []byte("older")}).Encode())
	body = rpc.AppendBatchOp(body, rpc.OpRead, []byte("never"), nil)
	body = rpc.AppendBatchOp(body, rpc.OpWrite, []byte("b"), (&record.Record{Version: v1, Tombstone: true}).Encode())
	code, out := internalBatch(t, cl, base, body, "")
	require.Equal(t, http.StatusOK, code)
	held := (&record.Record{Version: v2, Value: []byte("held")}).Encode()
	want := []byte{rpc.ResApplied}
	want = rpc.AppendResultFound(want, held[:record.HeaderSize], held[record.HeaderSize:])
	want = rpc.AppendResultNewer(want, v2)
	want = append(want, rpc.ResNotFound, rpc.ResApplied)
	require.Equal(t, want, out)
	_, rec := internalGet(t, cl, base, "a", "")
	require.Equal(t, "A", string(rec.Value))
	_, rec = internalGet(t, cl, base, "b", "")
	require.True(t, rec.Tombstone)
	expectValue(t, cl, base, "held", 1, 1, "held")

	// Refused whole: nothing of the batch is stored, even its valid first
	// operation.
	good := rpc.AppendBatchOp(nil, rpc.OpWrite, []byte("k4"), (&record.Record{Version: v1, Value: []byte("v")}).Encode())
	tooMany := []byte{}
	for range rpc.MaxBatchOps + 1 {
		tooMany = rpc.AppendBatchOp(tooMany, rpc.OpRead, []byte("x"), nil)
	}
	for name, tc := range map[string]struct {
		body []byte
		code int
	}{
		"short envelope":  {rpc.AppendBatchOp(good, rpc.OpWrite, []byte("k5"), []byte("x")), http.StatusBadRequest},
		"envelope format": {rpc.AppendBatchOp(good, rpc.OpWrite, []byte("k5"), append([]byte{9, 0}, make([]byte, 8)...)), http.StatusBadRequest},
		"version 0":       {rpc.AppendBatchOp(good, rpc.OpWrite, []byte("k5"), (&record.Record{Value: []byte("v")}).Encode()), http.StatusBadRequest},
		"unknown kind":    {append(slices.Clone(good), 'x', 1, 'k'), http.StatusBadRequest},
		"cut short":       {good[:len(good)-1], http.StatusBadRequest},
		"length too big":  {append(slices.Clone(good), rpc.OpRead, 0xff, 0xff, 0x03, 'k'), http.StatusBadRequest},
		"empty key":       {rpc.AppendBatchOp(good, rpc.OpRead, nil, nil), http.StatusBadRequest},
		"too many":        {append(slices.Clone(good), tooMany...), http.StatusBadRequest},
	} {
		code, out := internalBatch(t, cl, base, tc.body, "")
		require.Equal(t, tc.code, code, name)
		require.Equal(t, 1, bytes.Count(out, []byte("\n")), "%s: a one-line reason: %q", name, out)
	}
	code, _ = internalGet(t, cl, base, "k4", "")
	require.Equal(t, http.StatusNotFound, code)

	// A key over this node's limit (another node's may be larger) fails
	// its operation only: a read answers an error, a write a refusal,
	// and the rest of the batch is served.
	long := bytes.Repeat([]byte("k"), 1025)
	body = rpc.AppendBatchOp(nil, rpc.OpRead, long, nil)
	body = rpc.AppendBatchOp(body, rpc.OpWrite, long, (&record.Record{Version: v1, Value: []byte("v")}).Encode())
	body = rpc.AppendBatchOp(body, rpc.OpWrite, []byte("k6"), (&record.Record{Version: v1, Value: []byte("v")}).Encode())
	code, out = internalBatch(t, cl, base, body, "")
	require.Equal(t, http.StatusOK, code, "%q", out)
	require.Equal(t, byte(rpc.ResError), out[0], "%q", out)
	require.Contains(t, string(out), "key of 1025 bytes (1 to 1024 allowed)")
	require.Equal(t, byte(rpc.ResApplied), out[len(out)-1], "%q", out)
	code, _ = internalGet(t, cl, base, "k6", "")
	require.Equal(t, http.StatusOK, code)

	// A version too far ahead refuses that write only; the rest of the
	// batch is served.
	for name, v := range map[string]uint64{
		"far future":   versionAt(now.Add(hlc.DefaultMaxAhead+time.Hour), 0, 1),
		"top of range": ^uint64(0),
	} {
		body := rpc.AppendBatchOp(nil, rpc.OpWrite, []byte("skew-"+name), (&record.Record{Version: v, Value: []byte("v")}).Encode())
		body = rpc.AppendBatchOp(body, rpc.OpWrite, []byte("fine-"+name), (&record.Record{Version: v1, Value: []byte("v")}).Encode())
		code, out := internalBatch(t, cl, base, body, "")
		require.Equal(t, http.StatusOK, code, name)
		require.Equal(t, byte(rpc.ResRefused), out[0], "%s: %q", name, out)
		require.Contains(t, string(out), "too far ahead", name)
		require.Equal(t, byte(rpc.ResApplied), out[len(out)-1], name)
		code, _ = internalGet(t, cl, base, "skew-"+name, "")
		require.Equal(t, http.StatusNotFound, code, name)
		code, _ = internalGet(t, cl, base, "fine-"+name, "")
		require.Equal(t, http.StatusOK, code, name)
	}

	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		code, _ := cl.Do(t, m, base+rpc.BatchPath, good)
		require.Equal(t, http.StatusMethodNotAllowed, code, m)
	}
	// An empty batch is valid and answers nothing.
	code, out = internalBatch(t, cl, base, nil, "")
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, out)
}

// TestPublicPutCannotForgeVersion: whatever a client sends to /v0/entity,
// the write gets a fresh version from the coordinator's clock (its node id,
// the current millisecond) and the body is stored verbatim as the value. A
// version in the query is an unknown parameter: refused.
func TestPublicPutCannotForgeVersion(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2)
	cl := testcluster.NewClient(t)
	forged := record.Record{Version: ^uint64(0) &^ 0xff, Value: []byte("forged")}
	body := forged.Encode() // a body that is itself a valid envelope
	for via := range 2 {
		key := "forge-" + strconv.Itoa(via)
		u := testcluster.EntityURL(c.URL(via), key, 2, 2)
		code, reason := cl.Do(t, http.MethodPut, u+"&version="+strconv.FormatUint(forged.Version, 10), body)
		require.Equal(t, http.StatusBadRequest, code)
		require.Contains(t, string(reason), `unknown parameter "version"`)
		req, err := http.NewRequest(http.MethodPut, u, strings.NewReader(string(body)))
		require.NoError(t, err)
		req.Header.Set("X-Dhtkv-Version", strconv.FormatUint(forged.Version, 10))
		req.Header.Set("Content-Type", "application/octet-stream")
		before := time.Now()
		resp, err := cl.HTTP.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)

		for i := range 2 {
			code, rec := internalGet(t, cl, c.URL(i), key, "")
			require.Equal(t, http.StatusOK, code)
			ms, _, nodeID := hlc.Parts(rec.Version)
			require.Equal(t, via, nodeID, "version carries the coordinator's id")
			require.InDelta(t, before.UnixMilli(), ms, 5000, "version is the current time, not the forged one")
			require.Equal(t, body, rec.Value, "the body is the value, not an envelope")
		}
		expectValue(t, cl, c.URL(1-via), key, 2, 2, string(body))
	}
}

// TestInternalFarFutureVersion documents why the internal endpoint must be
// protected (--cluster-secret, network): whoever can reach it can write any
// version up to --max-clock-skew ahead of the replica's clock (here set to
// two hours); beyond that it is refused (TestInternalBatch). A far-future one is reported back to the next coordinator
// (409 with the held version), which then rewrites above it: the public
// write wins, but every clock that sees the forged version is dragged an
// hour ahead, and the versions of all later writes with it.
func TestInternalFarFutureVersion(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2, func(_ int, cfg *node.Config) { cfg.MaxClockSkew = 2 * time.Hour })
	cl := testcluster.NewClient(t)
	future := versionAt(time.Now().Add(time.Hour), 0, 1)
	require.Equal(t, http.StatusCreated, internalPut(t, cl, c.URL(1), "k", record.Record{Version: future, Value: []byte("forged")}, ""))

	// Node 0 never saw the forged version; node 1 refuses node 0's first
	// round with it, and node 0 rewrites past it.
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "k", []byte("public"), 2, 2))
	for i := range 2 {
		_, rec := internalGet(t, cl, c.URL(i), "k", "")
		require.Equal(t, "public", string(rec.Value), "node %d", i)
		require.Greater(t, rec.Version, future, "node %d: the clock now runs past the forged version", i)
	}
	expectValue(t, cl, c.URL(1), "k", 2, 2, "public")
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(1), "k", []byte("via1"), 2, 2))
	expectValue(t, cl, c.URL(0), "k", 2, 2, "via1")
}

// TestClusterSecret: with --cluster-secret, internal requests need the
// header (403 otherwise), the public API does not, and the cluster works
// end to end because peers send it.
func TestClusterSecret(t *testing.T) {
	t.Parallel()
	const secret = "s3cret"
	c := testcluster.Start(t, 2, withSecret(secret))
	cl := testcluster.NewClient(t)
	rec := record.Record{Version: versionAt(time.Now(), 0, 0), Value: []byte("v")}
	for i := range 2 {
		base := c.URL(i)
		require.Equal(t, http.StatusForbidden, internalPut(t, cl, base, "direct", rec, ""))
		require.Equal(t, http.StatusForbidden, internalPut(t, cl, base, "direct", rec, "wrong"))
		code, _ := internalGet(t, cl, base, "direct", "")
		require.Equal(t, http.StatusForbidden, code)
		code, _ = internalGet(t, cl, base, "direct", secret[:3])
		require.Equal(t, http.StatusForbidden, code)

		require.Equal(t, http.StatusCreated, internalPut(t, cl, base, "direct", rec, secret))
		code, got := internalGet(t, cl, base, "direct", secret)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, rec, got)

		// A ping (an empty batch) with the header once, and repeated in
		// either order: a repeated header is refused whatever it holds.
		for _, values := range [][]string{{secret}, {secret, "wrong"}, {"wrong", secret}, {secret, secret}} {
			req, err := http.NewRequest(http.MethodPost, base+rpc.BatchPath, nil)
			require.NoError(t, err)
			for _, v := range values {
				req.Header.Add(rpc.SecretHeader, v)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			if len(values) == 1 {
				require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
				continue
			}
			require.Equal(t, http.StatusForbidden, resp.StatusCode, "%q", values)
			require.Equal(t, "forbidden: the cluster secret's header is repeated\n", string(body))
		}

		// A caller without the secret learns nothing of an endpoint's
		// methods: a wrong method is a 403 before it is a 405.
		for secretGiven, want := range map[string]int{"": http.StatusForbidden, secret: http.StatusMethodNotAllowed} {
			req, err := http.NewRequest(http.MethodGet, base+rpc.BatchPath, nil)
			require.NoError(t, err)
			if secretGiven != "" {
				req.Header.Set(rpc.SecretHeader, secretGiven)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, want, resp.StatusCode, "GET %s with secret %q", rpc.BatchPath, secretGiven)
		}
	}

	for via := range 2 {
		key := "e2e-" + strconv.Itoa(via)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(via), key, []byte("v"), 2, 2))
		for i := range 2 {
			expectValue(t, cl, c.URL(i), key, 2, 2, "v")
		}
		require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(1-via), key, 2, 2))
		for i := range 2 {
			expectAbsent(t, cl, c.URL(i), key, 2, 2)
		}
	}
}

// TestClusterSecretMismatch: a node started with another secret is refused
// by its peers (403), which the coordinator counts as a failed replica,
// and its status says why, in the peer's words (the ping's error once
// said only "status 403").
func TestClusterSecretMismatch(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, 2, func(i int, cfg *node.Config) { cfg.ClusterSecret = "secret-" + strconv.Itoa(i) })
	cl := testcluster.NewClient(t)
	p := placementOf(t, c)
	key := findKey(t, p, "mismatch", 0, 1)
	require.Equal(t, http.StatusGatewayTimeout, cl.Put(t, c.URL(0), key, []byte("v"), 2, 2))
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v"), 1, 2))
	code, _ := internalGet(t, cl, c.URL(1), key, "secret-0")
	require.Equal(t, http.StatusForbidden, code)
	code, _ = internalGet(t, cl, c.URL(1), key, "secret-1")
	require.Equal(t, http.StatusNotFound, code, "node 1 refused the write")
	require.Equal(t, rpc.SecretHeader, "X-Dhtkv-Secret")
	testcluster.Eventually(t, 10*time.Second, "node 0's status gives node 1's reason", func() bool {
		code, body := cl.Do(t, http.MethodGet, c.URL(0)+"/v0/status?verbose", nil)
		return code == http.StatusOK && strings.Contains(string(body), "status 403: forbidden: missing or wrong cluster secret")
	})
}

// TestClockSurvivesRestart: a node stores a version far ahead of its wall
// clock (a peer's clock ran ahead); after a restart, writes it coordinates
// alone (one local replica: no replica can answer 409) must still be newer.
// Without the persisted clock bound (hlc.Restore), the restarted clock
// starts from the wall clock and the PUT below is silently lost (removing
// the Restore call in node.New makes this test fail).
func TestClockSurvivesRestart(t *testing.T) {
	// A bound wide enough that the version is still ahead after the
	// restart.
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) { cfg.MaxClockSkew = 10 * time.Second })
	cl := testcluster.NewClient(t)
	future := versionAt(time.Now().Add(3*time.Second), 0, 0) // within --max-clock-skew
	require.Equal(t, http.StatusCreated, internalPut(t, cl, c.URL(0), "k", record.Record{Version: future, Value: []byte("ahead")}, ""))
	c.StopNode(0)
	c.StartNode(0)
	require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "k", []byte("after restart"), 1, 1))
	expectValue(t, cl, c.URL(0), "k", 1, 1, "after restart")
}

// TestRestartLoopKeepsVersionsNearTheWallClock: a node restarted 50 times
// in a row, writing between restarts, issues versions within
// hlc.PersistWindow of the wall clock every time: restarts do not push its
// clock ahead, and do not accumulate.
func TestRestartLoopKeepsVersionsNearTheWallClock(t *testing.T) {
	c := testcluster.Start(t, 1)
	cl := testcluster.NewClient(t)
	var last uint64
	for i := range 50 {
		c.StopNode(0)
		c.StartNode(0)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), "k", []byte("v"), 1, 1))
		wall := time.Now().UnixMilli() // after the write's version was taken
		_, rec := internalGet(t, cl, c.URL(0), "k", "")
		require.Greater(t, rec.Version, last, "restart %d: versions increase", i)
		last = rec.Version
		ms, _, _ := hlc.Parts(rec.Version)
		require.LessOrEqual(t, ms-wall, hlc.PersistWindow.Milliseconds(), "restart %d: version %d ms ahead of the wall clock", i, ms-wall)
	}
}

// TestInternalStreamParts: a record stream that names partitions carries
// every record of them, tombstones included, in key order, and nothing of
// the others; parts that do not parse are a 400 with the reason.
func TestInternalStreamParts(t *testing.T) {
	c := testcluster.Start(t, 1)
	cl := testcluster.NewClient(t)
	var keys []string
	for k := range 200 {
		key := "p" + strconv.Itoa(k)
		keys = append(keys, key)
		require.Equal(t, http.StatusCreated, cl.Put(t, c.URL(0), key, []byte("v"), 1, 1))
	}
	require.Equal(t, http.StatusAccepted, cl.Delete(t, c.URL(0), keys[0], 1, 1))
	parts := &partition.Set{}
	for _, key := range keys[:100] {
		p, _ := partition.Of([]byte(key))
		parts.Add(p)
	}
	var want []string
	for _, key := range keys {
		if parts.HasKey([]byte(key)) {
			want = append(want, key)
		}
	}
	slices.Sort(want)
	require.Less(t, len(want), len(keys), "some keys are of other partitions")

	sc := rpc.NewStreamClient(rpc.StreamOptions{OpenTimeout: time.Second, IdleTimeout: 5 * time.Second, MaxKey: 1024, MaxEnvelope: 1 << 20})
	defer sc.Close()
	it, err := sc.OpenParts(t.Context(), c.URL(0), 0, parts, false)
	require.NoError(t, err)
	var got []string
	tombstones := 0
	for it.Next() {
		got = append(got, string(it.Key()))
		if it.Record().Tombstone {
			tombstones++
		}
	}
	require.NoError(t, it.Err())
	require.NoError(t, it.Close())
	require.Equal(t, want, got)
	require.Equal(t, 1, tombstones, "the deleted key comes as a tombstone")

	for _, bad := range []string{"", "xyz", parts.String() + "A", "%2B" + parts.String()[1:]} {
		code, body := cl.Do(t, http.MethodGet, c.URL(0)+"/v0/internal/entities?start=%00&parts="+bad, nil)
		require.Equal(t, http.StatusBadRequest, code, "parts %q", bad)
		require.Contains(t, string(body), "partition set")
	}
}
