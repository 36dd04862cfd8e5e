package otlpreceiver

import (
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestCountingReceiverCountsEverySpanOfARequest holds the counting
// receiver's wire walk to the spans a decoder finds: several resources,
// several scopes each, spans with attributes and events around them.
func TestCountingReceiverCountsEverySpanOfARequest(t *testing.T) {
	ex := &coltracepb.ExportTraceServiceRequest{}
	want := 0
	for r := range 3 {
		rs := &tracepb.ResourceSpans{Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
			{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "svc"}}}}},
			SchemaUrl: "https://example.org/schema"}
		for s := range r + 2 {
			ss := &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: "scope"}}
			for i := range 5*s + r {
				ss.Spans = append(ss.Spans, &tracepb.Span{TraceId: make([]byte, 16), SpanId: make([]byte, 8), Name: "process x",
					StartTimeUnixNano: uint64(i), Attributes: []*commonpb.KeyValue{
						{Key: "pepsi.attempts", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(i)}}}},
					Events: []*tracepb.Span_Event{{Name: "pepsi.claimed"}}})
				want++
			}
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ex.ResourceSpans = append(ex.ResourceSpans, rs)
	}
	b, err := proto.Marshal(ex)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := countSpans(b); err != nil || got != want {
		t.Fatalf("countSpans = %d, %v; want %d spans", got, err, want)
	}
	if _, err := countSpans(b[:len(b)-3]); err == nil {
		t.Fatalf("countSpans of a truncated request: no error")
	}
}
