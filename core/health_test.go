package core_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// healthOf is stage's entry in the core's Health.
func healthOf(t *testing.T, w *world, stage string) core.StageHealth {
	t.Helper()
	for _, h := range w.c.Health() {
		if h.Stage == stage {
			return h
		}
	}
	t.Fatalf("no health for stage %s in %v", stage, w.c.Health())
	return core.StageHealth{}
}

// Proves: a stage whose program cannot be run is cannot_start, with the
// spawn's error, the cooldown and its end, for as long as its starts fail
// (the cooldown's end moving with each); the first answer makes it ok, and
// the other stages stay ok throughout.
func TestHealthOfAProgramThatCannotStart(t *testing.T) {
	w := newWorld(t, threeStages)
	w.noAutoStart = true
	sp := one[core.Spawn](t, w.start("b", 1))
	if h := healthOf(t, w, "b"); h.State != core.HealthOK {
		t.Errorf("before any start failed: %+v, want ok", h)
	}
	w.step(core.SpawnFailed{Worker: sp.Worker, Err: `exec: "b": executable file not found in $PATH`})
	h := healthOf(t, w, "b")
	if h.State != core.HealthCannotStart || !h.Until.Equal(epoch.Add(core.CooldownMin)) ||
		!strings.Contains(h.Reason, `exec: "b": executable file not found in $PATH`) || !strings.Contains(h.Reason, "held back 1s") {
		t.Errorf("after a failed spawn: %+v, want cannot_start until %s with the error and the cooldown", h, core.CooldownMin)
	}
	for _, other := range []string{"a", "c"} {
		if h := healthOf(t, w, other); h.State != core.HealthOK || h.Reason != "" {
			t.Errorf("stage %s: %+v, want ok", other, h)
		}
	}
	sp = one[core.Spawn](t, w.tick(core.CooldownMin))
	w.step(core.SpawnFailed{Worker: sp.Worker, Err: "fork/exec /bin/b: permission denied"})
	if h := healthOf(t, w, "b"); h.State != core.HealthCannotStart || !h.Until.Equal(epoch.Add(3*core.CooldownMin)) ||
		!strings.Contains(h.Reason, "permission denied") || !strings.Contains(h.Reason, "held back 2s") {
		t.Errorf("after a second failed spawn: %+v, want cannot_start until %s with the last error", h, 3*core.CooldownMin)
	}
	w.noAutoStart = false
	sp = one[core.Spawn](t, w.tick(3*core.CooldownMin))
	if h := healthOf(t, w, "b"); h.State != core.HealthCannotStart {
		t.Errorf("started, nothing answered yet: %+v, want still cannot_start", h)
	}
	w.finish(sp.Worker)
	if h := healthOf(t, w, "b"); h.State != core.HealthOK || h.Reason != "" || !h.Until.IsZero() {
		t.Errorf("after an answer: %+v, want ok", h)
	}
}

// Proves: a worker that exits at start having answered nothing makes its
// stage cannot_start with how it exited.
func TestHealthOfAWorkerThatExitsAtStart(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("b", 1)
	w.at(time.Second)
	w.exit(1, 2, "")
	if h := healthOf(t, w, "b"); h.State != core.HealthCannotStart ||
		!strings.Contains(h.Reason, "cannot start: program 'b': worker pid 1001 exited (exit status 2) before answering anything") {
		t.Errorf("after a worker exited at start: %+v, want cannot_start with its exit status", h)
	}
}

// Proves: CrashingAfter worker crashes in a row at a stage, with no answer
// between, make it crashing with the last crash; fewer do not; an answer
// makes it ok again.
func TestHealthOfAStageWhoseWorkersKeepCrashing(t *testing.T) {
	w := newWorld(t, threeStages)
	cmds := w.start("b", 6)
	wid := one[core.Spawn](t, cmds).Worker
	for i := 1; i <= core.CrashingAfter; i++ {
		if h := healthOf(t, w, "b"); h.State != core.HealthOK {
			t.Fatalf("after %d crashes: %+v, want ok", i-1, h)
		}
		w.at(time.Duration(i) * 2 * core.StartWindow) // past the start window: a crash, not a failed start
		cmds = w.exit(wid, 0, "KILL")
		if i < core.CrashingAfter {
			wid = one[core.Spawn](t, cmds).Worker
		}
	}
	h := healthOf(t, w, "b")
	if h.State != core.HealthCrashing || !strings.Contains(h.Reason, "3 workers crashed in a row") || !strings.Contains(h.Reason, "signal KILL") {
		t.Errorf("after %d crashes in a row: %+v, want crashing with the last crash", core.CrashingAfter, h)
	}
	wid = one[core.Spawn](t, cmds).Worker
	w.finish(wid)
	if h := healthOf(t, w, "b"); h.State != core.HealthOK {
		t.Errorf("after an answer: %+v, want ok", h)
	}
}

// Proves: a stage whose RATE holds back messages it has room for is
// rate_held, steadily while its backlog lasts (not only between tokens), and
// ok once it has claimed them all.
func TestHealthOfAStageHeldByItsRate(t *testing.T) {
	w := newWorld(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = a
RATE = 2
PARALLELISM = 4
QUEUE_LIMIT = 16
`)
	w.start("a", 4)
	for w.now.Sub(epoch) < 1900*time.Millisecond {
		if h := healthOf(t, w, "a"); h.State != core.HealthRateHeld || !strings.Contains(h.Reason, "RATE 2/s") {
			t.Fatalf("at %s, 4 rows at RATE 2: %+v, want rate_held", w.now.Sub(epoch), h)
		}
		w.tick(lastTimer(t, w.all).Sub(epoch))
	}
	for w.now.Sub(epoch) < 3*time.Second {
		w.tick(lastTimer(t, w.all).Sub(epoch))
	}
	if h := healthOf(t, w, "a"); h.State != core.HealthOK {
		t.Errorf("every row claimed: %+v, want ok", h)
	}
}

// Proves: a stage whose program the shell found it cannot run at start-up is
// cannot_start before any message needs a worker (one log line, not green),
// its program is checked again every ProgramCheckEvery while it cannot be
// run, and a check that passes makes it ok again.
func TestHealthOfAProgramThatCannotBeRunBeforeAnyMessage(t *testing.T) {
	w := newWorld(t, threeStages)
	cmds := w.step(core.Start{Unrunnable: []core.ProgramChecked{{Stage: "b", Err: "program 'b' not found on PATH"}}})
	if l := one[core.Log](t, cmds); l.Level != core.LevelError || !strings.Contains(l.Msg, "stage b: cannot start b: program 'b' not found on PATH") {
		t.Errorf("log %+v, want one error naming the stage and why", l)
	}
	if h := healthOf(t, w, "b"); h.State != core.HealthCannotStart || !strings.Contains(h.Reason, "not found on PATH") {
		t.Errorf("health of b %+v, want cannot_start with the check's error", h)
	}
	if h := healthOf(t, w, "a"); h.State != core.HealthOK {
		t.Errorf("health of a %+v, want ok", h)
	}
	none[core.CheckProgram](t, w.tick(core.ProgramCheckEvery-time.Second), "checked again early")
	if c := one[core.CheckProgram](t, w.tick(core.ProgramCheckEvery)); c.Stage != "b" {
		t.Errorf("checked %q, want b", c.Stage)
	}
	none[core.Log](t, w.step(core.ProgramChecked{Stage: "b", Err: "program 'b' not found on PATH"}), "logged a failed check again")
	one[core.CheckProgram](t, w.tick(2*core.ProgramCheckEvery))
	if l := one[core.Log](t, w.step(core.ProgramChecked{Stage: "b"})); !strings.Contains(l.Msg, "stage b: its program 'b' can be run now") {
		t.Errorf("log %+v, want the program found", l)
	}
	if h := healthOf(t, w, "b"); h.State != core.HealthOK {
		t.Errorf("health of b after a check passed %+v, want ok", h)
	}
	none[core.CheckProgram](t, w.tick(4*core.ProgramCheckEvery), "checked a program that can be run")
}

// Proves: a worker of the stage that starts ends what the start-up check
// found: the stage is ok and its program is not checked again.
func TestAWorkerThatStartsEndsAFailedProgramCheck(t *testing.T) {
	w := newWorld(t, threeStages)
	w.q.Insert("a", 1)
	w.step(core.Start{Unrunnable: []core.ProgramChecked{{Stage: "a", Err: "program 'a' is not executable"}}})
	if h := healthOf(t, w, "a"); h.State != core.HealthOK {
		t.Errorf("health of a after its worker started %+v, want ok", h)
	}
	none[core.CheckProgram](t, w.tick(2*core.ProgramCheckEvery), "checked a program whose worker started")
}

// Proves: a rated stage with no rows, claimed at a notification, is not
// rate_held while that claim is out (its tokens went to it; it waits for its
// result, not for a token), and counts no rate-held time for it.
func TestAnEmptyRatedStageWaitingForItsClaimIsNotHeld(t *testing.T) {
	w := newWorld(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
STATS_INTERVAL = 1
[stage-a]
PROGRAM = a
RATE = 2
PARALLELISM = 4
QUEUE_LIMIT = 16
`)
	w.start("a", 0)
	for w.now.Sub(epoch) < 3*time.Second { // its first token, and a claim that finds nothing
		w.tick(lastTimer(t, w.all).Sub(epoch))
	}
	held := func() (us int64) {
		for _, f := range of[core.Flush](w.all) {
			for _, d := range f.Stages {
				us += d.RateHeldUS
			}
		}
		return us
	}
	before := held()
	w.at(5 * time.Second)
	w.deferTxns = true
	w.step(core.Ingress{}) // a producer's notification: the claim waits
	if h := healthOf(t, w, "a"); h.State != core.HealthOK {
		t.Errorf("an empty rated stage whose claim is out: %+v, want ok", h)
	}
	w.at(5*time.Second + 300*time.Millisecond)
	w.deferTxns = false
	w.drain()
	if h := healthOf(t, w, "a"); h.State != core.HealthOK {
		t.Errorf("an empty rated stage after its claim found nothing: %+v, want ok", h)
	}
	for w.now.Sub(epoch) < 8*time.Second {
		w.tick(lastTimer(t, w.all).Sub(epoch))
	}
	if d := held() - before; d != 0 {
		t.Errorf("flushed %d µs held by its rate while an empty stage's claim was out, want none", d)
	}
}
