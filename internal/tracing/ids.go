package tracing

import (
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
)

// randomIDs are a new trace id and span id from math/rand/v2's generator
// (ChaCha8, seeded from the operating system: unpredictable enough for ids
// that need only be unique), neither all zeros.
func randomIDs() (trace.TraceID, trace.SpanID) {
	var t trace.TraceID
	var s trace.SpanID
	for !t.IsValid() {
		binary.BigEndian.PutUint64(t[:8], rand.Uint64())
		binary.BigEndian.PutUint64(t[8:], rand.Uint64())
	}
	for !s.IsValid() {
		binary.BigEndian.PutUint64(s[:], rand.Uint64())
	}
	return t, s
}
