// Ordering per key in the fake: the keys' locks, the insert that blocks a row
// behind its key, the release, and the claim's filter, as schema 12 does them
// (store/migrations/0012_order_key.sql).

package fakequeue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// ByRelease is the dispatcher's or an operator's release of a key
// (pepsi.order_release): it blocks and unblocks rows.
const ByRelease Writer = "release"

// keyed is what a producer transaction in flight decided for its keyed row at
// insert: its key and its status (pending or blocked).
type keyed struct {
	key    string
	status core.RowStatus
}

// unfinished reports whether status is one of a key's unfinished statuses.
func unfinished(s core.RowStatus) bool {
	return s == core.StatusPending || s == core.StatusRunning || s == core.StatusPaused || s == core.StatusBlocked
}

// keyRows lists the unfinished rows of key, oldest first.
func (q *Queue) keyRows(key string) []*Row {
	var rows []*Row
	for _, r := range q.rows {
		if r != nil && r.Key == key && unfinished(r.Status) {
			rows = append(rows, r)
		}
	}
	return rows
}

// KeyLocked reports whether a producer in flight holds key's lock. (The fake
// gives every key a lock of its own; PostgreSQL shares one among the keys of
// a hash bucket, which only makes a release busy more often.)
func (q *Queue) KeyLocked(key string) bool {
	_, ok := q.keyLocks[key]
	return ok
}

// ReserveKeyed is Reserve for a row with an order key: the producer takes the
// key's lock, then the id, and decides the row's status as the insert trigger
// does (blocked when the key has an unfinished row). It reports false, and
// does nothing, while another producer holds the key's lock: PostgreSQL would
// make this insert wait for that transaction; the caller tries again later.
func (q *Queue) ReserveKeyed(key string) (int64, bool) {
	if q.KeyLocked(key) {
		return 0, false
	}
	id := q.Reserve()
	if q.keyLocks == nil {
		q.keyLocks, q.keyed = map[string]int64{}, map[int64]keyed{}
	}
	q.keyLocks[key] = id
	st := core.StatusPending
	if len(q.keyRows(key)) > 0 {
		st = core.StatusBlocked
	}
	q.keyed[id] = keyed{key: key, status: st}
	return id, true
}

// ReservedBlocked reports whether the keyed row a producer reserved (and
// has not committed) will be blocked behind its key, as the insert trigger
// decided at its insert.
func (q *Queue) ReservedBlocked(id int64) bool {
	k, ok := q.keyed[id]
	return ok && k.status == core.StatusBlocked
}

// ErrKeyLocked is the answer of a synchronous insert (Enqueue,
// InsertIngress) of a row whose order key a producer in flight holds the
// lock of: PostgreSQL's insert would wait for that producer to end, which the
// single-threaded fake cannot; the caller commits that producer first.
var ErrKeyLocked = errors.New("an order key's lock is held by a producer in flight (PostgreSQL would wait for it)")

// orderKeysFree checks, before a synchronous insert changes anything, that
// no producer in flight holds the lock of one of keys ("" for none).
func (q *Queue) orderKeysFree(keys []string) error {
	for _, k := range keys {
		if k != "" && q.KeyLocked(k) {
			return fmt.Errorf("order key %q: %w", k, ErrKeyLocked)
		}
	}
	return nil
}

// commitKeyed gives a committed reserved row its key and status and lets its
// key's lock go.
func (q *Queue) commitKeyed(r *Row) {
	k, ok := q.keyed[r.ID]
	if !ok {
		return
	}
	delete(q.keyed, r.ID)
	delete(q.keyLocks, k.key)
	r.Key, r.Status = k.key, k.status
}

// abortKeyed lets an aborted reserved row's key lock go.
func (q *Queue) abortKeyed(id int64) {
	if k, ok := q.keyed[id]; ok {
		delete(q.keyed, id)
		delete(q.keyLocks, k.key)
	}
}

// claimable reports whether the claim may take pending row r: a keyed row
// only when its key is not excluded (held) and no older row of its key is
// unfinished.
func (q *Queue) claimable(r *Row, excludeKeys []string) bool {
	if r.Key == "" {
		return true
	}
	return !slices.Contains(excludeKeys, r.Key) && !q.behindKey(r)
}

// behindKey reports whether keyed row r has an older unfinished row of its
// key (a row with no key never has).
func (q *Queue) behindKey(r *Row) bool {
	return r.Key != "" && q.olderUnfinished(r.Key, r.ID)
}

// olderUnfinished reports whether a row of key older than id is unfinished.
func (q *Queue) olderUnfinished(key string, id int64) bool {
	rows := q.keyRows(key)
	return len(rows) > 0 && rows[0].ID < id
}

// release is pepsi.order_release: each key, in sorted order, is handed to
// its oldest unfinished row unless a row of it is held, and every other row of
// it that is not held waits blocked. A key a producer holds the lock of is
// busy (wait false) or skipped (wait true: the caller, an operator's tool,
// would have waited for that producer; the fake's synchronous tools cannot,
// and release the key once it is free; see RetryAll).
func (q *Queue) release(keys []string, wait bool, by Writer) (heads []core.Head, busy []string) {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		if k == "" {
			continue
		}
		if q.KeyLocked(k) {
			if !wait {
				busy = append(busy, k)
			}
			continue
		}
		rows := q.keyRows(k)
		if len(rows) == 0 {
			continue
		}
		head := rows[0]
		held := slices.ContainsFunc(rows[1:], func(r *Row) bool { return r.Status == core.StatusRunning })
		for _, r := range rows {
			if (r != head || held) && (r.Status == core.StatusPending || r.Status == core.StatusPaused) {
				before := *r
				if r.Status == core.StatusPending {
					r.Timeout = time.Time{}
				}
				r.PausedForGood = r.Status == core.StatusPaused && r.Timeout.IsZero()
				r.Status = core.StatusBlocked
				q.observe(by, before, r)
			}
		}
		if held {
			continue
		}
		if head.Status == core.StatusBlocked {
			before := *head
			head.Status = core.StatusPending
			if head.PausedForGood || !head.Timeout.IsZero() && head.Timeout.After(q.now()) {
				head.Status = core.StatusPaused
			} else if head.Attempts > 0 {
				head.DispatchError = "" // the reason of the retry whose wait this ends, as the wake does
			}
			head.PausedForGood = false
			q.observe(by, before, head)
			if head.Status == core.StatusPending && !head.Timeout.IsZero() {
				// Its pause or schedule ran out while it waited: woken, as the
				// wake records it. Only into a day that has its partition, as
				// schema 31's release checks (to_regclass): with none, the key
				// is released and no row written.
				if at := q.now(); q.days[day(at)] {
					q.record(store.HistoryRow{ID: head.ID, Stage: head.Stage, Event: core.HistoryWoken, At: at, Attempts: head.Attempts})
				}
			}
		}
		if head.Status == core.StatusPending || head.Status == core.StatusPaused {
			heads = append(heads, core.Head{Key: k, ID: head.ID, Stage: head.Stage, Status: head.Status, Timeout: head.Timeout})
		}
	}
	return heads, busy
}

// head is what blocked row r waits behind: the oldest row of its key that
// is not blocked; nil for a row that is not blocked, or when none is.
func (q *Queue) head(r *Row) *store.KeyHead {
	if r.Status != core.StatusBlocked {
		return nil
	}
	for _, h := range q.keyRows(r.Key) {
		if h.Status != core.StatusBlocked {
			kh := &store.KeyHead{ID: h.ID, Stage: h.Stage, Status: h.Status, Attempts: h.Attempts}
			if !h.Timeout.IsZero() {
				t := h.Timeout
				kh.Timeout = &t
			}
			return kh
		}
	}
	return nil
}

// CountKeysWaiting counts the blocked rows and their keys, by what each
// key's head is doing, as store's keysWaitingSQL does.
func (q *Queue) CountKeysWaiting(context.Context) (store.KeysWaiting, error) {
	var w store.KeysWaiting
	for _, k := range q.blockedKeys() {
		rows := q.keyRows(k)
		w.Keys++
		var head *Row
		for _, r := range rows {
			if r.Status == core.StatusBlocked {
				w.Messages++
			} else if head == nil {
				head = r
			}
		}
		switch {
		case head == nil:
			w.HeadNone++
		case head.Status == core.StatusPending:
			w.HeadPending++
		case head.Status == core.StatusRunning:
			w.HeadRunning++
		case head.Attempts == 0:
			w.HeadPaused++
		default:
			w.HeadRetrying++
		}
	}
	return w, nil
}

// blockedKeys lists the keys that have blocked rows, sorted.
func (q *Queue) blockedKeys() []string {
	var keys []string
	for _, r := range q.rows {
		if r != nil && r.Status == core.StatusBlocked {
			keys = append(keys, r.Key)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

func (q *Queue) releaseCmd(c core.Release) core.Event {
	keys := slices.Clone(c.Keys)
	for _, b := range c.Behind {
		if r := q.row(b.ID); (r == nil || r.Status != core.StatusRunning) && q.olderUnfinished(b.Key, b.ID) {
			keys = append(keys, b.Key)
		}
	}
	if c.All {
		keys = append(slices.Clone(keys), q.blockedKeys()...)
	}
	heads, busy := q.release(keys, false, ByRelease)
	return core.Released{Op: c.Op, Heads: heads, Busy: busy}
}

// RawRetry is an operator's own SQL (not pepsi-queue retry) that makes every
// failed or timed-out row with an order key that skip does not exclude
// pending again, with NOTIFY ingress, but without the release of its key:
// two messages of a key may then be pending, or one pending while a worker
// holds another. It returns their ids.
func (q *Queue) RawRetry(skip func(id int64) bool) []int64 {
	var ids []int64
	for _, r := range q.rows {
		if r != nil && r.Key != "" && (r.Status == core.StatusFailed || r.Status == core.StatusTimeout) && !skip(r.ID) {
			q.retry(r, "")
			ids = append(ids, r.ID)
		}
	}
	if len(ids) > 0 {
		q.undo = nil // the tool commits synchronously, as in Retry
		q.notify()
	}
	return ids
}
