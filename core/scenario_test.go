package core_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Feature: event-driven, batched claiming.

// Proves: start-up resets every running row (it holds none yet), then one Claim
// takes up to QUEUE_LIMIT × PARALLELISM pending rows of every stage.
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
	// That one claim took the rows of both stages with pending work, a's up to its cap:
	// b's are 1 and 2, a's are 3 to 12, of which 3 to 8 fit.
	w.wantRow(1, "b", core.StatusRunning)
	w.wantRow(2, "b", core.StatusRunning)
	w.wantRow(8, "a", core.StatusRunning)
	w.wantRow(9, "a", core.StatusPending)
}

// Proves: rows inserted without a notification wait (for the heartbeat); an Ingress
// claims them at once.
func TestIngressClaimsOnlyWhenNotifiedOrPolled(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0) // nothing pending: the claim returns less than the caps
	w.settle()      // it waits for notifications: every producer notifies
	w.q.Insert("a", 2)
	none[core.Claim](t, w.tick(time.Second), "no claim without a notification before the heartbeat")
	w.wantRow(1, "a", core.StatusPending)
	claim := one[core.Claim](t, w.step(core.Ingress{}))
	if capsOf(claim)["a"] != 6 {
		t.Errorf("claim after ingress: caps %v, want a:6", claim.Caps)
	}
	w.wantRow(1, "a", core.StatusRunning)
	w.wantRow(2, "a", core.StatusRunning)
}

// Proves: a pending row whose NOTIFY was lost is claimed by the heartbeat, at
// POLL_INTERVAL, which the core asks a timer for.
func TestHeartbeatFindsWorkWhoseNotificationWasLost(t *testing.T) {
	w := newWorld(t, threeStages)
	cmds := w.start("a", 0)
	cmds = append(cmds, w.settle()...) // it waits for notifications: every producer notifies
	if at := lastTimer(t, cmds); !at.Equal(epoch.Add(30 * time.Second)) {
		t.Errorf("timer after start-up at %s, want the heartbeat at 30s (POLL_INTERVAL)", at.Sub(epoch))
	}
	w.q.Insert("a", 1) // NOTIFY lost: no Ingress event
	none[core.Claim](t, w.tick(29*time.Second), "no claim before POLL_INTERVAL")
	cmds = w.tick(30 * time.Second)
	one[core.Wake](t, cmds)
	if c := one[core.Claim](t, cmds); capsOf(c)["a"] != 6 {
		t.Errorf("heartbeat claim caps %v", c.Caps)
	}
	if wr := one[core.Write](t, cmds); !slices.Equal(wr.IDs, []int64{1}) {
		t.Errorf("heartbeat handed out %v, want [1] (the row whose notification was lost)", wr.IDs)
	}
}

// Proves: the gate (core.Rest, core.Busy): producers notify only while the
// dispatcher waits, so before it relies on notifications the core takes the gate
// and looks once more, and a row a producer committed without notifying is
// claimed then.
func TestAnIdleCoreRestsAndLooksOnceMoreBeforeItReliesOnNotifications(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	// Before RestAfter has passed the core counts as busy: producers do not
	// notify, and it asks for a tick to rest.
	w.q.Insert("a", 1) // no notification: the dispatcher looked busy
	cmds := w.tick(core.RestAfter / 2)
	none[core.Rest](t, cmds, "no rest before RestAfter")
	cmds = w.tick(core.RestAfter)
	one[core.Rest](t, cmds)
	// The harness grants the gate at once; the answer brings the last look, which
	// finds the row, and the core declares itself busy again.
	claim := one[core.Claim](t, cmds)
	if indexOf(cmds, one[core.Rest](t, cmds)) > indexOf(cmds, claim) {
		t.Errorf("the last look must come after the rest:\n%s", list(cmds))
	}
	one[core.Busy](t, cmds)
	w.wantRow(1, "a", core.StatusRunning)
}

// Proves: a move that claims at its target is a claim that found work, like a
// claim's rows: RestAfter counts from its reply, however long its transaction
// took. A message whose stages answer promptly goes through them without a
// Rest and a last look between its hops (each a transaction the next hop's
// resolve would wait for, while producers' commits notify); once its last
// hop's reply finds nothing more, the core rests.
func TestAMoveThatClaimsCountsAsWorkFoundForRestAfter(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.replyAfter = 2 * core.RestAfter // every transaction outlasts RestAfter
	for _, hop := range []struct{ from, line string }{{"a", "0 >b"}, {"b", "0 >c"}} {
		w.now = w.now.Add(core.RestAfter / 2) // the stage answers promptly
		cmds := answerMove(w, workerAt(t, w, hop.from), hop.line)
		if it := items(cmds)[0]; !it.Claim {
			t.Fatalf("%s at %s: item %v does not claim", hop.line, hop.from, it)
		}
		none[core.Rest](t, cmds, hop.line+" at "+hop.from+": the move claimed, and RestAfter has not passed since its reply")
	}
	w.now = w.now.Add(core.RestAfter / 2)
	cmds := answerMove(w, workerAt(t, w, "c"), "0 >done")
	one[core.Rest](t, cmds)
	w.wantRow(1, "c", core.StatusDone)
}

// workerAt is the worker of stage that holds a message.
func workerAt(t *testing.T, w *world, stage string) core.WorkerID {
	t.Helper()
	for wid, ids := range w.held {
		if w.stageOf[wid] == stage && len(ids) > 0 {
			return wid
		}
	}
	t.Fatalf("no worker of %s holds a message", stage)
	return 0
}

// Proves: a core whose last look after taking the gate finds nothing stays
// resting (no Busy, no second Rest), and a notification that brings work makes
// it busy again.
func TestARestingCoreStaysRestingWhenItsLastLookFindsNothing(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	cmds := w.settle()
	one[core.Rest](t, cmds)
	one[core.Claim](t, cmds)
	none[core.Busy](t, cmds, "nothing found: it keeps waiting")
	none[core.Rest](t, w.tick(time.Second), "already resting")
	// A notification that brings work makes it busy.
	w.q.Insert("b", 1)
	cmds = w.step(core.Ingress{})
	one[core.Claim](t, cmds)
	one[core.Busy](t, cmds)
}

// Proves: a gate that cannot be taken (Resting with an error) makes the core
// look at once, since no one notifies it, and not ask for the gate again at
// once.
func TestAGateThatCannotBeTakenIsAskedForAgainAfterALook(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	w.at(core.RestAfter)
	cmds := w.c.Step(w.now, core.Tick{})
	one[core.Rest](t, cmds)
	w.q.Insert("a", 1)
	cmds = w.step(core.Resting{Err: "connection refused"})
	// No one notifies: the core looks now, and asks again later.
	one[core.Claim](t, cmds)
	none[core.Rest](t, cmds, "no second rest at once")
	w.wantRow(1, "a", core.StatusRunning)
}

// Proves: while a Rest waits for the gate (a producer that inserted while the
// core was busy stays in its transaction), the core keeps looking every
// LookEvery, so rows that other producers committed meanwhile without
// notifying do not wait for that one transaction, nor for the heartbeat.
func TestTheCoreKeepsLookingWhileItsRestWaitsForTheGate(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	w.at(core.RestAfter)
	cmds := w.c.Step(w.now, core.Tick{})
	one[core.Rest](t, cmds)
	if timer := one[core.SetTimer](t, cmds); !timer.At.Equal(w.now.Add(core.LookEvery)) {
		t.Errorf("timer at %v while the Rest is outstanding, want LookEvery after it (%v)", timer.At, w.now.Add(core.LookEvery))
	}
	// Committed without a notification; no Resting comes.
	w.q.Insert("b", 1)
	none[core.Claim](t, w.c.Step(w.now.Add(core.LookEvery-time.Nanosecond), core.Tick{}), "a look before LookEvery")
	cmds = w.c.Step(w.now.Add(core.LookEvery), core.Tick{})
	if c := one[core.Claim](t, cmds); len(c.Caps) != 3 {
		t.Errorf("the look while asking claims %v, want every stage", c.Caps)
	}
	none[core.Rest](t, cmds, "the Rest is still outstanding")
}

// Proves: the pause between the looks while a Rest waits for the gate does not
// grow with the wait. A producer that holds its transaction open for seconds
// (it inserted while the core was busy, so the Rest waits for it) holds back
// the rows other producers commit meanwhile without a notification for at most
// LookEvery, also 300 ms into the wait (a pause that doubled from 10 ms
// would be 160 ms by then). Each look walks above the stages' floors: such
// rows are above them, and the dead index entries below are not walked again
// a hundred times a second.
func TestTheLooksWhileARestWaitsDoNotBackOff(t *testing.T) {
	w := newWorld(t, threeStages)
	w.finish(workersOf(w.start("a", 1))[0]) // row 1 is done: a's floor rises to 1
	w.at(w.now.Sub(epoch) + core.RestAfter)
	rested := w.now
	looks := w.unwatched(rested.Add(300*time.Millisecond), nil)
	w.q.Insert("b", 1) // committed without a notification
	inserted := w.now
	looks = append(looks, w.unwatched(rested.Add(400*time.Millisecond), nil)...)
	wantLooksEvery(t, looks, rested, core.LookEvery)
	if first := firstAfter(looks, inserted); first.Sub(inserted) > core.LookEvery {
		t.Errorf("a row committed %s into the wait was claimed %s after its commit, want at most LookEvery (%s)",
			inserted.Sub(rested), first.Sub(inserted), core.LookEvery)
	}
	w.wantRow(2, "b", core.StatusRunning)
	for _, l := range looks {
		if capsAfter(l.claim)["a"] < 1 {
			t.Errorf("the look at %s into the wait walks stage a from %d, want from its floor 1: %s",
				l.at.Sub(rested), capsAfter(l.claim)["a"], l.claim)
			break
		}
	}
}

// Proves: while the gate cannot be taken (no producer notifies then), the core
// looks every LookEvery until a Rest takes it, although it asks for the gate
// again only after a pause that doubles up to RestRetryMax.
func TestTheCoreLooksEveryLookEveryWhileTheGateCannotBeTaken(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	w.at(core.RestAfter)
	from := w.now
	looks := w.unwatched(from.Add(700*time.Millisecond), core.Resting{Err: "gate: connection refused"})
	wantLooksEvery(t, looks, from, core.LookEvery)
}

// Proves: a lost gate (RestLost: its connection died, so producers stopped
// notifying) makes the core look at once, and a row committed meanwhile is
// claimed.
func TestALostGateMakesTheCoreLookAgain(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	w.settle()
	w.q.Insert("c", 1) // the gate's connection died: producers stopped notifying
	cmds := w.step(core.RestLost{})
	one[core.Claim](t, cmds)
	w.wantRow(1, "c", core.StatusRunning)
}

// Proves: when an answer and a notification arrive in one Step, the answer frees its
// slot before the claim is sized, so that claim fills the slot.
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
	w.q.StageWrite(id, "a", "a", core.StatusDone, time.Time{})
	w.held[1] = w.held[1][1:]
	cmds := w.step(core.Ingress{}, core.Answer{Worker: 1, Line: "0"})
	claim := one[core.Claim](t, cmds)
	if capsOf(claim)["a"] != 1 {
		t.Errorf("claim cap after one answer = %v, want a:1", claim.Caps)
	}
	if r := one[core.Resolve](t, cmds); len(r.Items) != 1 {
		t.Errorf("resolve: %v", r)
	}
	if wr := one[core.Write](t, cmds); wr.Worker != 1 || !slices.Equal(wr.IDs, []int64{3}) {
		t.Errorf("%s, want message 3 written to w1 in the slot the answer freed", wr)
	}
}

// Proves: no queue command is issued while a transaction's results are outstanding,
// and a notification that came meanwhile is claimed for once they are back.
func TestOnlyOneQueueTransactionIsOutstanding(t *testing.T) {
	w := newWorld(t, threeStages)
	w.q.Insert("a", 1)
	cmds := w.c.Step(epoch, core.Start{})
	one[core.Claim](t, cmds)
	// Results not delivered yet: another notification must not start a second claim.
	more := w.c.Step(epoch.Add(time.Millisecond), core.Ingress{})
	none[core.Claim](t, more, "a second claim while the first is outstanding")
	none[core.Resolve](t, more, "a queue write while a transaction is outstanding")
	for _, c := range more {
		if core.IsQueue(c) {
			t.Errorf("queue command %q issued while the first transaction is outstanding", c)
		}
	}
	// The first transaction's results come back: the notification is not lost.
	var txn []core.Command
	for _, c := range cmds {
		if core.IsQueue(c) {
			txn = append(txn, c)
		}
	}
	after := w.c.Step(epoch.Add(2*time.Millisecond), w.q.Exec(t.Context(), txn)...)
	if claims := of[core.Claim](after); len(claims) != 1 || capsOf(claims[0])["a"] == 0 {
		t.Errorf("want a claim for a once the outstanding transaction is back (an Ingress came while it was out), got:\n%s", list(after))
	}
}

// Feature: persistent, pipelined workers.

// Proves: a worker is handed its first QUEUE_LIMIT ids, oldest first, in one write,
// and no more than QUEUE_LIMIT × PARALLELISM rows are claimed.
func TestWorkerIsHandedUpToQueueLimitIdsInOneWrite(t *testing.T) {
	w := newWorld(t, threeStages)
	cmds := w.start("b", 6)
	writes := of[core.Write](cmds)
	if len(writes) != 1 || len(writes[0].IDs) != 4 {
		t.Fatalf("want one write of 4 ids (QUEUE_LIMIT of b), got %v", writes)
	}
	if !slices.Equal(writes[0].IDs, []int64{1, 2, 3, 4}) {
		t.Errorf("wrote %v, want the oldest four, [1 2 3 4] in that order", writes[0].IDs)
	}
	if n := len(of[core.Spawn](cmds)); n != 1 {
		t.Errorf("stage b (PARALLELISM 1) spawned %d workers", n)
	}
	// Stage b's in-flight capacity is QUEUE_LIMIT × PARALLELISM = 4: two stay pending.
	w.wantRow(5, "b", core.StatusPending)
	w.wantRow(6, "b", core.StatusPending)
}

// Feature: elastic per-stage pools.

// Proves: claimed ids fill one worker up to QUEUE_LIMIT before the next gets any,
// and new work goes to the busiest worker that has room, not to an idle one.
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
	if !slices.Equal(w.held[1], []int64{1, 2, 3, 4}) || !slices.Equal(w.held[2], []int64{5}) {
		t.Errorf("w1 holds %v and w2 %v, want w1 [1 2 3 4] (filled first) and w2 [5]", w.held[1], w.held[2])
	}
	// A new message goes to the busier worker that has room, not to an idle one.
	w.finish(2)
	w.finish(1)
	w.q.Insert("a", 1)
	cmds = w.step(core.Ingress{})
	if wr := one[core.Write](t, cmds); wr.Worker != 1 {
		t.Errorf("new message went to %s, want w1 (it still holds work)", wr.Worker)
	} else if !slices.Equal(wr.IDs, []int64{6}) {
		t.Errorf("w1 was written %v, want [6] (the new message)", wr.IDs)
	}
}

// Proves: a stage runs at most PARALLELISM workers of at most QUEUE_LIMIT ids each;
// a slot an answer frees is refilled, not given to a new worker.
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
	for _, wid := range []core.WorkerID{1, 2, 3} {
		if len(w.held[wid]) != 1 {
			t.Errorf("%s holds %v, want one id (each of the 3 workers is full)", wid, w.held[wid])
		}
	}
	w.wantRow(4, "c", core.StatusPending) // 3 × 1 in flight: the rest waits
	// Answers free slots but never create a fourth worker.
	cmds = w.finish(1)
	none[core.Spawn](t, cmds, "no fourth worker")
	if wr := one[core.Write](t, cmds); wr.Worker != 1 || !slices.Equal(wr.IDs, []int64{4}) {
		t.Errorf("%s, want message 4 written to w1, whose slot the answer freed", wr)
	}
	w.wantRow(5, "c", core.StatusPending)
}

// Proves: a worker idle for WORKER_IDLE_TIMEOUT is stopped then, at a timer the core
// asks for, not before, and its clean exit afterwards is quiet.
func TestIdleWorkersAreStoppedAfterIdleTimeout(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(time.Second)
	cmds := w.finish(1)
	cmds = append(cmds, w.settle()...) // the core rests first (RestAfter)
	if at := lastTimer(t, cmds); !at.Equal(epoch.Add(6 * time.Second)) {
		t.Errorf("timer after w1 went idle at 1s: %s, want 6s (WORKER_IDLE_TIMEOUT later)", at.Sub(epoch))
	}
	none[core.Stop](t, w.tick(5*time.Second+999*time.Millisecond), "reaped before WORKER_IDLE_TIMEOUT")
	stop := one[core.Stop](t, w.tick(6*time.Second))
	if stop.Worker != 1 {
		t.Errorf("stopped %s, want w1", stop.Worker)
	}
	cmds = w.exit(1, 0, "")
	if strings.Contains(list(cmds), "crash") || len(items(cmds)) != 0 {
		t.Errorf("a clean exit after stop must be quiet:\n%s", list(cmds))
	}
}

// Proves: a worker handed MAX_MESSAGES ids gets no more, is stopped only once it has
// answered them all, and a fresh worker takes the rest.
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
	if s := one[core.Stop](t, cmds); s.Worker != 1 {
		t.Errorf("stopped %s, want w1 (drained after MAX_MESSAGES)", s.Worker)
	}
	cmds = w.exit(1, 0, "")
	if ids := workersOf(cmds); len(ids) != 1 || ids[0] != 2 {
		t.Fatalf("after recycling, want a fresh w2, got spawns %v:\n%s", ids, list(cmds))
	}
	if len(w.held[2]) != 2 {
		t.Errorf("w2 holds %v, want the remaining 2", w.held[2])
	}
	if !slices.Equal(w.held[2], []int64{4, 5}) {
		t.Errorf("w2 holds %v, want [4 5]", w.held[2])
	}
}

// Proves: after a failed spawn the stage spawns nothing for CooldownMin, asks a timer
// for the cooldown's end, and spawns for the stage then.
func TestProgramThatCannotStartIsHeldOffWithCooldown(t *testing.T) {
	w := newWorld(t, threeStages)
	w.noAutoStart = true
	cmds := w.start("b", 1)
	sp := one[core.Spawn](t, cmds)
	cmds = w.step(core.SpawnFailed{Worker: sp.Worker, Err: "exec: \"b\": executable file not found in $PATH"})
	none[core.Spawn](t, cmds, "respawned during the cooldown")
	cmds = append(cmds, w.settle()...) // the core rests first (RestAfter)
	if at := lastTimer(t, cmds); !at.Equal(epoch.Add(core.CooldownMin)) {
		t.Errorf("timer after the failed spawn at %s, want %s (end of the cooldown)", at.Sub(epoch), core.CooldownMin)
	}
	none[core.Spawn](t, w.tick(999*time.Millisecond), "respawned during the cooldown")
	if sp := one[core.Spawn](t, w.tick(core.CooldownMin)); sp.Stage != "b" {
		t.Errorf("spawned for stage %s at the end of the cooldown, want b", sp.Stage)
	}
}

// Feature: requeue on advance, and the stage-bug guard.

// Proves: a row its stage advanced (a bare 0) is requeued at the next stage by the
// resolve, then claimed and handed to that stage's worker in the same step.
func TestAdvancedMessageIsRequeuedForTheNextStage(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	cmds := w.advance(1, "b")
	it := itemFor(t, cmds, 1)
	if it.Stage != "a" {
		t.Errorf("resolve item guarded by stage %q, want the claimed stage a", it.Stage)
	}
	if it.Verdict != core.Answered {
		t.Errorf("resolve item %v, want answered (the stage wrote the advance itself)", it)
	}
	// Requeued to pending at b, then claimed for b in the same transaction.
	claim := one[core.Claim](t, cmds)
	if capsOf(claim)["b"] == 0 {
		t.Errorf("stage b not claimed for after the advance: %v", claim.Caps)
	}
	w.wantRow(1, "b", core.StatusRunning)
	if ws := of[core.Write](cmds); len(ws) != 1 || ws[0].IDs[0] != 1 {
		t.Errorf("message 1 not handed to a b worker: %v", ws)
	} else if st := w.stageOf[ws[0].Worker]; st != "b" {
		t.Errorf("message 1 handed to %s of stage %s, want a worker of b", ws[0].Worker, st)
	}
}

// Proves: a bare 0 that left the row running at its stage fails it with a reason
// saying so, and it is not handed out again.
func TestZeroThatLeavesTheRowRunningFailsItAsAStageBug(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.answer(1, "", "", "0")
	w.wantRow(1, "a", core.StatusFailed)
	if r := w.row(1); !strings.Contains(r.DispatchError, "left the message running") {
		t.Errorf("dispatch_error %q does not say the stage left it running", r.DispatchError)
	}
	// And it is not claimed again: no loop.
	none[core.Write](t, w.tick(31*time.Second), "a stuck message handed out again")
}

// Proves: when a database crash since the claim may have lost the stage's own
// commit, a 0 that left the row running runs the stage again instead of failing it.
func TestStuckMessageIsRequeuedNotFailedAfterADatabaseCrash(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	id := w.head(1)
	w.q.StageWrite(id, "a", "b", core.StatusRunning, time.Time{})
	w.q.Crash() // PostgreSQL lost the stage's asynchronous commit
	w.held[1] = w.held[1][1:]
	w.step(core.Answer{Worker: 1, Line: "0"})
	if r := w.row(id); r.Status == core.StatusFailed {
		t.Fatalf("message %d failed as a stage bug although the crash lost the stage's commit", id)
	}
	w.wantRow(id, "a", core.StatusRunning) // requeued, then claimed again for a
	// The same stage runs it again.
	if w.head(1) != id {
		t.Errorf("message %d not handed to stage a again", id)
	}
}

// Feature: retry scheduling.

// Proves: a row its stage paused is woken at its timeout, not before, at a timer the
// core asks for, and handed out again.
func TestPausedRowIsWokenAtItsTimeout(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(10 * time.Second)
	w.answer(1, "a", core.StatusPaused, "0") // paused until 10s + 1m = 70s
	w.tick(30 * time.Second)                 // heartbeat: a wake that finds nothing due
	cmds := w.tick(60 * time.Second)
	w.wantRow(1, "a", core.StatusPaused)
	cmds = append(cmds, w.settle()...) // the core rests first (RestAfter)
	if at := lastTimer(t, cmds); !at.Equal(epoch.Add(70 * time.Second)) {
		t.Errorf("timer after the 60s heartbeat at %s, want the paused timeout at 70s", at.Sub(epoch))
	}
	cmds = w.tick(70 * time.Second)
	wake := one[core.Wake](t, cmds)
	if !wake.Now.Equal(epoch.Add(70 * time.Second)) {
		t.Errorf("wake at %v, want 70s", wake.Now.Sub(epoch))
	}
	w.wantRow(1, "a", core.StatusRunning)
	if wr := one[core.Write](t, cmds); wr.IDs[0] != 1 {
		t.Errorf("woken message not handed out: %v", wr)
	}
}

// Proves: once nothing earlier is due (the idle worker reaped), the core's timer is
// the earliest paused timeout.
func TestTimerAsksForTheEarliestPausedTimeout(t *testing.T) {
	w := newWorld(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = a
`)
	w.start("a", 1)
	w.at(time.Second)
	cmds := w.answer(1, "a", core.StatusPaused, "0")
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

// Proves: a scheduled message a producer inserted paused (not_before), due
// before any pause the core knew of, is woken at its time, not at the
// heartbeat: the core learns its time from the wake that follows the
// producer's notification.
func TestAScheduledMessageIsWokenAtItsTimeNotAtTheHeartbeat(t *testing.T) {
	w := newWorld(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = a
`)
	w.step(core.Start{})
	w.settle()
	w.at(time.Second)
	due := epoch.Add(50 * time.Second)
	ids, err := w.q.InsertIngress(context.Background(), []store.IngressRow{{Stage: "a", NotBefore: due}})
	if err != nil {
		t.Fatal(err)
	}
	w.wantRow(ids[0], "a", core.StatusPaused)
	cmds := w.step(core.Ingress{})
	cmds = append(cmds, w.settle()...)
	if at := lastTimer(t, cmds); !at.Equal(due) {
		t.Fatalf("timer after the producer's notification at %s, want the scheduled time, 50s", at.Sub(epoch))
	}
	cmds = w.tick(50 * time.Second)
	if wake := one[core.Wake](t, cmds); !wake.Now.Equal(due) {
		t.Errorf("wake at %v, want 50s", wake.Now.Sub(epoch))
	}
	w.wantRow(ids[0], "a", core.StatusRunning)
}

// Feature: crash and watchdog recovery.

// Proves: a non-zero answer fails only its message, with the worker's reason, and the
// same worker goes on to the next message.
func TestNonZeroAnswerFailsOneMessageAndTheWorkerLivesOn(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 3)
	cmds := w.answer(1, "", "", "3 invalid address: nobody@")
	none[core.Kill](t, cmds, "a worker answering non-zero must survive")
	none[core.Stop](t, cmds, "a worker answering non-zero must survive")
	if its := items(cmds); len(its) != 1 || its[0].ID != 1 || its[0].Verdict != core.Fail {
		t.Errorf("resolve items %v, want only message 1 failed", its)
	}
	w.wantRow(1, "a", core.StatusFailed)
	if r := w.row(1); r.DispatchError != "invalid address: nobody@" {
		t.Errorf("dispatch_error = %q, want the worker's reason", r.DispatchError)
	}
	w.advance(1, "b")
	w.wantRow(2, "b", core.StatusRunning)
}

// Proves: a crash fails the worker's head-of-line message, requeues the rest (which a
// new worker runs) and counts one crash.
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
	w.wantRow(2, "a", core.StatusFailed)
	if r := w.row(3); r.Status == core.StatusFailed {
		t.Errorf("message 3 never ran but was failed")
	}
	w.wantRow(3, "a", core.StatusRunning) // requeued, claimed again
	if ws := of[core.Write](cmds); len(ws) != 1 || !slices.Equal(ws[0].IDs, []int64{3}) || ws[0].Worker == 1 {
		t.Errorf("writes after the crash %v, want message 3 handed to a new worker", ws)
	}
	flushAll(w)
	st, _, _, _ := w.q.Stats()
	if st["a"].Crashes != 1 || st["a"].Failed != 1 {
		t.Errorf("stats for a: %+v, want 1 crash and 1 failed", st["a"])
	}
}

// Proves: a crashed worker's head that its stage had already advanced and committed
// is requeued at the next stage, not failed.
func TestCrashAfterTheHeadWasAdvancedRequeuesItInsteadOfFailing(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	w.at(time.Minute)
	id := w.head(1)
	w.q.StageWrite(id, "a", "b", core.StatusRunning, time.Time{}) // committed, then died
	w.exit(1, 1, "")
	if r := w.row(id); r.Status == core.StatusFailed || r.Stage != "b" {
		t.Errorf("advanced head is %s at %s, want requeued at b", r.Status, r.Stage)
	}
}

// Proves: MAX_RUNTIME is timed from when a message reached the head of its worker's
// pipeline; at that instant (a timer the core asks for) the worker is killed and the
// message becomes timeout.
func TestWatchdogTimesTheHeadFromWhenItReachedTheHead(t *testing.T) {
	w := newWorld(t, threeStages) // MAX_RUNTIME 300s
	w.start("a", 2)               // w1 holds 1, 2
	w.at(100 * time.Second)
	w.finish(1) // 2 reaches the head at 100s
	none[core.Kill](t, w.tick(300*time.Second), "timed from dispatch instead of from the head")
	cmds := w.tick(399 * time.Second)
	none[core.Kill](t, cmds, "killed before MAX_RUNTIME at the head")
	cmds = append(cmds, w.settle()...) // the core rests first (RestAfter)
	if at := lastTimer(t, cmds); !at.Equal(epoch.Add(400 * time.Second)) {
		t.Errorf("timer at %s, want 400s (message 2 reached the head at 100s, MAX_RUNTIME 300s)", at.Sub(epoch))
	}
	cmds = w.tick(400 * time.Second)
	if k := one[core.Kill](t, cmds); k.Worker != 1 {
		t.Errorf("killed %s", k.Worker)
	}
	cmds = w.exit(1, -1, "killed")
	if it := itemFor(t, cmds, 2); it.Verdict != core.TimeOut {
		t.Errorf("head item %v, want timeout", it)
	}
	w.wantRow(2, "a", core.StatusTimeout)
}

// Proves: each stage's watchdog is its own MAX_RUNTIME: a head at a stage that
// sets 10s is killed at 10s, with a reason that names 10s, while a head at a
// stage without one runs on to the dispatcher's 300s; the core's timer is the
// stage's deadline.
func TestEachStageTimesOutAtItsOwnMaxRuntime(t *testing.T) {
	w := newWorld(t, `
[pepsi-dispatch]
MAX_RUNTIME = 300
[stage-fast]
PROGRAM = fast
PARALLELISM = 1
MAX_RUNTIME = 10
[stage-slow]
PROGRAM = slow
PARALLELISM = 1
`)
	w.q.Insert("slow", 1)      // message 1
	cmds := w.start("fast", 1) // message 2
	cmds = append(cmds, w.settle()...)
	if at := lastTimer(t, cmds); !at.Equal(epoch.Add(10 * time.Second)) {
		t.Errorf("timer at %s, want 10s (fast's own MAX_RUNTIME)", at.Sub(epoch))
	}
	none[core.Kill](t, w.tick(9*time.Second), "fast's head killed before its MAX_RUNTIME")
	cmds = w.tick(10 * time.Second)
	if k := one[core.Kill](t, cmds); w.stageOf[k.Worker] != "fast" {
		t.Errorf("killed %s of stage %s, want fast's worker", k.Worker, w.stageOf[k.Worker])
	}
	var fastWorker core.WorkerID
	for id, st := range w.stageOf {
		if st == "fast" {
			fastWorker = id
		}
	}
	cmds = w.exit(fastWorker, -1, "killed")
	if it := itemFor(t, cmds, 2); it.Verdict != core.TimeOut || !strings.Contains(it.Reason, "MAX_RUNTIME 10s") {
		t.Errorf("fast's head item %v, want a timeout naming MAX_RUNTIME 10s", it)
	}
	none[core.Kill](t, w.tick(299*time.Second), "slow's head killed before the dispatcher's MAX_RUNTIME")
	if k := one[core.Kill](t, w.tick(300*time.Second)); w.stageOf[k.Worker] != "slow" {
		t.Errorf("killed %s of stage %s at 300s, want slow's worker", k.Worker, w.stageOf[k.Worker])
	}
}

// Proves: a new worker whose first line is not an answer (a banner, a log
// line) breaks the protocol like any other such line: it cannot be skipped,
// since the protocol cannot tell a banner from an answer. Its head fails with
// a reason that quotes the line and says what it likely is; the same line
// after an answer gets no such hint.
func TestABannerOnANewWorkerFailsItsHeadWithAReasonThatSaysSo(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 4) // w1 holds 1, 2, 3; w2 holds 4, then 2 and 3 requeued
	w.step(core.Answer{Worker: 1, Line: "worker v1.2 starting"})
	cmds := w.exit(1, -1, "killed")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Fail ||
		!strings.Contains(it.Reason, "answered 'worker v1.2 starting', its first line, which is not an answer (a banner or a log line on standard output?") {
		t.Errorf("head item %v, want failed naming the first line as a likely banner", it)
	}
	w.finish(2)
	w.step(core.Answer{Worker: 2, Line: "worker v1.2 starting"})
	cmds = w.exit(2, -1, "killed")
	if it := itemFor(t, cmds, 2); it.Verdict != core.Fail || strings.Contains(it.Reason, "first line") {
		t.Errorf("head item %v after an answer: want failed without the first-line hint", it)
	}
}

// Proves: an answer line longer than AnswerMax, which the shell passes on cut
// (Answer.Cut), is a protocol error whatever its first bytes say: the worker is
// killed and its head fails with a reason that names the limit, instead of
// the cut answer being written as a patch that is not JSON.
func TestAnAnswerLongerThanAnswerMaxIsAProtocolError(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	cut := `0 >done {"x":"` + strings.Repeat("x", core.AnswerMax-len(`0 >done {"x":"`))
	cmds := w.step(core.Answer{Worker: 1, Line: cut, Cut: true})
	if k := one[core.Kill](t, cmds); k.Worker != 1 {
		t.Errorf("killed %s, want w1 (it broke the protocol)", k.Worker)
	}
	none[core.Resolve](t, cmds, "the cut answer was written")
	cmds = w.exit(1, -1, "killed")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Fail || !strings.Contains(it.Reason, "protocol error") ||
		!strings.Contains(it.Reason, "a line longer than 65536 bytes") || len(it.Reason) > 600 {
		t.Errorf("head item %v, want failed with a short protocol reason naming the 65536-byte limit", it)
	}
	if it := itemFor(t, cmds, 2); it.Verdict != core.Requeue {
		t.Errorf("second item %v, want pending", it)
	}
}

// Proves: a line that is not a status line gets the worker killed, and then, as for a
// crash, its head fails, the rest is requeued and a crash is counted.
func TestProtocolErrorIsTreatedLikeACrash(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	cmds := w.step(core.Answer{Worker: 1, Line: "OK"})
	if k := one[core.Kill](t, cmds); k.Worker != 1 {
		t.Errorf("killed %s, want w1 (it broke the protocol)", k.Worker)
	}
	// The line is quoted in single quotes: the text log would escape double
	// quotes inside its own (msg="... \"OK\" ...").
	if l := one[core.Log](t, cmds); !strings.Contains(l.Msg, "'OK'") || strings.Contains(l.Msg, `"`) {
		t.Errorf("log %q: want the line quoted as 'OK', without double quotes", l.Msg)
	}
	cmds = w.exit(1, -1, "killed")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Fail || !strings.Contains(it.Reason, "protocol") || !strings.Contains(it.Reason, "answered 'OK'") {
		t.Errorf("head item %v, want failed with a protocol reason that quotes the line as 'OK'", it)
	}
	if it := itemFor(t, cmds, 2); it.Verdict != core.Requeue {
		t.Errorf("second item %v, want pending", it)
	}
	if d := unflushed(w, "a"); d.Crashes != 1 {
		t.Errorf("counts of a not yet flushed %+v, want 1 crash", d)
	}
}

// unflushed sums what the core counted for stage and has not flushed yet.
func unflushed(w *world, stage string) core.StageDelta {
	sum := core.StageDelta{Stage: stage}
	for _, f := range w.c.Unflushed() {
		for _, d := range f.Stages {
			if d.Stage == stage {
				sum.Add(d)
			}
		}
	}
	return sum
}

// Proves: a worker that exits before answering anything requeues its messages and
// cools the stage down. At the head of StartFailLimit such starts in a row, with
// nothing to show the program can start, the message is not failed (a broken
// deployment fails no message): the stage's next worker is a probe, handed
// nothing until it has lived StartWindow, and then handed the message like any
// worker, so a message that kills its workers fails as a crash.
func TestWorkerThatDiesBeforeAnsweringIsAStartFailureNotAMessageFailure(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("b", 1)
	w.at(100 * time.Millisecond)
	cmds := w.exit(1, 1, "")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Requeue {
		t.Fatalf("message of a worker that could not start: %v, want pending", it)
	}
	none[core.Spawn](t, cmds, "respawned during the cooldown")
	for i := 2; i <= core.StartFailLimit; i++ {
		cmds = w.tick(time.Duration(i) * time.Minute)
		sp := one[core.Spawn](t, cmds)
		if w.head(sp.Worker) != 1 {
			t.Fatalf("message 1 is not the head of the new worker")
		}
		w.at(time.Duration(i)*time.Minute + time.Second)
		cmds = w.exit(sp.Worker, 1, "")
	}
	if it := itemFor(t, cmds, 1); it.Verdict != core.Requeue {
		t.Errorf("after %d failed starts of a program never seen to start: %v, want pending again", core.StartFailLimit, it)
	}
	if !slices.ContainsFunc(of[core.Log](cmds), func(l core.Log) bool { return strings.Contains(l.Msg, "handed nothing until it has lived") }) {
		t.Errorf("no log announces the probe in:\n%s", list(cmds))
	}
	probeAt := time.Duration(core.StartFailLimit+1) * time.Minute
	cmds = w.tick(probeAt)
	probe := one[core.Spawn](t, cmds)
	none[core.Write](t, cmds, "handed the message to the probe at once")
	none[core.Write](t, w.tick(probeAt+core.StartWindow-time.Millisecond), "handed the message to the probe before it lived StartWindow")
	if wr := one[core.Write](t, w.tick(probeAt+core.StartWindow)); wr.Worker != probe.Worker || len(wr.IDs) != 1 || wr.IDs[0] != 1 {
		t.Fatalf("once the probe lived %s: %v, want message 1 handed to it", core.StartWindow, wr)
	}
	w.at(probeAt + core.StartWindow + time.Second)
	if it := itemFor(t, w.exit(probe.Worker, 1, ""), 1); it.Verdict != core.Fail || !strings.Contains(it.Reason, "crashed") {
		t.Errorf("the message that killed a worker that had started: %v, want failed as a crash", it)
	}
}

// Proves: a program that never starts (a broken deployment) fails no message,
// however many starts fail: its probes die too, and the message is only ever
// requeued, pending between the tries, while the stage is cannot_start.
func TestABrokenDeploymentFailsNoMessage(t *testing.T) {
	w := newWorld(t, threeStages)
	cmds := w.start("b", 1)
	var items []core.Item
	for i := 1; i <= 4*core.StartFailLimit; i++ {
		if i > 1 {
			cmds = w.tick(time.Duration(i) * time.Minute)
		}
		sp := of[core.Spawn](cmds)
		if len(sp) != 1 {
			t.Fatalf("start %d: %d spawns, want 1:\n%s", i, len(sp), list(cmds))
		}
		w.at(time.Duration(i-1)*time.Minute + time.Second) // (the first spawn is at the start)
		if i > 1 {
			w.at(time.Duration(i)*time.Minute + time.Second)
		}
		for _, r := range of[core.Resolve](w.exit(sp[0].Worker, 1, "")) {
			items = append(items, r.Items...)
		}
	}
	for _, it := range items {
		if it.Verdict != core.Requeue {
			t.Errorf("a program that never started failed or timed out message %d: %v", it.ID, it)
		}
	}
	if h := healthOf(t, w, "b"); h.State != core.HealthCannotStart {
		t.Errorf("health of b %+v, want cannot_start", h)
	}
	// Given back, not held claimed, between the tries: an operator sees it
	// pending (and may discard it).
	w.wantRow(1, "b", core.StatusPending)
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

// Proves: ids requeued by a failed start are handed to a new worker when the cooldown
// ends, at a timer the core asks for, with no notification.
func TestMessagesOfAWorkerThatCouldNotStartAreRetriedWhenTheCooldownEnds(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("b", 1)
	w.at(1500 * time.Millisecond)
	cmds := w.exit(1, 1, "")
	cmds = append(cmds, w.settle()...)
	w.wantRow(1, "b", core.StatusPending)
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

// Proves: rows claimed for a stage whose spawn failed are pending during the cooldown
// and claimed again, by a timer, when it ends.
func TestClaimedRowsOfAStageThatCannotStartArePendingDuringTheCooldown(t *testing.T) {
	w := newWorld(t, threeStages)
	w.noAutoStart = true
	sp := one[core.Spawn](t, w.start("b", 2))
	w.at(1500 * time.Millisecond)
	cmds := w.step(core.SpawnFailed{Worker: sp.Worker, Err: "exec: \"b\": executable file not found in $PATH"})
	cmds = append(cmds, w.settle()...)
	for _, id := range []int64{1, 2} {
		if it := itemFor(t, cmds, id); it.Verdict != core.Requeue {
			t.Errorf("claimed row %d of a stage that cannot start: %v, want pending", id, it)
		}
		w.wantRow(id, "b", core.StatusPending)
	}
	due := epoch.Add(1500*time.Millisecond + core.CooldownMin)
	if at := lastTimer(t, cmds); !at.Equal(due) {
		t.Fatalf("timer after the failed spawn at %s, want %s (end of the cooldown)", at.Sub(epoch), due.Sub(epoch))
	}
	w.noAutoStart = false
	cmds = w.tick(due.Sub(epoch))
	one[core.Claim](t, cmds)
	one[core.Spawn](t, cmds)
	w.wantRow(1, "b", core.StatusRunning)
}

// Feature: start-up / shutdown safety.

// Proves: a shutdown stops every worker, even one still starting, requeues claimed
// rows no worker holds, claims nothing, and exits 0 once the workers have exited.
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
	if s := one[core.Stop](t, cmds); s.Worker != sp.Worker {
		t.Errorf("stopped %s, want the starting %s", s.Worker, sp.Worker)
	}
	none[core.Claim](t, cmds, "claimed during a shutdown")
	for _, id := range []int64{1, 2} {
		if it := itemFor(t, cmds, id); it.Verdict != core.Requeue {
			t.Errorf("claimed-but-unassigned %d: %v, want pending", id, it)
		}
	}
	w.wantRow(1, "a", core.StatusPending)
	w.wantRow(2, "a", core.StatusPending)
	none[core.Exit](t, cmds, "exited before its worker")
	cmds = w.exit(sp.Worker, 0, "")
	if e := one[core.Exit](t, cmds); e.Code != 0 {
		t.Errorf("exit code %d", e.Code)
	}
}

// Proves: during a shutdown an answer is still written; what the stopped worker had
// not answered when it was killed is requeued, then the core exits 0.
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
	w.wantRow(1, "a", core.StatusDone)
	w.wantRow(2, "a", core.StatusPending)
	w.wantRow(3, "a", core.StatusPending)
	if e := one[core.Exit](t, w.all); e.Code != 0 {
		t.Errorf("exit code %d, want 0 (every row was resolved or requeued)", e.Code)
	}
}

// Writes while the database is away.

// Proves: answers read while the database is down are held, not written, and all sent
// in one resolve after DatabaseUp.
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
	w.wantRow(1, "b", core.StatusRunning)
	w.wantRow(2, "a", core.StatusDone)
}

// Proves: after a claim whose reply was lost, the core resets the running rows it
// does not hold, keeping its own, before it claims again.
func TestLostClaimReplyResetsTheRowsItMayHaveClaimed(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.q.Insert("a", 2)
	w.loseReplies = true
	w.step(core.Ingress{}) // claims 2, 3 but the reply is lost
	w.loseReplies = false
	w.wantRow(2, "a", core.StatusRunning)
	cmds := w.step(core.DatabaseUp{})
	reset := one[core.ResetOrphans](t, cmds)
	if len(reset.Keep) != 1 || reset.Keep[0] != 1 {
		t.Errorf("reset keeps %v, want [1] (held by w1)", reset.Keep)
	}
	if w.row(1).Status != core.StatusRunning {
		t.Errorf("row 1 (held) was reset")
	}
	if w.head(1) != 1 || len(w.held[1]) != 3 {
		t.Errorf("rows 2, 3 not claimed again after the reset: w1 holds %v", w.held[1])
	}
}

// Proves: a resolve whose reply was lost is re-sent unchanged after
// DatabaseUp (but marked Again, so its pass is not recorded twice), and
// applying it again does no harm: the message runs once at its next stage.
func TestLostResolveReplyIsResentSafely(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.loseReplies = true
	lost := itemFor(t, w.advance(1, "b"), 1) // requeued to pending at b, reply lost
	w.loseReplies = false
	again := itemFor(t, w.step(core.DatabaseUp{}), 1)
	if !again.Again {
		t.Errorf("re-sent item %v is not marked again (its pass may be recorded already)", again)
	}
	if again.Again = false; again.String() != lost.String() {
		t.Errorf("re-sent item %v, want the lost one unchanged but for Again: %v", again, lost)
	}
	w.wantRow(1, "b", core.StatusRunning) // resent: left alone, then claimed for b
	if len(of[core.Write](w.all)) != 2 {
		t.Errorf("message 1 not handed to b exactly once:\n%s", list(w.all))
	}
}

// Proves: a transaction the shell knows did not commit (its session was ended before
// the COMMIT ran) claimed nothing and applied nothing: the retry carries no
// orphan reset (a lost session costs the retry, nothing more), the rows the
// workers hold stay theirs, and the message is handed on once.
func TestAnAbortedTransactionIsRetriedWithoutAReset(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	w.failQueue, w.abortQueue = "FATAL: terminating connection due to administrator command (SQLSTATE 57P01)", true
	w.advance(1, "b") // requeued to pending at b: the transaction is aborted
	w.failQueue, w.abortQueue = "", false
	retry := w.step(core.DatabaseUp{})
	if resets := of[core.ResetOrphans](retry); len(resets) != 0 {
		t.Errorf("the retry of an aborted transaction resets orphans: %v", resets)
	}
	w.wantRow(1, "b", core.StatusRunning) // requeued, then claimed for b
	w.wantRow(2, "a", core.StatusRunning) // still held by its worker: not reset
	if n := len(of[core.Write](w.all)); n != 2 {
		t.Errorf("%d writes to workers, want 2 (the first claim's, then message 1 at b once):\n%s", n, list(w.all))
	}
}

// Found by the simulator (testdata/sim/seeds.txt).
//
// Proves: a stage pauses its message briefly and answers 0; the transaction
// that resolves the answer also wakes due rows and claims, and its reply is
// lost. The reset after the lost claim must not keep the row (its resolve may
// already have been applied), so the re-sent item finds it paused or pending
// instead of failing it as a stage bug, and a later wake and claim hand it to
// stage a again. (When the seed was found, that same wake took the row; a wake
// now keeps the rows of its own transaction's resolve: see core.Wake.)
func TestRowItsStagePausedIsNotFailedWhenTheReplyOfTheTransactionThatWokeItIsLost(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	id := w.head(1)
	w.at(30 * time.Second) // the heartbeat is due: this step's transaction wakes due rows
	if !w.q.StageWrite(id, "a", "a", core.StatusPaused, w.now) {
		t.Fatalf("stage write of %d failed", id)
	}
	w.held[1] = w.held[1][1:]
	w.loseReplies = true
	w.step(core.Answer{Worker: 1, Line: "0"}) // resolve, wake and claim commit; the reply is lost
	w.loseReplies = false
	w.step(core.DatabaseUp{})
	if r := w.row(id); r.Status == core.StatusFailed {
		t.Fatalf("message %d was failed (%q) although its stage paused it before answering 0", id, r.DispatchError)
	}
	w.wantRow(id, "a", core.StatusRunning) // reset, then claimed again at a
	if w.head(1) != id {
		t.Errorf("message %d not handed to stage a again", id)
	}
}

// Found by the simulator (testdata/sim/seeds.txt).
//
// Proves: a claim's reply is lost, so rows it took may be running with no one
// holding them; a graceful shutdown must reset them before it exits 0 ("every
// row was reset or resolved").
func TestShutdownResetsRowsALostClaimMayHaveTakenBeforeExitingZero(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 0)
	w.q.Insert("a", 1)
	w.loseReplies = true
	w.step(core.Ingress{}) // claims row 1; the reply is lost
	w.loseReplies = false
	w.wantRow(1, "a", core.StatusRunning)
	none[core.Exit](t, w.step(core.Shutdown{}), "exited while a lost claim's row may be running")
	cmds := w.step(core.DatabaseUp{})
	one[core.ResetOrphans](t, cmds)
	if e := one[core.Exit](t, cmds); e.Code != 0 {
		t.Errorf("exit code %d after resetting everything, want 0", e.Code)
	}
	w.wantRow(1, "a", core.StatusPending)
}

// Feature: statistics.

// Proves: going idle flushes what was counted (fused stages credited, a's own time
// net of theirs), and nothing is flushed when there is nothing to add.
func TestStatisticsAreFlushedAsDeltasOnIdleAndNeverEmpty(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(2 * time.Second)
	w.answer(1, "b", core.StatusRunning, "0 x:100 y:200")
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

// Proves: going idle flushes at once when the last flush is a second old, and
// otherwise a second after it, at a timer the core asks for.
func TestIdleFlushHappensAtMostOnceASecond(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(1500 * time.Millisecond)
	if f := of[core.Flush](w.finish(1)); len(f) != 1 {
		t.Fatalf("going idle at 1.5s (1.5s after the start) flushed %d times in that step, want once", len(f))
	}
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
	cmds = append(cmds, w.settle()...) // the core rests first (RestAfter)
	if at := lastTimer(t, cmds); !at.Equal(epoch.Add(2500 * time.Millisecond)) {
		t.Errorf("timer after going idle at 1.8s: %s, want 2.5s (a second after the 1.5s flush)", at.Sub(epoch))
	}
	cmds = w.tick(2500 * time.Millisecond)
	if f := one[core.Flush](t, cmds); f.MessagesLeft != 1 {
		t.Errorf("deferred idle flush %v", f)
	}
}

// Proves: while workers are busy the counts are flushed once STATS_INTERVAL has
// passed, not on each answer.
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
	if st, _, _, _ := w.q.Stats(); st["a"].Processed != 1 {
		t.Errorf("stage_stats of a after the periodic flush %+v, want 1 processed", st["a"])
	}
}

// Proves: a shutdown request flushes the statistics counted so far at once,
// while a worker still has messages, so that a second request (which kills
// the workers and writes nothing more) loses none of them.
func TestAShutdownRequestFlushesTheStatisticsAtOnce(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	w.at(10 * time.Second)
	w.finish(1) // 2 still held: not idle, STATS_INTERVAL not reached
	cmds := w.step(core.Shutdown{})
	if f := one[core.Flush](t, cmds); f.MessagesLeft != 1 {
		t.Errorf("flush at the shutdown request %v, want the message that left", f)
	}
	w.step(core.Shutdown{})
	if st, _, _, _ := w.q.Stats(); st["a"].Processed != 1 {
		t.Errorf("stage_stats of a after a second shutdown request %+v, want 1 processed", st["a"])
	}
}

// Proves: a flush whose reply was lost (it was applied) is re-sent unchanged, with
// its Seq, after DatabaseUp, and its counts are added to the tables once.
func TestLostFlushIsResentUnchangedAndAppliedOnce(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.at(500 * time.Millisecond)
	w.finish(1) // idle within a second of the start: the flush waits until 1s
	w.loseReplies = true
	lost := one[core.Flush](t, w.tick(time.Second)) // the flush alone: applied, its reply lost
	w.loseReplies = false
	resent := one[core.Flush](t, w.step(core.DatabaseUp{}))
	lost.Op, resent.Op = 0, 0
	if resent.String() != lost.String() {
		t.Errorf("re-sent flush %v, want the lost one unchanged: %v", resent, lost)
	}
	w.tick(3 * time.Second)
	flushAll(w)
	_, passes, left, seq := w.q.Stats()
	if passes != 1 || left != 1 || seq != lost.Seq {
		t.Errorf("after a lost and resent flush: passes %d left %d flush_seq %d, want 1, 1 and %d", passes, left, seq, lost.Seq)
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

// Proves: a core that lost its lock hands its unsure and unsent counts to the next
// core, which adds exactly what the database has not applied yet.
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
	w.wantRow(3, "a", core.StatusRunning) // reset, claimed again by the new core
	flushAll(w)
	st, passes, left, _ := w.q.Stats()
	// Passes: 1 and 2 answered by the first core; the lost flush was applied and
	// must not be added twice, the unsent one must not be lost. Only message 1 was
	// seen leaving: the resolve that would have shown 2 done was never sent.
	if passes != 2 || left != 1 || st["a"].Processed != 2 {
		t.Errorf("after the restart: passes %d left %d processed %d, want 2, 1, 2", passes, left, st["a"].Processed)
	}
}

// Proves: a wake keeps the rows handed to workers, so a row paused with a due timeout
// is not handed to a second worker before its answer is read, and runs again after.
func TestRowPausedWithADueTimeoutIsNotWokenBeforeItsAnswerIsRead(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	id := w.head(1)
	w.at(30 * time.Second) // the heartbeat is due
	// The stage paused the row until a moment already past and committed; its
	// answer has not been read yet.
	if !w.q.StageWrite(id, "a", "a", core.StatusPaused, epoch) {
		t.Fatal("stage write failed")
	}
	cmds := w.step(core.Tick{})
	if wake := one[core.Wake](t, cmds); len(wake.Keep) != 1 || wake.Keep[0] != id {
		t.Errorf("wake keeps %v, want [%d] (handed, unanswered)", wake.Keep, id)
	}
	w.wantRow(id, "a", core.StatusPaused)
	none[core.Write](t, cmds, "a message handed out again while its worker holds it")
	// Once the answer is read, the due pause is woken and the message runs again.
	w.held[1] = w.held[1][1:]
	cmds = w.step(core.Answer{Worker: 1, Line: "0"})
	if ws := of[core.Write](cmds); len(ws) != 1 || ws[0].IDs[0] != id {
		t.Errorf("message %d not handed out again after its pause was resolved: %v", id, ws)
	}
	if r := w.row(id); r.Status != core.StatusRunning {
		t.Errorf("row %d is %s, want running again", id, r.Status)
	}
}

// Proves: after a second shutdown request the core asks for no timer already due
// (nothing more is written), and exits 1 with results unwritten once its workers are gone.
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

// Proves: every POLL_INTERVAL, running rows this core does not hold are reset to
// pending (and claimed again); the rows it holds are kept.
func TestHeartbeatResetsRunningRowsNoOneHolds(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1) // w1 holds 1
	// A transaction of a session that lost the lock commits late: it claims row 2,
	// which this core knows nothing of.
	w.q.Insert("a", 1)
	w.q.Exec(t.Context(), []core.Command{core.Claim{Op: 999, Caps: []core.Cap{{Stage: "a", N: 1}}}})
	w.wantRow(2, "a", core.StatusRunning)
	cmds := w.tick(30 * time.Second)
	reset := one[core.ResetOrphans](t, cmds)
	if len(reset.Keep) != 1 || reset.Keep[0] != 1 {
		t.Errorf("heartbeat reset keeps %v, want [1] (held by w1)", reset.Keep)
	}
	w.wantRow(1, "a", core.StatusRunning)
	if got := w.held[1]; len(got) != 2 || got[1] != 2 {
		t.Errorf("the orphan was not reset and handed out: w1 holds %v", got)
	}
}

// Feature: answers that carry the transition ("0 >TARGET").

// answerMove makes worker wid answer line for its head without writing the row.
func answerMove(w *world, wid core.WorkerID, line string) []core.Command {
	return w.answer(wid, "", "", line)
}

// Proves: "0 >b {patch}" has the dispatcher write the row to b with the patch
// merged, claimed for b in the same write when b has room (a move that claims),
// and counts the pass.
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
	w.wantRow(1, "b", core.StatusRunning)
	flushAll(w)
	stages, passes, _, _ := w.q.Stats()
	if stages["a"].Processed != 1 || passes != 1 {
		t.Errorf("stats %v passes %d, want the answered pass counted as processed at a", stages["a"], passes)
	}
}

// Proves: "0 >done" and "0 >paused:S" are written straight to done, and to paused
// until the answer's instant + S, and the pause is woken at that instant.
func TestAnsweredDoneAndPauseAreWrittenStraightToWhatTheRowBecomes(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	cmds := answerMove(w, 1, "0 >done")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Move || it.To != core.TargetDone {
		t.Fatalf("item %v, want a move to done", it)
	}
	w.wantRow(1, "a", core.StatusDone)
	w.at(10 * time.Second)
	cmds = answerMove(w, 1, "0 >paused:2.5")
	it := itemFor(t, cmds, 2)
	if want := epoch.Add(12500 * time.Millisecond); it.Verdict != core.Move || it.To != core.TargetPaused || !it.Until.Equal(want) {
		t.Fatalf("item %v, want a pause until %s", it, want)
	}
	w.wantRow(2, "a", core.StatusPaused)
	cmds = append(cmds, w.settle()...)
	// The core learnt the timeout from the outcome and wakes it then.
	if timer := of[core.SetTimer](cmds); len(timer) == 0 || !timer[len(timer)-1].At.Equal(it.Until) {
		t.Fatalf("want a timer at the answered timeout %s:\n%s", it.Until, list(cmds))
	}
	w.tick(12500 * time.Millisecond)
	w.wantRow(2, "a", core.StatusRunning)
}

// Proves: one worker may answer a transition for one message and bare 0s for the
// next; each is resolved by its own verdict.
func TestAnsweredTransitionsMixWithBareAnswersInOneWorker(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 3)
	if it := itemFor(t, answerMove(w, 1, "0 >b"), 1); it.Verdict != core.Move || it.To != "b" {
		t.Errorf("item %v after 0 >b, want a move to b", it)
	}
	if it := itemFor(t, w.advance(1, "b"), 2); it.Verdict != core.Answered {
		t.Errorf("item %v after a bare 0, want answered", it)
	}
	cmds := w.finish(1)
	if it := itemFor(t, cmds, 3); it.Verdict != core.Answered {
		t.Errorf("item %v after a bare 0, want answered", it)
	}
	w.wantRow(1, "b", core.StatusRunning)
	w.wantRow(2, "b", core.StatusRunning)
	w.wantRow(3, "a", core.StatusDone)
}

// Proves: an answered transition the dispatcher cannot write fails only that message,
// with a reason, and the worker is neither killed nor stopped.
func TestAnUnwritableTransitionFailsItsMessageAndTheWorkerLivesOn(t *testing.T) {
	for _, line := range []string{"0 >zz", "0 >paused:-1", `0 >b {"x":`, "0 >paused", "0 >b [1,2,3]"} {
		t.Run(line, func(t *testing.T) {
			w := newWorld(t, threeStages)
			w.start("a", 2)
			cmds := answerMove(w, 1, line)
			none[core.Kill](t, cmds, "an unwritable transition is not a protocol error")
			none[core.Stop](t, cmds, "a worker whose answer could not be written lives on")
			if it := itemFor(t, cmds, 1); it.Verdict != core.Fail || !strings.Contains(it.Reason, "cannot have") {
				t.Fatalf("item %v, want the message failed with a reason", it)
			}
			w.wantRow(1, "a", core.StatusFailed)
			w.wantRow(2, "a", core.StatusRunning)
		})
	}
}

// Proves: a move whose row is no longer running at the answering stage writes
// nothing, is logged and counted as a guard miss, and the row stays where the stage put it.
func TestAGuardMissWritesNothingAndIsCountedAndLogged(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	// The stage both wrote its advance and answered one: the dispatcher's write
	// misses its guard, the row is requeued where the stage put it.
	cmds := w.answer(1, "c", core.StatusRunning, "0 >b")
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
	w.wantRow(1, "c", core.StatusRunning)
	flushAll(w)
	if stages, _, _, _ := w.q.Stats(); stages["a"].GuardMisses != 1 {
		t.Errorf("guard misses of a = %d, want 1", stages["a"].GuardMisses)
	}
}

// Proves: a re-sent move that finds its own earlier write (the reply was lost) is
// not a guard miss, and the message leaves once.
func TestAMoveWhoseReplyWasLostIsNotCountedAsAGuardMiss(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.loseReplies = true
	answerMove(w, 1, "0 >done")
	w.loseReplies = false
	w.at(2 * time.Second)
	w.step(core.DatabaseUp{})
	w.wantRow(1, "a", core.StatusDone)
	flushAll(w)
	if stages, _, left, _ := w.q.Stats(); stages["a"].GuardMisses != 0 || left != 1 {
		t.Errorf("guard misses %d, messages left %d: want 0 and 1 (the re-sent move found its own write)", stages["a"].GuardMisses, left)
	}
}

// rolling is a stage of two workers, one message each, whose workers live
// long: an old worker keeps answering while new ones are started.
const rolling = `
[pepsi-dispatch]
MAX_RUNTIME = 300
WORKER_IDLE_TIMEOUT = 3600
POLL_INTERVAL = 30
STATS_INTERVAL = 60
[stage-a]
PROGRAM = a
PARALLELISM = 2
QUEUE_LIMIT = 1
`

// Proves: the proof that a stage's program starts comes from a worker started
// no earlier than a message's first failed start. A worker started before (one
// running the program as it was before a deployment broke it) that answers
// between the failed starts proves nothing: the message at their head is not
// failed, the stage's next worker is a probe, and the old worker's answers
// end neither the probing nor the cooldown (the stage shows cannot_start, and
// its starts are held back longer after each failure); a probe that lives
// ends the probing.
func TestAnOldWorkersAnswersDoNotProveANewDeploymentStarts(t *testing.T) {
	w := newWorld(t, rolling)
	old := one[core.Spawn](t, w.start("a", 1)).Worker
	w.at(time.Second)
	w.finish(old) // the old program started: it answered
	// From here on every new worker fails at its start, with message m at its
	// head, while the old one keeps answering other messages.
	w.at(time.Minute)
	w.q.Insert("a", 2)
	cmds := w.step(core.Ingress{})
	fresh := one[core.Spawn](t, cmds).Worker
	m := w.head(fresh)
	var it core.Item
	for i := 1; i <= core.StartFailLimit; i++ {
		at := time.Duration(i) * time.Minute
		w.at(at + time.Second)
		w.finish(old) // an answer between the failed starts
		w.q.Insert("a", 1)
		w.step(core.Ingress{}) // the old worker is busy again
		w.at(at + 2*time.Second)
		it = itemFor(t, w.exit(fresh, 1, ""), m)
		if i < core.StartFailLimit {
			sp := one[core.Spawn](t, w.tick(at+time.Minute-time.Second))
			if fresh = sp.Worker; w.head(fresh) != m {
				t.Fatalf("start %d: message %d is not the head of the new worker", i+1, m)
			}
		}
	}
	if it.Verdict != core.Requeue {
		t.Fatalf("after %d failed starts of new workers, with only an old worker answering: %v, want pending again", core.StartFailLimit, it)
	}
	probeAt := time.Duration(core.StartFailLimit+1) * time.Minute
	probe := one[core.Spawn](t, w.tick(probeAt)).Worker
	w.finish(old) // the old worker answers, and takes m
	if w.head(old) != m {
		t.Fatalf("the old worker, ready, was not handed message %d", m)
	}
	// Nor do its answers end the cooldown: the stage shows it cannot start.
	if h := healthOf(t, w, "a"); h.State != core.HealthCannotStart {
		t.Errorf("health of a while only an old worker answers: %+v, want cannot_start", h)
	}
	w.q.Insert("a", 1)
	none[core.Write](t, w.step(core.Ingress{}), "handed a message to the probe because an old worker answered")
	if wr := one[core.Write](t, w.tick(probeAt+core.StartWindow)); wr.Worker != probe {
		t.Fatalf("once the probe lived %s: %v, want the pending message handed to it", core.StartWindow, wr)
	}
}

// Proves: an old worker's answers end a stage's cooldown once it has run out
// with no new worker started since (none was needed: the old ones took the
// messages), so a stage whose workers suffice does not show cannot_start for
// good after one failed start; before the cooldown runs out they do not.
func TestAnOldWorkersAnswerEndsACooldownThatRanOutWithNoNewTry(t *testing.T) {
	w := newWorld(t, rolling)
	old := one[core.Spawn](t, w.start("a", 1)).Worker
	w.at(time.Minute)
	w.q.Insert("a", 1)
	fresh := one[core.Spawn](t, w.step(core.Ingress{})).Worker
	m := w.head(fresh)
	w.at(time.Minute + time.Second)
	w.exit(fresh, 1, "") // a failed start: m is pending again
	w.at(time.Minute + 1500*time.Millisecond)
	w.finish(old) // within the cooldown; the old worker takes m
	if w.head(old) != m {
		t.Fatalf("the old worker, ready, was not handed message %d", m)
	}
	if h := healthOf(t, w, "a"); h.State != core.HealthCannotStart {
		t.Errorf("health of a after an old worker's answer within the cooldown: %+v, want cannot_start", h)
	}
	w.at(time.Minute + 5*time.Second)
	none[core.Spawn](t, w.finish(old), "started a worker no message needs")
	if h := healthOf(t, w, "a"); h.State != core.HealthOK {
		t.Errorf("health of a after an old worker's answer, the cooldown run out and no new try: %+v, want ok", h)
	}
}

// Proves: a worker's last line written without a newline is judged by how
// the worker ended. Killed by the watchdog while writing "0 >bx {...}", its
// cut-off "0 >b" is dropped and its message times out, as MAX_RUNTIME says,
// instead of moving to stage b; a worker that exits by itself wrote its last
// line whole, and it is its answer, unless it ended with another status or a
// signal of its own.
func TestALastLineWithoutANewlineIsAnAnswerOnlyIfTheWorkerExitedByItself(t *testing.T) {
	w := newWorld(t, threeStages)
	killed := one[core.Spawn](t, w.start("a", 1)).Worker
	w.at(time.Second)
	w.step(core.Answer{Worker: killed, Line: "0 >b", Unterminated: true})
	kill := one[core.Kill](t, w.tick(301*time.Second))
	if kill.Worker != killed {
		t.Fatalf("killed %v, want the worker past MAX_RUNTIME", kill.Worker)
	}
	cmds := w.exit(killed, -1, "killed")
	if it := itemFor(t, cmds, 1); it.Verdict != core.TimeOut {
		t.Errorf("the message of a worker killed while writing its answer: %v, want timed out", it)
	}
	if !slices.ContainsFunc(of[core.Log](cmds), func(l core.Log) bool { return strings.Contains(l.Msg, "had no newline when it ended") }) {
		t.Errorf("no log says the cut-off line was dropped:\n%s", list(cmds))
	}

	w.at(10 * time.Minute)
	w.q.Insert("a", 1)
	whole := one[core.Spawn](t, w.step(core.Ingress{})).Worker
	id := w.head(whole)
	w.at(10*time.Minute + time.Second)
	w.step(core.Answer{Worker: whole, Line: "0 >b", Unterminated: true})
	if it := itemFor(t, w.exit(whole, 0, ""), id); it.Verdict != core.Move || it.To != "b" {
		t.Errorf("the last line of a worker that exited by itself: %v, want its move to b", it)
	}

	// Past its start, a worker that ends otherwise than with status 0 (a
	// shell stage under set -e, a signal of its own) may have been cut off
	// too: the line is dropped and its message fails as the crash it is.
	for i, end := range []struct {
		code   int
		signal string
	}{{1, ""}, {-1, "segmentation fault"}} {
		at := time.Duration(20+i) * time.Minute
		w.at(at)
		w.q.Insert("a", 1)
		x := one[core.Spawn](t, w.step(core.Ingress{})).Worker
		id := w.head(x)
		w.at(at + core.StartWindow + time.Second)
		w.step(core.Answer{Worker: x, Line: "0 >b", Unterminated: true})
		if it := itemFor(t, w.exit(x, end.code, end.signal), id); it.Verdict != core.Fail || !strings.Contains(it.Reason, "crashed") {
			t.Errorf("the last line of a worker that ended with %+v: %v, want the message failed as a crash", end, it)
		}
	}
}

// Proves: a last line without a newline that breaks the protocol, judged
// when its worker has exited, fails the message as the protocol error it is,
// and sends no Kill for a worker that is gone, nor says it is killing one.
func TestALastLineThatBreaksTheProtocolAtTheExitKillsNothing(t *testing.T) {
	w := newWorld(t, threeStages)
	x := one[core.Spawn](t, w.start("a", 1)).Worker
	id := w.head(x)
	w.at(core.StartWindow + time.Second)
	w.step(core.Answer{Worker: x, Line: "hello there", Unterminated: true})
	cmds := w.exit(x, 0, "")
	if k := of[core.Kill](cmds); len(k) != 0 {
		t.Errorf("killed %v, a worker already gone", k)
	}
	if it := itemFor(t, cmds, id); it.Verdict != core.Fail || !strings.Contains(it.Reason, "protocol") {
		t.Errorf("the message whose last line broke the protocol: %v, want it failed for it", it)
	}
	logs := of[core.Log](cmds)
	if slices.ContainsFunc(logs, func(l core.Log) bool { return strings.Contains(l.Msg, "killing it") }) ||
		!slices.ContainsFunc(logs, func(l core.Log) bool { return strings.Contains(l.Msg, "in the last line it wrote before it exited") }) {
		t.Errorf("logs:\n%s\nwant the protocol error said of a worker that had exited", list(cmds))
	}
}

// runs is rolling with a short MAX_RUNTIME.
var runs = strings.Replace(rolling, "MAX_RUNTIME = 300", "MAX_RUNTIME = 10", 1)

// Proves: a message's failed starts count only in a row. One whose pass ended
// otherwise between them (here it timed out, and an operator retried it)
// starts a new run: a proof older than that run, by a worker of a
// deployment since broken, does not fail it at its next failed start.
func TestFailedStartsCountOnlyInARow(t *testing.T) {
	w := newWorld(t, runs)
	first := one[core.Spawn](t, w.start("a", 1)).Worker
	m := w.head(first)
	w.at(time.Second)
	w.exit(first, 1, "") // failed start 1
	second := one[core.Spawn](t, w.tick(time.Minute)).Worker
	w.at(time.Minute + time.Second)
	w.exit(second, 1, "") // failed start 2
	third := one[core.Spawn](t, w.tick(2*time.Minute)).Worker
	one[core.Kill](t, w.tick(2*time.Minute+11*time.Second)) // it started, and m ran past MAX_RUNTIME
	if it := itemFor(t, w.exit(third, -1, "killed"), m); it.Verdict != core.TimeOut {
		t.Fatalf("m on a worker that started: %v, want timed out", it)
	}
	// A worker spawned now answers: the program starts.
	w.at(3 * time.Minute)
	w.q.Insert("a", 1)
	proof := one[core.Spawn](t, w.step(core.Ingress{})).Worker
	w.at(3*time.Minute + time.Second)
	w.finish(proof)
	// The deployment breaks; the proof keeps answering, m is retried.
	w.at(4 * time.Minute)
	w.q.Insert("a", 1)
	w.step(core.Ingress{}) // the proof is busy with it
	if n, err := w.q.Retry(t.Context(), store.RetryParams{ID: m, Statuses: []core.RowStatus{core.StatusTimeout}}); err != nil || n != 1 {
		t.Fatalf("retry of m: %d, %v", n, err)
	}
	broken := one[core.Spawn](t, w.step(core.Ingress{})).Worker
	if w.head(broken) != m {
		t.Fatalf("m is not the head of the new worker")
	}
	w.at(4*time.Minute + time.Second)
	if it := itemFor(t, w.exit(broken, 1, ""), m); it.Verdict != core.Requeue {
		t.Errorf("m's first failed start since its pass ended: %v, want pending again (two failed starts before that pass are not in a row with it)", it)
	}
}

// Proves: each new round of a stage's failed starts is proven over only by a
// worker spawned since that round: an older worker's answer does not end a
// cooldown a later round set, while it runs.
func TestAnOldWorkerDoesNotEndALaterRoundsCooldown(t *testing.T) {
	w := newWorld(t, rolling)
	n1 := one[core.Spawn](t, w.start("a", 1)).Worker
	w.at(time.Second)
	w.exit(n1, 1, "") // round 1
	old := one[core.Spawn](t, w.tick(10*time.Second)).Worker
	w.at(20 * time.Second)
	w.q.Insert("a", 1)
	n2 := one[core.Spawn](t, w.step(core.Ingress{})).Worker
	w.at(21 * time.Second)
	w.exit(n2, 1, "") // round 2, from a worker spawned after old
	w.at(21*time.Second + 500*time.Millisecond)
	w.finish(old)
	if h := healthOf(t, w, "a"); h.State != core.HealthCannotStart {
		t.Errorf("health after an answer of a worker older than the round that set the cooldown: %+v, want cannot_start", h)
	}
}

// Proves: a shutdown's grace does not stop the watchdog: a head that runs
// past MAX_RUNTIME while its worker is stopping times out, with the reason,
// rather than being requeued to start its MAX_RUNTIME afresh at the next
// start (STOP_GRACE longer than what was left of it).
func TestTheWatchdogRunsThroughAShutdownsGrace(t *testing.T) {
	w := newWorld(t, strings.Replace(threeStages, "[pepsi-dispatch]\n", "[pepsi-dispatch]\nSTOP_GRACE = 60\n", 1))
	wid := one[core.Spawn](t, w.start("a", 1)).Worker
	w.at(290 * time.Second)
	w.step(core.Shutdown{})
	kill := one[core.Kill](t, w.tick(300*time.Second))
	if kill.Worker != wid {
		t.Fatalf("killed %v at MAX_RUNTIME, want the stopping worker %v", kill.Worker, wid)
	}
	if it := itemFor(t, w.exit(wid, -1, "killed"), 1); it.Verdict != core.TimeOut {
		t.Errorf("the head of a stopping worker past MAX_RUNTIME: %v, want timed out", it)
	}
}

// probeBeside: stage p's second worker may be a probe while its first holds
// a message; workers idle 4 s are reaped, before a probe has lived
// StartWindow (5 s).
const probeBeside = `
[pepsi-dispatch]
MAX_RUNTIME = 3600
WORKER_IDLE_TIMEOUT = 4
POLL_INTERVAL = 30
STATS_INTERVAL = 60
[stage-p]
PROGRAM = p
PARALLELISM = 2
QUEUE_LIMIT = 1
`

// Proves: a probe idle past WORKER_IDLE_TIMEOUT beside its stage's backlog
// (handed nothing until it has lived StartWindow) is reaped in the step in
// which another worker's answer takes that backlog: the step's timers look
// before its hand-out, when the backlog still kept the probe, so it is
// reaped after the hand-out too (reapAfterAssign), not a step late (found
// by make sim-long, rule reap-due; this scenario keeps it proven when the
// simulator's seed no longer reaches it).
func TestAProbeLeftIdleByAHandOutIsReapedInThatStep(t *testing.T) {
	w := newWorld(t, probeBeside)
	w.start("p", 1) // w1 holds 1
	// Message 2 comes after w1 started: its workers' failed starts are all
	// younger than w1, whose answer then proves nothing of them.
	w.at(50 * time.Millisecond)
	w.q.Insert("p", 1)
	sp := one[core.Spawn](t, w.step(core.Ingress{}))
	if w.head(1) != 1 || w.head(sp.Worker) != 2 {
		t.Fatalf("w1 holds %v, %s %v; want 1 and 2", w.held[1], sp.Worker, w.held[sp.Worker])
	}
	w.at(100 * time.Millisecond)
	cmds := w.exit(sp.Worker, 1, "") // a failed start, with 2 at its head
	for i := 2; i <= core.StartFailLimit; i++ {
		cmds = w.tick(time.Duration(i) * time.Minute)
		sp := one[core.Spawn](t, cmds)
		if w.head(sp.Worker) != 2 {
			t.Fatalf("message 2 is not the head of the new worker %s", sp.Worker)
		}
		w.at(time.Duration(i)*time.Minute + time.Second)
		cmds = w.exit(sp.Worker, 1, "")
	}
	if !slices.ContainsFunc(of[core.Log](cmds), func(l core.Log) bool { return strings.Contains(l.Msg, "handed nothing until it has lived") }) {
		t.Fatalf("no probe announced after %d failed starts:\n%s", core.StartFailLimit, list(cmds))
	}
	probeAt := time.Duration(core.StartFailLimit+1) * time.Minute
	probe := one[core.Spawn](t, w.tick(probeAt)).Worker
	// Idle 4.5 s beside message 2, pending at p: kept. Then w1 answers, and
	// message 2 goes to w1 in the same step: nothing waits at p any more.
	w.at(probeAt + 4500*time.Millisecond)
	cmds = w.answer(1, "", "", "0 >done")
	if wr := one[core.Write](t, cmds); wr.Worker != 1 || len(wr.IDs) != 1 || wr.IDs[0] != 2 {
		t.Fatalf("after w1's answer: %v; want message 2 handed to w1", wr)
	}
	// In that step: before the resolve it sends, not once the resolve's
	// result comes back (the harness runs both at this instant).
	stop := slices.IndexFunc(cmds, func(c core.Command) bool { s, ok := c.(core.Stop); return ok && s.Worker == probe })
	resolve := slices.IndexFunc(cmds, func(c core.Command) bool { _, ok := c.(core.Resolve); return ok })
	if stop < 0 || resolve < 0 || stop > resolve {
		t.Errorf("the probe %s, idle 4.5 s with nothing left at its stage, was not reaped in the step that took its backlog:\n%s", probe, list(cmds))
	}
}
