// Package sim is the deterministic simulator of pepsi-dispatch: it runs the real
// core (package core, never a copy) against a fake world — the fake queue of
// sim/fakequeue, fake worker processes and a simulated clock — injects faults, and
// checks the dispatcher's invariants after every step.
//
// One seed (or one rapid draw) chooses the whole scenario: the pepsi.conf, the
// messages and what every stage does with each of them, and the fault schedule.
// Run plays it in two phases, VOPR style: a fault phase (failed and lost queue
// transactions, database outages and crashes, lost notifications, crashing,
// hanging and babbling workers, programs that cannot start, dispatcher crashes and
// shutdowns), then a healing phase with every fault off, in which every message
// must reach a final status within a bounded simulated time and the flushed
// statistics must equal what happened.
//
// Time is simulated: events wait in a queue ordered by (instant, sequence), and
// the driver hands everything due at one instant to one core.Step, as the shell
// does. Every random decision comes from the scenario's choices or from PCG
// sources derived from its seed; nothing reads the wall clock or the global
// random source, and no map is ranged over where order could leak, so the same
// seed always yields the same trace, byte for byte.
//
// The package must never reach into the core's internals, patch it or give it
// test-only hooks: the simulator sees only the events it feeds and the commands
// it gets back, like the shell. What it knows about the core's decisions it
// derives from those and from the documented thresholds (core.StartWindow,
// core.StartFailLimit, core.CooldownMin/Max, core.IdleFlushMin).
//
// What is exact and what is not (statistics). Each core life (from Start to Exit
// or to a dispatcher crash) has its own ground truth, counted from the fake
// world: passes answered 0 (fused stages credited to their own stage), the time
// of each answered pass as the core measures it (from when the message reached
// the head of its worker's pipeline, or from the DatabaseUp that ended an outage
// the core saw), worker crashes (protocol errors included, kills by the core
// excluded), rows this life's own resolves moved to failed or timeout (counted
// once the core has their outcome: a verdict whose reply was lost counts when the
// re-sent resolve reports it), and messages seen leaving. A life that ends with
// Exit 0 or is the one running at the end must have flushed exactly its truth; a
// life that crashed or exited 1 may have lost any part of its unflushed deltas.
// So the flushed totals must lie between the sum over the exact lives and the sum
// over all lives; with no dispatcher crash and no Exit 1 the two bounds meet and
// the check is equality. While a life runs, its flushes are also checked against
// its truth: none is empty, none is early (STATS_INTERVAL, or idle and at most
// once per core.IdleFlushMin), none is late (deltas left unflushed past those
// bounds with no transaction outstanding), and a re-sent flush is unchanged.
package sim
