package dispatch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// History from outside: the real dispatcher, PostgreSQL and stage processes
// (teststage), checked against what the stages recorded.

// history reads message id's history.
func (e *env) history(id int64) []store.HistoryRow {
	e.t.Helper()
	rows, err := store.On(e.db).History(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return rows
}

func historyEvents(rows []store.HistoryRow) string {
	var parts []string
	for _, r := range rows {
		s := r.Event + "@" + r.Stage
		if r.Detail != "" {
			s += "(" + r.Detail + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// A run with retries, pauses, moves, a failure, an operator's retry and a
// stage with HISTORY = off: one history row per pass the stages logged, with
// the event its answer means, the pid of the worker that logged it,
// handed_at at or before at, the attempts; a woken row after each pause and
// retry; none for the stage with HISTORY = off; a retried row for the
// operator's retry.
func TestHistoryRecordsEveryPassOfARun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
STATS_INTERVAL = 1h
[stage-a]
PROGRAM = @BIN@/teststage
RETRY_LIMIT = 3
RETRY_DELAY = 100ms
RETRY_DELAY_MAX = 200ms
[stage-b]
PROGRAM = @BIN@/teststage
[stage-quiet]
PROGRAM = @BIN@/teststage
HISTORY = off
`)
	ids := e.insert("a",
		"a=count+answer:75 busy|answer:0 >b;b=answer:0 >done",
		"a=count+answer:0 >paused:0.2|answer:0 >done",
		"a=count+answer:7 bad input|answer:0 >done",
		"a=answer:0 >quiet;quiet=answer:0 >done",
		"a=advance:b;b=done")
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 4, "failed": 1})
	n, err := store.On(e.db).Retry(context.Background(), store.RetryParams{ID: ids[2], Statuses: []core.RowStatus{core.StatusFailed}})
	if err != nil || n != 1 {
		t.Fatalf("retry of message %d: %d, %v", ids[2], n, err)
	}
	if err := store.On(e.db).NotifyIngress(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.waitCounts(20*time.Second, map[string]int{"done": 5})
	d.stopClean()

	want := map[int64]string{
		ids[0]: "retry@a(busy) woken@a moved@a(b) done@b",
		ids[1]: "paused@a woken@a done@a",
		ids[2]: "failed@a(bad input) retried@a(failed at a: bad input) done@a",
		ids[3]: "moved@a(quiet)",
		ids[4]: "answered@a(pending at b) answered@b(done at b)",
	}
	handles := map[string][]int{} // "id stage" -> the pids that logged its passes, in order
	for _, r := range e.records("handle") {
		k := fmt.Sprint(r.ID, " ", r.Stage)
		handles[k] = append(handles[k], r.PID)
	}
	for _, id := range ids {
		rows := e.history(id)
		if got := historyEvents(rows); got != want[id] {
			t.Errorf("history of message %d: %q, want %q", id, got, want[id])
			continue
		}
		passes := map[string]int{}
		for _, r := range rows {
			if r.Event == core.HistoryWoken || r.Event == core.HistoryRetried {
				if r.WorkerPID != 0 || r.HandedAt != nil {
					t.Errorf("message %d: %s row %+v has a worker", id, r.Event, r)
				}
				continue
			}
			k := fmt.Sprint(id, " ", r.Stage)
			i := passes[k]
			passes[k]++
			if logged := handles[k]; i >= len(logged) || logged[i] != r.WorkerPID {
				t.Errorf("message %d: pass %d at %s by pid %d, but the stage logged its passes there by %v", id, i+1, r.Stage, r.WorkerPID, logged)
			}
			if r.HandedAt == nil || r.HandedAt.After(r.At) {
				t.Errorf("message %d: pass %+v: want handed_at at or before at", id, r)
			}
		}
		for k, logged := range handles {
			if strings.HasPrefix(k, fmt.Sprint(id, " ")) && !strings.HasSuffix(k, " quiet") && passes[k] != len(logged) {
				t.Errorf("%s: %d passes logged, %d recorded", k, len(logged), passes[k])
			}
		}
	}
	if rows := e.history(ids[0]); len(rows) == 4 && (rows[0].Attempts != 0 || rows[2].Attempts != 1) {
		t.Errorf("message %d's attempts: %+v; want 0 at its retry, 1 at its move", ids[0], rows)
	}
	if n := e.scalar("SELECT count(*) FROM pepsi.history WHERE stage = 'quiet'"); n != 0 {
		t.Errorf("%d history rows of stage quiet (HISTORY = off)", n)
	}
}

// A short HISTORY_KEEP: the dispatcher makes the days ahead at start-up and
// drops the partitions wholly older than HISTORY_KEEP, with their rows, and
// no other.
func TestHistoryPartitionsAreMadeAheadAndDroppedPastHistoryKeep(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
HISTORY_KEEP = 2d
[stage-a]
PROGRAM = @BIN@/teststage
`)
	today := time.Now().UTC().Truncate(24 * time.Hour)
	old, kept := today.AddDate(0, 0, -5), today.AddDate(0, 0, -1)
	for _, day := range []time.Time{old, kept} {
		if _, err := e.db.Exec(context.Background(), `SELECT pepsi.history_day($1::date, true)`, day.Format("2006-01-02")); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.Exec(context.Background(), `INSERT INTO pepsi.history (ingress_id, stage, event, at) VALUES (1, 'a', 'done', $1)`, day.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	e.insert("a", "a=done")
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 1})
	d.stopClean()
	days, err := store.On(e.db).HistoryPartitions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, d := range days {
		have[d.Format("2006-01-02")] = true
	}
	if have[old.Format("2006-01-02")] {
		t.Errorf("the partition of %s, 5 days old, is still there with HISTORY_KEEP = 2d: %v", old.Format("2006-01-02"), days)
	}
	for i := -1; i <= 3; i++ {
		if d := today.AddDate(0, 0, i).Format("2006-01-02"); !have[d] {
			t.Errorf("no partition of %s (from yesterday, kept, to three days ahead): %v", d, days)
		}
	}
	if n := e.scalar("SELECT count(*) FROM pepsi.history WHERE at < $1", kept); n != 0 {
		t.Errorf("%d rows older than the kept days", n)
	}
	if n := e.scalar("SELECT count(*) FROM pepsi.history WHERE at >= $1 AND at < $2", kept, today); n != 1 {
		t.Errorf("%d rows of yesterday, want the one kept", n)
	}
}
