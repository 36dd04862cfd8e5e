package core_test

import (
	"slices"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// lookAtFullB brings a world of threeStages to a look (LookEvery, the core
// busy) at a moment stage b is full: b's one worker holds rows 1 to 4, and
// the look's claim, out (deferred), leaves b out. w2 still holds row 6 at a.
// It returns the world and b's worker.
func lookAtFullB(t *testing.T) (*world, core.WorkerID) {
	t.Helper()
	w := newWorld(t, threeStages)
	w.start("a", 6) // w1 holds rows 1 to 3 at a, w2 rows 4 to 6
	for range 3 {
		answerMove(w, 1, "0 >b")
	}
	answerMove(w, 2, "0 >b")
	var bw core.WorkerID
	for wid, st := range w.stageOf {
		if st == "b" {
			bw = wid
		}
	}
	w.deferTxns = true
	w.now = w.now.Add(core.LookEvery) // the next claim looks
	looked := of[core.Claim](answerMove(w, 2, "0 >c"))
	if len(looked) != 1 || capsOf(looked[0])["a"] == 0 {
		t.Fatalf("with a look due the core sent %v; want a claim that looks at stage a", looked)
	}
	if _, ok := capsOf(looked[0])["b"]; ok {
		t.Fatalf("the look's claim %s claims at b, which is full", looked[0])
	}
	return w, bw
}

// row6Claims reports whether cmds resolve row 6 with a move that claims.
func row6Claims(cmds []core.Command) bool {
	for _, it := range items(cmds) {
		if it.ID == 6 {
			return it.Claim
		}
	}
	return false
}

// Proves: the core's periodic look (LookEvery, while it is busy) leaves a
// stage it cannot claim for want of room known to be empty: the moves to it
// in the next transaction still claim, leaving one slot of its room for the
// claim that looks, which that transaction's claim then makes. Stage b is
// full (rows 1 to 4) when the look is due, so the look's claim leaves it out;
// b's worker finishes rows 1 and 2 and row 6 moves to b while that claim is
// out. The next transaction's move of row 6 claims at b, and its claim looks
// at b with the slot left. (Ended by the look, b's dryness kept every such
// move from claiming: a row version more for each, with order keys for about
// one move in three.)
func TestALookThatFindsAStageFullLeavesItsMovesClaiming(t *testing.T) {
	w, bw := lookAtFullB(t)
	answerMove(w, bw, "0 >done")
	answerMove(w, bw, "0 >done")
	answerMove(w, 2, "0 >b") // row 6
	next := w.reply(0)
	if !row6Claims(next) {
		t.Fatalf("after the look the core sent %s; want row 6's move to claim at b, which was claimed dry and has room", list(next))
	}
	if c := of[core.Claim](next); len(c) != 1 || capsOf(c[0])["b"] < 1 {
		t.Fatalf("after the look the core sent %s; want a claim that looks at b in the slot the move left", list(next))
	}
	w.drain()
	w.wantRow(6, "b", core.StatusRunning)
}

// Proves: the slot a look owed at a stage keeps is kept from the moves: with
// one row of room at b (its worker finished row 1 alone), row 6's move to b
// does not claim it, and the next transaction's claim looks at b with it
// (and takes row 6, pending there), as it would take a row committed there
// without a notification: moves that fill the stage for as long as they
// come do not keep the look from it.
func TestALookOwedAtAStageKeepsASlotOfItsRoomFromTheMoves(t *testing.T) {
	w, bw := lookAtFullB(t)
	answerMove(w, bw, "0 >done")
	answerMove(w, 2, "0 >b") // row 6
	next := w.reply(0)
	if row6Claims(next) {
		t.Fatalf("after the look the core sent %s; want row 6's move to leave b's one free slot to the claim that looks", list(next))
	}
	if c := of[core.Claim](next); len(c) != 1 || capsOf(c[0])["b"] != 1 {
		t.Fatalf("after the look the core sent %s; want a claim that looks at b for its one free slot", list(next))
	}
	w.drain()
	w.wantRow(6, "b", core.StatusRunning)
}

// Proves: with SESSIONS above 1, a look while a Rest waits for the gate
// claims each stage for its room, not for the one row a probe asks of a
// stage claimed dry: the look is owed at every stage, and a stage a look is
// owed at is not probed. Three rows committed at b without a notification
// are claimed by that one look, not one per look. (Before a look stopped
// ending dryness, no stage was dry after it, so none was probed.)
func TestALookWhileARestWaitsClaimsEachStageForItsRoomBesideTwoSessions(t *testing.T) {
	w := newWorld(t, twoSessions)
	w.start("a", 0) // every stage claimed dry
	w.at(core.RestAfter)
	one[core.Rest](t, w.c.Step(w.now, core.Tick{}))
	w.q.Insert("b", 3) // committed without a notification
	c := one[core.Claim](t, w.c.Step(w.now.Add(core.LookEvery), core.Tick{}))
	if capsOf(c)["b"] < 3 {
		t.Fatalf("the look while the Rest waits claims %v; want b claimed for its room (4), which holds the three rows", c.Caps)
	}
}

// Proves: moves that take every slot a worker frees at a stage do not keep
// the look from it. Stage b is full and each transaction resolves b's
// finished head beside a move from a to b, which claims the freed slot, so
// no claim can take b; a row committed at b without a notification (older
// than the moving rows) is handed within a few transactions all the same,
// though they follow each other 4 ms apart, well within LookEvery. (A claim
// that left b out for want of room counted as a look, so with transactions
// this close the core never looked again, no slot was kept, and the row
// waited as long as the moves came.)
func TestMovesThatTakeEveryFreedSlotDoNotKeepTheLookFromAStage(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 6) // w1 holds rows 1 to 3 at a, w2 rows 4 to 6
	for range 3 {
		answerMove(w, 1, "0 >b")
	}
	answerMove(w, 2, "0 >b") // b's worker holds rows 1 to 4: b is full
	var bw core.WorkerID
	for wid, st := range w.stageOf {
		if st == "b" {
			bw = wid
		}
	}
	quiet := w.q.Insert("b", 1)[0] // committed without a notification
	w.q.Insert("a", 40)            // younger rows that will move to b
	w.deferTxns = true
	answerMove(w, 2, "0 >c") // row 5: a transaction out, b left out of its claim
	for i := range 30 {
		answerMove(w, bw, "0 >done")
		var aw core.WorkerID
		for wid, st := range w.stageOf {
			if st == "a" && len(w.held[wid]) > 0 && (aw == 0 || wid < aw) {
				aw = wid
			}
		}
		if aw == 0 {
			t.Fatalf("step %d: no worker of a holds a row to move to b", i)
		}
		answerMove(w, aw, "0 >b")
		last := len(w.out) - 1
		for last >= 0 && w.out[last] == nil {
			last--
		}
		if got := handed(w.reply(last)); slices.Contains(got, quiet) {
			return
		}
		w.now = w.now.Add(4 * time.Millisecond)
	}
	t.Fatalf("row %d, committed at b without a notification, was not handed in 30 transactions 4 ms apart (%s): moves took every slot b's worker freed", quiet, 30*4*time.Millisecond)
}

// Proves: with SESSIONS = 2, moves that take every slot a worker frees at a
// stage do not keep the look from it when they go beside the full
// transaction. Stages b and c are full, so each full transaction resolves a
// move from a to c left pending there. Each round b's worker finishes its
// head and a row moves from a to b, both resolved beside the full
// transaction, the move with a claim of the slot the head freed; both
// answer before the full transaction does, so the move's reservation is
// given back before the next full transaction's claim is built, and b is
// then full only of rows the core holds. A row committed at b without a
// notification (older than the moving rows) is handed within a bounded
// number of rounds all the same, though the rounds follow each other 4 ms
// apart, well within LookEvery. (A claim that left b out for want of room
// with no move reserving any counted as a look, so the core never looked
// again, no slot was kept, and the row waited as long as the moves came.)
func TestMovesBesideTheFullTransactionDoNotKeepTheLookFromAStage(t *testing.T) {
	w := newWorld(t, twoSessions)
	w.start("a", 8) // w1 holds rows 1 to 3 at a, w2 rows 4 to 6
	for range 3 {
		answerMove(w, 1, "0 >c") // rows 1 to 3, and w1 takes rows 7 and 8
	}
	for range 3 {
		answerMove(w, 2, "0 >b") // rows 4 to 6
	}
	answerMove(w, 1, "0 >b") // row 7
	var bw core.WorkerID
	var cw int
	for wid, st := range w.stageOf {
		switch st {
		case "b":
			bw = wid
		case "c":
			cw += len(w.held[wid])
		}
	}
	if len(w.held[bw]) != 4 || cw != 3 || !slices.Equal(w.held[1], []int64{8}) {
		t.Fatalf("b's worker holds %v, c's workers %d rows, w1 %v; want b and c full (4 and 3 rows) and row 8 at w1", w.held[bw], cw, w.held[1])
	}
	quiet := w.q.Insert("b", 1)[0] // committed without a notification
	w.q.Insert("a", 100)           // younger rows that will move to b and c
	aWorker := func() core.WorkerID {
		var aw core.WorkerID
		for wid, st := range w.stageOf {
			if st == "a" && len(w.held[wid]) > 0 && (aw == 0 || wid < aw) {
				aw = wid
			}
		}
		if aw == 0 {
			t.Fatalf("at %s no worker of a holds a row", w.now.Sub(epoch))
		}
		return aw
	}
	w.deferTxns = true
	answerMove(w, 1, "0 >c")         // row 8, pending at c
	w.drain()                        // the claims take rows at a, not the row at b, which is full
	answerMove(w, aWorker(), "0 >c") // pending at c: a full transaction out
	const rounds = 40
	for range rounds {
		var got []int64
		got = append(got, handed(answerMove(w, bw, "0 >done"))...) // beside the full transaction
		got = append(got, handed(answerMove(w, aWorker(), "0 >b"))...)
		got = append(got, handed(answerMove(w, aWorker(), "0 >c"))...) // owed to the next full transaction
		for {
			var waiting []int
			for j, txn := range w.out {
				if txn != nil {
					waiting = append(waiting, j)
				}
			}
			if len(waiting) < 2 {
				break
			}
			// The newest, sent beside the oldest (the full transaction), answers first.
			got = append(got, handed(w.reply(waiting[len(waiting)-1]))...)
		}
		for j, txn := range w.out {
			if txn != nil {
				got = append(got, handed(w.reply(j))...)
				break
			}
		}
		if slices.Contains(got, quiet) {
			return
		}
		w.now = w.now.Add(4 * time.Millisecond)
	}
	t.Fatalf("row %d, committed at b without a notification, was not handed in %d rounds 4 ms apart (%s); want it handed once a look (due every %s) keeps a slot of b: moves beside the full transaction took every slot b's worker freed", quiet, rounds, rounds*4*time.Millisecond, core.LookEvery)
}
