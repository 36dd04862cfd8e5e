package writelog

import "testing"

// The ownership check itself: it must catch a worker writing a row its
// dispatcher no longer holds, and accept the ordinary history of a takeover.
func TestCheckOwnershipCatchesAWriteByAWorkerWhoseDispatcherLostTheRow(t *testing.T) {
	t.Parallel()
	workers := map[string]string{"wA": "A", "wB": "B"}
	w := func(app, from, to string) Write {
		return Write{ID: 1, App: app, OldStatus: from, NewStatus: to, OldStage: "a", NewStage: "a"}
	}
	takeover := []Write{w("A", "pending", "running"), w("B", "running", "pending"), w("B", "pending", "running"), w("wB", "running", "done")}
	if bad := CheckOwnership(takeover, workers); len(bad) != 0 {
		t.Errorf("a clean takeover was flagged: %v", bad)
	}
	late := []Write{w("A", "pending", "running"), w("B", "running", "pending"), w("B", "pending", "running"), w("wA", "running", "done")}
	if bad := CheckOwnership(late, workers); len(bad) != 1 {
		t.Errorf("A's worker wrote a row B held, and %d violations were found; want 1", len(bad))
	}
	// A dispatcher writing a transition its stage answered, for a row another
	// dispatcher holds, is caught as well.
	w2 := func(app, from, to, fromStage, toStage string) Write {
		return Write{ID: 1, App: app, OldStatus: from, NewStatus: to, OldStage: fromStage, NewStage: toStage}
	}
	answered := []Write{w2("A", "pending", "running", "a", "a"), w2("A", "running", "pending", "a", "b"),
		w2("B", "pending", "running", "b", "b"), w2("A", "running", "done", "b", "b")}
	if bad := CheckOwnership(answered, workers); len(bad) != 1 {
		t.Errorf("A wrote a transition of a row B held, and %d violations were found; want 1", len(bad))
	}
}
