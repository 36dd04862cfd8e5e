package core_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Proves: a pass whose outcome the database refuses for the data itself (an
// operator's own constraint on state) costs only its message. The store
// writes the message's failure in its place (core.RefusedFallback, its
// Outcome.Refused set), and the core logs it, counts it failed, drops its
// emits and releases its order key, so the key's next message goes on; the
// other messages of the transaction are written as answered.
func TestAnOutcomeTheDatabaseRefusesFailsOnlyItsMessageAndReleasesItsKey(t *testing.T) {
	w := newWorld(t, threeStages)
	w.q.RefuseStateKey("forbidden")
	k := w.insertKeyed("a", "k", "k")
	plain := w.q.Insert("a", 1)[0]
	w.step(core.Start{})
	if h := w.head(1); h != k[0] {
		t.Fatalf("worker 1's head is %d, want the key's oldest, %d", h, k[0])
	}
	w.emit(1, `+{"stage":"c","payload":"child"}`)
	w.answer(1, "", "", `0 >b {"forbidden":1}`)
	r := w.row(k[0])
	if r.Status != core.StatusFailed || r.Stage != "a" || !strings.Contains(r.DispatchError, "refused the write of this message's outcome") {
		t.Errorf("refused message: %s at %s (%q); want failed at a with a reason saying the database refused its outcome", r.Status, r.Stage, r.DispatchError)
	}
	if c := w.childrenOf(k[0]); len(c) != 0 {
		t.Errorf("the refused pass's emits were inserted: %v", c)
	}
	// Its key is released: the key's next message is handed.
	if r := w.row(k[1]); r.Status != core.StatusRunning {
		t.Errorf("the key's next message is %s; want running (handed once the refused head failed)", r.Status)
	}
	head := w.head(1)
	if head != plain {
		t.Fatalf("worker 1's next head is %d, want %d", head, plain)
	}
	w.answer(1, "", "", `0 >b {"fine":1}`)
	if r := w.row(plain); r.Stage != "b" {
		t.Errorf("the other message is %s at %s; want it moved to b", r.Status, r.Stage)
	}
	flushAll(w)
	st, _, _, _ := w.q.Stats()
	failed, dropped := st["a"].Failed, st["a"].EmitsDropped
	if failed != 1 || dropped != 1 {
		t.Errorf("stage a's statistics: %d failed, %d emits dropped; want 1 and 1 (the refused message and its emit)", failed, dropped)
	}
}

// Proves: when the reply of the transaction that wrote a refused outcome's
// failure is lost, the send again (Again) finds the row failed with that
// failure's reason and counts it, once, as the first send would have.
func TestARefusedOutcomeWhoseReplyWasLostIsCountedOnce(t *testing.T) {
	w := newWorld(t, threeStages)
	w.q.RefuseStateKey("forbidden")
	id := w.q.Insert("a", 1)[0]
	w.step(core.Start{})
	w.emit(1, `+{"stage":"c","payload":"child"}`)
	w.loseReplies = true
	w.answer(1, "", "", `0 >b {"forbidden":1}`)
	w.loseReplies = false
	w.at(time.Second)
	w.step(core.DatabaseUp{})
	if r := w.row(id); r.Status != core.StatusFailed || !strings.Contains(r.DispatchError, "refused the write") {
		t.Fatalf("row %+v; want failed by the refusal", r)
	}
	flushAll(w)
	st, _, _, _ := w.q.Stats()
	failed, dropped := st["a"].Failed, st["a"].EmitsDropped
	if failed != 1 || dropped != 1 {
		t.Errorf("stage a's statistics: %d failed, %d emits dropped; want 1 and 1", failed, dropped)
	}
}
