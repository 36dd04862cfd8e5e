package stage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/shell/pgtest"
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
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	ids := insertRunning(t, conn, "parse", "a", "b", "c", "d", "e", "f", "g", "h")
	rec := &recorder{}
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": rec.handler("enrich")}})

	w.send(idLines(ids))
	for i := range ids {
		if got := w.answer(); got != "0" {
			t.Fatalf("answer %d = %q, want \"0\"", i, got)
		}
	}
	if got := rec.seen(); fmt.Sprint(got) != fmt.Sprint(ids) {
		t.Errorf("handler saw ids %v, want %v in that order", got, ids)
	}
	for _, id := range ids {
		if r := get(t, conn, id); r.Stage != "enrich" || r.Status != "running" {
			t.Errorf("row %d is %s at %s, want running at enrich", id, r.Status, r.Stage)
		}
	}
}

func TestIDsSplitAcrossReadsAreReassembled(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
		if got := w.answer(); got != "0" {
			t.Fatalf("answer %d = %q, want \"0\"", i, got)
		}
	}
	if got := rec.seen(); fmt.Sprint(got) != fmt.Sprint(ids[9:]) {
		t.Errorf("handler saw ids %v, want %v (ids cut across reads must be reassembled)", got, ids[9:])
	}
}

func TestEndOfInputFinishesWorkInFlightThenReturns(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
	if len(rest) != len(ids) {
		t.Fatalf("got %d status lines %q after closing input, want %d", len(rest), rest, len(ids))
	}
	for _, id := range ids {
		if r := get(t, conn, id); r.Status != "done" {
			t.Errorf("row %d is %s, want done", id, r.Status)
		}
	}
}

func TestHandlerPanicIsAnsweredNonZeroAndTheWorkerLivesOn(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
	if got := w.answer(); got != "0" {
		t.Errorf("answer to the next message = %q, want \"0\" (the worker must live on)", got)
	}
	if r := get(t, conn, ids[0]); r.Status != "running" || r.Stage != "parse" || r.State["touched"] != nil {
		t.Errorf("panicked row = %+v, want untouched (running at parse, empty state)", r)
	}
	if !strings.Contains(w.logs.String(), "stage_test.TestHandlerPanic") {
		t.Errorf("log does not name the panic site; got:\n%s", w.logs.String())
	}
}

func TestEachTransitionWritesTheRowAndAnswers(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	until := time.Date(2031, 2, 3, 4, 5, 6, 0, time.UTC)
	results := map[string]stage.Result{
		"advance":  stage.Advance("enrich"),
		"done":     stage.Done(),
		"failed":   stage.Failed("amount is not a number"),
		"pause":    stage.Pause(until),
		"pausefor": stage.PauseFor(time.Hour),
		"error":    stage.Error("relay unreachable\nretry later"),
		"nothing":  {},
		"self":     stage.Advance("parse"),
	}
	cases := []struct {
		payload string
		answer  string
		stage   string
		status  string
		written bool // whether the handler's state change was committed
	}{
		{"advance", "0", "enrich", "running", true},
		{"done", "0", "parse", "done", true},
		{"failed", "0", "parse", "failed", true},
		{"pause", "0", "parse", "paused", true},
		{"pausefor", "0", "parse", "paused", true},
		{"error", "1 relay unreachable retry later", "parse", "running", false},
		{"nothing", "1 handler returned no Result (use stage.Advance, Done, Failed, Pause or Error)", "parse", "running", false},
		{"self", `1 advanced to its own stage "parse", which would run it again forever`, "parse", "running", false},
	}
	var payloads []string
	for _, c := range cases {
		payloads = append(payloads, c.payload)
	}
	ids := insertRunning(t, conn, "parse", payloads...)
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			m.State["seen_by"] = m.Stage
			return results[string(m.Payload)]
		}}})

	start := time.Now()
	w.send(idLines(ids))
	for i, c := range cases {
		if got := w.answer(); got != c.answer {
			t.Errorf("%s: answer = %q, want %q", c.payload, got, c.answer)
		}
		r := get(t, conn, ids[i])
		if r.Stage != c.stage || r.Status != c.status {
			t.Errorf("%s: row is %s at %s, want %s at %s", c.payload, r.Status, r.Stage, c.status, c.stage)
		}
		if written := r.State["seen_by"] == "parse"; written != c.written {
			t.Errorf("%s: state %v, want the handler's change written: %v", c.payload, r.State, c.written)
		}
		if r.State["dispatch_error"] != nil {
			t.Errorf("%s: state.dispatch_error = %v; a stage must never write it", c.payload, r.State["dispatch_error"])
		}
	}
	if got := get(t, conn, ids[2]).State["error"]; got != "amount is not a number" {
		t.Errorf("failed: state.error = %v, want the reason", got)
	}
	if got := get(t, conn, ids[3]).Timeout; got == nil || !got.Equal(until) {
		t.Errorf("pause: timeout = %v, want %v", got, until)
	}
	if got := get(t, conn, ids[4]).Timeout; got == nil || got.Before(start.Add(time.Hour-time.Second)) || got.After(time.Now().Add(time.Hour)) {
		t.Errorf("pausefor: timeout = %v, want about an hour after %v", got, start)
	}
}

func TestRowNotRunningAtThisStageIsAnsweredZeroAndLeftAlone(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
	got := w.answer()
	if !regexp.MustCompile(`^0 tag:\d+ score:\d+$`).MatchString(got) {
		t.Errorf("answer = %q, want \"0 tag:MICROS score:MICROS\"", got)
	}
	r := get(t, conn, ids[0])
	if r.Stage != "deliver" || r.Status != "running" {
		t.Errorf("row is %s at %s, want running at deliver (advanced through the fused stages)", r.Status, r.Stage)
	}
	want := map[string]any{"enriched_by": "enrich", "tagged_by": "tag", "scored_by": "score"}
	if fmt.Sprint(r.State) != fmt.Sprint(want) {
		t.Errorf("state = %v, want %v (each fused handler sees its own stage name)", r.State, want)
	}
}

func TestFusedStageFailureUndoesTheWholePass(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	ids := insertRunning(t, conn, "enrich", "m")
	w := startWorker(t, stage.Options{Stage: "enrich", DB: url, Fused: []string{"tag"},
		Handlers: map[string]stage.Handler{
			"enrich": advanceTo("tag"),
			"tag":    func(context.Context, *stage.Message) stage.Result { return stage.Failed("spam") },
		}})

	w.send(idLines(ids))
	if got := w.answer(); !regexp.MustCompile(`^0 tag:\d+$`).MatchString(got) {
		t.Errorf("answer = %q, want \"0 tag:MICROS\"", got)
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
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
	if got := w.answer(); got != "0" {
		t.Fatalf("answer after the connection was cut = %q, want \"0\" (run again on a new connection)", got)
	}
	// Between ids, too: cut the connection while the worker is idle.
	if _, err := admin.Exec(context.Background(),
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pepsi-stage parse'"); err != nil {
		t.Fatal(err)
	}
	w.send(idLines(ids[1:2]))
	if got := w.answer(); got != "0" {
		t.Fatalf("answer after an idle connection was cut = %q, want \"0\"", got)
	}
	// A message that loses the connection twice: the second reconnect waits.
	start := time.Now()
	w.send(idLines(ids[2:]))
	if got := w.answer(); got != "0" {
		t.Fatalf("answer after two cuts = %q, want \"0\"", got)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("two losses in a row were retried within %v; want a backoff of at least 100ms before the second reconnect", waited)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["cut"] != 2 || calls["after"] != 1 || calls["cut twice"] != 3 {
		t.Errorf("handler calls = %v, want cut:2 (run again after the loss) after:1 \"cut twice\":3", calls)
	}
	for _, id := range ids {
		if r := get(t, conn, id); r.Stage != "enrich" {
			t.Errorf("row %d at %s, want enrich", id, r.Stage)
		}
	}
}

func TestHandlerStatementsCommitWithTheTransition(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
	w.answer()
	w.answer()
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
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	id := insert(t, conn, "parse", "running", "x", `{"big": 9007199254740993, "frac": 0.1}`)
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": advanceTo("enrich")}})

	w.send(idLines([]int64{id}))
	w.answer()
	var text string
	if err := conn.QueryRow(context.Background(), "SELECT state::text FROM pepsi.queue WHERE ingress_id = $1", id).Scan(&text); err != nil {
		t.Fatal(err)
	}
	var back map[string]json.Number
	if err := json.Unmarshal([]byte(text), &back); err != nil || back["big"] != "9007199254740993" || back["frac"] != "0.1" {
		t.Errorf("state after the pass = %s, want the numbers unchanged", text)
	}
}

func TestLineThatIsNotAnIDIsAnsweredNonZero(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	ids := insertRunning(t, conn, "parse", "x")
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": advanceTo("enrich")}})

	w.send("twelve\n\n" + idLines(ids))
	if got := w.answer(); got != `1 not a message id: "twelve"` {
		t.Errorf("answer = %q, want a non-zero line for the bad input", got)
	}
	if got := w.answer(); got != "0" {
		t.Errorf("answer for the id after it = %q, want \"0\" (blank lines are skipped)", got)
	}
}

func TestHandlerThatMovesItsRowItselfIsAnsweredNonZeroAndUndone(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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
	if r := get(t, conn, ids[0]); r.Stage != "parse" || r.Status != "running" {
		t.Errorf("row moved by its handler is %s at %s, want running at parse (the pass rolled back)", r.Status, r.Stage)
	}
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

func TestRowChangedWhileTheHandlerRanIsRunAgainOnTheNewRow(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	operator := pgtest.Connect(t, url)
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
				// Its row was read with the first message's commit; change it now.
				if _, err := operator.Exec(ctx, `UPDATE pepsi.queue SET state = '{"operator": "was here"}' WHERE ingress_id = $1`, m.ID); err != nil {
					return stage.Error(err.Error())
				}
			}
			m.State["seen"] = n
			return stage.Advance("enrich")
		}}})

	w.send(idLines(ids)) // one write: the second id's row is read ahead
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
	if r.Stage != "enrich" || r.State["operator"] != "was here" || r.State["seen"] != json.Number("2") {
		t.Errorf("changed row = %s with state %v, want enrich with the operator's state and seen 2 (the second run's transition, not the first's)", r.Stage, r.State)
	}
}

func TestRowChangedBeforeTheHandlersFirstStatementIsRunAgain(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	operator := pgtest.Connect(t, url)
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
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
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

func TestMissingIDReadAheadIsAnsweredZero(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	ids := insertRunning(t, conn, "parse", "x", "y")
	missing := ids[1] + 1000
	w := startWorker(t, stage.Options{Stage: "parse", DB: url,
		Handlers: map[string]stage.Handler{"parse": advanceTo("enrich")}})

	// One write: the missing id's row is read ahead with the first commit (and
	// found absent), the last id's with nothing before it.
	w.send(idLines([]int64{ids[0], missing, ids[1]}))
	for i, want := range []string{"0", "0", "0"} {
		if got := w.answer(); got != want {
			t.Errorf("answer %d = %q, want %q", i, got, want)
		}
	}
	for _, id := range ids {
		if r := get(t, conn, id); r.Stage != "enrich" || r.Status != "running" {
			t.Errorf("row %d is %s at %s, want running at enrich", id, r.Status, r.Stage)
		}
	}
	if !strings.Contains(w.logs.String(), "message does not exist") {
		t.Errorf("log lacks \"message does not exist\" for id %d; log:\n%s", missing, w.logs.String())
	}
}
