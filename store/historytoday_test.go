package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// pepsi-queue retry and discard make today's partition of pepsi.history
// (UTC) before they write their rows at now(): in the same transaction, so
// that it is the day of that now(). Made in a transaction of its own, it
// was the day before for a retry begun at midnight, whose rows were then
// refused when no dispatcher had made the days ahead. Checked here by the
// transaction that made the partition and the one that wrote the row (the
// test cannot move the server's clock past midnight): they are one.
func TestRetryAndDiscardMakeTodaysHistoryInTheTransactionThatWritesIt(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	q := store.On(conn)
	dropToday := func() {
		t.Helper()
		if _, err := conn.Exec(t.Context(), `DO $$ BEGIN
			EXECUTE format('DROP TABLE pepsi.%I', 'history_' || to_char((now() AT TIME ZONE 'UTC')::date, 'YYYYMMDD'));
		END $$`); err != nil {
			t.Fatal(err)
		}
	}
	// The transactions (top-level: the partition is made in a
	// subtransaction) of each partition made and each history row written.
	if _, err := conn.Exec(t.Context(), `
		CREATE TABLE made (xid bigint, what text);
		CREATE FUNCTION made_partition() RETURNS event_trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO made VALUES (txid_current(), 'partition'); END $$;
		CREATE EVENT TRIGGER made_partition ON ddl_command_end WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION made_partition();
		CREATE FUNCTION made_row() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO made VALUES (txid_current(), 'row'); RETURN NULL; END $$;
		CREATE TRIGGER made_row AFTER INSERT ON pepsi.history FOR EACH STATEMENT EXECUTE FUNCTION made_row();`); err != nil {
		t.Fatal(err)
	}
	sameTxn := func(what string) {
		t.Helper()
		var partitions, rows, apart int
		err := conn.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE what = 'partition'), count(*) FILTER (WHERE what = 'row'),
			(SELECT count(DISTINCT xid) FROM made) FROM made`).Scan(&partitions, &rows, &apart)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if partitions != 1 || rows != 1 || apart != 1 {
			t.Errorf("%s: %d partitions made, %d writes of history rows, in %d transactions; want one of each, in one", what, partitions, rows, apart)
		}
		if _, err := conn.Exec(t.Context(), `DELETE FROM made`); err != nil {
			t.Fatal(err)
		}
	}
	var failed, pending int64
	if err := conn.QueryRow(t.Context(), `INSERT INTO pepsi.queue (stage, status) VALUES ('a', 'failed') RETURNING ingress_id`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(t.Context(), `INSERT INTO pepsi.queue (stage) VALUES ('a') RETURNING ingress_id`).Scan(&pending); err != nil {
		t.Fatal(err)
	}

	dropToday()
	if n, err := q.Retry(t.Context(), store.RetryParams{ID: failed, Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("retry: %d, %v; want 1", n, err)
	}
	sameTxn("retry")

	if _, err := conn.Exec(t.Context(), `DELETE FROM pepsi.history`); err != nil {
		t.Fatal(err)
	}
	dropToday()
	if n, err := q.Discard(t.Context(), store.DiscardParams{Selection: store.Selection{ID: pending, Statuses: []core.RowStatus{core.StatusPending}}, DispatchError: "not wanted"}); err != nil || n != 1 {
		t.Fatalf("discard: %d, %v; want 1", n, err)
	}
	sameTxn("discard")
}

// A retry whose own statement the server cannot prepare (a database whose
// schema lacks a column the statement names) says that, not that today's
// history partition could not be made: pgx reports a batch's preparation
// failure from the batch's first result, the partition's.
func TestARetryThatCannotBePreparedIsNotBlamedOnTheHistoryPartition(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(t.Context(), `ALTER TABLE pepsi.queue RENAME COLUMN ready_at TO ready_at_gone`); err != nil {
		t.Fatal(err)
	}
	_, err := store.On(conn).Retry(t.Context(), store.RetryParams{ID: 1, Statuses: []core.RowStatus{core.StatusFailed}})
	if err == nil || strings.Contains(err.Error(), "history partition") || !strings.Contains(err.Error(), "ready_at") {
		t.Errorf("retry against a queue without ready_at: %v; want its own statement's error, naming ready_at, not the partition", err)
	}
}

// pepsi.history_keep, asked to make today's partition while another
// session holds pepsi.history past the caller's lock_timeout, fails with
// the lock timeout (55P03), not success with the day missing: the
// dispatcher's queue sessions have a lock_timeout, and a day read as made
// made every history row of it refused, naming neither the lock nor its
// holder (schema 35).
func TestHistoryKeepThatCannotMakeTodayInTimeSaysSo(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	ctx := t.Context()
	if _, err := conn.Exec(ctx, `DO $$ BEGIN
		EXECUTE format('DROP TABLE pepsi.%I', 'history_' || to_char((now() AT TIME ZONE 'UTC')::date, 'YYYYMMDD'));
	END $$`); err != nil {
		t.Fatal(err)
	}
	holder, err := pgtest.Connect(t, url).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // the test's end
	if _, err := holder.Exec(ctx, `LOCK TABLE pepsi.history IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET lock_timeout = '200ms'`); err != nil {
		t.Fatal(err)
	}
	var covered time.Time
	err = conn.QueryRow(ctx, `SELECT pepsi.history_keep(now(), now(), now() + interval '2 days', now() - interval '30 days')`).Scan(&covered)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Errorf("history_keep with today's partition locked out: covered %v, err %v; want the lock timeout (55P03)", covered, err)
	}
}
