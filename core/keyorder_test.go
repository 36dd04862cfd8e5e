package core_test

import (
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Proves: the children a stage emits into one order key are inserted in
// the order of the passes that emitted them, even when the first pass
// waited for a producer's lock of that key: a later pass of the same key
// does not overtake it once the producer commits (its children would be
// the key's older messages, and go first).
func TestAWaitingPassIsNotOvertakenByALaterPassOfItsChildsOrderKey(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 2)
	late, _ := w.q.ReserveKeyed("k")
	w.emit(1, `+{"stage":"b","payload":"child of 1","order_key":"k"}`)
	answerMove(w, 1, "0 >done")
	for _, d := range []time.Duration{10, 30, 70, 150, 310} { // its pause grows to 320 ms
		w.tick(d * time.Millisecond)
	}
	w.q.Commit(late, "c")
	w.emit(1, `+{"stage":"b","payload":"child of 2","order_key":"k"}`)
	answerMove(w, 1, "0 >done")
	for range 100 {
		w.tick(w.now.Sub(epoch) + core.LookEvery)
	}
	w.wantRow(1, "a", core.StatusDone)
	w.wantRow(2, "a", core.StatusDone)
	w.wantChildrenInPassOrder()
}

// Proves: the same when the later pass is answered while the earlier one's
// resolve is out: the earlier, found waiting, is owed again ahead of it,
// and the later waits with it, though the producer commits before the
// next transaction.
func TestAWaitingPassIsNotOvertakenByAPassAnsweredWhileItsResolveWasOut(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 2)
	late, _ := w.q.ReserveKeyed("k")
	w.deferTxns = true
	w.emit(1, `+{"stage":"b","payload":"child of 1","order_key":"k"}`)
	answerMove(w, 1, "0 >done")
	w.emit(1, `+{"stage":"b","payload":"child of 2","order_key":"k"}`)
	answerMove(w, 1, "0 >done")
	w.reply(0) // message 1: KeyBusy
	w.q.Commit(late, "c")
	w.deferTxns = false
	w.drain()
	for range 100 {
		w.tick(w.now.Sub(epoch) + core.LookEvery)
	}
	w.wantRow(1, "a", core.StatusDone)
	w.wantRow(2, "a", core.StatusDone)
	w.wantChildrenInPassOrder()
}

// wantChildrenInPassOrder fails the test unless message 1's child was
// inserted, and so comes in its key, before message 2's.
func (w *world) wantChildrenInPassOrder() {
	w.t.Helper()
	var of1, of2 int64
	for _, r := range w.q.Rows() {
		switch r.ParentID {
		case 1:
			of1 = r.ID
		case 2:
			of2 = r.ID
		}
	}
	if of1 == 0 || of2 == 0 || of1 > of2 {
		w.t.Errorf("child of message 1 is row %d, child of message 2 row %d: the key's later pass's child was inserted first", of1, of2)
	}
}
