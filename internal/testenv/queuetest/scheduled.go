// The conformance tests of scheduled messages: a producer's not_before
// (pepsi-ingress's field, pepsi-queue enqueue -not-before).

package queuetest

import (
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The suite's two instants for not_before: ahead of every clock a harness
// runs on (the server's, the fake's at base) and behind them.
var (
	notBeforeAhead  = time.Date(2100, time.January, 2, 3, 4, 5, 0, time.UTC)
	notBeforeBehind = time.Date(2001, time.January, 2, 3, 4, 5, 0, time.UTC)
)

// scheduledTests are the conformance tests of not_before.
var scheduledTests = []conformanceTest{
	{"InsertIngressInsertsAScheduledMessagePausedUntilItsTime", testInsertIngressScheduled},
	{"EnqueueInsertsScheduledMessagesPausedUntilTheirTime", testEnqueueScheduled},
	{"AWakeWakesAtMostWakeMaxRowsTheFirstDueAndSaysMoreAreDue", testWakeBounded},
}

// wantPausedUntil fails the test unless row id is paused at stage until at.
func wantPausedUntil(t *testing.T, h Harness, id int64, stage string, at time.Time) {
	t.Helper()
	st, status, timeout, _, ok := h.Row(t, id)
	if !ok || st != stage || status != core.StatusPaused || !timeout.Equal(at) {
		t.Errorf("row %d: %s, %s until %v (found %v); want paused at %s until %v", id, st, status, timeout, ok, stage, at)
	}
}

func testInsertIngressScheduled(t *testing.T, h Harness) {
	id := insertIngress(t, h,
		store.IngressRow{Stage: "a", Payload: []byte("later"), NotBefore: notBeforeAhead},
		store.IngressRow{Stage: "a", Payload: []byte("due already"), NotBefore: notBeforeBehind},
		store.IngressRow{Stage: "a", Payload: []byte("now")},
		store.IngressRow{Stage: "b", Key: key("d1"), NotBefore: notBeforeAhead})
	wantPausedUntil(t, h, id[0], "a", notBeforeAhead)
	wantRow(t, h, id[1], "a", core.StatusPending) // not ahead of the clock: pending at once
	wantRow(t, h, id[2], "a", core.StatusPending)
	wantPausedUntil(t, h, id[3], "b", notBeforeAhead)
	// The claim takes only what is due; the wake reports the scheduled rows'
	// time, so the dispatcher sleeps until then.
	if got := ids(claimRows(t, h, core.Cap{Stage: "a", N: 10}, core.Cap{Stage: "b", N: 10})); len(got) != 2 || got[0] != id[1] || got[1] != id[2] {
		t.Fatalf("claim took %v, want the two rows that are due, %v", got, id[1:3])
	}
	if w := wakeAt(t, h, base); w.Count != 0 || !w.Next.Equal(notBeforeAhead) {
		t.Fatalf("wake at %v = %+v; want nothing woken and the next due at %v", base, w, notBeforeAhead)
	}
	if w := wakeAt(t, h, notBeforeAhead); w.Count != 2 {
		t.Fatalf("wake at the scheduled time = %+v, want both scheduled rows woken", w)
	}
	wantRow(t, h, id[0], "a", core.StatusPending)
	// A known idempotency key answers its row, scheduled or not.
	if again := insertIngress(t, h, store.IngressRow{Stage: "b", Key: key("d1")}); again[0] != id[3] {
		t.Fatalf("InsertIngress of key d1 again = %v, want %d", again, id[3])
	}
}

func testEnqueueScheduled(t *testing.T, h Harness) {
	r, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "a", Payloads: make([][]byte, 3), States: make([]string, 3),
		NotBefore: []time.Time{notBeforeAhead, {}, notBeforeBehind}})
	if err != nil || r.Count != 3 || r.Scheduled != 1 {
		t.Fatalf("Enqueue of 3 rows, one scheduled ahead = %+v, %v; want 3 rows, 1 scheduled", r, err)
	}
	wantPausedUntil(t, h, r.First, "a", notBeforeAhead)
	wantRow(t, h, r.First+1, "a", core.StatusPending)
	wantRow(t, h, r.Last, "a", core.StatusPending)
	if r, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "a", Payloads: make([][]byte, 1), States: make([]string, 1)}); err != nil || r.Scheduled != 0 {
		t.Fatalf("Enqueue without not_before = %+v, %v; want nothing scheduled", r, err)
	}
}

func testKeyScheduled(t *testing.T, h KeyedHarness) {
	head := h.InsertKeyed(t, "a", "k")
	got := insertIngress(t, h,
		store.IngressRow{Stage: "a", OrderKey: "k", NotBefore: notBeforeAhead},
		store.IngressRow{Stage: "a", OrderKey: "j", NotBefore: notBeforeAhead})
	// Behind its key's unfinished message a scheduled one waits blocked; the
	// first of its key is paused until its time, and holds the key till then.
	wantOrderKey(t, h, got[0], "k", core.StatusBlocked)
	wantPausedUntil(t, h, got[1], "a", notBeforeAhead)
	// Enqueue counts a scheduled message blocked behind its key as
	// scheduled: it will be paused until its time once it is the head.
	r, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "a", Payloads: make([][]byte, 1), States: make([]string, 1),
		OrderKeys: []string{"k"}, NotBefore: []time.Time{notBeforeAhead}})
	if err != nil || r.Count != 1 || r.Scheduled != 1 {
		t.Fatalf("Enqueue of a scheduled message behind its key = %+v, %v; want 1 row, 1 scheduled", r, err)
	}
	wantOrderKey(t, h, r.First, "k", core.StatusBlocked)
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	resolve(t, h, core.Item{ID: head, Stage: "a", Verdict: core.Move, To: core.TargetDone})
	rel := release(t, h, "k")
	if len(rel.Heads) != 1 || rel.Heads[0].ID != got[0] || rel.Heads[0].Status != core.StatusPaused || !rel.Heads[0].Timeout.Equal(notBeforeAhead) {
		t.Fatalf("release of k once its head is done = %+v; want row %d its head, paused until %v", rel, got[0], notBeforeAhead)
	}
	wantPausedUntil(t, h, got[0], "a", notBeforeAhead)
}

func testWakeBounded(t *testing.T, h Harness) {
	const more = 3
	n := core.WakeMax + more
	notBefore := make([]time.Time, n)
	for i := range notBefore {
		notBefore[i] = notBeforeAhead
	}
	notBefore[0] = notBeforeAhead.Add(-time.Minute) // due first
	if _, err := h.Enqueue(t.Context(), store.EnqueueParams{Stage: "a", Payloads: make([][]byte, n), States: make([]string, n), NotBefore: notBefore}); err != nil {
		t.Fatal(err)
	}
	first, err := h.List(t.Context(), store.ListParams{Selection: store.Selection{Stage: "a"}, Limit: 1})
	if err != nil || len(first) != 1 {
		t.Fatalf("List = %v, %v", first, err)
	}
	w := wakeAt(t, h, notBeforeAhead)
	if w.Count != core.WakeMax || !w.Next.Equal(notBeforeAhead) {
		t.Fatalf("wake of %d due rows = %+v; want core.WakeMax (%d) woken and the next due now, %v", n, w, core.WakeMax, notBeforeAhead)
	}
	wantRow(t, h, first[0].ID, "a", core.StatusPending) // the one due first is among them
	if w := wakeAt(t, h, notBeforeAhead); w.Count != more || !w.Next.IsZero() {
		t.Fatalf("the next wake = %+v; want the %d left woken and nothing more due", w, more)
	}
}
