// Back-pressure between stages: while a stage has more than its MAX_PENDING
// messages pending, the core claims nothing for the stages that feed it
// (docs/protocol.md, "Back-pressure between stages").

package core

import (
	"fmt"
	"slices"
	"strings"
)

// pressure is a stage's part in back-pressure.
type pressure struct {
	// feeds: the stages with a MAX_PENDING that this stage's passes sent
	// messages to since the core started (learnFeeder), in the order learned.
	feeds []*stage
	// fed: another stage feeds this one (it is in some stage's feeds).
	fed bool
	// over: the last claim that checked this stage's MAX_PENDING found more
	// messages pending there than that (Claimed.Over).
	over bool
}

// learnFeeder notes that a pass of stage from sent a message to stage to: an
// answered transition (0 >to), a stage's own advance to it seen in a resolve
// outcome, or an emitted message. From then on, while to has more than its
// MAX_PENDING messages pending, nothing is claimed for from. A stage feeding
// itself, or a stage with no MAX_PENDING, changes nothing.
func (c *Core) learnFeeder(from, to string) {
	f, t := c.byName[from], c.byName[to]
	if f == nil || t == nil || f == t || t.cfg.MaxPending <= 0 || slices.Contains(f.pressure.feeds, t) {
		return
	}
	f.pressure.feeds = append(f.pressure.feeds, t)
	t.pressure.fed = true
	c.logf(LevelInfo, "stage %s feeds stage %s: no message is claimed for %s while %s has more than its MAX_PENDING %d pending",
		from, to, from, to, t.cfg.MaxPending)
}

// heldBy is the stage whose back-pressure holds st (one it feeds that has
// more than its MAX_PENDING messages pending), or nil when none does. A stage
// over its own MAX_PENDING is never held, so a cycle of stages cannot stop
// (it drains into the stages it feeds); nor is one during a shutdown, which
// claims nothing anyway.
func (c *Core) heldBy(st *stage) *stage {
	if c.shutdown > 0 || st.pressure.over {
		return nil
	}
	for _, t := range st.pressure.feeds {
		if t.pressure.over {
			return t
		}
	}
	return nil
}

// limits are the MAX_PENDING a Claim sent after txn checks (Claim.Limits):
// those of the stages that take part in back-pressure, as a stage fed by
// another or as a feeder (whose own limit exempts it from being held), each
// counted above the floor its claim would look above (claimAfter), and less
// what waits for the stage beside its pending rows (waiting; -1 at the
// least: then the stage is over whatever is pending).
func (c *Core) limits(txn []Command) []Limit {
	var out []Limit
	for _, st := range c.stages {
		if st.cfg.MaxPending > 0 && (st.pressure.fed || len(st.pressure.feeds) > 0) {
			out = append(out, Limit{Stage: st.cfg.Name, Max: max(-1, st.cfg.MaxPending-st.waiting()), After: c.claimAfter(st, txn)})
		}
	}
	return out
}

// waiting counts the messages claimed for st that wait for it as its
// pending ones do while none of its workers has answered since the latest
// round of failed starts (cooldownStep, cooldownAt: a stage whose workers
// answer drains, whatever its new ones do), so they count against its
// MAX_PENDING then: its backlog, what its workers that have not answered
// hold, all of which a failed start gives back pending, and the rows that
// the outstanding resolves' moves and emits claim there (reserved), which
// join its backlog only with their outcomes: a claim's count runs after its
// own transaction's resolve and finds them running, not pending, so without
// them a feeder's message moved on into the stage freed the feeder for one
// more. Were they not counted, a stage whose program cannot start would take
// itself under its limit at every try, freeing its feeders for one more
// claim each time, and its queue would grow without bound while it cannot
// run. A stage known to start is counted by its pending rows alone: the
// backlog its starting workers take is theirs in a moment.
func (st *stage) waiting() int64 {
	if !st.unproven() {
		return 0
	}
	n := len(st.backlog) + st.reserved
	for _, w := range st.workers {
		if w.answered == 0 {
			n += len(w.queue)
		}
	}
	return int64(n)
}

// unproven reports whether none of st's workers has answered since its
// latest round of failed starts (cooldownStep, cooldownAt): what is claimed
// for it waits for it then as its pending rows do (waiting).
func (st *stage) unproven() bool {
	return st.cooldownStep > 0 && !st.answeredAt.After(st.cooldownAt)
}

// pendingText is how a stage over its MAX_PENDING is said to be: with what
// waits for it beside its pending rows, when that counts (waiting).
func (st *stage) pendingText() string {
	if st.waiting() > 0 {
		return fmt.Sprintf("has more than its MAX_PENDING %d messages pending or waiting for a worker while none of its workers can start", st.cfg.MaxPending)
	}
	return fmt.Sprintf("has more than its MAX_PENDING %d messages pending", st.cfg.MaxPending)
}

// holds are the Claim.Holds of a claim that checks limits: every stage that
// feeds a stage with a MAX_PENDING, with that stage.
func (c *Core) holds() []Hold {
	var out []Hold
	for _, st := range c.stages {
		for _, t := range st.pressure.feeds {
			out = append(out, Hold{Stage: st.cfg.Name, By: t.cfg.Name})
		}
	}
	return out
}

// anyOver reports whether some stage was over its MAX_PENDING at its last
// check.
func (c *Core) anyOver() bool {
	return slices.ContainsFunc(c.stages, func(st *stage) bool { return st.pressure.over })
}

// checkedLimits takes in what a claim found of the limits it checked, and
// logs each stage that crossed its MAX_PENDING, either way, with the stages
// its crossing holds or frees. rows are the rows the claim took.
//
// A claim that took rows of an unproven stage over its limit does not show
// it back within: the count runs after the claim, so it misses them, and
// the core holds them (waiting) only from now on, though they wait for the
// stage as they did pending. Trusted, it freed the stage's feeders for a
// step after each failed start whose requeued rows a worker still alive
// took back, or each cooldown's new try. The stage stays over, and the
// next step checks again (checkDue), counting them.
func (c *Core) checkedLimits(limits []Limit, over []string, rows []Row) {
	for _, l := range limits {
		t := c.byName[l.Stage]
		now := slices.Contains(over, l.Stage)
		if now == t.pressure.over {
			continue
		}
		if !now && t.unproven() && slices.ContainsFunc(rows, func(r Row) bool { return r.Stage == l.Stage }) {
			c.checkDue = true
			continue
		}
		t.pressure.over = now
		var feeders []string
		for _, f := range c.stages {
			if slices.Contains(f.pressure.feeds, t) {
				feeders = append(feeders, f.cfg.Name)
			}
		}
		if now {
			c.logf(LevelInfo, "stage %s %s: claims held for the stages that feed it (%s)",
				l.Stage, t.pendingText(), strings.Join(feeders, ", "))
		} else {
			c.logf(LevelInfo, "stage %s is back within its MAX_PENDING %d: claims resume for the stages that feed it (%s)",
				l.Stage, t.cfg.MaxPending, strings.Join(feeders, ", "))
		}
	}
}
