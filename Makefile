# dhtkv — see README.md. Every target works on a fresh machine with Go 1.26.
SHELL := /bin/bash
GO    ?= go
BIN   := bin

.PHONY: all build test test-faults lint fuzz run run-cluster stop-cluster clean

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

# The whole suite, with the race detector, as CI runs it.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...

# The fault scenarios (partitions, clock skew, restarts, hints, read
# repair, anti-entropy) FAULT_COUNT times each with the race detector, shuffled; a
# history that fails is saved and its path logged. make test runs them once.
FAULT_COUNT ?= 20
test-faults:
	$(GO) test -race -count=$(FAULT_COUNT) -shuffle=on -timeout 60m \
		-run 'TestFault|TestReadRepair|TestHint|TestRebuild|TestAntiEntropy|TestRestartLoop|TestClockSurvivesRestart|TestProcessCluster' ./internal/e2e

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -version >/dev/null 2>&1; then \
		$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...; \
	else echo "staticcheck not available from the module proxy; skipped"; fi

# Fuzz the request parser, then the whole handler, for FUZZTIME each (default 30s).
# make test runs their seed corpora only.
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./internal/httpapi -run '^$$' -fuzz FuzzParseEntity -fuzztime $(FUZZTIME)
	$(GO) test ./internal/httpapi -run '^$$' -fuzz FuzzHandler -fuzztime $(FUZZTIME)

# One node, data in ./data/node1.
run: build
	@mkdir -p data
	exec $(BIN)/dhtkv --listen 127.0.0.1:8080 --admin-listen 127.0.0.1:6060 --data-dir ./data/node1

# Three nodes on 127.0.0.1:8080-8082 (admin 6060-6062), data in ./data/node{1,2,3},
# logs in ./data/node{1,2,3}.log. Ctrl-C stops all three; so does `make stop-cluster`.
CLUSTER := http://127.0.0.1:8080,http://127.0.0.1:8081,http://127.0.0.1:8082
run-cluster: build
	@mkdir -p data
	@pids=(); \
	stop() { trap - INT TERM EXIT; echo; echo "stopping cluster"; kill -TERM "$${pids[@]}" 2>/dev/null; wait; rm -f data/node*.pid; }; \
	trap stop INT TERM EXIT; \
	for i in 1 2 3; do \
		port=$$((8079 + i)); admin=$$((6059 + i)); \
		$(BIN)/dhtkv --listen 127.0.0.1:$$port --admin-listen 127.0.0.1:$$admin \
			--data-dir ./data/node$$i --cluster $(CLUSTER) >> data/node$$i.log 2>&1 & \
		pids+=($$!); echo $$! > data/node$$i.pid; \
	done; \
	for port in 8080 8081 8082; do \
		for t in $$(seq 50); do curl -sf -o /dev/null http://127.0.0.1:$$port/v0/status && break; sleep 0.1; done; \
	done; \
	echo "dhtkv cluster running:"; \
	for i in 1 2 3; do echo "  node$$i  http://127.0.0.1:$$((8079 + i))  admin http://127.0.0.1:$$((6059 + i))/metrics  log data/node$$i.log"; done; \
	echo; \
	echo "try:  curl -X PUT --data-binary hello 'http://127.0.0.1:8080/v0/entity?id=greeting'"; \
	echo "      curl 'http://127.0.0.1:8081/v0/entity?id=greeting&ack=2&from=3'"; \
	echo "Ctrl-C (or make stop-cluster) stops all three."; \
	wait -n "$${pids[@]}"; echo "a node exited (make stop-cluster, or see data/node*.log)"

stop-cluster:
	@for f in data/node*.pid; do [ -f "$$f" ] && kill -TERM $$(cat $$f) 2>/dev/null; rm -f "$$f"; done; echo "stopped"

clean:
	rm -rf $(BIN)

# Benchmarks (cmd/dhtkv-bench): make bench (full, < 30 min on 2 cores) and
# make bench-quick (< 3 min) write docs/reports/. Each run measures the
# in-memory baseline server (bin/dhtkv-baseline) too, and quotes dhtkv's
# figures as a ratio to it. Extra driver flags go in BENCH_FLAGS, e.g.
# make bench BENCH_FLAGS='--only node-get,ceiling-get --keep';
# go run ./cmd/dhtkv-bench -h lists them. make bench-wrk cross-checks the
# baseline's figure with wrk (installs wrk if missing).
BENCH_OUT   ?= docs/reports
BENCH_FLAGS ?=

.PHONY: bench bench-quick bench-driver bench-wrk bench-ensure-wrk

# The driver is built rather than `go run` so that Ctrl-C reaches it
# directly and it can stop the servers it started.
bench-driver:
	$(GO) build -o $(BIN)/dhtkv-bench ./cmd/dhtkv-bench

bench: build bench-driver
	./$(BIN)/dhtkv-bench --out $(BENCH_OUT) --bin $(BIN) --baseline $(BIN)/dhtkv-baseline $(BENCH_FLAGS)

bench-quick: build bench-driver
	./$(BIN)/dhtkv-bench --quick --out $(BENCH_OUT) --bin $(BIN) --baseline $(BIN)/dhtkv-baseline $(BENCH_FLAGS)

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
