package store_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The tests of schema 27: pepsi.queue has no trigger on UPDATE, and the
// writers do what schemas 11, 13 and 21's update triggers did.

const goodTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// Schema 27: no trigger of pepsi.queue fires on an UPDATE (any row trigger
// costs every row version the dispatcher writes; docs/performance.md,
// "Schema 27"). A traceparent an UPDATE writes is therefore not checked by
// the database, and one an INSERT gives still is; no remaining trigger calls
// a function of PEPSI's in its WHEN clause.
func TestSchema27FiresNoTriggerOnAQueueUpdate(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	var updates []string
	rows, err := h.pool.Query(ctx, `SELECT tgname FROM pg_trigger
		WHERE tgrelid = 'pepsi.queue'::regclass AND NOT tgisinternal AND tgtype & 16 <> 0`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		updates = append(updates, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(updates) > 0 {
		t.Errorf("triggers on UPDATE of pepsi.queue: %v; want none", updates)
	}
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	checkTriggerWhens(t, conn.Conn(), "queue_traceparent_insert")

	ids := h.Insert(t, "a", 1)
	if tag := h.exec(t, `UPDATE pepsi.queue SET traceparent = upper($2) WHERE ingress_id = $1`, ids[0], goodTrace); tag.RowsAffected() != 1 {
		t.Errorf("an update to an upper-case traceparent changed %d rows; want 1", tag.RowsAffected())
	}
	_, err = h.pool.Exec(ctx, `INSERT INTO pepsi.queue (stage, traceparent) VALUES ('a', upper($1))`, goodTrace)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "queue_traceparent_check" {
		t.Errorf("an insert of an upper-case traceparent: %v; want check_violation of queue_traceparent_check", err)
	}
}

// A traceparent that is not well-formed, which only an UPDATE can have
// written since schema 27, counts as none where PEPSI reads it: the claim's
// trace context of the message and of its pass (what an INPUT = message
// line and the exported span carry), and the stage library's read. A
// well-formed one beside it is read as before.
func TestAMalformedTraceparentIsReadAsNone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 3)
	// ids[0]'s is upper case; ids[2]'s is bad only where a pass's traceparent
	// puts the pass's span id (reading the pass's must not hide it).
	h.exec(t, `UPDATE pepsi.queue SET traceparent = CASE ingress_id WHEN $1 THEN upper($4) WHEN $2 THEN $4
		ELSE left($4, 36) || 'ZZZZZZZZZZZZZZZZ' || right($4, 3) END
		WHERE ingress_id IN ($1, $2, $3)`, ids[0], ids[1], ids[2], goodTrace)
	ev := mustExec(t, h, []core.Command{core.Claim{Op: 1, Traces: true, Caps: []core.Cap{{Stage: "a", N: 3}}}})[0].(core.Claimed)
	if len(ev.Rows) != 3 {
		t.Fatalf("claimed %v; want the three rows", ev.Rows)
	}
	for _, r := range ev.Rows {
		switch {
		case r.ID != ids[1] && r.Trace != (core.Trace{}):
			t.Errorf("row %d, its traceparent malformed: claimed with trace %+v; want none", r.ID, r.Trace)
		case r.ID == ids[1] && (r.Trace.Message != goodTrace || len(r.Trace.Pass) != 55):
			t.Errorf("row %d, its traceparent well-formed: claimed with trace %+v; want the message's and its pass's", r.ID, r.Trace)
		}
	}
	read, err := h.StageRead(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range read {
		if want := r.ID == ids[1]; (r.TraceParent != "") != want {
			t.Errorf("the stage library read row %d with traceparent %q; want one: %v", r.ID, r.TraceParent, want)
		}
	}
}

// retried makes row id, pending at stage, a row retried once there and
// claimed again: running at stage with attempts 1. op is the first of the
// four ops it uses.
func retried(t *testing.T, h *harness, id int64, stage string, op int64) {
	t.Helper()
	mustExec(t, h, []core.Command{core.Claim{Op: op, Caps: []core.Cap{{Stage: stage, N: 1}}}})
	mustExec(t, h, []core.Command{core.Resolve{Op: op + 1, Items: []core.Item{
		{ID: id, Stage: stage, Verdict: core.Retry, Reason: "later", Until: time.Now().Add(-time.Minute)},
	}}})
	mustExec(t, h, []core.Command{core.Wake{Op: op + 2, Now: time.Now()}})
	rows := mustExec(t, h, []core.Command{core.Claim{Op: op + 3, Caps: []core.Cap{{Stage: stage, N: 1}}}})[0].(core.Claimed).Rows
	if len(rows) != 1 || rows[0].ID != id || rows[0].Attempts != 1 {
		t.Fatalf("claim after a retry at %s: %v; want row %d with attempts 1", stage, rows, id)
	}
}

// attemptsAndReadyAge reads row id's attempts and how long ago it was last
// ready.
func attemptsAndReadyAge(t *testing.T, h *harness, id int64) (int, time.Duration) {
	t.Helper()
	var attempts int
	var us int64
	if err := h.pool.QueryRow(t.Context(), `SELECT attempts, (extract(epoch FROM now() - ready_at) * 1e6)::bigint
		FROM pepsi.queue WHERE ingress_id = $1`, id).Scan(&attempts, &us); err != nil {
		t.Fatal(err)
	}
	return attempts, time.Duration(us) * time.Microsecond
}

// A stage program that writes its advance itself (no trigger sees it since
// schema 27) leaves the row's attempts and ready_at as they were; the
// dispatcher's requeue of the advanced row makes it ready at the new stage
// then, with attempts 0.
func TestTheRequeueOfARowItsStageAdvancedMakesItReadyWithNoAttempts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 1)
	retried(t, h, ids[0], "a", 1)
	h.exec(t, `UPDATE pepsi.queue SET ready_at = now() - interval '1 hour'`)
	h.Stage(t, ids[0], "a", "b", core.StatusRunning, time.Time{})
	if attempts, age := attemptsAndReadyAge(t, h, ids[0]); attempts != 1 || age < 59*time.Minute {
		t.Fatalf("after the stage's own advance: attempts %d, ready %v ago; want 1, an hour (what the stage wrote is all that changed)", attempts, age)
	}
	out := mustExec(t, h, []core.Command{core.Resolve{Op: 5, Items: []core.Item{
		{ID: ids[0], Stage: "a", Verdict: core.Answered, Reason: "stuck"},
	}}})[0].(core.Resolved).Outcomes
	if len(out) != 1 || out[0].Stage != "b" || out[0].Status != core.StatusPending || out[0].Matched {
		t.Fatalf("resolve of the advanced row: %+v; want it requeued pending at b", out)
	}
	if attempts, age := attemptsAndReadyAge(t, h, ids[0]); attempts != 0 || age > time.Minute {
		t.Errorf("requeued at b: attempts %d, ready %v ago; want 0, now", attempts, age)
	}
}

// A retried row that a tool moves to another stage with its own UPDATE
// (which no trigger sees since schema 27) keeps its attempts in the column;
// the claim at the new stage counts them as 0, since they were counted at
// another stage (attempts_stage), and a claim at the stage of the retry
// keeps them.
func TestAClaimCountsNoAttemptsMadeAtAnotherStage(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 2)
	retried(t, h, ids[0], "a", 1)
	retried(t, h, ids[1], "a", 5)
	mustExec(t, h, []core.Command{core.Resolve{Op: 9, Items: []core.Item{
		{ID: ids[0], Stage: "a", Verdict: core.Retry, Reason: "later", Until: time.Now().Add(time.Hour)},
		{ID: ids[1], Stage: "a", Verdict: core.Retry, Reason: "later", Until: time.Now().Add(time.Hour)},
	}}})
	h.exec(t, `UPDATE pepsi.queue SET status = 'pending', timeout = NULL,
		stage = CASE WHEN ingress_id = $1 THEN 'b' ELSE stage END WHERE ingress_id IN ($1, $2)`, ids[0], ids[1])
	want := map[int64]core.Row{ids[0]: {ID: ids[0], Stage: "b"}, ids[1]: {ID: ids[1], Stage: "a", Attempts: 2}}
	rows := mustExec(t, h, []core.Command{core.Claim{Op: 10, Caps: []core.Cap{{Stage: "a", N: 1}, {Stage: "b", N: 1}}}})[0].(core.Claimed).Rows
	if len(rows) != 2 {
		t.Fatalf("claimed %v; want both rows", rows)
	}
	for _, r := range rows {
		if r != want[r.ID] {
			t.Errorf("claimed %+v; want %+v", r, want[r.ID])
		}
	}
	if attempts, _ := attemptsAndReadyAge(t, h, ids[0]); attempts != 0 {
		t.Errorf("row %d claimed at b: attempts %d in the column; want 0", ids[0], attempts)
	}
}

// The stage library's own transition to another stage sets attempts to 0
// and ready_at to now, as the trigger of schemas 11 and 13 did (the requeue
// that would set them is lost if the dispatcher dies first); a transition at
// the same stage keeps both.
func TestTheStageLibrarysMoveSetsAttemptsAndReadyAt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 2)
	retried(t, h, ids[0], "a", 1)
	retried(t, h, ids[1], "a", 5)
	h.exec(t, `UPDATE pepsi.queue SET ready_at = now() - interval '1 hour'`)
	for _, p := range []store.StageTransitionParams{
		{ID: ids[0], From: "a", Stage: "b", Status: core.StatusRunning, State: []byte(`{}`)},
		{ID: ids[1], From: "a", Stage: "a", Status: core.StatusDone, State: []byte(`{}`)},
	} {
		if moved, err := h.StageTransition(t.Context(), p); err != nil || !moved {
			t.Fatalf("transition %+v: moved %v, %v", p, moved, err)
		}
	}
	if attempts, age := attemptsAndReadyAge(t, h, ids[0]); attempts != 0 || age > time.Minute {
		t.Errorf("moved to b by the library: attempts %d, ready %v ago; want 0, now", attempts, age)
	}
	if attempts, age := attemptsAndReadyAge(t, h, ids[1]); attempts != 1 || age < 59*time.Minute {
		t.Errorf("done at a by the library: attempts %d, ready %v ago; want 1, the hour it had", attempts, age)
	}
}

// pepsi.order_release (schema 27's) makes a key's next message ready when it
// makes it pending (schema 13's trigger did), and keeps ready_at for one it
// makes paused (its retry not yet due: the wake makes it ready).
func TestAReleaseMakesTheKeysNextMessageReadyNow(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	head := h.InsertKeyed(t, "a", "k")
	next := h.InsertKeyed(t, "a", "k")
	// Key j's second message is scheduled an hour ahead: released, it is
	// paused until then.
	headJ := h.InsertKeyed(t, "a", "j")
	var later int64
	if err := h.pool.QueryRow(t.Context(), `INSERT INTO pepsi.queue (stage, order_key, status, timeout)
		VALUES ('a', 'j', 'paused', now() + interval '1 hour') RETURNING ingress_id`).Scan(&later); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{next, later} {
		if _, status, _, _, _ := h.Row(t, id); status != core.StatusBlocked {
			t.Fatalf("message %d is %s; want blocked behind its key's first", id, status)
		}
	}
	mustExec(t, h, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 2}}}})
	mustExec(t, h, []core.Command{core.Resolve{Op: 2, Items: []core.Item{
		{ID: head, Stage: "a", Verdict: core.Move, To: core.TargetDone, Key: "k"},
		{ID: headJ, Stage: "a", Verdict: core.Move, To: core.TargetDone, Key: "j"},
	}}})
	h.exec(t, `UPDATE pepsi.queue SET ready_at = now() - interval '1 hour' WHERE ingress_id IN ($1, $2)`, next, later)
	mustExec(t, h, []core.Command{core.Release{Op: 3, Keys: []string{"k", "j"}}})
	for _, c := range []struct {
		id     int64
		status core.RowStatus
		ready  bool
	}{{next, core.StatusPending, true}, {later, core.StatusPaused, false}} {
		if _, status, _, _, _ := h.Row(t, c.id); status != c.status {
			t.Fatalf("after the release message %d is %s; want %s", c.id, status, c.status)
		}
		if _, age := attemptsAndReadyAge(t, h, c.id); (age < time.Minute) != c.ready {
			t.Errorf("message %d released %s: ready %v ago; want now: %v (paused, the wake makes it ready)", c.id, c.status, age, c.ready)
		}
	}
}

// Schema 27 writes attempts_stage for the unfinished rows that were retried
// before it (their attempts were counted where they are), and for no other.
func TestSchema27NamesTheStageOfEarlierRetries(t *testing.T) {
	t.Parallel()
	conn := migratedTo(t, 26)
	execAll(t, conn, `INSERT INTO pepsi.queue (stage, status, attempts, timeout) VALUES
		('a', 'paused', 2, now()), ('b', 'pending', 1, NULL), ('c', 'done', 3, NULL), ('d', 'pending', 0, NULL)`)
	if _, err := store.MigrateTo(t.Context(), conn, 27); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(t.Context(), `SELECT stage || ':' || coalesce(attempts_stage, '-') FROM pepsi.queue ORDER BY ingress_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if want := []string{"a:a", "b:b", "c:-", "d:-"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("stage:attempts_stage after schema 27: %v, %v; want %v", got, err, want)
	}
}

// A row its stage advanced itself just before the dispatcher that held it
// died (no trigger sees that advance since schema 27) is made pending at its
// new stage by the orphan reset with attempts 0, counted at the stage before
// (attempts_stage), in the row and in the reset's history row.
func TestTheOrphanResetCountsNoAttemptsMadeAtAnotherStage(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 1)
	retried(t, h, ids[0], "a", 1)
	h.Stage(t, ids[0], "a", "b", core.StatusRunning, time.Time{})
	ev := mustExec(t, h, []core.Command{core.ResetOrphans{Op: 5, Now: time.Now()}})[0].(core.OrphansReset)
	if ev.Count != 1 {
		t.Fatalf("reset %d rows; want the advanced one", ev.Count)
	}
	if stage, status, _, _, _ := h.Row(t, ids[0]); stage != "b" || status != core.StatusPending {
		t.Fatalf("after the reset the row is %s at %s; want pending at b", status, stage)
	}
	if attempts, _ := attemptsAndReadyAge(t, h, ids[0]); attempts != 0 {
		t.Errorf("reset at b: attempts %d; want 0 (the retry was at a)", attempts)
	}
	var recorded int
	if err := h.pool.QueryRow(t.Context(), `SELECT attempts FROM pepsi.history WHERE ingress_id = $1 AND event = 'reset'`, ids[0]).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if recorded != 0 {
		t.Errorf("the reset's history row has attempts %d; want 0", recorded)
	}
}
