package queuetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// refusedTests are the conformance tests of a transaction the database
// refuses for the data itself (an operator's own constraint): the store
// narrows it down to the message whose outcome is refused and writes that
// message's failure (core.RefusedFallback) with the rest, or, when the
// failure is refused too, fails the whole transaction as before.
var refusedTests = []conformanceTest{
	{"AMoveTheDatabaseRefusesFailsAloneAndTheRestIsWritten", testRefusedMoveFailsAlone},
	{"ATransactionWhoseFailureTooIsRefusedFailsWhole", testRefusedWhole},
}

func testRefusedMoveFailsAlone(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 4)
	claimRows(t, h, core.Cap{Stage: "a", N: 4})
	h.RefuseStateKey(t, "forbidden")
	refused := pass(move(ids[0], "a", "b"), core.HistoryMoved, 7, base, base.Add(time.Second), 0)
	refused.Patch = `{"forbidden":1}`
	allowed := move(ids[2], "a", "b")
	allowed.Patch = `{"ok":1}`
	also := move(ids[3], "a", core.TargetDone) // refused too: each is narrowed down to alone
	also.Patch = `{"forbidden":2}`
	res := core.Resolve{Op: 1, Items: []core.Item{refused, move(ids[1], "a", core.TargetDone), allowed, also}}
	keep, _ := upkeepFor(res) // the day the refused pass's history goes to
	evs := h.Exec(context.Background(), []core.Command{keep, res, core.Claim{Op: 2, Caps: []core.Cap{{Stage: "b", N: 5}}}})
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3", len(evs))
	}
	evs = evs[1:]
	resolved, ok := evs[0].(core.Resolved)
	if !ok || resolved.Err != "" || len(resolved.Outcomes) != 4 {
		t.Fatalf("resolve: %+v; want four outcomes and no error", evs[0])
	}
	o := resolved.Outcomes[0]
	if o.Refused == "" || o.Status != core.StatusFailed || o.Stage != "a" || !o.Matched || !strings.Contains(o.Error, "refused the write of this message's outcome") {
		t.Errorf("refused move's outcome %+v; want Refused set, failed at a (matched) with a reason saying the database refused it", o)
	}
	if o := resolved.Outcomes[1]; o.Refused != "" || o.Status != core.StatusDone {
		t.Errorf("second item's outcome %+v; want done, not refused", o)
	}
	if o := resolved.Outcomes[2]; o.Refused != "" || o.Status != core.StatusPending || o.Stage != "b" {
		t.Errorf("third item's outcome %+v; want pending at b, not refused", o)
	}
	if o := resolved.Outcomes[3]; o.Refused == "" || o.Status != core.StatusFailed {
		t.Errorf("fourth item's outcome %+v; want Refused set and failed", o)
	}
	wantRow(t, h, ids[0], "a", core.StatusFailed)
	wantRow(t, h, ids[3], "a", core.StatusFailed)
	if st := h.State(t, ids[0]); st["forbidden"] != nil {
		t.Errorf("refused row's state %v: the refused patch was written", st)
	}
	if st := h.State(t, ids[2]); st["ok"] == nil {
		t.Errorf("third row's state %v: its patch was not written", st)
	}
	claimed, ok := evs[1].(core.Claimed)
	if !ok || claimed.Err != "" || len(claimed.Rows) != 1 || claimed.Rows[0].ID != ids[2] {
		t.Errorf("claim after the narrowed resolve: %+v; want row %d", evs[1], ids[2])
	}
	rows := history(t, h, ids[0])
	if len(rows) != 1 || rows[0].Event != core.HistoryFailed || !strings.Contains(rows[0].Detail, "refused") || rows[0].WorkerPID != 7 {
		t.Errorf("history of the refused move %+v; want one failed row with the refusal as its detail, worker 7", rows)
	}
}

func testRefusedWhole(t *testing.T, h Harness) {
	held := h.InsertMessage(t, "a", `{"forbidden":1}`, nil)
	other := h.Insert(t, "a", 1)[0]
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	h.RefuseStateKey(t, "forbidden")
	evs := h.Exec(context.Background(), []core.Command{
		core.Resolve{Op: 1, Items: []core.Item{move(held, "a", core.TargetDone), move(other, "a", core.TargetDone)}},
	})
	res, ok := evs[0].(core.Resolved)
	if !ok || res.Err == "" || !res.Aborted {
		t.Fatalf("resolve: %+v; want the whole transaction failed and aborted (the message's failure is refused too)", evs[0])
	}
	wantRow(t, h, held, "a", core.StatusRunning)
	wantRow(t, h, other, "a", core.StatusRunning)
}
