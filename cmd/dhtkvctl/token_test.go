package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dhtkv/dhtkv/internal/testcluster"
)

// dhtkvctl against a real 2-node cluster with client tokens: --token,
// DHTKV_TOKEN and --token-file pass the token; each command needs its
// role (exit 5 and the node's reason with a lower one or none); status
// needs none; the flags' misuse is a usage error.
func TestToken(t *testing.T) {
	tok := testcluster.NewTokens(t)
	c := testcluster.Start(t, 2, testcluster.ClientTokens(tok))
	c.AwaitReady(10 * time.Second)
	eps := "--endpoints=" + c.URL(0) + "," + c.URL(1)
	admin := "--admin=" + c.Node(0).AdminAddr()
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	writeFile := file("write", tok.Write+"\n")
	crlfFile := file("crlf", tok.Admin+"\r\n")
	const noToken = "refused (401): unauthorized: this request needs a client token (Authorization: Bearer TOKEN)"
	for _, s := range []step{
		{name: "put without a token", args: []string{eps, "put", "k", "v"}, code: exitBadRequest, errHas: noToken},
		{name: "get without a token", args: []string{eps, "get", "k"}, code: exitBadRequest, errHas: noToken},
		{name: "unknown token", args: []string{eps, "--token", "not-a-token-of-the-node", "get", "k"}, code: exitBadRequest, errHas: "refused (401): unauthorized: unknown token"},
		{name: "put with read", args: []string{eps, "--token", tok.Read, "put", "k", "v"}, code: exitBadRequest, errHas: "refused (403): forbidden: this request needs the write role; the token's is read"},
		{name: "put with write", args: []string{eps, "--token", tok.Write, "put", "k", "v"}, out: "OK\n"},
		{name: "get with read", args: []string{eps, "--token", tok.Read, "get", "k"}, out: "v"},
		{name: "scan with read", args: []string{eps, "--token", tok.Read, "scan", "--keys-only"}, out: "k\n"},
		{name: "scan without a token", args: []string{eps, "scan"}, code: exitBadRequest, errHas: noToken},
		{name: "token after the command", args: []string{"get", eps, "--token", tok.Admin, "k"}, out: "v"},
		{name: "token file", args: []string{eps, "--token-file", writeFile, "del", "k"}, out: "OK\n"},
		{name: "token file, CRLF", args: []string{eps, "--token-file", crlfFile, "put", "k", "v2"}, out: "OK\n"},
		{name: "status needs no token", args: []string{eps, "status"}, outHas: []string{c.URL(0), c.URL(1)}},
		{name: "cluster with read", args: []string{"--token", tok.Read, "cluster", admin}, outHas: []string{c.URL(0)}},
		{name: "cluster without a token", args: []string{"cluster", admin}, code: exitBadRequest, errHas: noToken},
		{name: "repair with write", args: []string{"--token", tok.Write, "repair", admin}, code: exitBadRequest, errHas: "refused (403): forbidden: this request needs the admin role; the token's is write"},
		{name: "repair with admin", args: []string{"--token", tok.Admin, "repair", admin}, outHas: []string{"PEER", c.URL(1)}},
		{name: "snapshot with write", args: []string{"--token", tok.Write, "snapshot", admin, "--dir", "x"}, code: exitBadRequest, errHas: "(403): forbidden: this request needs the admin role"},
		{name: "decommission without a token", args: []string{"decommission", admin, c.URL(1)}, code: exitBadRequest, errHas: noToken},
		{name: "join with read", args: []string{"--token", tok.Read, "join", admin, "http://127.0.0.1:1"}, code: exitBadRequest, errHas: "(403): forbidden: this request needs the admin role; the token's is read"},
		{name: "replace with write", args: []string{"--token", tok.Write, "replace", admin, c.URL(1), "http://127.0.0.1:1"}, code: exitBadRequest, errHas: "(403): forbidden"},

		{name: "--token and --token-file", args: []string{eps, "--token", tok.Read, "--token-file", writeFile, "get", "k"}, code: exitUsage, errHas: "--token and --token-file: give one"},
		{name: "token file missing", args: []string{eps, "--token-file", filepath.Join(dir, "absent"), "get", "k"}, code: exitError, errHas: "--token-file: open"},
		{name: "token file of two lines", args: []string{eps, "--token-file", file("two", tok.Read+"\n"+tok.Write+"\n"), "get", "k"}, code: exitError, errHas: "want one non-empty line, the token"},
		{name: "token file empty", args: []string{eps, "--token-file", file("empty", "\n"), "get", "k"}, code: exitError, errHas: "want one non-empty line"},
		{name: "token with a space", args: []string{eps, "--token", "a b", "get", "k"}, code: exitUsage, errHas: "Config.Token has ' ' at byte 1"},
	} {
		s.run(t)
	}

	t.Setenv("DHTKV_TOKEN", tok.Read)
	step{name: "DHTKV_TOKEN", args: []string{eps, "get", "k"}, out: "v2"}.run(t)
	step{name: "--token wins over DHTKV_TOKEN", args: []string{eps, "--token", tok.Write, "put", "k", "v3"}, out: "OK\n"}.run(t)
	t.Setenv("DHTKV_TOKEN", "")
	t.Setenv("DHTKV_TOKEN_FILE", writeFile)
	step{name: "DHTKV_TOKEN_FILE", args: []string{eps, "put", "k", "v4"}, out: "OK\n"}.run(t)
	t.Setenv("DHTKV_TOKEN_FILE", "")

	var help strings.Builder
	require.Equal(t, exitOK, run([]string{"-h"}, nil, &help, &help))
	require.Contains(t, help.String(), "DHTKV_TOKEN")
	require.Contains(t, help.String(), "-token-file")
}
