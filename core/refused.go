package core

import (
	"fmt"
	"strings"
)

// refusedReasonMax bounds the server's error text a refused item's failure
// carries as its reason.
const refusedReasonMax = 1000

// RefusedFallback is what the dispatcher writes instead of it when the
// database refuses the write of its outcome for the data itself (a constraint
// or a trigger of the operator's own on pepsi.queue or pepsi.history, SQLSTATE
// class 22, 23 or 54: every try would fail the same way), err being the
// server's error: the message fails at its stage, with a reason that says
// so, and its transition, patch and emits are dropped. The store applies it
// to that item alone, after the transaction's other writes were taken
// (store.Queue.Exec), and reports its outcome with Outcome.Refused; if the
// database refuses the failure too, nothing is narrowed and the whole
// transaction fails as it did, holding the pipeline until what refuses it is
// removed (docs/operations.md, "A write the database refuses").
//
// The same guard holds as for any failure: a row its stage moved on or
// finished meanwhile is requeued or left as it is.
func RefusedFallback(it Item, err string) Item {
	return Item{
		ID: it.ID, Stage: it.Stage, Key: it.Key, Verdict: Fail,
		Reason:  StorableText(clip(refusedPrefix(it.Stage)+err+")", refusedReasonMax)),
		History: it.History, Event: HistoryFailed,
		HandedAt: it.HandedAt, At: it.At, PID: it.PID, Attempts: it.Attempts, Again: it.Again,
	}
}

// refusedPrefix begins the reason of a refused outcome's failure at stage.
func refusedPrefix(stage string) string {
	return fmt.Sprintf("stage %s: the database refused the write of this message's outcome (", stage)
}

// refusedBefore is the refusal a send of it whose reply was lost wrote in
// its place, when o, the row as this send of it found it, is that
// failure (failed at it's stage, with a reason RefusedFallback gives, cut
// at refusedReasonMax or not): the send that wrote it counted nothing, so
// this one counts it. "" when o is not. Nothing but a RefusedFallback
// writes such a reason while the core holds the row.
func refusedBefore(it Item, o Outcome) string {
	prefix := refusedPrefix(it.Stage)
	if o.Status != StatusFailed || o.Stage != it.Stage || !strings.HasPrefix(o.Error, prefix) || len(o.Error) == len(prefix) {
		return ""
	}
	return strings.TrimSuffix(strings.TrimPrefix(o.Error, prefix), ")")
}
