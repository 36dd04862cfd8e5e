// Statistics: the deltas counted since the last flush, and when to flush them.

package core

import (
	"slices"
)

// Unflushed returns the statistics this core counted but cannot know were
// written: a flush outstanding or whose result was lost (with its Life and Seq),
// and the deltas not yet sent (Seq 0). The shell hands them to the next core's
// Start when it must start over after losing the lock, so a lost lock does not
// lose counts.
func (c *Core) Unflushed() []Flush {
	var out []Flush
	for _, t := range c.txns {
		for _, cmd := range t.cmds {
			if f, ok := cmd.(Flush); ok {
				out = append(out, f)
			}
		}
	}
	out = append(out, c.resendFlushes...)
	if c.hasDeltas() {
		out = append(out, c.deltas())
	}
	return out
}

// addFlush adds a flush's figures to the deltas not yet sent.
func (c *Core) addFlush(f Flush) {
	c.passes += f.StagePasses
	c.left += f.MessagesLeft
	for _, d := range f.Stages {
		c.stat(d.Stage).Add(d)
	}
}

func (c *Core) stat(name string) *StageDelta {
	d := c.stats[name]
	if d == nil {
		d = &StageDelta{Stage: name}
		c.stats[name] = d
	}
	return d
}

func (c *Core) idle() bool {
	if len(c.owed) > 0 || len(c.outstandingItems()) > 0 {
		return false
	}
	for _, st := range c.stages {
		if len(st.backlog) > 0 {
			return false
		}
		for _, w := range st.workers {
			if len(w.queue) > 0 {
				return false
			}
		}
	}
	return true
}

func (c *Core) hasDeltas() bool {
	if c.passes != 0 || c.left != 0 {
		return true
	}
	for _, d := range c.stats {
		if !d.zero() {
			return true
		}
	}
	return false
}

// flushDue returns the statistics flush to send now, if any: an unsure one again, or
// the deltas when STATS_INTERVAL has passed, when the pipeline went idle (at most
// once a second), at once after a shutdown request (its workers may take
// STOP_GRACE to finish, and a second request exits without writing) and at
// the end of a shutdown. Never an empty one.
func (c *Core) flushDue(idle bool) (Flush, bool) {
	if !c.resetDone {
		return Flush{}, false
	}
	if len(c.resendFlushes) > 0 {
		f := c.resendFlushes[0]
		c.resendFlushes = c.resendFlushes[1:]
		return f, true
	}
	if !c.hasDeltas() {
		return Flush{}, false
	}
	due := !c.now.Before(c.lastFlush.Add(c.cfg.StatsInterval))
	if idle && !c.now.Before(c.lastFlush.Add(IdleFlushMin)) {
		due = true
	}
	if c.shutdown > 0 && (!c.shutdownFlushed || len(c.workers) == 0 && idle) {
		due = true
	}
	if !due {
		return Flush{}, false
	}
	if c.shutdown > 0 {
		c.shutdownFlushed = true
	}
	f := c.deltas()
	c.flushSeq++
	f.Life, f.Seq = c.life, c.flushSeq
	clear(c.stats)
	c.passes, c.left = 0, 0
	c.lastFlush = c.now
	return f, true
}

// deltas returns the counts not yet sent as a Flush without Op and Seq, stages in
// name order.
func (c *Core) deltas() Flush {
	f := Flush{StagePasses: c.passes, MessagesLeft: c.left}
	names := make([]string, 0, len(c.stats))
	for name, d := range c.stats {
		if !d.zero() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		f.Stages = append(f.Stages, *c.stats[name])
	}
	return f
}
