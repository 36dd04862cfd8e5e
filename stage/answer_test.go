package stage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// The patch on the answer line holds the top-level keys the handler added or
// changed, including a nested value changed in place, and none it left alone,
// in one compact line whatever the strings hold.
func TestStatePatchHoldsOnlyTheKeysTheHandlerChanged(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	id := insert(t, conn, "parse", "running", "x",
		`{"keep": 1, "same": 2, "html": "a<b&c>", "change": "a", "nested": {"x": 1}}`)
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			m.State["same"] = 2 // the same value, as a Go int: not a change
			m.State["html"] = "a<b&c>"
			m.State["change"] = "b"
			m.State["nested"].(map[string]any)["y"] = true
			m.State["new"] = "two\nlines"
			return stage.Advance("enrich")
		}}})

	w.send(idLines([]int64{id}))
	want := `0 >enrich {"change":"b","nested":{"x":1,"y":true},"new":"two\nlines"}`
	if got := w.answer(); got != want {
		t.Errorf("answer = %q, want %q", got, want)
	}
}

// state || patch cannot delete a key: a handler that deletes one has its
// transition written by the library, whole state included, and a bare 0.
func TestDeletedStateKeyIsWrittenByTheLibrary(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	id := insert(t, conn, "parse", "running", "x", `{"drop": 1, "keep": 2}`)
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			delete(m.State, "drop")
			m.State["added"] = true
			return stage.Advance("enrich")
		}}})

	w.send(idLines([]int64{id}))
	if got := w.answer(); got != "0" {
		t.Errorf("answer = %q, want a bare \"0\" (the library wrote the transition)", got)
	}
	r := get(t, conn, id)
	if r.Stage != "enrich" || r.Status != "running" || fmt.Sprint(r.State) != "map[added:true keep:2]" {
		t.Errorf("row = %+v, want running at enrich with state {added: true, keep: 2}", r)
	}
}

// The dispatcher reads lines of a bounded length: a patch that would make the
// line longer than 32 KiB is not sent; the library writes the transition.
func TestPatchTooLongForALineIsWrittenByTheLibrary(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "x")
	big := strings.Repeat("x", 40<<10)
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			m.State["big"] = big
			return stage.Done()
		}}})

	w.send(idLines(ids))
	if got := w.answer(); got != "0" {
		t.Errorf("answer = %.40q…, want a bare \"0\" (the library wrote the transition)", got)
	}
	if r := get(t, conn, ids[0]); r.Status != "done" || r.State["big"] != big {
		t.Errorf("row is %s with a state.big of %d bytes, want done with the 40 KiB value", r.Status, len(fmt.Sprint(r.State["big"])))
	}
}

// A handler that used Message.Tx gets every transition written in its
// transaction, and a bare 0 (with the fused stages' times).
func TestHandlerThatUsedTheTransactionHasEachTransitionWritten(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	until := time.Date(2031, 2, 3, 4, 5, 6, 0, time.UTC)
	results := map[string]stage.Result{
		"advance": stage.Advance("deliver"),
		"done":    stage.Done(),
		"failed":  stage.Failed("spam"),
		"pause":   stage.Pause(until),
	}
	cases := []struct{ payload, stage, status string }{
		{"advance", "deliver", "running"},
		{"done", "enrich", "done"},
		{"failed", "enrich", "failed"},
		{"pause", "enrich", "paused"},
	}
	var payloads []string
	for _, c := range cases {
		payloads = append(payloads, c.payload)
	}
	ids := insertRunning(t, conn, "enrich", payloads...)
	w := startWorker(t, stage.Options{Stage: "enrich", DB: url, Fused: []string{"tag"},
		Handlers: map[string]stage.Handler{
			"enrich": func(ctx context.Context, m *stage.Message) stage.Result {
				if _, err := m.Tx.Exec(ctx, "SELECT 1"); err != nil {
					return stage.Error(err.Error())
				}
				m.State["enriched"] = true
				return stage.Advance("tag")
			},
			"tag": func(_ context.Context, m *stage.Message) stage.Result { return results[string(m.Payload)] },
		}})

	w.send(idLines(ids))
	for i, c := range cases {
		if got := w.answer(); !regexp.MustCompile(`^0 tag:\d+$`).MatchString(got) {
			t.Errorf("%s: answer = %q, want \"0 tag:MICROS\"", c.payload, got)
		}
		r := get(t, conn, ids[i])
		if r.Stage != c.stage || r.Status != c.status || r.State["enriched"] != true {
			t.Errorf("%s: row = %+v, want %s at %s, enriched", c.payload, r, c.status, c.stage)
		}
	}
	if got := get(t, conn, ids[3]).Timeout; got == nil || !got.Equal(until) {
		t.Errorf("pause: timeout = %v, want %v", got, until)
	}
	if got := get(t, conn, ids[2]).State["error"]; got != "tag: spam" {
		t.Errorf("failed: state.error = %v, want \"tag: spam\"", got)
	}
}

// For a dispatcher that predates answers with a target, WriteTransitions makes
// the library write every transition itself and answer a bare 0.
func TestWriteTransitionsWritesEveryTransitionAndAnswersZero(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "advance", "done", "pause")
	w := startWorker(t, stage.Options{Stage: "parse", DB: url, WriteTransitions: true,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			m.State["seen"] = true
			switch string(m.Payload) {
			case "advance":
				return stage.Advance("enrich")
			case "done":
				return stage.Done()
			}
			return stage.PauseFor(time.Hour)
		}}})

	start := time.Now()
	w.send(idLines(ids))
	want := []struct{ stage, status string }{{"enrich", "running"}, {"parse", "done"}, {"parse", "paused"}}
	for i, c := range want {
		if got := w.answer(); got != "0" {
			t.Errorf("answer %d = %q, want \"0\"", i, got)
		}
		if r := get(t, conn, ids[i]); r.Stage != c.stage || r.Status != c.status || r.State["seen"] != true {
			t.Errorf("row %d = %+v, want %s at %s with the handler's state", ids[i], r, c.status, c.stage)
		}
	}
	if got := get(t, conn, ids[2]).Timeout; got == nil || got.Before(start.Add(time.Hour-time.Second)) || got.After(time.Now().Add(time.Hour)) {
		t.Errorf("pause: timeout = %v, want about an hour after %v", got, start)
	}
}

// The rows of every id already on standard input are read in one statement,
// before the first handler runs: a row moved after that read is still handled
// (the dispatcher's guard then discards its answer, as it does for any answer
// about a row no longer running at the stage).
func TestRowsOfABatchAreReadOnceBeforeItsHandlersRun(t *testing.T) {
	t.Parallel()
	url, conn, operator := withOperator(t)
	ids := insertRunning(t, conn, "parse", "first", "second")
	rec := &recorder{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			if m.ID == ids[0] {
				if _, err := operator.Exec(ctx, "UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = $1", ids[1]); err != nil {
					return stage.Error(err.Error())
				}
			}
			return rec.handler("enrich")(ctx, m)
		}}})

	w.send(idLines(ids)) // one write: both ids are buffered when the first is taken
	for i := range ids {
		if got := w.answer(); got != "0 >enrich" {
			t.Errorf("answer %d = %q, want \"0 >enrich\"", i, got)
		}
	}
	if got := rec.seen(); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Errorf("handler saw %v, want %v (the second row as the batch read it, running)", got, ids)
	}
	// Ids that arrive later are a batch of their own, read as they are now.
	w.send(idLines(ids[1:]))
	if got := w.answer(); got != "0" {
		t.Errorf("answer for the moved row sent again = %q, want \"0\" (not running at this stage)", got)
	}
}

// A slow handler does not hold the answers before it.
func TestSlowHandlerDoesNotHoldTheAnswersBeforeIt(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "quick", "slow")
	release := make(chan struct{})
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			if string(m.Payload) == "slow" {
				<-release
			}
			return stage.Done()
		}}})

	w.send(idLines(ids))
	got := w.answer() // fails the test if it waits for the slow handler
	close(release)
	if got != "0 >done" {
		t.Errorf("answer of the quick message = %q, want \"0 >done\"", got)
	}
	if got := w.answer(); got != "0 >done" {
		t.Errorf("answer of the slow message = %q, want \"0 >done\"", got)
	}
}

// The patch is valid JSON that decodes to the handler's values.
func TestPatchDecodesToTheHandlersValues(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "x")
	values := map[string]any{"s": "tab\tquote\"back\\slash\u2028", "n": 1.5, "l": []any{"a", nil, false}, "o": map[string]any{"k": "v"}}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			for k, v := range values {
				m.State[k] = v
			}
			return stage.Done()
		}}})

	w.send(idLines(ids))
	got := w.answer()
	patch, ok := strings.CutPrefix(got, "0 >done ")
	var back map[string]any
	if !ok || json.Unmarshal([]byte(patch), &back) != nil || fmt.Sprint(back) != fmt.Sprint(values) {
		t.Errorf("answer = %q, want \"0 >done \" and a JSON object equal to %v", got, values)
	}
}

// A Failed reason is written into state.error, jsonb text: a NUL or bytes
// that are not UTF-8 in it are replaced, as the dispatcher does with a
// reason, so the failure is written (the database refused it once, and the
// message ended with a database error instead).
func TestAFailedReasonJSONBCannotHoldIsWrittenReplaced(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	id := insert(t, conn, "parse", "running", "x", `{}`)
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(context.Context, *stage.Message) stage.Result {
			return stage.Failed("bad \xff byte \x00 here")
		}}})
	w.send(idLines([]int64{id}))
	if got := w.answer(); got != "0" {
		t.Fatalf("answer = %q, want 0 (the library wrote the failure)", got)
	}
	var status, reason string
	if err := conn.QueryRow(context.Background(), `SELECT status, state->>'error' FROM pepsi.queue WHERE ingress_id = $1`, id).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || reason != "bad \uFFFD byte \uFFFD here" {
		t.Errorf("row %s with state.error %q; want failed with the reason, its bad bytes replaced", status, reason)
	}
}

// A pause longer than the dispatcher takes (core.PauseMax, 10 years) fails
// with a reason that says so, rather than answering a line the dispatcher
// refuses.
func TestAPauseLongerThanTheDispatcherTakesFailsWithAReason(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	id := insert(t, conn, "parse", "running", "x", `{}`)
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(context.Context, *stage.Message) stage.Result {
			return stage.PauseFor(11 * 365 * 24 * time.Hour)
		}}})
	w.send(idLines([]int64{id}))
	if got := w.answer(); !strings.HasPrefix(got, "1 ") || !strings.Contains(got, "core.PauseMax") {
		t.Errorf("answer = %q; want a failure naming the longest pause", got)
	}
}

// Every answer of a batch is written out before the next pass runs: a worker
// that dies in a pass (a panic on a goroutine of its own, an os.Exit) would
// take the answers still buffered along, and the dispatcher would fail its
// head, a message already answered, as crashed (docs/protocol.md).
func TestEveryAnswerIsOutBeforeTheNextPassRuns(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "first", "second", "third")
	out := &lockedbuf.Buffer{} // a handler reads what was written so far
	seen := map[string]string{}
	err := stage.Run(context.Background(), stage.Options{Stage: "parse", DB: url, In: strings.NewReader(idLines(ids)), Out: out,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			seen[string(m.Payload)] = out.String()
			return stage.Done()
		}}})
	if err != nil {
		t.Fatal(err)
	}
	for payload, want := range map[string]string{"first": "", "second": "0 >done\n", "third": "0 >done\n0 >done\n"} {
		if seen[payload] != want {
			t.Errorf("written out when the pass of %q began: %q; want %q", payload, seen[payload], want)
		}
	}
}
