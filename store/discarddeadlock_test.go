package store_test

import (
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// A discard batch and another transaction that lock the same two rows in
// opposite orders, as the dispatcher's does (it writes the rows it resolves
// and releases, then claims): PostgreSQL ends one of them as a deadlock's
// victim. Here it is the discard (the other session waits 30 s before it
// looks for a deadlock), which must run its batch again once the other has
// gone on, not stop with "deadlock detected" having discarded nothing: found
// in a run of pepsi-queue discard beside a dispatcher handing order keys on.
func TestADiscardBatchThatADeadlockRolledBackRunsAgain(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	var first, second int64
	if err := conn.QueryRow(t.Context(), `WITH ins AS (INSERT INTO pepsi.queue (stage, payload) VALUES ('a', 'x'), ('a', 'y') RETURNING ingress_id)
		SELECT min(ingress_id), max(ingress_id) FROM ins`).Scan(&first, &second); err != nil {
		t.Fatal(err)
	}
	other := pgtest.Connect(t, url)
	tx, err := other.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	if _, err := tx.Exec(t.Context(), `SET LOCAL deadlock_timeout = '30s'`); err != nil {
		t.Fatal(err)
	}
	var otherPID int
	if err := tx.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), `UPDATE pepsi.queue SET updated_at = now() WHERE ingress_id = $1`, second); err != nil {
		t.Fatal(err)
	}
	// PostgreSQL looks for a deadlock once, deadlock_timeout after a wait
	// began: the discard's look must come after the other transaction began
	// to wait too, which on a loaded machine may take more than the default
	// second (and less than the other's 30 s, so the discard is the victim).
	if _, err := conn.Exec(t.Context(), `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET deadlock_timeout = ''5s''', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	operator := store.On(pgtest.Connect(t, url))
	discarded := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = operator.Discard(t.Context(), store.DiscardParams{
			Selection:     store.Selection{Stage: "a", Statuses: []core.RowStatus{core.StatusPending}},
			DispatchError: "discarded by an operator (pepsi-queue discard)",
		})
		discarded <- err
	}()
	// The discard has locked the first row and waits for the second.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := conn.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)) AND datname = current_database())`, otherPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the discard never waited for the row the other transaction holds")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Now the other transaction wants the first row: a deadlock, whose
	// victim is the discard; this update then goes through.
	if _, err := tx.Exec(t.Context(), `UPDATE pepsi.queue SET updated_at = now() WHERE ingress_id = $1`, first); err != nil {
		t.Fatalf("the other transaction's update: %v", err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-discarded; err != nil || n != 2 {
		t.Fatalf("discard: %d messages, %v; want both discarded, its batch run again after the deadlock", n, err)
	}
	var failed, events int64
	if err := conn.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM pepsi.queue WHERE status = 'failed'),
		(SELECT count(*) FROM pepsi.history WHERE event = 'failed')`).Scan(&failed, &events); err != nil {
		t.Fatal(err)
	}
	if failed != 2 || events != 2 {
		t.Errorf("%d messages failed, %d failed events in their history; want 2 and 2, once each", failed, events)
	}
}
