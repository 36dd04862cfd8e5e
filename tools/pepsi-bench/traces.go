package main

import (
	"fmt"
	"os"
	"regexp"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/otlpreceiver"
)

// startCollector starts what the traced configurations export to: "live", an
// OTLP/HTTP receiver that counts the spans of every request (walking its
// protobuf wire format, otlpreceiver.Counting); "dead",
// a listener that takes each connection and never reads nor answers. It
// returns the dispatcher's OpenTelemetry environment (every pass sampled, the
// exporter's own timeout an hour, so that nothing but the queues' bounds
// stands between a dead collector and the dispatcher), what it got so far,
// and how to stop it.
func startCollector(kind string) (env []string, got func() string, stop func(), err error) {
	env = []string{"OTEL_TRACES_SAMPLER=always_on", "OTEL_EXPORTER_OTLP_TIMEOUT=3600000"}
	if kind == "live" {
		r := otlpreceiver.Counting()
		return append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+r.URL()),
			func() string { return fmt.Sprintf("the receiver got %d spans", r.Count()) }, r.Close, nil
	}
	url, stop, err := otlpreceiver.Silent()
	if err != nil {
		return nil, nil, nil, err
	}
	return append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+url),
		func() string { return "the collector answered nothing" }, stop, nil
}

// droppedLine is the dispatcher's line at exit that counts its dropped spans.
var droppedLine = regexp.MustCompile(`traces: spans dropped.*dropped=(\d+)`)

// droppedSpans says how many spans the dispatcher whose log is file dropped.
func droppedSpans(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return "its log: " + err.Error()
	}
	if m := droppedLine.FindSubmatch(b); m != nil {
		return "pepsi-dispatch dropped " + string(m[1]) + " spans"
	}
	return "pepsi-dispatch dropped no span"
}
