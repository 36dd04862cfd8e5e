package core

import "time"

// Snapshot is a copy of the dispatcher's live state, for metrics: what it
// holds in memory and nowhere else (the database knows the queue; only the
// core knows its workers). It shares nothing with the core.
type Snapshot struct {
	// At is the instant of the core's last Step.
	At time.Time
	// Stages has one entry per configured stage, sorted by name.
	Stages []StageSnapshot
	// DatabaseDown says the core is waiting for the database to come back.
	DatabaseDown bool
	// ShuttingDown says a shutdown has begun.
	ShuttingDown bool
}

// StageSnapshot is one stage's live state.
type StageSnapshot struct {
	Stage string
	// Starting, Ready and Stopping count the stage's worker processes by state:
	// spawned and not yet running, running (may be handed ids), and told to stop
	// or killed, not yet exited.
	Starting, Ready, Stopping int
	// InFlight counts the message ids handed to workers and not yet answered.
	InFlight int
	// Claimed counts messages claimed for the stage and not yet handed to a worker.
	Claimed int
	// Capacity is PARALLELISM × QUEUE_LIMIT: the most messages in flight at once.
	Capacity int
	// CooldownUntil, when after At, is when the stage may spawn workers again
	// after a program that could not start.
	CooldownUntil time.Time
	// MaxPending is the stage's MAX_PENDING (0 for none); OverMaxPending says
	// the last claim that checked it found more messages pending
	// (back-pressure, pressure.go).
	MaxPending     int64
	OverMaxPending bool
	// HeldBy names the stage whose back-pressure holds this one (a stage it
	// feeds that is over its MAX_PENDING); "" when none does.
	HeldBy string
}

// Snapshot returns a copy of the live state. It changes nothing.
func (c *Core) Snapshot() Snapshot {
	s := Snapshot{At: c.now, DatabaseDown: c.dbDown, ShuttingDown: c.shutdown > 0}
	s.Stages = make([]StageSnapshot, 0, len(c.stages))
	for _, st := range c.stages {
		ss := StageSnapshot{
			Stage:          st.cfg.Name,
			Claimed:        len(st.backlog),
			Capacity:       st.cfg.Parallelism * st.cfg.QueueLimit,
			CooldownUntil:  st.cooldownUntil,
			MaxPending:     st.cfg.MaxPending,
			OverMaxPending: st.pressure.over,
		}
		if t := c.heldBy(st); t != nil {
			ss.HeldBy = t.cfg.Name
		}
		for _, w := range st.workers {
			switch w.state {
			case starting:
				ss.Starting++
			case ready:
				ss.Ready++
			default:
				ss.Stopping++
			}
			ss.InFlight += len(w.queue)
		}
		s.Stages = append(s.Stages, ss)
	}
	return s
}
