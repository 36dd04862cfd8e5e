package queuetest

import (
	"errors"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The stage library's statements: the batched row read, the row lock and the
// guarded transition.

// stageTests are the conformance tests of StageRead, StageLock and
// StageTransition.
var stageTests = []conformanceTest{
	{"StageReadReadsTheRowsAskedForAndSkipsMissingOnes", testStageRead},
	{"StageLockReadsTheVersionEveryWriteChanges", testStageLock},
	{"StageTransitionWritesOnlyARowRunningAtItsStageAndVersion", testStageTransitionGuard},
	{"StageTransitionReplacesTheStateAndResetsAttemptsOnAMove", testStageTransitionWrites},
}

// stageRead reads the rows of ids by id.
func stageRead(t *testing.T, h Harness, ids ...int64) map[int64]store.StageRow {
	t.Helper()
	rows, err := h.StageRead(t.Context(), ids)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]store.StageRow{}
	for _, r := range rows {
		out[r.ID] = r
	}
	if len(out) != len(rows) {
		t.Fatalf("StageRead(%v) read a row twice: %v", ids, rows)
	}
	return out
}

func testStageRead(t *testing.T, h Harness) {
	msg := h.InsertMessage(t, "a", `{"k": 1}`, []byte("hello"))
	bare := h.Insert(t, "a", 1)[0]
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	got := stageRead(t, h, msg, bare, 12345)
	if len(got) != 2 {
		t.Fatalf("StageRead of two rows and a missing id read %v, want the two rows", got)
	}
	if r := got[msg]; r.Stage != "a" || r.Status != core.StatusRunning || compact(t, r.State) != `{"k":1}` ||
		string(r.Payload) != "hello" || r.Attempts != 0 {
		t.Errorf("StageRead(%d) = %+v, want a:running, state {\"k\":1}, payload hello, attempts 0", msg, r)
	}
	if r := got[bare]; r.Stage != "a" || r.Status != core.StatusPending || compact(t, r.State) != `{}` || r.Payload != nil {
		t.Errorf("StageRead(%d) = %+v, want a:pending, state {}, no payload", bare, r)
	}
}

func testStageLock(t *testing.T, h Harness) {
	id := h.Insert(t, "a", 1)[0]
	read := stageRead(t, h, id)[id]
	l, err := h.StageLock(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if l != (store.StageLocked{Stage: "a", Status: core.StatusPending, Version: read.Version}) {
		t.Errorf("StageLock(%d) = %+v, want a:pending at the version StageRead read, %d", id, l, read.Version)
	}
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	if l, err := h.StageLock(t.Context(), id); err != nil || l.Status != core.StatusRunning || l.Version == read.Version {
		t.Errorf("StageLock(%d) after a claim = %+v, %v; want running at a version other than %d", id, l, err, read.Version)
	}
	if _, err := h.StageLock(t.Context(), 12345); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("StageLock of a missing row: err = %v, want store.ErrNotFound", err)
	}
}

// transition moves row id from stage from to stage to, running, with state
// {} and version, and says whether it moved it.
func transition(t *testing.T, h Harness, id int64, from, to string, version *uint32) bool {
	t.Helper()
	moved, err := h.StageTransition(t.Context(), store.StageTransitionParams{
		ID: id, From: from, Stage: to, Status: core.StatusRunning, State: []byte(`{}`), Version: version})
	if err != nil {
		t.Fatal(err)
	}
	return moved
}

func testStageTransitionGuard(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	old := stageRead(t, h, ids[0])[ids[0]].Version
	if transition(t, h, ids[0], "a", "b", nil) {
		t.Errorf("a transition of pending row %d moved it", ids[0])
	}
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	if transition(t, h, ids[0], "x", "b", nil) {
		t.Errorf("a transition from stage x moved row %d, running at a", ids[0])
	}
	if transition(t, h, ids[0], "a", "b", &old) {
		t.Errorf("a transition at the version before the claim moved row %d", ids[0])
	}
	wantRow(t, h, ids[0], "a", core.StatusRunning)
	now := stageRead(t, h, ids[0])[ids[0]].Version
	if !transition(t, h, ids[0], "a", "b", &now) {
		t.Errorf("a transition at the row's version did not move row %d", ids[0])
	}
	wantRow(t, h, ids[0], "b", core.StatusRunning)
	if !transition(t, h, ids[1], "a", "b", nil) {
		t.Errorf("a transition with no version did not move row %d, running at a", ids[1])
	}
	wantRow(t, h, ids[1], "b", core.StatusRunning)
}

func testStageTransitionWrites(t *testing.T, h Harness) {
	id := h.InsertMessage(t, "a", `{"k": 1}`, nil)
	retryOnce(t, h, id, "a", 0, base, "busy")
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	until := base.Add(time.Hour)
	write := func(to string, status core.RowStatus, timeout *time.Time, state string) {
		t.Helper()
		moved, err := h.StageTransition(t.Context(), store.StageTransitionParams{
			ID: id, From: "a", Stage: to, Status: status, Timeout: timeout, State: []byte(state)})
		if err != nil || !moved {
			t.Fatalf("StageTransition(%d to %s:%s) = %v, %v; want it moved", id, to, status, moved, err)
		}
	}
	write("a", core.StatusPaused, &until, `{"k": 2, "dispatch_error": "set by the stage"}`)
	wantRowError(t, h, id, "a", core.StatusPaused, "set by the stage")
	if _, _, timeout, _, _ := h.Row(t, id); !timeout.Equal(until) {
		t.Errorf("row %d: timeout %v, want %v", id, timeout, until)
	}
	if r := stageRead(t, h, id)[id]; r.Attempts != 1 || compact(t, r.State) != `{"dispatch_error":"set by the stage","k":2}` {
		t.Errorf("row %d paused at its stage: attempts %d, state %s; want 1 and the state written", id, r.Attempts, r.State)
	}
	wakeAt(t, h, until)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	write("b", core.StatusRunning, nil, `{}`)
	wantRowError(t, h, id, "b", core.StatusRunning, "")
	if r := stageRead(t, h, id)[id]; r.Attempts != 0 || compact(t, r.State) != `{}` {
		t.Errorf("row %d moved to b: attempts %d, state %s; want 0 and {} (the state replaced whole)", id, r.Attempts, r.State)
	}
}
