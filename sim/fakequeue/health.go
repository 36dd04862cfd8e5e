package fakequeue

import (
	"cmp"
	"context"
	"slices"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The statements of pepsi.stage_health, as store's health.go states them,
// on the fake's Clock.

// WriteHealth records hs, one entry per stage of the dispatcher: the rows of
// other stages go, and a stage whose state did not change keeps its Since.
func (q *Queue) WriteHealth(_ context.Context, hs []core.StageHealth) error {
	now := q.now()
	rows := make(map[string]store.StageHealth, len(hs))
	for _, h := range hs {
		since := now
		if old, ok := q.health[h.Stage]; ok && old.State == h.State {
			since = old.Since
		}
		rows[h.Stage] = store.StageHealth{Stage: h.Stage, State: h.State, Reason: h.Reason, Until: h.Until, Since: since, UpdatedAt: now}
	}
	q.health = rows
	return nil
}

// ReadStageHealth reads the recorded health of each stage, by stage.
func (q *Queue) ReadStageHealth(context.Context) ([]store.StageHealth, error) {
	out := make([]store.StageHealth, 0, len(q.health))
	for _, h := range q.health {
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b store.StageHealth) int { return cmp.Compare(a.Stage, b.Stage) })
	return out, nil
}

// StageHealthExists is true: the fake is always at the latest schema.
func (q *Queue) StageHealthExists(context.Context) (bool, error) { return true, nil }
