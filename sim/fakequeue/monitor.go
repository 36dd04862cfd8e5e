package fakequeue

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The reads of pepsi-httpd, as store's monitor.go states them, on the
// fake's Clock.

// depths counts the rows in status per stage, in stage order, filling each
// with fill (nil for none) from its rows.
func (q *Queue) depths(status core.RowStatus, fill func(d *store.StageDepth, r *Row)) []store.StageDepth {
	by := map[string]*store.StageDepth{}
	for _, r := range q.rows {
		if r == nil || r.Status != status {
			continue
		}
		d := by[r.Stage]
		if d == nil {
			d = &store.StageDepth{Stage: r.Stage, Status: status}
			by[r.Stage] = d
		}
		d.Count++
		if fill != nil {
			fill(d, r)
		}
	}
	out := make([]store.StageDepth, 0, len(by))
	for _, d := range by {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b store.StageDepth) int { return cmp.Compare(a.Stage, b.Stage) })
	return out
}

// MonitorPending reads each stage's pending rows and the wait of its head
// (its lowest id) since its last change.
func (q *Queue) MonitorPending(context.Context) ([]store.StageDepth, error) {
	now := q.now()
	return q.depths(core.StatusPending, func(d *store.StageDepth, r *Row) {
		if d.Count == 1 { // rows go in id order: the first is the head
			d.OldestWait = max(now.Sub(q.updated[r.ID]), 0)
		}
	}), nil
}

// MonitorBlocked reads each stage's blocked rows.
func (q *Queue) MonitorBlocked(context.Context) ([]store.StageDepth, error) {
	return q.depths(core.StatusBlocked, nil), nil
}

// MonitorRunning reads each stage's running rows.
func (q *Queue) MonitorRunning(context.Context) ([]store.StageDepth, error) {
	return q.depths(core.StatusRunning, nil), nil
}

// MonitorPaused reads each stage's paused rows, those due (a row with no
// timeout never is) and those waiting out a retry.
func (q *Queue) MonitorPaused(context.Context) ([]store.StageDepth, error) {
	now := q.now()
	return q.depths(core.StatusPaused, func(d *store.StageDepth, r *Row) {
		if !r.Timeout.IsZero() && !r.Timeout.After(now) {
			d.Due++
		}
		if r.Attempts > 0 {
			d.RetryWaiting++
		}
	}), nil
}

// MonitorFailed reads each stage's failed and timed-out rows.
func (q *Queue) MonitorFailed(context.Context) ([]store.StageDepth, error) {
	out := append(q.depths(core.StatusFailed, nil), q.depths(core.StatusTimeout, nil)...)
	slices.SortStableFunc(out, func(a, b store.StageDepth) int { return cmp.Compare(a.Stage, b.Stage) })
	return out, nil
}

// MonitorFailures reads the latest store.FailuresMax failed or timed-out
// rows, newest (by updated_at) first, and who gave each its reason.
func (q *Queue) MonitorFailures(context.Context) ([]store.Failure, error) {
	var out []store.Failure
	for _, r := range q.rows {
		if r == nil || r.Status != core.StatusFailed && r.Status != core.StatusTimeout {
			continue
		}
		f := store.Failure{ID: r.ID, Stage: r.Stage, Status: r.Status, UpdatedAt: q.updated[r.ID]}
		f.By, f.Reason = failedBy(r)
		out = append(out, f)
	}
	slices.SortStableFunc(out, func(a, b store.Failure) int { return b.UpdatedAt.Compare(a.UpdatedAt) })
	return out[:min(len(out), store.FailuresMax)], nil
}

// failedBy is who gave r its reason, "dispatcher" (state.dispatch_error),
// "stage" (state.error) or "", and the reason cut to store.ReasonMax
// characters.
func failedBy(r *Row) (by, reason string) {
	if r.DispatchError != "" {
		by, reason = "dispatcher", r.DispatchError
	} else if text, ok := stageError(r.State); ok {
		by, reason = "stage", text
	}
	if runes := []rune(reason); len(runes) > store.ReasonMax {
		reason = string(runes[:store.ReasonMax])
	}
	return by, reason
}

// ReadPageMessage reads row id as pepsi-httpd's message page shows it, or
// returns store.ErrNotFound.
func (q *Queue) ReadPageMessage(_ context.Context, id int64) (store.PageMessage, error) {
	r := q.row(id)
	if r == nil {
		return store.PageMessage{}, store.ErrNotFound
	}
	m := store.PageMessage{ID: id, Stage: r.Stage, Status: r.Status, Attempts: r.Attempts,
		CreatedAt: q.created[id], UpdatedAt: q.updated[id], OrderKey: r.Key, Head: q.head(r)}
	if r.Status == core.StatusPaused && !r.Timeout.IsZero() {
		t := r.Timeout
		m.Timeout = &t
	}
	m.By, m.Reason = failedBy(r)
	m.ParentID = r.ParentID
	for _, c := range q.rows { // by id: oldest first
		if c != nil && c.ParentID == id {
			m.Children++
			if len(m.FirstChildren) < store.ChildrenMax {
				m.FirstChildren = append(m.FirstChildren, c.ID)
			}
		}
	}
	return m, nil
}

// stageError is state.error as text (state->>'error'), and whether state
// has the key.
func stageError(state string) (string, bool) {
	var m map[string]json.RawMessage
	if state == "" || json.Unmarshal([]byte(state), &m) != nil || m["error"] == nil {
		return "", false
	}
	var s string
	if json.Unmarshal(m["error"], &s) != nil {
		s = string(m["error"]) // not a string: ->> reads the JSON text
	}
	return s, true
}

// MonitorTable reads the queue's health: its dead row versions (Dead) and
// live rows. The fake never vacuums in the background and holds no
// transaction open: LastVacuum and Horizon are zero.
func (q *Queue) MonitorTable(context.Context) (store.TableHealth, error) {
	return store.TableHealth{DeadTuples: q.Dead, LiveTuples: int64(len(q.Rows()))}, nil
}

// FailedIndexExists is true: the fake is always at the latest schema (see
// SchemaVersion), whose queue_failed index bounds MonitorFailed.
func (q *Queue) FailedIndexExists(context.Context) (bool, error) { return true, nil }

// MonitorLock reads the clock (see Clock). The fake has no dispatcher lock:
// no session holds it.
func (q *Queue) MonitorLock(context.Context) (time.Time, bool, error) {
	return q.now(), false, nil
}
