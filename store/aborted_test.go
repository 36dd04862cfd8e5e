package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// aborted says whether a failed step's Claimed and Resolved results say the
// transaction certainly did not commit, and fails the test if they disagree.
func aborted(t *testing.T, evs []core.Event) bool {
	t.Helper()
	var got []bool
	for _, ev := range evs {
		switch e := ev.(type) {
		case core.Claimed:
			got = append(got, e.Aborted)
		case core.Resolved:
			got = append(got, e.Aborted)
		}
		if errText(ev) == "" {
			t.Fatalf("result %v has no error; want the step to fail", ev)
		}
	}
	if len(got) != 2 || got[0] != got[1] {
		t.Fatalf("Aborted of the claim and the resolve: %v; want two equal flags", got)
	}
	return got[0]
}

// A step whose session is ended while a statement before the COMMIT runs
// (pg_terminate_backend: the server answers FATAL there) certainly did not
// commit: its Claimed and Resolved say Aborted, so the core neither resets nor
// doubts its items. One cut off by its context while it waits has no answer:
// it may have committed, and is not Aborted.
func TestASessionEndedBeforeTheCommitIsReportedAborted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 2)
	cmds := func(op int64) []core.Command {
		return []core.Command{
			core.Claim{Op: op, Caps: []core.Cap{{Stage: "a", N: 1}}},
			core.Resolve{Op: op + 1, Items: []core.Item{{ID: ids[1], Stage: "a", Verdict: core.Requeue}}},
		}
	}
	mustExec(t, h, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 2}}}})
	ctx := context.Background()
	// Another session holds the row the resolve writes, so the step waits there.
	lockRow(t, h.url, ids[1])
	blocker := pgtest.Connect(t, h.url)

	done := make(chan []core.Event, 1)
	go func() { done <- h.Exec(ctx, cmds(2)) }()
	var pid int32
	for deadline := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the step never waited for the row lock")
		}
		err := blocker.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := blocker.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if evs := <-done; !aborted(t, evs) {
		t.Errorf("a step whose session was ended before its COMMIT: %v; want Aborted", evs)
	}

	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if evs := h.Exec(tctx, cmds(4)); aborted(t, evs) {
		t.Errorf("a step cut off by its context without an answer: %v; want not Aborted (it may have committed)", evs)
	}
}

// A session ended while its COMMIT runs leaves the transaction in doubt: the
// COMMIT may have taken effect before the FATAL. The queue then asks the
// server what became of the transaction (pg_xact_status): here a deferred
// trigger holds the COMMIT back, the session is ended during it, and the
// transaction aborted, so the results say Aborted.
func TestASessionEndedDuringTheCommitIsLookedUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 1)
	ctx := context.Background()
	_, err := h.pool.Exec(ctx, `
		CREATE FUNCTION public.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(60); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON pepsi.queue
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.slow_commit();`)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan []core.Event, 1)
	go func() {
		done <- h.Exec(ctx, []core.Command{
			core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 1}}},
			core.Resolve{Op: 2, Items: []core.Item{{ID: ids[0] + 1000, Stage: "a", Verdict: core.Requeue}}},
		})
	}()
	var pid int32
	for deadline := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the COMMIT never ran the deferred trigger")
		}
		err := h.pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE wait_event = 'PgSleep' AND datname = current_database()`).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	evs := <-done
	if !strings.Contains(errText(evs[0]), "commit") {
		t.Fatalf("results %v; want the COMMIT to have failed", evs)
	}
	if !aborted(t, evs) {
		t.Errorf("a COMMIT cut off by an ended session, of a transaction the server says aborted: %v; want Aborted", evs)
	}
	if _, status, _, _, _ := h.Row(t, ids[0]); status != "pending" {
		t.Errorf("row %d is %s, want pending (the claim aborted)", ids[0], status)
	}
}
