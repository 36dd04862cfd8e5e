package queueadmin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

var ctx = context.Background()

// setRow forces a row into a status (and stage, state and age) the way the
// dispatcher or a stage would have left it.
func setRow(t *testing.T, conn *pgx.Conn, id int64, stage, status, state string, age time.Duration) {
	t.Helper()
	_, err := conn.Exec(ctx, `UPDATE pepsi.queue SET stage = $2, status = $3, state = $4,
		updated_at = now() - make_interval(secs => $5), ready_at = now() - make_interval(secs => $5) WHERE ingress_id = $1`, id, stage, status, state, age.Seconds())
	if err != nil {
		t.Fatalf("set row %d: %v", id, err)
	}
}

func enqueue(t *testing.T, conn *pgx.Conn, stage string, n int) queueadmin.Range {
	t.Helper()
	msgs := make([]queueadmin.NewMessage, n)
	for i := range msgs {
		msgs[i].Payload = []byte(fmt.Sprintf("m%d", i+1))
	}
	r, err := queueadmin.Enqueue(ctx, conn, stage, msgs)
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return r
}

func TestEnqueueInsertsPendingRowsInOrderAndNotifiesOnce(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	listener := pgtest.Listen(t, url)
	pgtest.HoldGate(t, url) // a dispatcher waits for work: the insert notifies
	msgs := []queueadmin.NewMessage{
		{Payload: []byte("first")},
		{Payload: []byte{0, 255, '\n'}, State: json.RawMessage(`{"from": "test", "n": 2}`)},
		{Payload: []byte("third")},
	}
	r, err := queueadmin.Enqueue(ctx, conn, "parse", msgs)
	if err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	if r.Count != 3 || r.Last-r.First != 2 {
		t.Fatalf("Enqueue range = %+v, want 3 contiguous ids", r)
	}
	for i, m := range msgs {
		got, err := queueadmin.Show(ctx, conn, r.First+int64(i))
		if err != nil {
			t.Fatalf("Show(%d): %v", r.First+int64(i), err)
		}
		wantState := "{}"
		if m.State != nil {
			wantState = `{"n": 2, "from": "test"}`
		}
		if got.Stage != "parse" || got.Status != "pending" || string(got.Payload) != string(m.Payload) || string(got.State) != wantState {
			t.Errorf("row %d = stage %s status %s payload %q state %s; want pending at parse, payload %q, state %s",
				i, got.Stage, got.Status, got.Payload, got.State, m.Payload, wantState)
		}
	}
	n, err := listener.WaitForNotification(ctx)
	if err != nil || n.Channel != "ingress" {
		t.Fatalf("notification = %v, %v; want one on ingress", n, err)
	}
}

func TestEnqueueRefusesABadStateAndTooLargeABatch(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	_, err := queueadmin.Enqueue(ctx, conn, "parse", []queueadmin.NewMessage{{State: json.RawMessage(`[1]`)}})
	if err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("Enqueue with state [1] = %v, want refused as not a JSON object", err)
	}
	_, err = queueadmin.Enqueue(ctx, conn, "parse", make([]queueadmin.NewMessage, queueadmin.EnqueueBatchMax+1))
	if err == nil {
		t.Errorf("Enqueue of %d messages succeeded, want refused", queueadmin.EnqueueBatchMax+1)
	}
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pepsi.queue").Scan(&rows); err != nil || rows != 0 {
		t.Errorf("queue has %d rows (err %v) after refused enqueues, want 0", rows, err)
	}
}

func TestReadStatsCountsPerStageAndStatusAndReadsStatistics(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	r := enqueue(t, conn, "parse", 6)
	setRow(t, conn, r.First, "parse", "pending", "{}", time.Hour) // the oldest pending
	setRow(t, conn, r.First+1, "enrich", "running", "{}", 0)
	setRow(t, conn, r.First+2, "enrich", "done", "{}", 0)
	setRow(t, conn, r.First+3, "enrich", "failed", "{}", 0)
	_, err := conn.Exec(ctx, `INSERT INTO pepsi.stage_stats (stage, processed, failed, processing_us) VALUES ('parse', 7, 1, 900);
		UPDATE pepsi.dispatch_stats SET stage_passes = 9, messages_left = 2`)
	if err != nil {
		t.Fatal(err)
	}

	s, err := queueadmin.ReadStats(ctx, conn)
	if err != nil {
		t.Fatalf("ReadStats: %v", err)
	}
	var got []string
	for _, d := range s.Depth {
		got = append(got, fmt.Sprintf("%s/%s=%d", d.Stage, d.Status, d.Count))
	}
	want := "[enrich/running=1 enrich/done=1 enrich/failed=1 parse/pending=3]"
	if fmt.Sprint(got) != want {
		t.Errorf("depth = %v, want %s", got, want)
	}
	if w := s.Depth[3].OldestWait; w < 59*time.Minute || w > 61*time.Minute {
		t.Errorf("oldest pending wait at parse = %v, want about an hour", w)
	}
	if s.Count(core.StatusPending) != 3 || s.Count(core.StatusDone) != 1 {
		t.Errorf("Count(pending) = %d, Count(done) = %d; want 3 and 1", s.Count(core.StatusPending), s.Count(core.StatusDone))
	}
	if len(s.Stages) != 1 || s.Stages[0].Stage != "parse" || s.Stages[0].Processed != 7 || s.Stages[0].ProcessingUS != 900 {
		t.Errorf("stage stats = %+v, want parse processed 7, 900 µs", s.Stages)
	}
	if s.Dispatch.StagePasses != 9 || s.Dispatch.MessagesLeft != 2 {
		t.Errorf("dispatch stats = %+v, want 9 passes, 2 left", s.Dispatch)
	}
}

func TestShowReportsTheRowOrNotFound(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	r := enqueue(t, conn, "parse", 1)
	if _, err := conn.Exec(ctx, `UPDATE pepsi.queue SET status = 'paused', timeout = '2030-01-01Z' WHERE ingress_id = $1`, r.First); err != nil {
		t.Fatal(err)
	}
	m, err := queueadmin.Show(ctx, conn, r.First)
	if err != nil {
		t.Fatalf("Show: %v", err)
	}
	if m.Status != "paused" || m.Timeout == nil || m.Timeout.Year() != 2030 || string(m.Payload) != "m1" || m.CreatedAt.IsZero() {
		t.Errorf("Show = %+v, want paused until 2030 with payload m1", m)
	}
	if _, err := queueadmin.Show(ctx, conn, r.First+99); !errors.Is(err, queueadmin.ErrNotFound) {
		t.Errorf("Show of a missing id = %v, want ErrNotFound", err)
	}
}

func TestRetryRequeuesSelectedFailuresKeepsHistoryAndNotifies(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	listener := pgtest.Connect(t, url)
	r := enqueue(t, conn, "parse", 5)
	failedAtParse, timedOutAtDeliver, failedAtDeliver, done, running := r.First, r.First+1, r.First+2, r.First+3, r.First+4
	setRow(t, conn, failedAtParse, "parse", "failed", `{"dispatch_error": "exit 1", "k": 1}`, 0)
	setRow(t, conn, timedOutAtDeliver, "deliver", "timeout", `{"dispatch_error": "MAX_RUNTIME"}`, 0)
	setRow(t, conn, failedAtDeliver, "deliver", "failed", `{"error": "bad amount"}`, 0)
	setRow(t, conn, done, "deliver", "done", `{}`, 0)
	setRow(t, conn, running, "deliver", "running", `{}`, 0)
	// The deliver failure used up its retries (RETRY_LIMIT 3).
	if _, err := conn.Exec(ctx, "UPDATE pepsi.queue SET attempts = 3 WHERE ingress_id = $1", failedAtDeliver); err != nil {
		t.Fatal(err)
	}
	if _, err := listener.Exec(ctx, "LISTEN ingress"); err != nil {
		t.Fatal(err)
	}

	// Only timeouts at deliver: one row.
	n, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{Stage: "deliver", Statuses: []core.RowStatus{core.StatusTimeout}})
	if err != nil || n != 1 {
		t.Fatalf("Retry(deliver, timeout) = %d, %v; want 1", n, err)
	}
	if note, err := listener.WaitForNotification(ctx); err != nil || note.Channel != "ingress" {
		t.Fatalf("after Retry: notification %v, %v; want one on ingress", note, err)
	}
	// One id, sent to another stage.
	if n, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{ID: failedAtParse, To: "enrich"}); err != nil || n != 1 {
		t.Fatalf("Retry(id, to enrich) = %d, %v; want 1", n, err)
	}
	// Everything else that failed: the deliver failure only (done and running are never touched).
	if n, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{}); err != nil || n != 1 {
		t.Fatalf("Retry(all) = %d, %v; want 1", n, err)
	}
	var attempts int
	if err := conn.QueryRow(ctx, "SELECT attempts FROM pepsi.queue WHERE ingress_id = $1", failedAtDeliver).Scan(&attempts); err != nil || attempts != 0 {
		t.Errorf("attempts after retry = %d, %v; want 0 (all its retries again)", attempts, err)
	}

	check := func(id int64, stage, status string, wantState func(map[string]any) bool, what string) {
		t.Helper()
		m, err := queueadmin.Show(ctx, conn, id)
		if err != nil {
			t.Fatal(err)
		}
		var state map[string]any
		if err := json.Unmarshal(m.State, &state); err != nil {
			t.Fatal(err)
		}
		if m.Stage != stage || m.Status != status || !wantState(state) {
			t.Errorf("row %d = %s at %s, state %s; want %s at %s with %s", id, m.Status, m.Stage, m.State, status, stage, what)
		}
	}
	history := func(state map[string]any) map[string]any {
		h, _ := state["dispatch_error_history"].([]any)
		if len(h) != 1 {
			return nil
		}
		e, _ := h[0].(map[string]any)
		return e
	}
	check(timedOutAtDeliver, "deliver", "pending", func(s map[string]any) bool {
		h := history(s)
		return s["dispatch_error"] == nil && h != nil && h["error"] == "MAX_RUNTIME" && h["status"] == "timeout" && h["stage"] == "deliver" && h["retried_at"] != nil
	}, "dispatch_error moved into dispatch_error_history")
	check(failedAtParse, "enrich", "pending", func(s map[string]any) bool {
		h := history(s)
		return s["dispatch_error"] == nil && s["k"] == 1.0 && h != nil && h["error"] == "exit 1" && h["stage"] == "parse"
	}, "the rest of the state kept and the old stage in the history")
	check(failedAtDeliver, "deliver", "pending", func(s map[string]any) bool {
		h := history(s)
		return s["error"] == "bad amount" && h != nil && h["error"] == nil && h["status"] == "failed"
	}, "a history entry without error (the stage's own state.error is the stage's)")
	check(done, "deliver", "done", func(s map[string]any) bool { return len(s) == 0 }, "done untouched")
	check(running, "deliver", "running", func(s map[string]any) bool { return len(s) == 0 }, "running untouched")

	if _, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{Statuses: []core.RowStatus{core.StatusRunning}}); err == nil {
		t.Errorf("Retry of running rows succeeded; want refused")
	}
}

func TestRetryOfNothingDoesNotNotify(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	listener := pgtest.Listen(t, url)
	if n, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{ID: 12345}); err != nil || n != 0 {
		t.Fatalf("Retry of a missing id = %d, %v; want 0, nil", n, err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if note, err := listener.WaitForNotification(short); err == nil {
		t.Errorf("notification %v after a retry that moved nothing; want none", note)
	}
}

// A retry that fails says "retry: " once, not once for each layer it
// passed through.
func TestARetrysErrorSaysRetryOnce(t *testing.T) {
	t.Parallel()
	_, conn := pgtest.NewMigratedConn(t)
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	_, err := queueadmin.Retry(stopped, conn, queueadmin.RetryFilter{ID: 1})
	if err == nil || !strings.HasPrefix(err.Error(), "retry: ") || strings.Contains(err.Error(), "retry: retry") {
		t.Errorf("Retry with its context cancelled: %v; want one error that begins \"retry: \" once", err)
	}
}

func TestPurgeDeletesOldFinishedRowsInBatches(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	r := enqueue(t, conn, "parse", 40)
	// Rows 1..30 are old: 10 done, 10 failed, 10 timeout; among them one is old but
	// paused, one old but running. Rows 31..40 are recent and done.
	keep := map[int64]string{}
	for i := int64(0); i < 40; i++ {
		id := r.First + i
		status := []string{"done", "failed", "timeout"}[i%3]
		age := 48 * time.Hour
		if i >= 30 {
			status, age = "done", time.Minute
			keep[id] = "recent"
		}
		setRow(t, conn, id, "deliver", status, "{}", age)
	}
	setRow(t, conn, r.First+5, "deliver", "paused", "{}", 48*time.Hour)
	setRow(t, conn, r.First+6, "deliver", "running", "{}", 48*time.Hour)
	keep[r.First+5], keep[r.First+6] = "paused", "running"

	var progress []int64
	n, err := queueadmin.Purge(ctx, conn, 24*time.Hour, 7, nil, func(total int64) { progress = append(progress, total) })
	if err != nil || n != 28 {
		t.Fatalf("Purge = %d, %v; want 28 rows deleted", n, err)
	}
	if fmt.Sprint(progress) != "[7 14 21 28]" {
		t.Errorf("progress = %v, want batches of 7: [7 14 21 28]", progress)
	}
	var left []int64
	rows, _ := conn.Query(ctx, "SELECT ingress_id FROM pepsi.queue ORDER BY ingress_id")
	left, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != len(keep) {
		t.Errorf("rows left %v, want exactly the recent, paused and running ones (%d)", left, len(keep))
	}
	for _, id := range left {
		if keep[id] == "" {
			t.Errorf("row %d survived the purge; it was old and finished", id)
		}
	}
	if _, err := queueadmin.Purge(ctx, conn, time.Hour, 10, []core.RowStatus{core.StatusPending}, nil); err == nil {
		t.Errorf("Purge of pending rows succeeded; want refused")
	}
}

func TestConnectNamesTheUnreachableHost(t *testing.T) {
	t.Parallel()
	_, err := queueadmin.Connect(ctx, "postgres://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") || !strings.Contains(err.Error(), `"nowhere"`) {
		t.Errorf("Connect to a closed port = %v, want an error naming 127.0.0.1:1 and the database", err)
	}
}

// ingress_id is a bigint: a long-lived queue passes 2^31, and retry -id must
// still find its rows (the id filter once compared against an int4 parameter).
func TestRetryByIDBeyondInt32(t *testing.T) {
	t.Parallel()
	_, conn := pgtest.NewMigratedConn(t)
	if _, err := conn.Exec(ctx, `ALTER TABLE pepsi.queue ALTER COLUMN ingress_id RESTART WITH 3000000000`); err != nil {
		t.Fatal(err)
	}
	r := enqueue(t, conn, "parse", 1)
	if r.First <= 1<<31 {
		t.Fatalf("first id %d, want one beyond 2^31", r.First)
	}
	setRow(t, conn, r.First, "parse", "failed", `{"dispatch_error": "exit 1"}`, 0)
	n, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{ID: r.First})
	if err != nil || n != 1 {
		t.Fatalf("Retry(id %d) = %d, %v; want 1", r.First, n, err)
	}
	if m, err := queueadmin.Show(ctx, conn, r.First); err != nil || m.Status != "pending" {
		t.Fatalf("after Retry: %+v, %v; want pending", m, err)
	}
}

// TestARetryCommitsBeforeItReleasesItsKeys: a producer holding an order key's
// lock (its insert trigger took it) waits for a row the retry changed (the
// dedup_key it inserts again) while the retry has yet to release that key.
// Were the retry and its release one transaction, the release would wait for
// the producer's lock and the producer for the retry's row: a deadlock, and
// the whole retry undone (found by a review: a large retry -all beside a
// producer resending a key). The retry's change commits first, so both end.
func TestARetryCommitsBeforeItReleasesItsKeys(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	var keyed, held int64
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, status, payload, order_key, dedup_key, state)
		VALUES ('a', 'failed', 'x', 'kx', 'd1', '{"dispatch_error": "exit 1"}') RETURNING ingress_id`).Scan(&keyed); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, status, payload, state)
		VALUES ('a', 'failed', 'y', '{"dispatch_error": "exit 1"}') RETURNING ingress_id`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	// A session holds the second row, so the retry's UPDATE has changed the
	// keyed row and waits there until the producer waits too.
	tx := holdRow(t, url, held)
	type result struct {
		n   int64
		err error
	}
	retried := make(chan result, 1)
	go func() {
		n, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{})
		retried <- result{n, err}
	}()
	watcher := pgtest.Connect(t, url)
	pgtest.WaitForLockWait(t, watcher, "%dispatch_error_history%")
	producer := pgtest.Connect(t, url)
	produced := make(chan error, 1)
	go func() {
		_, err := producer.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload, order_key, dedup_key) VALUES ('a', 'again', 'kx', 'd1')
			ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING`)
		produced <- err
	}()
	pgtest.WaitForLockWait(t, watcher, "%ON CONFLICT%")
	// Past deadlock_timeout (1 s by default): the producer's own deadlock
	// check finds no cycle yet, so a cycle made now would be the retry's to
	// find.
	time.Sleep(1500 * time.Millisecond)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-retried; r.err != nil || r.n != 2 {
		t.Errorf("retry = %d, %v; want both rows retried", r.n, r.err)
	}
	if err := <-produced; err != nil {
		t.Errorf("the producer's insert: %v; want it done (nothing: its key was seen before)", err)
	}
	for _, id := range []int64{keyed, held} {
		m, err := queueadmin.Show(ctx, conn, id)
		if err != nil {
			t.Fatal(err)
		}
		if m.Status != "pending" {
			t.Errorf("row %d after the retry is %s; want pending", id, m.Status)
		}
	}
}

// A discard of a large backlog (pepsi-queue discard -stage import) runs
// beside a dispatcher, whose claim of a pending row the discard has
// already changed waits for the discard's transaction: in one transaction,
// a discard of 290,000 pending rows stopped every stage of a running
// dispatcher for the 8 s it took. It commits a batch at a time instead, so
// that no write of the dispatcher waits for more than one batch.
func TestADiscardCommitsABatchAtATime(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	const rows = 2500 // more than two batches
	if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload) SELECT 'import', 'x' FROM generate_series(1, $1)`, rows); err != nil {
		t.Fatal(err)
	}
	var first, last int64
	if err := conn.QueryRow(ctx, `SELECT min(ingress_id), max(ingress_id) FROM pepsi.queue`).Scan(&first, &last); err != nil {
		t.Fatal(err)
	}
	// A session (as a dispatcher's claim would) holds the last row, so the
	// discard waits there, at its end.
	tx := holdRow(t, url, last)
	type result struct {
		n   int64
		err error
	}
	discarded := make(chan result, 1)
	go func() {
		n, err := queueadmin.Discard(ctx, conn, queueadmin.Selection{Stage: "import"}, "bad import", false)
		discarded <- result{n, err}
	}()
	watcher := pgtest.Connect(t, url)
	pgtest.WaitForLockWait(t, watcher, "%SET status = 'failed', timeout = NULL%")
	// The first rows' batch has committed: another session may change them,
	// and sees them failed.
	var status string
	if err := watcher.QueryRow(ctx, `SELECT status FROM pepsi.queue WHERE ingress_id = $1`, first).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "failed" {
		t.Errorf("while the discard waits for its last row, its first row is %s to other sessions; want failed (the first batch committed)", status)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-discarded; r.err != nil || r.n != rows {
		t.Fatalf("discard = %d, %v; want %d", r.n, r.err, rows)
	}
	var failed, events int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'failed' AND state->>'dispatch_error' LIKE 'discarded by an operator%bad import'),
		(SELECT count(*) FROM pepsi.history WHERE event = 'failed') FROM pepsi.queue`).Scan(&failed, &events); err != nil {
		t.Fatal(err)
	}
	if failed != rows || events != rows {
		t.Errorf("after the discard %d rows are failed with its reason and %d failed events recorded; want %d of each", failed, events, rows)
	}
}

// A discard in batches hands the order keys of the heads it discarded on
// only once it has walked its whole selection: handed on after each batch,
// a key's next message, made pending, would be discarded by a later batch of
// a discard of pending messages, and the next after it, one by one, where
// the operator selected only what was pending when the discard began.
func TestADiscardInBatchesDoesNotReachTheMessagesItsHeadsHandTheirKeysTo(t *testing.T) {
	t.Parallel()
	_, conn := pgtest.NewMigratedConn(t)
	head := enqueueKeyed(t, conn, "a", "k")
	enqueue(t, conn, "a", 150) // more than a batch between the head and the next of its key
	next := enqueueKeyed(t, conn, "a", "k")
	if m, err := queueadmin.Show(ctx, conn, next); err != nil || m.Status != "blocked" {
		t.Fatalf("the key's second message: %v, %v; want blocked", m, err)
	}
	n, err := queueadmin.Discard(ctx, conn, queueadmin.Selection{Stage: "a", Statuses: []core.RowStatus{core.StatusPending}}, "", false)
	if err != nil || n != 151 {
		t.Errorf("discard of the pending messages = %d, %v; want 151 (the head and the 150 others)", n, err)
	}
	for id, want := range map[int64]core.RowStatus{head: core.StatusFailed, next: core.StatusPending} {
		m, err := queueadmin.Show(ctx, conn, id)
		if err != nil {
			t.Fatal(err)
		}
		if m.Status != string(want) {
			t.Errorf("message %d after the discard is %s; want %s", id, m.Status, want)
		}
	}
}

func enqueueKeyed(t *testing.T, conn *pgx.Conn, stage, key string) int64 {
	t.Helper()
	r, err := queueadmin.Enqueue(ctx, conn, stage, []queueadmin.NewMessage{{Payload: []byte("keyed"), OrderKey: key}})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return r.First
}

// A discard stopped midway (the operator's Ctrl-C) keeps the batches it
// committed, says how many, and changes nothing more: its waiting batch is
// cancelled in the server (queueadmin.Connect's cancel request), not
// committed after the tool gave up.
func TestAnInterruptedDiscardKeepsItsBatchesAndSaysHowMany(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn, err := queueadmin.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const rows = 250 // two whole batches, then one of 50
	if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload) SELECT 'import', 'x' FROM generate_series(1, $1)`, rows); err != nil {
		t.Fatal(err)
	}
	var last int64
	if err := conn.QueryRow(ctx, `SELECT max(ingress_id) FROM pepsi.queue`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	tx := holdRow(t, url, last)
	holder := pgtest.Connect(t, url)
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = queueadmin.Discard(stop, conn, queueadmin.Selection{Stage: "import"}, "", false)
		done <- err
	}()
	pgtest.WaitForLockWait(t, pgtest.Connect(t, url), "%SET status = 'failed', timeout = NULL%")
	cancel()
	err = <-done
	if err == nil || n != 200 || !strings.Contains(err.Error(), "stopped after 200 messages discarded") {
		t.Errorf("interrupted discard = %d, %v; want 200 and an error saying so", n, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A batch still running in the server would commit now that its row is
	// free: wait until none is (it was cancelled), then count.
	pgtest.WaitForStatement(t, holder, "%SET status = 'failed', timeout = NULL%", false)
	var failed int64
	if err := holder.QueryRow(ctx, `SELECT count(*) FROM pepsi.queue WHERE status = 'failed'`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if failed != 200 {
		t.Errorf("%d messages failed after the interrupted discard; want the 200 of its committed batches", failed)
	}
}

// A discard that stops midway and then cannot hand on the order keys of
// the heads it did discard says both: that the keys are not handed on is
// what leaves the keys' next messages blocked until the dispatcher's next
// start-up, and the operator must hear it as a complete discard would say it.
func TestADiscardStoppedMidwaySaysItsKeysWereNotHandedOn(t *testing.T) {
	t.Parallel()
	_, conn := pgtest.NewMigratedConn(t)
	head := enqueueKeyed(t, conn, "a", "k")
	enqueueKeyed(t, conn, "a", "k") // blocked behind head
	enqueue(t, conn, "a", 150)      // the second batch holds the last of these
	var last int64
	if err := conn.QueryRow(ctx, `SELECT max(ingress_id) FROM pepsi.queue`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	// The second batch fails on the last row; the release of k (blocked ->
	// pending) fails too.
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF OLD.ingress_id = %d THEN RAISE EXCEPTION 'second batch refused'; END IF;
			IF OLD.status = 'blocked' THEN RAISE EXCEPTION 'release refused'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse BEFORE UPDATE ON pepsi.queue FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse()`, last)); err != nil {
		t.Fatal(err)
	}
	n, err := queueadmin.Discard(ctx, conn, queueadmin.Selection{Stage: "a", Statuses: []core.RowStatus{core.StatusPending}}, "", false)
	if err == nil || n != 100 || !strings.Contains(err.Error(), "stopped after 100 messages discarded") {
		t.Fatalf("discard = %d, %v; want 100 and an error saying it stopped", n, err)
	}
	if !strings.Contains(err.Error(), "order keys") || !strings.Contains(err.Error(), "release refused") {
		t.Errorf("discard stopped after discarding key k's head %d, whose key could not be handed on, says %q; want it to say the keys were not handed on", head, err)
	}
}

// holdRow holds row id (FOR UPDATE) in a transaction on a session of its
// own, as a dispatcher's claim would, so that a statement that changes it
// waits there; the test ends the transaction to free it (it is rolled back
// at the test's end otherwise).
func holdRow(t *testing.T, url string, id int64) pgx.Tx {
	t.Helper()
	tx, err := pgtest.Connect(t, url).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck // ended by the test already, mostly
	if _, err := tx.Exec(ctx, "SELECT 1 FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	return tx
}

// TestConnectCommitsDurablyAtReadCommittedWhateverTheDefaults: on a
// database whose sessions start at REPEATABLE READ with synchronous_commit
// off, pepsi-queue's session runs at READ COMMITTED (the order-key trigger
// refuses a keyed insert at another level, schema 36) and commits durably
// (what enqueue prints as committed survives a crash of the server).
func TestConnectCommitsDurablyAtReadCommittedWhateverTheDefaults(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	if _, err := pgtest.Connect(t, url).Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database());
		EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = ''repeatable read''', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	conn, err := queueadmin.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var commit, isolation string
	if err := conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('transaction_isolation')").Scan(&commit, &isolation); err != nil ||
		commit != "on" || isolation != "read committed" {
		t.Errorf("synchronous_commit %q, isolation %q, %v; want on, read committed", commit, isolation, err)
	}
}

// Proves: pepsi-queue's session keeps a synchronous_commit stronger than on
// (remote_apply: a commit waits for a standby to apply it), and sends no
// startup parameter of its own but its application_name (a pooler such as
// PgBouncer refuses a connection that sends others): it sets its session up
// once connected.
func TestConnectKeepsAStrongerCommitAndSendsNoStartupParameters(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	if _, err := pgtest.Connect(t, url).Exec(ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET synchronous_commit = remote_apply', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	conn, err := queueadmin.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var commit string
	if err := conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&commit); err != nil || commit != "remote_apply" {
		t.Errorf("synchronous_commit %q, %v; want remote_apply kept", commit, err)
	}
	for name := range conn.Config().RuntimeParams {
		if name != "application_name" {
			t.Errorf("startup parameter %s sent; want application_name only", name)
		}
	}
}
