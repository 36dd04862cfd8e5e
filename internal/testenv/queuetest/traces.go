// The conformance tests of traces (docs/protocol.md, "Traces"): the
// traceparent a producer gives, the one a message's first claim gives it
// when it has none, and the pass's own that a claim, a move that claims and
// the stage library's read report.

package queuetest

import (
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
	"github.com/pepsi-pipeline/pepsi/store"
)

// traceTests are the conformance tests of traces.
var traceTests = []conformanceTest{
	{"AClaimKeepsAProducersTraceparentAndGivesARowWithoutOneAFreshOne", testTraceClaim},
	{"EveryPassOfAMessageHasItsOwnSpanInTheMessagesTrace", testTracePasses},
	{"AClaimWithoutTracesReadsThePassTraceForMessageStagesOnly", testTraceMessageStagesOnly},
	{"ProducersRefuseATraceparentThatIsNotW3C", testTraceRefused},
	{"AnEmittedMessageIsAChildOfThePassThatEmittedIt", testTraceEmitted},
}

// producerTrace is a traceparent a producer gives (W3C Trace Context's example).
const producerTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func claimTraced(t *testing.T, h Harness, caps ...core.Cap) []core.Row {
	t.Helper()
	return exec(t, h, core.Claim{Op: 42, Caps: caps, Traces: true}, func(e core.Claimed) (int64, string) { return e.Op, e.Err }).Rows
}

// wantPassOf fails the test unless pass is a valid traceparent of the trace
// of message with a span id of its own, and its flags.
func wantPassOf(t *testing.T, what, message, pass string) {
	t.Helper()
	if err := msgjson.CheckTraceParent(pass); err != nil {
		t.Fatalf("%s: pass trace: %v", what, err)
	}
	if pass[3:35] != message[3:35] || pass[53:] != message[53:] {
		t.Errorf("%s: pass trace %s, want the trace id and flags of %s", what, pass, message)
	}
	if pass[36:52] == message[36:52] && message == producerTrace {
		t.Errorf("%s: pass trace %s has its parent's span id", what, pass)
	}
}

func shownTrace(t *testing.T, h Harness, id int64) string {
	t.Helper()
	m, err := h.Show(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return m.TraceParent
}

func testTraceClaim(t *testing.T, h Harness) {
	ids := insertIngress(t, h, store.IngressRow{Stage: "a", TraceParent: producerTrace}, store.IngressRow{Stage: "a"})
	if got := shownTrace(t, h, ids[1]); got != "" {
		t.Fatalf("row %d has traceparent %q before its first claim, want none", ids[1], got)
	}
	rows := claimTraced(t, h, core.Cap{Stage: "a", N: 2})
	if len(rows) != 2 {
		t.Fatalf("claim took %v, want rows %v", rows, ids)
	}
	if got := rows[0].Trace.Message; got != producerTrace {
		t.Errorf("claim read row %d's traceparent %q, want the producer's %s", ids[0], got, producerTrace)
	}
	wantPassOf(t, "producer's", producerTrace, rows[0].Trace.Pass)
	fresh := rows[1].Trace.Message
	if err := msgjson.CheckTraceParent(fresh); err != nil {
		t.Fatalf("the claim gave row %d %v", ids[1], err)
	}
	if fresh[53:] != "01" {
		t.Errorf("fresh traceparent %s is not sampled (flags 01)", fresh)
	}
	// The first pass is its fresh trace's root: the message's span is its own.
	if rows[1].Trace.Pass != fresh {
		t.Errorf("first pass of row %d: pass trace %s, want the fresh traceparent %s (its root)", ids[1], rows[1].Trace.Pass, fresh)
	}
	if fresh[3:35] == producerTrace[3:35] {
		t.Errorf("fresh traceparent %s shares the other message's trace", fresh)
	}
	for i, want := range []string{producerTrace, fresh} {
		if got := shownTrace(t, h, ids[i]); got != want {
			t.Errorf("Show(%d) traceparent %q, want %q", ids[i], got, want)
		}
	}
}

func testTracePasses(t *testing.T, h Harness) {
	id := h.Insert(t, "a", 1)[0]
	first := claimTraced(t, h, core.Cap{Stage: "a", N: 1})[0].Trace
	read := stageRead(t, h, id)[id]
	if read.TraceParent != first.Pass {
		t.Errorf("StageRead of row %d: trace %q, want its claim's pass trace %q", id, read.TraceParent, first.Pass)
	}
	// A move that claims: the next pass, its own span.
	mv := move(id, "a", "b")
	mv.Claim = true
	o := exec(t, h, core.Resolve{Op: 42, Items: []core.Item{mv}, Traces: true}, func(e core.Resolved) (int64, string) { return e.Op, e.Err }).Outcomes[0]
	if o.Trace.Message != first.Message {
		t.Errorf("move that claims read traceparent %q, want the message's %q", o.Trace.Message, first.Message)
	}
	wantPassOf(t, "move that claims", first.Message, o.Trace.Pass)
	if o.Trace.Pass == first.Pass {
		t.Errorf("second pass has the first pass's span: %s", o.Trace.Pass)
	}
	if got := stageRead(t, h, id)[id].TraceParent; got != o.Trace.Pass {
		t.Errorf("StageRead of row %d at b: trace %q, want the move's pass trace %q", id, got, o.Trace.Pass)
	}
	// Requeued and claimed again: a third pass, a third span.
	resolve(t, h, core.Item{ID: id, Stage: "b", Verdict: core.Requeue})
	third := claimTraced(t, h, core.Cap{Stage: "b", N: 1})[0].Trace
	wantPassOf(t, "claim again", first.Message, third.Pass)
	if third.Message != first.Message || third.Pass == o.Trace.Pass || third.Pass == first.Pass {
		t.Errorf("third pass: %+v; want the message's trace %s and a span of its own (not %s nor %s)", third, first.Message, first.Pass, o.Trace.Pass)
	}
}

func testTraceMessageStagesOnly(t *testing.T, h Harness) {
	ids := insertIngress(t, h, store.IngressRow{Stage: "a", TraceParent: producerTrace}, store.IngressRow{Stage: "m", TraceParent: producerTrace})
	rows := claimRows(t, h, core.Cap{Stage: "a", N: 1}, core.Cap{Stage: "m", N: 1, LineMax: 1024})
	if len(rows) != 2 || rows[0].ID != ids[0] || rows[1].ID != ids[1] {
		t.Fatalf("claim took %v, want rows %v", rows, ids)
	}
	if rows[0].Trace != (core.Trace{}) {
		t.Errorf("claim without Traces read %+v for an INPUT = id stage, want nothing", rows[0].Trace)
	}
	if rows[1].Trace.Message != "" {
		t.Errorf("claim without Traces read the message's traceparent %q, want only the pass's", rows[1].Trace.Message)
	}
	wantPassOf(t, "message stage", producerTrace, rows[1].Trace.Pass)
}

func testTraceRefused(t *testing.T, h Harness) {
	for _, bad := range []string{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "nonsense"} {
		if _, err := h.InsertIngress(t.Context(), []store.IngressRow{{Stage: "a"}, {Stage: "a", TraceParent: bad}}); err == nil {
			t.Errorf("InsertIngress of traceparent %q succeeded, want an error", bad)
		}
		if _, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "a", Payloads: make([][]byte, 1), States: make([]string, 1), TraceParents: []string{bad}}); err == nil {
			t.Errorf("Enqueue of traceparent %q succeeded, want an error", bad)
		}
	}
	if n, err := h.CountSelected(t.Context(), store.Selection{Stage: "a"}); err != nil || n != 0 {
		t.Fatalf("rows at a = %d, %v; want none: a refused insert inserts nothing", n, err)
	}
	if r, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "a", Payloads: make([][]byte, 2), States: make([]string, 2), TraceParents: []string{producerTrace, ""}}); err != nil || r.Count != 2 {
		t.Fatalf("Enqueue with a traceparent and without = %+v, %v", r, err)
	}
	ids := listIDs(t, h, store.Selection{Stage: "a"}, 0, 10)
	if got := shownTrace(t, h, ids[0]); got != producerTrace {
		t.Errorf("Enqueue stored traceparent %q, want %s", got, producerTrace)
	}
	if got := shownTrace(t, h, ids[1]); got != "" {
		t.Errorf("Enqueue stored traceparent %q for a message without one, want none", got)
	}
}

func testTraceEmitted(t *testing.T, h Harness) {
	ids := insertIngress(t, h, store.IngressRow{Stage: "a", TraceParent: producerTrace}, store.IngressRow{Stage: "a"})
	rows := claimTraced(t, h, core.Cap{Stage: "a", N: 2})
	if len(rows) != 2 {
		t.Fatalf("claim took %v, want rows %v", rows, ids)
	}
	// The first answer's move claims its next stage: a new pass, whose span
	// the children must not take (the resolve rewrites the row the emitting
	// pass's span is computed from).
	claiming := moveEmitting(ids[0], "a", "b", core.Emit{Stage: "c", Payload: []byte("1")}, core.Emit{Stage: "c", Payload: []byte("2")})
	claiming.Claim = true
	out := exec(t, h, core.Resolve{Op: 42, Items: []core.Item{claiming, moveEmitting(ids[1], "a", core.TargetDone, core.Emit{Stage: "c"})}, Traces: true},
		func(e core.Resolved) (int64, string) { return e.Op, e.Err }).Outcomes
	if out[0].Status != core.StatusRunning || out[0].Trace.Pass == "" || out[0].Trace.Pass == rows[0].Trace.Pass {
		t.Fatalf("the move that claims = %+v; want it running at b in a pass of its own", out[0])
	}
	for i, id := range ids {
		kids := childrenAfter(t, h, id, ids[1], 4)
		if len(kids) != 2-i {
			t.Fatalf("children of %d: %d, want %d", id, len(kids), 2-i)
		}
		for _, k := range kids {
			if k.TraceParent != rows[i].Trace.Pass {
				t.Errorf("child %d of %d has traceparent %q, want its emitting pass's %q (parent's message trace %q)", k.ID, id, k.TraceParent, rows[i].Trace.Pass, rows[i].Trace.Message)
			}
		}
	}
	// A child's own passes are spans of the parent's trace, children of the
	// emitting pass.
	kids := claimTraced(t, h, core.Cap{Stage: "c", N: 3})
	if len(kids) != 3 {
		t.Fatalf("claim at c took %v, want the three children", kids)
	}
	if kids[0].Trace.Message != rows[0].Trace.Pass {
		t.Errorf("claim of child %d read traceparent %q, want %q", kids[0].ID, kids[0].Trace.Message, rows[0].Trace.Pass)
	}
	wantPassOf(t, "child's first pass", rows[0].Trace.Pass, kids[0].Trace.Pass)
	if kids[0].Trace.Pass == kids[1].Trace.Pass {
		t.Errorf("two children's passes share the span %s", kids[0].Trace.Pass)
	}
}
