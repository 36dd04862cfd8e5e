package stage_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// Proves: in message mode a handler sees its pass's traceparent, the one
// its line carries, and none without.
func TestMessageModeHandlersSeeThePassTraceparent(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var seen []string
	handlers := map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
		seen = append(seen, m.TraceParent)
		return stage.Done()
	}}
	input := `{"id":1,"stage":"parse","attempts":0,"traceparent":"` + tp + `","state":{},"payload":"x"}
{"id":2,"stage":"parse","attempts":0,"state":{},"payload":"y"}
`
	got := runMessages(t, "parse", input, handlers)
	if len(got) != 2 || got[0] != "0 >done" || got[1] != "0 >done" {
		t.Errorf("answers %q; want two done", got)
	}
	if len(seen) != 2 || seen[0] != tp || seen[1] != "" {
		t.Errorf("handlers saw traceparents %q; want %s and none", seen, tp)
	}
}

// Proves: in id mode a handler sees its pass's traceparent, which the
// library reads with the row: the message's trace id and the span id the
// dispatcher's claim computed for this pass (pepsi.pass_traceparent of the
// row as the claim left it).
func TestIDModeHandlersSeeThePassTraceparent(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "a", "b")
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var want string
	if err := conn.QueryRow(t.Context(), `UPDATE pepsi.queue SET traceparent = $2 WHERE ingress_id = $1
		RETURNING pepsi.pass_traceparent(traceparent, ingress_id, stage, updated_at)`, ids[0], tp).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if want[:36] != tp[:36] || want[52:] != tp[52:] || want == tp {
		t.Fatalf("pass traceparent %s: want the trace id and flags of %s with a span of its own", want, tp)
	}
	var mu sync.Mutex
	seen := map[int64]string{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			mu.Lock()
			defer mu.Unlock()
			seen[m.ID] = m.TraceParent
			return stage.Done()
		}}})
	w.send(idLines(ids))
	for range ids {
		w.answer()
	}
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(seen[ids[0]], seen[ids[1]]); got != fmt.Sprint(want, "") {
		t.Errorf("handlers saw traceparents %q and %q; want %s and none", seen[ids[0]], seen[ids[1]], want)
	}
}

// Proves: the handler's context carries its pass's span context, remote, so
// an application's OpenTelemetry spans are children of the pass; a message
// with no traceparent has none.
func TestTheHandlersContextCarriesThePassSpanContext(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var seen []trace.SpanContext
	handlers := map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
		seen = append(seen, trace.SpanContextFromContext(ctx))
		return stage.Done()
	}}
	input := `{"id":1,"stage":"parse","attempts":0,"traceparent":"` + tp + `","state":{},"payload":"x"}
{"id":2,"stage":"parse","attempts":0,"state":{},"payload":"y"}
`
	runMessages(t, "parse", input, handlers)
	if len(seen) != 2 || !seen[0].IsRemote() || seen[0].TraceID().String() != tp[3:35] || seen[0].SpanID().String() != tp[36:52] || !seen[0].IsSampled() {
		t.Fatalf("handlers' span contexts %v; want the pass's %s, remote, then none", seen, tp)
	}
	if seen[1].IsValid() {
		t.Errorf("a message without a traceparent: span context %v, want none", seen[1])
	}
}
