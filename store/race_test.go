package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// TestResolveOfARowALateCommitMovesWritesNothing forces the race of a stage's
// late commit with the dispatcher's resolve: a transaction of the stage's holds
// the row (its UPDATE done, its COMMIT not yet) while the resolve runs, so the
// resolve's UPDATE waits on the row lock; then the stage commits. Every time,
// the resolve must write nothing over what the stage committed (no verdict
// decided on the row as it was), and report the row as its snapshot saw it,
// running at the claimed stage, for the core to resolve again; the next resolve
// then sees the committed row.
func TestResolveOfARowALateCommitMovesWritesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, to, status string
		want             core.RowStatus // after the second resolve
	}{
		{"finished", "a", "done", core.StatusDone},
		{"advanced", "b", "running", core.StatusPending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			id := h.Insert(t, "a", 1)[0]
			mustExec(t, h, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 1}}}})

			stage := pgtest.Connect(t, h.url)
			tx, err := stage.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op once committed
			if _, err := tx.Exec(ctx, `UPDATE pepsi.queue SET stage = $2, status = $3
				WHERE ingress_id = $1 AND status = 'running' AND stage = 'a'`, id, tc.to, tc.status); err != nil {
				t.Fatal(err)
			}

			item := core.Item{ID: id, Stage: "a", Verdict: core.TimeOut, Reason: "no answer within MAX_RUNTIME"}
			done := make(chan []core.Event, 1)
			go func() { done <- h.Exec(ctx, []core.Command{core.Resolve{Op: 2, Items: []core.Item{item}}}) }()
			waitForLockWaits(t, h, 1)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var evs []core.Event
			select {
			case evs = <-done:
			case <-ctx.Done():
				t.Fatal("the resolve did not return after the stage committed")
			}
			res, ok := evs[0].(core.Resolved)
			if !ok || res.Err != "" || len(res.Outcomes) != 1 {
				t.Fatalf("resolve = %v", evs[0])
			}
			if o := res.Outcomes[0]; o.Status != core.StatusRunning || o.Stage != "a" || o.Matched {
				t.Fatalf("outcome %v, want the row as the resolve read it (running at a), unmatched", o)
			}
			gotStage, gotStatus, _, dispatchError, _ := h.Row(t, id)
			if gotStage != tc.to || string(gotStatus) != tc.status || dispatchError != "" {
				t.Fatalf("row is %s at %s (dispatch_error %q): the resolve wrote over the stage's commit (want %s at %s)",
					gotStatus, gotStage, dispatchError, tc.status, tc.to)
			}

			// The core resolves it again: now against the committed row.
			res = mustExec(t, h, []core.Command{core.Resolve{Op: 3, Items: []core.Item{item}}})[0].(core.Resolved)
			if o := res.Outcomes[0]; o.Status != tc.want || o.Stage != tc.to || o.Matched {
				t.Fatalf("second outcome %v, want %s at %s, unmatched", o, tc.want, tc.to)
			}
		})
	}
}

// TestCoreSurvivesALateCommitDuringItsResolve drives the real core against
// PostgreSQL through the same race: its worker answers a bare 0 while the
// stage's transaction still holds the row (its COMMIT on the way), and that
// commit lands while the resolve waits on the row. The core must not stop
// (it once panicked: `row 1 is "running" after resolve`): it resolves the row
// again, which finds the stage's commit, and writes no verdict over it.
func TestCoreSurvivesALateCommitDuringItsResolve(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cfg, err := conf.Parse("t.conf", "[stage-a]\nPROGRAM = a\n")
	if err != nil {
		t.Fatal(err)
	}
	id := h.Insert(t, "a", 1)[0]
	c := core.New(cfg)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var handed []int64
	var logs []string
	// drive steps the core until it asks for nothing more at this instant;
	// during runs while each transaction is executed.
	drive := func(during func(), evs ...core.Event) {
		for len(evs) > 0 {
			var txn []core.Command
			next := []core.Event{}
			for _, cmd := range c.Step(now, evs...) {
				switch x := cmd.(type) {
				case core.Spawn:
					next = append(next, core.WorkerStarted{Worker: x.Worker, PID: 4242})
				case core.Write:
					handed = append(handed, x.IDs...)
				case core.Log:
					logs = append(logs, x.Msg)
				}
				if core.IsQueue(cmd) {
					txn = append(txn, cmd)
				}
			}
			if len(txn) > 0 {
				done := make(chan []core.Event, 1)
				go func() { done <- h.Exec(ctx, txn) }()
				if during != nil {
					during()
					during = nil
				}
				select {
				case res := <-done:
					next = append(next, res...)
				case <-ctx.Done():
					t.Fatal("a transaction did not return")
				}
			}
			evs = next
		}
	}
	drive(nil, core.Start{})
	if len(handed) != 1 || handed[0] != id {
		t.Fatalf("handed %v, want [%d]", handed, id)
	}

	stage := pgtest.Connect(t, h.url)
	tx, err := stage.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op once committed
	if _, err := tx.Exec(ctx, `UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = $1 AND status = 'running' AND stage = 'a'`, id); err != nil {
		t.Fatal(err)
	}
	drive(func() {
		waitForLockWaits(t, h, 1)
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
		}
	}, core.Answer{Worker: 1, Line: "0"})

	if _, status, _, dispatchError, _ := h.Row(t, id); status != core.StatusDone || dispatchError != "" {
		t.Fatalf("row is %s (dispatch_error %q), want done as the stage committed it", status, dispatchError)
	}
	if !slices.ContainsFunc(logs, func(l string) bool { return strings.Contains(l, "changed while its resolve wrote it") }) {
		t.Errorf("no log line for the race; logs: %q", logs)
	}
	if len(handed) != 1 {
		t.Errorf("the message was handed out again: %v", handed)
	}
}
