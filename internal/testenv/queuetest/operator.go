package queuetest

import (
	"slices"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The operator's daily work on messages: List, CountSelected and Discard, and
// the stamps Show reads.

// operatorTests are the conformance tests of List, CountSelected and Discard.
var operatorTests = []conformanceTest{
	{"ListAndCountSelectByIdStageStatusAndReason", testListSelects},
	{"ListReadsPagesInIdOrder", testListPages},
	{"ListSelectsByTheTimeSinceTheLastChange", testListOlderThan},
	{"DiscardFailsTheSelectedRowsWithItsReasonAndNoTimeout", testDiscard},
	{"ShowAndListReadWhenARowWasMadeAndLastChanged", testStamps},
}

// operatorRows makes one row of each kind the operator's filters tell apart
// and returns their ids, in id order: one failed at a (reason "smtp:
// Connection refused"), two pending at a, one running at b, one paused at a by
// a retry (attempts 1, reason "rate limited").
func operatorRows(t *testing.T, h Harness) (pending []int64, running, failed, paused int64) {
	t.Helper()
	failed = failAt(t, h, "a", "smtp: Connection refused", core.Fail) // first: failAt claims a's first pending row
	pending = h.Insert(t, "a", 2)
	running = h.Insert(t, "b", 1)[0]
	claimRows(t, h, core.Cap{Stage: "b", N: 1})
	paused = h.Insert(t, "c", 1)[0]
	claimRows(t, h, core.Cap{Stage: "c", N: 1})
	h.Stage(t, paused, "c", "a", core.StatusRunning, time.Time{})
	resolve(t, h, retryItem(paused, "a", base, "rate limited"))
	return pending, running, failed, paused
}

// listIDs lists the ids of the rows sel selects after after, at most limit.
func listIDs(t *testing.T, h Harness, sel store.Selection, after int64, limit int) []int64 {
	t.Helper()
	page, err := h.List(t.Context(), store.ListParams{Selection: sel, After: after, Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, len(page))
	for i, m := range page {
		ids[i] = m.ID
	}
	return ids
}

func testListSelects(t *testing.T, h Harness) {
	pending, running, failed, paused := operatorRows(t, h)
	all := []int64{failed, pending[0], pending[1], running, paused}
	cases := []struct {
		name string
		sel  store.Selection
		want []int64
	}{
		{"everything", store.Selection{}, all},
		{"one id", store.Selection{ID: failed}, []int64{failed}},
		{"a stage", store.Selection{Stage: "a"}, []int64{failed, pending[0], pending[1], paused}},
		{"statuses", store.Selection{Statuses: []core.RowStatus{core.StatusRunning, core.StatusPaused}}, []int64{running, paused}},
		{"a stage and a status", store.Selection{Stage: "b", Statuses: []core.RowStatus{core.StatusPending}}, nil},
		{"a reason, ignoring case", store.Selection{Reason: "CONNECTION refused"}, []int64{failed}},
		{"a reason no row has", store.Selection{Reason: "disk full"}, nil},
	}
	for _, c := range cases {
		if got := listIDs(t, h, c.sel, 0, 100); !slices.Equal(got, c.want) {
			t.Errorf("List(%s) = %v, want %v", c.name, got, c.want)
		}
		if n, err := h.CountSelected(t.Context(), c.sel); err != nil || n != int64(len(c.want)) {
			t.Errorf("CountSelected(%s) = %d, %v; want %d", c.name, n, err, len(c.want))
		}
	}
	page, err := h.List(t.Context(), store.ListParams{Selection: store.Selection{ID: paused}, Limit: 1})
	if err != nil || len(page) != 1 {
		t.Fatalf("List(id %d) = %v, %v; want the row", paused, page, err)
	}
	if m := page[0]; m.Stage != "a" || m.Status != core.StatusPaused || m.DispatchError != "rate limited" || m.Attempts != 1 || m.DedupKey != "" {
		t.Errorf("List(id %d) = %+v, want a:paused, dispatch_error %q, attempts 1, no key", paused, m, "rate limited")
	}
}

func testListPages(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 5)
	if got := listIDs(t, h, store.Selection{}, 0, 2); !slices.Equal(got, ids[:2]) {
		t.Errorf("first page of 2 = %v, want %v", got, ids[:2])
	}
	if got := listIDs(t, h, store.Selection{}, ids[1], 2); !slices.Equal(got, ids[2:4]) {
		t.Errorf("page of 2 after %d = %v, want %v", ids[1], got, ids[2:4])
	}
	if got := listIDs(t, h, store.Selection{}, ids[3], 2); !slices.Equal(got, ids[4:]) {
		t.Errorf("last page after %d = %v, want %v", ids[3], got, ids[4:])
	}
}

func testListOlderThan(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	if got := listIDs(t, h, store.Selection{OlderThan: time.Hour}, 0, 10); len(got) != 0 {
		t.Errorf("List(older than an hour) = %v, want none", got)
	}
	time.Sleep(5 * time.Millisecond) // the rows' last change is now over a millisecond old
	if got := listIDs(t, h, store.Selection{OlderThan: time.Millisecond}, 0, 10); !slices.Equal(got, ids) {
		t.Errorf("List(older than a millisecond) = %v, want %v", got, ids)
	}
}

func testDiscard(t *testing.T, h Harness) {
	pending, running, failed, paused := operatorRows(t, h)
	kept := h.InsertMessage(t, "k", `{"k": 1}`, nil)
	waiting := []core.RowStatus{core.StatusPending, core.StatusPaused}
	discard := func(sel store.Selection, reason string) int64 {
		t.Helper()
		n, err := h.Discard(t.Context(), store.DiscardParams{Selection: sel, DispatchError: reason})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := discard(store.Selection{Stage: "a", Statuses: waiting, Reason: "RATE"}, "by hand"); n != 1 {
		t.Errorf("Discard(stage a, reason RATE) = %d, want 1 (the paused row)", n)
	}
	wantRowError(t, h, paused, "a", core.StatusFailed, "by hand")
	if _, _, timeout, _, _ := h.Row(t, paused); !timeout.IsZero() {
		t.Errorf("discarded row %d keeps its timeout %v", paused, timeout)
	}
	if n := discard(store.Selection{Statuses: waiting}, "all of them"); n != 3 {
		t.Errorf("Discard(pending and paused) = %d, want 3", n)
	}
	for _, id := range append(pending, kept) {
		_, _, _, reason, _ := h.Row(t, id)
		if reason != "all of them" {
			t.Errorf("row %d: dispatch_error %q, want %q", id, reason, "all of them")
		}
	}
	if state := h.State(t, kept); len(state) != 2 || state["k"] != 1.0 {
		t.Errorf("state of discarded row %d = %v, want its own key k and dispatch_error", kept, state)
	}
	wantRow(t, h, running, "b", core.StatusRunning)
	wantRowError(t, h, failed, "a", core.StatusFailed, "smtp: Connection refused")
}

func testStamps(t *testing.T, h Harness) {
	r, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "a", Payloads: [][]byte{nil}, States: []string{""}})
	if err != nil {
		t.Fatal(err)
	}
	id := r.First
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	m, err := h.Show(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if m.CreatedAt.IsZero() || m.UpdatedAt.Before(m.CreatedAt) {
		t.Errorf("Show(%d): created_at %v, updated_at %v; want a time, and the change no earlier", id, m.CreatedAt, m.UpdatedAt)
	}
	page, err := h.List(t.Context(), store.ListParams{Selection: store.Selection{ID: id}, Limit: 1})
	if err != nil || len(page) != 1 {
		t.Fatalf("List(id %d) = %v, %v; want the row", id, page, err)
	}
	if !page[0].CreatedAt.Equal(m.CreatedAt) || !page[0].UpdatedAt.Equal(m.UpdatedAt) {
		t.Errorf("List(id %d): created_at %v, updated_at %v; Show read %v, %v", id, page[0].CreatedAt, page[0].UpdatedAt, m.CreatedAt, m.UpdatedAt)
	}
}
