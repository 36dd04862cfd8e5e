package core_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Proves: a move to a stage with room is written straight to running there and
// handed to that stage's worker with no claim of its own (a move that claims);
// once the stage's room is taken, the next move goes pending there instead, and
// the moves that claimed reserved what they took (the same step's claim asks
// for less).
func TestAMoveClaimsOnlyWhatTheNextStageHasRoomFor(t *testing.T) {
	w := newWorld(t, threeStages) // b: PARALLELISM 1, QUEUE_LIMIT 4
	w.start("a", 5)
	for i := 0; i < 5; i++ {
		wid := core.WorkerID(1)
		if len(w.held[wid]) == 0 {
			wid = 2
		}
		cmds := answerMove(w, wid, "0 >b")
		it := items(cmds)[0]
		if want := i < 4; it.Claim != want {
			t.Fatalf("move %d: item %v, want Claim %v (b has room for 4)", i+1, it, want)
		}
		if it.Claim {
			if cl := of[core.Claim](cmds); len(cl) > 0 && capsOf(cl[0])["b"] > 3-i {
				t.Errorf("move %d: the claim asks %d of b, which has room for %d after the move", i+1, capsOf(cl[0])["b"], 3-i)
			}
		}
	}
	var toB []int64
	for _, wr := range of[core.Write](w.all) {
		if w.stageOf[wr.Worker] == "b" {
			toB = append(toB, wr.IDs...)
		}
	}
	if len(toB) != 4 {
		t.Errorf("b's worker was handed %v, want the 4 rows that moved and claimed", toB)
	}
	for _, id := range toB {
		w.wantRow(id, "b", core.StatusRunning)
	}
	pending := 0
	for _, r := range w.q.Rows() {
		if r.Stage == "b" && r.Status == core.StatusPending {
			pending++
		}
	}
	if pending != 1 {
		t.Errorf("%d rows pending at b, want the one move b had no room for", pending)
	}
}

// Proves: a move does not claim past rows the core knows may be pending at its
// target (claims go in ingress_id order): after a notification the move to b is
// written pending, and the claim of the same transaction takes b's rows in
// order.
func TestAMoveDoesNotOvertakeRowsPendingAtItsTarget(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.q.Insert("b", 1) // row 2, pending at b: the core hears of it with the answer
	w.pending = append(w.pending, core.Ingress{})
	cmds := answerMove(w, 1, "0 >b")
	if it := itemFor(t, cmds, 1); it.Claim {
		t.Fatalf("item %v claims, though row 2 may be pending at b", it)
	}
	if wr := of[core.Write](cmds); len(wr) == 0 || wr[0].IDs[0] != 1 || len(wr[0].IDs) != 2 {
		t.Errorf("b's worker was handed %v, want rows 1 and 2 by the claim", wr)
	}
}

// Proves: a resolve whose reply was lost may have moved and claimed a row that
// no one holds: the core resets running rows it does not hold before it claims
// again (as after a lost claim), re-sends the item without its claim, and the
// message reaches b's worker once.
func TestALostReplyOfAMoveThatClaimsResetsItsRow(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1)
	w.loseReplies = true
	lost := itemFor(t, answerMove(w, 1, "0 >b"), 1)
	w.loseReplies = false
	if !lost.Claim {
		t.Fatalf("item %v does not claim", lost)
	}
	w.wantRow(1, "b", core.StatusRunning) // applied: running at b, held by no one
	cmds := w.step(core.DatabaseUp{})
	reset := one[core.ResetOrphans](t, cmds)
	if len(reset.Keep) != 0 {
		t.Errorf("reset keeps %v, want nothing kept (row 1's resolve may have applied)", reset.Keep)
	}
	if again := itemFor(t, cmds, 1); again.Claim {
		t.Errorf("re-sent item %v claims; a re-sent item decides nothing on a row it may have moved", again)
	}
	n := 0
	for _, wr := range of[core.Write](w.all) {
		if w.stageOf[wr.Worker] == "b" {
			n += len(wr.IDs)
		}
	}
	if n != 1 {
		t.Errorf("message 1 handed to b %d times, want once:\n%s", n, list(w.all))
	}
	w.wantRow(1, "b", core.StatusRunning)
}

// Proves: a stage with a RATE is never claimed by a move (its bucket counts
// claims), and no move claims during a shutdown.
func TestAMoveDoesNotClaimForARatedStageNorDuringShutdown(t *testing.T) {
	w := newWorld(t, threeStages+"RATE = 1000\n") // stage c has the rate
	w.start("a", 2)
	if it := itemFor(t, answerMove(w, 1, "0 >c"), 1); it.Claim {
		t.Errorf("item %v claims at stage c, which has a RATE", it)
	}
	w.step(core.Shutdown{})
	if it := itemFor(t, answerMove(w, 1, "0 >b"), 2); it.Claim {
		t.Errorf("item %v claims during a shutdown", it)
	}
}

// Proves: a move leaves the next stage's room to the rows the core itself left
// pending there (claims go in ingress_id order): with room for one row at b
// and row 5 pending there, the move of row 6 to b does not claim, and the
// claim of the same transaction takes row 5.
func TestAMoveLeavesTheRoomToRowsPendingBeforeIt(t *testing.T) {
	w := newWorld(t, threeStages) // b: PARALLELISM 1, QUEUE_LIMIT 4
	w.start("a", 6)
	holder := func(id int64) core.WorkerID {
		t.Helper()
		for wid, ids := range w.held {
			if len(ids) > 0 && ids[0] == id {
				return wid
			}
		}
		t.Fatalf("no worker holds %d at its head: %v", id, w.held)
		return 0
	}
	for id := int64(1); id <= 5; id++ {
		answerMove(w, holder(id), "0 >b")
	}
	w.wantRow(5, "b", core.StatusPending) // b was full
	bw, aw := holder(1), holder(6)
	w.held[bw], w.held[aw] = w.held[bw][1:], w.held[aw][1:]
	cmds := w.step(core.Answer{Worker: bw, Line: "0 >c"}, core.Answer{Worker: aw, Line: "0 >b"})
	if it := itemFor(t, cmds, 6); it.Claim {
		t.Errorf("item %v claims the one slot b has, overtaking row 5 pending there", it)
	}
	w.wantRow(5, "b", core.StatusRunning)
	w.wantRow(6, "b", core.StatusPending)
}

// answerAll makes every worker of stage answer line for every message it
// holds, all in one step.
func answerAll(w *world, stage, line string) []core.Command {
	var evs []core.Event
	for _, wid := range slices.Sorted(maps.Keys(w.held)) {
		if w.stageOf[wid] != stage {
			continue
		}
		for range w.held[wid] {
			evs = append(evs, core.Answer{Worker: wid, Line: line})
		}
		w.held[wid] = nil
	}
	return w.step(evs...)
}

// firstClaim is the claim of the transaction the step's answers went into.
func firstClaim(t *testing.T, cmds []core.Command) core.Claim {
	t.Helper()
	cl := of[core.Claim](cmds)
	if len(cl) == 0 {
		t.Fatalf("no claim in:\n%s", list(cmds))
	}
	return cl[0]
}

// Proves: a stage whose moves find no room at their target takes fewer new
// rows in the same step, one slot fewer per such move, but never less than
// half its room. Without it a queue once left at b never drains while a and b
// keep pace, and every hop through b costs two row versions
// (docs/performance.md, "A stage yields").
func TestAStageYieldsItsClaimToMovesThatFoundNoRoom(t *testing.T) {
	w := newWorld(t, threeStages) // a: 2 workers of QUEUE_LIMIT 3; b: one of QUEUE_LIMIT 4
	w.start("a", 20)
	// Six moves to b, which has room for four: two go pending, and a, with
	// room for six, claims four.
	cmds := answerAll(w, "a", "0 >b")
	claims := 0
	for _, it := range items(cmds) {
		if it.Claim {
			claims++
		}
	}
	if claims != 4 {
		t.Fatalf("%d of the six moves claim, want the 4 b has room for:\n%s", claims, list(cmds))
	}
	if got := capsOf(firstClaim(t, cmds))["a"]; got != 4 {
		t.Errorf("the claim asks %d rows of a, want 4: its room of 6 less the 2 moves that found no room at b", got)
	}
	// Six more moves to a full b: none claims, and a, with room for six
	// again, yields at most half of it.
	cmds = answerAll(w, "a", "0 >b")
	for _, it := range items(cmds) {
		if it.Claim {
			t.Fatalf("item %v claims at b, which is full", it)
		}
	}
	if got := capsOf(firstClaim(t, cmds))["a"]; got != 3 {
		t.Errorf("the claim asks %d rows of a, want 3: half its room of 6 (six moves found no room, but a yields at most half)", got)
	}
}

// Proves: a stage does not yield to its moves to a stage with a RATE (they
// never claim: yielding would only halve it for good) nor to its moves to
// itself (its own claim is what drains that queue).
func TestAStageDoesNotYieldToMovesToARatedStageOrToItself(t *testing.T) {
	w := newWorld(t, threeStages+"RATE = 1000\n") // stage c has the rate
	w.start("a", 20)
	cmds := answerAll(w, "a", "0 >c")
	if got := capsOf(firstClaim(t, cmds))["a"]; got != 6 {
		t.Errorf("after six moves to rated stage c, the claim asks %d rows of a, want its whole room of 6", got)
	}
	cmds = answerAll(w, "a", "0 >a")
	for _, it := range items(cmds) {
		if it.Claim {
			t.Fatalf("item %v claims at a, where 8 rows are pending", it)
		}
	}
	if got := capsOf(firstClaim(t, cmds))["a"]; got != 6 {
		t.Errorf("after six moves of a to a, the claim asks %d rows of a, want its whole room of 6", got)
	}
}
