package store

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pepsi-pipeline/pepsi/core"
)

// TestAClaimCarriesBackPressureOnlyWithLimits: a claim with no stage's
// MAX_PENDING to check is sent as claimSQL, without the back-pressure parts
// every run of the statement would set up (docs/performance.md, "A
// transaction's fixed cost, again"); one with limits as claimLimitsSQL,
// followed by the count of what it left pending.
func TestAClaimCarriesBackPressureOnlyWithLimits(t *testing.T) {
	t.Parallel()
	caps := []core.Cap{{Stage: "a", N: 4}, {Stage: "b", N: 4}}
	for _, c := range []struct {
		name  string
		claim core.Claim
		want  []string
	}{
		{"no limits", core.Claim{Caps: caps}, []string{epochSQL, settledSQL, claimSQL}},
		{"limits", core.Claim{Caps: caps, Limits: []core.Limit{{Stage: "b", Max: 10}}, Holds: []core.Hold{{Stage: "a", By: "b"}}},
			[]string{epochSQL, settledSQL, claimLimitsSQL, overSQL}},
	} {
		var b pgx.Batch
		claim(c.claim).queue(&b)
		if len(b.QueuedQueries) != len(c.want) {
			t.Errorf("%s: %d statements queued, want %d", c.name, len(b.QueuedQueries), len(c.want))
			continue
		}
		for i, q := range b.QueuedQueries {
			if q.SQL != c.want[i] {
				t.Errorf("%s: statement %d is not the one wanted:\n%.200s", c.name, i, q.SQL)
			}
		}
		want := 9 // claimSQL's; claimLimitsSQL's five more
		if c.claim.Limits != nil {
			want += 5
		}
		if got := len(b.QueuedQueries[2].Arguments); got != want {
			t.Errorf("%s: the claim given %d arguments, want %d", c.name, got, want)
		}
	}
}
