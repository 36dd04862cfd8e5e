package queuetest

import (
	"context"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Executor is the contract of a queue: what running one core step's queue
// commands does and answers. Two queues implement it, PostgreSQL
// (store) and the simulator's fake (sim/fakequeue), and this suite runs
// both through it, so the simulator cannot drift from reality.
//
// It is the suite's seam, not the dispatcher's: pepsi-dispatch
// (shell/dispatch) holds a *store.Queue, whose Ping, Inspect and Vacuum it
// needs too, and the simulator holds a *fakequeue.Queue; neither swaps one
// queue for the other, so it lives here, beside the suite that is its only user.
type Executor interface {
	// Exec runs cmds (each one of core.ResetOrphans, core.Resolve, core.Wake,
	// core.Claim, core.Flush) in order in one transaction and returns one result
	// event per command, in the same order (core.OrphansReset, core.Resolved,
	// core.Woken, core.Claimed, core.Flushed), each with the same Op. If the
	// transaction fails, every result carries the error text: the caller cannot know
	// whether it committed, and the core is written for both.
	Exec(ctx context.Context, cmds []core.Command) []core.Event
}
