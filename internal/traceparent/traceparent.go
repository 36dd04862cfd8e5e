// Package traceparent turns a W3C traceparent, as PEPSI's queue and lines
// carry it (docs/protocol.md, "Traces"), into OpenTelemetry's span context
// and back. It uses only OpenTelemetry's API (go.opentelemetry.io/otel/trace),
// never its SDK, so the stage library may use it without pulling an exporter
// into every stage program; it does no I/O.
package traceparent

import (
	"encoding/hex"

	"go.opentelemetry.io/otel/trace"
)

// SpanContext is the remote span context tp names, and false when tp is not
// a valid version 00 traceparent (msgjson.CheckTraceParent's rule).
func SpanContext(tp string) (trace.SpanContext, bool) {
	if !Wellformed(tp) {
		return trace.SpanContext{}, false
	}
	tid, err := trace.TraceIDFromHex(tp[3:35])
	if err != nil {
		return trace.SpanContext{}, false
	}
	sid, err := trace.SpanIDFromHex(tp[36:52])
	if err != nil {
		return trace.SpanContext{}, false
	}
	var flags [1]byte
	if _, err := hex.Decode(flags[:], []byte(tp[53:])); err != nil || !lowerHex(tp[53:]) {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]), Remote: true})
	return sc, sc.IsValid()
}

// Format is sc as a version 00 traceparent; "" when sc is not valid.
func Format(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	tid, sid := sc.TraceID(), sc.SpanID()
	b := make([]byte, 0, 55)
	b = append(b, "00-"...)
	b = hex.AppendEncode(b, tid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, sid[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, []byte{byte(sc.TraceFlags())})
	return string(b)
}

// Wellformed says whether tp is what the queue's check on inserts
// (pepsi.traceparent_ok) lets in: 55 bytes, "00-", then 32, 16 and 2
// lower-case hex digits between dashes. Since schema 27 the database checks
// only the traceparents inserted; one an UPDATE wrote is checked here, where
// PEPSI reads it, and one that is not well-formed counts as none.
func Wellformed(tp string) bool {
	return len(tp) == 55 && tp[:3] == "00-" && tp[35] == '-' && tp[52] == '-' &&
		lowerHex(tp[3:35]) && lowerHex(tp[36:52]) && lowerHex(tp[53:])
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
