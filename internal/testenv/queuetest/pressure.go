package queuetest

import (
	"slices"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Back-pressure: a claim checks MAX_PENDING limits (core.Claim.Limits,
// core.Claimed.Over).

// pressureTests are the conformance tests of a claim's limits.
var pressureTests = []conformanceTest{
	{"ClaimNamesTheStagesOverTheirLimitAfterTakingItsRows", testClaimOver},
	{"ClaimCountsALimitAboveItsFloorOnly", testClaimOverFloor},
	{"ClaimWithLimitsAndNoCapsOnlyChecks", testClaimOverOnly},
	{"ClaimCountsWhatTheResolveBeforeItLeftPending", testClaimOverAfterResolve},
	{"ClaimTakesNothingForAStageItsHoldsFindOverBeforeIt", testClaimHolds},
}

// claimLimits runs one Claim of caps checking limits.
func claimLimits(t *testing.T, h Harness, caps []core.Cap, limits ...core.Limit) core.Claimed {
	t.Helper()
	return exec(t, h, core.Claim{Op: 42, Caps: caps, Limits: limits}, func(e core.Claimed) (int64, string) { return e.Op, e.Err })
}

// testClaimOver: a stage is named when more than Max of its rows are pending
// once the claim has taken its own (exactly Max is not over), in the order
// of the limits; running, paused and other stages' rows do not count.
func testClaimOver(t *testing.T, h Harness) {
	h.Insert(t, "a", 5)
	h.Insert(t, "b", 3)
	h.Insert(t, "c", 1)
	got := claimLimits(t, h, []core.Cap{{Stage: "a", N: 1}},
		core.Limit{Stage: "c", Max: 0}, core.Limit{Stage: "b", Max: 3}, core.Limit{Stage: "a", Max: 3})
	// a: 5 pending, 1 claimed: 4 > 3; b: 3, not over 3; c: 1 > 0.
	if !slices.Equal(got.Over, []string{"c", "a"}) {
		t.Fatalf("over = %v, want [c a] (c 1 > 0, b 3 not over 3, a 4 left > 3, in the limits' order)", got.Over)
	}
	got = claimLimits(t, h, []core.Cap{{Stage: "a", N: 1}}, core.Limit{Stage: "a", Max: 3})
	if len(got.Over) != 0 {
		t.Fatalf("over = %v after a claim left 3 pending at a, want none (3 is not more than 3)", got.Over)
	}
	if got = claimLimits(t, h, nil, core.Limit{Stage: "nowhere", Max: 0}); len(got.Over) != 0 {
		t.Fatalf("over = %v for a stage with no rows, want none", got.Over)
	}
}

// testClaimOverFloor: only rows above the limit's After count.
func testClaimOverFloor(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 4)
	if got := claimLimits(t, h, nil, core.Limit{Stage: "a", Max: 2, After: ids[1]}); len(got.Over) != 0 {
		t.Fatalf("over = %v counting above row %d (2 rows), want none", got.Over, ids[1])
	}
	if got := claimLimits(t, h, nil, core.Limit{Stage: "a", Max: 2, After: ids[0]}); !slices.Equal(got.Over, []string{"a"}) {
		t.Fatalf("over = %v counting above row %d (3 rows), want [a]", got.Over, ids[0])
	}
}

// testClaimOverOnly: a claim with no caps takes nothing and still checks.
func testClaimOverOnly(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	got := claimLimits(t, h, nil, core.Limit{Stage: "a", Max: 1})
	if len(got.Rows) != 0 || !slices.Equal(got.Over, []string{"a"}) {
		t.Fatalf("claim = %v, over %v; want no rows, and a over", got.Rows, got.Over)
	}
	for _, id := range ids {
		if _, status, _, _, _ := h.Row(t, id); status != core.StatusPending {
			t.Errorf("row %d is %s after a claim with no caps, want pending", id, status)
		}
	}
}

// testClaimOverAfterResolve: a resolve's moves in the same transaction count
// at their target; the claim's own rows do not.
func testClaimOverAfterResolve(t *testing.T, h Harness) {
	a := h.Insert(t, "a", 2)
	h.Insert(t, "b", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	evs := h.Exec(t.Context(), []core.Command{
		core.Resolve{Op: 1, Items: []core.Item{
			{ID: a[0], Stage: "a", Verdict: core.Move, To: "b"},
			{ID: a[1], Stage: "a", Verdict: core.Move, To: "b"},
		}},
		core.Claim{Op: 2, Caps: []core.Cap{{Stage: "b", N: 1}}, Limits: []core.Limit{{Stage: "b", Max: 1}}},
	})
	if len(evs) != 2 {
		t.Fatalf("answered %v, want 2 events", evs)
	}
	got, ok := evs[1].(core.Claimed)
	if !ok || got.Err != "" {
		t.Fatalf("claim answered %v", evs[1])
	}
	// b: 1 + 2 moved = 3 pending, 1 claimed: 2 > 1.
	if len(got.Rows) != 1 || !slices.Equal(got.Over, []string{"b"}) {
		t.Fatalf("claim = %v, over %v; want one row and b over (2 left pending > 1)", got.Rows, got.Over)
	}
}

// testClaimHolds: a cap of a stage whose Hold names a stage over its limit as
// the transaction stands before the claim takes nothing (and the stage is
// named in More, its rows still pending); a stage over its own limit is not
// held; a stage within its limit before the claim does not hold, though the
// claim's Over reports what it left.
func testClaimHolds(t *testing.T, h Harness) {
	f := h.Insert(t, "f", 2)
	h.Insert(t, "x", 2)
	hold := []core.Hold{{Stage: "f", By: "x"}}
	got := exec(t, h, core.Claim{Op: 42, Caps: []core.Cap{{Stage: "f", N: 2}, {Stage: "x", N: 1}},
		Limits: []core.Limit{{Stage: "x", Max: 1}}, Holds: hold}, func(e core.Claimed) (int64, string) { return e.Op, e.Err })
	// x: 2 pending before (over 1): f held; x's own claim takes one, leaving 1.
	if len(got.Rows) != 1 || got.Rows[0].Stage != "x" || !slices.Contains(got.More, "f") || len(got.Over) != 0 {
		t.Fatalf("claim = %v, more %v, over %v; want x's row only, more at f (held), nothing over after", got.Rows, got.More, got.Over)
	}
	for _, id := range f {
		if _, status, _, _, _ := h.Row(t, id); status != core.StatusPending {
			t.Errorf("row %d of held stage f is %s, want pending", id, status)
		}
	}
	// f over its own limit of 1: not held, whatever x is.
	h.Insert(t, "x", 1)
	got = exec(t, h, core.Claim{Op: 42, Caps: []core.Cap{{Stage: "f", N: 2}},
		Limits: []core.Limit{{Stage: "f", Max: 1}, {Stage: "x", Max: 1}}, Holds: hold}, func(e core.Claimed) (int64, string) { return e.Op, e.Err })
	if len(got.Rows) != 2 || !slices.Equal(got.Over, []string{"x"}) {
		t.Fatalf("claim = %v, over %v; want f's 2 rows (over its own limit: never held), x over", got.Rows, got.Over)
	}
}
