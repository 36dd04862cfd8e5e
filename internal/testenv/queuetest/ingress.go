package queuetest

import (
	"slices"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// pepsi-ingress's insert, with idempotency keys.

// ingressTests are the conformance tests of InsertIngress.
var ingressTests = []conformanceTest{
	{"InsertIngressInsertsInOrderAndAnswersAKnownKeyWithItsHolder", testInsertIngress},
	{"InsertIngressWithoutKeysInsertsEveryRow", testInsertIngressUnkeyed},
}

// key is k as an IngressRow's key.
func key(k string) *string { return &k }

// insertIngress inserts rows and returns their ids.
func insertIngress(t *testing.T, h Harness, rows ...store.IngressRow) []int64 {
	t.Helper()
	ids, err := h.InsertIngress(t.Context(), rows)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(rows) {
		t.Fatalf("InsertIngress of %d rows answered %d ids: %v", len(rows), len(ids), ids)
	}
	return ids
}

func testInsertIngress(t *testing.T, h Harness) {
	first := insertIngress(t, h,
		store.IngressRow{Stage: "a", Payload: []byte("one")},
		store.IngressRow{Stage: "a", Payload: []byte("two"), State: `{"k": 1}`, Key: key("k2")},
		store.IngressRow{Stage: "b", Key: key("k3")})
	if !slices.IsSorted(first) || first[0] == first[1] || first[1] == first[2] {
		t.Fatalf("InsertIngress of three new rows = %v, want three ids in order", first)
	}
	claimRows(t, h, core.Cap{Stage: "b", N: 1})
	again := insertIngress(t, h,
		store.IngressRow{Stage: "c", Payload: []byte("other"), Key: key("k3")},
		store.IngressRow{Stage: "c", Key: key("k4")},
		store.IngressRow{Stage: "c"})
	if again[0] != first[2] || again[1] <= first[2] || again[2] <= again[1] {
		t.Fatalf("InsertIngress(k3 again, k4, no key) = %v; want %d (k3's row) and two new ids in order", again, first[2])
	}
	wantRow(t, h, first[2], "b", core.StatusRunning) // the known key's row is left as it was
	want := []struct {
		id                         int64
		stage, payload, state, key string
	}{
		{first[0], "a", "one", `{}`, ""},
		{first[1], "a", "two", `{"k":1}`, "k2"},
		{first[2], "b", "", `{}`, "k3"},
		{again[1], "c", "", `{}`, "k4"},
		{again[2], "c", "", `{}`, ""},
	}
	for _, w := range want {
		m, err := h.Show(t.Context(), w.id)
		if err != nil {
			t.Fatal(err)
		}
		if m.Stage != w.stage || string(m.Payload) != w.payload || compact(t, m.State) != w.state || m.DedupKey != w.key {
			t.Errorf("Show(%d) = stage %s payload %q state %s key %q; want %s %q %s %q",
				w.id, m.Stage, m.Payload, m.State, m.DedupKey, w.stage, w.payload, w.state, w.key)
		}
	}
	page, err := h.List(t.Context(), store.ListParams{Selection: store.Selection{ID: first[1]}, Limit: 1})
	if err != nil || len(page) != 1 || page[0].DedupKey != "k2" {
		t.Errorf("List(id %d) = %v, %v; want the row with key k2", first[1], page, err)
	}
}

func testInsertIngressUnkeyed(t *testing.T, h Harness) {
	ids := insertIngress(t, h, store.IngressRow{Stage: "a"}, store.IngressRow{Stage: "a"})
	if ids[1] <= ids[0] {
		t.Fatalf("InsertIngress of two rows = %v, want two ids in order", ids)
	}
	if n, err := h.CountPending(t.Context(), []string{"a"}, 10); err != nil || n["a"] != 2 {
		t.Errorf("CountPending(a) = %v, %v; want 2", n, err)
	}
}
