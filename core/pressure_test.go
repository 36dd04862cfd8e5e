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

// feedSlow: a feeds b, which is slow (one message at a time) and has a
// MAX_PENDING of 2.
const feedSlow = `
[pepsi-dispatch]
POLL_INTERVAL = 30
STATS_INTERVAL = 60
[stage-a]
PROGRAM = a
PARALLELISM = 1
QUEUE_LIMIT = 2
[stage-b]
PROGRAM = b
PARALLELISM = 1
QUEUE_LIMIT = 1
MAX_PENDING = 2
`

// pendingAt counts the rows pending at stage.
func (w *world) pendingAt(stage string) int {
	n := 0
	for _, r := range w.q.Rows() {
		if r.Stage == stage && r.Status == core.StatusPending {
			n++
		}
	}
	return n
}

// busyWorker is a live worker of stage that holds a message, or 0.
func (w *world) busyWorker(stage string) core.WorkerID {
	var ids []core.WorkerID
	for wid, s := range w.stageOf {
		if s == stage && w.alive[wid] && len(w.held[wid]) > 0 {
			ids = append(ids, wid)
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		return 0
	}
	return ids[0]
}

// Proves: once a stage's answers moved messages to b, nothing more is claimed
// for it while b has more than its MAX_PENDING pending (a claim reports b
// over its limit, Claimed.Over, and the stage's health and the snapshot say
// why it is held);
// b's pending count stays within MAX_PENDING plus what a held when the limit
// was crossed; the claim whose rows bring b back within its limit is followed,
// in the same step, by a claim for a; and every message finishes.
func TestAFullStageHoldsTheStageThatFeedsItUntilItIsBackWithinItsLimit(t *testing.T) {
	w := newWorld(t, feedSlow)
	w.start("a", 10)
	held, resumed := false, false
	for steps := 0; ; steps++ {
		if steps > 200 {
			t.Fatal("the messages did not finish in 200 answers")
		}
		// a answers twice as fast as b: b's pending grows until a is held.
		wasHeld := healthOf(t, w, "a").State == core.HealthPressureHeld
		waiting := w.pendingAt("a") > 0 && w.heldBy("a") < 2 // (room for them)
		var cmds []core.Command
		if wa := w.busyWorker("a"); wa != 0 && steps%3 != 2 {
			cmds = answerMove(w, wa, "0 >b")
		} else if wb := w.busyWorker("b"); wb != 0 {
			cmds = w.answer(wb, "", "", "0 >done")
		} else if wa != 0 {
			cmds = answerMove(w, wa, "0 >b")
		} else {
			break
		}
		// a holds at most QUEUE_LIMIT 2 when the limit is crossed.
		if n := w.pendingAt("b"); n > 2+2 {
			t.Fatalf("%d messages pending at b, more than MAX_PENDING 2 + the 2 a held", n)
		}
		// (The first claim of the step is decided before any result of it.)
		if cl := of[core.Claim](cmds); wasHeld && len(cl) > 0 && capsOf(cl[0])["a"] > 0 {
			t.Fatalf("a claimed while held: %v", cl[0])
		}
		if h := healthOf(t, w, "a"); h.State == core.HealthPressureHeld {
			held = true
			if h.Reason == "" {
				t.Errorf("a is held with no reason")
			}
			if s := w.c.Snapshot(); s.Stages[0].HeldBy != "b" || !s.Stages[1].OverMaxPending || s.Stages[1].MaxPending != 2 {
				t.Errorf("snapshot %+v: want a held by b, b over its MAX_PENDING 2", s.Stages)
			}
		} else if wasHeld && waiting {
			if capsOf(lastClaim(cmds))["a"] == 0 {
				t.Fatalf("b is back within its limit, a has messages pending, and no claim for a followed:\n%s", list(cmds))
			}
			resumed = true
		}
	}
	if !held || !resumed {
		t.Errorf("a held %v, resumed %v: want both", held, resumed)
	}
	for _, r := range w.q.Rows() {
		if r.Status != core.StatusDone {
			t.Errorf("row %d is %s at %s, want done", r.ID, r.Status, r.Stage)
		}
	}
}

// heldBy counts the messages the live workers of stage hold.
func (w *world) heldBy(stage string) int {
	n := 0
	for wid, s := range w.stageOf {
		if s == stage && w.alive[wid] {
			n += len(w.held[wid])
		}
	}
	return n
}

// lastClaim is the last Claim of cmds (the zero Claim for none).
func lastClaim(cmds []core.Command) core.Claim {
	cl := of[core.Claim](cmds)
	if len(cl) == 0 {
		return core.Claim{}
	}
	return cl[len(cl)-1]
}

// cycle: a and b feed each other, each with a MAX_PENDING of 1.
const cycle = `
[pepsi-dispatch]
POLL_INTERVAL = 30
[stage-a]
PROGRAM = a
PARALLELISM = 1
QUEUE_LIMIT = 1
MAX_PENDING = 1
[stage-b]
PROGRAM = b
PARALLELISM = 1
QUEUE_LIMIT = 1
MAX_PENDING = 1
`

// Proves: a stage over its own MAX_PENDING is never held, so a cycle of
// stages whose limits are all crossed keeps claiming at each stage (the
// messages drain out of it) instead of stopping.
func TestACycleOfStagesOverTheirLimitsIsNotHeld(t *testing.T) {
	w := newWorld(t, cycle)
	w.q.Insert("b", 4)
	w.start("a", 4)
	// Each stage sends one message to the other: the edges a -> b, b -> a.
	answerMove(w, w.busyWorker("a"), "0 >b")
	answerMove(w, w.busyWorker("b"), "0 >a")
	if a, b := w.pendingAt("a"), w.pendingAt("b"); a <= 1 || b <= 1 {
		t.Fatalf("pending a %d, b %d: want both over their limit of 1", a, b)
	}
	for steps := 0; w.busyWorker("a") != 0 || w.busyWorker("b") != 0; steps++ {
		if steps > 100 {
			t.Fatal("the cycle stopped")
		}
		for _, s := range []string{"a", "b"} {
			if h := healthOf(t, w, s); h.State == core.HealthPressureHeld && w.pendingAt(s) > 1 {
				t.Fatalf("%s is held though over its own limit: %s", s, h.Reason)
			}
		}
		if wa := w.busyWorker("a"); wa != 0 {
			w.answer(wa, "", "", "0 >done")
		} else {
			w.answer(w.busyWorker("b"), "", "", "0 >done")
		}
	}
	for _, r := range w.q.Rows() {
		if r.Status != core.StatusDone {
			t.Errorf("row %d is %s at %s, want done", r.ID, r.Status, r.Stage)
		}
	}
}

// chain: a feeds f, which feeds x (MAX_PENDING 1, slow).
const chain = `
[pepsi-dispatch]
POLL_INTERVAL = 30
[stage-a]
PROGRAM = a
PARALLELISM = 1
QUEUE_LIMIT = 4
[stage-f]
PROGRAM = f
PARALLELISM = 1
QUEUE_LIMIT = 4
[stage-x]
PROGRAM = x
PARALLELISM = 1
QUEUE_LIMIT = 1
MAX_PENDING = 1
`

// Proves: a stage held by back-pressure claims nothing by a move either: a
// move to it is written pending there, not running (moves that claim), and
// it is claimed there only once the stage it feeds is back within its limit.
func TestAMoveToAHeldStageDoesNotClaim(t *testing.T) {
	w := newWorld(t, chain)
	w.q.Insert("x", 3) // rows 1-3: x over its limit once x's worker holds one
	w.q.Insert("f", 1) // row 4
	w.start("a", 2)    // rows 5, 6
	// f sends row 4 to x: f feeds x, which then has 3 pending (over 1).
	answerMove(w, w.busyWorker("f"), "0 >x")
	if h := healthOf(t, w, "f"); h.State != core.HealthPressureHeld {
		t.Fatalf("f is %s (%s), want held by x's back-pressure", h.State, h.Reason)
	}
	cmds := answerMove(w, w.busyWorker("a"), "0 >f")
	if it := itemFor(t, cmds, 5); it.Claim {
		t.Fatalf("the move to held stage f claims: %v", it)
	}
	w.wantRow(5, "f", core.StatusPending)
	// x works off its messages; once it is back within its limit f claims 5.
	for i := 0; i < 3; i++ {
		w.answer(w.busyWorker("x"), "", "", "0 >done")
	}
	if h := healthOf(t, w, "f"); h.State != core.HealthOK {
		t.Fatalf("f is still %s (%s)", h.State, h.Reason)
	}
	w.wantRow(5, "f", core.StatusRunning)
}

// feedFull: f feeds x (MAX_PENDING 1, one message at a time).
const feedFull = `
[pepsi-dispatch]
POLL_INTERVAL = 3
[stage-f]
PROGRAM = f
PARALLELISM = 1
QUEUE_LIMIT = 4
[stage-x]
PROGRAM = x
PARALLELISM = 1
QUEUE_LIMIT = 1
MAX_PENDING = 1
`

// Proves: the heartbeat checks the limits even when no claim is otherwise
// due (a claim with no caps, Claim.Limits only), so a stage held while the
// stage it feeds cannot claim (its worker busy) resumes at the next
// heartbeat once something else, an operator, emptied that stage.
func TestTheHeartbeatChecksTheLimitsOfAFullStageWithoutClaiming(t *testing.T) {
	w := newWorld(t, feedFull)
	w.q.Insert("x", 3) // rows 1-3
	w.start("f", 2)    // rows 4, 5
	answerMove(w, w.busyWorker("f"), "0 >x")
	if h := healthOf(t, w, "f"); h.State != core.HealthPressureHeld {
		t.Fatalf("f is %s, want held", h.State)
	}
	answerMove(w, w.busyWorker("f"), "0 >x") // f has nothing left; x's worker holds row 1
	w.q.Insert("f", 1)                       // row 6, pending at f
	sel := store.Selection{Stage: "x", Statuses: []core.RowStatus{core.StatusPending}}
	if n, err := w.q.Discard(context.Background(), store.DiscardParams{Selection: sel, DispatchError: "discarded"}); err != nil || n == 0 {
		t.Fatalf("discard: %d, %v", n, err)
	}
	cmds := w.tick(4 * time.Second) // before f's idle worker is reaped (5 s)
	var checked bool
	for _, cl := range of[core.Claim](cmds) {
		checked = checked || (len(cl.Caps) == 0 && len(cl.Limits) > 0)
	}
	if !checked {
		t.Fatalf("the heartbeat sent no claim checking the limits alone:\n%s", list(cmds))
	}
	if h := healthOf(t, w, "f"); h.State != core.HealthOK {
		t.Fatalf("f is still %s (%s)", h.State, h.Reason)
	}
	w.wantRow(6, "f", core.StatusRunning)
}

// feedBroken: feed feeds broken (MAX_PENDING 2), whose program is made to
// fail its starts by the test.
const feedBroken = `
[pepsi-dispatch]
POLL_INTERVAL = 30
STATS_INTERVAL = 60
[stage-feed]
PROGRAM = feed
PARALLELISM = 1
QUEUE_LIMIT = 1
[stage-broken]
PROGRAM = broken
PARALLELISM = 2
QUEUE_LIMIT = 2
MAX_PENDING = 2
`

// Proves: while a stage's workers have not answered since its failed
// starts, a message its feeder moves on into it that the move claims there
// (running at once, in no backlog until the resolve's outcome) counts
// against its MAX_PENDING in the claim of the same transaction, whose count
// runs after the move and finds the row running, not pending: the feeder
// gets no more, and when the try fails the stage has no more than its
// MAX_PENDING plus the one message its feeder held pending.
func TestAMoveThatClaimsAtAStageThatCannotStartCountsAgainstItsMaxPending(t *testing.T) {
	w := newWorld(t, feedBroken)
	w.q.Insert("broken", 2) // rows 1, 2
	w.start("feed", 5)      // rows 3-7: feed's worker holds 3
	wb := w.busyWorker("broken")
	if wb == 0 || len(w.held[wb]) != 2 {
		t.Fatalf("broken's worker holds %v, want rows 1 and 2", w.held[wb])
	}
	w.exit(wb, 1, "")                           // a failed start: 1 and 2 are pending again
	w.tick(core.CooldownMin + time.Millisecond) // the next try claims them
	wb = w.busyWorker("broken")
	if wb == 0 || len(w.held[wb]) != 2 {
		t.Fatalf("broken's next worker holds %v, want rows 1 and 2", w.held[wb])
	}
	// Feed sends 3 on: the move claims it at broken, where 1 and 2 wait for
	// a worker that has not answered. With 3 that is 3 waiting, over 2.
	cmds := answerMove(w, w.busyWorker("feed"), "0 >broken")
	if it := itemFor(t, cmds, 3); !it.Claim {
		t.Fatalf("the move of 3 to broken does not claim there (the case this test is for): %v", it)
	}
	if l := lastClaim(cmds).Limits; len(l) != 1 || l[0].Max != -1 {
		t.Errorf("the claim checks broken's limit as %v, want Max -1 (2, less 1 and 2 held and 3 moved in)", l)
	}
	w.wantRow(4, "feed", core.StatusPending)
	if h := healthOf(t, w, "feed"); h.State != core.HealthPressureHeld {
		t.Errorf("feed is %s (%s), want held by broken", h.State, h.Reason)
	}
	// Every try fails: what broken's workers held is pending again, and
	// feed sends on whatever it was given meanwhile.
	for wb := w.busyWorker("broken"); wb != 0; wb = w.busyWorker("broken") {
		w.exit(wb, 1, "")
	}
	if wf := w.busyWorker("feed"); wf != 0 {
		answerMove(w, wf, "0 >broken")
	}
	if n := w.pendingAt("broken"); n > 2+1 {
		t.Errorf("%d messages pending at broken, more than MAX_PENDING 2 + the 1 feed held", n)
	}
}

// Proves: a claim that takes the rows of a stage that cannot start (none of
// its workers answered since its failed starts), at the next try after a
// cooldown, does not show the stage back within its MAX_PENDING: its count
// runs after it took them, and they wait for the stage as they did
// pending. The feeder stays held, no claim asks rows for it, and the check
// that follows, counting them, finds the stage over still.
func TestAClaimOfItsOwnRowsDoesNotShowAStageThatCannotStartBackWithinItsLimit(t *testing.T) {
	w := newWorld(t, feedBroken)
	w.q.Insert("broken", 3) // rows 1-3
	w.start("feed", 5)      // rows 4-8: feed's worker holds 4
	answerMove(w, w.busyWorker("feed"), "0 >broken")
	// Every start fails: 1-4 are pending again. Feed sends on 5, which it
	// held, and the claim after finds broken over its limit.
	for wb := w.busyWorker("broken"); wb != 0; wb = w.busyWorker("broken") {
		w.exit(wb, 1, "")
	}
	answerMove(w, w.busyWorker("feed"), "0 >broken")
	if h := healthOf(t, w, "feed"); h.State != core.HealthPressureHeld {
		t.Fatalf("feed is %s (%s), want held by broken", h.State, h.Reason)
	}
	n := w.pendingAt("broken")
	// The next try claims all the room broken has: 4 of its rows.
	cmds := w.tick(core.CooldownMin + time.Millisecond)
	if got := w.heldBy("broken"); got != 4 || n-w.pendingAt("broken") != 4 {
		t.Fatalf("broken's next try took %d of its %d pending rows, its workers hold %d: want 4 (the case this test is for)", n-w.pendingAt("broken"), n, got)
	}
	for _, cl := range of[core.Claim](cmds) {
		if capsOf(cl)["feed"] > 0 {
			t.Errorf("claim %v asks rows for feed, with %d messages pending or waiting for broken", cl, n)
		}
	}
	for _, l := range of[core.Log](cmds) {
		if strings.Contains(l.Msg, "back within") {
			t.Errorf("logged %q, with %d messages pending or waiting for broken", l.Msg, n)
		}
	}
	if h := healthOf(t, w, "feed"); h.State != core.HealthPressureHeld {
		t.Errorf("feed is %s (%s), want held by broken", h.State, h.Reason)
	}
}
