package fakequeue

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The statements of store.Executor other than Exec: what the operator's
// tools, pepsi-ingress and pepsi-httpd do to the queue, as the conformance
// suite (internal/testenv/queuetest) states them.

var _ store.Executor = (*Queue)(nil)

// Enqueue inserts p's messages as pending rows (paused until NotBefore for
// those scheduled) at p.Stage, in order, and notifies once, as the insert
// trigger does for one statement.
func (q *Queue) Enqueue(_ context.Context, p store.EnqueueParams) (store.EnqueueResult, error) {
	if len(p.States) != len(p.Payloads) {
		return store.EnqueueResult{}, fmt.Errorf("enqueue: %d payloads, %d states", len(p.Payloads), len(p.States))
	}
	if len(p.OrderKeys) > len(p.Payloads) {
		return store.EnqueueResult{}, fmt.Errorf("enqueue: %d payloads, %d order keys", len(p.Payloads), len(p.OrderKeys))
	}
	if len(p.TraceParents) > len(p.Payloads) {
		return store.EnqueueResult{}, fmt.Errorf("enqueue: %d payloads, %d traceparents", len(p.Payloads), len(p.TraceParents))
	}
	orderKeys := make([]string, len(p.Payloads))
	copy(orderKeys, p.OrderKeys)
	traces := make([]string, len(p.Payloads))
	copy(traces, p.TraceParents)
	if err := checkTraces(traces); err != nil {
		return store.EnqueueResult{}, fmt.Errorf("enqueue: %w", err)
	}
	if err := q.orderKeysFree(orderKeys); err != nil {
		return store.EnqueueResult{}, fmt.Errorf("enqueue: %w", err)
	}
	if len(p.NotBefore) > len(p.Payloads) {
		return store.EnqueueResult{}, fmt.Errorf("enqueue: %d payloads, %d not_before times", len(p.Payloads), len(p.NotBefore))
	}
	notBefore := make([]time.Time, len(p.Payloads))
	copy(notBefore, p.NotBefore)
	var r store.EnqueueResult
	for i, payload := range p.Payloads {
		id := q.add(p.Stage, p.States[i], payload, "", orderKeys[i], notBefore[i])
		q.rows[q.slot(id)].TraceParent = traces[i]
		if !q.rows[q.slot(id)].Timeout.IsZero() {
			r.Scheduled++ // paused, or blocked until its key's turn, then paused
		}
		if r.Count == 0 {
			r.First = id
		}
		r.Count, r.Last = r.Count+1, id
	}
	if r.Count > 0 {
		q.notify()
	}
	return r, nil
}

// add appends a pending row at stage with state (a JSON object, "" for {}),
// payload (nil for NULL), key ("" for none) and order key ("" for none:
// a row whose order key has an unfinished row is blocked, as the insert
// trigger decides), and returns its id; a notBefore ahead of the clock
// inserts it paused until then (a blocked row keeps it for when it becomes
// its key's head). It does not notify: the caller does, once per statement.
func (q *Queue) add(stage, state string, payload []byte, key, orderKey string, notBefore time.Time) int64 {
	id := q.nextID()
	row := &Row{ID: id, Stage: stage, Status: core.StatusPending, DedupKey: key, Key: orderKey}
	if orderKey != "" && len(q.keyRows(orderKey)) > 0 {
		row.Status = core.StatusBlocked
	}
	q.schedule(row, notBefore)
	if state != "" && state != "{}" {
		row.State = merge("", state)
	}
	if payload != nil {
		row.Payload, row.HasPayload = string(payload), true
	}
	q.rows = append(q.rows, row)
	q.touch(id)
	return id
}

// InsertIngress inserts rows as pending rows in order, but for a row whose
// key a row holds already, and returns each row's id: the one it was given,
// or the holder's. It notifies once if it inserted any, as the insert
// trigger does for one statement.
func (q *Queue) InsertIngress(_ context.Context, rows []store.IngressRow) ([]int64, error) {
	orderKeys := make([]string, len(rows))
	traces := make([]string, len(rows))
	for i, r := range rows {
		orderKeys[i], traces[i] = r.OrderKey, r.TraceParent
	}
	if err := checkTraces(traces); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	if err := q.orderKeysFree(orderKeys); err != nil {
		return nil, fmt.Errorf("insert: %w", err)
	}
	ids := make([]int64, len(rows))
	inserted := false
	for i, r := range rows {
		key := ""
		if r.Key != nil {
			key = *r.Key
			if id := q.holder(key); id != 0 {
				ids[i] = id
				continue
			}
		}
		ids[i], inserted = q.add(r.Stage, r.State, r.Payload, key, r.OrderKey, r.NotBefore), true
		q.rows[q.slot(ids[i])].TraceParent = r.TraceParent
	}
	if inserted {
		q.notify()
	}
	return ids, nil
}

// holder is the id of the row that holds key, 0 if none does.
func (q *Queue) holder(key string) int64 {
	for _, r := range q.rows {
		if r != nil && r.DedupKey == key {
			return r.ID
		}
	}
	return 0
}

// CountRows counts the rows per stage and status; for pending rows, how long
// the one changed longest ago has waited (see Clock).
func (q *Queue) CountRows(context.Context) ([]store.Depth, error) {
	now := q.now()
	counts := map[[2]string]*store.Depth{}
	for _, r := range q.rows {
		if r == nil {
			continue
		}
		d := counts[[2]string{r.Stage, string(r.Status)}]
		if d == nil {
			d = &store.Depth{Stage: r.Stage, Status: r.Status}
			counts[[2]string{r.Stage, string(r.Status)}] = d
		}
		d.Count++
		if r.Status == core.StatusPending {
			d.OldestWait = max(d.OldestWait, now.Sub(q.updated[r.ID]))
		}
	}
	out := make([]store.Depth, 0, len(counts))
	for _, d := range counts {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b store.Depth) int {
		return cmp.Or(cmp.Compare(a.Stage, b.Stage), cmp.Compare(a.Status, b.Status))
	})
	return out, nil
}

// ReadStageStats reads the statistics per stage, by stage, with when a flush
// last touched each (see Clock).
func (q *Queue) ReadStageStats(context.Context) ([]store.StageStats, error) {
	out := make([]store.StageStats, 0, len(q.stats))
	for _, d := range q.stats {
		out = append(out, store.StageStats{StageDelta: d, UpdatedAt: q.statsAt[d.Stage]})
	}
	slices.SortFunc(out, func(a, b store.StageStats) int { return cmp.Compare(a.Stage, b.Stage) })
	return out, nil
}

// ReadDispatchStats reads the dispatcher's own statistics, with when the last
// flush touched them (see Clock; zero before the first).
func (q *Queue) ReadDispatchStats(context.Context) (store.DispatchStats, error) {
	return store.DispatchStats{StagePasses: q.passes, MessagesLeft: q.left, FlushSeq: q.flushSeq, UpdatedAt: q.statsAt[""]}, nil
}

// CountPending counts the pending rows of each of stages, at most limit each.
func (q *Queue) CountPending(_ context.Context, stages []string, limit int64) (map[string]int64, error) {
	out := make(map[string]int64, len(stages))
	for _, s := range stages {
		out[s] = 0
	}
	for _, r := range q.rows {
		if r == nil || r.Status != core.StatusPending {
			continue
		}
		if n, asked := out[r.Stage]; asked && n < limit {
			out[r.Stage]++
		}
	}
	return out, nil
}

// Show reads one row, or returns store.ErrNotFound. CreatedAt and UpdatedAt
// are by Clock.
func (q *Queue) Show(_ context.Context, id int64) (*store.Message, error) {
	r := q.row(id)
	if r == nil {
		return nil, fmt.Errorf("show message %d: %w", id, store.ErrNotFound)
	}
	m := &store.Message{ID: id, Stage: r.Stage, Status: string(r.Status), State: json.RawMessage(r.StateJSON()), Attempts: r.Attempts,
		DedupKey: r.DedupKey, OrderKey: r.Key, TraceParent: r.TraceParent, CreatedAt: q.created[id], UpdatedAt: q.updated[id], Head: q.head(r),
		ParentID: r.ParentID}
	for _, c := range q.rows {
		if c != nil && c.ParentID == id {
			m.Children++
		}
	}
	if !r.Timeout.IsZero() {
		t := r.Timeout
		m.Timeout = &t
	}
	if r.HasPayload {
		m.Payload = []byte(r.Payload)
	}
	return m, nil
}

// Retry makes the rows p selects pending again, as pepsi-queue retry does,
// and notifies when it moved any.
func (q *Queue) Retry(_ context.Context, p store.RetryParams) (int64, error) {
	if len(p.Statuses) == 0 {
		return 0, nil // retrySQL selects no status then, where a Selection would select any
	}
	sel := store.Selection{ID: p.ID, Stage: p.Stage, Statuses: p.Statuses, Reason: p.Reason}
	var n int64
	var keys []string
	for _, r := range q.rows {
		if r == nil || !q.selects(r, sel, time.Time{}) {
			continue
		}
		if r.Key != "" && q.KeyLocked(r.Key) {
			continue // the tool would wait for the producer (see release)
		}
		q.retry(r, p.To)
		keys = append(keys, r.Key)
		n++
	}
	if n > 0 {
		q.notify()
	}
	q.release(keys, true, ByOperator)
	if n > 0 {
		// The tool commits synchronously: the WAL up to its commit, stage
		// writes before it included, survives a crash.
		q.undo = nil
	}
	return n, nil
}

// retry makes one failed or timed-out row pending again, at stage to if it is
// not "": no timeout, attempts 0, and state.dispatch_error moved to the end of
// the array state.dispatch_error_history (one entry per retry: error, status,
// stage, retried_at; a history that is not an array starts again).
func (q *Queue) retry(r *Row, to string) {
	before := *r
	state := map[string]json.RawMessage{}
	if r.State != "" {
		if err := json.Unmarshal([]byte(r.State), &state); err != nil {
			panic(fmt.Sprintf("fakequeue: state %q: %v", r.State, err))
		}
	}
	var history []json.RawMessage
	if err := json.Unmarshal(state["dispatch_error_history"], &history); err != nil {
		history = nil
	}
	entry := map[string]any{"status": r.Status, "stage": r.Stage, "retried_at": q.now()}
	if r.DispatchError != "" {
		entry["error"] = r.DispatchError
	}
	e, err := json.Marshal(entry)
	if err != nil {
		panic(fmt.Sprintf("fakequeue: history entry: %v", err))
	}
	h, err := json.Marshal(append(history, e))
	if err != nil {
		panic(fmt.Sprintf("fakequeue: history: %v", err))
	}
	r.State = merge(r.State, `{"dispatch_error_history":`+string(h)+`}`)
	r.Status, r.DispatchError, r.Attempts, r.Timeout = core.StatusPending, "", 0, time.Time{}
	if to != "" {
		r.Stage = to
	}
	q.observe(ByOperator, before, r)
	detail := string(before.Status) + " at " + before.Stage
	if before.DispatchError != "" {
		detail += ": " + before.DispatchError
	}
	q.makeDay(q.now()) // the tool makes today's partition first (historyTodaySQL)
	q.record(store.HistoryRow{ID: r.ID, Stage: r.Stage, Event: core.HistoryRetried, Detail: detail, At: q.now()})
}

// now is the server's clock, for retried_at: Clock, or the zero time when
// the fake has none.
func (q *Queue) now() time.Time {
	if q.Clock == nil {
		return time.Time{}
	}
	return q.Clock()
}

// PurgeCutoff is now (see Clock) less olderThan.
func (q *Queue) PurgeCutoff(_ context.Context, olderThan time.Duration) (time.Time, error) {
	return q.now().Add(-olderThan), nil
}

// PurgeBatch deletes up to p.Limit rows after p.After whose status is one of
// p.Statuses and whose last change was before p.Before, in id order.
func (q *Queue) PurgeBatch(_ context.Context, p store.PurgeParams) (store.PurgeResult, error) {
	var r store.PurgeResult
	for id := max(p.After, q.base) + 1; id < q.nextID() && r.Found < int64(p.Limit); id++ {
		row := q.row(id)
		if row == nil || !slices.Contains(p.Statuses, row.Status) || !q.updated[id].Before(p.Before) {
			continue
		}
		r.Found, r.Last, r.Deleted = r.Found+1, id, r.Deleted+1
		q.rows[q.slot(id)] = nil
		delete(q.updated, id)
		delete(q.created, id)
		delete(q.versions, id)
		q.Dead++
	}
	return r, nil
}

// NotifyIngress sends NOTIFY ingress.
func (q *Queue) NotifyIngress(context.Context) error {
	q.notify()
	return nil
}

// SchemaVersion is the latest migration's: the fake is always current.
func (q *Queue) SchemaVersion(context.Context) (int, error) { return store.Latest(), nil }
