package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
)

// Each test below proves one feature of pepsi-dispatch(1) end to end: the real
// daemon (dispatch.Run), real worker processes (internal/testenv/teststage, scripted by
// each message's payload), a real PostgreSQL database of the test's own.

// stages returns [stage-NAME] sections of the raw test program with the given
// PARALLELISM and QUEUE_LIMIT.
func stages(parallelism, queueLimit int, names ...string) string {
	return stagesOf("teststage", parallelism, queueLimit, names...)
}

// stagesOf returns [stage-NAME] sections that run program (one of the
// test's binaries) with the given PARALLELISM and QUEUE_LIMIT.
func stagesOf(program string, parallelism, queueLimit int, names ...string) string {
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "[stage-%s]\nPROGRAM = @BIN@/%s\nPARALLELISM = %d\nQUEUE_LIMIT = %d\n", n, program, parallelism, queueLimit)
	}
	return b.String()
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// Feature: event-driven, batched claiming.

func TestClaimTakesRowsOfEveryStageInOneStatementUpToEachStagesCap(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nSTOP_GRACE = 200ms\n"+stages(1, 2, "a", "b", "c"))
	for _, s := range []string{"a", "b", "c"} {
		e.insert(s, repeat(s+"=sleep:2000+done", 3)...)
	}
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"running": 6, "pending": 3})
	// now() is the start of the transaction, so one updated_at across the running
	// rows of three stages means one claim made them all running.
	var claims, stagesClaimed int64
	err := e.db.QueryRow(context.Background(),
		`SELECT count(DISTINCT updated_at), count(DISTINCT stage) FROM pepsi.queue WHERE status = 'running'`).Scan(&claims, &stagesClaimed)
	if err != nil {
		t.Fatal(err)
	}
	if claims != 1 || stagesClaimed != 3 {
		t.Errorf("running rows came from %d claims over %d stages; want 1 claim covering 3 stages", claims, stagesClaimed)
	}
	if n := e.scalar(`SELECT count(DISTINCT stage) FROM pepsi.queue WHERE status = 'pending'`); n != 3 {
		t.Errorf("pending rows left at %d stages; want one row left at each of the 3 (cap QUEUE_LIMIT × PARALLELISM = 2)", n)
	}
	d.stopClean()
}

// Feature: persistent, pipelined workers.

func TestWorkerIsHandedUpToQueueLimitIdsAtOnceAndRefilledBeforeItAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	e.insert("a", repeat("a=sleep:100+done", 10)...)
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 10})
	d.stopClean()

	reads := e.records("read")
	if len(reads) == 0 {
		t.Fatal("the worker recorded no reads")
	}
	if len(reads[0].IDs) != 4 {
		t.Errorf("first read of the worker got ids %v; want 4 (QUEUE_LIMIT) in one buffer", reads[0].IDs)
	}
	maxHeld, refilled := 0, false
	pids := map[int]bool{}
	for _, r := range reads {
		maxHeld = max(maxHeld, r.Outstanding)
		refilled = refilled || r.Outstanding > len(r.IDs)
		pids[r.PID] = true
	}
	if maxHeld != 4 {
		t.Errorf("the worker held at most %d unanswered ids; want exactly QUEUE_LIMIT = 4", maxHeld)
	}
	if !refilled {
		t.Errorf("no id arrived while the worker still held unanswered ones (reads %+v); want the pipeline refilled", reads)
	}
	if len(pids) != 1 {
		t.Errorf("%d worker processes ran; want 1 (PARALLELISM 1, persistent worker)", len(pids))
	}
}

// Feature: elastic per-stage pools.

func TestPoolGrowsToParallelismPacksWorkAndShrinksWhenIdle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nWORKER_IDLE_TIMEOUT = 300ms\n"+stages(3, 1, "a")+stages(4, 4, "b"))
	e.insert("a", repeat("a=sleep:300+done", 9)...)
	e.insert("b", repeat("b=sleep:100+done", 3)...)
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 12})

	live, peak := 0, 0
	startedB := 0
	for _, r := range e.records("") {
		switch {
		case r.Stage == "b" && r.Ev == "start":
			startedB++
		case r.Stage == "a" && r.Ev == "start":
			live++
			peak = max(peak, live)
		case r.Stage == "a" && r.Ev == "exit":
			live--
		}
	}
	if peak != 3 {
		t.Errorf("stage a ran at most %d workers at once; want PARALLELISM = 3", peak)
	}
	if startedB != 1 {
		t.Errorf("stage b started %d workers for 3 messages; want 1 (QUEUE_LIMIT 4: work packed onto the fewest)", startedB)
	}
	// Idle workers are stopped after WORKER_IDLE_TIMEOUT while the daemon runs.
	waitFor(t, 10*time.Second, "every worker to exit after WORKER_IDLE_TIMEOUT", func() (bool, string) {
		starts, exits := len(e.records("start")), len(e.records("exit"))
		return starts == exits, fmt.Sprintf("%d started, %d exited", starts, exits)
	})
	d.stopClean()
}

func TestWorkerIsRecycledAfterMaxMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[stage-a]\nPROGRAM = @BIN@/teststage\nPARALLELISM = 1\nQUEUE_LIMIT = 2\nMAX_MESSAGES = 3\n")
	e.insert("a", repeat("a=done", 9)...)
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 9})
	e.waitStatsOf(9)
	d.stopClean()

	got := map[int]int{}
	for _, r := range e.records("read") {
		got[r.PID] += len(r.IDs)
	}
	for pid, n := range got {
		if n > 3 {
			t.Errorf("worker pid %d was handed %d ids; want at most MAX_MESSAGES = 3", pid, n)
		}
	}
	if len(got) < 3 {
		t.Errorf("%d worker processes handled 9 messages; want at least 3 (recycled every 3)", len(got))
	}
	if s := e.stageStats()["a"]; s.Crashes != 0 || s.Processed != 9 {
		t.Errorf("stage_stats a = %+v; want processed 9, crashes 0 (a recycle is a clean stop)", s)
	}
}

func TestStageWhoseProgramIsMissingIsRetriedAfterACooldownInsteadOfSpinning(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[stage-a]\nPROGRAM = @BIN@/no-such-program\n")
	e.insert("a", repeat("a=done", 3)...)
	d := e.start()
	waitFor(t, 15*time.Second, "three attempts to start the program", func() (bool, string) {
		n := len(d.logs.lines("next try in"))
		return n >= 3, fmt.Sprintf("%d attempts", n)
	})
	attempts := d.logs.lines("next try in") // (not the check at start-up, which runs nothing)
	first, second, third := attempts[0].time(), attempts[1].time(), attempts[2].time()
	if gap := second.Sub(first); gap < 900*time.Millisecond {
		t.Errorf("second start attempt %v after the first; want a cooldown of at least 1s", gap)
	}
	if gap := third.Sub(second); gap < 1900*time.Millisecond {
		t.Errorf("third start attempt %v after the second; want the cooldown doubled to 2s", gap)
	}
	if n := len(attempts); n > 4 {
		t.Errorf("%d start attempts in %v; want no more than one per cooldown", n, third.Sub(first))
	}
	// Between attempts nothing runs the messages: they are pending, not failed.
	e.waitCounts(5*time.Second, map[string]int{"pending": 3})
	d.stopClean()
	e.waitCounts(time.Second, map[string]int{"pending": 3})
}

// A program that exits at every start (a broken deployment) fails no
// message, however often it is tried: after 3 failed starts with the same
// head the stage's next worker is a probe, handed nothing, which dies too.
func TestProgramThatExitsAtEveryStartFailsNoMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 30\n[stage-a]\nPROGRAM = @BIN@/exitstage\nPARALLELISM = 1\n")
	ids := e.insert("a", "a=done", "a=done")
	d := e.start()
	waitFor(t, 20*time.Second, "a probe that dies too", func() (bool, string) {
		n := len(e.records("start"))
		return n >= 4, fmt.Sprintf("%d starts", n)
	})
	if n := len(d.logs.lines("handed nothing until it has lived")); n != 1 {
		t.Errorf("%d log lines announce a probe; want 1", n)
	}
	// Given back between the tries (not held claimed), while it runs.
	e.waitCounts(10*time.Second, map[string]int{"pending": 2})
	d.stopClean()
	for _, id := range ids {
		e.expectRow(id, "pending", "a", "")
	}
}

// A message that kills every worker it is handed, at once, is failed once a
// probe shows the program itself starts: the probe lives StartWindow, is
// handed the message and dies of it; the message behind it is done.
func TestAMessageThatKillsEveryWorkerAtStartFailsOnceAProbeLives(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 30\n[stage-a]\nPROGRAM = @BIN@/teststage\nPARALLELISM = 1\n")
	ids := e.insert("a", "a=exit:1", "a=done")
	d := e.start()
	waitFor(t, 30*time.Second, "the message that kills its workers to fail", func() (bool, string) {
		r := e.row(ids[0])
		return r.Status == "failed", r.String()
	})
	e.expectRow(ids[0], "failed", "a", "crashed")
	e.waitCounts(10*time.Second, map[string]int{"failed": 1, "done": 1})
	if n := len(d.logs.lines("handed nothing until it has lived")); n != 1 {
		t.Errorf("%d log lines announce a probe; want 1", n)
	}
	d.stopClean()
}

// Feature: requeue on advance.

func TestAdvancedMessageIsRequeuedForTheNextStagesPool(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a", "b", "c"))
	ids := e.insert("a", repeat("a=advance:b;b=advance:c;c=done", 3)...)
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 3})
	d.stopClean()

	path := map[int64]string{}
	pidStage := map[int]string{}
	for _, r := range e.records("handle") {
		path[r.ID] += r.Stage
		if s, ok := pidStage[r.PID]; ok && s != r.Stage {
			t.Errorf("worker pid %d handled messages at stages %s and %s; want one stage per worker", r.PID, s, r.Stage)
		}
		pidStage[r.PID] = r.Stage
	}
	for _, id := range ids {
		if path[id] != "abc" {
			t.Errorf("message %d went through stages %q; want \"abc\"", id, path[id])
		}
		e.expectRow(id, "done", "c", "")
	}
}

// Feature: retry scheduling.

func TestPausedMessageIsWokenAtItsTimeoutNotAtTheHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 30\n"+stages(1, 4, "a"))
	ids := e.insert("a", "a=pause:800|done")
	d := e.start()
	e.waitCounts(5*time.Second, map[string]int{"done": 1}) // far below POLL_INTERVAL
	d.stopClean()
	h := e.records("handle")
	if len(h) != 2 || h[0].Pass != 0 || h[1].Pass != 1 {
		t.Fatalf("handle records %+v; want two passes of message %d", h, ids[0])
	}
	if gap := h[1].At.Sub(h[0].At); gap < 800*time.Millisecond || gap > 3*time.Second {
		t.Errorf("second pass %v after the first; want it soon after the 800ms pause", gap)
	}
}

// Feature: crash & watchdog recovery.

func TestNonZeroAnswerFailsThatMessageAndTheWorkerLivesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	ids := e.insert("a", "a=done", "a=answer:7 bad input", "a=done", "a=done")
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"done": 3, "failed": 1})
	e.waitStatsOf(4)
	d.stopClean()
	e.expectRow(ids[1], "failed", "a", "bad input")
	pids := map[int]bool{}
	for _, r := range e.records("handle") {
		pids[r.PID] = true
	}
	if len(pids) != 1 {
		t.Errorf("%d worker processes handled the messages; want 1 (the worker survives a non-zero answer)", len(pids))
	}
	if s := e.stageStats()["a"]; s.Processed != 3 || s.Failed != 1 || s.Crashes != 0 {
		t.Errorf("stage_stats a = %+v; want processed 3, failed 1, crashes 0", s)
	}
}

func TestZeroAnswerThatLeavesTheRowRunningFailsItAsAStageBug(t *testing.T) {
	t.Parallel()
	e, id := failsThenDone(t, "a=noop", "answered 0 but left the message running")
	if n := len(e.handledBy()[id]); n != 1 {
		t.Errorf("the stuck message ran %d times; want once (no loop)", n)
	}
}

func TestCrashFailsTheHeadOfLineAndRequeuesTheRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a", "b"))
	a := e.insert("a", "a=done", "a=exit:3", "a=done", "a=done")
	b := e.insert("b", "b=done", "b=segv", "b=done")
	d := e.start()
	e.waitCounts(15*time.Second, map[string]int{"done": 5, "failed": 2})
	e.waitStatsOf(7)
	d.stopClean()

	e.expectRow(a[1], "failed", "a", "crashed (exit status 3)")
	e.expectRow(b[1], "failed", "b", "crashed (signal segmentation fault)")
	by := e.handledBy()
	for _, ids := range [][]int64{a, b} {
		crashed := by[ids[1]][0]
		for _, id := range ids[2:] {
			e.expectRow(id, "done", string(e.row(id).Stage), "")
			if slices.Contains(by[id], crashed) || len(by[id]) != 1 {
				t.Errorf("message %d was handled by pids %v; want once, by a new worker (not the crashed pid %d)", id, by[id], crashed)
			}
		}
		held := false
		for _, r := range e.records("read") {
			held = held || r.PID == crashed && slices.Contains(r.IDs, ids[2])
		}
		if !held {
			t.Errorf("message %d was not in the pipeline of the crashed worker %d; the test proves nothing", ids[2], crashed)
		}
	}
	e.wantCrashes(1, "a", "b")
}

func TestProtocolErrorFailsTheHeadAndRequeuesTheRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	ids := e.insert("a", "a=done", "a=print:this is not a status", "a=done")
	d := e.start()
	e.waitCounts(15*time.Second, map[string]int{"done": 2, "failed": 1})
	d.stopClean()
	e.expectRow(ids[1], "failed", "a", `protocol error: worker pid`)
	e.expectRow(ids[1], "failed", "a", `this is not a status`)
	// The broken worker may have run message 3 before the kill reached it; either
	// its commit stands (and the requeue leaves the row alone) or a new worker
	// runs it: one committed pass either way.
	e.expectRow(ids[2], "done", "a", "")
	if r := e.row(ids[2]); r.Passes["a"] != 1 {
		t.Errorf("message %d committed %d passes at a; want exactly 1", ids[2], r.Passes["a"])
	}
}

func TestWatchdogTimesOutTheHeadAfterMaxRuntimeCountedFromWhenItReachedTheHead(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nMAX_RUNTIME = 1500ms\n"+stages(1, 4, "a"))
	// The first two take 1.8s together but each less than MAX_RUNTIME at the head.
	ids := e.insert("a", "a=sleep:900+done", "a=sleep:900+done", "a=hang", "a=done")
	d := e.start()
	e.waitCounts(15*time.Second, map[string]int{"done": 3, "timeout": 1})
	e.waitStatsOf(4)
	d.stopClean()
	e.expectRow(ids[2], "timeout", "a", "no answer within MAX_RUNTIME 1.5s")
	by := e.handledBy()
	if slices.Contains(by[ids[3]], by[ids[2]][0]) {
		t.Errorf("message %d ran on the killed worker; want it requeued to a new one", ids[3])
	}
	if s := e.stageStats()["a"]; s.Timeouts != 1 || s.Failed != 0 {
		t.Errorf("stage_stats a = %+v; want timeouts 1, failed 0", s)
	}
}

func TestEachStageTimesOutAtItsOwnMaxRuntime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `[pepsi-dispatch]
MAX_RUNTIME = 60
[stage-quick]
PROGRAM = @BIN@/teststage
PARALLELISM = 1
QUEUE_LIMIT = 1
MAX_RUNTIME = 1s
[stage-slow]
PROGRAM = @BIN@/teststage
PARALLELISM = 2
QUEUE_LIMIT = 1
MAX_RUNTIME = 4s
`)
	quick := e.insert("quick", "quick=hang")
	slow := e.insert("slow", "slow=sleep:2000+done", "slow=hang")
	start := time.Now()
	d := e.start()
	e.waitCounts(15*time.Second, map[string]int{"timeout": 1, "running": 2})
	// quick's hang timed out at its own second while slow's two ran on: the
	// one that sleeps 2s is not killed, although that is past quick's watchdog.
	e.expectRow(quick[0], "timeout", "quick", "no answer within MAX_RUNTIME 1s")
	e.waitCounts(15*time.Second, map[string]int{"timeout": 2, "done": 1})
	if took := time.Since(start); took < 4*time.Second {
		t.Errorf("slow's hang timed out after %s; want not before its own MAX_RUNTIME 4s", took)
	}
	d.stopClean()
	e.expectRow(slow[0], "done", "slow", "")
	e.expectRow(slow[1], "timeout", "slow", "no answer within MAX_RUNTIME 4s")
	if s := e.stageStats(); s["quick"].Timeouts != 1 || s["slow"].Timeouts != 1 {
		t.Errorf("stage_stats %+v; want one timeout at each stage", s)
	}
}

func TestRowAStageAlreadyAdvancedIsRequeuedNotFailedWhenItsWorkerDies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a", "p", "b"))
	a := e.insert("a", "a=done", "a=advance:b+exit:3;b=done")
	p := e.insert("p", "p=done", "p=advance:b+print:garbage;b=done")
	d := e.start()
	e.waitCounts(15*time.Second, map[string]int{"done": 4})
	e.waitStatsOf(4)
	d.stopClean()
	for _, id := range []int64{a[1], p[1]} {
		e.expectRow(id, "done", "b", "")
		if r := e.row(id); r.Passes["b"] != 1 {
			t.Errorf("message %d passed stage b %d times; want once (requeued there after its worker died)", id, r.Passes["b"])
		}
	}
	e.wantCrashes(0, "a", "p")
}

// Feature: start-up / shutdown safety.

func TestOrphanedRunningRowsAreResetAtStartAndProcessed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a", "b"))
	if _, err := e.db.Exec(context.Background(), `INSERT INTO pepsi.queue (stage, status, payload) VALUES
		('a', 'running', 'a=advance:b;b=done'), ('b', 'running', 'b=done'), ('a', 'pending', 'a=done')`); err != nil {
		t.Fatal(err)
	}
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"done": 3})
	d.stopClean()
	if n := len(d.logs.lines("reset 2 orphaned running rows")); n != 1 {
		t.Errorf("%d log lines about resetting 2 orphans; want 1", n)
	}
}

func TestShutdownStopsWorkersAndLeavesNoRowRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(2, 4, "a"))
	e.insert("a", repeat("a=sleep:150+done", 40)...)
	d := e.start()
	waitFor(t, 10*time.Second, "a few messages done", func() (bool, string) {
		c, err := e.counts()
		return err == nil && c["done"] >= 4 && c["running"] > 0, fmtCounts(c)
	})
	d.stopClean()
	c, err := e.counts()
	if err != nil {
		t.Fatal(err)
	}
	if c["running"] != 0 || c["done"]+c["pending"] != 40 {
		t.Errorf("after shutdown the queue is %s; want only done and pending rows, 40 in all", fmtCounts(c))
	}
	if starts, exits := len(e.records("start")), len(e.records("exit")); starts != exits {
		t.Errorf("%d workers started, %d finished their input and exited; want every worker stopped cleanly", starts, exits)
	}
	if s := e.stageStats()["a"]; s.Crashes != 0 || s.Processed != int64(c["done"]) {
		t.Errorf("stage_stats a = %+v after shutdown; want processed %d (flushed on shutdown), crashes 0", s, c["done"])
	}
	// The session's queue transactions are summed up at its end: at least
	// one claim and one resolve carried the messages done, each a hop.
	sums := d.logs.lines("queue transactions")
	if len(sums) != 1 {
		t.Fatalf("%d summaries of the queue transactions logged; want 1 at the end", len(sums))
	}
	count, _ := sums[0]["count"].(float64)
	items, _ := sums[0]["items"].(float64)
	if count < 2 || items < float64(2*c["done"]) {
		t.Errorf("queue transactions %v; want at least 2, carrying at least %d items (each message done claimed and resolved)", sums[0], 2*c["done"])
	}
}

func TestShutdownKillsWorkersThatDoNotStopWithinTheGraceAndRequeuesTheirRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nSTOP_GRACE = 300ms\n"+stages(2, 2, "a"))
	e.insert("a", repeat("a=hang", 6)...)
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"running": 4, "pending": 2})
	waitFor(t, 10*time.Second, "both workers to hold their messages", func() (bool, string) {
		n := len(e.records("handle"))
		return n == 2, fmt.Sprintf("%d messages being handled", n)
	})
	start := time.Now()
	d.stopClean()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown took %v; want about STOP_GRACE 300ms", took)
	}
	e.waitCounts(time.Second, map[string]int{"pending": 6})
}

func TestSecondSignalKillsWorkersAndExitsOneLeavingRowsForTheNextStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nSTOP_GRACE = 200ms\n"+stages(1, 4, "a"))
	e.insert("a", repeat("a=sleep:5000+done", 2)...)
	d := e.start()
	waitFor(t, 10*time.Second, "the worker to be running a message", func() (bool, string) {
		n := len(e.records("handle"))
		return n == 1, fmt.Sprintf("%d messages being handled", n)
	})
	d.signals <- syscall.SIGTERM
	d.signals <- syscall.SIGTERM
	if code, err := d.wait(3 * time.Second); code != dispatch.ExitUnwritten || err != nil {
		t.Errorf("after two signals: exit %d, err %v; want exit %d (results unwritten)", code, err, dispatch.ExitUnwritten)
	}
	e.waitCounts(time.Second, map[string]int{"running": 2})
	// The next dispatcher resets them at start.
	next := e.startWith("next dispatcher", false)
	waitFor(t, 10*time.Second, "the next dispatcher to reset the orphans", func() (bool, string) {
		return len(next.logs.lines("reset 2 orphaned running rows")) == 1, "not yet"
	})
	next.stopClean()
	e.waitCounts(time.Second, map[string]int{"pending": 2})
}

// Feature: statistics.

func TestStatisticsAreFlushedWhenIdleAndAgreeWithTheQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[pepsi-dispatch]
STATS_INTERVAL = 60
[stage-a]
PROGRAM = @BIN@/libstage
[stage-b]
PROGRAM = @BIN@/libstage
[stage-c]
PROGRAM = @BIN@/teststage
`)
	e.insert("a", repeat("a=advance:tag;tag=sleep:2+advance:b;b=done", 5)...)
	e.insert("c", "c=answer:5 nope", "c=answer:5 nope", "c=done", "c=fused:x:1500+done")
	d := e.start()
	e.waitCounts(15*time.Second, map[string]int{"done": 7, "failed": 2})
	// STATS_INTERVAL is a minute: only the flush on going idle can be this quick.
	waitFor(t, 5*time.Second, "the idle flush", func() (bool, string) {
		passes, left, _ := e.dispatchStats()
		return left == 9, fmt.Sprintf("stage_passes %d, messages_left %d", passes, left)
	})
	passes, left, seq := e.dispatchStats()
	// Every pass counts, a failed one too (stage_passes is all the stages'
	// passes; processed, below, only those answered 0).
	if want := int64(5 + 5 + 5 + 4 + 1); passes != want {
		t.Errorf("stage_passes = %d; want %d (a, fused tag, b five times; c four times, two of them failed; fused x once)", passes, want)
	}
	if ended := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status IN ('done', 'failed', 'timeout')`); left != ended {
		t.Errorf("messages_left = %d; the queue holds %d finished messages", left, ended)
	}
	st := e.stageStats()
	want := map[string]stageStats{
		"a": {Processed: 5}, "tag": {Processed: 5}, "b": {Processed: 5},
		"c": {Processed: 2, Failed: 2}, "x": {Processed: 1, ProcessingUS: 1500},
	}
	for s, w := range want {
		got := st[s]
		if got.Processed != w.Processed || got.Failed != w.Failed || got.Crashes != 0 || got.Timeouts != 0 {
			t.Errorf("stage_stats %s = %+v; want processed %d, failed %d, no crashes or timeouts", s, got, w.Processed, w.Failed)
		}
		if w.ProcessingUS != 0 && got.ProcessingUS != w.ProcessingUS {
			t.Errorf("stage_stats %s processing_us = %d; want %d as reported on the status line", s, got.ProcessingUS, w.ProcessingUS)
		}
		if s != "x" && got.ProcessingUS <= 0 {
			t.Errorf("stage_stats %s processing_us = %d; want the time its passes took", s, got.ProcessingUS)
		}
	}
	if len(st) != len(want) {
		t.Errorf("stage_stats has rows for %d stages (%v); want %d", len(st), st, len(want))
	}
	d.stopClean()
	if _, _, after := e.dispatchStats(); after != seq {
		t.Errorf("flush_seq went from %d to %d at an idle shutdown; want nothing written without deltas", seq, after)
	}
}

// Feature: one dispatcher per system.

func TestSecondDispatcherRefusesToRunAndAStandbyTakesOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	first := e.start()
	waitFor(t, 10*time.Second, "the first dispatcher to hold the lock", func() (bool, string) {
		return len(first.logs.lines("holding the dispatcher lock")) == 1, "not yet"
	})
	second := e.startWith("second dispatcher", false)
	code, err := second.wait(10 * time.Second)
	if code != dispatch.ExitLockHeld || err == nil || !strings.Contains(err.Error(), `application_name 'pepsi-dispatch `) {
		t.Errorf("second dispatcher: exit %d, err %v; want exit %d and an error naming the holder's application_name",
			code, err, dispatch.ExitLockHeld)
	}
	if err != nil && (strings.Count(err.Error(), "another pepsi-dispatch") != 1 || !strings.Contains(err.Error(), "-standby")) {
		t.Errorf("second dispatcher: err %q; want \"another pepsi-dispatch\" once, and -standby named", err)
	}
	standby := e.startWith("standby", true)
	waitFor(t, 10*time.Second, "the standby to wait for the lock", func() (bool, string) {
		return len(standby.logs.lines("standby: waiting for the dispatcher lock")) > 0, "not yet"
	})
	ids := e.insert("a", "a=done")
	e.waitCounts(10*time.Second, map[string]int{"done": 1})
	if len(standby.logs.lines("holding the dispatcher lock")) != 0 {
		t.Fatalf("the standby took the lock while the first dispatcher held it")
	}
	first.stopClean()
	waitFor(t, 15*time.Second, "the standby to take over", func() (bool, string) {
		return len(standby.logs.lines("holding the dispatcher lock")) == 1, "not yet"
	})
	more := e.insert("a", "a=done")
	e.waitCounts(10*time.Second, map[string]int{"done": 2})
	// A standby still waiting stops cleanly on a signal.
	waiting := e.startWith("second standby", true)
	waitFor(t, 10*time.Second, "the second standby to wait for the lock", func() (bool, string) {
		return len(waiting.logs.lines("standby: waiting for the dispatcher lock")) > 0, "not yet"
	})
	waiting.stopClean()
	standby.stopClean()
	by := e.handledBy()
	if len(by[ids[0]]) != 1 || len(by[more[0]]) != 1 || by[ids[0]][0] == by[more[0]][0] {
		t.Errorf("messages handled by pids %v and %v; want one each, by the two dispatchers' own workers", by[ids[0]], by[more[0]])
	}
}

// Feature: config propagation.

func TestWorkersGetTheConfigFileAndTheirStage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a", "b"))
	e.insert("a", "a=done")
	e.insert("b", "b=done")
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"done": 2})
	d.stopClean()
	starts := e.records("start")
	if len(starts) != 2 {
		t.Fatalf("%d workers started; want 2", len(starts))
	}
	seen := map[string]bool{}
	for _, s := range starts {
		if want := []string{"worker", "-c", e.conf}; !slices.Equal(s.Args, want) {
			t.Errorf("worker pid %d got arguments %q; want %q", s.PID, s.Args, want)
		}
		seen[s.Env] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("workers got PEPSI_STAGE values %v; want a and b", seen)
	}
}

func TestWorkersGetConfigFileWhenItNamesAnotherFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nCONFIG_FILE = @DIR@/worker.conf\n"+stages(1, 4, "a"))
	text, err := os.ReadFile(e.conf)
	if err != nil {
		t.Fatal(err)
	}
	workerConf := filepath.Join(e.dir, "worker.conf")
	if err := os.WriteFile(workerConf, text, 0o644); err != nil {
		t.Fatal(err)
	}
	e.insert("a", "a=done")
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"done": 1})
	d.stopClean()
	if s := e.records("start"); len(s) != 1 || !slices.Equal(s[0].Args, []string{"worker", "-c", workerConf}) {
		t.Errorf("workers started with %+v; want one, with arguments worker -c %s", s, workerConf)
	}
}

// The worker protocol: standard error is logged, tagged with stage and pid.

func TestWorkerStandardErrorIsLoggedWithStageAndPID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	e.insert("a", "a=stderr:hello from stage a+done")
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"done": 1})
	waitFor(t, 5*time.Second, "the worker's stderr line in the log", func() (bool, string) {
		return len(d.logs.lines("hello from stage a")) == 1, "not yet"
	})
	d.stopClean()
	l := d.logs.lines("hello from stage a")[0]
	pid := e.records("start")[0].PID
	if l["stage"] != "a" || l["pid"] != float64(pid) || l["stream"] != "stderr" {
		t.Errorf("stderr line logged as %v; want stage a, pid %d, stream stderr", l, pid)
	}
}

// A stage's log record on standard error whose pairs name a stage, a pid, a
// worker or a stream (a stage logs the pid of a child it ran) is logged
// without a second key of any of those names: one pair with the
// dispatcher's value drops out, one with another value is kept as
// stderr.NAME. A JSON record naming a key twice is refused by strict
// readers, and others take the last one, so the stage's pid=... would pass
// for the worker's.
func TestAStageLogRecordNeverRepeatsTheDispatchersKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	e.insert("a", "a=stderr:level=INFO msg=converted pid=4242 stage=a worker=w99 stream=stdout+done")
	d := e.start()
	e.waitCounts(10*time.Second, map[string]int{"done": 1})
	waitFor(t, 5*time.Second, "the worker's log record in the log", func() (bool, string) {
		return len(d.logs.lines("converted")) == 1, "not yet"
	})
	d.stopClean()
	pid := e.records("start")[0].PID
	for line := range strings.Lines(d.logs.String()) {
		if !strings.Contains(line, `"msg":"converted"`) {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(line))
		seen := map[string]bool{}
		if _, err := dec.Token(); err != nil {
			t.Fatal(err)
		}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			if seen[k.(string)] {
				t.Errorf("the record names %q twice: %s", k, line)
			}
			seen[k.(string)] = true
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
		}
	}
	l := d.logs.lines("converted")[0]
	want := map[string]any{"stage": "a", "pid": float64(pid), "stream": "stderr",
		"stderr.pid": "4242", "stderr.worker": "w99", "stderr.stream": "stdout", "stderr.stage": nil}
	for k, v := range want {
		if l[k] != v {
			t.Errorf("%s = %#v, want %#v (record %v)", k, l[k], v, l)
		}
	}
	if l["worker"] == "w99" {
		t.Errorf("worker = w99, the stage's own pair, not the dispatcher's worker id (record %v)", l)
	}
}

// The database: a missing schema is refused, a database that fails every write
// is retried with backoff until it heals.

func TestDatabaseWithoutTheSchemaIsRefusedWithExitFour(t *testing.T) {
	t.Parallel()
	e := newEnvAt(t, pgtest.NewDatabase(t), stages(1, 4, "a"))
	d := e.start()
	code, err := d.wait(10 * time.Second)
	if code != dispatch.ExitFatal || err == nil || !strings.Contains(err.Error(), "pepsi-queue migrate") {
		t.Errorf("exit %d, err %v; want exit %d and an error saying to run pepsi-queue migrate", code, err, dispatch.ExitFatal)
	}
}

func TestQueueWritesThatFailAtOnceAreRetriedWithBackoffUntilTheDatabaseHeals(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	d := e.start()
	first := e.insert("a", "a=done")
	e.waitCounts(10*time.Second, map[string]int{"done": 1})
	// Fault: every queue transaction fails at once although the server is up.
	if _, err := e.db.Exec(context.Background(), `ALTER TABLE pepsi.queue RENAME TO queue_away`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(context.Background(), `INSERT INTO pepsi.queue_away (stage, payload) VALUES ('a', 'a=done')`); err != nil {
		t.Fatal(err) // its NOTIFY makes the dispatcher claim, and fail
	}
	waitFor(t, 10*time.Second, "the dispatcher to fail a queue write", func() (bool, string) {
		return len(d.logs.lines("queue write failed")) > 0, "no failure logged"
	})
	time.Sleep(2 * time.Second) // the outage: how often it retries meanwhile is the point
	failures := len(d.logs.lines("queue write failed"))
	// Healing.
	if _, err := e.db.Exec(context.Background(), `ALTER TABLE pepsi.queue_away RENAME TO queue`); err != nil {
		t.Fatal(err)
	}
	e.waitCounts(15*time.Second, map[string]int{"done": 2})
	d.stopClean()
	// Doubling from 100ms: 100+200+400+800 ms fit in the 2s outage, so at most
	// about 6 attempts; a retry loop without backoff makes thousands.
	if failures > 8 {
		t.Errorf("%d failed queue transactions during a 2s outage; want a handful (retries back off)", failures)
	}
	e.expectRow(first[0], "done", "a", "")
}

// A worker killed while writing its answer ("0 >b" of a longer line, no
// newline yet) is not taken to have answered it: killed by the watchdog, its
// message times out at its stage; killed at a shutdown's STOP_GRACE, its
// message is requeued at its stage. Neither moves to stage b.
func TestAnAnswerCutOffByAKillIsNotTaken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nMAX_RUNTIME = 1s\n"+stages(1, 1, "a", "b"))
	timedOut := e.insert("a", "a=partial:0 >b+hang")[0]
	d := e.start()
	e.waitCounts(15*time.Second, map[string]int{"timeout": 1})
	d.stopClean()
	e.expectRow(timedOut, "timeout", "a", "no answer within MAX_RUNTIME 1s")
	if n := len(d.logs.lines("had no newline when it ended")); n != 1 {
		t.Errorf("%d log lines say the cut-off line was dropped; want 1", n)
	}

	g := newEnv(t, "[pepsi-dispatch]\nMAX_RUNTIME = 600\nSTOP_GRACE = 1s\n"+stages(1, 1, "a", "b"))
	requeued := g.insert("a", "a=partial:0 >b+hang")[0]
	d = g.start()
	g.waitCounts(15*time.Second, map[string]int{"running": 1})
	waitFor(t, 10*time.Second, "the partial line to be read", func() (bool, string) {
		return len(g.records("handle")) > 0, "no pass yet"
	})
	time.Sleep(200 * time.Millisecond) // the partial line is written right after the pass starts
	d.stopClean()
	g.expectRow(requeued, "pending", "a", "")
}
