// Stage health: what a stage's workers are doing that an operator must see
// and that only the core knows (a program that cannot start, workers that
// keep crashing, a stage held by its RATE or by back-pressure). The shell
// records it where pepsi-httpd and pepsi-queue stats read it; the decision
// is taken here.

package core

import (
	"fmt"
	"time"
)

// HealthState is what a stage's workers are doing, as an operator sees it.
// Its text is what the shell records (pepsi.stage_health.state).
type HealthState string

// The health states, worst first: a stage is in the first that holds.
const (
	// HealthCannotStart: the stage's last worker start failed (its program
	// could not be run, or exited within StartWindow having answered
	// nothing), and no worker has answered since. Its spawns are held back
	// by the cooldown, and its messages wait pending. Or, before any
	// message needed a worker, the check of its program found it cannot be
	// run (program.go).
	HealthCannotStart HealthState = "cannot_start"
	// HealthCrashing: CrashingAfter or more of the stage's workers in a row
	// crashed (died unexpectedly, or broke the protocol) with no answer
	// between.
	HealthCrashing HealthState = "crashing"
	// HealthPressureHeld: nothing is claimed for the stage because a stage
	// it feeds has more than its MAX_PENDING messages pending
	// (back-pressure, core/pressure.go); its messages wait pending until
	// that stage is back within its limit. Not a fault of its own; the
	// reason names the stage and its limit.
	HealthPressureHeld HealthState = "pressure_held"
	// HealthRateHeld: at the core's last step the stage had messages to
	// claim and room for them, but its RATE had no token: the rate, not the
	// workers, sets its pace. Not a fault; an operator wants to know.
	HealthRateHeld HealthState = "rate_held"
	// HealthOK: none of the above.
	HealthOK HealthState = "ok"
)

// CrashingAfter is how many worker crashes in a row, with no answer between,
// make a stage HealthCrashing. One crash is a message's bad luck (the message
// is failed); three in a row is a stage that does not work.
const CrashingAfter = 3

// StageHealth is one stage's health at the core's last step. It is
// comparable: the shell records it again only when it changes.
type StageHealth struct {
	Stage string
	State HealthState
	// Reason says in one line why the stage is in its state, for the page
	// and pepsi-queue stats: the last failed start's error and the cooldown
	// (HealthCannotStart), the crashes and the last one (HealthCrashing);
	// empty for HealthOK.
	Reason string
	// Until, for HealthCannotStart, is when the cooldown ends: when the
	// stage may start a worker again.
	Until time.Time
}

// Health returns every stage's health at the last step, in name order. It
// changes nothing.
func (c *Core) Health() []StageHealth {
	out := make([]StageHealth, 0, len(c.stages))
	for _, st := range c.stages {
		h := StageHealth{Stage: st.cfg.Name, State: HealthOK}
		switch {
		case st.cooldownStep > 0:
			h.State, h.Until = HealthCannotStart, st.cooldownUntil
			h.Reason = fmt.Sprintf("cannot start: %s; starts held back %s after each failure", st.startErr, st.cooldownStep)
		case st.programErr != "":
			h.State = HealthCannotStart
			h.Reason = fmt.Sprintf("cannot start: %s (no message has needed a worker yet; checked again every %s)", st.programErr, ProgramCheckEvery)
		case st.crashRun >= CrashingAfter:
			h.State = HealthCrashing
			h.Reason = fmt.Sprintf("%d workers crashed in a row with no answer between; last: %s", st.crashRun, st.crashErr)
		case c.heldBy(st) != nil:
			t := c.heldBy(st)
			h.State = HealthPressureHeld
			h.Reason = fmt.Sprintf("held by back-pressure: stage %s, which it feeds, %s", t.cfg.Name, t.pendingText())
		case st.rate != nil && !st.rate.heldSince.IsZero():
			h.State = HealthRateHeld
			h.Reason = fmt.Sprintf("held by its RATE %g/s: it has messages to claim and room for them, but no token", st.cfg.Rate)
		}
		out = append(out, h)
	}
	return out
}
