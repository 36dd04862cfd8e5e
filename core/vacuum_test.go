package core_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Feature (PEPSI's own): the dispatcher keeps pepsi.queue vacuumed.

func healthy(op int64, dead int64) core.Inspected {
	return core.Inspected{Op: op, Dead: dead, Live: 1000, Autovacuum: true}
}

// Proves: the queue is inspected at start and then every InspectInterval, each
// inspect under an op of its own.
func TestTheQueueIsInspectedEveryInspectInterval(t *testing.T) {
	w := newWorld(t, threeStages)
	first := one[core.Inspect](t, w.start("a", 0))
	w.step(healthy(first.Op, 0))
	cmds := w.tick(core.InspectInterval - time.Millisecond)
	none[core.Inspect](t, cmds, "no inspect before InspectInterval")
	cmds = w.tick(core.InspectInterval)
	if got := one[core.Inspect](t, cmds); got.Op == first.Op {
		t.Fatalf("the second inspect reuses op %d", got.Op)
	}
}

// Proves: dead rows at VacuumDeadMin or more are vacuumed, fewer are not, and
// while a vacuum runs no second one starts, however many dead rows an inspect
// finds; once it is done the next inspect may start one.
func TestDeadRowsPastTheThresholdAreVacuumedOnceAtATime(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	none[core.Vacuum](t, w.step(healthy(in.Op, core.VacuumDeadMin-1)), "below the threshold nothing is vacuumed")
	in = one[core.Inspect](t, w.tick(core.InspectInterval))
	v := one[core.Vacuum](t, w.step(healthy(in.Op, core.VacuumDeadMin)))
	// While it runs, another inspect finds even more dead rows: no second vacuum.
	in = one[core.Inspect](t, w.tick(2*core.InspectInterval))
	none[core.Vacuum](t, w.step(healthy(in.Op, 3*core.VacuumDeadMin)), "one vacuum at a time")
	w.step(core.Vacuumed{Op: v.Op})
	in = one[core.Inspect](t, w.tick(3*core.InspectInterval))
	one[core.Vacuum](t, w.step(healthy(in.Op, 3*core.VacuumDeadMin)))
}

// Proves: no vacuum starts while another (autovacuum's, or a DBA's) is
// vacuuming the queue.
func TestNoVacuumWhileAnotherRuns(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	busy := healthy(in.Op, 5*core.VacuumDeadMin)
	busy.Vacuuming = true
	none[core.Vacuum](t, w.step(busy), "autovacuum (or a DBA) is vacuuming the queue already")
}

// Proves: with VACUUM = off the core never vacuums, and warns that nothing of
// its own removes the dead rows.
func TestNoVacuumWhenTurnedOff(t *testing.T) {
	off := newWorld(t, "[pepsi-dispatch]\nVACUUM = off\n[stage-a]\nPROGRAM = a\n")
	in := one[core.Inspect](t, off.start("a", 0))
	cmds := off.step(core.Inspected{Op: in.Op, Dead: 9 * core.VacuumDeadMin})
	none[core.Vacuum](t, cmds, "VACUUM = off leaves vacuuming to the operator")
	if !logged(cmds, "VACUUM = off") {
		t.Errorf("no warning that nothing removes dead rows:\n%s", list(cmds))
	}
}

// Proves: autovacuum turned off and a horizon held back (by an idle
// transaction) are each logged once, not at every inspect; a horizon that moves
// on and is held back again is said again.
func TestAutovacuumOffAndAHeldBackHorizonAreSaidOnce(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	ev := core.Inspected{Op: in.Op, Dead: 10, HorizonAge: core.HorizonAgeWarn, Horizon: "pid 42 (idle in transaction)"}
	cmds := w.step(ev)
	if !logged(cmds, "autovacuum is off") || !logged(cmds, "pid 42") {
		t.Fatalf("want warnings about autovacuum and the horizon:\n%s", list(cmds))
	}
	in = one[core.Inspect](t, w.tick(core.InspectInterval))
	ev.Op = in.Op
	none[core.Log](t, w.step(ev), "each warning is said once")
	// The horizon moves on, then is held back again: said again.
	in = one[core.Inspect](t, w.tick(2*core.InspectInterval))
	w.step(core.Inspected{Op: in.Op})
	in = one[core.Inspect](t, w.tick(3*core.InspectInterval))
	ev.Op = in.Op
	if cmds := w.step(ev); !logged(cmds, "pid 42") || logged(cmds, "autovacuum is off") {
		t.Errorf("want the horizon said again, autovacuum not:\n%s", list(cmds))
	}
}

// Proves: once the dispatcher is shutting down, no vacuum starts, whatever an
// inspect finds.
func TestNoInspectOrVacuumDuringShutdown(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	w.step(core.Shutdown{})
	none[core.Vacuum](t, w.step(healthy(in.Op, 9*core.VacuumDeadMin)), "no vacuum once shutting down")
}

func logged(cmds []core.Command, part string) bool {
	for _, l := range of[core.Log](cmds) {
		if strings.Contains(l.Msg, part) {
			return true
		}
	}
	return false
}

// Proves: the inspect asks about the configured stages, and messages pending at
// a stage no one runs are logged with the stage and their count, once per
// POLL_INTERVAL, not at every inspect.
func TestPendingMessagesOfAStageNobodyRunsAreSaidOncePerHeartbeat(t *testing.T) {
	w := newWorld(t, threeStages) // POLL_INTERVAL 30 s
	in := one[core.Inspect](t, w.start("a", 0))
	if got := strings.Join(in.Run, ","); got != "a,b,c" {
		t.Fatalf("inspect asks about stages %q; want the configured a,b,c", got)
	}
	ghost := func(op int64) core.Inspected {
		return core.Inspected{Op: op, Autovacuum: true, Unrun: []core.StageCount{{Stage: "ghost", N: 7}}}
	}
	if cmds := w.step(ghost(in.Op)); !logged(cmds, `7 messages are pending at stage 'ghost'`) {
		t.Fatalf("want a warning naming the stage and the count:\n%s", list(cmds))
	}
	in = one[core.Inspect](t, w.tick(core.InspectInterval))
	if cmds := w.step(ghost(in.Op)); logged(cmds, "ghost") {
		t.Errorf("said again before POLL_INTERVAL:\n%s", list(cmds))
	}
	in = one[core.Inspect](t, w.tick(30*time.Second))
	if cmds := w.step(ghost(in.Op)); !logged(cmds, "ghost") {
		t.Errorf("not said again after POLL_INTERVAL:\n%s", list(cmds))
	}
}
