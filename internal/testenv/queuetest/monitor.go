package queuetest

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// pepsi-httpd's reads.

// monitorTests are the conformance tests of the Monitor methods.
var monitorTests = []conformanceTest{
	{"MonitorDepthsCountEachStageInEachStatus", testMonitorDepths},
	{"MonitorFailuresReadsTheNewestFirstWithWhoFailedThemAndWhy", testMonitorFailures},
	{"MonitorFailuresReadsAtMostFailuresMax", testMonitorFailuresMax},
	{"MonitorTableAndLockRead", testMonitorTableLock},
	{"TheFailedIndexExistsAtTheLatestSchema", testFailedIndex},
	{"ReadPageMessageReadsWhoFailedAMessageAndWhyButNeitherPayloadNorState", testPageMessage},
}

// Instants far before and after any clock a queue runs on.
var (
	longAgo  = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)
	farAhead = time.Date(2100, time.January, 1, 0, 0, 0, 0, time.UTC)
)

func testMonitorDepths(t *testing.T, h Harness) {
	failAt(t, h, "c", "x", core.Fail)
	failAt(t, h, "c", "y", core.TimeOut)
	due := h.Insert(t, "a", 1)[0]
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	h.Stage(t, due, "a", "a", core.StatusPaused, longAgo)
	retried := h.Insert(t, "a", 1)[0]
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	resolve(t, h, retryItem(retried, "a", farAhead, "busy"))
	h.Insert(t, "a", 2)
	h.Insert(t, "b", 1)
	claimRows(t, h, core.Cap{Stage: "b", N: 1})
	time.Sleep(5 * time.Millisecond) // the pending rows have waited over a millisecond
	got := map[string]int64{}
	for _, read := range []func(*testing.T) []store.StageDepth{
		readDepths(h.MonitorPending), readDepths(h.MonitorRunning), readDepths(h.MonitorPaused), readDepths(h.MonitorFailed),
	} {
		for _, d := range read(t) {
			got[at(d.Stage, d.Status)] = d.Count
			switch {
			case d.Status == core.StatusPending && d.OldestWait < time.Millisecond:
				t.Errorf("pending at %s: oldest wait %v, want a millisecond or more", d.Stage, d.OldestWait)
			case d.Status == core.StatusPaused && (d.Due != 1 || d.RetryWaiting != 1):
				t.Errorf("paused at %s: %d due, %d waiting out a retry; want 1 and 1", d.Stage, d.Due, d.RetryWaiting)
			}
		}
	}
	want := map[string]int64{"a:pending": 2, "a:paused": 2, "b:running": 1, "c:failed": 1, "c:timeout": 1}
	if !maps.Equal(got, want) {
		t.Errorf("monitor depths = %v, want %v", got, want)
	}
}

// readDepths is read as a step of the test.
func readDepths(read func(ctx context.Context) ([]store.StageDepth, error)) func(*testing.T) []store.StageDepth {
	return func(t *testing.T) []store.StageDepth {
		t.Helper()
		d, err := read(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}

func testMonitorFailures(t *testing.T, h Harness) {
	long := strings.Repeat("é", store.ReasonMax+10)
	byDispatcher := failAt(t, h, "a", long, core.Fail)
	byStage := h.Insert(t, "b", 1)[0]
	claimRows(t, h, core.Cap{Stage: "b", N: 1})
	moved, err := h.StageTransition(t.Context(), store.StageTransitionParams{
		ID: byStage, From: "b", Stage: "b", Status: core.StatusFailed, State: []byte(`{"error": "bad input"}`)})
	if err != nil || !moved {
		t.Fatalf("stage failure of row %d: %v, %v", byStage, moved, err)
	}
	timedOut := failAt(t, h, "c", "MAX_RUNTIME", core.TimeOut)
	got, err := h.MonitorFailures(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Failure{
		{ID: timedOut, Stage: "c", Status: core.StatusTimeout, By: "dispatcher", Reason: "MAX_RUNTIME"},
		{ID: byStage, Stage: "b", Status: core.StatusFailed, By: "stage", Reason: "bad input"},
		{ID: byDispatcher, Stage: "a", Status: core.StatusFailed, By: "dispatcher", Reason: strings.Repeat("é", store.ReasonMax)},
	}
	if len(got) != len(want) {
		t.Fatalf("MonitorFailures = %v, want %d failures", got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.UpdatedAt.IsZero() {
			t.Errorf("failure %d: no updated_at", i)
		}
		g.UpdatedAt = time.Time{}
		if g != w {
			t.Errorf("failure %d = %+v (%d characters of reason), want %+v", i, g, utf8.RuneCountInString(g.Reason), w)
		}
	}
}

func testMonitorFailuresMax(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", store.FailuresMax+2)
	claimRows(t, h, core.Cap{Stage: "a", N: len(ids)})
	items := make([]core.Item, len(ids))
	for i, id := range ids {
		items[i] = core.Item{ID: id, Stage: "a", Verdict: core.Fail, Reason: "x"}
	}
	resolve(t, h, items...)
	if got, err := h.MonitorFailures(t.Context()); err != nil || len(got) != store.FailuresMax {
		t.Errorf("MonitorFailures of %d failures read %d, %v; want %d", len(ids), len(got), err, store.FailuresMax)
	}
}

func testMonitorTableLock(t *testing.T, h Harness) {
	h.Insert(t, "a", 1)
	if tb, err := h.MonitorTable(t.Context()); err != nil || tb.DeadTuples < 0 || tb.LiveTuples < 0 || tb.Horizon < 0 {
		t.Errorf("MonitorTable = %+v, %v; want counts and a horizon of zero or more", tb, err)
	}
	if at, locked, err := h.MonitorLock(t.Context()); err != nil || at.IsZero() || locked {
		t.Errorf("MonitorLock = %v, %v, %v; want the clock, and no dispatcher holding the lock", at, locked, err)
	}
}

func testFailedIndex(t *testing.T, h Harness) {
	if ok, err := h.FailedIndexExists(t.Context()); err != nil || !ok {
		t.Errorf("FailedIndexExists = %v, %v; want true", ok, err)
	}
}

func testPageMessage(t *testing.T, h Harness) {
	failed := failAt(t, h, "a", "smtp: refused", core.Fail)
	paused := h.Insert(t, "b", 1)[0]
	claimRows(t, h, core.Cap{Stage: "b", N: 1})
	resolve(t, h, retryItem(paused, "b", farAhead, "busy"))
	byStage := h.InsertMessage(t, "c", `{"k": 1}`, []byte("secret"))
	claimRows(t, h, core.Cap{Stage: "c", N: 1})
	if moved, err := h.StageTransition(t.Context(), store.StageTransitionParams{
		ID: byStage, From: "c", Stage: "c", Status: core.StatusFailed, State: []byte(`{"error": "bad input"}`)}); err != nil || !moved {
		t.Fatalf("stage failure of row %d: %v, %v", byStage, moved, err)
	}
	pending := h.Insert(t, "d", 1)[0]
	for _, w := range []store.PageMessage{
		{ID: failed, Stage: "a", Status: core.StatusFailed, By: "dispatcher", Reason: "smtp: refused"},
		{ID: paused, Stage: "b", Status: core.StatusPaused, Attempts: 1, Timeout: &farAhead, By: "dispatcher", Reason: "busy"},
		{ID: byStage, Stage: "c", Status: core.StatusFailed, By: "stage", Reason: "bad input"},
		{ID: pending, Stage: "d", Status: core.StatusPending},
	} {
		m, err := h.ReadPageMessage(t.Context(), w.ID)
		if err != nil {
			t.Fatal(err)
		}
		if m.CreatedAt.IsZero() || m.UpdatedAt.Before(m.CreatedAt) {
			t.Errorf("ReadPageMessage(%d): created_at %v, updated_at %v; want a time and a change no earlier", w.ID, m.CreatedAt, m.UpdatedAt)
		}
		if (m.Timeout == nil) != (w.Timeout == nil) || m.Timeout != nil && !m.Timeout.Equal(*w.Timeout) {
			t.Errorf("ReadPageMessage(%d): timeout %v, want %v", w.ID, m.Timeout, w.Timeout)
		}
		m.CreatedAt, m.UpdatedAt, m.Timeout, w.Timeout = time.Time{}, time.Time{}, nil, nil
		if len(m.FirstChildren) == 0 {
			m.FirstChildren = nil // no children: an empty list or none, alike
		}
		if !reflect.DeepEqual(m, w) {
			t.Errorf("ReadPageMessage(%d) = %+v, want %+v", w.ID, m, w)
		}
	}
	if _, err := h.ReadPageMessage(t.Context(), 12345); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ReadPageMessage of a missing row: err = %v, want store.ErrNotFound", err)
	}
}
