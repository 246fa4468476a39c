# dhtkv — see README.md. Every target works on a fresh machine with Go 1.26.
SHELL := /bin/bash
GO    ?= go
BIN   := bin

.PHONY: all build test test-faults lint fuzz run run-cluster stop-cluster run-node stop-node clean

all: build

# The version make build links into the binaries (dhtkv --version, the
# dhtkv_build_info metric, /v0/status?verbose); without it (go build, go
# run), they report the version the go command stamped from the VCS.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS := $(if $(VERSION),-X github.com/dhtkv/dhtkv/internal/buildinfo.version=$(VERSION))

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/dhtkv ./cmd/dhtkv
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/dhtkvctl ./cmd/dhtkvctl
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/dhtkv-load ./cmd/dhtkv-load
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/dhtkv-baseline ./cmd/dhtkv-baseline

# The whole suite, with the race detector, as CI runs it; then the
# Kubernetes manifests rendered and checked by deploy/kubernetes/validate,
# a module of its own (the server's go.mod stays without the Kubernetes
# API packages; the go command fetches them from the module proxy).
K8S_VALIDATE := deploy/kubernetes/validate
# make test also runs the allocation checks once without the race
# detector, whose own allocations make them skip under -race. The race
# run is scripts/test-race.sh: go test -race ./..., but internal/e2e's
# tests in two processes beside the other packages (why: there).
test:
	$(GO) vet ./...
	GO=$(GO) scripts/test-race.sh
	$(GO) test -count=1 -run 'Allocat' ./internal/cluster ./internal/httpapi ./internal/loadgen ./internal/clientauth
	cd $(K8S_VALIDATE) && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 5m ./...

# The fault scenarios (partitions, clock skew, restarts, hints, read
# repair, anti-entropy, garbage collection, membership changes)
# FAULT_COUNT times each with the race detector, shuffled, then the
# in-process protocol stories and tests as often; a history that fails is
# saved and its path logged. The membership changes under partitions,
# clock steps, dead members and slow links (TestMembershipFault*) run
# every case, MEMBERSHIP_FAULT_COUNT times (3-3.5 min a time on 2 shared
# cores). make test runs each scenario once, the first case of those
# with several, and leaves out the stories of about 15 s or more whose
# fault a shorter test covers (DHTKV_FAULTS=all runs them: internal/e2e's
# longFault), so that it stays within ten minutes.
FAULT_COUNT ?= 20
MEMBERSHIP_FAULT_COUNT ?= 3
test-faults:
	DHTKV_FAULTS=all $(GO) test -race -count=$(FAULT_COUNT) -shuffle=on -timeout 60m \
		-run 'TestFault|TestReadRepair|TestHint|TestRebuild|TestAntiEntropy|TestGC|TestMembership|TestRestartLoop|TestClockSurvivesRestart|TestProcessCluster' \
		-skip 'TestMembershipFault' ./internal/e2e
	DHTKV_FAULTS=all $(GO) test -race -count=$(MEMBERSHIP_FAULT_COUNT) -shuffle=on -timeout 30m \
		-run 'TestMembershipFault' ./internal/e2e
	$(GO) test -race -count=$(FAULT_COUNT) -shuffle=on -timeout 20m \
		./internal/testcluster ./internal/membership ./internal/handoff

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd $(K8S_VALIDATE) && $(GO) vet ./...
	@if $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -version >/dev/null 2>&1; then \
		$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... && \
		(cd $(K8S_VALIDATE) && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...); \
	else echo "staticcheck not available from the module proxy; skipped"; fi

# Fuzz each target for FUZZTIME (default 30s): the client API's request
# parser and whole handler, a replica's batch handler on real Pebble, the
# cluster maps a node may be handed and the changes made from them, the
# map log's rules, the peers' answers and the record streams' framing.
# make test runs their seed corpora only.
FUZZTIME ?= 30s
FUZZ_TARGETS = httpapi:FuzzParseEntity httpapi:FuzzHandler rpc:FuzzServeBatch rpc:FuzzParseSegmentsAnswer \
	placement:FuzzValidMaps maplog:FuzzRules scan/framing:FuzzDecoder scan/framing:FuzzJSONString
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "== $$t"; $(GO) test ./internal/$${t%%:*} -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME); \
	done

# The local nodes of make run and make run-cluster: scripts/cluster.sh is
# the recipe (found next to this Makefile, so make -f works from anywhere).
SCRIPTS     := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))scripts
PORT        ?= 8080
CLUSTER_ENV = PORT=$(PORT) BIN=$(BIN) $(if $(ADMIN_PORT),ADMIN_PORT=$(ADMIN_PORT)) $(if $(DATA),DATA=$(DATA))

# One node on 127.0.0.1:PORT (default 8080), admin port ADMIN_PORT
# (default PORT-2020: 6060), data in DATA/single (DATA as for
# run-cluster: ./data, or ./data/PORT for another PORT), a directory of
# its own: a cluster node's directory would make it wait for its peers.
# Ctrl-C stops it.
run: build
	@$(CLUSTER_ENV) exec $(SCRIPTS)/cluster.sh single

# Three nodes on 127.0.0.1:PORT..PORT+2 (default 8080-8082), admin ports
# ADMIN_PORT..ADMIN_PORT+2 (default PORT-2020: 6060-6062), data, logs and
# pid files in DATA (default ./data, or ./data/PORT for another PORT),
# and every node added since with run-node (node N on PORT+N-1). Ctrl-C
# stops them all; so does `make stop-cluster` with the same PORT (or
# DATA).
run-cluster: build
	@$(CLUSTER_ENV) $(SCRIPTS)/cluster.sh run

stop-cluster:
	@$(CLUSTER_ENV) $(SCRIPTS)/cluster.sh stop

# Node N of the local cluster (PORT+N-1, admin ADMIN_PORT+N-1, data in
# DATA/nodeN), in the background: a new one takes the cluster map from a
# running member (JOIN=url names one), after dhtkvctl join or replace
# added it. stop-node stops it alone.
N ?=
run-node: build
	@$(CLUSTER_ENV) $(if $(JOIN),JOIN=$(JOIN)) $(SCRIPTS)/cluster.sh node $(N)

stop-node:
	@$(CLUSTER_ENV) $(SCRIPTS)/cluster.sh stop-node $(N)

clean:
	rm -rf $(BIN)

# Benchmarks (cmd/dhtkv-bench): make bench (full, < 30 min on 2 cores)
# writes docs/reports/ (committed); make bench-quick (< 3 min, a smoke
# test whose figures are not measurements) writes BENCH_QUICK_OUT
# (default ./bench-quick-out, git-ignored); the driver refuses to let a
# quick run write docs/reports/. Each run measures the in-memory baseline
# server (bin/dhtkv-baseline) too, and quotes dhtkv's figures as a ratio
# to it. Extra driver flags go in BENCH_FLAGS, e.g.
# make bench BENCH_FLAGS='--only node-get,ceiling-get --keep';
# go run ./cmd/dhtkv-bench -h lists them. make bench-wrk cross-checks the
# baseline's figure with wrk (installs wrk if missing).
BENCH_OUT       ?= docs/reports
BENCH_QUICK_OUT ?= bench-quick-out
BENCH_FLAGS     ?=

.PHONY: bench bench-quick bench-driver bench-wrk bench-ensure-wrk

# The driver is built rather than `go run` so that Ctrl-C reaches it
# directly and it can stop the servers it started.
bench-driver:
	$(GO) build -o $(BIN)/dhtkv-bench ./cmd/dhtkv-bench

bench: build bench-driver
	./$(BIN)/dhtkv-bench --out $(BENCH_OUT) --bin $(BIN) --baseline $(BIN)/dhtkv-baseline $(BENCH_FLAGS)

bench-quick: build bench-driver
	./$(BIN)/dhtkv-bench --quick --out $(BENCH_QUICK_OUT) --bin $(BIN) --baseline $(BIN)/dhtkv-baseline $(BENCH_FLAGS)

# wrk is not needed by the driver; only bench-wrk and loadtest/wrk/ use it.
bench-ensure-wrk:
	@command -v wrk >/dev/null 2>&1 || { \
		echo "wrk not found; installing it with apt-get"; \
		apt-get install -y wrk || { apt-get update && apt-get install -y wrk; }; \
	}

# Independent check of the load generator's figures: wrk's closed-loop GET
# throughput on the baseline, to compare with the closed-loop row of
# docs/reports/ceiling-get.md. Loopback only; the baseline is stopped on exit.
BENCH_WRK_PORT ?= 18089
bench-wrk: build bench-ensure-wrk
	@set -e; \
	$(BIN)/dhtkv-baseline --listen 127.0.0.1:$(BENCH_WRK_PORT) 2>/dev/null & pid=$$!; \
	trap 'kill $$pid 2>/dev/null' EXIT INT TERM; \
	for i in $$(seq 50); do curl -sf -o /dev/null http://127.0.0.1:$(BENCH_WRK_PORT)/v0/status && break; sleep 0.1; done; \
	$(BIN)/dhtkv-load --targets http://127.0.0.1:$(BENCH_WRK_PORT) --fill 100000 --fill-only --value-size 1024; \
	KEYSPACE=100000 wrk -t2 -c64 -d10s --latency -s loadtest/wrk/get.lua http://127.0.0.1:$(BENCH_WRK_PORT)
