package core_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Feature: a message the dispatcher holds is never claimed again, whatever
// moved its row, and a stale answer writes nothing on a newer pass.

// Proves: a row an operator retries while its worker still holds it (the stage
// wrote failed itself and has not answered yet) is excluded from every claim,
// so no second worker gets it; the late bare 0 then writes nothing (no stage-bug
// failure), and the row is claimed again only after that answer.
func TestARowRetriedWhileItsWorkerHoldsItIsNotClaimedUntilTheAnswer(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 1) // w1 holds 1
	if !w.q.StageWrite(1, "a", "a", core.StatusFailed, time.Time{}) {
		t.Fatal("stage write failed")
	}
	w.q.RetryAll(func(int64) bool { return false }) // pepsi-queue retry
	w.wantRow(1, "a", core.StatusPending)
	cmds := w.step(core.Ingress{})
	claim := one[core.Claim](t, cmds)
	if !slices.Contains(claim.Exclude, 1) {
		t.Fatalf("claim %v does not exclude row 1, which w1 holds", claim)
	}
	none[core.Write](t, cmds, "row 1 is held by w1")
	w.wantRow(1, "a", core.StatusPending)

	// The stale answer: the stage finished the message (as failed) and says so.
	cmds = w.answer(1, "", "", "0")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Answered {
		t.Fatalf("item %v, want the bare 0's answered item", it)
	}
	if r := w.row(1); r.DispatchError != "" {
		t.Fatalf("the stale answer wrote a verdict: dispatch_error %q", r.DispatchError)
	}
	// Now that w1 is done with it, the retried row runs again, once.
	if got := w.held[1]; !slices.Equal(got, []int64{1}) {
		t.Fatalf("after its answer the retried row is not handed out again: w1 holds %v\n%s", got, list(cmds))
	}
	w.finish(1)
	w.wantRow(1, "a", core.StatusDone)
}

// Proves: a claim excludes rows claimed and not yet handed out, and rows handed
// to a worker that is neither answered nor exited; not rows already answered.
func TestClaimsExcludeWhatTheCoreHolds(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2) // w1 holds 1, 2
	cmds := w.finish(1)
	claim := one[core.Claim](t, cmds)
	if !slices.Equal(claim.Exclude, []int64{2}) {
		t.Fatalf("claim %v: want exclude=[2] (w1 still holds 2; 1 was answered)", claim)
	}
}

// Proves: a resolve that reads its row back still running (a stage's commit
// landed while the resolve's UPDATE waited on the row, so it wrote nothing)
// does not stop the dispatcher: it is logged, counted as a guard miss, the row
// stays held (kept and excluded) and is resolved again against the committed row.
func TestARowStillRunningAfterItsResolveIsResolvedAgain(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2) // w1 holds 1, 2
	// w1 is killed for MAX_RUNTIME while its commit of 1 (to done) is on its
	// way to the server; the commit lands while the resolve waits on the row.
	w.tick(300 * time.Second)
	w.q.CommitDuringResolve(1, func() { w.q.StageWrite(1, "a", "a", core.StatusDone, time.Time{}) })
	cmds := w.exit(1, -1, "killed")
	if it := itemFor(t, cmds, 1); it.Verdict != core.TimeOut {
		t.Fatalf("item %v, want the head timed out", it)
	}
	logged := false
	for _, l := range of[core.Log](cmds) {
		logged = logged || strings.Contains(l.Msg, "changed while its resolve wrote it")
	}
	if !logged {
		t.Errorf("no log line for the row that changed under its resolve:\n%s", list(cmds))
	}
	resolves := of[core.Resolve](cmds)
	if len(resolves) != 2 || !slices.ContainsFunc(resolves[1].Items, func(it core.Item) bool { return it.ID == 1 && it.Verdict == core.TimeOut }) {
		t.Fatalf("want the item resolved again in the next transaction:\n%s", list(cmds))
	}
	for _, wr := range of[core.Write](cmds) {
		if slices.Contains(wr.IDs, 1) {
			t.Fatalf("row 1 handed out again while still owed:\n%s", list(cmds))
		}
	}
	w.wantRow(1, "a", core.StatusDone) // the stage's commit stands; no timeout written over it
	flushAll(w)
	if stages, _, left, _ := w.q.Stats(); stages["a"].GuardMisses != 1 || left != 1 || stages["a"].Timeouts != 0 {
		t.Errorf("stats %+v, left %d: want one guard miss, no timeout, one message left", stages["a"], left)
	}
}

// Proves: workers of one stage that fail to start at the same instant are one
// failed start: the cooldown doubles once (both say "next try in 1s", not 1s
// then 2s), and the next failed start, later, doubles it.
func TestCooldownDoublesOncePerInstantNotOncePerWorker(t *testing.T) {
	w := newWorld(t, threeStages)
	w.noAutoStart = true
	cmds := w.start("a", 6) // PARALLELISM 2: two spawns
	spawns := of[core.Spawn](cmds)
	if len(spawns) != 2 {
		t.Fatalf("want two spawns, got:\n%s", list(cmds))
	}
	cmds = w.step(core.SpawnFailed{Worker: spawns[0].Worker, Err: "not found"}, core.SpawnFailed{Worker: spawns[1].Worker, Err: "not found"})
	tries := 0
	for _, l := range of[core.Log](cmds) {
		if strings.Contains(l.Msg, "cannot start") {
			tries++
			if !strings.HasSuffix(l.Msg, "next try in 1s") {
				t.Errorf("log %q: two failed starts at one instant must both say 1s", l.Msg)
			}
		}
	}
	if tries != 2 {
		t.Fatalf("%d cannot-start lines, want 2:\n%s", tries, list(cmds))
	}
	cmds = w.tick(core.CooldownMin)
	spawns = of[core.Spawn](cmds)
	if len(spawns) == 0 {
		t.Fatalf("no spawn when the 1s cooldown ended:\n%s", list(cmds))
	}
	cmds = w.step(core.SpawnFailed{Worker: spawns[0].Worker, Err: "not found"})
	if l := one[core.Log](t, cmds); !strings.HasSuffix(l.Msg, "next try in 2s") {
		t.Errorf("log %q: the next failed start doubles the cooldown to 2s", l.Msg)
	}
}

// Proves: workers started in one round that exit before answering at
// different instants (a program that starts and exits at once, on a bad
// config, exits from each worker a little apart) are one failed start: the
// cooldown doubles once ("next start in 1s" from each, not 1s, 2s then 4s),
// each holding the stage back a second from its own exit. Workers spawned
// after the cooldown, a new try, double it once more, as a round too.
func TestCooldownDoublesOncePerRoundOfStartsNotOncePerExit(t *testing.T) {
	w := newWorld(t, threeStages)
	round := workersOf(w.start("c", 3)) // PARALLELISM 3, QUEUE_LIMIT 1: three workers
	if len(round) != 3 {
		t.Fatalf("want three workers spawned, got %v", round)
	}
	wantNext := func(cmds []core.Command, step string) {
		t.Helper()
		l := one[core.Log](t, cmds)
		if !strings.Contains(l.Msg, "before answering anything") || !strings.HasSuffix(l.Msg, "next start in "+step) {
			t.Errorf("log %q, want a failed start with the next start in %s", l.Msg, step)
		}
	}
	for i, wid := range round {
		w.at(100*time.Millisecond + time.Duration(i)*time.Millisecond)
		wantNext(w.exit(wid, 1, ""), "1s")
	}
	last := epoch.Add(102 * time.Millisecond)
	if h := healthOf(t, w, "c"); h.State != core.HealthCannotStart || !h.Until.Equal(last.Add(core.CooldownMin)) {
		t.Errorf("health %+v, want cannot_start until %s, a second after the last exit", h, core.CooldownMin)
	}
	cmds := w.tick(time.Second + 101*time.Millisecond)
	if spawns := of[core.Spawn](cmds); len(spawns) != 0 {
		t.Fatalf("spawned before the last exit's second had passed:\n%s", list(cmds))
	}
	cmds = w.tick(time.Second + 102*time.Millisecond)
	round = workersOf(cmds)
	if len(round) != 3 {
		t.Fatalf("want three workers spawned when the cooldown ended, got:\n%s", list(cmds))
	}
	w.at(time.Second + 200*time.Millisecond)
	wantNext(w.exit(round[0], 1, ""), "2s")
	w.at(time.Second + 201*time.Millisecond)
	wantNext(w.exit(round[1], 1, ""), "2s")
}
