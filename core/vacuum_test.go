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

// grown is a healthy inspection of a queue of pages whose statistics were
// taken at planned pages.
func grown(op, pages, planned int64) core.Inspected {
	in := healthy(op, 0)
	in.Pages, in.PlannedPages = pages, planned
	return in
}

// Proves: a queue that has more than doubled since its statistics were taken
// (the size its sessions' plans were made for), and is at least
// AnalyzePagesMin, is analyzed (a Vacuum with Analyze), once at a time, and
// said in the log; one that has not, or is smaller, is not.
func TestAQueueThatOutgrewItsStatisticsIsAnalyzed(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	none[core.Vacuum](t, w.step(grown(in.Op, core.AnalyzePagesMin-1, 0)), "a queue below AnalyzePagesMin is not analyzed")
	in = one[core.Inspect](t, w.tick(core.InspectInterval))
	cmds := w.step(grown(in.Op, 5000, 0))
	if v := one[core.Vacuum](t, cmds); v.Kind != core.AnalyzeOnly {
		t.Fatalf("%v: want an analyze of a queue of 5,000 pages planned empty", v)
	}
	if !logged(cmds, "analyzing it") {
		t.Errorf("the analyze is not said:\n%s", list(cmds))
	}
	in = one[core.Inspect](t, w.tick(2*core.InspectInterval))
	none[core.Vacuum](t, w.step(grown(in.Op, 5000, 0)), "one analyze at a time")
	w.step(core.Vacuumed{Op: one[core.Vacuum](t, cmds).Op})
	in = one[core.Inspect](t, w.tick(3*core.InspectInterval))
	none[core.Vacuum](t, w.step(grown(in.Op, 10000, 5000)), "a queue twice its statistics' size, not more")
	in = one[core.Inspect](t, w.tick(4*core.InspectInterval))
	if v := one[core.Vacuum](t, w.step(grown(in.Op, 10001, 5000))); v.Kind != core.AnalyzeOnly {
		t.Errorf("%v: want an analyze of a queue past twice its statistics' size", v)
	}
	if !core.OutgrewPlans(grown(0, core.AnalyzePagesMin, 0)) || core.OutgrewPlans(grown(0, core.AnalyzePagesMin-1, 0)) {
		t.Errorf("a queue never analyzed calls for an analyze from %d pages: OutgrewPlans says otherwise", core.AnalyzePagesMin)
	}
}

// Proves: when dead rows call for a vacuum and the queue has outgrown its
// statistics, one VACUUM (ANALYZE) does both.
func TestAVacuumAndAnAnalyzeDueAreOne(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	ev := grown(in.Op, 5000, 0)
	ev.Dead = core.VacuumDeadMin
	if v := one[core.Vacuum](t, w.step(ev)); v.Kind != core.VacuumAnalyze {
		t.Errorf("%v: want a vacuum that analyzes too where dead rows call for one", v)
	}
}

// Proves: with VACUUM = off the core analyzes nothing either.
func TestNoAnalyzeWhenVacuumIsOff(t *testing.T) {
	off := newWorld(t, "[pepsi-dispatch]\nVACUUM = off\n[stage-a]\nPROGRAM = a\n")
	in := one[core.Inspect](t, off.start("a", 0))
	none[core.Vacuum](t, off.step(grown(in.Op, 50000, 0)), "VACUUM = off leaves the statistics to the operator")
}

// Proves: when the claims report InspectGrowth rows added since the last
// inspection, and as many as the live rows it found (the queue may have
// doubled), the next comes InspectGrowthInterval after it, not
// InspectInterval, and the one after that InspectInterval later again; fewer
// rows, or a queue that many rows do not double, wait for InspectInterval.
func TestRowsAddedSinceTheLastInspectionCallForTheNextSooner(t *testing.T) {
	for _, c := range []struct {
		name        string
		live, added int64
		next        time.Duration
	}{
		{"fewer", 1000, core.InspectGrowth - 1, core.InspectInterval},
		{"enough", 1000, core.InspectGrowth, core.InspectGrowthInterval},
		{"not-double", 3 * core.InspectGrowth, 2 * core.InspectGrowth, core.InspectInterval},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, threeStages)
			in := one[core.Inspect](t, w.start("a", 0))
			first := healthy(in.Op, 0)
			first.Live = c.live
			w.step(first)
			w.q.Insert("a", int(c.added))
			w.step(core.Ingress{})
			none[core.Inspect](t, w.tick(c.next-time.Millisecond), "no inspection before it is due")
			got := of[core.Inspect](w.tick(c.next))
			if len(got) != 1 {
				t.Fatalf("%d rows added beside %d live: %d inspections %s after the last; want 1", c.added, c.live, len(got), c.next)
			}
			// No rows since: the next waits InspectInterval again.
			w.step(healthy(got[0].Op, 0))
			none[core.Inspect](t, w.tick(c.next+core.InspectInterval-time.Millisecond), "no inspection before InspectInterval again")
			if n := len(of[core.Inspect](w.tick(c.next + core.InspectInterval))); n != 1 {
				t.Errorf("%d inspections InspectInterval after the early one; want 1", n)
			}
		})
	}
}

// Proves: the rows that call an inspection forward are those added since the
// start, not the queue's ids before it: a dispatcher started on a queue whose
// newest id is past InspectGrowth (a queue that has run a while, its rows
// finished) inspects it again InspectInterval after the first look, not
// InspectGrowthInterval. (Its first Inspect goes out before any claim has
// reported how far ingress settled; the first claim that does sets the
// baseline.)
func TestTheQueuesIDsBeforeTheStartCallNoInspectionForward(t *testing.T) {
	w := newWorld(t, threeStages)
	w.q.Insert("z", 3*core.InspectGrowth) // a stage this dispatcher does not run: never claimed
	in := one[core.Inspect](t, w.start("a", 0))
	w.step(healthy(in.Op, 0))
	none[core.Inspect](t, w.tick(core.InspectInterval-time.Millisecond), "no inspection forward for the rows there before the start")
	if n := len(of[core.Inspect](w.tick(core.InspectInterval))); n != 1 {
		t.Errorf("%d inspections InspectInterval after the first; want 1", n)
	}
}

// Proves: when the inspection says the dispatcher's role may not vacuum the
// queue (PostgreSQL would skip a vacuum or an analyze with a mere warning),
// the core says so once and sends neither, whatever the dead rows and the
// queue's growth; once it may, the vacuum due is sent.
func TestARoleThatMayNotVacuumTheQueueIsSaidOnceAndNothingIsSent(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	ev := grown(in.Op, 5000, 0)
	ev.Dead, ev.NotOwner = 9*core.VacuumDeadMin, true
	cmds := w.step(ev)
	none[core.Vacuum](t, cmds, "the role may not vacuum the queue")
	if !logged(cmds, "may not vacuum or analyze pepsi.queue") {
		t.Errorf("no warning that the role may not vacuum the queue:\n%s", list(cmds))
	}
	in = one[core.Inspect](t, w.tick(core.InspectInterval))
	ev.Op = in.Op
	cmds = w.step(ev)
	none[core.Vacuum](t, cmds, "the role may still not vacuum the queue")
	if logged(cmds, "may not vacuum") {
		t.Errorf("the warning is said again:\n%s", list(cmds))
	}
	in = one[core.Inspect](t, w.tick(2*core.InspectInterval))
	ev.Op, ev.NotOwner = in.Op, false
	if v := one[core.Vacuum](t, w.step(ev)); v.Kind != core.VacuumAnalyze {
		t.Errorf("%v: once the role may, want the vacuum and the analyze due", v)
	}
}

// Proves: an analyze taken while a long load was uncommitted counted its
// pages but not its rows; once the rows are live, more than twice those the
// statistics hold (and AnalyzeRowsMin or more), the queue is analyzed again,
// though its pages have not grown.
func TestAQueueWhoseRowsOutgrewItsStatisticsIsAnalyzed(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	ev := grown(in.Op, 5000, 5000)
	ev.Live, ev.PlannedRows = core.AnalyzeRowsMin-1, 0
	none[core.Vacuum](t, w.step(ev), "fewer live rows than AnalyzeRowsMin")
	in = one[core.Inspect](t, w.tick(core.InspectInterval))
	ev.Op, ev.Live, ev.PlannedRows = in.Op, 100000, 50000
	none[core.Vacuum](t, w.step(ev), "twice the rows the statistics hold, not more")
	in = one[core.Inspect](t, w.tick(2*core.InspectInterval))
	ev.Op, ev.PlannedRows = in.Op, 0
	if v := one[core.Vacuum](t, w.step(ev)); v.Kind != core.AnalyzeOnly {
		t.Errorf("%v: want an analyze of 100,000 live rows whose statistics hold none", v)
	}
}

// Proves: with autovacuum off and a role that may not vacuum the queue, the
// warning about autovacuum does not promise that pepsi-dispatch vacuums the
// queue itself: it says that nothing removes the dead rows.
func TestAutovacuumOffUnderARoleThatMayNotVacuumPromisesNoVacuum(t *testing.T) {
	w := newWorld(t, threeStages)
	in := one[core.Inspect](t, w.start("a", 0))
	ev := healthy(in.Op, 100)
	ev.Autovacuum, ev.NotOwner = false, true
	cmds := w.step(ev)
	if logged(cmds, "vacuums it itself") {
		t.Errorf("the warning promises a vacuum the role may not run:\n%s", list(cmds))
	}
	if !logged(cmds, "may not vacuum it: nothing removes its dead rows") {
		t.Errorf("no warning that nothing removes the dead rows:\n%s", list(cmds))
	}
}
