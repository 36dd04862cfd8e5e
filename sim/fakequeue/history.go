package fakequeue

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The fake's pepsi.history: its rows, in the order written, and its daily
// partitions (UTC days), as schema 16 keeps them.

// day is the first instant of t's UTC day.
func day(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// makeDay makes the partition of t's day.
func (q *Queue) makeDay(t time.Time) {
	if q.days == nil {
		q.days = map[time.Time]bool{}
	}
	q.days[day(t)] = true
}

// record writes one history row. A row whose day has no partition is a bug of
// the dispatcher or the tool that wrote it (PostgreSQL would fail the
// statement, and so the transaction, for good): the fake panics.
func (q *Queue) record(h store.HistoryRow) {
	if !q.days[day(h.At)] {
		panic(fmt.Sprintf("fakequeue: history row %s of message %d at %s has no partition to go to", h.Event, h.ID, h.At.UTC().Format(time.RFC3339Nano)))
	}
	q.history = append(q.history, h)
}

// keepHistory is pepsi.history_keep: the days from c.From to c.Through are
// made (the fake never waits for a lock), and the days that end at or before
// c.DropBefore dropped, with their rows.
func (q *Queue) keepHistory(c core.KeepHistory) core.Event {
	for d := day(c.From); !d.After(c.Through); d = d.AddDate(0, 0, 1) {
		q.makeDay(d)
	}
	for d := range q.days {
		if !d.AddDate(0, 0, 1).After(c.DropBefore) {
			delete(q.days, d)
		}
	}
	q.history = slices.DeleteFunc(q.history, func(h store.HistoryRow) bool { return !q.days[day(h.At)] })
	return core.HistoryKept{Op: c.Op, Through: day(c.Through).AddDate(0, 0, 1)}
}

// recordPass writes what an item's resolve did to pepsi.history, as
// resolveSQL does: nothing with history off, for a row gone, or for a row
// still running that the resolve did not write (a racing commit); for an
// item sent again, nothing if its pass is there already.
func (q *Queue) recordPass(it core.Item, wrote, matched bool, r *Row) {
	if !it.History || it.At.IsZero() || r == nil || (!wrote && r.Status == core.StatusRunning) {
		return
	}
	if it.Again && slices.ContainsFunc(q.history, func(h store.HistoryRow) bool {
		return h.ID == it.ID && h.At.Equal(it.At) && h.Stage == it.Stage
	}) {
		return
	}
	h := store.HistoryRow{ID: it.ID, Stage: it.Stage, Event: it.Event, At: it.At, WorkerPID: it.PID, Attempts: it.Attempts}
	switch {
	case it.Verdict != core.Answered && !(wrote && matched):
		h.Event = core.HistoryGuardMiss
	case it.Verdict == core.Answered && wrote && matched && r.Status == core.StatusFailed:
		h.Event = core.HistoryFailed
	}
	switch h.Event {
	case core.HistoryMoved:
		h.Detail = it.To
	case core.HistoryRetry, core.HistoryFailed, core.HistoryTimeout, core.HistoryCrashed:
		h.Detail = it.Reason
	case core.HistoryAnswered, core.HistoryGuardMiss:
		h.Detail = string(r.Status) + " at " + r.Stage
	}
	if !it.HandedAt.IsZero() {
		handed := it.HandedAt
		h.HandedAt = &handed
	}
	q.record(h)
}

// History is message id's history, oldest first, as History of store reads it.
func (q *Queue) History(_ context.Context, id int64) ([]store.HistoryRow, error) {
	var out []store.HistoryRow
	for _, h := range q.history {
		if h.ID == id {
			out = append(out, h)
		}
	}
	slices.SortStableFunc(out, func(a, b store.HistoryRow) int { return a.At.Compare(b.At) })
	return out, nil
}

// HistoryRows is every history row, in the order written.
func (q *Queue) HistoryRows() []store.HistoryRow { return slices.Clone(q.history) }

// HistoryPartitions lists the days that have a partition, oldest first.
func (q *Queue) HistoryPartitions(context.Context) ([]time.Time, error) {
	var out []time.Time
	for d := range q.days {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out, nil
}
