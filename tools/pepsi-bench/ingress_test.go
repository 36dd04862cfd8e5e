package main

import (
	"regexp"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
)

// TestIngressFiguresAreMeasuredSideBySide runs -ingress small: pgbench and
// single-message requests, pepsi-queue enqueue and NDJSON requests (the rows
// of each checked: every 202 committed), then the accepted → done latency
// through the real dispatcher.
func TestIngressFiguresAreMeasuredSideBySide(t *testing.T) {
	t.Parallel()
	bin := buildBench(t)
	if err := gobuild.Into(bin, "cmd/pepsi-ingress", "cmd/pepsi-queue"); err != nil {
		t.Fatal(err)
	}
	out, code := runBench(t, bin, "-ingress", "-rounds", "1", "-seconds", "1", "-clients", "2", "-ingress-clients", "4",
		"-ingress-batch", "100", "-ingress-total", "1000", "-latency-rate", "50", "-latency-seconds", "1")
	if code != 0 {
		t.Fatalf("pepsi-bench -ingress exited %d, want 0; output:\n%s", code, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^round 1 \(load average [0-9.]+\): pgbench [0-9]+ tps; single-message requests [0-9]+ msg/s \(request p50 [0-9.]+ ms, p99 [0-9.]+ ms\) = [0-9.]+× pgbench, ` +
			`CPU per request: load generator [0-9.]+ µs, pepsi-ingress [0-9.]+ µs, its PostgreSQL sessions ([0-9.]+ µs|\?), machine busy [0-9]+%, [0-9.]+ requests per transaction, commit [0-9.]+ ms; pepsi-queue enqueue [0-9]+ msg/s; NDJSON requests [0-9]+ msg/s = [0-9.]+× pepsi-queue`),
		regexp.MustCompile(`(?m)^  pepsi-ingress, 4 clients, one message per request +[0-9]+ msg/s  ratio [0-9.]+×  p50 [0-9.]+ ms  p99 [0-9.]+ ms$`),
		// Both CPU figures are measured: neither can be zero for requests served.
		regexp.MustCompile(`(?m)^    CPU per request: load generator [0-9]*[1-9][0-9]*\.[0-9] µs, pepsi-ingress [0-9]*[1-9][0-9]*\.[0-9] µs$`),
		regexp.MustCompile(`(?m)^  accepted over HTTP → done, .*: 50 messages at [0-9]+/s .* p50 [0-9.]+ ms, p99 [0-9.]+ ms`),
	} {
		if !want.MatchString(out) {
			t.Errorf("pepsi-bench -ingress output has no line matching %q; output:\n%s", want, out)
		}
	}
}
