package store

import (
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
)

// TestAResolvesChildrenGoToTheirParentsOutcome: the rows after the items'
// outcomes are the children inserted running, each put with its parent's
// outcome, in order; a report of another shape (too few rows, a child among
// the items, a child of no item) is an error that names the row, never
// outcomes the core would take for the truth.
func TestAResolvesChildrenGoToTheirParentsOutcome(t *testing.T) {
	t.Parallel()
	item := func(id int64) resolved {
		return resolved{Outcome: core.Outcome{ID: id, Stage: "a", Status: core.StatusDone, Matched: true}}
	}
	child := func(id, of int64) resolved {
		return resolved{Outcome: core.Outcome{ID: id, Stage: "b", Status: core.StatusRunning}, childOf: of}
	}
	got, err := resolvedOutcomes([]resolved{item(1), item(2), child(10, 2), child(11, 1), child(12, 2)}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != 1 || got[1].ID != 2 ||
		len(got[0].Children) != 1 || got[0].Children[0] != (core.Child{ID: 11, Stage: "b"}) ||
		len(got[1].Children) != 2 || got[1].Children[0].ID != 10 || got[1].Children[1].ID != 12 {
		t.Errorf("outcomes %v, want 1 with child 11, 2 with children 10 and 12", got)
	}
	for _, bad := range []struct {
		rows []resolved
		want string
	}{
		{[]resolved{item(1)}, "1 outcomes for 2 items"},
		{[]resolved{item(1), child(10, 1)}, "row 10 is a child of 1"},
		{[]resolved{item(1), item(2), child(10, 3)}, "row 10 is neither"},
	} {
		if _, err := resolvedOutcomes(bad.rows, 2); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("resolvedOutcomes(%v, 2) = %v, want an error saying %q", bad.rows, err, bad.want)
		}
	}
}
