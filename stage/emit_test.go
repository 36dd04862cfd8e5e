package stage_test

import (
	"context"

	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// emitByPayload is a handler whose payload names what it does: it emits two
// messages to "row", then returns the Result the payload names.
func emitByPayload(ctx context.Context, m *stage.Message) stage.Result {
	for i := range 2 {
		if err := m.Emit(stage.Emit{Stage: "row", Payload: []byte(fmt.Sprintf("%d/%d", m.ID, i))}); err != nil {
			return stage.Error(err.Error())
		}
	}
	switch string(m.Payload) {
	case "advance":
		return stage.Advance("next")
	case "pause":
		return stage.PauseFor(0)
	case "failed":
		return stage.Failed("bad row")
	case "error":
		return stage.Error("broken")
	case "retry":
		return stage.Retry("later")
	case "tx":
		if _, err := m.Tx.Exec(ctx, "SELECT 1"); err != nil {
			return stage.Error(err.Error())
		}
	case "delete":
		delete(m.State, "k")
	case "fuse":
		return stage.Advance("tag")
	}
	return stage.Done()
}

// Proves: the emit lines a handler's Emit makes are compact JSON objects with
// pepsi-ingress's fields, which the dispatcher's own reader reads back as the
// message emitted: a UTF-8 payload as text, other bytes as payload_base64, the
// state, key and order key; an empty payload is "". They go before the status
// line, in the order emitted.
func TestEmitLinesCarryTheEmittedMessagesFields(t *testing.T) {
	emits := []stage.Emit{
		{Stage: "row", Payload: []byte(`a,"b"`)},
		{Stage: "row", Payload: []byte{0xff, 0, 'x'}},
		{Stage: "deliver", Payload: []byte("to: a@example.org"), State: map[string]any{"n": 1, "to": "a<b>"}, Key: "k1", OrderKey: "acct-7"},
		{Stage: "row"},
	}
	handlers := map[string]stage.Handler{"split": func(_ context.Context, m *stage.Message) stage.Result {
		for _, e := range emits {
			if err := m.Emit(e); err != nil {
				return stage.Error(err.Error())
			}
		}
		return stage.Done()
	}}
	got := runMessages(t, "split", `{"id":1,"stage":"split","attempts":0,"state":{},"payload":"x"}`+"\n", handlers)
	want := []string{
		`+{"stage":"row","payload":"a,\"b\""}`,
		`+{"stage":"row","payload_base64":"/wB4"}`,
		`+{"stage":"deliver","payload":"to: a@example.org","state":{"n":1,"to":"a<b>"},"key":"k1","order_key":"acct-7"}`,
		`+{"stage":"row","payload":""}`,
		`0 >done`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("output\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i, e := range emits {
		ce, err := core.ParseEmit(got[i])
		if err != nil {
			t.Fatalf("the dispatcher refuses emit line %q: %v", got[i], err)
		}
		if ce.Stage != e.Stage || string(ce.Payload) != string(e.Payload) || ce.Key != e.Key || ce.OrderKey != e.OrderKey {
			t.Errorf("emit line %q reads back as %v, want %+v", got[i], ce, e)
		}
	}
}

// Proves: emits ride only an answered transition, in message mode: Advance,
// Done and Pause carry them (the lines come first), Failed, Error and Retry
// write none (a failed pass has no children, and the dispatcher counts nothing
// as dropped), and what the library would have to write itself (a deleted
// key) fails the message instead of losing its children; a fused stage's
// emits add to its pass's.
func TestMessageModeWritesEmitsOnlyBeforeAnAnsweredTransition(t *testing.T) {
	handlers := map[string]stage.Handler{"split": emitByPayload,
		"tag": func(_ context.Context, m *stage.Message) stage.Result {
			if err := m.Emit(stage.Emit{Stage: "tagged", Payload: []byte("t")}); err != nil {
				return stage.Error(err.Error())
			}
			return stage.Advance("next")
		}}
	var input strings.Builder
	cases := []struct{ payload, want string }{
		{"advance", `^\+1/0 \+1/1 0 >next$`},
		{"done", `^\+2/0 \+2/1 0 >done$`},
		{"pause", `^\+3/0 \+3/1 0 >paused:0$`},
		{"failed", `^1 bad row$`},
		{"error", `^1 broken$`},
		{"retry", `^75 later$`},
		{"delete", `^1 the handler deleted a state key`},
		{"fuse", `^\+8/0 \+8/1 \+tagged 0 >next tag:\d+$`},
	}
	for i, c := range cases {
		fmt.Fprintf(&input, `{"id":%d,"stage":"split","attempts":0,"state":{"k":1},"payload":%q}`+"\n", i+1, c.payload)
	}
	got := answersWithEmits(runMessages(t, "split", input.String(), handlers, "tag"))
	if len(got) != len(cases) {
		t.Fatalf("answers %q, want %d", got, len(cases))
	}
	for i, c := range cases {
		if !regexp.MustCompile(c.want).MatchString(got[i]) {
			t.Errorf("%s: output %q, want it to match %s", c.payload, got[i], c.want)
		}
	}
}

// answersWithEmits folds each status line's emit lines into it, each shown
// as "+PAYLOAD" (or "+STAGE" for another stage than row), so a test reads one
// string per message.
func answersWithEmits(lines []string) []string {
	var out []string
	var pending []string
	for _, l := range lines {
		if !core.IsEmitLine(l) {
			out = append(out, strings.Join(append(pending, l), " "))
			pending = nil
			continue
		}
		e, err := core.ParseEmit(l)
		switch {
		case err != nil:
			pending = append(pending, "+BAD("+l+")")
		case e.Stage == "row":
			pending = append(pending, "+"+string(e.Payload))
		default:
			pending = append(pending, "+"+e.Stage)
		}
	}
	return out
}

// Proves: an Emit the dispatcher would refuse is refused where the handler
// sees it, and fails the message even when the handler ignores the error and
// returns Done (a child is never lost in silence); a handler that returns
// Error itself keeps its reason. Nothing is emitted for such a message.
func TestEmitRefusesWhatTheDispatcherWouldAndTheMessageFails(t *testing.T) {
	bad := map[string]stage.Emit{
		"stage":  {Stage: "no such"},
		"done":   {Stage: "done"},
		"state":  {Stage: "row", State: map[string]any{"f": func() {}}},
		"nul":    {Stage: "row", State: map[string]any{"a": "x\x00"}},
		"key":    {Stage: "row", Key: strings.Repeat("k", core.EmitKeyMax+1)},
		"length": {Stage: "row", Payload: []byte(strings.Repeat("x", core.AnswerMax))},
	}
	var errs []string
	handlers := map[string]stage.Handler{"split": func(_ context.Context, m *stage.Message) stage.Result {
		if err := m.Emit(stage.Emit{Stage: "row", Payload: []byte("fine")}); err != nil {
			return stage.Error("the good emit: " + err.Error())
		}
		name, handled := strings.CutPrefix(string(m.Payload), "handled-")
		err := m.Emit(bad[name])
		if err == nil {
			return stage.Error("Emit accepted " + name)
		}
		errs = append(errs, err.Error())
		if handled {
			return stage.Error("cannot split: " + err.Error())
		}
		return stage.Done()
	}}
	names := []string{"stage", "done", "state", "nul", "key", "length", "handled-stage"}
	var input strings.Builder
	for i, n := range names {
		fmt.Fprintf(&input, `{"id":%d,"stage":"split","attempts":0,"state":{},"payload":%q}`+"\n", i+1, n)
	}
	got := runMessages(t, "split", input.String(), handlers)
	if len(got) != len(names) {
		t.Fatalf("output %q: want one failure line per message and no emit line", got)
	}
	for i, n := range names {
		want := "1 emit 2: "
		if strings.HasPrefix(n, "handled-") {
			want = "1 cannot split: emit 2: "
		}
		if !strings.HasPrefix(got[i], want) {
			t.Errorf("%s: answer %q, want it to start with %q", n, got[i], want)
		}
	}
	if len(errs) != len(names) || !strings.Contains(errs[0], `stage "no such" is not a stage name`) ||
		!strings.Contains(errs[4], "key is 257 bytes long") || !strings.Contains(errs[5], "over the 65536 the dispatcher reads") {
		t.Errorf("Emit's errors %q do not say what is wrong", errs)
	}
}

// Proves: a handler's emits can be tested without a dispatcher: Emits
// returns them in order, and a refused one is not among them.
func TestEmitsAreVisibleToAHandlersOwnTest(t *testing.T) {
	m := &stage.Message{ID: 1, Stage: "split", State: map[string]any{}}
	if err := m.Emit(stage.Emit{Stage: "row", Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if err := m.Emit(stage.Emit{Stage: "paused"}); err == nil {
		t.Error("Emit to stage paused returned no error")
	}
	if err := m.Emit(stage.Emit{Stage: "row", Payload: []byte("b"), Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(m.Emits()); got != fmt.Sprint([]stage.Emit{{Stage: "row", Payload: []byte("a")}, {Stage: "row", Payload: []byte("b"), Key: "k"}}) {
		t.Errorf("Emits() = %s", got)
	}
}

// Proves: in id mode emits ride the answered transition the same way, and a
// transition the library must write itself (the handler used Message.Tx, or
// Options.WriteTransitions) fails the message with a reason and writes
// nothing: the handler's transaction is rolled back, the row stays running.
// Failed is written as ever, with no emit line.
func TestIDModeWritesEmitsOnlyBeforeAnAnsweredTransition(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "split", "done", "failed", "retry", "tx")
	w := startWorker(t, stage.Options{Stage: "split", DB: url, Handlers: map[string]stage.Handler{"split": emitByPayload}})
	w.send(idLines(ids))
	want := []string{
		fmt.Sprintf(`^\+%d/0 \+%[1]d/1 0 >done$`, ids[0]),
		`^0$`,
		`^75 later$`,
		`^1 the handler emitted 2 messages, but the handler used Message.Tx, so the library writes the transition itself`,
	}
	got := answersWithEmits(readOutput(t, w, len(ids)))
	for i := range want {
		if !regexp.MustCompile(want[i]).MatchString(got[i]) {
			t.Errorf("%s: output %q, want it to match %s", []string{"done", "failed", "retry", "tx"}[i], got[i], want[i])
		}
	}
	if r := get(t, conn, ids[1]); r.Status != "failed" || r.State["error"] != "bad row" {
		t.Errorf("the Failed message is %+v, want failed with its reason", r)
	}
	if r := get(t, conn, ids[3]); r.Status != "running" || r.Stage != "split" {
		t.Errorf("the message that used Message.Tx is %s at %s, want still running at split (nothing written)", r.Status, r.Stage)
	}

	ids = insertRunning(t, conn, "split", "done")
	w2 := startWorker(t, stage.Options{Stage: "split", DB: url, WriteTransitions: true, Handlers: map[string]stage.Handler{"split": emitByPayload}})
	w2.send(idLines(ids))
	if got := w2.answer(); !strings.Contains(got, "but this program writes every transition itself (WriteTransitions)") {
		t.Errorf("WriteTransitions with emits: answer %q, want the message failed with the reason", got)
	}
	if r := get(t, conn, ids[0]); r.Status != "running" {
		t.Errorf("WriteTransitions with emits: row is %s, want running (nothing written)", r.Status)
	}
}

// readOutput reads lines from w until it has n status lines, emit lines
// included.
func readOutput(t *testing.T, w *worker, n int) []string {
	t.Helper()
	var lines []string
	for n > 0 {
		l := w.answer()
		lines = append(lines, l)
		if !core.IsEmitLine(l) {
			n--
		}
	}
	return lines
}
