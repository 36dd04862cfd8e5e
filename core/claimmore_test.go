package core_test

import (
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// Proves: a claim that comes back with fewer rows than its cap, while its walk
// found more pending rows than the cap (Claimed.More: a row it picked was
// changed by another writer before the UPDATE took it), does not count the
// stage as emptied. The core claims the stage again at once, from above the
// highest row it took, not from the settled id: the rows past the cap are
// pending, and a floor above them would hide them until the heartbeat.
func TestAShortClaimThatFoundMoreDoesNotEmptyItsStage(t *testing.T) {
	cfg, err := conf.Parse("test.conf", threeStages)
	if err != nil {
		t.Fatal(err)
	}
	c := core.New(cfg)
	cmds := c.Step(epoch, core.Start{Life: 1})
	keep, reset, wake, claim := one[core.KeepHistory](t, cmds), one[core.ResetOrphans](t, cmds), one[core.Wake](t, cmds), one[core.Claim](t, cmds)
	capA := capsOf(claim)["a"]
	if capA < 2 {
		t.Fatalf("first claim %v: want a cap of at least 2 at stage a", claim)
	}
	cmds = c.Step(epoch,
		core.HistoryKept{Op: keep.Op, Through: keep.Through},
		core.OrphansReset{Op: reset.Op},
		core.Woken{Op: wake.Op},
		core.Claimed{Op: claim.Op, Epoch: "e1", Settled: 50, Rows: []core.Row{{ID: 7, Stage: "a"}}, More: []string{"a"}})
	again := one[core.Claim](t, cmds)
	var found bool
	for _, cp := range again.Caps {
		if cp.Stage != "a" {
			continue
		}
		found = true
		if cp.After > 7 {
			t.Errorf("claim %v looks at stage a above %d; want at most 7, the highest row taken (rows past the cap are pending)", again, cp.After)
		}
	}
	if !found {
		t.Errorf("claim %v leaves stage a out; want it claimed again: its last claim came back short but found more than its cap", again)
	}
}
