# PEPSI. `make demo` runs the demo pipeline; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
export PEPSI_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
BIN := $(CURDIR)/bin

.PHONY: all build install man test vet lint purity bench-core python promtool bench bench-peers bench-backlog bench-split bench-ingress river-bench demo sim-long mutants chaos clean postgres postgres-demo chromium soak soak-private test-orderkey

all: build

# -version names the commit even where the toolchain records none (GOFLAGS=-buildvcs=false).
LDFLAGS := -X github.com/pepsi-pipeline/pepsi/internal/buildinfo.commit=$(shell git describe --always --dirty 2>/dev/null)

# cmd/ holds the programs an operator installs; tools/pepsi-* the development
# programs (demo, bench, chaos, soak, simulator replay); examples/pepsi-example
# the Go example stage the demo and the bench run. tools/man is run, not built
# (make man), since bin/man is its output folder.
build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/... ./tools/pepsi-... ./examples/pepsi-example

# The programs an operator installs (make install), and where.
PROGRAMS := pepsi-dispatch pepsi-queue pepsi-httpd pepsi-ingress pepsi-stage-check
PREFIX ?= /usr/local
DESTDIR ?=

# The manual pages of docs/ (NAME.N.md) rendered for man(1) into bin/man/manN/.
man:
	$(GO) run ./tools/man -docs docs -out $(BIN)/man

# The programs into $(DESTDIR)$(PREFIX)/bin and their manual pages into
# $(DESTDIR)$(PREFIX)/share/man, where man finds them: man pepsi-dispatch.
install: build man
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(addprefix $(BIN)/,$(PROGRAMS)) $(DESTDIR)$(PREFIX)/bin/
	for d in $(BIN)/man/man*; do install -d $(DESTDIR)$(PREFIX)/share/man/$$(basename $$d) && install -m 0644 $$d/* $(DESTDIR)$(PREFIX)/share/man/$$(basename $$d)/; done

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

# The import rules of README.md ("Layout: where things live"), enforced by
# golangci-lint's depguard (.golangci.yml); .ci/lint installs the pinned
# golangci-lint once.
lint:
	@.ci/lint

# The core must stay pure: no I/O, no clock, no goroutines (see core/purity_test.go).
purity:
	$(GO) test -run 'TestCoreIsPure' ./core/

# A benchmark is a test of the code it measures: make test runs the core's
# benchmarks a fixed 20,000 hops each (past the first recycling of every
# worker), so a world that stalls the core fails CI, not make bench.
bench-core:
	$(GO) test -run '^$$' -bench . -benchtime=20000x ./core/...

# Start (or install) the local PostgreSQL when nothing answers: .ci/postgres-up,
# for the server PEPSI_TEST_DATABASE_URL names (tests, bench, soak) or, for the
# demo, the one PEPSI_DATABASE names; a server elsewhere is never replaced by one
# on 127.0.0.1:5432.
postgres:
	@.ci/postgres-up PEPSI_TEST_DATABASE_URL

postgres-demo:
	@.ci/postgres-up PEPSI_DATABASE

# Install Debian's chromium-headless-shell when no chromium is there, for
# pepsi-httpd's browser test.
chromium:
	@.ci/chromium-up

# Install Debian's python3 when it is missing, for the example Python stage's test.
python:
	@.ci/python-up

# Install Debian's prometheus package (for its promtool) when promtool is
# missing, for the test of the example alerting rules.
promtool:
	@.ci/promtool-up

# Files tests keep (t.ArtifactDir: the status page's screenshot) go to
# test-artifacts/_artifacts/, ignored by git.
test: postgres python chromium promtool vet lint purity bench-core
	@mkdir -p $(CURDIR)/test-artifacts
	$(GO) test -race -count=1 -timeout 20m -artifacts -outputdir $(CURDIR)/test-artifacts ./...

# The stage modes pepsi-bench measures: write (the stage library writes each
# transition, stage.WriteTransitions), library (the stage library answers
# "0 >NEXT", the dispatcher writes it) and answer (a stage with no database
# connection answers "0 >NEXT"), message (INPUT = message stages that parse
# each message and answer a patch computed from it), python (the same with the
# example's Python stage), relay1ms and relay10ms (message mode behind a TCP
# relay adding 1 or 10 ms per round trip). All but write need the "0 >TARGET"
# protocol: against a dispatcher without it pepsi-bench says so, measures the
# rest and exits 1. BENCH_MODES=write measures write mode alone; BACKLOG_MODES
# are bench-backlog's (no relay); BENCH_FLAGS passes more flags (bin/pepsi-bench -h).
BENCH_MODES ?= write,library,answer,message,python,relay1ms,relay10ms
BACKLOG_MODES ?= write,library,answer,message
BENCH_FLAGS ?=

# The core's micro-benchmarks, then pepsi-bench: pgbench's commit rate, the
# pipeline's hops/s in each mode at the bench configuration and at pepsi.conf's
# defaults, River's jobs/s, median of 3 rounds, one table; then the latency at
# 100 messages/s (docs/performance.md).
bench: postgres python build river-bench
	$(GO) test -run '^$$' -bench . -benchmem ./core/
	$(BIN)/pepsi-bench -river $(BIN)/river-bench -modes $(BENCH_MODES) $(BENCH_FLAGS)

# PEPSI beside its peer only: pgbench, the pipeline at the bench configuration,
# River draining as many no-op jobs as the pipeline makes hops, 3 rounds.
bench-peers: postgres python build river-bench
	$(BIN)/pepsi-bench -river $(BIN)/river-bench -modes $(BENCH_MODES) -configs bench -latency-seconds 0 $(BENCH_FLAGS)

# On demand, not in CI (tens of minutes): drain 1,000,000 messages per mode;
# hops/s over the first and the last tenth, the queue's sizes before and after.
bench-backlog: postgres build
	$(BIN)/pepsi-bench -backlog -modes $(BACKLOG_MODES) $(BENCH_FLAGS)

# The split (issue 32's figure): a stage that emits 10 messages per message,
# its children through one more stage, beside pgbench's single-row INSERTs into
# pepsi.queue; each round at SESSIONS = 2 and at SESSIONS = 1 (docs/performance.md,
# "Sessions beside the first").
bench-split: postgres build
	$(BIN)/pepsi-bench -split 20000 -rounds 5 -parallelism 4 -queue-limit 128 -sessions 2 -split-single $(BENCH_FLAGS)

# pepsi-ingress: single-message requests from 64 keep-alive clients beside
# pgbench's single-row INSERTs into pepsi.queue, NDJSON requests of 1,000
# beside pepsi-queue enqueue, and accepted over HTTP -> done (docs/performance.md).
bench-ingress: postgres build
	$(BIN)/pepsi-bench -ingress $(BENCH_FLAGS)

# River's side of the comparison, from its own module (bench/river/go.mod), so
# that PEPSI's module does not depend on River.
river-bench:
	@mkdir -p $(BIN)
	cd bench/river && $(GO) build -o $(BIN)/river-bench .

demo: postgres-demo build
	PATH=$(BIN):$$PATH $(BIN)/pepsi-demo

# On demand, not in CI (minutes): the outside check of ordering per key
# (shell/dispatch, TestOrderPerKeyFromOutside) with a hot key's backlog of
# 20,000 messages; make test runs it with 1,500.
ORDER_HOT ?= 20000
test-orderkey: postgres python
	PEPSI_TEST_ORDER_HOT=$(ORDER_HOT) $(GO) test -count=1 -timeout 60m -v -run '^TestOrderPerKeyFromOutside$$' ./shell/dispatch/

# The simulator's long campaign: the real core against the fake world under
# faults, 100000 seeds (go test ./sim runs a fixed budget). A failure prints its
# seed and the pepsi-sim command that replays it.
sim-long:
	$(GO) run ./tools/pepsi-sim -runs 100000 -workers 2

# Plant deliberate bugs in the core (sim/mutants) and check that the simulator
# kills every one of them.
mutants:
	$(GO) run ./sim/mutants

# A pipeline at 70% of this machine's capacity for 30 minutes, workers recycling
# every 50 messages, on the server as it is; soak-private: the same on a
# PostgreSQL of its own with autovacuum on at its defaults (docs/operations.md).
soak: postgres build
	$(BIN)/pepsi-soak

soak-private: build
	$(BIN)/pepsi-soak -private

# The long chaos run: five samples of each fault (worker SIGKILL, dispatcher
# SIGKILL with a standby, PostgreSQL crash restart) and two 30 s black holes,
# against a real pipeline on a private PostgreSQL; prints the recovery-time
# table and its seed (-seed N replays the sequence; the seed draws SESSIONS,
# 1 to 3); then the kill storm, at SESSIONS = 1 and at 2: a minute at 600
# messages/s, and a minute more with the active dispatcher's sessions ended
# twice a second, claim latencies side by side (docs/durability.md, "A lost
# session"), and once more with the lock's session ended too (every kill a
# takeover, whose reruns are counted, not failed). go test ./tools/pepsi-chaos
# runs a short one of the first two in make test.
chaos: build
	$(BIN)/pepsi-chaos -samples 5
	$(BIN)/pepsi-chaos -storm 60s -rate 600 -sessions 1
	$(BIN)/pepsi-chaos -storm 60s -rate 600 -sessions 2
	$(BIN)/pepsi-chaos -storm 60s -rate 600 -sessions 2 -kill-lock

clean:
	rm -rf $(BIN) $(CURDIR)/test-artifacts
