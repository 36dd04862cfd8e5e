package store_test

import (
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
)

// A dispatcher that lost its lock fences its queue (shell/dispatch,
// lostCarry): from then on no transaction is sent, not a new one, a retry
// or a narrowed rerun, since the next holder may be resetting and claiming
// the same rows; the result says it certainly did not commit.
func TestAFencedQueueSendsNoTransaction(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	id := h.Insert(t, "a", 1)[0]
	h.Fence()
	evs := h.Exec(t.Context(), []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 1}}}})
	c, ok := evs[0].(core.Claimed)
	if !ok || !c.Aborted || !strings.Contains(c.Err, "lost its lock") {
		t.Errorf("claim on a fenced queue: %+v; want it aborted, not sent, saying the lock was lost", evs[0])
	}
	if _, status, _, _, _ := h.Row(t, id); status != core.StatusPending {
		t.Errorf("row %d is %s; want pending (nothing sent)", id, status)
	}
}
