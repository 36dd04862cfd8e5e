package fakequeue

import (
	"encoding/json"
	"fmt"

	"github.com/pepsi-pipeline/pepsi/core"
)

// RefuseStateKey makes the queue refuse, as a CHECK (NOT state ? key) of an
// operator's own added NOT VALID would, every row version whose state has
// key at its top level: a move whose patch adds it is written as its
// failure instead (core.RefusedFallback, as store.Queue.Exec narrows a
// refused transaction), and a transaction that would write a row whose
// state has it already fails whole, aborted. "" refuses nothing.
func (q *Queue) RefuseStateKey(key string) { q.refuseKey = key }

// refuses reports whether a row version with state (compact JSON, "" for
// {}) is refused.
func (q *Queue) refuses(state string) bool {
	if q.refuseKey == "" || state == "" {
		return false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(state), &m); err != nil {
		panic(fmt.Sprintf("fakequeue: state %q: %v", state, err))
	}
	_, ok := m[q.refuseKey]
	return ok
}

// refusal is the server's error for a refused row version.
func (q *Queue) refusal() string {
	return fmt.Sprintf("new row violates the check on state key %q (SQLSTATE 23514)", q.refuseKey)
}

// refusedWhole reports a message of cmds' resolves whose write PostgreSQL
// would refuse whatever the item (its state has the refused key already):
// the row is running, so the item writes it, and its failure is refused too;
// unless the item is a move whose children's order keys a producer holds,
// of which PostgreSQL writes nothing (keyBusy).
func (q *Queue) refusedWhole(cmds []core.Command) (int64, bool) {
	for _, cmd := range cmds {
		r, ok := cmd.(core.Resolve)
		if !ok {
			continue
		}
		for _, it := range r.Items {
			if row := q.row(it.ID); row != nil && row.Status == core.StatusRunning && q.refuses(row.State) && !q.keyBusy(it, row) {
				return it.ID, true
			}
		}
	}
	return 0, false
}
