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
// # The rules
//
// The checker (check.go) holds the core to named rules (rules.go, listed by
// pepsi-sim -rules): each has a name, the moment it is checked (at each
// command, event or row change, after each step, at each deadline, at the
// end) and its doc, which says what it asks. A violation prints the name of the
// rule it broke ("rule promptness: ..."), and every mutant of make mutants
// (sim/mutants) names the rule that must kill it. Deadlines are checked after
// every step and again whenever the clock moves on, before anything else
// happens at the new instant, so a core that forgot a timer is caught at the
// deadline it missed, not when it acts late at some unrelated event; the fake
// world hands the core a Tick only for the timer it asked for.
//
// # The fake world's faults
//
// Queue transactions that fail before taking effect, take effect and lose their
// reply, hit 40001, or (claims only) lose their reply and commit up to 3 s later,
// after the core moved on, leaving orphans only the heartbeat's reset finds;
// outages and PostgreSQL crashes (losing asynchronous stage commits and the
// crash sentinel); lost notifications; workers that crash before or after
// committing, hang, babble (a malformed line, or a valid line while they hold
// nothing), stall at start, are reported started late (so the core sees them
// starting, and may stop or kill them then), or cannot start; stages that answer
// their transitions (with patches, pauses and fused stages), answer one the
// dispatcher cannot write, or both write and answer (a guard miss); producers
// that take their row's id when they insert and commit up to 100 ms later (rows
// appear out of id order, behind ids a claim already took); an operator who
// retries every failed message the dispatcher has seen fail (pepsi-queue retry,
// whose NOTIFY may be lost like any other), and one who retries in a loop the
// messages a stage failed while its worker still holds them (stages that answer
// up to a second after their commit); commits of killed workers that land while
// the resolve waits on their row, and of stages that answer a transition and
// also write one of their own (before the answer: a guard miss; or while the
// resolve of the answer waits on the row); status lines of every shape the grammar can
// recognise as an attempted patch (not an object, not JSON), and a bare
// "0 >paused"; pauses written with six decimals (zero included), pauses of the
// largest length allowed (paused:315360000, ten years), which an operator then
// ends by hand, stages that answer themselves as the target ("0 >a" at stage
// a), and patches that fill a status line to its 64 KiB limit; cooldowns of workers that fail to
// start at one instant; dispatcher crashes, graceful and double shutdowns, and
// lost locks, after which the next core is handed the old one's unflushed
// statistics (core.Start.Carry).
//
// What is exact and what is not (statistics) is rule statistics-exact's doc;
// while a life runs, its flushes are also held to rules flush-not-empty,
// flush-not-early, flush-not-late and flush-sequenced.
package sim
