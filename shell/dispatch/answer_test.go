package dispatch_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Answers that carry the transition ("0 >TARGET", docs/protocol.md): the stage
// writes nothing and the dispatcher writes the transition in its own batched
// transaction.

func TestAnsweredTransitionsAreWrittenByTheDispatcherInEveryForm(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 30\n"+stages(1, 4, "a", "b"))
	ids := e.insert("a",
		"a=answer:0 >b;b=answer:0 >done",                     // advance, then done
		`a=answer:0 >b {"k":"v","n":[1,2]};b=answer:0 >done`, // a patch rides with the advance
		"a=answer:0 >paused:0.3|answer:0 >done",              // pause, then done on the second pass
		"a=advance:b;b=answer:0 >done",                       // a stage that writes mixed with one that answers
		"a=answer:0 >b fused-x:120;b=done",                   // fused stage timings ride along
		"a=answer:0 >zz",                                     // not a stage: failed, the worker lives on
		`a=answer:0 >b {"k":`,                                // a malformed patch: failed
		"a=answer:0 >b [1,2,3]",                              // valid JSON, not an object: failed
		`a=answer:0 >b {"n":1e-20000}`,                       // a number numeric cannot hold: failed, nothing else stops
	)
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 5, "failed": 4})
	e.waitStatsOf(9)
	d.stopClean()
	for _, id := range ids[:5] {
		want := "b"
		if id == ids[2] {
			want = "a"
		}
		e.expectRow(id, "done", want, "")
	}
	var k string
	var n int64
	if err := e.db.QueryRow(context.Background(), `SELECT state->>'k', jsonb_array_length(state->'n') FROM pepsi.queue WHERE ingress_id = $1`, ids[1]).Scan(&k, &n); err != nil || k != "v" || n != 2 {
		t.Errorf("state of the patched message: k=%q, len(n)=%d, %v; want the patch merged", k, n, err)
	}
	if r := e.row(ids[1]); r.Passes["a"] != 1 || r.Passes["b"] != 1 {
		t.Errorf("the patch replaced the state instead of merging into it: passes %v", r.Passes)
	}
	e.expectRow(ids[5], "failed", "a", `target 'zz' is not a stage`)
	e.expectRow(ids[6], "failed", "a", `state patch '{"k":' refused: not valid JSON`) // the reason quotes the patch's start
	e.expectRow(ids[7], "failed", "a", `state patch '[1,2,3] `)                       // the test stage adds its own patch after it
	e.expectRow(ids[8], "failed", "a", `the number 1e-20000, beyond the range of PostgreSQL's numeric`)
	h := e.records("handle")
	passes, pids := map[int64]int{}, map[string]map[int]bool{}
	for _, r := range h {
		passes[r.ID]++
		if pids[r.Stage] == nil {
			pids[r.Stage] = map[int]bool{}
		}
		pids[r.Stage][r.PID] = true
	}
	if passes[ids[2]] != 2 {
		t.Errorf("the paused message ran %d times; want 2 (paused, then done)", passes[ids[2]])
	}
	if len(pids["a"]) != 1 {
		t.Errorf("%d workers of stage a; want 1 (an unwritable transition is not a crash)", len(pids["a"]))
	}
	s := e.stageStats()
	if s["a"].Processed != 6 || s["a"].Failed != 4 || s["a"].Crashes != 0 || s["fused-x"].Processed != 1 || s["b"].Processed != 4 {
		t.Errorf("stage_stats %+v; want a: processed 6 (two passes of the paused one), failed 4; b: processed 4; fused-x: 1", s)
	}
}

func TestAGuardMissWritesNothingAndIsCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a", "b", "c"))
	// The stage writes its own advance to c and then also answers one to b.
	ids := e.insert("a", "a=advance:c+answer:0 >b;c=done")
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 1})
	waitFor(t, 10*time.Second, "the guard miss counted", func() (bool, string) {
		n := e.scalar(`SELECT coalesce(sum(guard_misses), 0) FROM pepsi.stage_stats WHERE stage = 'a'`)
		return n == 1, fmt.Sprintf("guard_misses of a = %d", n)
	})
	d.stopClean()
	e.expectRow(ids[0], "done", "c", "")
	if lines := d.logs.lines("no longer running"); len(lines) != 1 {
		t.Errorf("%d log lines about the guard miss; want 1", len(lines))
	}
}

// The dispatcher dies (SIGKILL) after it read a stage's answer, while its
// transaction writing the transition waits for a row lock the test holds. Its
// pipelined transaction has reached the server whole (COMMIT included), so
// either the server runs it to the end after all (the transition is durable, the
// stage ran once), or its backend dies with it before the commit (the row is
// still running at the stage; the next dispatcher resets it and the stage runs
// again). Nothing is lost either way.
func TestADispatcherKilledBetweenAnAnswerAndItsCommitLosesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		terminate bool // end the dead dispatcher's backend before its commit
		passes    int
	}{
		{"its commit still lands", false, 1},
		{"its backend dies before the commit, so the pass runs again", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			killBetweenAnswerAndCommit(t, tc.terminate, tc.passes)
		})
	}
}

func killBetweenAnswerAndCommit(t *testing.T, terminate bool, passes int) {
	e := newEnv(t, stages(1, 4, "a"))
	ids := e.insert("a", "a=sleep:1500+answer:0 >done")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lock, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background()) //nolint:errcheck // released below; this is for early returns
	cmd, out := command(ctx, "-c", e.conf, "-log-format", "json")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	waitFor(t, 20*time.Second, "the stage's first pass", func() (bool, string) {
		n := len(e.records("handle"))
		return n == 1, fmt.Sprintf("%d passes", n)
	})
	// Hold the row while the stage works, so that the dispatcher's resolve of
	// its answer waits for it.
	if _, err := lock.Exec(ctx, `SELECT 1 FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`, ids[0]); err != nil {
		t.Fatal(err)
	}
	const waiting = `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
		AND query LIKE '%WITH item AS%' AND datname = current_database()`
	waitFor(t, 20*time.Second, "the dispatcher's resolve waiting for the row lock", func() (bool, string) {
		n := e.scalar(waiting)
		return n == 1, fmt.Sprintf("%d waiting", n)
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	if terminate {
		e.scalar(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name LIKE 'pepsi-dispatch%' AND datname = current_database()`)
		waitFor(t, 20*time.Second, "the dead dispatcher's backends to go", func() (bool, string) {
			n := e.scalar(`SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pepsi-dispatch%' AND datname = current_database()`)
			return n == 0, fmt.Sprintf("%d backends", n)
		})
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the dead dispatcher's transaction to end", func() (bool, string) {
		n := e.scalar(`SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pepsi-dispatch%' AND datname = current_database()`)
		return n == 0, fmt.Sprintf("%d backends", n)
	})
	if terminate {
		e.expectRow(ids[0], "running", "a", "")
	} else {
		e.expectRow(ids[0], "done", "a", "")
	}
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 1})
	d.stopClean()
	if n := len(e.records("handle")); n != passes {
		t.Errorf("the stage ran %d times; want %d\n%s", n, passes, out)
	}
}

// A dispatcher killed with SIGKILL leaves its last pipelined transaction running
// in the server (waiting for a row lock, say); if it ran on after the next
// dispatcher's start-up reset and claim, it would write rows the new dispatcher
// holds. The new dispatcher ends every session of an earlier one first.
func TestAnEarlierDispatchersSessionIsEndedBeforeTheStartUpReset(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	ids := e.insert("a", "a=answer:0 >done")
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "pepsi-dispatch an-earlier-host 4242"
	old, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close(ctx)
	// The earlier dispatcher's transaction, still open, holding the row.
	if _, err := old.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Exec(ctx, `UPDATE pepsi.queue SET updated_at = now() WHERE ingress_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 1})
	d.stopClean()
	if _, err := old.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("the earlier dispatcher's session still answers; want it ended before the start-up reset")
	}
	if n := len(d.logs.lines("ended sessions of an earlier dispatcher")); n != 1 {
		t.Errorf("%d log lines about ending an earlier dispatcher's sessions; want 1", n)
	}
}

// Proves: a dispatcher whose connection sets an application_name of its own
// warns at start that it cannot end an earlier dispatcher's sessions, which
// then bear the same name as its own and as any other client of that
// connection string (TestAnEarlierDispatchersSessionIsEndedBeforeTheStartUpReset
// finds them by "pepsi-dispatch HOST PID"); it runs as usual.
func TestAnApplicationNameOfItsOwnIsWarnedAbout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	e.url = rewriteURL(t, e.url, "", "application_name", "pepsi-of-our-own")
	e.insert("a", "a=answer:0 >done")
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 1})
	d.stopClean()
	warned := d.logs.lines("sets its own application_name")
	if len(warned) != 1 || warned[0]["application_name"] != "pepsi-of-our-own" {
		t.Errorf("warnings about the connection's own application_name: %v; want one, naming it", warned)
	}
}
