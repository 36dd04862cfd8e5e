package queuetest

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The statements of the operator's tools, pepsi-ingress and pepsi-httpd:
// each method of store.Executor but Exec.

// statementTests are the conformance tests of the methods other than Exec.
var statementTests = []conformanceTest{
	{"EnqueueInsertsPendingRowsInOrderAndShowReadsThem", testEnqueueShow},
	{"ShowOfAMissingRowIsErrNotFound", testShowMissing},
	{"CountRowsCountsEachStageAndStatus", testCountRows},
	{"CountPendingCountsUpToTheLimitAndNamesEveryStageAsked", testCountPending},
	{"RetryMovesDispatchErrorIntoItsHistoryAndCanChangeTheStage", testRetryHistory},
	{"RetrySelectsByIdStageAndStatusOnly", testRetrySelects},
	{"RetrySelectsByReasonIgnoringCase", testRetryByReason},
	{"PurgeDeletesFinishedRowsOlderThanTheCutoffInIdOrder", testPurge},
	{"SchemaVersionIsTheLatestMigration", testSchemaVersion},
	{"NotifyIngressSucceeds", testNotify},
}

// failAt makes a new row at stage fail there with reason, as the dispatcher
// does, and returns its id.
func failAt(t *testing.T, h Harness, stage, reason string, verdict core.Verdict) int64 {
	t.Helper()
	id := h.Insert(t, stage, 1)[0]
	claimRows(t, h, core.Cap{Stage: stage, N: 1})
	resolve(t, h, core.Item{ID: id, Stage: stage, Verdict: verdict, Reason: reason})
	return id
}

func testEnqueueShow(t *testing.T, h Harness) {
	r, err := h.Enqueue(t.Context(), store.EnqueueParams{
		Stage: "s", Payloads: [][]byte{[]byte("one"), []byte("two")}, States: []string{"", `{"k":1}`}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 2 || r.Last-r.First != 1 {
		t.Fatalf("Enqueue = %+v, want 2 rows with consecutive ids", r)
	}
	for i, want := range []struct{ payload, state string }{{"one", `{}`}, {"two", `{"k":1}`}} {
		m, err := h.Show(t.Context(), r.First+int64(i))
		if err != nil {
			t.Fatal(err)
		}
		if m.ID != r.First+int64(i) || m.Stage != "s" || m.Status != string(core.StatusPending) ||
			string(m.Payload) != want.payload || compact(t, m.State) != want.state {
			t.Errorf("Show(%d) = %s:%s payload %q state %s; want s:pending payload %q state %s",
				m.ID, m.Stage, m.Status, m.Payload, m.State, want.payload, want.state)
		}
	}
}

func testShowMissing(t *testing.T, h Harness) {
	if _, err := h.Show(t.Context(), 12345); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Show of a missing row: err = %v, want store.ErrNotFound", err)
	}
}

func testCountRows(t *testing.T, h Harness) {
	h.Insert(t, "a", 3)
	h.Insert(t, "b", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	failAt(t, h, "c", "no", core.Fail)
	time.Sleep(5 * time.Millisecond) // the pending rows have waited over a millisecond
	depths, err := h.CountRows(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, d := range depths {
		got[at(d.Stage, d.Status)] += d.Count
		if pending := d.Status == core.StatusPending; pending != (d.OldestWait >= time.Millisecond) || d.OldestWait < 0 {
			t.Errorf("CountRows: %s oldest wait %v; want a millisecond or more for pending rows only", at(d.Stage, d.Status), d.OldestWait)
		}
	}
	want := map[string]int64{"a:pending": 2, "a:running": 1, "b:pending": 1, "c:failed": 1}
	if !maps.Equal(got, want) {
		t.Errorf("CountRows = %v, want %v", got, want)
	}
}

func testCountPending(t *testing.T, h Harness) {
	h.Insert(t, "a", 3)
	h.Insert(t, "b", 1)
	claimRows(t, h, core.Cap{Stage: "b", N: 1})
	got, err := h.CountPending(t.Context(), []string{"a", "b", "c"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int64{"a": 2, "b": 0, "c": 0}; !maps.Equal(got, want) {
		t.Errorf("CountPending(a, b, c; limit 2) = %v, want %v", got, want)
	}
}

func testRetryHistory(t *testing.T, h Harness) {
	id := failAt(t, h, "a", "exit 3: bad input", core.Fail)
	n, err := h.Retry(t.Context(), store.RetryParams{ID: id, Statuses: []core.RowStatus{core.StatusFailed}, To: "b"})
	if err != nil || n != 1 {
		t.Fatalf("Retry -to b = %d, %v; want 1 row", n, err)
	}
	wantRowError(t, h, id, "b", core.StatusPending, "")
	claimRows(t, h, core.Cap{Stage: "b", N: 1})
	resolve(t, h, core.Item{ID: id, Stage: "b", Verdict: core.TimeOut, Reason: "MAX_RUNTIME 1s exceeded"})
	if n, err := h.Retry(t.Context(), store.RetryParams{ID: id, Statuses: []core.RowStatus{core.StatusTimeout}}); err != nil || n != 1 {
		t.Fatalf("Retry = %d, %v; want 1 row", n, err)
	}
	wantRowError(t, h, id, "b", core.StatusPending, "")
	history, _ := h.State(t, id)["dispatch_error_history"].([]any)
	want := []map[string]any{
		{"error": "exit 3: bad input", "status": "failed", "stage": "a"},
		{"error": "MAX_RUNTIME 1s exceeded", "status": "timeout", "stage": "b"},
	}
	if len(history) != len(want) {
		t.Fatalf("state.dispatch_error_history = %v, want %d entries", history, len(want))
	}
	for i, w := range want {
		e, _ := history[i].(map[string]any)
		at, _ := e["retried_at"].(string)
		if _, err := time.Parse(time.RFC3339Nano, at); err != nil {
			t.Errorf("history entry %d: retried_at %q is not a time: %v", i, e["retried_at"], err)
		}
		delete(e, "retried_at")
		if !maps.Equal(e, w) {
			t.Errorf("history entry %d = %v, want %v and retried_at", i, e, w)
		}
	}
}

func testRetrySelects(t *testing.T, h Harness) {
	failedA := failAt(t, h, "a", "x", core.Fail)
	timeoutA := failAt(t, h, "a", "y", core.TimeOut)
	failedB := failAt(t, h, "b", "z", core.Fail)
	pending := h.Insert(t, "a", 1)[0]
	retry := func(p store.RetryParams) int64 {
		t.Helper()
		n, err := h.Retry(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := retry(store.RetryParams{Stage: "a", Statuses: []core.RowStatus{core.StatusFailed}}); n != 1 {
		t.Errorf("Retry -stage a -status failed moved %d rows, want 1", n)
	}
	wantRow(t, h, failedA, "a", core.StatusPending)
	wantRow(t, h, timeoutA, "a", core.StatusTimeout)
	wantRow(t, h, failedB, "b", core.StatusFailed)
	if n := retry(store.RetryParams{ID: failedB, Statuses: []core.RowStatus{core.StatusTimeout}}); n != 0 {
		t.Errorf("Retry -id %d -status timeout of a failed row moved %d rows, want 0", failedB, n)
	}
	both := []core.RowStatus{core.StatusFailed, core.StatusTimeout}
	if n := retry(store.RetryParams{Statuses: both}); n != 2 {
		t.Errorf("Retry -all moved %d rows, want 2", n)
	}
	for _, id := range []int64{timeoutA, failedB} {
		wantRowError(t, h, id, map[int64]string{timeoutA: "a", failedB: "b"}[id], core.StatusPending, "")
	}
	if _, ok := h.State(t, pending)["dispatch_error_history"]; ok {
		t.Errorf("a pending row was retried: %v", h.State(t, pending))
	}
}

func testRetryByReason(t *testing.T, h Harness) {
	refused := failAt(t, h, "a", "smtp: Connection refused", core.Fail)
	full := failAt(t, h, "a", "mailbox full", core.Fail)
	both := []core.RowStatus{core.StatusFailed, core.StatusTimeout}
	n, err := h.Retry(t.Context(), store.RetryParams{Statuses: both, Reason: "connection REFUSED"})
	if err != nil || n != 1 {
		t.Fatalf("Retry -reason 'connection REFUSED' = %d, %v; want 1 row", n, err)
	}
	wantRow(t, h, refused, "a", core.StatusPending)
	wantRow(t, h, full, "a", core.StatusFailed)
}

func testPurge(t *testing.T, h Harness) {
	done := h.Insert(t, "a", 1)[0]
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	h.Stage(t, done, "a", "a", core.StatusDone, time.Time{})
	failed := failAt(t, h, "a", "x", core.Fail)
	pending := h.Insert(t, "a", 1)[0]
	finished := []core.RowStatus{core.StatusDone, core.StatusFailed, core.StatusTimeout}
	purge := func(olderThan time.Duration, statuses []core.RowStatus, limit int) store.PurgeResult {
		t.Helper()
		cutoff, err := h.PurgeCutoff(t.Context(), olderThan)
		if err != nil {
			t.Fatal(err)
		}
		r, err := h.PurgeBatch(t.Context(), store.PurgeParams{Statuses: statuses, Before: cutoff, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := purge(time.Hour, finished, 10); r != (store.PurgeResult{}) {
		t.Errorf("purge of rows older than an hour = %+v, want nothing found", r)
	}
	time.Sleep(5 * time.Millisecond) // the rows' last change is now over a millisecond old
	if r := purge(time.Millisecond, []core.RowStatus{core.StatusFailed}, 10); r != (store.PurgeResult{Found: 1, Last: failed, Deleted: 1}) {
		t.Errorf("purge -status failed = %+v, want row %d found and deleted", r, failed)
	}
	if _, err := h.Show(t.Context(), failed); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("row %d after its purge: %v, want store.ErrNotFound", failed, err)
	}
	if r := purge(time.Millisecond, finished, 1); r != (store.PurgeResult{Found: 1, Last: done, Deleted: 1}) {
		t.Errorf("purge of finished rows, one at a time = %+v, want row %d found and deleted", r, done)
	}
	if r := purge(time.Millisecond, finished, 10); r != (store.PurgeResult{}) {
		t.Errorf("purge with no finished rows left = %+v, want nothing found", r)
	}
	wantRow(t, h, pending, "a", core.StatusPending)
}

func testSchemaVersion(t *testing.T, h Harness) {
	v, err := h.SchemaVersion(t.Context())
	if err != nil || v != store.Latest() {
		t.Errorf("SchemaVersion = %d, %v; want %d", v, err, store.Latest())
	}
}

func testNotify(t *testing.T, h Harness) {
	if err := h.NotifyIngress(t.Context()); err != nil {
		t.Errorf("NotifyIngress: %v", err)
	}
}

// compact is a JSON object's text with sorted keys and no spaces, so that
// jsonb's and the fake's texts compare.
func compact(t *testing.T, b []byte) string {
	t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("state %q: %v", b, err)
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
