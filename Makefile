# PEPSI. `make demo` runs the demo pipeline; `make test` runs every test.
SHELL := /bin/bash
GO ?= go
export PEPSI_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable
BIN := $(CURDIR)/bin

.PHONY: all build test vet purity bench demo sim-long mutants clean postgres chromium soak soak-private

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

# The core must stay pure: no I/O, no clock, no goroutines (see core/purity_test.go).
purity:
	$(GO) test -run 'TestCoreIsPure' ./core/

# Start (or install) the local PostgreSQL when nothing answers: .ci/postgres-up.
postgres:
	@.ci/postgres-up

# Install Debian's chromium when it is missing, for pepsi-httpd's browser test.
chromium:
	@.ci/chromium-up

# Files tests keep (t.ArtifactDir: the status page's screenshot) go to
# test-artifacts/_artifacts/, ignored by git.
test: postgres chromium vet purity
	@mkdir -p $(CURDIR)/test-artifacts
	$(GO) test -race -count=1 -timeout 20m -artifacts -outputdir $(CURDIR)/test-artifacts ./...

# The core's micro-benchmarks, then pepsi-bench: pgbench's commit rate and the
# pipeline's hops/s side by side (docs/performance.md).
bench: postgres build
	$(GO) test -run '^$$' -bench . -benchmem ./core/
	$(BIN)/pepsi-bench

demo: postgres build
	PATH=$(BIN):$$PATH $(BIN)/pepsi-demo

# The simulator's long campaign: the real core against the fake world under
# faults, 100000 seeds (go test ./sim runs a fixed budget). A failure prints its
# seed and the pepsi-sim command that replays it.
sim-long:
	$(GO) run ./cmd/pepsi-sim -runs 100000 -workers 2

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

clean:
	rm -rf $(BIN) $(CURDIR)/test-artifacts
