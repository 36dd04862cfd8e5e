// The conformance tests of the producers' order keys (Enqueue,
// InsertIngress) and of what the stage library and the operator's tools read
// of them.

package queuetest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// wantOrderKey fails the test unless Show reads row id with order key key
// and status.
func wantOrderKey(t *testing.T, h Harness, id int64, key string, status core.RowStatus) {
	t.Helper()
	m, err := h.Show(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if m.OrderKey != key || core.RowStatus(m.Status) != status {
		t.Errorf("Show(%d): order key %q, %s; want %q, %s", id, m.OrderKey, m.Status, key, status)
	}
}

func testKeyEnqueue(t *testing.T, h KeyedHarness) {
	head := h.InsertKeyed(t, "a", "k")
	r, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "b", Payloads: make([][]byte, 4), States: make([]string, 4),
		OrderKeys: []string{"k", "", "j", "j"}})
	if err != nil || r.Count != 4 {
		t.Fatalf("Enqueue of 4 keyed rows = %+v, %v", r, err)
	}
	got := listIDs(t, h, store.Selection{Stage: "b"}, 0, 10)
	if len(got) != 4 || got[0] != r.First || got[3] != r.Last {
		t.Fatalf("rows at b %v, Enqueue answered %+v; want 4 rows from its first id to its last", got, r)
	}
	wantOrderKey(t, h, head, "k", core.StatusPending)
	wantOrderKey(t, h, got[0], "k", core.StatusBlocked) // behind the unfinished head
	wantOrderKey(t, h, got[1], "", core.StatusPending)
	wantOrderKey(t, h, got[2], "j", core.StatusPending) // its key's first
	wantOrderKey(t, h, got[3], "j", core.StatusBlocked) // behind the row before it
	// Without order keys, as before.
	if r, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "c", Payloads: make([][]byte, 2), States: make([]string, 2)}); err != nil || r.Count != 2 {
		t.Fatalf("Enqueue without order keys = %+v, %v", r, err)
	}
	for _, id := range listIDs(t, h, store.Selection{Stage: "c"}, 0, 10) {
		wantOrderKey(t, h, id, "", core.StatusPending)
	}
}

func testKeyInsertIngress(t *testing.T, h KeyedHarness) {
	head := h.InsertKeyed(t, "a", "k")
	got := insertIngress(t, h,
		store.IngressRow{Stage: "b", OrderKey: "k"},
		store.IngressRow{Stage: "b", OrderKey: "j", Key: key("d1")},
		store.IngressRow{Stage: "b"},
		store.IngressRow{Stage: "b", OrderKey: "j"})
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != 4 {
		t.Fatalf("InsertIngress of four rows = %v, want four ids in the order given", got)
	}
	wantOrderKey(t, h, head, "k", core.StatusPending)
	wantOrderKey(t, h, got[0], "k", core.StatusBlocked)
	wantOrderKey(t, h, got[1], "j", core.StatusPending)
	wantOrderKey(t, h, got[2], "", core.StatusPending)
	wantOrderKey(t, h, got[3], "j", core.StatusBlocked)
	// A known idempotency key answers its row and inserts nothing, order key
	// or not.
	again := insertIngress(t, h, store.IngressRow{Stage: "b", OrderKey: "j", Key: key("d1")})
	if again[0] != got[1] {
		t.Fatalf("InsertIngress of idempotency key d1 again = %v, want %d", again, got[1])
	}
	if n, err := h.CountSelected(t.Context(), store.Selection{Stage: "b"}); err != nil || n != 4 {
		t.Fatalf("rows at b = %d, %v; want 4", n, err)
	}
}

func testKeyShowHead(t *testing.T, h KeyedHarness) {
	head := h.InsertKeyed(t, "a", "k")
	waiting := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	m, err := h.Show(t.Context(), waiting)
	if err != nil {
		t.Fatal(err)
	}
	if m.Head == nil || m.Head.ID != head || m.Head.Stage != "a" || m.Head.Status != core.StatusRunning {
		t.Fatalf("Show(%d).Head = %+v; want message %d, running at a", waiting, m.Head, head)
	}
	until := base.Add(time.Hour)
	resolve(t, h, retryItem(head, "a", until, "service down"))
	if m, err = h.Show(t.Context(), waiting); err != nil {
		t.Fatal(err)
	}
	if m.Head == nil || m.Head.ID != head || m.Head.Status != core.StatusPaused || m.Head.Attempts != 1 ||
		m.Head.Timeout == nil || !m.Head.Timeout.Equal(until) {
		t.Fatalf("Show(%d).Head = %+v; want message %d paused until %v for its first retry", waiting, m.Head, head, until)
	}
	if m, err := h.Show(t.Context(), head); err != nil || m.Head != nil || m.OrderKey != "k" {
		t.Fatalf("Show(%d) of the head = %+v, %v; want order key k and nothing it waits behind", head, m, err)
	}
	// pepsi-httpd's message page reads the same.
	if p, err := h.ReadPageMessage(t.Context(), waiting); err != nil || p.OrderKey != "k" || p.Head == nil || p.Head.ID != head ||
		p.Head.Status != core.StatusPaused || p.Head.Attempts != 1 || p.Head.Timeout == nil || !p.Head.Timeout.Equal(until) {
		t.Fatalf("ReadPageMessage(%d) = %+v, %v; want order key k, waiting behind %+v", waiting, p, err, m.Head)
	}
	// Once the head finished, the blocked message waits behind nothing: the
	// dispatcher's release is next.
	wakeAt(t, h, until)
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	resolve(t, h, core.Item{ID: head, Stage: "a", Verdict: core.Move, To: core.TargetDone})
	if m, err := h.Show(t.Context(), waiting); err != nil || m.Head != nil || core.RowStatus(m.Status) != core.StatusBlocked {
		t.Fatalf("Show(%d) after its head finished = %+v, %v; want it blocked, behind nothing", waiting, m, err)
	}
}

func testKeyStageRead(t *testing.T, h KeyedHarness) {
	keyed := h.InsertKeyed(t, "a", "acct-9")
	plain := h.Insert(t, "a", 1)[0]
	got := stageRead(t, h, keyed, plain)
	if got[keyed].OrderKey != "acct-9" || got[plain].OrderKey != "" {
		t.Errorf("StageRead order keys %q and %q; want acct-9 and none", got[keyed].OrderKey, got[plain].OrderKey)
	}
}

func testKeySelect(t *testing.T, h KeyedHarness) {
	head := failHead(t, h, "k")
	a := h.InsertKeyed(t, "a", "k")
	b := h.InsertKeyed(t, "a", "k")
	h.InsertKeyed(t, "a", "j")
	h.Insert(t, "a", 1)
	sel := store.Selection{OrderKey: "k"}
	page, err := h.List(t.Context(), store.ListParams{Selection: sel, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, m := range page {
		got = append(got, m.ID)
		if m.OrderKey != "k" {
			t.Errorf("List(order key k) read row %d with order key %q", m.ID, m.OrderKey)
		}
	}
	if !slices.Equal(got, []int64{head, a, b}) {
		t.Fatalf("List(order key k) = %v, want [%d %d %d] (its finished message too)", got, head, a, b)
	}
	blocked := store.Selection{OrderKey: "k", Statuses: []core.RowStatus{core.StatusBlocked}}
	if n, err := h.CountSelected(t.Context(), blocked); err != nil || n != 1 {
		t.Fatalf("CountSelected(k, blocked) = %d, %v; want 1", n, err)
	}
	if n, err := h.Discard(t.Context(), store.DiscardParams{Selection: blocked, DispatchError: "backlog dropped"}); err != nil || n != 1 {
		t.Fatalf("Discard(k, blocked) = %d, %v; want 1", n, err)
	}
	wantRowError(t, h, b, "a", core.StatusFailed, "backlog dropped")
	wantRow(t, h, a, "a", core.StatusPending) // the key's head, untouched
}

func testKeyCountWaiting(t *testing.T, h KeyedHarness) {
	if w, err := h.CountKeysWaiting(t.Context()); err != nil || w != (store.KeysWaiting{}) {
		t.Fatalf("CountKeysWaiting of an empty queue = %+v, %v; want zeros", w, err)
	}
	heads := map[string]int64{}
	for _, k := range []string{"paused", "retrying", "running", "none", "alone"} {
		heads[k] = h.InsertKeyed(t, "a", k)
	}
	for _, k := range []string{"paused", "paused", "retrying", "running", "none"} {
		h.InsertKeyed(t, "a", k)
	}
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	h.InsertKeyed(t, "a", "pending")
	h.InsertKeyed(t, "a", "pending")
	h.Stage(t, heads["paused"], "a", "a", core.StatusPaused, base.Add(time.Hour))
	resolve(t, h, retryItem(heads["retrying"], "a", base.Add(time.Hour), "service down"))
	// The stage finished this head itself; no release has run since.
	h.Stage(t, heads["none"], "a", "a", core.StatusDone, base)
	want := store.KeysWaiting{Keys: 5, Messages: 6, HeadPending: 1, HeadRunning: 1, HeadPaused: 1, HeadRetrying: 1, HeadNone: 1}
	if w, err := h.CountKeysWaiting(t.Context()); err != nil || w != want {
		t.Fatalf("CountKeysWaiting = %+v, %v; want %+v", w, err, want)
	}
}

func testKeyMonitorBlocked(t *testing.T, h KeyedHarness) {
	h.InsertKeyed(t, "a", "k")
	h.InsertKeyed(t, "a", "k")
	h.InsertKeyed(t, "b", "k")
	h.InsertKeyed(t, "b", "j")
	got, err := h.MonitorBlocked(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(x, y store.StageDepth) int { return strings.Compare(x.Stage, y.Stage) })
	want := []store.StageDepth{{Stage: "a", Status: core.StatusBlocked, Count: 1}, {Stage: "b", Status: core.StatusBlocked, Count: 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("MonitorBlocked = %+v, want %+v", got, want)
	}
}
