package queueadmin_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// A retry or a discard that waits for a row another transaction holds (a
// dispatcher's pass that fails or wakes it, another operator's discard)
// changes the row as that transaction left it, so its event comes after
// that transaction's in the message's history. Stamped at its own
// transaction's start (now()), before the wait, it came before: under a
// running dispatcher, history printed "retried: failed at s1: discarded by
// an operator" above the "failed: discarded by an operator" it retried,
// and a timeline that ended in "failed" for a message the retry had made
// pending.
func TestARetryOrDiscardThatWaitedForARowComesAfterItsEventInTheHistory(t *testing.T) {
	t.Parallel()
	url, conn := pgtest.NewMigratedConn(t)
	if _, err := conn.Exec(ctx, `SELECT pepsi.history_day((now() AT TIME ZONE 'UTC')::date, true)`); err != nil {
		t.Fatal(err)
	}
	watcher := pgtest.Connect(t, url)

	// hold changes row id as a dispatcher or another operator would, in a
	// transaction of its own that the caller commits once the tool waits
	// for the row; then it records its event, later than the tool's
	// transaction began.
	hold := func(id int64, set string) pgx.Tx {
		t.Helper()
		tx := holdRow(t, url, id)
		if _, err := tx.Exec(ctx, `UPDATE pepsi.queue SET `+set+` WHERE ingress_id = $1`, id); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	record := func(tx pgx.Tx, id int64, event, detail string) {
		t.Helper()
		time.Sleep(20 * time.Millisecond) // past the clock's resolution, and the tool's now()
		if _, err := tx.Exec(ctx, `INSERT INTO pepsi.history (ingress_id, stage, event, detail, at) VALUES ($1, 'a', $2, $3, clock_timestamp())`, id, event, detail); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	last := func(id int64) queueadmin.HistoryRow {
		t.Helper()
		hist, err := queueadmin.History(ctx, conn, id)
		if err != nil || len(hist) == 0 {
			t.Fatalf("history of %d: %v, %d events", id, err, len(hist))
		}
		return hist[len(hist)-1]
	}
	type result struct {
		n   int64
		err error
	}

	// A retry waits for a failed row another operator's discard holds.
	var failed int64
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, status, payload, state)
		VALUES ('a', 'failed', 'x', '{"dispatch_error": "exit 1"}') RETURNING ingress_id`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	tx := hold(failed, `state = jsonb_set(state, '{dispatch_error}', '"discarded"')`)
	retried := make(chan result, 1)
	go func() {
		n, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{ID: failed})
		retried <- result{n, err}
	}()
	pgtest.WaitForLockWait(t, watcher, "%dispatch_error_history%")
	record(tx, failed, "failed", "discarded")
	if r := <-retried; r.err != nil || r.n != 1 {
		t.Fatalf("retry = %d, %v; want 1", r.n, r.err)
	}
	if h := last(failed); h.Event != "retried" || h.Detail != "failed at a: discarded" {
		t.Errorf("the last event of the retried message is %s: %s; want retried: failed at a: discarded (the retry came after the discard it undid)", h.Event, h.Detail)
	}

	// A discard waits for a paused row a dispatcher's wake holds.
	var paused int64
	if err := conn.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, status, payload, timeout)
		VALUES ('a', 'paused', 'y', now() + interval '1 hour') RETURNING ingress_id`).Scan(&paused); err != nil {
		t.Fatal(err)
	}
	tx = hold(paused, `status = 'pending', timeout = NULL`)
	discarded := make(chan result, 1)
	go func() {
		n, err := queueadmin.Discard(ctx, conn, queueadmin.Selection{ID: paused}, "", false)
		discarded <- result{n, err}
	}()
	pgtest.WaitForLockWait(t, watcher, "%SET status = 'failed', timeout = NULL%")
	record(tx, paused, "woken", "")
	if r := <-discarded; r.err != nil || r.n != 1 {
		t.Fatalf("discard = %d, %v; want 1", r.n, r.err)
	}
	if h := last(paused); h.Event != "failed" {
		t.Errorf("the last event of the discarded message is %s; want failed (the discard came after the wake it followed)", h.Event)
	}
}
