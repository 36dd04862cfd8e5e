package queuetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// historyTests are the conformance tests of pepsi.history: what each queue
// command records, in the transaction that makes it happen, and the upkeep
// of its days.
var historyTests = []conformanceTest{
	{"ResolveRecordsEachPassItWroteWithItsEventAndDetail", testHistoryPasses},
	{"ResolveRecordsAGuardMissAndWhatABareAnswerLeft", testHistoryGuardMiss},
	{"AVerdictARowOutranIsAGuardMissNeverTheVerdict", testHistoryVerdictOutrun},
	{"ResolveRecordsNothingForAStageWithHistoryOff", testHistoryOff},
	{"AnItemSentAgainRecordsItsPassOnlyOnce", testHistoryAgain},
	{"WakeAndResetRecordTheirRows", testHistoryWakeReset},
	{"AnOperatorsRetryRecordsRetried", testHistoryRetried},
	{"AnOperatorsDiscardRecordsFailedWithoutAPass", testHistoryDiscarded},
	{"KeepHistoryMakesTheDaysAheadAndDropsOldOnesWithTheirRows", testHistoryKeep},
}

// pass is an item whose pass is recorded: handed to worker pid at handed,
// answered at.
func pass(it core.Item, event string, pid int, handed, at time.Time, attempts int) core.Item {
	it.History, it.Event, it.PID, it.HandedAt, it.At, it.Attempts = true, event, pid, handed, at, attempts
	return it
}

// history reads id's history as "event@stage(detail)" lines.
func history(t *testing.T, h Harness, id int64) []store.HistoryRow {
	t.Helper()
	rows, err := h.History(t.Context(), id)
	if err != nil {
		t.Fatalf("History(%d): %v", id, err)
	}
	return rows
}

func historyText(rows []store.HistoryRow) string {
	var b strings.Builder
	for i, r := range rows {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s@%s", r.Event, r.Stage)
		if r.Detail != "" {
			fmt.Fprintf(&b, "(%s)", r.Detail)
		}
	}
	return b.String()
}

func wantHistory(t *testing.T, h Harness, id int64, want string) []store.HistoryRow {
	t.Helper()
	rows := history(t, h, id)
	if got := historyText(rows); got != want {
		t.Errorf("history of %d = %q, want %q", id, got, want)
	}
	return rows
}

func testHistoryPasses(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 7)
	claimRows(t, h, core.Cap{Stage: "a", N: 7})
	handed, at := base, base.Add(1500*time.Millisecond)
	resolve(t, h,
		pass(move(ids[0], "a", "b"), core.HistoryMoved, 101, handed, at, 0),
		pass(move(ids[1], "a", core.TargetDone), core.HistoryDone, 101, handed, at, 0),
		pass(core.Item{ID: ids[2], Stage: "a", Verdict: core.Fail, Reason: "exit 3"}, core.HistoryFailed, 102, handed, at, 0),
		pass(core.Item{ID: ids[3], Stage: "a", Verdict: core.Retry, Reason: "busy", Until: base.Add(time.Hour)}, core.HistoryRetry, 102, handed, at, 0),
		pass(core.Item{ID: ids[4], Stage: "a", Verdict: core.Fail, Reason: "worker pid 103 crashed"}, core.HistoryCrashed, 103, handed, at, 0),
		pass(core.Item{ID: ids[5], Stage: "a", Verdict: core.Requeue}, core.HistoryRequeued, 103, handed, at, 0),
		pass(core.Item{ID: ids[6], Stage: "a", Verdict: core.TimeOut, Reason: "no answer"}, core.HistoryTimeout, 104, time.Time{}, at, 2),
	)
	rows := wantHistory(t, h, ids[0], "moved@a(b)")
	if len(rows) == 1 {
		r := rows[0]
		if r.WorkerPID != 101 || r.HandedAt == nil || !r.HandedAt.Equal(handed) || !r.At.Equal(at) || r.Attempts != 0 || r.ID != ids[0] {
			t.Errorf("history row %+v: want pid 101, handed at %s, at %s, attempts 0", r, handed, at)
		}
	}
	wantHistory(t, h, ids[1], "done@a")
	wantHistory(t, h, ids[2], "failed@a(exit 3)")
	wantHistory(t, h, ids[3], "retry@a(busy)")
	wantHistory(t, h, ids[4], "crashed@a(worker pid 103 crashed)")
	wantHistory(t, h, ids[5], "requeued@a")
	rows = wantHistory(t, h, ids[6], "timeout@a(no answer)")
	if len(rows) == 1 && (rows[0].HandedAt != nil || rows[0].Attempts != 2) {
		t.Errorf("history row %+v: want no handed_at (never handed) and attempts 2", rows[0])
	}
}

func testHistoryGuardMiss(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 5)
	claimRows(t, h, core.Cap{Stage: "a", N: 5})
	h.Stage(t, ids[0], "a", "a", core.StatusDone, time.Time{})    // wrote its own, then answered a transition
	h.Stage(t, ids[1], "a", "c", core.StatusRunning, time.Time{}) // advanced itself, answered a transition
	h.Stage(t, ids[2], "a", "b", core.StatusRunning, time.Time{}) // advanced itself, answered a bare 0
	h.Stage(t, ids[3], "a", "a", core.StatusDone, time.Time{})    // finished itself, answered a bare 0
	at := base.Add(time.Second)
	answered := func(id int64) core.Item {
		return pass(core.Item{ID: id, Stage: "a", Verdict: core.Answered, Reason: "stage bug"}, core.HistoryAnswered, 7, base, at, 0)
	}
	resolve(t, h,
		pass(move(ids[0], "a", "b"), core.HistoryMoved, 7, base, at, 0),
		pass(move(ids[1], "a", "b"), core.HistoryMoved, 7, base, at, 0),
		answered(ids[2]), answered(ids[3]), answered(ids[4]))
	wantHistory(t, h, ids[0], "guard-miss@a(done at a)")
	wantHistory(t, h, ids[1], "guard-miss@a(pending at c)")
	wantHistory(t, h, ids[2], "answered@a(pending at b)")
	wantHistory(t, h, ids[3], "answered@a(done at a)")
	wantHistory(t, h, ids[4], "failed@a(stage bug)") // a bare 0 that left it running
}

// testHistoryVerdictOutrun: a stage that wrote its own transition and then
// failed, hung, crashed, asked for a retry or waited behind a crash leaves
// its row moved on (requeued at its new stage) or finished (left alone); the
// history says what the row became, a guard-miss, and never records a
// failure, timeout, retry or requeue the row did not take.
func testHistoryVerdictOutrun(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 6)
	claimRows(t, h, core.Cap{Stage: "a", N: 6})
	h.Stage(t, ids[0], "a", "c", core.StatusRunning, time.Time{}) // advanced itself, then answered 1
	h.Stage(t, ids[1], "a", "a", core.StatusDone, time.Time{})    // finished itself, then hung
	h.Stage(t, ids[2], "a", "b", core.StatusRunning, time.Time{}) // advanced itself, then crashed
	h.Stage(t, ids[3], "a", "a", core.StatusDone, time.Time{})    // finished itself, then answered 75
	h.Stage(t, ids[4], "a", "c", core.StatusRunning, time.Time{}) // advanced itself, then waited behind a crash
	at := base.Add(time.Second)
	resolve(t, h,
		pass(core.Item{ID: ids[0], Stage: "a", Verdict: core.Fail, Reason: "exit 1"}, core.HistoryFailed, 7, base, at, 0),
		pass(core.Item{ID: ids[1], Stage: "a", Verdict: core.TimeOut, Reason: "no answer"}, core.HistoryTimeout, 7, base, at, 0),
		pass(core.Item{ID: ids[2], Stage: "a", Verdict: core.Fail, Reason: "worker pid 7 crashed"}, core.HistoryCrashed, 7, base, at, 0),
		pass(core.Item{ID: ids[3], Stage: "a", Verdict: core.Retry, Reason: "busy", Until: base.Add(time.Hour)}, core.HistoryRetry, 7, base, at, 0),
		pass(core.Item{ID: ids[4], Stage: "a", Verdict: core.Requeue}, core.HistoryRequeued, 7, base, at, 0),
		pass(core.Item{ID: ids[5], Stage: "a", Verdict: core.Fail, Reason: "exit 1"}, core.HistoryFailed, 7, base, at, 0),
	)
	wantHistory(t, h, ids[0], "guard-miss@a(pending at c)")
	wantHistory(t, h, ids[1], "guard-miss@a(done at a)")
	wantHistory(t, h, ids[2], "guard-miss@a(pending at b)")
	wantHistory(t, h, ids[3], "guard-miss@a(done at a)")
	wantHistory(t, h, ids[4], "guard-miss@a(pending at c)")
	wantHistory(t, h, ids[5], "failed@a(exit 1)") // its guard held: the failure is what happened
}

func testHistoryOff(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	off := pass(move(ids[0], "a", "b"), core.HistoryMoved, 7, base, base, 0)
	off.History = false
	resolve(t, h, off, pass(move(ids[1], "a", "b"), core.HistoryMoved, 7, base, base, 0))
	wantHistory(t, h, ids[0], "")
	wantHistory(t, h, ids[1], "moved@a(b)")
}

func testHistoryAgain(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	first := pass(move(ids[0], "a", core.TargetDone), core.HistoryDone, 7, base, base.Add(time.Second), 0)
	resolve(t, h, first)
	again := first
	again.Again = true
	resolve(t, h, again) // the first committed, its reply lost
	wantHistory(t, h, ids[0], "done@a")
	// Sent again when the first did not commit: recorded once, now.
	lost := pass(move(ids[1], "a", core.TargetDone), core.HistoryDone, 7, base, base.Add(time.Second), 0)
	lost.Again = true
	resolve(t, h, lost)
	wantHistory(t, h, ids[1], "done@a")
}

func testHistoryWakeReset(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	h.Stage(t, ids[0], "a", "a", core.StatusPaused, base)
	resetOrphans(t, h)
	wakeAt(t, h, base.Add(time.Minute))
	rows := wantHistory(t, h, ids[0], "woken@a")
	if len(rows) == 1 && !rows[0].At.Equal(base.Add(time.Minute)) {
		t.Errorf("woken row at %s, want the wake's now %s", rows[0].At, base.Add(time.Minute))
	}
	rows = wantHistory(t, h, ids[1], "reset@a")
	if len(rows) == 1 && (!rows[0].At.Equal(base) || rows[0].WorkerPID != 0 || rows[0].HandedAt != nil) {
		t.Errorf("reset row %+v: want at %s, no worker, no handed_at", rows[0], base)
	}
}

func testHistoryRetried(t *testing.T, h Harness) {
	id := failAt(t, h, "a", "exit 3: bad input", core.Fail)
	if n, err := h.Retry(t.Context(), store.RetryParams{ID: id, Statuses: []core.RowStatus{core.StatusFailed}, To: "b"}); err != nil || n != 1 {
		t.Fatalf("Retry -to b = %d, %v; want 1 row", n, err)
	}
	wantHistory(t, h, id, "retried@b(failed at a: exit 3: bad input)")
}

// testHistoryDiscarded: a discarded message's history says it failed, and
// why, as a transition without a pass; a message a worker holds is not
// discarded and records nothing.
func testHistoryDiscarded(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 1}) // ids[0] running, held
	const why = "discarded by an operator (pepsi-queue discard): bad import"
	for _, id := range ids {
		sel := store.Selection{ID: id, Statuses: []core.RowStatus{core.StatusPending, core.StatusPaused, core.StatusBlocked}}
		if _, err := h.Discard(t.Context(), store.DiscardParams{Selection: sel, DispatchError: why}); err != nil {
			t.Fatalf("Discard(%d): %v", id, err)
		}
	}
	wantHistory(t, h, ids[0], "")
	rows := wantHistory(t, h, ids[1], "failed@a("+why+")")
	if len(rows) == 1 && (rows[0].WorkerPID != 0 || rows[0].HandedAt != nil) {
		t.Errorf("discard's history row %+v: want no worker, no handed_at", rows[0])
	}
}

func testHistoryKeep(t *testing.T, h Harness) {
	day := time.Date(2030, time.March, 4, 0, 0, 0, 0, time.UTC)
	keep := func(from, now, through, drop time.Time) core.HistoryKept {
		t.Helper()
		return exec(t, h, core.KeepHistory{Op: 42, From: from, Now: now, Through: through, DropBefore: drop},
			func(e core.HistoryKept) (int64, string) { return e.Op, e.Err })
	}
	days := func() []time.Time {
		t.Helper()
		ds, err := h.HistoryPartitions(t.Context())
		if err != nil {
			t.Fatalf("HistoryPartitions: %v", err)
		}
		var out []time.Time
		for _, d := range ds {
			if !d.Before(day.AddDate(0, 0, -10)) && d.Before(day.AddDate(0, 0, 30)) { // (the migration's own days aside)
				out = append(out, d)
			}
		}
		return out
	}
	now := day.Add(5 * time.Hour)
	if k := keep(now, now, now.Add(72*time.Hour), now.AddDate(0, 0, -7)); !k.Through.Equal(day.AddDate(0, 0, 4)) {
		t.Errorf("upkeep through %s, want the end of the day three days ahead, %s", k.Through, day.AddDate(0, 0, 4))
	}
	if ds := days(); len(ds) != 4 || !ds[0].Equal(day) {
		t.Fatalf("days made %v, want 4 from %s", ds, day)
	}
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	resolve(t, h, pass(move(ids[0], "a", core.TargetDone), core.HistoryDone, 7, now, now, 0))
	// Two days later, keeping one day: the first day ends before now - 1d.
	later := now.AddDate(0, 0, 2)
	keep(later, later, later.Add(72*time.Hour), later.AddDate(0, 0, -1))
	if ds := days(); len(ds) != 5 || !ds[0].Equal(day.AddDate(0, 0, 1)) {
		t.Errorf("days after dropping %v, want 5 from %s", ds, day.AddDate(0, 0, 1))
	}
	wantHistory(t, h, ids[0], "") // dropped with its day
	// A row older than what is kept still finds its day when the upkeep
	// reaches back to it (From), and DropBefore spares it.
	keep(now, later, later, now)
	resolve(t, h, pass(move(ids[1], "a", core.TargetDone), core.HistoryDone, 7, now, now, 0))
	wantHistory(t, h, ids[1], "done@a")
}
