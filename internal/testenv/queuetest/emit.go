// The conformance tests of emitted messages (core.Item.Emits): children are
// inserted with the move that answered them, and only if its guard matched.

package queuetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// emitTests run on every Harness.
var emitTests = []conformanceTest{
	{"AMovesEmitsAreInsertedPendingWithTheirParentInOrder", testEmitInserted},
	{"AGuardMissInsertsNoneOfItsEmits", testEmitGuardMiss},
	{"MovesToDoneToPausedAndMovesThatClaimInsertTheirEmits", testEmitTargets},
	{"AnEmittedKeyAlreadyInTheQueueInsertsNothing", testEmitDedup},
	{"AResolveSentAgainAfterItsCommitInsertsNoSecondChildren", testEmitResent},
	{"AClaimAfterAResolveThatEmitsInItsTransactionReportsIngressSettled", testEmitSettled},
	{"AnEmitThatClaimsIsInsertedRunningAndReportedAsAClaimsRow", testEmitClaimed},
}

// move with emits.
func moveEmitting(id int64, stage, to string, emits ...core.Emit) core.Item {
	it := move(id, stage, to)
	it.Emits = emits
	return it
}

// show reads one message as pepsi-queue show does.
func show(t *testing.T, h Harness, id int64) *store.Message {
	t.Helper()
	m, err := h.Show(t.Context(), id)
	if err != nil {
		t.Fatalf("show %d: %v", id, err)
	}
	return m
}

// childrenAfter lists the messages whose parent is parent among the ids
// after `after` up to after+span (a child a key kept out may have taken an id
// and left a gap).
func childrenAfter(t *testing.T, h Harness, parent, after int64, span int) []*store.Message {
	t.Helper()
	var out []*store.Message
	for id := after + 1; id <= after+int64(span); id++ {
		m, err := h.Show(t.Context(), id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("show %d: %v", id, err)
		}
		if m.ParentID == parent {
			out = append(out, m)
		}
	}
	return out
}

func childText(m *store.Message) string {
	return fmt.Sprintf("{%s:%s payload=%q state=%s key=%q order_key=%q parent=%d}", m.Stage, m.Status, m.Payload, m.State, m.DedupKey, m.OrderKey, m.ParentID)
}

func testEmitInserted(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	got := resolve(t, h,
		moveEmitting(ids[0], "a", "b",
			core.Emit{Stage: "c", Payload: []byte("row 1")},
			core.Emit{Stage: "b", Payload: []byte{0xff, 0}, State: `{"n":2,"s":"é"}`},
			core.Emit{Stage: "c", Payload: []byte{}}),
		move(ids[1], "a", "b"))
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "b", Status: core.StatusPending, Matched: true},
		{ID: ids[1], Stage: "b", Status: core.StatusPending, Matched: true},
	})
	kids := childrenAfter(t, h, ids[0], ids[1], 6)
	if len(kids) != 3 {
		t.Fatalf("children of %d: %d, want 3", ids[0], len(kids))
	}
	want := []struct {
		stage, payload, state string
	}{{"c", "row 1", "map[]"}, {"b", "\xff\x00", "map[n:2 s:é]"}, {"c", "", "map[]"}}
	for i, k := range kids {
		var state map[string]any
		if err := json.Unmarshal(k.State, &state); err != nil {
			t.Fatalf("child %d: state %s: %v", i, k.State, err)
		}
		w := want[i]
		if k.Stage != w.stage || core.RowStatus(k.Status) != core.StatusPending || string(k.Payload) != w.payload ||
			fmt.Sprint(state) != w.state || k.ParentID != ids[0] || k.DedupKey != "" || k.OrderKey != "" {
			t.Errorf("child %d = %s, want pending at %s, payload %q, state %s, parent %d", i, childText(k), w.stage, w.payload, w.state, ids[0])
		}
		if i > 0 && k.ID <= kids[i-1].ID {
			t.Errorf("child %d has id %d, not after child %d's %d: not in the order emitted", i, k.ID, i-1, kids[i-1].ID)
		}
	}
	if m := show(t, h, ids[0]); m.Children != 3 || m.ParentID != 0 {
		t.Errorf("show %d: children %d parent %d, want 3 children and no parent", ids[0], m.Children, m.ParentID)
	}
	if m := show(t, h, ids[1]); m.Children != 0 {
		t.Errorf("show %d: %d children, want none", ids[1], m.Children)
	}
	// pepsi-httpd's message page names them too: the parent's children, oldest
	// first, and a child's parent.
	if p, err := h.ReadPageMessage(t.Context(), ids[0]); err != nil || p.ParentID != 0 || p.Children != 3 ||
		!slices.Equal(p.FirstChildren, []int64{kids[0].ID, kids[1].ID, kids[2].ID}) {
		t.Errorf("ReadPageMessage(%d): parent %d, %d children %v, %v; want none, 3: %d, %d, %d", ids[0], p.ParentID, p.Children, p.FirstChildren, err,
			kids[0].ID, kids[1].ID, kids[2].ID)
	}
	if p, err := h.ReadPageMessage(t.Context(), kids[1].ID); err != nil || p.ParentID != ids[0] || p.Children != 0 || len(p.FirstChildren) != 0 {
		t.Errorf("ReadPageMessage(%d): parent %d, %d children %v, %v; want parent %d, no children", kids[1].ID, p.ParentID, p.Children, p.FirstChildren, err, ids[0])
	}
	// Pending at their stages: the claim takes them, with their message.
	rows := claimRows(t, h, core.Cap{Stage: "c", N: 5, LineMax: 1 << 10})
	if len(rows) != 2 || rows[0].ID != kids[0].ID || rows[1].ID != kids[2].ID || string(rows[0].Message.Payload) != "row 1" {
		t.Fatalf("claim at c = %v, want children %d and %d", rows, kids[0].ID, kids[2].ID)
	}
	// The claim reads a message stage's parent_id for its line.
	for _, r := range rows {
		if r.Message.ParentID != ids[0] {
			t.Errorf("claim at c read row %d's parent as %d, want %d", r.ID, r.Message.ParentID, ids[0])
		}
	}
	// A message no pass emitted has none; a move that claims reads it too.
	rows = claimRows(t, h, core.Cap{Stage: "b", N: 5, LineMax: 1 << 10})
	if len(rows) != 3 {
		t.Fatalf("claim at b = %v, want %d, %d and child %d", rows, ids[0], ids[1], kids[1].ID)
	}
	for _, r := range rows {
		if want := map[bool]int64{true: ids[0]}[r.ID == kids[1].ID]; r.Message.ParentID != want {
			t.Errorf("claim at b read row %d's parent as %d, want %d", r.ID, r.Message.ParentID, want)
		}
	}
	claiming := move(kids[1].ID, "b", "c")
	claiming.Claim, claiming.LineMax = true, 1<<10
	out := resolve(t, h, claiming)
	if o := out[0]; o.Status != core.StatusRunning || o.Message == nil || o.Message.ParentID != ids[0] {
		t.Errorf("the move that claims child %d at c = %+v, want it running with its message and parent %d", kids[1].ID, o, ids[0])
	}
}

func testEmitGuardMiss(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	// The stage moved its row itself, then answered a transition with emits:
	// the transition is not written, and neither are its children.
	h.Stage(t, ids[0], "a", "c", core.StatusRunning, time.Time{})
	h.Stage(t, ids[1], "a", "a", core.StatusDone, time.Time{})
	got := resolve(t, h,
		moveEmitting(ids[0], "a", "b", core.Emit{Stage: "b", Payload: []byte("x")}),
		moveEmitting(ids[1], "a", core.TargetDone, core.Emit{Stage: "b", Payload: []byte("y")}))
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "c", Status: core.StatusPending},
		{ID: ids[1], Stage: "a", Status: core.StatusDone},
	})
	for _, id := range ids {
		if m := show(t, h, id); m.Children != 0 {
			t.Errorf("show %d after a guard miss: %d children, want none", id, m.Children)
		}
	}
	if rows := claimRows(t, h, core.Cap{Stage: "b", N: 5}); len(rows) != 0 {
		t.Errorf("claim at b after guard misses = %v, want nothing: no child may exist", rows)
	}
}

func testEmitTargets(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	claimRows(t, h, core.Cap{Stage: "a", N: 3})
	paused := moveEmitting(ids[1], "a", core.TargetPaused, core.Emit{Stage: "c", Payload: []byte("p")})
	paused.Until = base.Add(time.Hour)
	claimed := moveEmitting(ids[2], "a", "b", core.Emit{Stage: "c", Payload: []byte("m")})
	claimed.Claim = true
	got := resolve(t, h, moveEmitting(ids[0], "a", core.TargetDone, core.Emit{Stage: "c", Payload: []byte("d")}), paused, claimed)
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "a", Status: core.StatusDone, Matched: true},
		{ID: ids[1], Stage: "a", Status: core.StatusPaused, Timeout: base.Add(time.Hour), Matched: true},
		{ID: ids[2], Stage: "b", Status: core.StatusRunning, Matched: true},
	})
	for i, id := range ids {
		kids := childrenAfter(t, h, id, ids[2], 6)
		want := []string{"d", "p", "m"}[i]
		if len(kids) != 1 || string(kids[0].Payload) != want || kids[0].Stage != "c" || core.RowStatus(kids[0].Status) != core.StatusPending {
			t.Errorf("children of %d = %d %v; want one pending at c with payload %q", id, len(kids), kids, want)
		}
	}
}

func testEmitDedup(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	known := insertIngress(t, h, store.IngressRow{Stage: "b", Payload: []byte("first"), Key: key("k1")})[0]
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	resolve(t, h, moveEmitting(ids[0], "a", core.TargetDone,
		core.Emit{Stage: "c", Payload: []byte("dup"), Key: "k1"},
		core.Emit{Stage: "c", Payload: []byte("new"), Key: "k2"},
		core.Emit{Stage: "c", Payload: []byte("twice"), Key: "k2"},
		core.Emit{Stage: "c", Payload: []byte("plain")}))
	kids := childrenAfter(t, h, ids[0], known, 8)
	if len(kids) != 2 || string(kids[0].Payload) != "new" || kids[0].DedupKey != "k2" || string(kids[1].Payload) != "plain" {
		texts := make([]string, len(kids))
		for i, k := range kids {
			texts[i] = childText(k)
		}
		t.Fatalf("children = %v; want k2's first (new) and the unkeyed one: a key in the queue, or given twice, inserts once", texts)
	}
	if m := show(t, h, known); string(m.Payload) != "first" || m.ParentID != 0 {
		t.Errorf("the key's first row became %s, want it untouched", childText(m))
	}
}

func testEmitResent(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	it := moveEmitting(ids[0], "a", "b", core.Emit{Stage: "c", Payload: []byte("once")})
	resolve(t, h, it)
	// Its reply was lost: the core sends it again. The row is pending at b
	// now, so the guard misses and nothing more is inserted.
	got := resolve(t, h, it)
	wantOutcomes(t, got, []core.Outcome{{ID: ids[0], Stage: "b", Status: core.StatusPending}})
	if m := show(t, h, ids[0]); m.Children != 1 {
		t.Errorf("show %d after the resolve was sent twice: %d children, want 1", ids[0], m.Children)
	}
}

// testKeyEmitted: an emitted message's order key goes through the insert's
// rules: behind an unfinished message of its key it waits blocked.
func testKeyEmitted(t *testing.T, h KeyedHarness) {
	head := h.InsertKeyed(t, "b", "k")
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	resolve(t, h, moveEmitting(ids[0], "a", core.TargetDone,
		core.Emit{Stage: "b", Payload: []byte("behind"), OrderKey: "k"},
		core.Emit{Stage: "b", Payload: []byte("alone"), OrderKey: "fresh"}))
	kids := childrenAfter(t, h, ids[0], ids[0], 4)
	if len(kids) != 2 {
		t.Fatalf("%d children, want 2", len(kids))
	}
	if kids[0].OrderKey != "k" || core.RowStatus(kids[0].Status) != core.StatusBlocked || kids[0].Head == nil || kids[0].Head.ID != head {
		t.Errorf("child of key k = %s head %+v; want blocked behind %d", childText(kids[0]), kids[0].Head, head)
	}
	if kids[1].OrderKey != "fresh" || core.RowStatus(kids[1].Status) != core.StatusPending {
		t.Errorf("child of a key of its own = %s; want pending", childText(kids[1]))
	}
}

// The children a resolve inserts are the dispatcher's own rows, visible to
// the claim that follows in its transaction: they are no producer
// mid-transaction, so the claim still reports ingress settled (else the
// claim floors would stop rising while stages emit, and every claim would
// walk the index entries of all the rows claimed since).
func testEmitSettled(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	evs := h.Exec(t.Context(), []core.Command{
		core.Resolve{Op: 1, Items: []core.Item{moveEmitting(ids[0], "a", core.TargetDone, core.Emit{Stage: "c", Payload: []byte("x")}, core.Emit{Stage: "c", Payload: []byte("y")})}},
		core.Claim{Op: 2, Caps: []core.Cap{{Stage: "c", N: 1}}},
	})
	if len(evs) != 2 {
		t.Fatalf("events %v, want a resolve's and a claim's", evs)
	}
	c, ok := evs[1].(core.Claimed)
	if !ok || c.Err != "" {
		t.Fatalf("claim after the resolve: %v", evs[1])
	}
	kids := childrenAfter(t, h, ids[0], ids[1], 4)
	if len(kids) != 2 || len(c.Rows) != 1 || c.Rows[0].ID != kids[0].ID {
		t.Fatalf("claim at c took %v; want the first of the children %v", c.Rows, kids)
	}
	if c.Settled != kids[1].ID {
		t.Errorf("claim in the transaction of a resolve that emitted reported settled=%d, want %d (the newest row, its own child)", c.Settled, kids[1].ID)
	}
}

// testEmitClaimed: an emit that claims (core.Emit.Claim) is inserted running
// at its stage and reported with its parent's outcome, read as a claim reads
// a row (its trace context with Traces); the others of the same pass are
// pending; a guard miss inserts none; the claim never takes a running child,
// and a reset makes one pending, as it does any row no one holds.
func testEmitClaimed(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	h.Stage(t, ids[1], "a", "a", core.StatusDone, time.Time{}) // its stage finished it: a guard miss
	got := exec(t, h, core.Resolve{Op: 42, Traces: true, Items: []core.Item{
		moveEmitting(ids[0], "a", core.TargetDone,
			core.Emit{Stage: "b", Payload: []byte("one"), Claim: true},
			core.Emit{Stage: "c", Payload: []byte("two")},
			core.Emit{Stage: "b", Payload: []byte("three"), Claim: true},
			// A keyed child never claims: it may have to wait behind its key.
			core.Emit{Stage: "b", Payload: []byte("four"), OrderKey: "k", Claim: true}),
		moveEmitting(ids[1], "a", "b", core.Emit{Stage: "c", Payload: []byte("x"), Claim: true}),
	}}, func(e core.Resolved) (int64, string) { return e.Op, e.Err }).Outcomes
	kids := childrenAfter(t, h, ids[0], ids[1], 8)
	if len(kids) != 4 {
		t.Fatalf("children of %d: %d, want 4", ids[0], len(kids))
	}
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "a", Status: core.StatusDone, Matched: true,
			Children: []core.Child{{ID: kids[0].ID, Stage: "b"}, {ID: kids[2].ID, Stage: "b"}}},
		{ID: ids[1], Stage: "a", Status: core.StatusDone},
	})
	for i, want := range []core.RowStatus{core.StatusRunning, core.StatusPending, core.StatusRunning, core.StatusPending} {
		if k := kids[i]; core.RowStatus(k.Status) != want || k.ParentID != ids[0] {
			t.Errorf("child %d = %s, want %s with parent %d", i, childText(k), want, ids[0])
		}
	}
	for _, ch := range got[0].Children {
		m := show(t, h, ch.ID)
		if ch.Trace.Message == "" || ch.Trace.Message != m.TraceParent || len(ch.Trace.Pass) != 55 || ch.Trace.Pass[3:35] != m.TraceParent[3:35] {
			t.Errorf("child %d read with trace %+v; want its traceparent %q and a pass of that trace", ch.ID, ch.Trace, m.TraceParent)
		}
	}
	if m := show(t, h, ids[1]); m.Children != 0 {
		t.Errorf("show %d after a guard miss: %d children, want none", ids[1], m.Children)
	}
	// Running, the claim leaves them; the pending one it takes.
	if rows := claimRows(t, h, core.Cap{Stage: "b", N: 5}); len(rows) != 1 || rows[0].ID != kids[3].ID {
		t.Errorf("claim at b = %v, want the keyed child %d only: the others are running, the dispatcher's already", rows, kids[3].ID)
	}
	if rows := claimRows(t, h, core.Cap{Stage: "c", N: 5}); len(rows) != 1 || rows[0].ID != kids[1].ID {
		t.Errorf("claim at c = %v, want child %d", rows, kids[1].ID)
	}
	// Held, the first is resolved as any claimed row; the other, held by no
	// one after a lost reply, is made pending by the reset.
	wantOutcomes(t, resolve(t, h, move(kids[0].ID, "b", core.TargetDone)), []core.Outcome{
		{ID: kids[0].ID, Stage: "b", Status: core.StatusDone, Matched: true},
	})
	resetOrphans(t, h, kids[1].ID)
	if m := show(t, h, kids[2].ID); core.RowStatus(m.Status) != core.StatusPending || m.Stage != "b" {
		t.Errorf("child %d after a reset that keeps only %d: %s at %s, want pending at b", kids[2].ID, kids[1].ID, m.Status, m.Stage)
	}
}

// testKeyEmittedBusy: a move whose child's order key a producer in flight
// holds the lock of writes nothing of itself (core.Outcome.KeyBusy: its row
// running at its stage, no child, no history), where waiting for that
// producer would hold the dispatcher's transaction; the resolve's other
// items are written, a keyed child of a free key among them. Sent again
// once the producer committed, the move is written with its child, blocked
// behind the producer's message of its key.
func testKeyEmittedBusy(t *testing.T, h KeyedHarness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	late, commit := h.BeginInsertKeyed(t, "b", "k")
	at := base.Add(time.Second)
	busy := pass(moveEmitting(ids[0], "a", core.TargetDone,
		core.Emit{Stage: "b", Payload: []byte("free")},
		core.Emit{Stage: "b", Payload: []byte("held"), OrderKey: "k"}), core.HistoryDone, 101, base, at, 0)
	free := pass(moveEmitting(ids[1], "a", "b", core.Emit{Stage: "c", Payload: []byte("other"), OrderKey: "other"}), core.HistoryMoved, 101, base, at, 0)
	wantOutcomes(t, resolve(t, h, busy, free), []core.Outcome{
		{ID: ids[0], Stage: "a", Status: core.StatusRunning, KeyBusy: true},
		{ID: ids[1], Stage: "b", Status: core.StatusPending, Matched: true},
	})
	if kids := childrenAfter(t, h, ids[0], ids[1], 8); len(kids) != 0 {
		t.Errorf("children of the move whose child's key is held: %d, want none", len(kids))
	}
	if kids := childrenAfter(t, h, ids[1], ids[1], 8); len(kids) != 1 || kids[0].OrderKey != "other" || core.RowStatus(kids[0].Status) != core.StatusPending {
		t.Errorf("children of the other move: %v, want its child of key other, pending", kids)
	}
	wantHistory(t, h, ids[0], "")
	commit()
	wantOutcomes(t, resolve(t, h, busy), []core.Outcome{{ID: ids[0], Stage: "a", Status: core.StatusDone, Matched: true}})
	kids := childrenAfter(t, h, ids[0], ids[1], 8)
	if len(kids) != 2 || string(kids[0].Payload) != "free" || string(kids[1].Payload) != "held" {
		t.Fatalf("children after the producer committed: %d, want free and held, in order", len(kids))
	}
	if core.RowStatus(kids[1].Status) != core.StatusBlocked || kids[1].Head == nil || kids[1].Head.ID != late {
		t.Errorf("child of key k = %s head %+v; want blocked behind the producer's %d", childText(kids[1]), kids[1].Head, late)
	}
	wantHistory(t, h, ids[0], "done@a")
}

// testKeyEmittedBusyRefusedState: a move whose child's order key a
// producer in flight holds writes nothing of its row (KeyBusy), so a row
// whose state the queue would refuse to write again is not written either:
// the transaction is not refused, the move comes back KeyBusy and the
// resolve's other item is written.
func testKeyEmittedBusyRefusedState(t *testing.T, h KeyedHarness) {
	held := h.InsertMessage(t, "a", `{"forbidden":1}`, nil)
	other := h.Insert(t, "a", 1)[0]
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	h.RefuseStateKey(t, "forbidden")
	_, commit := h.BeginInsertKeyed(t, "b", "k")
	defer commit()
	wantOutcomes(t, resolve(t, h,
		moveEmitting(held, "a", core.TargetDone, core.Emit{Stage: "b", Payload: []byte("held"), OrderKey: "k"}),
		move(other, "a", core.TargetDone)), []core.Outcome{
		{ID: held, Stage: "a", Status: core.StatusRunning, KeyBusy: true},
		{ID: other, Stage: "a", Status: core.StatusDone, Matched: true},
	})
}

// testKeyEmittedQueued: a Resolve with QueueKeys (a try that queues for its
// children's order-key locks, sent alone) whose key a producer in flight
// holds writes nothing and answers every item KeyBusy (on PostgreSQL once
// its short lock wait ran out); once the producer committed it writes the
// moves and their children in order.
func testKeyEmittedQueued(t *testing.T, h KeyedHarness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	late, commit := h.BeginInsertKeyed(t, "b", "k")
	r := core.Resolve{Op: 42, QueueKeys: true, Items: []core.Item{
		moveEmitting(ids[0], "a", core.TargetDone, core.Emit{Stage: "b", Payload: []byte("first"), OrderKey: "k"}),
		moveEmitting(ids[1], "a", core.TargetDone, core.Emit{Stage: "b", Payload: []byte("second"), OrderKey: "k"}),
	}}
	done := func(e core.Resolved) (int64, string) { return e.Op, e.Err }
	wantOutcomes(t, exec(t, h, r, done).Outcomes, []core.Outcome{
		{ID: ids[0], Stage: "a", Status: core.StatusRunning, KeyBusy: true},
		{ID: ids[1], Stage: "a", Status: core.StatusRunning, KeyBusy: true},
	})
	if kids := childrenAfter(t, h, ids[0], ids[1], 8); len(kids) != 0 {
		t.Errorf("children while k's producer is in flight: %d, want none", len(kids))
	}
	commit()
	wantOutcomes(t, exec(t, h, r, done).Outcomes, []core.Outcome{
		{ID: ids[0], Stage: "a", Status: core.StatusDone, Matched: true},
		{ID: ids[1], Stage: "a", Status: core.StatusDone, Matched: true},
	})
	first, second := childrenAfter(t, h, ids[0], ids[1], 8), childrenAfter(t, h, ids[1], ids[1], 8)
	if len(first) != 1 || len(second) != 1 || first[0].ID > second[0].ID {
		t.Fatalf("children %v and %v, want one each, the first pass's first", first, second)
	}
	if core.RowStatus(first[0].Status) != core.StatusBlocked || first[0].Head == nil || first[0].Head.ID != late {
		t.Errorf("first child = %s head %+v; want blocked behind the producer's %d", childText(first[0]), first[0].Head, late)
	}
}
