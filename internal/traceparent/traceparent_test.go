package traceparent_test

import (
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/traceparent"
)

// Proves: a valid traceparent becomes a remote span context and back, the
// same text; anything msgjson.CheckTraceParent refuses is not valid here
// either.
func TestATraceparentIsASpanContextAndBack(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc, ok := traceparent.SpanContext(tp)
	if !ok || !sc.IsRemote() || !sc.IsSampled() || sc.TraceID().String() != tp[3:35] || sc.SpanID().String() != tp[36:52] {
		t.Fatalf("SpanContext(%s) = %v, %v", tp, sc, ok)
	}
	if got := traceparent.Format(sc); got != tp {
		t.Errorf("Format = %s, want %s", got, tp)
	}
	for _, bad := range []string{"", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0G", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-"} {
		if _, ok := traceparent.SpanContext(bad); ok {
			t.Errorf("SpanContext(%q) is valid, want not", bad)
		}
	}
}
