package core_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
)

// twoSessions is threeStages with SESSIONS = 2.
var twoSessions = strings.Replace(threeStages, "STATS_INTERVAL = 60\n", "STATS_INTERVAL = 60\nSESSIONS = 2\n", 1)

// queueCmds lists the queue commands of cmds.
func queueCmds(cmds []core.Command) []core.Command {
	return slices.DeleteFunc(slices.Clone(cmds), func(c core.Command) bool { return !core.IsQueue(c) })
}

// wantNoClaim fails the test with why if cmds resolve row id with a move that
// claims.
func wantNoClaim(t *testing.T, cmds []core.Command, id int64, why string) {
	t.Helper()
	for _, it := range items(cmds) {
		if it.ID == id && it.Claim {
			t.Fatalf("%s: %s", why, list(cmds))
		}
	}
}

// Proves: with SESSIONS = 2, answers that arrive while the step's transaction
// is out are resolved at once in a second transaction of one Resolve (no claim,
// wake, release or flush beside it), and a third waits for a session; with
// SESSIONS = 1 they all wait for the first transaction's result. The rows end
// as answered whichever transaction commits first.
func TestASecondSessionResolvesBesideTheStepsTransaction(t *testing.T) {
	w := newWorld(t, twoSessions)
	w.start("a", 3) // w1 holds rows 1, 2 and 3 at a
	w.deferTxns = true
	first := queueCmds(answerMove(w, 1, "0 >done"))
	if len(first) == 0 {
		t.Fatal("the first answer sent no transaction")
	}
	second := queueCmds(answerMove(w, 1, "0 >done"))
	if len(second) != 1 {
		t.Fatalf("beside the first transaction the core sent %s; want one Resolve", list(second))
	}
	if r, ok := second[0].(core.Resolve); !ok || len(r.Items) != 1 || r.Items[0].ID != 2 {
		t.Fatalf("beside the first transaction the core sent %s; want the resolve of row 2 alone", second[0])
	}
	if third := queueCmds(answerMove(w, 1, "0 >done")); len(third) != 0 {
		t.Fatalf("with two transactions out the core sent %s; want nothing until a session is free", list(third))
	}
	// The second commits and answers first.
	next := queueCmds(w.reply(1))
	if r := of[core.Resolve](next); len(r) != 1 || len(r[0].Items) != 1 || r[0].Items[0].ID != 3 {
		t.Fatalf("once the second transaction answered the core sent %s; want the resolve of row 3", list(next))
	}
	w.reply(0)
	w.reply(2)
	for id := int64(1); id <= 3; id++ {
		w.wantRow(id, "a", core.StatusDone)
	}

	t.Run("one session", func(t *testing.T) {
		one := newWorld(t, threeStages)
		one.start("a", 2)
		one.deferTxns = true
		answerMove(one, 1, "0 >done")
		if cmds := queueCmds(answerMove(one, 1, "0 >done")); len(cmds) != 0 {
			t.Errorf("with SESSIONS = 1 and a transaction out the core sent %s; want nothing", list(cmds))
		}
	})
}

// Proves: a claim's result does not end the look at a stage where a
// transaction sent beside it made a row pending that the claim may not have
// seen. Row 2's stage moved it to c itself and answered "0 >done": its
// resolve, beside the step's transaction, misses its guard and leaves it
// pending at c, committing after that transaction's claim ran and answering
// first. The next claim looks at c again below row 2 and takes it. (Taken as
// a claim's result always is, c would count as claimed dry with its floor
// above the row, which would wait for a later look.)
func TestAClaimsResultKeepsLookingWhereATransactionBesideItMadeRowsPending(t *testing.T) {
	w := newWorld(t, twoSessions)
	w.start("a", 2) // w1 holds rows 1 and 2 at a
	w.deferTxns = true
	first := queueCmds(answerMove(w, 1, "0 >b"))
	if c := of[core.Claim](first); len(c) != 1 || capsOf(c[0])["c"] == 0 {
		t.Fatalf("the first answer sent %s; want a claim that looks at c", list(first))
	}
	second := queueCmds(w.answer(1, "c", core.StatusRunning, "0 >done"))
	if it := items(second); len(it) != 1 || it[0].ID != 2 {
		t.Fatalf("beside %s the core sent %s; want row 2's resolve", list(first), list(second))
	}
	// The first transaction (its claim included) commits, then the second;
	// the second's result arrives first.
	r0 := w.apply(0)
	r1 := w.apply(1)
	w.step(r1...)
	w.wantRow(2, "c", core.StatusPending)
	cmds := w.step(r0...)
	looked := false
	for _, c := range of[core.Claim](cmds) {
		if after, ok := capsAfter(c)["c"]; ok && after < 2 {
			looked = true
		}
	}
	if !looked {
		t.Fatalf("after the claim's result the core sent %s; want a claim of c above an id below 2", list(cmds))
	}
	w.drain()
	w.wantRow(2, "c", core.StatusRunning)
}

// Proves: a busy core with only a resolve out beside its step's transaction
// (it cannot rest while one is out, so producers do not notify it) asks for a
// Tick LookEvery after its last look, and at that Tick looks for work with a
// claim of every stage with room, sent beside the resolve: a row a producer
// committed meanwhile without notifying waits no longer than that.
func TestABusyCoreBesideAResolveLooksEveryLookEvery(t *testing.T) {
	w := newWorld(t, twoSessions)
	w.start("a", 3)
	w.deferTxns = true
	answerMove(w, 1, "0 >done") // transaction 0: its resolve and a claim
	answerMove(w, 1, "0 >done") // transaction 1: a resolve beside it
	cmds := w.reply(0)
	w.q.Insert("a", 1) // row 4, committed without a notification
	timers := of[core.SetTimer](cmds)
	if len(timers) == 0 || timers[len(timers)-1].At.After(w.now.Add(core.LookEvery)) {
		t.Fatalf("with a resolve out the core asked for %v; want a Tick within LookEvery (%s)", timers, core.LookEvery)
	}
	w.now = timers[len(timers)-1].At
	looked := of[core.Claim](w.step(core.Tick{}))
	if len(looked) != 1 || capsOf(looked[0])["a"] == 0 {
		t.Fatalf("at the Tick the core sent %v; want a claim that looks at stage a", looked)
	}
	w.reply(2)
	w.reply(1)
	w.wantRow(4, "a", core.StatusRunning)
}

// narrowB is twoSessions with room for two rows at b.
var narrowB = strings.Replace(strings.Replace(twoSessions, "[stage-b]\nPROGRAM = b\nPARALLELISM = 1\nQUEUE_LIMIT = 4", "[stage-b]\nPROGRAM = b\nPARALLELISM = 1\nQUEUE_LIMIT = 2", 1), "[stage-a]\nPROGRAM = a\nPARALLELISM = 2\nQUEUE_LIMIT = 3", "[stage-a]\nPROGRAM = a\nPARALLELISM = 1\nQUEUE_LIMIT = 3", 1)

// Proves: a move beside an outstanding transaction does not claim at a stage
// where that transaction may leave a row pending. Row 3's move to b, sent when
// b was full, goes pending there; while it is out, b's worker finishes a row
// and row 4 moves to b: its move may not claim past row 3, so it waits for
// the next full transaction, and b's worker gets row 3 first.
func TestAMoveBesideDoesNotClaimWhereAnOutstandingTransactionLeavesRowsPending(t *testing.T) {
	w := newWorld(t, narrowB)
	w.q.Insert("b", 2) // rows 1 and 2 fill b
	w.q.Insert("a", 2) // rows 3 and 4
	w.step(core.Start{})
	w.deferTxns = true
	first := queueCmds(answerMove(w, 1, "0 >b")) // w1 (a) holds 3 and 4
	if it := itemFor(t, first, 3); it.Claim {
		t.Fatalf("row 3's move claims at a full b: %s", list(first))
	}
	answerMove(w, 2, "0 >done") // b's worker finishes row 1 beside it
	w.reply(1)
	wantNoClaim(t, queueCmds(answerMove(w, 1, "0 >b")), 4, "with row 3's move to b out, row 4's move beside it claims at b")
	w.drain()
	w.wantRow(3, "b", core.StatusRunning)
	w.wantRow(4, "b", core.StatusPending) // b is full again: rows 2 and 3
	answerMove(w, 2, "0 >done")
	w.drain()
	w.wantRow(4, "b", core.StatusRunning)
	var handed []int64
	for _, wr := range of[core.Write](w.all) {
		if w.stageOf[wr.Worker] == "b" {
			handed = append(handed, wr.IDs...)
		}
	}
	if i, j := slices.Index(handed, 3), slices.Index(handed, 4); i < 0 || j < i {
		t.Errorf("b's worker was handed %v; want row 3 before row 4", handed)
	}
}

// Proves: a move in a transaction beside the step's claims nothing at a
// stage where rows the core knows of are pending: no claim follows in its
// transaction to take them first. Row 3 waits pending at b; the step's
// transaction out beside claims nothing at b (b was full when it was sent);
// b's worker finishes both its rows, and row 5's move to b, beside, does not
// claim past row 3: it waits for the next full transaction.
func TestAMoveBesideDoesNotClaimPastRowsKnownPending(t *testing.T) {
	w := newWorld(t, narrowB)
	w.q.Insert("b", 2) // rows 1 and 2 fill b
	w.q.Insert("a", 3) // rows 3, 4 and 5
	w.step(core.Start{})
	w.deferTxns = true
	answerMove(w, 1, "0 >b") // row 3: b is full, so it goes pending
	w.drain()
	w.wantRow(3, "b", core.StatusPending)
	full := queueCmds(answerMove(w, 1, "1 broken")) // row 4 fails: a full transaction
	fullAt := len(w.out) - 1
	for _, c := range of[core.Claim](full) {
		if capsOf(c)["b"] > 0 {
			t.Fatalf("the step's transaction claims at b, which is full: %s", list(full))
		}
	}
	answerMove(w, 2, "0 >done")
	answerMove(w, 2, "0 >done")
	for i := fullAt + 1; i < len(w.out); i++ { // the resolves beside the step's transaction
		if w.out[i] != nil {
			w.reply(i)
		}
	}
	wantNoClaim(t, queueCmds(answerMove(w, 1, "0 >b")), 5, "beside the step's transaction row 5's move claims at b, past row 3 pending there")
	w.drain()
	w.wantRow(3, "b", core.StatusRunning)
	w.wantRow(5, "b", core.StatusRunning)
}
