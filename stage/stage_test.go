package stage_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// advanceTo is a handler that moves every message on to next.
func advanceTo(next string) stage.Handler {
	return func(context.Context, *stage.Message) stage.Result { return stage.Advance(next) }
}

// recorder is a handler that remembers the ids it saw, in order.
type recorder struct {
	mu  sync.Mutex
	ids []int64
}

func (r *recorder) handler(next string) stage.Handler {
	return func(_ context.Context, m *stage.Message) stage.Result {
		r.mu.Lock()
		r.ids = append(r.ids, m.ID)
		r.mu.Unlock()
		return stage.Advance(next)
	}
}

func (r *recorder) seen() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.ids...)
}

func idLines(ids []int64) string {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%d\n", id)
	}
	return b.String()
}

func TestManyIDsInOneReadAreAnsweredInOrder(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "a", "b", "c", "d", "e", "f", "g", "h")
	rec := &recorder{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": rec.handler("enrich")}})

	w.send(idLines(ids))
	for i := range ids {
		if got := w.answer(); got != "0 >enrich" {
			t.Fatalf("answer %d = %q, want \"0 >enrich\"", i, got)
		}
	}
	if got := rec.seen(); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Errorf("handler saw ids %v, want %v in that order", got, ids)
	}
	wantRunningAtParse(t, conn, "the dispatcher writes answered transitions", ids...)
}

func TestIDsSplitAcrossReadsAreReassembled(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	// Enough rows that some ids have two digits and can be cut in the middle.
	var payloads []string
	for i := 0; i < 12; i++ {
		payloads = append(payloads, fmt.Sprint(i))
	}
	ids := insertRunning(t, conn, "parse", payloads...)
	rec := &recorder{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": rec.handler("enrich")}})

	text := idLines(ids[9:]) // "10\n11\n12\n" or similar: cut inside ids and before newlines
	for i := 0; i < len(text); i++ {
		w.send(text[i : i+1])
	}
	for i := range ids[9:] {
		if got := w.answer(); got != "0 >enrich" {
			t.Fatalf("answer %d = %q, want \"0 >enrich\"", i, got)
		}
	}
	if got := rec.seen(); fmt.Sprint(got) != fmt.Sprint(ids[9:]) {
		t.Errorf("handler saw ids %v, want %v (ids cut across reads must be reassembled)", got, ids[9:])
	}
}

func TestEndOfInputFinishesWorkInFlightThenReturns(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "a", "b", "c", "d", "e")
	// The last id has no newline: a final line without one still counts.
	input := strings.TrimSuffix(idLines(ids), "\n")
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(context.Context, *stage.Message) stage.Result {
			time.Sleep(5 * time.Millisecond) // still working when input ends
			return stage.Done()
		}}})

	w.send(input)
	rest, err := w.closeInput()
	if err != nil {
		t.Fatalf("Run returned %v at the end of input, want nil", err)
	}
	if want := strings.Repeat("0 >done ", len(ids)); strings.Join(rest, " ")+" " != want {
		t.Fatalf("status lines after closing input = %q, want %d times \"0 >done\"", rest, len(ids))
	}
}

func TestHandlerPanicIsAnsweredNonZeroAndTheWorkerLivesOn(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "boom", "fine")
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			m.State["touched"] = true
			if string(m.Payload) == "boom" {
				panic("payload exploded")
			}
			return stage.Done()
		}}})

	w.send(idLines(ids))
	if got := w.answer(); got != "1 panic: payload exploded" {
		t.Errorf("answer to the panicking message = %q, want \"1 panic: payload exploded\"", got)
	}
	if got := w.answer(); got != `0 >done {"touched":true}` {
		t.Errorf("answer to the next message = %q, want \"0 >done {\"touched\":true}\" (the worker must live on)", got)
	}
	if r := get(t, conn, ids[0]); r.Status != "running" || r.Stage != "parse" || r.State["touched"] != nil {
		t.Errorf("panicked row = %+v, want untouched (running at parse, empty state)", r)
	}
	if !strings.Contains(w.logs.String(), "stage_test.TestHandlerPanic") {
		t.Errorf("log does not name the panic site; got:\n%s", w.logs.String())
	}
}

// Each Result but Failed and Error is answered with its transition and the
// handler's state change as a patch, and the row is left for the dispatcher to
// write; Failed is written by the library and answered a bare 0; Error and the
// results a stage may not give are answered non-zero, Retry 75, nothing written.
func TestEachResultIsAnsweredWithItsLine(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	results := map[string]func() stage.Result{
		"advance":  func() stage.Result { return stage.Advance("enrich") },
		"done":     stage.Done,
		"failed":   func() stage.Result { return stage.Failed("amount is not a number") },
		"pausefor": func() stage.Result { return stage.PauseFor(time.Hour) },
		"fraction": func() stage.Result { return stage.PauseFor(1500 * time.Millisecond) },
		"past":     func() stage.Result { return stage.Pause(time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)) },
		"error":    func() stage.Result { return stage.Error("relay unreachable\nretry later") },
		"retry":    func() stage.Result { return stage.Retry("rate limited:\ttry in 5 s") },
		"nothing":  func() stage.Result { return stage.Result{} },
		"self":     func() stage.Result { return stage.Advance("parse") },
		"todone":   func() stage.Result { return stage.Advance("done") },
		"badname":  func() stage.Result { return stage.Advance("en rich") },
		"empty":    func() stage.Result { return stage.Advance("") },
	}
	patch := ` {"seen_by":"parse"}`
	cases := []struct {
		payload string
		answer  string // a regular expression for the whole line
		status  string // what the row is after the answer
		written bool   // whether the handler's state change was written by the stage
	}{
		{"advance", `0 >enrich` + patch, "running", false},
		{"done", `0 >done` + patch, "running", false},
		{"failed", `0`, "failed", true},
		{"pausefor", `0 >paused:(3599\.9\d*|3600)` + patch, "running", false},
		{"fraction", `0 >paused:1\.(4\d*|5)` + patch, "running", false},
		{"past", `0 >paused:0` + patch, "running", false},
		{"error", `1 relay unreachable retry later`, "running", false},
		{"retry", `75 rate limited: try in 5 s`, "running", false},
		{"nothing", `1 handler returned no Result \(use stage.Advance, Done, Failed, Pause, Error or Retry\)`, "running", false},
		{"self", `1 advanced to its own stage "parse", which would run it again forever`, "running", false},
		{"todone", `1 advanced to "done", which is not a stage name \(use stage.Done to finish\)`, "running", false},
		{"badname", `1 advanced to "en rich", which is not a stage name \(use stage.Done to finish\)`, "running", false},
		{"empty", `1 advanced to "", which is not a stage name \(use stage.Done to finish\)`, "running", false},
	}
	var payloads []string
	for _, c := range cases {
		payloads = append(payloads, c.payload)
	}
	ids := insertRunning(t, conn, "parse", payloads...)
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			m.State["seen_by"] = m.Stage
			return results[string(m.Payload)]()
		}}})

	w.send(idLines(ids))
	for i, c := range cases {
		if got := w.answer(); !regexp.MustCompile(`^` + c.answer + `$`).MatchString(got) {
			t.Errorf("%s: answer = %q, want it to match %q", c.payload, got, c.answer)
		}
		r := get(t, conn, ids[i])
		if r.Stage != "parse" || r.Status != c.status {
			t.Errorf("%s: row is %s at %s, want %s at parse", c.payload, r.Status, r.Stage, c.status)
		}
		if written := r.State["seen_by"] == "parse"; written != c.written {
			t.Errorf("%s: state %v, want the handler's change written by the stage: %v", c.payload, r.State, c.written)
		}
		if r.State["dispatch_error"] != nil {
			t.Errorf("%s: state.dispatch_error = %v; a stage must never write it", c.payload, r.State["dispatch_error"])
		}
	}
	if got := get(t, conn, ids[2]).State["error"]; got != "amount is not a number" {
		t.Errorf("failed: state.error = %v, want the reason", got)
	}
}

func TestRowNotRunningAtThisStageIsAnsweredZeroAndLeftAlone(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	pending := insert(t, conn, "parse", "pending", "x", `{"k": 1}`)
	elsewhere := insert(t, conn, "enrich", "running", "x", `{"k": 2}`)
	done := insert(t, conn, "parse", "done", "x", `{"k": 3}`)
	missing := done + 1000
	before := map[int64]row{}
	for _, id := range []int64{pending, elsewhere, done} {
		before[id] = get(t, conn, id)
	}
	rec := &recorder{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": rec.handler("enrich")}})

	w.send(idLines([]int64{pending, elsewhere, done, missing}))
	for i := 0; i < 4; i++ {
		if got := w.answer(); got != "0" {
			t.Errorf("answer %d = %q, want \"0\"", i, got)
		}
	}
	if got := rec.seen(); len(got) != 0 {
		t.Errorf("handler ran for %v; it must not run for rows that are not running at its stage", got)
	}
	for id, b := range before {
		a := get(t, conn, id)
		if a.Stage != b.Stage || a.Status != b.Status || fmt.Sprint(a.State) != fmt.Sprint(b.State) || !a.UpdatedAt.Equal(b.UpdatedAt) {
			t.Errorf("row %d changed from %+v to %+v; want it untouched", id, b, a)
		}
	}
}

func TestFusedStagesRunInThePassAndAreReported(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "enrich", "m")
	mark := func(key, next string) stage.Handler {
		return func(_ context.Context, m *stage.Message) stage.Result {
			m.State[key] = m.Stage
			return stage.Advance(next)
		}
	}
	w := startWorker(t, stage.Options{Stage: "enrich", DB: url, Fused: []string{"tag", "score"},
		Handlers: map[string]stage.Handler{
			"enrich": mark("enriched_by", "tag"),
			"tag":    mark("tagged_by", "score"),
			"score":  mark("scored_by", "deliver"),
		}})

	w.send(idLines(ids))
	// Each fused handler sees its own stage name; the patch has the changes of all.
	got := w.answer()
	want := `^0 >deliver tag:\d+ score:\d+ \{"enriched_by":"enrich","scored_by":"score","tagged_by":"tag"\}$`
	if !regexp.MustCompile(want).MatchString(got) {
		t.Errorf("answer = %q, want it to match %q", got, want)
	}
	if r := get(t, conn, ids[0]); r.Stage != "enrich" || r.Status != "running" || len(r.State) != 0 {
		t.Errorf("row = %+v, want untouched (running at enrich, empty state): the dispatcher writes it", r)
	}
}

func TestFusedStageFailureUndoesTheWholePass(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "enrich", "m", "loop")
	w := startWorker(t, stage.Options{Stage: "enrich", DB: url, Fused: []string{"tag", "enrich"},
		Handlers: map[string]stage.Handler{
			"enrich": func(_ context.Context, m *stage.Message) stage.Result {
				m.State["enriched"] = true
				return stage.Advance("tag")
			},
			"tag": func(_ context.Context, m *stage.Message) stage.Result {
				if string(m.Payload) == "loop" {
					return stage.Advance("enrich")
				}
				return stage.Error("no tags for this customer")
			},
		}})

	w.send(idLines(ids))
	if got := w.answer(); got != "1 tag: no tags for this customer" {
		t.Errorf("answer = %q, want \"1 tag: no tags for this customer\"", got)
	}
	if got := w.answer(); got != "1 fused stages loop: enrich -> tag -> enrich" {
		t.Errorf("answer = %q, want the loop reported", got)
	}
	for _, id := range ids {
		if r := get(t, conn, id); r.Stage != "enrich" || r.Status != "running" || len(r.State) != 0 {
			t.Errorf("row %d = %+v, want untouched (running at enrich, empty state)", id, r)
		}
	}
}

func TestFusedStageThatFinishesLeavesTheRowAtThePassStage(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "enrich", "fail", "pause", "done")
	w := startWorker(t, stage.Options{Stage: "enrich", DB: url, Fused: []string{"tag"},
		Handlers: map[string]stage.Handler{
			"enrich": advanceTo("tag"),
			"tag": func(_ context.Context, m *stage.Message) stage.Result {
				switch string(m.Payload) {
				case "pause":
					return stage.PauseFor(2 * time.Second)
				case "done":
					return stage.Done()
				}
				return stage.Failed("spam")
			},
		}})

	w.send(idLines(ids))
	for _, want := range []string{`^0 tag:\d+$`, `^0 >paused:(1\.9\d*|2) tag:\d+$`, `^0 >done tag:\d+$`} {
		if got := w.answer(); !regexp.MustCompile(want).MatchString(got) {
			t.Errorf("answer = %q, want it to match %q", got, want)
		}
	}
	if r := get(t, conn, ids[0]); r.Stage != "enrich" || r.Status != "failed" || r.State["error"] != "tag: spam" {
		t.Errorf("row = %+v, want failed at enrich with state.error \"tag: spam\"", r)
	}
}

func TestUnknownStageIsAConfigurationError(t *testing.T) {
	t.Parallel()
	err := stage.Run(context.Background(), stage.Options{Stage: "nope", DB: "postgres://127.0.0.1:1/x",
		In: strings.NewReader("1\n"), Out: &strings.Builder{},
		Handlers: map[string]stage.Handler{"parse": advanceTo("enrich"), "deliver": advanceTo("x")}})
	if err == nil || !strings.Contains(err.Error(), `PEPSI_STAGE="nope"`) || !strings.Contains(err.Error(), "deliver, parse") {
		t.Errorf("Run = %v, want an error naming PEPSI_STAGE=\"nope\" and the stages served (deliver, parse)", err)
	}
	err = stage.Run(context.Background(), stage.Options{Stage: "parse", Fused: []string{"tag"}, DB: "postgres://127.0.0.1:1/x",
		In: strings.NewReader("1\n"), Out: &strings.Builder{},
		Handlers: map[string]stage.Handler{"parse": advanceTo("tag")}})
	if err == nil || !strings.Contains(err.Error(), `fused stage "tag" has no handler`) {
		t.Errorf("Run with a fused stage without handler = %v, want it refused", err)
	}
}

func TestLostConnectionIsReestablishedAndTheIDRunAgain(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	admin := pgtest.Connect(t, url)
	ids := insertRunning(t, conn, "parse", "cut", "after", "cut twice")
	var mu sync.Mutex
	calls := map[string]int{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			mu.Lock()
			calls[string(m.Payload)]++
			first := calls[string(m.Payload)] == 1
			mu.Unlock()
			cut := first && string(m.Payload) == "cut" || calls[string(m.Payload)] <= 2 && string(m.Payload) == "cut twice"
			if cut {
				// The server drops this worker's connection in the middle of the pass.
				var pid int
				if err := m.Tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					return stage.Error(err.Error())
				}
				if _, err := admin.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid); err != nil {
					return stage.Error(err.Error())
				}
			}
			return stage.Advance("enrich")
		}}})

	w.send(idLines(ids[:1]))
	if got := w.answer(); got != "0 >enrich" {
		t.Fatalf("answer after the connection was cut = %q, want \"0 >enrich\" (run again on a new connection)", got)
	}
	// Between ids, too: cut the connection while the worker is idle.
	if _, err := admin.Exec(context.Background(),
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pepsi-stage parse'"); err != nil {
		t.Fatal(err)
	}
	w.send(idLines(ids[1:2]))
	if got := w.answer(); got != "0 >enrich" {
		t.Fatalf("answer after an idle connection was cut = %q, want \"0 >enrich\"", got)
	}
	// A message that loses the connection twice: the second reconnect waits.
	start := time.Now()
	w.send(idLines(ids[2:]))
	if got := w.answer(); got != "0 >enrich" {
		t.Fatalf("answer after two cuts = %q, want \"0 >enrich\"", got)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("two losses in a row were retried within %v; want a backoff of at least 100ms before the second reconnect", waited)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["cut"] != 2 || calls["after"] != 1 || calls["cut twice"] != 3 {
		t.Errorf("handler calls = %v, want cut:2 (run again after the loss) after:1 \"cut twice\":3", calls)
	}
	wantRunningAtParse(t, conn, "nothing committed by the cut passes", ids...)
}

func TestHandlerStatementsCommitWithTheTransition(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	if _, err := conn.Exec(context.Background(), "CREATE TABLE side (id bigint, sync text)"); err != nil {
		t.Fatal(err)
	}
	ids := insertRunning(t, conn, "parse", "keep", "undo")
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			_, err := m.Tx.Exec(ctx, "INSERT INTO side SELECT $1, current_setting('synchronous_commit')", m.ID)
			if err != nil {
				return stage.Error(err.Error())
			}
			if string(m.Payload) == "undo" {
				return stage.Error("changed my mind")
			}
			return stage.Done()
		}}})

	w.send(idLines(ids))
	if got := w.answer(); got != "0" {
		t.Errorf("answer of the pass that used Message.Tx = %q, want a bare \"0\" (the stage wrote its transition)", got)
	}
	if got := w.answer(); got != "1 changed my mind" {
		t.Errorf("answer of the pass that returned Error = %q, want \"1 changed my mind\"", got)
	}
	if r := get(t, conn, ids[0]); r.Status != "done" {
		t.Errorf("row of the pass that used Message.Tx is %s, want done (written with the handler's statements)", r.Status)
	}
	var got []string
	rows, err := conn.Query(context.Background(), "SELECT id || ':' || sync FROM side ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if want := []string{fmt.Sprintf("%d:off", ids[0])}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("side table = %v, want %v (the Done pass's insert, with synchronous_commit off; the Error pass's undone)", got, want)
	}
}

func TestStateNumbersSurviveExactly(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	state := `{"big": 9007199254740993, "frac": 0.1}`
	ids := []int64{insert(t, conn, "parse", "running", "copy", state), insert(t, conn, "parse", "running", "fail", state)}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			if string(m.Payload) == "fail" {
				return stage.Failed("written by the library")
			}
			m.State["copy"] = m.State["big"]
			return stage.Advance("enrich")
		}}})

	w.send(idLines(ids))
	if got, want := w.answer(), `0 >enrich {"copy":9007199254740993}`; got != want {
		t.Errorf("answer = %q, want %q (the copied number exact, the unchanged keys not sent)", got, want)
	}
	w.answer()
	var text string
	if err := conn.QueryRow(context.Background(), "SELECT state::text FROM pepsi.queue WHERE ingress_id = $1", ids[1]).Scan(&text); err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var back map[string]any
	if err := d.Decode(&back); err != nil || back["big"] != json.Number("9007199254740993") || back["frac"] != json.Number("0.1") {
		t.Errorf("state written by the library = %s, want the numbers unchanged", text)
	}
}

func TestLineThatIsNotAnIDIsAnsweredNonZero(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "x")
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": advanceTo("enrich")}})

	w.send("twelve\n\n" + idLines(ids))
	if got := w.answer(); got != `1 not a message id: "twelve"` {
		t.Errorf("answer = %q, want a non-zero line for the bad input", got)
	}
	if got := w.answer(); got != "0 >enrich" {
		t.Errorf("answer for the id after it = %q, want \"0 >enrich\" (blank lines are skipped)", got)
	}

	// A long one is answered with its reason cut, as every reason the
	// library gives: at 1,000 bytes and an ellipsis. (2,000 control bytes,
	// within an input line's bound, quote to 8,000.)
	w.send(strings.Repeat("\x01", 2000) + "\n")
	got := w.answer()
	want := "1 " + (`not a message id: "` + strings.Repeat(`\x01`, 2000))[:1000] + "…"
	if got != want {
		t.Errorf("answer for a line of 2,000 control bytes = %d bytes %.40q…, want %d bytes %.40q…", len(got), got, len(want), want)
	}
}

func TestHandlerThatMovesItsRowItselfIsAnsweredNonZeroAndUndone(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	if _, err := conn.Exec(context.Background(), "CREATE TABLE side (id bigint)"); err != nil {
		t.Fatal(err)
	}
	ids := insertRunning(t, conn, "parse", "sneaky", "fine")
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			if _, err := m.Tx.Exec(ctx, "INSERT INTO side VALUES ($1)", m.ID); err != nil {
				return stage.Error(err.Error())
			}
			if string(m.Payload) == "sneaky" {
				if _, err := m.Tx.Exec(ctx, "UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = $1", m.ID); err != nil {
					return stage.Error(err.Error())
				}
			}
			return stage.Advance("enrich")
		}}})

	w.send(idLines(ids))
	want := fmt.Sprintf("1 the handler moved message %d itself; return a Result instead of writing pepsi.queue", ids[0])
	if got := w.answer(); got != want {
		t.Errorf("answer for the handler that moved its row = %q, want %q", got, want)
	}
	if got := w.answer(); got != "0" {
		t.Errorf("answer for the next message = %q, want \"0\" (the connection is usable again)", got)
	}
	wantRunningAtParse(t, conn, "the pass that moved it itself rolled back", ids[0])
	if r := get(t, conn, ids[1]); r.Stage != "enrich" || r.Status != "running" {
		t.Errorf("next row is %s at %s, want running at enrich", r.Status, r.Stage)
	}
	rows, err := conn.Query(context.Background(), "SELECT id FROM side ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	side, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(side) != fmt.Sprint(ids[1:]) {
		t.Errorf("side table = %v, want %v (the bad pass's insert undone)", side, ids[1:])
	}
}

// A transition the library writes without a lock (here Failed) goes only over
// the row version the handler was given: if the row changed meanwhile, the pass
// runs again on the row as it is now.
func TestRowChangedWhileTheHandlerRanIsRunAgainOnTheNewRow(t *testing.T) {
	t.Parallel()
	url, conn, operator := withOperator(t)
	ids := insertRunning(t, conn, "parse", "first", "second")
	var mu sync.Mutex
	calls := map[int64]int{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			mu.Lock()
			calls[m.ID]++
			n := calls[m.ID]
			mu.Unlock()
			if m.ID == ids[1] && n == 1 {
				// Its row was read with the batch; change it now.
				if _, err := operator.Exec(ctx, `UPDATE pepsi.queue SET state = '{"operator": "was here"}' WHERE ingress_id = $1`, m.ID); err != nil {
					return stage.Error(err.Error())
				}
			}
			m.State["seen"] = n
			return stage.Failed("bad content")
		}}})

	w.send(idLines(ids)) // one write: both rows are read in one statement
	for i := range ids {
		if got := w.answer(); got != "0" {
			t.Errorf("answer %d = %q, want \"0\"", i, got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if calls[ids[0]] != 1 || calls[ids[1]] != 2 {
		t.Errorf("handler calls = %v, want 1 for %d and 2 for %d (run again after its row changed)", calls, ids[0], ids[1])
	}
	r := get(t, conn, ids[1])
	if r.Status != "failed" || r.State["operator"] != "was here" || r.State["seen"] != json.Number("2") {
		t.Errorf("changed row = %s with state %v, want failed with the operator's state and seen 2 (the second run's transition, not the first's)", r.Status, r.State)
	}
}

func TestRowChangedBeforeTheHandlersFirstStatementIsRunAgain(t *testing.T) {
	t.Parallel()
	url, conn, operator := withOperator(t)
	ids := insertRunning(t, conn, "parse", "x")
	var errs []string
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			if len(errs) == 0 {
				if _, err := operator.Exec(ctx, `UPDATE pepsi.queue SET state = '{"operator": "was here"}' WHERE ingress_id = $1`, m.ID); err != nil {
					return stage.Error(err.Error())
				}
			}
			_, err := m.Tx.Exec(ctx, "SELECT 1")
			errs = append(errs, fmt.Sprint(err))
			if err != nil {
				return stage.Error(err.Error())
			}
			return stage.Done()
		}}})

	w.send(idLines(ids))
	if got := w.answer(); got != "0" {
		t.Errorf("answer = %q, want \"0\" (the second run's)", got)
	}
	if len(errs) != 2 || errs[0] == "<nil>" || errs[1] != "<nil>" {
		t.Errorf("errors of the handler's statement per run = %q, want an error (row changed) and then none", errs)
	}
	if r := get(t, conn, ids[0]); r.Status != "done" || r.State["operator"] != "was here" {
		t.Errorf("row = %s with state %v, want done with the operator's state", r.Status, r.State)
	}
}

func TestMessageTransactionRefusesCommitAndRollbackButNestsSavepoints(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	if _, err := conn.Exec(context.Background(), "CREATE TABLE side (what text)"); err != nil {
		t.Fatal(err)
	}
	ids := insertRunning(t, conn, "parse", "x")
	var commitErr, rollbackErr error
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(ctx context.Context, m *stage.Message) stage.Result {
			for _, sp := range []string{"kept", "undone"} {
				nested, err := m.Tx.Begin(ctx)
				if err != nil {
					return stage.Error(err.Error())
				}
				if _, err := nested.Exec(ctx, "INSERT INTO side VALUES ($1)", sp); err != nil {
					return stage.Error(err.Error())
				}
				end := nested.Commit
				if sp == "undone" {
					end = nested.Rollback
				}
				if err := end(ctx); err != nil {
					return stage.Error(err.Error())
				}
			}
			commitErr, rollbackErr = m.Tx.Commit(ctx), m.Tx.Rollback(ctx)
			return stage.Done()
		}}})

	w.send(idLines(ids))
	if got := w.answer(); got != "0" {
		t.Fatalf("answer = %q, want \"0\"", got)
	}
	if commitErr == nil || rollbackErr == nil {
		t.Errorf("Commit and Rollback of Message.Tx returned %v and %v, want errors (the library ends the transaction)", commitErr, rollbackErr)
	}
	var got []string
	rows, err := conn.Query(context.Background(), "SELECT what FROM side")
	if err != nil {
		t.Fatal(err)
	}
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[kept]" {
		t.Errorf("side table = %v, want [kept] (the released savepoint's insert committed, the rolled back one's not)", got)
	}
	if r := get(t, conn, ids[0]); r.Status != "done" {
		t.Errorf("row is %s, want done", r.Status)
	}
}

func TestMissingIDInABatchIsAnsweredZero(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "x", "y")
	missing := ids[1] + 1000
	rec := &recorder{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": rec.handler("enrich")}})

	// One write: the three rows are read in one statement, which finds two.
	w.send(idLines([]int64{ids[0], missing, ids[1]}))
	for i, want := range []string{"0 >enrich", "0", "0 >enrich"} {
		if got := w.answer(); got != want {
			t.Errorf("answer %d = %q, want %q", i, got, want)
		}
	}
	if got := rec.seen(); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Errorf("handler saw ids %v, want %v (never the missing one)", got, ids)
	}
	if !strings.Contains(w.logs.String(), "message does not exist") {
		t.Errorf("log lacks \"message does not exist\" for id %d; log:\n%s", missing, w.logs.String())
	}
}

// A handler in id mode sees the row's attempts, as one in message mode does, so
// that it can give up or back off by itself, and its order key; both the
// batch read and the read of a single row (a pass that runs again) carry
// them.
func TestIDModeHandlersSeeTheRetriesAlreadyHadAndTheOrderKey(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	ids := insertRunning(t, conn, "parse", "a", "b")
	if _, err := conn.Exec(t.Context(), `UPDATE pepsi.queue SET attempts = ingress_id + 1,
		order_key = CASE WHEN ingress_id = $2 THEN 'acct-9' END WHERE ingress_id = ANY($1)`, ids, ids[0]); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int64]string{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			mu.Lock()
			defer mu.Unlock()
			seen[m.ID] = fmt.Sprintf("attempts %d, order key %q", m.Attempts, m.OrderKey)
			return stage.Done()
		}}})
	w.send(idLines(ids))
	for range ids {
		w.answer()
	}
	mu.Lock()
	defer mu.Unlock()
	for i, id := range ids {
		want := fmt.Sprintf("attempts %d, order key %q", id+1, []string{"acct-9", ""}[i])
		if seen[id] != want {
			t.Errorf("handler saw %s for message %d, want %s (the row's columns)", seen[id], id, want)
		}
	}
}

// The stage's log is read line by line by the dispatcher: an error that spans
// lines (pgx lists each address it tried on a line of its own) is one record
// on one line.
func TestNewLoggerWritesOneLinePerRecord(t *testing.T) {
	var b bytes.Buffer
	stage.NewLogger(&b).Error("cannot connect", "err", errors.New("failed to connect to `host=a`:\n\tdial error: refused\n\tserver error: gone"))
	got := b.String()
	if strings.Count(got, "\n") != 1 || !strings.Contains(got, "dial error: refused; server error: gone") {
		t.Errorf("log %q: want one line with the error's lines joined", got)
	}
}
