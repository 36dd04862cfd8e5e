package tracing

import (
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Proves: traces are on only when an OTLP endpoint is named, and not when
// the SDK or the traces exporter is switched off.
func TestTracesAreOnOnlyWithAnEndpoint(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		if got := Enabled(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("Enabled(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
	if n := queueSize(func(string) string { return "" }); n != 2048 {
		t.Errorf("queue size without OTEL_BSP_MAX_QUEUE_SIZE = %d, want the SDK's 2048", n)
	}
	if n := queueSize(func(string) string { return "16" }); n != 16 {
		t.Errorf("queue size with OTEL_BSP_MAX_QUEUE_SIZE=16 = %d", n)
	}
}

// Proves: a nil exporter (traces off) takes passes and requests and does
// nothing, so callers need no check of their own.
func TestANilExporterIsOff(t *testing.T) {
	var e *Exporter
	e.Pass(core.Pass{ID: 1, Stage: "a"})
	r := e.StartRequest("", "POST", "/v1/messages")
	if r.TraceParent() != "" || e.Dropped() != 0 || e.Failed() != 0 {
		t.Errorf("nil exporter: request %v, dropped %d, failed %d", r, e.Dropped(), e.Failed())
	}
	r.End(202, 1)
	e.Close()
}
