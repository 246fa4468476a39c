#!/usr/bin/env bash
# make test's race run: every package with -race, as `go test -race ./...`
# would, but internal/e2e's test binary runs as two processes beside the
# other packages. Its tests run one after another, about five minutes on
# two cores: alone it was the suite's longest path, with a core idle for
# much of it. One process runs the membership, rebuild and GC stories
# (E2E_HALF), the other the rest; both halves take about the same time.
# Output: go test's for the other packages, then a line per half, and a
# failing half's whole output.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
E2E_HALF=${E2E_HALF:-'^(TestMembership|TestRegained|TestRestartAfterCopy|TestChangeStops|TestGC|TestRebuild)'}
tmp=$(mktemp -d)
pids=()
goroot=$($GO env GOROOT)
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT

# $1: the half's name; the rest: its flags. Runs in internal/e2e, as go
# test runs a package's tests (the tests build ../.. from there).
# As go test runs a test binary: -test.paniconexit0 (a test that calls
# os.Exit(0) fails rather than ending the run as a pass), and the go
# command's GOROOT/bin first in PATH (the tests run "go build").
half() {
	local name=$1 start rc
	shift
	start=$(date +%s)
	(cd internal/e2e && PATH="$goroot/bin:$PATH" "$tmp/e2e.test" -test.paniconexit0 -test.timeout 15m -test.count 1 "$@") > "$tmp/$name.log" 2>&1
	rc=$?
	echo "$rc $(($(date +%s) - start))" > "$tmp/$name.rc"
}

$GO test -race -count=1 -timeout 15m $($GO list ./... | grep -v '/internal/e2e$') &
pids+=($!)
others=$!
if ! $GO test -race -c -o "$tmp/e2e.test" ./internal/e2e; then
	wait "$others"
	echo "FAIL	github.com/dhtkv/dhtkv/internal/e2e [build failed]"
	exit 1
fi
half stories -test.run "$E2E_HALF" &
pids+=($!)
half rest -test.skip "$E2E_HALF" &
pids+=($!)
wait "$others"
rc=$?
wait "${pids[@]:1}"
for name in stories rest; do
	code= secs=
	read -r code secs < "$tmp/$name.rc"
	if [ "$code" != 0 ]; then # a missing or unreadable status fails too
		cat "$tmp/$name.log"
		echo "FAIL	github.com/dhtkv/dhtkv/internal/e2e ($name)	${secs}s"
		rc=1
	else
		echo "ok  	github.com/dhtkv/dhtkv/internal/e2e ($name)	${secs}s"
	fi
done
exit "$rc"
