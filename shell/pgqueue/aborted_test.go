package pgqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
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
	blocker, err := pgx.Connect(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`, ids[1]); err != nil {
		t.Fatal(err)
	}

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
