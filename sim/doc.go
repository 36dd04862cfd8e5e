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
// The checker (check.go) holds the core to these rules. Each names when it is
// checked and which fault of the fake world makes it matter; make mutants plants
// at least one bug per rule (sim/mutants, named in brackets) and each must die.
//
// Invariants, checked at every command and after every step:
//   - Serial writes: no queue transaction while another is outstanding
//     [claim-while-txn-outstanding].
//   - Claims: none during a shutdown; never more than QUEUE_LIMIT × PARALLELISM
//     held per stage [capacity-off-by-one]; a claim's ids reach a worker only
//     after it committed, and only to a worker of the row's stage.
//   - Message lines: a worker of an INPUT = message stage is handed one line per
//     id and any other worker none; each line is the row as the queue holds it
//     when it is handed out (id, stage, attempts, state, payload), never a copy
//     from an earlier claim, before a retry or a requeue [stale-message-line].
//     The fake workers of such a stage read each message from its line.
//   - Never two holders: a claim never returns a row the core still holds (a
//     worker has it unanswered, or it is claimed or owed), whatever made it
//     pending meanwhile (an operator retrying it in flight) [claim-includes-held].
//   - No verdict from a stale answer: a resolve never writes a row that has been
//     claimed again since the claim its item was made for [claim-includes-held];
//     a row a resolve finds still running (a stage's commit landed while it
//     waited) stays held, owed the same item, and counts as a guard miss
//     [raced-item-dropped, raced-not-counted].
//   - Workers: at most PARALLELISM live per stage [parallelism-off-by-one]; at
//     most QUEUE_LIMIT unanswered ids each [queue-limit-off-by-one], MAX_MESSAGES
//     in a life; ids only to a ready worker; work packed onto the fewest workers
//     (the fullest worker with room gets the ids) [work-spread-not-packed]; a
//     spawn only when the claimed ids exceed what live and starting workers can
//     take [spawn-ignores-starting] and never during a cooldown [cooldown-ignored];
//     a stop outside a shutdown only of an idle worker past WORKER_IDLE_TIMEOUT
//     [reap-too-early] or of one that reached MAX_MESSAGES.
//   - Kills: the watchdog only after MAX_RUNTIME at the head, and never while the
//     core knows the database is down [watchdog-during-outage]; a stopped worker
//     only after STOP_GRACE.
//   - Resolve items: one per message the core stopped holding, with the verdict
//     the reference text gives (requeue, fail, timeout, answered with its claim's
//     epoch, or the move a stage answered, with its target, timeout and patch),
//     naming the stage it was claimed for, with a reason exactly when it fails
//     the message [wrong-item-stage, epoch-guard-dropped, timeout-head-failed,
//     move-*, unknown-target-written, unwritable-transition-written]. A verdict
//     applies only to the claim it was made for; a 0 whose stage committed (then
//     lost to a database crash) is never failed as a stage bug.
//   - Claim floors: a claim looks above each stage's floor (core.Cap.After)
//     only, and when it runs no row is pending at or below the floor, except a
//     row an operator retried that the core has not yet heard of (checked in the
//     fake queue, between the commands of the transaction)
//     [floor-ignores-settled, floor-kept-over-resolve, floor-kept-over-wake,
//     floor-kept-after-requeue, floor-kept-over-look, look-keeps-floors].
//   - Resets keep every row the core holds (but may drop rows whose resolve may
//     have applied) [reset-without-keep, reset-keeps-unsure-rows]; a wake never
//     takes a row before its timeout [wake-early] nor a row still handed out
//     [wake-takes-held-rows].
//   - Flushes are never empty, never early, re-sent unchanged, sequenced
//     [idle-flush-not-rate-limited, lost-flush-dropped].
//   - Exit 0 only when every worker is gone and nothing is held or owed, and no
//     row this core could know of is left running [exit-zero-before-reset].
//
// Obligations in the step (after the core's commands):
//   - Promptness: when a stage has pending rows the core was told of (a NOTIFY,
//     a wake or reset that moved rows, a requeue it resolved, the heartbeat, the
//     start, the database coming back) and has not since claimed the stage dry,
//     the stage has room, no transaction is outstanding, the database is up as
//     far as the core knows, no shutdown is under way and no cooldown applies,
//     the core claims for that stage in that step [ingress-during-claim-forgotten,
//     cooldown-kept-after-answer].
//   - Spawning: claimed ids that the ready and starting workers cannot take, with
//     room under PARALLELISM and no cooldown, get a worker in that step.
//   - Shutdown: after the first signal every worker, a starting one included, is
//     stopped or killed; after the second every one is killed
//     [shutdown-skips-starting, second-shutdown-spares-stopping].
//   - A protocol error (a line that is no status line, or a line while the worker
//     holds nothing) is acted on in that step: the worker is killed
//     [protocol-error-ignored, unsolicited-answer-ignored, protocol-error-not-killed].
//
// Deadlines, checked after every step and again whenever the clock moves on,
// before anything else happens at the new instant (so a core that forgot a timer
// is caught at the deadline it missed, not when it acts late at some unrelated
// event); the fake world hands the core a Tick only for the timer it asked for:
//   - a head unanswered past MAX_RUNTIME is killed [watchdog-timer-forgotten,
//     watchdog-never-fires]; a stopped worker gone or killed by STOP_GRACE
//     [grace-timer-forgotten]; an idle worker reaped by WORKER_IDLE_TIMEOUT
//     [reap-timer-forgotten]; a worker at MAX_MESSAGES recycled [never-recycled];
//   - a paused row the core knows of woken at its timeout [wake-timer-forgotten,
//     wake-only-on-heartbeat];
//   - statistics flushed by STATS_INTERVAL, or core.IdleFlushMin after going idle
//     [stats-timer-forgotten, idle-flush-timer-forgotten];
//   - what a spawn cooldown held back (a claim, a spawn) done when it ends
//     [cooldown-timer-forgotten].
//
// The gate (core.Rest, core.Busy), checked whenever the clock moves: no message
// waits for the heartbeat. Producers notify only while the dispatcher holds or
// asks for the gate; a row committed without a notification must be claimed,
// or its stage claimed, or the core must take the gate and look, within
// gateBound (500 ms) while its stage has room [never-rests, lost-gate-ignored];
// and the look after Resting is a promptness obligation like a NOTIFY
// [rest-without-last-look]. Producers commit at random points of the
// dispatcher's transition (transactions of 0 to 100 ms, holding the gate
// shared); gates fail to be taken, and held gates lose their connection.
//
// Liveness, after the heal phase: every message final within a bounded time
// (a late claim's orphans included [heartbeat-sweep-disabled]); and the
// statistics exact, below.
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
// the resolve waits on their row; status lines of every shape the grammar can
// recognise as an attempted patch (not an object, not JSON), and a bare
// "0 >paused"; pauses written with six decimals (zero included), and patches
// that fill a status line to its 64 KiB limit; cooldowns of workers that fail to start at one instant
// [cooldown-doubles-per-worker, patch-must-start-with-brace]; dispatcher
// crashes, graceful and double shutdowns, and lost locks, after which the next
// core is handed the old one's unflushed statistics (core.Start.Carry)
// [carry-dropped, carry-seq-ignored].
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
// the check is equality. A life that lost its lock counts as exact: what it had
// not flushed is carried to the next life, which must flush it (or, if that
// life crashes too, both become inexact). While a life runs, its flushes are also checked against
// its truth: none is empty, none is early (STATS_INTERVAL, or idle and at most
// once per core.IdleFlushMin), none is late (deltas left unflushed past those
// bounds with no transaction outstanding), and a re-sent flush is unchanged.
package sim
