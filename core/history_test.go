package core_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// historyStages: stage b keeps no history; a retries.
const historyStages = `
[pepsi-dispatch]
MAX_RUNTIME = 300
POLL_INTERVAL = 30
HISTORY_KEEP = 2d
[stage-a]
PROGRAM = a
PARALLELISM = 1
QUEUE_LIMIT = 2
RETRY_LIMIT = 3
[stage-b]
PROGRAM = b
PARALLELISM = 1
QUEUE_LIMIT = 1
HISTORY = off
`

// Proves: each pass's item carries its history: its event, the worker's pid,
// when its line was handed out and when its answer was read, and the row's
// attempts as claimed; the fake writes one history row per pass, in the same
// transaction, and a stage with HISTORY = off leaves its passes out. The
// wake that ends a retry's pause records woken.
func TestAPassCarriesItsHistory(t *testing.T) {
	w := newWorld(t, historyStages)
	w.start("a", 1)
	w.at(2 * time.Second)
	it := itemFor(t, w.answer(1, "", "", "75 busy"), 1)
	if !it.History || it.Event != core.HistoryRetry || it.PID != 1001 || !it.HandedAt.Equal(epoch) || !it.At.Equal(epoch.Add(2*time.Second)) || it.Attempts != 0 {
		t.Errorf("retry's item %v: want history retry, pid 1001, handed at 0s, answered at 2s, attempts 0", it)
	}
	w.tick(4 * time.Second) // due by 3.1 s: woken, claimed again, handed to w1
	w.at(5 * time.Second)
	it = itemFor(t, w.answer(1, "", "", "0 >b"), 1)
	if it.Event != core.HistoryMoved || it.Attempts != 1 || !it.HandedAt.Equal(epoch.Add(4*time.Second)) {
		t.Errorf("move's item %v: want history moved, attempts 1, handed at 4s", it)
	}
	it = itemFor(t, w.answer(2, "", "", "0 >done"), 1)
	if it.History {
		t.Errorf("item %v of stage b (HISTORY = off) carries history", it)
	}
	hist, err := w.q.History(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, h := range hist {
		events = append(events, h.Event+"@"+h.Stage)
	}
	want := []string{"retry@a", "woken@a", "moved@a"}
	if len(events) != len(want) || events[0] != want[0] || events[1] != want[1] || events[2] != want[2] {
		t.Errorf("history of message 1: %v, want %v", events, want)
	}
	if h := hist[2]; h.Detail != "b" || h.WorkerPID != 1001 || h.HandedAt == nil || h.HandedAt.After(h.At) {
		t.Errorf("moved row %+v: want detail b, pid 1001, handed at or before at", h)
	}
}

// Proves: the head of a crashed worker records crashed, the messages behind it
// requeued (never handed a line of their own answer: their handed_at is when
// they were written, their pid the crashed worker's).
func TestACrashRecordsCrashedAndRequeued(t *testing.T) {
	w := newWorld(t, historyStages)
	w.start("a", 2)
	w.at(core.StartWindow) // a crash, not a program that cannot start
	cmds := w.exit(1, 0, "SIGSEGV")
	crashed, requeued := itemFor(t, cmds, 1), itemFor(t, cmds, 2)
	if crashed.Event != core.HistoryCrashed || requeued.Event != core.HistoryRequeued || requeued.PID != 1001 {
		t.Errorf("crash items %v, %v: want crashed, then requeued by pid 1001", crashed, requeued)
	}
}

// Proves: the head of a worker the shell killed without the core asking (it
// closed its standard output and lived on) fails with a reason that says
// so, not as a crash of the stage's own by "signal killed"; the messages
// behind it are requeued.
func TestAWorkerTheShellKilledFailsItsHeadWithTheShellsReason(t *testing.T) {
	w := newWorld(t, historyStages)
	w.start("a", 2)
	w.at(core.StartWindow) // a crash, not a program that cannot start
	w.held[1], w.alive[1] = nil, false
	cmds := w.step(core.WorkerExited{Worker: 1, Code: -1, Signal: "killed", Killed: "it closed its standard output and did not exit"})
	head, rest := itemFor(t, cmds, 1), itemFor(t, cmds, 2)
	const want = "crashed (killed by the dispatcher: it closed its standard output and did not exit)"
	if head.Verdict != core.Fail || !strings.Contains(head.Reason, want) {
		t.Errorf("head %v: want it failed with a reason saying %q", head, want)
	}
	if rest.Verdict != core.Requeue {
		t.Errorf("message behind the head %v: want it requeued", rest)
	}
}

// Proves: the history's upkeep comes first in the first transaction, covering
// now to HistoryAhead and dropping what HISTORY_KEEP no longer keeps; it
// comes again every HistoryUpkeepEvery, and at once when now nears the end of
// the days made; a failed upkeep is sent again.
func TestHistoryUpkeep(t *testing.T) {
	w := newWorld(t, historyStages)
	cmds := w.start("a", 0)
	var first core.Command
	for _, c := range cmds {
		if core.IsQueue(c) {
			first = c
			break
		}
	}
	keep, ok := first.(core.KeepHistory)
	if !ok {
		t.Fatalf("first queue command %v, want keep-history", first)
	}
	if !keep.From.Equal(epoch) || !keep.Through.Equal(epoch.Add(core.HistoryAhead)) || !keep.DropBefore.Equal(epoch.Add(-48*time.Hour)) {
		t.Errorf("upkeep %v: want from now through now+%s, dropping before now-2d", keep, core.HistoryAhead)
	}
	if n := len(of[core.KeepHistory](w.tick(30 * time.Minute))); n != 0 {
		t.Errorf("%d upkeeps after 30 minutes, want none", n)
	}
	if n := len(of[core.KeepHistory](w.tick(core.HistoryUpkeepEvery))); n != 1 {
		t.Errorf("%d upkeeps after %s, want one", n, core.HistoryUpkeepEvery)
	}
	w.failQueue = "server closed the connection unexpectedly"
	w.tick(2 * core.HistoryUpkeepEvery)
	w.failQueue = ""
	if n := len(of[core.KeepHistory](w.step(core.DatabaseUp{}))); n != 1 {
		t.Errorf("%d upkeeps after a failed one and the database back, want one", n)
	}
	days, _ := w.q.HistoryPartitions(context.Background())
	if len(days) != 4 || !days[0].Equal(epoch) {
		t.Errorf("days made %v: want 4 from %s", days, epoch)
	}
}

// Proves: once the database is back after a failed transaction, the next
// transaction begins with the history's upkeep, however recent the last one:
// the failure may have been a day of pepsi.history dropped behind the
// dispatcher's back (retention by hand, a restore), which only the upkeep
// makes again. Without it every try failed the same way, the whole pipeline
// waiting, until the hourly upkeep (found by dropping today's partition
// under a running pipeline).
func TestTheDatabaseBackBringsTheHistoryUpkeep(t *testing.T) {
	w := newWorld(t, historyStages)
	w.start("a", 1)
	w.at(time.Minute)
	// An ERROR answered before the COMMIT: the shell knows nothing committed.
	w.failQueue, w.abortQueue = `resolve: ERROR: no partition of relation "history" found for row (SQLSTATE 23514)`, true
	if n := len(of[core.KeepHistory](w.answer(1, "", "", "0 >b"))); n != 0 {
		t.Fatalf("%d upkeeps a minute after the first, want none", n)
	}
	w.failQueue, w.abortQueue = "", false
	cmds := w.step(core.DatabaseUp{})
	if n := len(of[core.KeepHistory](cmds)); n != 1 {
		t.Errorf("%d upkeeps once the database is back, want one: %v", n, cmds)
	}
}

// Proves: the operator who read that a queue write failed reads, once one
// succeeds again, that writes go through, and after how long; once, and not
// while they fail.
func TestWritesThatSucceedAgainAreSaid(t *testing.T) {
	w := newWorld(t, historyStages)
	w.start("a", 1)
	w.at(time.Minute)
	w.failQueue, w.abortQueue = "resolve: ERROR: canceling statement due to user request (SQLSTATE 57014)", true
	if got := logsWith(w.answer(1, "", "", "0 >b"), "succeed again"); len(got) != 0 {
		t.Errorf("said while writes fail: %q", got)
	}
	w.failQueue, w.abortQueue = "", false
	w.at(time.Minute + 3*time.Second)
	got := logsWith(w.step(core.DatabaseUp{}), "succeed again")
	if len(got) != 1 || got[0].Level != core.LevelInfo || !strings.Contains(got[0].Msg, "3s after") {
		t.Fatalf("once a write succeeds again: %+v; want one info line saying 3s after the first that failed", got)
	}
	if got := logsWith(w.answer(2, "", "", "0 >b"), "succeed again"); len(got) != 0 {
		t.Errorf("said again without a new failure: %q", got)
	}
}

// logsWith is the Log commands among cmds whose text holds sub.
func logsWith(cmds []core.Command, sub string) []core.Log {
	var out []core.Log
	for _, l := range of[core.Log](cmds) {
		if strings.Contains(l.Msg, sub) {
			out = append(out, l)
		}
	}
	return out
}

// Proves: a worker that exited by itself just as the shell decided to kill
// it (Killed set, but no SIGKILL in its status) fails its head with its own
// exit status, not as killed by the dispatcher: the kill did not happen.
func TestAWorkerThatExitedBeforeTheShellsKillReportsItsOwnStatus(t *testing.T) {
	w := newWorld(t, historyStages)
	w.start("a", 1)
	w.answer(1, "", "", "0 >b")
	cmds := w.step(core.WorkerExited{Worker: 2, Code: 3, Killed: "it closed its standard output and did not exit"})
	if got := logsWith(cmds, "killed by the dispatcher"); len(got) != 0 {
		t.Errorf("a worker that exited 3 by itself is said killed by the dispatcher: %q", got)
	}
	if got := logsWith(cmds, "exit status 3"); len(got) == 0 {
		t.Errorf("the worker's own exit status 3 is not said: %v", cmds)
	}
}
