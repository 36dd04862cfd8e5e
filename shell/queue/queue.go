// Package queue defines Executor, the one interface through which the
// dispatcher's queue commands reach a queue: PostgreSQL (shell/pgqueue) or the
// simulator's fake (sim). Both pass the same conformance suite (shell/queue/queuetest),
// so the simulator cannot drift from reality. This package holds no SQL and does
// no I/O itself.
package queue

import (
	"context"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Executor runs the queue commands of one core step.
type Executor interface {
	// Exec runs cmds (each one of core.ResetOrphans, core.Resolve, core.Wake,
	// core.Claim, core.Flush) in order in one transaction and returns one result
	// event per command, in the same order (core.OrphansReset, core.Resolved,
	// core.Woken, core.Claimed, core.Flushed), each with the same Op. If the
	// transaction fails, every result carries the error text: the caller cannot know
	// whether it committed, and the core is written for both.
	Exec(ctx context.Context, cmds []core.Command) []core.Event
}
