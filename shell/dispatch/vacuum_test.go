package dispatch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Keeping pepsi.queue vacuumed, on the server as it is (autovacuum off here):
// the dispatcher vacuums the queue itself when dead rows pile up, says once that
// autovacuum is off, and leaves the table alone with VACUUM = off.
func TestTheDispatcherVacuumsAQueueFullOfDeadRowsUnlessToldNotTo(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("VACUUM=%v", on), func(t *testing.T) {
			t.Parallel()
			setting := "off"
			if on {
				setting = "on"
			}
			e := newEnv(t, "[pepsi-dispatch]\nVACUUM = "+setting+"\n"+stages(1, 4, "a"))
			ctx := context.Background()
			// Dead row versions past the threshold: finished rows, rewritten as
			// a busy queue rewrites its rows.
			e.insertN("a", "a=done", core.VacuumDeadMin/2)
			for range 3 {
				if _, err := e.db.Exec(ctx, `UPDATE pepsi.queue SET status = 'done', updated_at = now()`); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := e.db.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				t.Fatal(err)
			}
			vacuums := func() int64 {
				return e.scalar(`SELECT coalesce(vacuum_count + autovacuum_count, 0) FROM pg_stat_user_tables WHERE relid = 'pepsi.queue'::regclass`)
			}
			waitFor(t, 20*time.Second, "dead rows in the statistics", func() (bool, string) {
				n := e.scalar(`SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relid = 'pepsi.queue'::regclass`)
				return n >= core.VacuumDeadMin, fmt.Sprintf("%d dead", n)
			})
			before := vacuums()
			d := e.start()
			// The first inspection comes at start; its verdict is logged.
			waitFor(t, 20*time.Second, "the first inspection", func() (bool, string) {
				n := len(d.logs.lines("autovacuum is off")) + len(d.logs.lines("vacuumed pepsi.queue"))
				return n > 0, "no log line yet"
			})
			if on {
				waitFor(t, 30*time.Second, "the dispatcher's vacuum", func() (bool, string) {
					n := vacuums()
					return n > before, fmt.Sprintf("%d vacuums", n)
				})
			}
			d.stopClean()
			var autovacuum string
			if err := e.db.QueryRow(ctx, `SELECT current_setting('autovacuum')`).Scan(&autovacuum); err != nil {
				t.Fatal(err)
			}
			if autovacuum == "off" {
				if n := len(d.logs.lines("autovacuum is off for pepsi.queue")); n != 1 {
					t.Errorf("%d warnings that autovacuum is off; want 1", n)
				}
			}
			if !on {
				if n := vacuums(); n != before {
					t.Errorf("%d vacuums with VACUUM = off; want none", n-before)
				}
			}
		})
	}
}

// A message enqueued at a stage no [stage-NAME] configures waits forever; the
// dispatcher says so, with the count, at start and on the heartbeat.
func TestMessagesAtAStageNobodyRunsAreReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	e.insert("ghost", "a=done", "a=done")
	d := e.start()
	waitFor(t, 20*time.Second, "the warning", func() (bool, string) {
		n := len(d.logs.lines(`2 messages are pending at stage 'ghost'`))
		return n == 1, fmt.Sprintf("%d warnings", n)
	})
	d.stopClean()
}

// A dispatcher started on an empty queue made its plans for it; a backlog that
// comes afterwards is analyzed for (core.OutgrewPlans), which makes the plans
// again (store: TestAnAnalyzeMakesPlansMadeOnAnEmptyQueueAgain). Its claims
// report the rows added, so the inspection that finds them comes a second
// after the last, not InspectInterval (10 s) after it: the analyze comes well
// before the periodic inspection would, and is said in the log. (Autovacuum is
// off for the table, so that no autovacuum or autoanalyze takes the statistics
// first, and the first inspection says so: the test waits for it.)
func TestTheDispatcherAnalyzesABacklogThatCameAfterItsPlans(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	if _, err := e.db.Exec(context.Background(), `ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	analyses := func() int64 {
		return e.scalar(`SELECT coalesce(analyze_count, 0) FROM pg_stat_user_tables WHERE relid = 'pepsi.queue'::regclass`)
	}
	before := analyses()
	d := e.start()
	waitFor(t, 20*time.Second, "the first inspection", func() (bool, string) {
		return len(d.logs.lines("autovacuum is off for pepsi.queue")) == 1, "not yet"
	})
	inserted := time.Now()
	e.insertN("a", "a=done", 3*core.InspectGrowth)
	waitFor(t, 30*time.Second, "the dispatcher's analyze", func() (bool, string) {
		n := analyses()
		return n > before && len(d.logs.lines("analyzing it")) == 1, fmt.Sprintf("%d analyses, log: %q", n-before, d.logs.lines("analyzing it"))
	})
	// The periodic inspection comes InspectInterval after the first, at most
	// that long after the insert began: the early one a second after it.
	if took := time.Since(inserted); took > core.InspectInterval-2*time.Second {
		t.Errorf("the analyze came %s after the insert began; want it from the inspection a second after the claims saw the rows, not the periodic one %s after the last",
			took.Round(time.Millisecond), core.InspectInterval)
	}
	d.stopClean()
}
