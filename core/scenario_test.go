package core_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Feature: event-driven, batched claiming.

func TestStartResetsOrphansThenClaimsEveryStageInOneStatement(t *testing.T) {
	w := newWorld(t, threeStages)
	w.q.Insert("b", 2)
	cmds := w.start("a", 10)
	reset := one[core.ResetOrphans](t, cmds)
	if len(reset.Keep) != 0 {
		t.Errorf("start-up reset keeps %v, want nothing kept", reset.Keep)
	}
	claim := one[core.Claim](t, cmds)
	got := capsOf(claim)
	want := map[string]int{"a": 6, "b": 4, "c": 3} // QUEUE_LIMIT × PARALLELISM each
	for s, n := range want {
		if got[s] != n {
			t.Errorf("claim cap for %s = %d, want %d (all caps %v)", s, got[s], n, got)
		}
	}
	if !strings.Contains(list(cmds), "reset-orphans") || indexOf(cmds, reset) > indexOf(cmds, claim) {
		t.Errorf("the orphan reset must come before the first claim:\n%s", list(cmds))
	}
}

func TestIngressClaimsOnlyWhenNotifiedOrPolled(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0) // nothing pending: the claim returns less than the caps
	w.q.Insert("a", 2)
	none[core.Claim](t, w.tick(time.Second), "no claim without a notification before the heartbeat")
	claim := one[core.Claim](t, w.step(core.Ingress{}))
	if capsOf(claim)["a"] != 6 {
		t.Errorf("claim after ingress: caps %v, want a:6", claim.Caps)
	}
}

func TestHeartbeatFindsWorkWhoseNotificationWasLost(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	w.q.Insert("a", 1) // NOTIFY lost: no Ingress event
	none[core.Claim](t, w.tick(29*time.Second), "no claim before POLL_INTERVAL")
	cmds := w.tick(30 * time.Second)
	one[core.Wake](t, cmds)
	if c := one[core.Claim](t, cmds); capsOf(c)["a"] != 6 {
		t.Errorf("heartbeat claim caps %v", c.Caps)
	}
	one[core.Write](t, cmds)
}

func TestAnswersInTheSameBatchAreAppliedBeforeTheClaim(t *testing.T) {
	w := newWorld(t, `
[stage-a]
PROGRAM = a
PARALLELISM = 1
QUEUE_LIMIT = 2
`)
	w.start("a", 4)
	if got := w.held[1]; len(got) != 2 {
		t.Fatalf("worker 1 holds %v, want 2 ids", got)
	}
	// Full: a notification alone claims nothing.
	none[core.Claim](t, w.step(core.Ingress{}), "a full stage must not be claimed for")
	// The answer and the notification arrive together: the answer frees a slot first.
	id := w.head(1)
	w.q.StageWrite(id, "a", "a", "done", time.Time{})
	w.held[1] = w.held[1][1:]
	cmds := w.step(core.Ingress{}, core.Answer{Worker: 1, Line: "0"})
	claim := one[core.Claim](t, cmds)
	if capsOf(claim)["a"] != 1 {
		t.Errorf("claim cap after one answer = %v, want a:1", claim.Caps)
	}
	if r := one[core.Resolve](t, cmds); len(r.Items) != 1 {
		t.Errorf("resolve: %v", r)
	}
}

func TestOnlyOneQueueTransactionIsOutstanding(t *testing.T) {
	w := newWorld(t, threeStages)
	w.q.Insert("a", 1)
	cmds := w.c.Step(epoch, core.Start{})
	one[core.Claim](t, cmds)
	// Results not delivered yet: another notification must not start a second claim.
	more := w.c.Step(epoch.Add(time.Millisecond), core.Ingress{})
	none[core.Claim](t, more, "a second claim while the first is outstanding")
	none[core.Resolve](t, more, "a queue write while a transaction is outstanding")
}

// Feature: persistent, pipelined workers.

func TestWorkerIsHandedUpToQueueLimitIdsInOneWrite(t *testing.T) {
	w := newWorld(t, threeStages)
	cmds := w.start("b", 6)
	writes := of[core.Write](cmds)
	if len(writes) != 1 || len(writes[0].IDs) != 4 {
		t.Fatalf("want one write of 4 ids (QUEUE_LIMIT of b), got %v", writes)
	}
	if n := len(of[core.Spawn](cmds)); n != 1 {
		t.Errorf("stage b (PARALLELISM 1) spawned %d workers", n)
	}
	// Stage b's in-flight capacity is QUEUE_LIMIT × PARALLELISM = 4: two stay pending.
	w.wantRow(5, "b", "pending")
	w.wantRow(6, "b", "pending")
}

// Feature: elastic per-stage pools.

func TestWorkIsPackedOntoTheFewestWorkers(t *testing.T) {
	w := newWorld(t, `
[stage-a]
PROGRAM = a
PARALLELISM = 4
QUEUE_LIMIT = 4
`)
	cmds := w.start("a", 5)
	if ids := workersOf(cmds); len(ids) != 2 {
		t.Fatalf("5 messages with QUEUE_LIMIT 4 need 2 workers, spawned %v", ids)
	}
	if len(w.held[1]) != 4 || len(w.held[2]) != 1 {
		t.Errorf("held: w1 %v, w2 %v; want 4 and 1", w.held[1], w.held[2])
	}
	// A new message goes to the busier worker that has room, not to an idle one.
	w.finish(2)
	w.finish(1)
	w.q.Insert("a", 1)
	cmds = w.step(core.Ingress{})
	if wr := one[core.Write](t, cmds); wr.Worker != 1 {
		t.Errorf("new message went to %s, want w1 (it still holds work)", wr.Worker)
	}
}

func TestPoolGrowsToParallelismAndNoFurther(t *testing.T) {
	w := newWorld(t, threeStages)
	cmds := w.start("c", 10)
	if ids := workersOf(cmds); len(ids) != 3 {
		t.Fatalf("stage c has PARALLELISM 3, spawned %v", ids)
	}
	for _, wr := range of[core.Write](cmds) {
		if len(wr.IDs) != 1 {
			t.Errorf("stage c has QUEUE_LIMIT 1, wrote %v", wr)
		}
	}
	// Answers free slots but never create a fourth worker.
	cmds = w.finish(1)
	none[core.Spawn](t, cmds, "no fourth worker")
}

func TestIdleWorkersAreStoppedAfterIdleTimeout(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(time.Second)
	w.finish(1)
	none[core.Stop](t, w.tick(5*time.Second+999*time.Millisecond), "reaped before WORKER_IDLE_TIMEOUT")
	stop := one[core.Stop](t, w.tick(6*time.Second))
	if stop.Worker != 1 {
		t.Errorf("stopped %s, want w1", stop.Worker)
	}
	cmds := w.exit(1, 0, "")
	if strings.Contains(list(cmds), "crash") || len(items(cmds)) != 0 {
		t.Errorf("a clean exit after stop must be quiet:\n%s", list(cmds))
	}
}

func TestWorkerRecyclesAfterMaxMessagesOnceDrained(t *testing.T) {
	w := newWorld(t, `
[stage-a]
PROGRAM = a
PARALLELISM = 1
QUEUE_LIMIT = 2
MAX_MESSAGES = 3
`)
	w.start("a", 5)
	w.finish(1)
	cmds := w.finish(1) // w1 has been handed 3: it gets nothing more
	if len(w.held[1]) != 1 {
		t.Fatalf("w1 holds %v, want 1 (handed 3 = MAX_MESSAGES)", w.held[1])
	}
	none[core.Stop](t, cmds, "recycled before its pipeline drained")
	cmds = w.finish(1)
	one[core.Stop](t, cmds)
	cmds = w.exit(1, 0, "")
	if ids := workersOf(cmds); len(ids) != 1 || ids[0] != 2 {
		t.Fatalf("after recycling, want a fresh w2, got spawns %v:\n%s", ids, list(cmds))
	}
	if len(w.held[2]) != 2 {
		t.Errorf("w2 holds %v, want the remaining 2", w.held[2])
	}
}

func TestProgramThatCannotStartIsHeldOffWithCooldown(t *testing.T) {
	w := newWorld(t, threeStages)
	w.noAutoStart = true
	cmds := w.start("b", 1)
	sp := one[core.Spawn](t, cmds)
	cmds = w.step(core.SpawnFailed{Worker: sp.Worker, Err: "exec: \"b\": executable file not found in $PATH"})
	none[core.Spawn](t, cmds, "respawned during the cooldown")
	none[core.Spawn](t, w.tick(999*time.Millisecond), "respawned during the cooldown")
	one[core.Spawn](t, w.tick(core.CooldownMin))
}

// Feature: requeue on advance, and the stage-bug guard.

func TestAdvancedMessageIsRequeuedForTheNextStage(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	cmds := w.advance(1, "b")
	it := itemFor(t, cmds, 1)
	if it.Stage != "a" {
		t.Errorf("resolve item guarded by stage %q, want the claimed stage a", it.Stage)
	}
	// Requeued to pending at b, then claimed for b in the same transaction.
	claim := one[core.Claim](t, cmds)
	if capsOf(claim)["b"] == 0 {
		t.Errorf("stage b not claimed for after the advance: %v", claim.Caps)
	}
	w.wantRow(1, "b", "running")
	if ws := of[core.Write](cmds); len(ws) != 1 || ws[0].IDs[0] != 1 {
		t.Errorf("message 1 not handed to a b worker: %v", ws)
	}
}

func TestZeroThatLeavesTheRowRunningFailsItAsAStageBug(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.answer(1, "", "", "0")
	w.wantRow(1, "a", "failed")
	if r := w.row(1); !strings.Contains(r.DispatchError, "left the message running") {
		t.Errorf("dispatch_error %q does not say the stage left it running", r.DispatchError)
	}
	// And it is not claimed again: no loop.
	none[core.Write](t, w.tick(31*time.Second), "a stuck message handed out again")
}

func TestStuckMessageIsRequeuedNotFailedAfterADatabaseCrash(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	id := w.head(1)
	w.q.StageWrite(id, "a", "b", "running", time.Time{})
	w.q.Crash() // PostgreSQL lost the stage's asynchronous commit
	w.held[1] = w.held[1][1:]
	w.step(core.Answer{Worker: 1, Line: "0"})
	if r := w.row(id); r.Status == "failed" {
		t.Fatalf("message %d failed as a stage bug although the crash lost the stage's commit", id)
	}
	// The same stage runs it again.
	if w.head(1) != id {
		t.Errorf("message %d not handed to stage a again", id)
	}
}

// Feature: retry scheduling.

func TestPausedRowIsWokenAtItsTimeout(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(10 * time.Second)
	w.answer(1, "a", "paused", "0") // paused until 10s + 1m = 70s
	w.tick(30 * time.Second)        // heartbeat: a wake that finds nothing due
	w.tick(60 * time.Second)
	w.wantRow(1, "a", "paused")
	cmds := w.tick(70 * time.Second)
	wake := one[core.Wake](t, cmds)
	if !wake.Now.Equal(epoch.Add(70 * time.Second)) {
		t.Errorf("wake at %v, want 70s", wake.Now.Sub(epoch))
	}
	w.wantRow(1, "a", "running")
	if wr := one[core.Write](t, cmds); wr.IDs[0] != 1 {
		t.Errorf("woken message not handed out: %v", wr)
	}
}

func TestTimerAsksForTheEarliestPausedTimeout(t *testing.T) {
	w := newWorld(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = a
`)
	w.start("a", 1)
	w.at(time.Second)
	cmds := w.answer(1, "a", "paused", "0")
	ts := of[core.SetTimer](cmds)
	if len(ts) == 0 {
		t.Fatalf("no timer after a pause:\n%s", list(cmds))
	}
	// Reap at 6s comes before the pause ends at 61s.
	w.tick(6 * time.Second)
	w.exit(1, 0, "")
	ts = of[core.SetTimer](w.all)
	last := ts[len(ts)-1]
	if !last.At.Equal(epoch.Add(61 * time.Second)) {
		t.Errorf("last timer %v, want the paused timeout at 61s", last.At.Sub(epoch))
	}
}

// Feature: crash and watchdog recovery.

func TestNonZeroAnswerFailsOneMessageAndTheWorkerLivesOn(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 3)
	cmds := w.answer(1, "", "", "3 invalid address: nobody@")
	none[core.Kill](t, cmds, "a worker answering non-zero must survive")
	none[core.Stop](t, cmds, "a worker answering non-zero must survive")
	w.wantRow(1, "a", "failed")
	if r := w.row(1); r.DispatchError != "invalid address: nobody@" {
		t.Errorf("dispatch_error = %q, want the worker's reason", r.DispatchError)
	}
	w.advance(1, "b")
	w.wantRow(2, "b", "running")
}

func TestCrashFailsTheHeadOfLineAndRequeuesTheRest(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 3) // w1 holds 1,2,3
	w.at(time.Minute)
	w.advance(1, "b")                           // 1 answered
	cmds := w.exit(1, -1, "segmentation fault") // 2 at the head, 3 behind
	if it := itemFor(t, cmds, 2); it.Verdict != core.Fail || !strings.Contains(it.Reason, "crashed") {
		t.Errorf("head item %v, want failed with a crash reason", it)
	}
	if it := itemFor(t, cmds, 3); it.Verdict != core.Requeue {
		t.Errorf("item behind the head %v, want pending (requeued)", it)
	}
	w.wantRow(2, "a", "failed")
	if r := w.row(3); r.Status == "failed" {
		t.Errorf("message 3 never ran but was failed")
	}
	flushAll(w)
	st, _, _, _ := w.q.Stats()
	if st["a"].Crashes != 1 || st["a"].Failed != 1 {
		t.Errorf("stats for a: %+v, want 1 crash and 1 failed", st["a"])
	}
}

func TestCrashAfterTheHeadWasAdvancedRequeuesItInsteadOfFailing(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	w.at(time.Minute)
	id := w.head(1)
	w.q.StageWrite(id, "a", "b", "running", time.Time{}) // committed, then died
	w.exit(1, 1, "")
	if r := w.row(id); r.Status == "failed" || r.Stage != "b" {
		t.Errorf("advanced head is %s at %s, want requeued at b", r.Status, r.Stage)
	}
}

func TestWatchdogTimesTheHeadFromWhenItReachedTheHead(t *testing.T) {
	w := newWorld(t, threeStages) // MAX_RUNTIME 300s
	w.start("a", 2)               // w1 holds 1, 2
	w.at(100 * time.Second)
	w.finish(1) // 2 reaches the head at 100s
	none[core.Kill](t, w.tick(300*time.Second), "timed from dispatch instead of from the head")
	none[core.Kill](t, w.tick(399*time.Second), "killed before MAX_RUNTIME at the head")
	cmds := w.tick(400 * time.Second)
	if k := one[core.Kill](t, cmds); k.Worker != 1 {
		t.Errorf("killed %s", k.Worker)
	}
	cmds = w.exit(1, -1, "killed")
	if it := itemFor(t, cmds, 2); it.Verdict != core.TimeOut {
		t.Errorf("head item %v, want timeout", it)
	}
	w.wantRow(2, "a", "timeout")
}

func TestProtocolErrorIsTreatedLikeACrash(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	cmds := w.step(core.Answer{Worker: 1, Line: "OK"})
	one[core.Kill](t, cmds)
	cmds = w.exit(1, -1, "killed")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Fail || !strings.Contains(it.Reason, "protocol") {
		t.Errorf("head item %v, want failed with a protocol reason", it)
	}
	if it := itemFor(t, cmds, 2); it.Verdict != core.Requeue {
		t.Errorf("second item %v, want pending", it)
	}
}

func TestWorkerThatDiesBeforeAnsweringIsAStartFailureNotAMessageFailure(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("b", 1)
	w.at(100 * time.Millisecond)
	cmds := w.exit(1, 1, "")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Requeue {
		t.Fatalf("message of a worker that could not start: %v, want pending", it)
	}
	none[core.Spawn](t, cmds, "respawned during the cooldown")
	// Each retry kills the worker again; after StartFailLimit the message fails.
	for i := 2; i <= core.StartFailLimit; i++ {
		cmds = w.tick(time.Duration(i) * time.Minute)
		sp := one[core.Spawn](t, cmds)
		if w.head(sp.Worker) != 1 {
			t.Fatalf("message 1 is not the head of the new worker")
		}
		w.at(time.Duration(i)*time.Minute + time.Second)
		cmds = w.exit(sp.Worker, 1, "")
	}
	if it := itemFor(t, cmds, 1); it.Verdict != core.Fail || !strings.Contains(it.Reason, "failed worker starts") {
		t.Errorf("after %d failed starts: %v, want failed saying so", core.StartFailLimit, it)
	}
}

// lastTimer is the instant the last SetTimer of cmds asks for.
func lastTimer(t *testing.T, cmds []core.Command) time.Time {
	t.Helper()
	timers := of[core.SetTimer](cmds)
	if len(timers) == 0 {
		t.Fatalf("no SetTimer in:\n%s", list(cmds))
	}
	return timers[len(timers)-1].At
}

func TestMessagesOfAWorkerThatCouldNotStartAreRetriedWhenTheCooldownEnds(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("b", 1)
	w.at(1500 * time.Millisecond)
	cmds := w.exit(1, 1, "")
	w.wantRow(1, "b", "pending")
	// Requeued rows are pending, and no notification will come for them: the core
	// must ask for a tick when the cooldown ends, not wait for the heartbeat.
	due := epoch.Add(1500*time.Millisecond + core.CooldownMin)
	if at := lastTimer(t, cmds); !at.Equal(due) {
		t.Fatalf("timer after the failed start at %s, want %s (end of the cooldown)", at.Sub(epoch), due.Sub(epoch))
	}
	sp := one[core.Spawn](t, w.tick(due.Sub(epoch)))
	if w.head(sp.Worker) != 1 {
		t.Errorf("message 1 is not the head of the worker started after the cooldown")
	}
}

func TestClaimedRowsOfAStageThatCannotStartArePendingDuringTheCooldown(t *testing.T) {
	w := newWorld(t, threeStages)
	w.noAutoStart = true
	sp := one[core.Spawn](t, w.start("b", 2))
	w.at(1500 * time.Millisecond)
	cmds := w.step(core.SpawnFailed{Worker: sp.Worker, Err: "exec: \"b\": executable file not found in $PATH"})
	for _, id := range []int64{1, 2} {
		if it := itemFor(t, cmds, id); it.Verdict != core.Requeue {
			t.Errorf("claimed row %d of a stage that cannot start: %v, want pending", id, it)
		}
		w.wantRow(id, "b", "pending")
	}
	due := epoch.Add(1500*time.Millisecond + core.CooldownMin)
	if at := lastTimer(t, cmds); !at.Equal(due) {
		t.Fatalf("timer after the failed spawn at %s, want %s (end of the cooldown)", at.Sub(epoch), due.Sub(epoch))
	}
	w.noAutoStart = false
	cmds = w.tick(due.Sub(epoch))
	one[core.Claim](t, cmds)
	one[core.Spawn](t, cmds)
	w.wantRow(1, "b", "running")
}

// Feature: start-up / shutdown safety.

func TestShutdownStopsWorkersAndResetsTheirRowsAndTheUnassigned(t *testing.T) {
	w := newWorld(t, `
[stage-a]
PROGRAM = a
PARALLELISM = 1
QUEUE_LIMIT = 2
`)
	w.noAutoStart = true
	cmds := w.start("a", 2) // claimed, worker still starting: both unassigned
	sp := one[core.Spawn](t, cmds)
	cmds = w.step(core.Shutdown{})
	one[core.Stop](t, cmds)
	for _, id := range []int64{1, 2} {
		if it := itemFor(t, cmds, id); it.Verdict != core.Requeue {
			t.Errorf("claimed-but-unassigned %d: %v, want pending", id, it)
		}
	}
	w.wantRow(1, "a", "pending")
	none[core.Exit](t, cmds, "exited before its worker")
	cmds = w.exit(sp.Worker, 0, "")
	if e := one[core.Exit](t, cmds); e.Code != 0 {
		t.Errorf("exit code %d", e.Code)
	}
}

func TestShutdownRequeuesWhatAWorkerDidNotAnswer(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 3)
	w.step(core.Shutdown{})
	w.finish(1) // it answers the head after stdin closed, then is killed
	cmds := w.tick(10 * time.Second)
	one[core.Kill](t, cmds)
	cmds = w.exit(1, -1, "killed")
	for _, id := range []int64{2, 3} {
		if it := itemFor(t, cmds, id); it.Verdict != core.Requeue {
			t.Errorf("unanswered %d at shutdown: %v, want pending", id, it)
		}
	}
	w.wantRow(1, "a", "done")
	w.wantRow(2, "a", "pending")
	one[core.Exit](t, w.all)
}

// Writes while the database is away.

func TestWritesOwedDuringAnOutageAreSentWhenTheDatabaseIsBack(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 3)
	w.failQueue = "connection refused"
	cmds := w.advance(1, "b")
	one[core.Resolve](t, cmds)
	cmds = w.finish(1)
	none[core.Resolve](t, cmds, "wrote while the database is down")
	w.failQueue = ""
	cmds = w.step(core.DatabaseUp{})
	r := one[core.Resolve](t, cmds)
	if len(r.Items) != 2 {
		t.Fatalf("resolve after the outage has %v, want both owed answers", r.Items)
	}
	w.wantRow(1, "b", "running")
	w.wantRow(2, "a", "done")
}

func TestLostClaimReplyResetsTheRowsItMayHaveClaimed(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.q.Insert("a", 2)
	w.loseReplies = true
	w.step(core.Ingress{}) // claims 2, 3 but the reply is lost
	w.loseReplies = false
	w.wantRow(2, "a", "running")
	cmds := w.step(core.DatabaseUp{})
	reset := one[core.ResetOrphans](t, cmds)
	if len(reset.Keep) != 1 || reset.Keep[0] != 1 {
		t.Errorf("reset keeps %v, want [1] (held by w1)", reset.Keep)
	}
	if w.row(1).Status != "running" {
		t.Errorf("row 1 (held) was reset")
	}
	if w.head(1) != 1 || len(w.held[1]) != 3 {
		t.Errorf("rows 2, 3 not claimed again after the reset: w1 holds %v", w.held[1])
	}
}

func TestLostResolveReplyIsResentSafely(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.loseReplies = true
	w.advance(1, "b") // requeued to pending at b, reply lost
	w.loseReplies = false
	w.step(core.DatabaseUp{})
	w.wantRow(1, "b", "running") // resent: left alone, then claimed for b
	if len(of[core.Write](w.all)) != 2 {
		t.Errorf("message 1 not handed to b exactly once:\n%s", list(w.all))
	}
}

// Found by the simulator (testdata/sim/seeds.txt): a stage pauses its message briefly and
// answers 0; the transaction that resolves the answer also wakes the row, and its
// reply is lost, after the same transaction woke the row and claimed it again.
// The reset after the lost claim must not keep the row (its resolve may already
// have been applied), so the re-sent item finds it pending instead of failing it
// as a stage bug.
func TestRowItsStagePausedIsNotFailedWhenTheReplyOfTheTransactionThatWokeItIsLost(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	id := w.head(1)
	w.at(30 * time.Second) // the heartbeat is due: this step's transaction wakes due rows
	if !w.q.StageWrite(id, "a", "a", "paused", w.now) {
		t.Fatalf("stage write of %d failed", id)
	}
	w.held[1] = w.held[1][1:]
	w.loseReplies = true
	w.step(core.Answer{Worker: 1, Line: "0"}) // resolve, wake and claim commit; the reply is lost
	w.loseReplies = false
	w.step(core.DatabaseUp{})
	if r := w.row(id); r.Status == "failed" {
		t.Fatalf("message %d was failed (%q) although its stage paused it before answering 0", id, r.DispatchError)
	}
	w.wantRow(id, "a", "running") // reset, then claimed again at a
	if w.head(1) != id {
		t.Errorf("message %d not handed to stage a again", id)
	}
}

// Found by the simulator (testdata/sim/seeds.txt): a claim's reply is lost, so rows it took may
// be running with no one holding them; a graceful shutdown must reset them before
// it exits 0 ("every row was reset or resolved").
func TestShutdownResetsRowsALostClaimMayHaveTakenBeforeExitingZero(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	w.q.Insert("a", 1)
	w.loseReplies = true
	w.step(core.Ingress{}) // claims row 1; the reply is lost
	w.loseReplies = false
	w.wantRow(1, "a", "running")
	none[core.Exit](t, w.step(core.Shutdown{}), "exited while a lost claim's row may be running")
	cmds := w.step(core.DatabaseUp{})
	one[core.ResetOrphans](t, cmds)
	if e := one[core.Exit](t, cmds); e.Code != 0 {
		t.Errorf("exit code %d after resetting everything, want 0", e.Code)
	}
	w.wantRow(1, "a", "pending")
}

// Feature: statistics.

func TestStatisticsAreFlushedAsDeltasOnIdleAndNeverEmpty(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(2 * time.Second)
	w.answer(1, "b", "running", "0 x:100 y:200")
	w.at(3 * time.Second)
	cmds := w.finish(2)
	f := one[core.Flush](t, cmds)
	if f.StagePasses != 4 || f.MessagesLeft != 1 {
		t.Errorf("flush passes=%d left=%d, want 4 (a, x, y, b) and 1", f.StagePasses, f.MessagesLeft)
	}
	st, passes, left, _ := w.q.Stats()
	if passes != 4 || left != 1 || st["x"].Processed != 1 || st["x"].ProcessingUS != 100 || st["a"].Processed != 1 {
		t.Errorf("stats after flush: passes %d left %d %+v", passes, left, st)
	}
	// a's own time excludes the fused stages' 300µs of its 2s pass.
	if st["a"].ProcessingUS != 2_000_000-300 {
		t.Errorf("a processing_us = %d, want %d", st["a"].ProcessingUS, 2_000_000-300)
	}
	cmds = w.tick(time.Hour)
	none[core.Flush](t, cmds, "an empty flush")
}

func TestIdleFlushHappensAtMostOnceASecond(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(1500 * time.Millisecond)
	w.finish(1)
	w.at(1600 * time.Millisecond)
	if f := of[core.Flush](w.step()); len(f) != 0 {
		t.Fatalf("flush issued twice")
	}
	if f := of[core.Flush](w.all); len(f) != 1 {
		t.Fatalf("going idle at 1.5s flushed %d times, want once", len(f))
	}
	w.q.Insert("a", 1)
	w.step(core.Ingress{})
	w.at(1800 * time.Millisecond)
	cmds := w.finish(1) // idle again 0.3s after the last flush
	none[core.Flush](t, cmds, "a second idle flush within a second")
	cmds = w.tick(2500 * time.Millisecond)
	if f := one[core.Flush](t, cmds); f.MessagesLeft != 1 {
		t.Errorf("deferred idle flush %v", f)
	}
}

func TestStatisticsFlushEveryStatsIntervalWhileBusy(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	w.at(10 * time.Second)
	cmds := w.finish(1) // 2 still held: not idle
	none[core.Flush](t, cmds, "flushed while busy before STATS_INTERVAL")
	cmds = w.tick(60 * time.Second)
	f := one[core.Flush](t, cmds)
	if f.Seq != 1 || f.MessagesLeft != 1 {
		t.Errorf("periodic flush %v", f)
	}
}

func TestLostFlushIsResentUnchangedAndAppliedOnce(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(2 * time.Second)
	w.loseReplies = true
	w.finish(1) // resolve + (next step) flush: the replies are lost
	w.loseReplies = false
	w.step(core.DatabaseUp{})
	w.tick(3 * time.Second)
	flushAll(w)
	_, passes, left, _ := w.q.Stats()
	if passes != 1 || left != 1 {
		t.Errorf("after a lost and resent flush: passes %d left %d, want 1 and 1", passes, left)
	}
}

func flushAll(w *world) {
	w.t.Helper()
	w.tick(w.now.Sub(epoch) + 2*time.Minute)
}

func indexOf(cmds []core.Command, c core.Command) int {
	for i, x := range cmds {
		if x.String() == c.String() {
			return i
		}
	}
	return -1
}

func TestStatisticsOfACoreThatLostItsLockAreCarriedToTheNextCore(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 3) // w1 holds 1, 2, 3
	w.at(2 * time.Second)
	w.finish(1) // counted, not yet flushed: 2 and 3 are still held
	w.loseReplies = true
	w.tick(61 * time.Second) // the periodic flush is applied, but its reply is lost
	w.loseReplies = false
	w.finish(1) // counted while the database looks down: not sent
	carry := w.c.Unflushed()
	if len(carry) != 2 || carry[0].Seq == 0 || carry[1].Seq != 0 {
		t.Fatalf("Unflushed = %v, want the lost flush (with its Seq) and the unsent deltas", carry)
	}
	w.restart(carry)
	w.wantRow(3, "a", "running") // reset, claimed again by the new core
	flushAll(w)
	st, passes, left, _ := w.q.Stats()
	// Passes: 1 and 2 answered by the first core; the lost flush was applied and
	// must not be added twice, the unsent one must not be lost. Only message 1 was
	// seen leaving: the resolve that would have shown 2 done was never sent.
	if passes != 2 || left != 1 || st["a"].Processed != 2 {
		t.Errorf("after the restart: passes %d left %d processed %d, want 2, 1, 2", passes, left, st["a"].Processed)
	}
}

func TestRowPausedWithADueTimeoutIsNotWokenBeforeItsAnswerIsRead(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	id := w.head(1)
	w.at(30 * time.Second) // the heartbeat is due
	// The stage paused the row until a moment already past and committed; its
	// answer has not been read yet.
	if !w.q.StageWrite(id, "a", "a", "paused", epoch) {
		t.Fatal("stage write failed")
	}
	cmds := w.step(core.Tick{})
	if wake := one[core.Wake](t, cmds); len(wake.Keep) != 1 || wake.Keep[0] != id {
		t.Errorf("wake keeps %v, want [%d] (handed, unanswered)", wake.Keep, id)
	}
	w.wantRow(id, "a", "paused")
	none[core.Write](t, cmds, "a message handed out again while its worker holds it")
	// Once the answer is read, the due pause is woken and the message runs again.
	w.held[1] = w.held[1][1:]
	cmds = w.step(core.Answer{Worker: 1, Line: "0"})
	if ws := of[core.Write](cmds); len(ws) != 1 || ws[0].IDs[0] != id {
		t.Errorf("message %d not handed out again after its pause was resolved: %v", id, ws)
	}
	if r := w.row(id); r.Status != "running" {
		t.Errorf("row %d is %s, want running again", id, r.Status)
	}
}

func TestAfterASecondShutdownTheCoreAsksForNoTimerItCannotServe(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	w.at(500 * time.Millisecond)
	w.finish(1) // counted; not flushed yet (within a second of the start)
	w.step(core.Shutdown{})
	w.step(core.Shutdown{}) // now: workers killed, nothing more is written
	cmds := w.tick(2 * time.Minute)
	for _, tm := range of[core.SetTimer](cmds) {
		if !tm.At.IsZero() && !tm.At.After(w.now) {
			t.Fatalf("timer at %v, not after now (%v): the shell would spin until the workers exit", tm.At.Sub(epoch), w.now.Sub(epoch))
		}
	}
	if e := one[core.Exit](t, w.exit(1, -1, "killed")); e.Code != 1 {
		t.Errorf("exit code %d after an immediate shutdown with unwritten results, want 1", e.Code)
	}
}

func TestHeartbeatResetsRunningRowsNoOneHolds(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1) // w1 holds 1
	// A transaction of a session that lost the lock commits late: it claims row 2,
	// which this core knows nothing of.
	w.q.Insert("a", 1)
	w.q.Exec(t.Context(), []core.Command{core.Claim{Op: 999, Caps: []core.Cap{{Stage: "a", N: 1}}}})
	w.wantRow(2, "a", "running")
	cmds := w.tick(30 * time.Second)
	reset := one[core.ResetOrphans](t, cmds)
	if len(reset.Keep) != 1 || reset.Keep[0] != 1 {
		t.Errorf("heartbeat reset keeps %v, want [1] (held by w1)", reset.Keep)
	}
	w.wantRow(1, "a", "running")
	if got := w.held[1]; len(got) != 2 || got[1] != 2 {
		t.Errorf("the orphan was not reset and handed out: w1 holds %v", got)
	}
}

// Feature: answers that carry the transition ("0 >TARGET").

// answerMove makes worker wid answer line for its head without writing the row.
func answerMove(w *world, wid core.WorkerID, line string) []core.Command {
	return w.answer(wid, "", "", line)
}

func TestAnsweredAdvanceIsWrittenByTheDispatcherAndClaimedAtTheNextStage(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	cmds := answerMove(w, 1, `0 >b {"seen":true}`)
	it := itemFor(t, cmds, 1)
	if it.Verdict != core.Move || it.To != "b" || it.Patch != `{"seen":true}` || it.Epoch != "" || it.Reason != "" {
		t.Fatalf("item %v, want a move to b carrying the patch", it)
	}
	if w.q.Rows()[0].State != `{"seen":true}` {
		t.Errorf("state %q, want the patch merged", w.q.Rows()[0].State)
	}
	// The next stage's claim comes in the same step as the result: one write per hop.
	if cl := of[core.Claim](cmds); len(cl) == 0 || !slices.ContainsFunc(cl[len(cl)-1].Caps, func(c core.Cap) bool { return c.Stage == "b" }) {
		t.Fatalf("no claim for stage b after the move:\n%s", list(cmds))
	}
	w.wantRow(1, "b", "running")
	flushAll(w)
	stages, passes, _, _ := w.q.Stats()
	if stages["a"].Processed != 1 || passes != 1 {
		t.Errorf("stats %v passes %d, want the answered pass counted as processed at a", stages["a"], passes)
	}
}

func TestAnsweredDoneAndPauseAreWrittenStraightToWhatTheRowBecomes(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	cmds := answerMove(w, 1, "0 >done")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Move || it.To != core.TargetDone {
		t.Fatalf("item %v, want a move to done", it)
	}
	w.wantRow(1, "a", "done")
	w.at(10 * time.Second)
	cmds = answerMove(w, 1, "0 >paused:2.5")
	it := itemFor(t, cmds, 2)
	if want := epoch.Add(12500 * time.Millisecond); it.Verdict != core.Move || it.To != core.TargetPaused || !it.Until.Equal(want) {
		t.Fatalf("item %v, want a pause until %s", it, want)
	}
	w.wantRow(2, "a", "paused")
	// The core learnt the timeout from the outcome and wakes it then.
	if timer := of[core.SetTimer](cmds); len(timer) == 0 || !timer[len(timer)-1].At.Equal(it.Until) {
		t.Fatalf("want a timer at the answered timeout %s:\n%s", it.Until, list(cmds))
	}
	w.tick(12500 * time.Millisecond)
	w.wantRow(2, "a", "running")
}

func TestAnsweredTransitionsMixWithBareAnswersInOneWorker(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 3)
	answerMove(w, 1, "0 >b")
	w.advance(1, "b")
	cmds := w.finish(1)
	if it := itemFor(t, cmds, 3); it.Verdict != core.Answered {
		t.Errorf("item %v after a bare 0, want answered", it)
	}
	w.wantRow(1, "b", "running")
	w.wantRow(2, "b", "running")
	w.wantRow(3, "a", "done")
}

func TestAnUnwritableTransitionFailsItsMessageAndTheWorkerLivesOn(t *testing.T) {
	for _, line := range []string{"0 >zz", "0 >paused:-1", `0 >b {"x":`} {
		t.Run(line, func(t *testing.T) {
			w := newWorld(t, threeStages)
			w.start("a", 2)
			cmds := answerMove(w, 1, line)
			none[core.Kill](t, cmds, "an unwritable transition is not a protocol error")
			if it := itemFor(t, cmds, 1); it.Verdict != core.Fail || !strings.Contains(it.Reason, "cannot have") {
				t.Fatalf("item %v, want the message failed with a reason", it)
			}
			w.wantRow(1, "a", "failed")
			w.wantRow(2, "a", "running")
		})
	}
}

func TestAGuardMissWritesNothingAndIsCountedAndLogged(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	// The stage both wrote its advance and answered one: the dispatcher's write
	// misses its guard, the row is requeued where the stage put it.
	cmds := w.answer(1, "c", "running", "0 >b")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Move || it.To != "b" {
		t.Fatalf("item %v, want a move to b", it)
	}
	found := false
	for _, l := range of[core.Log](cmds) {
		found = found || strings.Contains(l.Msg, "no longer running")
	}
	if !found {
		t.Errorf("no log line for the guard miss:\n%s", list(cmds))
	}
	w.wantRow(1, "c", "running")
	flushAll(w)
	if stages, _, _, _ := w.q.Stats(); stages["a"].GuardMisses != 1 {
		t.Errorf("guard misses of a = %d, want 1", stages["a"].GuardMisses)
	}
}

func TestAMoveWhoseReplyWasLostIsNotCountedAsAGuardMiss(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.loseReplies = true
	answerMove(w, 1, "0 >done")
	w.loseReplies = false
	w.at(2 * time.Second)
	w.step(core.DatabaseUp{})
	w.wantRow(1, "a", "done")
	flushAll(w)
	if stages, _, left, _ := w.q.Stats(); stages["a"].GuardMisses != 0 || left != 1 {
		t.Errorf("guard misses %d, messages left %d: want 0 and 1 (the re-sent move found its own write)", stages["a"].GuardMisses, left)
	}
}
