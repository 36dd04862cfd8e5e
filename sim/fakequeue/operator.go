package fakequeue

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The operator's daily work on messages (pepsi-queue list and discard), as
// store's operator.go states it: a filter that selects rows, and ending
// pending or paused ones by hand.

// selects reports whether sel selects r, at now (the server's clock, read once
// per statement as now() is).
func (q *Queue) selects(r *Row, sel store.Selection, now time.Time) bool {
	return (sel.ID == 0 || r.ID == sel.ID) &&
		(sel.Stage == "" || r.Stage == sel.Stage) &&
		(len(sel.Statuses) == 0 || slices.Contains(sel.Statuses, r.Status)) &&
		(sel.Reason == "" || r.DispatchError != "" && strings.Contains(strings.ToLower(r.DispatchError), strings.ToLower(sel.Reason))) &&
		(sel.OlderThan == 0 || q.updated[r.ID].Before(now.Add(-sel.OlderThan))) &&
		(sel.OrderKey == "" || r.Key == sel.OrderKey)
}

// List reads one page of the selected rows, in id order.
func (q *Queue) List(_ context.Context, p store.ListParams) ([]store.Listed, error) {
	now := q.now()
	var out []store.Listed
	for _, r := range q.rows {
		if len(out) >= p.Limit {
			break
		}
		if r == nil || r.ID <= p.After || !q.selects(r, p.Selection, now) {
			continue
		}
		out = append(out, store.Listed{
			ID: r.ID, Stage: r.Stage, Status: r.Status, DispatchError: r.DispatchError, Attempts: r.Attempts, DedupKey: r.DedupKey,
			OrderKey: r.Key, CreatedAt: q.created[r.ID], UpdatedAt: q.updated[r.ID],
		})
	}
	return out, nil
}

// CountSelected counts the selected rows.
func (q *Queue) CountSelected(_ context.Context, sel store.Selection) (int64, error) {
	now := q.now()
	var n int64
	for _, r := range q.rows {
		if r != nil && q.selects(r, sel, now) {
			n++
		}
	}
	return n, nil
}

// Discard ends the selected rows failed, with p.DispatchError as their
// dispatch_error, no timeout and a failed event in their history, and
// returns how many.
func (q *Queue) Discard(_ context.Context, p store.DiscardParams) (int64, error) {
	now := q.now()
	var n int64
	var keys []string
	for _, r := range q.rows {
		if r == nil || !q.selects(r, p.Selection, now) || r.Key != "" && q.KeyLocked(r.Key) {
			continue // (a keyed row whose lock a producer holds: the tool would wait, see release)
		}
		before := *r
		r.Status, r.Timeout, r.DispatchError, r.PausedForGood = core.StatusFailed, time.Time{}, p.DispatchError, false
		q.observe(ByOperator, before, r)
		q.makeDay(now) // the tool makes today's partition first (historyTodaySQL)
		q.record(store.HistoryRow{ID: r.ID, Stage: r.Stage, Event: core.HistoryFailed, Detail: p.DispatchError, At: now, Attempts: r.Attempts})
		keys = append(keys, r.Key)
		n++
	}
	// A discarded head hands its key on.
	q.release(keys, true, ByOperator)
	if n > 0 {
		q.undo = nil // the tool commits synchronously, as in Retry
	}
	return n, nil
}
