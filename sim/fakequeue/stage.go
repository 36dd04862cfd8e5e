package fakequeue

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The statements of the stage library, as store's stage.go states them. The
// fake has no transactions: StageLock only reads what it would lock, and a
// row's version is a count of its changes (PostgreSQL's xmin is a
// transaction id; all either promises is that every write changes it).

// StageRead reads the rows of ids, in id order; an id with no row has none.
func (q *Queue) StageRead(_ context.Context, ids []int64) ([]store.StageRow, error) {
	var out []store.StageRow
	for _, id := range ids {
		r := q.row(id)
		if r == nil {
			continue
		}
		x := store.StageRow{ID: id, Stage: r.Stage, Status: r.Status, State: []byte(r.StateJSON()), Attempts: r.Attempts, OrderKey: r.Key,
			Version: q.versions[id], TraceParent: q.passTrace(r)}
		if r.HasPayload {
			x.Payload = []byte(r.Payload)
		}
		out = append(out, x)
	}
	return out, nil
}

// StageLock reads the row's stage, status and version, or returns an error
// wrapping store.ErrNotFound.
func (q *Queue) StageLock(_ context.Context, id int64) (store.StageLocked, error) {
	r := q.row(id)
	if r == nil {
		return store.StageLocked{}, fmt.Errorf("lock message: %w", store.ErrNotFound)
	}
	return store.StageLocked{Stage: r.Stage, Status: r.Status, Version: q.versions[id]}, nil
}

// StageTransition writes p's transition if the row is still running at
// p.From (and at p.Version, if given), as a stage's asynchronous commit (a
// Crash before the next Exec loses it). The new state replaces the old one
// whole, its dispatch_error (a string) included.
func (q *Queue) StageTransition(_ context.Context, p store.StageTransitionParams) (bool, error) {
	state := map[string]json.RawMessage{}
	if err := json.Unmarshal(p.State, &state); err != nil {
		return false, fmt.Errorf("write transition: state: %w", err)
	}
	var dispatchError string
	if err := json.Unmarshal(state["dispatch_error"], &dispatchError); err == nil {
		delete(state, "dispatch_error")
	}
	rest := ""
	if len(state) > 0 {
		b, err := json.Marshal(state)
		if err != nil {
			return false, fmt.Errorf("write transition: state: %w", err)
		}
		rest = string(b)
	}
	var timeout time.Time
	if p.Timeout != nil {
		timeout = *p.Timeout
	}
	return q.stageWrite(p.ID, p.From, p.Version, func(r *Row) {
		if p.Stage != r.Stage {
			r.Attempts = 0 // the library's move sets them to 0 (stageTransitionSQL)
		}
		r.Stage, r.Status, r.Timeout, r.State, r.DispatchError = p.Stage, p.Status, timeout, rest, dispatchError
	}), nil
}

// StageWrite changes a row the way a stage program does, guarded by status
// 'running' and stage from: advance (to != from, status "running"), or finish /
// pause (status "done", "failed" or "paused" with timeout). It keeps the
// row's state and attempts (a program in any language writes only what the
// protocol asks of it) and reports whether the guard matched. The write is
// asynchronous: a Crash before the next Exec loses it.
func (q *Queue) StageWrite(id int64, from, to string, status core.RowStatus, timeout time.Time) bool {
	return q.stageWrite(id, from, nil, func(r *Row) {
		r.Stage, r.Status, r.Timeout = to, status, time.Time{}
		if status == core.StatusPaused {
			r.Timeout = timeout
		}
	})
}

// stageWrite applies set to row id if it is running at stage from (and at
// version, if not nil), as a stage's asynchronous commit, and reports whether
// it did.
func (q *Queue) stageWrite(id int64, from string, version *uint32, set func(r *Row)) bool {
	r := q.row(id)
	if r == nil || r.Status != core.StatusRunning || r.Stage != from || version != nil && *version != q.versions[id] {
		return false
	}
	before := *r
	q.undo = append(q.undo, before)
	set(r) // attempts as they were: the queue has no trigger that sets them to 0 (schema 27)
	q.observe(ByStage, before, r)
	return true
}
