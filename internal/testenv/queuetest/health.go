package queuetest

import (
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// The dispatcher's record of each stage's health (pepsi.stage_health).

// healthTests are the conformance tests of WriteHealth, ReadStageHealth and
// StageHealthExists.
var healthTests = []conformanceTest{
	{"WriteHealthReplacesTheStagesAndKeepsSinceWhileAStateHolds", testHealth},
	{"TheStageHealthTableExistsAtTheLatestSchema", testHealthExists},
}

// writeHealth records hs and reads the rows back, by stage.
func writeHealth(t *testing.T, h Harness, hs ...core.StageHealth) map[string]store.StageHealth {
	t.Helper()
	if err := h.WriteHealth(t.Context(), hs); err != nil {
		t.Fatal(err)
	}
	rows, err := h.ReadStageHealth(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.StageHealth{}
	for i, r := range rows {
		if i > 0 && rows[i-1].Stage >= r.Stage {
			t.Errorf("ReadStageHealth is not in stage order: %v", rows)
		}
		if r.Since.IsZero() || r.UpdatedAt.Before(r.Since) {
			t.Errorf("stage_health %s: since %v, updated_at %v; want a time and an update no earlier", r.Stage, r.Since, r.UpdatedAt)
		}
		out[r.Stage] = r
	}
	return out
}

func testHealth(t *testing.T, h Harness) {
	until := base.Add(time.Minute)
	first := writeHealth(t, h,
		core.StageHealth{Stage: "b", State: core.HealthCannotStart, Reason: "exec: no such file", Until: until},
		core.StageHealth{Stage: "a", State: core.HealthOK})
	if b := first["b"]; len(first) != 2 || b.State != core.HealthCannotStart || b.Reason != "exec: no such file" || !b.Until.Equal(until) {
		t.Fatalf("stage_health = %+v; want a ok and b cannot_start until %v with its reason", first, until)
	}
	if a := first["a"]; a.State != core.HealthOK || a.Reason != "" || !a.Until.IsZero() {
		t.Errorf("stage_health a = %+v, want ok with no reason and no until", a)
	}
	time.Sleep(5 * time.Millisecond) // a later write is at a later instant
	second := writeHealth(t, h,
		core.StageHealth{Stage: "a", State: core.HealthOK},
		core.StageHealth{Stage: "b", State: core.HealthCrashing, Reason: "3 crashes"},
		core.StageHealth{Stage: "c", State: core.HealthRateHeld})
	if a := second["a"]; !a.Since.Equal(first["a"].Since) || !a.UpdatedAt.After(first["a"].UpdatedAt) {
		t.Errorf("stage a still ok: since %v, updated_at %v; want since kept (%v) and a later update", a.Since, a.UpdatedAt, first["a"].Since)
	}
	if b := second["b"]; b.State != core.HealthCrashing || !b.Since.After(first["b"].Since) || !b.Until.IsZero() {
		t.Errorf("stage b now crashing = %+v; want a new since and no until", b)
	}
	if third := writeHealth(t, h, core.StageHealth{Stage: "c", State: core.HealthRateHeld}); len(third) != 1 || third["c"].State != core.HealthRateHeld {
		t.Errorf("stage_health after recording c alone = %+v, want c only", third)
	}
}

func testHealthExists(t *testing.T, h Harness) {
	if ok, err := h.StageHealthExists(t.Context()); err != nil || !ok {
		t.Errorf("StageHealthExists = %v, %v; want true", ok, err)
	}
}
