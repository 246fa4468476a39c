package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/client"
	"github.com/dhtkv/dhtkv/internal/node"
	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// TestStatusNeverReached: against a real node, a member it has never
// reached (nothing listens on its port: every probe fails) is down, with
// no success ever, in the table's UP column, in --members and in --json;
// and as one replica of two the node cannot reach a majority (2) of any
// partition's replicas, status exits 1 and says so.
func TestStatusNeverReached(t *testing.T) {
	dead := "http://" + testcluster.DeadEndpoint(t)
	c := testcluster.Start(t, 1, func(_ int, cfg *node.Config) {
		cfg.Cluster = "http://" + cfg.Listen + "," + dead
	})
	eps := "--endpoints=" + c.URL(0)
	cl, err := client.New(client.Config{Endpoints: []string{c.URL(0)}})
	require.NoError(t, err)
	defer cl.Close()
	require.Eventually(t, func() bool {
		st, err := cl.Status(t.Context(), c.URL(0))
		require.NoError(t, err)
		return st.Members[1].Reachable != nil
	}, 10*time.Second, 20*time.Millisecond, "the dead member's first probe ends")

	const noQuorum = "has no quorum: 4096 of 4096 partitions have fewer than 2 of their 2 replicas reachable from here (unreachable: " + "http://"
	step{name: "status", args: []string{eps, "status"}, code: exitError, errHas: c.URL(0) + " " + noQuorum, check: func(t *testing.T, out string) {
		rows := table(out)
		require.Len(t, rows, 2, out)
		assert.Equal(t, "1/2", rows[1][6], "only the node itself is up:\n%s", out)
	}}.run(t)
	step{name: "status --members", args: []string{eps, "status", "--members"}, code: exitError, errHas: noQuorum, check: func(t *testing.T, out string) {
		lines := memberLines(t, out)
		require.Len(t, lines, 3, out)
		assert.Regexp(t, `^`+c.URL(0)+` +`+c.URL(0)+` +up +\(itself\) +-$`, lines[1])
		assert.Regexp(t, `^`+c.URL(0)+` +`+dead+` +down +never +\d{4}-\d\d-\d\dT\S+ .*connection refused`, lines[2])
	}}.run(t)
	var out bytes.Buffer
	var errb bytes.Buffer
	require.Equal(t, exitError, run([]string{eps, "status", "--json"}, nil, &out, &errb), out.String())
	var es endpointStatus
	require.NoError(t, json.Unmarshal(out.Bytes(), &es), out.String())
	assert.Contains(t, es.Status.NoQuorum, "4096 of 4096 partitions")
	assert.Equal(t, map[string]client.MemberState{c.URL(0): client.MemberUp, dead: client.MemberDown}, es.MemberStates)
}

// memberLines are the lines of the --members table, its header first.
func memberLines(t *testing.T, out string) []string {
	t.Helper()
	_, members, found := strings.Cut(out, "\n\n")
	require.True(t, found, "no members table in\n%s", out)
	lines := strings.Split(strings.TrimSpace(members), "\n")
	require.Regexp(t, `^ENDPOINT +MEMBER +STATE +LAST SUCCESS +LAST ERROR$`, lines[0])
	return lines
}

// TestStatusUnknownMember: a node that has no word on a member yet (its
// first probe has not ended: "reachable" absent), or says it reachable
// without a success ever, shows it unknown, not up. A node answers so
// only in its first second, so a server stands in for it with each such
// answer; dhtkvctl and its client are the real ones.
func TestStatusUnknownMember(t *testing.T) {
	yes := true
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	st := client.Status{
		Node: "http://127.0.0.1:1", Version: "v1", Warnings: []string{}, Members: []client.Member{
			{URL: "http://127.0.0.1:1", Self: true, Reachable: &yes},
			{URL: "http://127.0.0.1:2", Reachable: &yes, LastSuccess: &now},
			{URL: "http://127.0.0.1:3"},
			{URL: "http://127.0.0.1:4", Reachable: &yes},
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v0/status" || !r.URL.Query().Has("verbose") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	}))
	defer srv.Close()
	eps := "--endpoints=" + srv.URL

	step{name: "status", args: []string{eps, "status", "--members"}, check: func(t *testing.T, out string) {
		rows := table(out)
		assert.Equal(t, "2/4", rows[1][6], "UP: itself and the member that answered:\n%s", out)
		lines := memberLines(t, out)
		require.Len(t, lines, 5, out)
		for i, want := range []string{
			`http://127.0.0.1:1 +up +\(itself\) +-$`,
			`http://127.0.0.1:2 +up +2026-11-24T10:00:00Z +-$`,
			`http://127.0.0.1:3 +unknown +never +-$`,
			`http://127.0.0.1:4 +unknown +never +-$`,
		} {
			assert.Regexp(t, `^`+srv.URL+` +`+want, lines[i+1])
		}
	}}.run(t)
	var out bytes.Buffer
	require.Equal(t, exitOK, run([]string{eps, "status", "--json"}, nil, &out, &out), out.String())
	var es endpointStatus
	require.NoError(t, json.Unmarshal(out.Bytes(), &es), out.String())
	assert.Equal(t, map[string]client.MemberState{
		"http://127.0.0.1:1": client.MemberUp, "http://127.0.0.1:2": client.MemberUp,
		"http://127.0.0.1:3": client.MemberUnknown, "http://127.0.0.1:4": client.MemberUnknown,
	}, es.MemberStates)
}

// Member.State and the UP column on the answers a node may give: only a
// member that answered is up; reachable absent, or claimed without a
// success ever, is unknown.
func TestMemberState(t *testing.T) {
	yes, no, now := true, false, time.Now()
	for _, tc := range []struct {
		name string
		m    client.Member
		want client.MemberState
	}{
		{"itself", client.Member{Self: true, Reachable: &yes}, client.MemberUp},
		{"itself, nothing said", client.Member{Self: true}, client.MemberUp},
		{"answered", client.Member{Reachable: &yes, LastSuccess: &now}, client.MemberUp},
		{"not probed yet", client.Member{}, client.MemberUnknown},
		{"reachable but never answered", client.Member{Reachable: &yes}, client.MemberUnknown},
		{"never answered, probe failed", client.Member{Reachable: &no, LastError: "refused", LastErrorAt: &now}, client.MemberDown},
		{"answered once, now failing", client.Member{Reachable: &no, LastSuccess: &now, LastError: "timeout", LastErrorAt: &now}, client.MemberDown},
	} {
		assert.Equal(t, tc.want, tc.m.State(), tc.name)
		st := &client.Status{Version: "v1", Members: []client.Member{{URL: "self", Self: true}, tc.m}}
		var b bytes.Buffer
		require.NoError(t, printStatus(&b, []endpointStatus{{Endpoint: "e", Reachable: true, Status: st}}, false))
		up := "1/2"
		if tc.want == client.MemberUp {
			up = "2/2"
		}
		assert.Equal(t, up, table(b.String())[1][6], tc.name)
	}
}

// A node whose disk is full, or whose store failed, shows it in the DISK
// column and its warning, and status exits 1 saying it refuses writes; a
// node with room shows the share free. A server stands in for each.
func TestStatusDisk(t *testing.T) {
	for _, tc := range []struct {
		name    string
		disk    *client.Disk
		warning string
		cell    string
		errHas  string
	}{
		{"room", &client.Disk{FreeBytes: 40 << 30, TotalBytes: 100 << 30}, "", "40%", ""},
		{"no report", nil, "", "-", ""},
		{"full", &client.Disk{FreeBytes: 3 << 30, TotalBytes: 100 << 30, Full: true, Ballast: "/d/EMERGENCY_BALLAST", BallastBytes: 1 << 30},
			"disk full: ...; deleting the emergency ballast /d/EMERGENCY_BALLAST frees 1.0 GiB at once", "full",
			"refuses writes (507): its data volume is below --min-free-space"},
		{"failed", &client.Disk{FreeBytes: 40 << 30, TotalBytes: 100 << 30, StoreError: "insufficient storage: the store failed a write: EIO"},
			"store failed a write (EIO): ...", "failed", "refuses writes (507): insufficient storage: the store failed a write: EIO"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := client.Status{Node: "http://127.0.0.1:1", Version: "v1", Warnings: []string{}, Disk: tc.disk,
				Members: []client.Member{{URL: "http://127.0.0.1:1", Self: true}}}
			if tc.warning != "" {
				st.Warnings = []string{tc.warning}
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(st)
			}))
			defer srv.Close()
			code := exitOK
			if tc.errHas != "" {
				code = exitError
			}
			step{name: tc.name, args: []string{"--endpoints=" + srv.URL, "status"}, code: code, errHas: tc.errHas, check: func(t *testing.T, out string) {
				rows := table(out)
				assert.Equal(t, "DISK", rows[0][9])
				assert.Equal(t, tc.cell, rows[1][9], out)
				if tc.warning != "" {
					assert.Contains(t, out, tc.warning)
				}
			}}.run(t)
		})
	}
}

// status asks every endpoint: one endpoint that accepts connections and
// never answers (a hung node, what status is for) must not make the
// healthy endpoints listed after it read as unreachable. It used the
// whole --timeout on the hung one, and then reported every later
// endpoint "no" with "context deadline exceeded".
func TestStatusHungEndpointHidesNoOther(t *testing.T) {
	_, ep := testcluster.Single(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // never answered
		}
	}()
	var out, errb bytes.Buffer
	code := run([]string{"--endpoints", "http://" + l.Addr().String() + "," + ep, "--timeout", "1s", "status"}, nil, &out, &errb)
	assert.Equal(t, exitError, code)
	rows := table(out.String())
	require.Len(t, rows, 3, out.String())
	assert.Equal(t, "no", rows[1][1], out.String())
	assert.Equal(t, "yes", rows[2][1], "the healthy node answered:\n%s", out.String())
	assert.Contains(t, errb.String(), "1 of 2 endpoints did not answer")
}

// TestStatusWritesFailing: a node that says writes fail through it during
// a change (client.Status.WritesFailing: a join asked before its node
// started, at factor 2) makes status exit 1 with its reason, as a node
// without a quorum does. A server stands in for it; the e2e story
// (TestStatusWarnsOfWritesAJoinWaitsFor) has the real node say it.
func TestStatusWritesFailing(t *testing.T) {
	const why = "2048 of 4096 partitions cannot take writes at the default ack while the join of node 3 (stage write-both) writes both replica sets: unreachable from here: http://127.0.0.1:4"
	yes := true
	now := time.Now()
	st := client.Status{
		Node: "http://127.0.0.1:1", Version: "v1", Warnings: []string{"writes failing: " + why}, WritesFailing: why,
		Members: []client.Member{{URL: "http://127.0.0.1:1", Self: true, Reachable: &yes, LastSuccess: &now}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	}))
	defer srv.Close()
	step{name: "status", args: []string{"--endpoints=" + srv.URL, "status"}, code: exitError, errHas: "status: writes fail through " + srv.URL + ": " + why,
		check: func(t *testing.T, out string) {
			assert.Contains(t, out, "writes failing: "+why, "in the table's warnings")
		}}.run(t)
}
