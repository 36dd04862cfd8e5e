package sim

import (
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
)

// rule is one thing the checker holds the core to: a name, printed with every
// violation of it and named by each mutant (sim/mutants) meant to break it; its
// doc, which says what it asks; when it is checked; and its check, the one
// function that judges it, which checkAt runs at each of its moments with what
// crosses the boundary then. The hooks of check.go and ledger.go judge nothing
// themselves: they say what crossed and keep the ledger. A rule that must
// re-derive a decision of the core (promptness needs a stage's room, the
// cooldown rule the doubling cooldown, rule rate the bucket, retry-backoff the
// delay) owns that derivation, and says why it is its own. Rule world-consistent
// alone has no check: the fake world raises it wherever it meets what it
// cannot reach if the core is right.
type rule struct {
	name  string
	doc   string
	when  moment
	check func(*world, *rule, crossing)
}

// crossing is what crosses the boundary at the moment a rule is checked; the
// fields of other moments are empty, and a rule's check ignores a crossing
// that is not its business.
type crossing struct {
	cmd      core.Command      // atCommand: the command, before the world runs it
	step     []core.Command    // atCommand, atTransaction: every command of the step
	took     *took             // atEvent: a row a claim's result or a move that claims hands the core
	rated    *int              // atEvent: the stage with a RATE whose claim's result just came
	change   *fakequeue.Change // atChange: a row the fake queue changed
	claimRun *claimRun         // atChange: a claim of the core's transaction the fake queue is about to run
	overdue  bool              // atEnd: the heal phase's deadline passed before every message was final
}

// took is a row the core takes in: returned by what (a claim, or a move that
// claims) with its attempts.
type took struct {
	what     string
	id       int64
	attempts int
}

// claimRun is a claim the fake queue runs, when its transaction was sent,
// and what the release before it in the transaction answered.
type claimRun struct {
	claim core.Claim
	sent  time.Time
	heads []core.Head // the key heads a release of the same transaction reported before it
	busy  []string    // the keys such a release found busy
	// unclaimed: the keys of the same transaction's moves that were to claim
	// and found an older message of their key unfinished: their outcomes owe
	// the keys a release, which reports the head.
	unclaimed []string
	// beside: the items of other transactions applied after its own was
	// sent: rows it may pass over below its floors.
	beside []int64
}

// moment is when a rule is checked: one or more of these.
type moment int

const (
	atCommand     moment = 1 << iota // as the core issues a command, before the world runs it
	atTransaction                    // once a step's commands are recorded, over its queue transaction, before the world runs it
	atEvent                          // as the world hands the core an event
	atChange                         // as the fake queue changes a row (or is about to run a claim)
	afterStep                        // after every step, from the step's own commands
	atDeadline                       // after every step and whenever the clock moves on, before anything happens at the new instant
	atEnd                            // once, after the heal phase, when everything is quiescent
)

var momentNames = [...]string{"at each command", "at each step's transaction", "at each event", "at each row change", "after each step", "at each deadline", "at the end"}

func (m moment) String() string {
	var names []string
	for i, name := range momentNames {
		if m&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	return strings.Join(names, " and ")
}

// Rule is one rule of the checker, as pepsi-sim -rules lists it.
type Rule struct {
	Name string // as violations print it and mutants name it
	When string // when it is checked
	Doc  string // what it asks
}

// Rules lists every rule the checker holds the core to, in the order they are
// documented.
func Rules() []Rule {
	out := make([]Rule, 0, len(rules))
	for _, r := range rules {
		out = append(out, Rule{Name: r.name, When: r.when.String(), Doc: r.doc})
	}
	return out
}

// broke fails the run by rule r.
func (w *world) broke(r *rule, format string, args ...any) {
	if w.fail != nil {
		return
	}
	w.failf("rule "+r.name+": "+format, args...)
	w.fail.Rule = r.name
}

// checkAt runs the check of every rule of moment m, in order, with what
// crossed, until one fails.
func (w *world) checkAt(m moment, x crossing) {
	for _, r := range rules {
		if r.when&m == 0 || r.check == nil {
			continue
		}
		if r.check(w, r, x); w.fail != nil {
			return
		}
	}
}

// rules is every rule, in the order they are documented; checkAt runs the
// checks of each moment in this order.
var rules = []*rule{
	// At each command (rule rate also at each claim's result, and the rules of
	// the rows a claim hands the core at each event).
	ruleSerialWrites, ruleClaimBounds, ruleClaimYieldsHalf, ruleResetAfterLoss, ruleRate, ruleClaimReadsRow, ruleNeverTwoHolders, ruleKeyHeldOnce,
	ruleHandToReady, ruleKeyOnePerPipeline, ruleWorkPacked, ruleMessageLines, ruleHandClaimed, ruleQueueLimit,
	ruleCooldown, ruleSpawnNeeded, ruleParallelism, ruleReapIdle, ruleKillLive, ruleStopGrace,
	ruleWatchdog, ruleChildrenOnce, ruleItemForHeld, ruleItemStage, ruleItemVerdict, ruleItemTransition, rulePauseDueExact,
	ruleRetryBackoff, ruleItemEpoch, ruleItemReason, ruleHistoryItem, ruleKeyWaitPaced, ruleMoveClaims, ruleMovesClaimOldestFirst, ruleMovesLeaveALookSlot, ruleResetKeepsHeld, ruleWakeNotEarly,
	rulePressureHolds,
	ruleFlushNotEmpty, ruleFlushSequenced, ruleFlushNotEarly, ruleInspect, ruleVacuumCalledFor,
	ruleExit,
	// At each row change.
	ruleClaimFloor, ruleOnlyClaimRuns, ruleKeyOldestFirst, ruleAttempts, ruleWakeKeepsHanded, ruleNoStaleVerdict, ruleEpochGuard,
	// After each step.
	ruleVacuumWhenDue, ruleProtocolErrorKills, ruleShutdownStops, ruleStageCapacity,
	ruleSpawnWhenNeeded, rulePressureOnlyWhileOver, rulePromptness,
	// At each deadline.
	ruleInspectDue, ruleGate, ruleFlushNotLate, ruleWakeDue, ruleStopGraceDue,
	ruleWatchdogDue, ruleRecycleDue, ruleReapDue, ruleRateTokenDue, ruleCooldownEndDue,
	// At the end.
	ruleKeyNotStranded, rulePressureNeverStops, ruleLiveness, ruleStatisticsExact, ruleHistoryOnce,
	// Whenever the world meets what it cannot reach if the core is right.
	ruleWorldConsistent,
}

var ruleSerialWrites = &rule{name: "serial-writes", when: atCommand, check: (*world).serialWrites,
	doc: "At most SESSIONS queue transactions are outstanding (with one, the core's writes are serial, one batch at a time); " +
		"one issued beside others carries no reset and no history upkeep (each goes alone), no second claim, wake, release or flush, and no row of an outstanding resolve."}

var ruleClaimBounds = &rule{name: "claim-bounds", when: atCommand, check: (*world).claimBounds,
	doc: "No claim during a shutdown, and no claim that would make a stage hold more than QUEUE_LIMIT × PARALLELISM messages (claimed, handed out and unanswered), " +
		"counting what the outstanding claim and the outstanding moves that claim may add."}

var ruleResetAfterLoss = &rule{name: "reset-after-loss", when: atTransaction, check: (*world).resetAfterLoss,
	doc: "After a transaction whose reply was lost (not known to have aborted) and whose claim, or a move or an emit of its resolve that claims, may have left rows running that the core never learned of, " +
		"the core's next queue transaction resets every running row it does not hold (core.ResetOrphans): such rows wait for no heartbeat's sweep."}

var ruleClaimYieldsHalf = &rule{name: "claim-yields-at-most-half", when: atTransaction, check: (*world).claimYieldsHalf,
	doc: "A queue transaction asks each stage it claims, and each stage the promptness rule owes a claim, for at least half (rounded up) of the stage's room " +
		"less the moves of the transaction that claim there, within its RATE: a stage yields slots to its own moves that found no room at their target, " +
		"never more than half, so no stage starves behind a full one. The room is rule promptness's."}

var ruleRate = &rule{name: "rate", when: atCommand | atEvent, check: (*world).rate,
	doc: "A claim at a stage with a RATE asks for no more rows than the bucket holds tokens (a token every 1/RATE s, at most max(1, RATE) of them, a claim counted from its result), " +
		"and in every window ending at the latest claim at most RATE × T + max(1, RATE) rows were claimed, however the database timed each claim between its sending and its result. " +
		"The bucket is replayed here over the claims the world saw (rateFull), from the core's interval and burst (core.RateInterval, core.RateBurst: pure functions of RATE alone), " +
		"not read from the core's own bucket: a bug in its bookkeeping would pass a check that asked it. The window bound is checked at each claim's result as well."}

var ruleNeverTwoHolders = &rule{name: "never-two-holders", when: atEvent, check: (*world).neverTwoHolders,
	doc: "A claim never returns a row the core still holds (a worker has it unanswered, or it is claimed or owed a resolve), " +
		"whatever made it pending meanwhile: an operator retrying it in flight, a stage's late commit."}

var ruleClaimReadsRow = &rule{name: "claim-reads-the-row", when: atEvent, check: (*world).claimReadsRow,
	doc: "A claim returns each row with the attempts the row has: the retry limit counts from them."}

var ruleMessageLines = &rule{name: "message-lines", when: atCommand, check: (*world).messageLines,
	doc: "A worker of an INPUT = message stage is handed one line per id and any other worker none; each line is the row as the queue holds it when it is handed out " +
		"(id, stage, attempts, state, payload), never a copy from an earlier claim, before a retry or a requeue. The fake workers of such a stage read each message from its line."}

var ruleHandClaimed = &rule{name: "hand-claimed-rows", when: atCommand, check: (*world).handClaimed,
	doc: "Ids reach a worker only after their claim committed, only to a worker of the row's stage, and only ids the core claimed and has not handed out."}

var ruleHandToReady = &rule{name: "hand-to-ready", when: atCommand, check: (*world).handToReady,
	doc: "Ids go only to a live worker that is ready (started, neither stopped nor killed), and not to a probe (a worker spawned while nothing showed its program starts) before it has lived core.StartWindow."}

var ruleWorkPacked = &rule{name: "work-packed", when: atCommand, check: (*world).workPacked,
	doc: "Work is packed onto the fewest workers: the fullest worker of the stage with room gets the ids."}

var ruleQueueLimit = &rule{name: "queue-limit", when: atCommand, check: (*world).queueLimit,
	doc: "A worker holds at most QUEUE_LIMIT unanswered ids, and is handed at most MAX_MESSAGES in its life."}

var ruleSpawnNeeded = &rule{name: "spawn-only-when-needed", when: atCommand, check: (*world).spawnNeeded,
	doc: "A worker is spawned only outside a shutdown, with a fresh id, and only when the stage's claimed ids exceed what its live and starting workers can take."}

var ruleCooldown = &rule{name: "cooldown", when: atCommand, check: (*world).cooldown,
	doc: "No spawn during a stage's cooldown: after a failed start the stage waits core.CooldownMin, doubling with each failed start up to core.CooldownMax, " +
		"once for all the workers started in one round (spawned before it last doubled), whenever each fails; the first answer of a worker spawned no earlier than the failed start that began it ends it, and an older worker's once it has run out with no worker spawned since the last failed start alive."}

var ruleParallelism = &rule{name: "parallelism", when: atCommand, check: (*world).parallelism,
	doc: "At most PARALLELISM live workers per stage, checked at each spawn and after each step."}

var ruleReapIdle = &rule{name: "reap-only-idle", when: atCommand, check: (*world).reapIdle,
	doc: "Outside a shutdown a worker is stopped only when it reached MAX_MESSAGES, or when it is ready, holds nothing and has been idle for WORKER_IDLE_TIMEOUT."}

var ruleKillLive = &rule{name: "commands-for-live-workers", when: atCommand, check: (*world).killLive,
	doc: "Stops and kills name a worker that is alive (a kill decided on a line that came in the same batch as the worker's exit excepted)."}

var ruleStopGrace = &rule{name: "stop-grace", when: atCommand, check: (*world).stopGrace,
	doc: "A stopped worker is killed only after STOP_GRACE."}

var ruleWatchdog = &rule{name: "watchdog", when: atCommand, check: (*world).watchdog,
	doc: "The watchdog kills a worker only when its head has run its stage's MAX_RUNTIME (the stage's own, or else the dispatcher's; timed from when it reached the head, or from the DatabaseUp that ended an outage the core saw), " +
		"and never while the core knows the database is down: no stage can commit then."}

var ruleItemForHeld = &rule{name: "item-for-held", when: atCommand, check: (*world).itemForHeld,
	doc: "A resolve item names a message the core stopped holding (its worker answered or died) or a claimed row no worker has seen, given back: " +
		"never one a worker still has unanswered."}

var ruleKeyWaitPaced = &rule{name: "key-wait-paced", when: atCommand, check: (*world).keyWaitPaced,
	doc: "A resolve item whose last send wrote nothing because a child's order key was locked by a producer in flight (core.Outcome.KeyBusy) is sent again " +
		"no sooner than LookEvery after that result: the dispatcher does not spin on a producer's lock."}

var ruleMoveClaims = &rule{name: "move-claims", when: atCommand, check: (*world).moveClaims,
	doc: "A resolve item claims its row at its target (a move that claims, core.Item.Claim) only for a transition a stage answered to a stage this dispatcher runs, " +
		"never past rows the core knows may be pending there (claims go in ingress_id order): not when it was told rows may be pending at the target and has not since claimed it dry, " +
		"not beside a requeue to the target, not while an outstanding transaction may make rows pending there, not past rows its own resolves left pending there unless a claim of the stage follows in its transaction, " +
		"and not for a row whose earlier resolve may have moved it " +
		"(a lost reply, a racing commit). Its room is rule claim-bounds's, a RATE's stage rule rate's, and the line it hands out rule message-lines's."}

var ruleMovesClaimOldestFirst = &rule{name: "move-claims-oldest-first", when: atCommand, check: (*world).movesClaimOldestFirst,
	doc: "When a stage's room runs out among the moves of one resolve to it, the moves that claim are the oldest (lowest ingress_id), whatever order their answers came in: " +
		"a move that claims never overtakes a move to the same target in the same resolve that does not. The fake world has the workers of a stage answer out of ingress_id order " +
		"into a target with little room in one scenario in four."}

var ruleItemStage = &rule{name: "item-stage", when: atCommand, check: (*world).itemStage,
	doc: "A resolve item names the stage its message was claimed for: the guard of the write depends on it."}

var ruleItemVerdict = &rule{name: "item-verdict", when: atCommand, check: (*world).itemVerdict,
	doc: "A resolve item carries the verdict the reference text gives: requeue, fail, timeout (the watchdog's head), answered (a 0), retry (a 75 under RETRY_LIMIT) or move (an answered transition). " +
		"A worker's head is failed on a crash or a protocol error and timed out by the watchdog; what is behind it is requeued; " +
		"a last line without a newline is an answer only if the worker ended by itself, and dropped if it was killed; " +
		"a head of core.StartFailLimit failed starts in a row fails if a worker of the stage spawned no earlier than the first showed its program starts (it answered, a probe lived core.StartWindow), " +
		"else it is requeued and the stage's next workers are probes; other ids of a worker that could not start are requeued."}

var ruleItemTransition = &rule{name: "item-transition", when: atCommand, check: (*world).itemTransition,
	doc: "An answered transition is written as the stage answered it: its target and its patch (the timeout of a pause is rule pause-due-exact's). " +
		"No other item carries a transition."}

var rulePauseDueExact = &rule{name: "pause-due-exact", when: atCommand, check: (*world).pauseDueExact,
	doc: "An answered pause is written due at the clock when its answer was read plus exactly the SECONDS answered, to the microsecond a status line carries: " +
		"neither rounded (to whole seconds, to milliseconds) nor dropped. The fake world draws pauses of a fraction of a second, and of whole seconds and a fraction, " +
		"in one scenario in four (and rule wake-due then holds the wake to that due time)."}

var ruleRetryBackoff = &rule{name: "retry-backoff", when: atCommand, check: (*world).retryBackoff,
	doc: "A retry is due RETRY_DELAY × 2^attempts (capped at RETRY_DELAY_MAX) plus a jitter of 0 to core.RetryJitter of that after its answer; " +
		"the 75 that finds attempts = RETRY_LIMIT fails. The delay is derived here from pepsi.conf(5)'s formula (retryDelay), not by the core's function: " +
		"a bug in that function would pass a check that called it."}

var ruleItemEpoch = &rule{name: "item-epoch", when: atCommand, check: (*world).itemEpoch,
	doc: "An item for a message answered 0 carries the epoch of its claim, so that a 0 whose stage committed and then lost it to a database crash is run again, not failed; no other item carries one."}

var ruleItemReason = &rule{name: "item-reason", when: atCommand, check: (*world).itemReason,
	doc: "An item has a reason exactly when it fails the message (or may, for an answered 0), and a worker's non-zero answer's reason is the item's."}

var ruleResetKeepsHeld = &rule{name: "reset-keeps-held", when: atCommand, check: (*world).resetKeepsHeld,
	doc: "The start-up orphan reset keeps nothing; later resets keep every row the core holds, " +
		"except rows whose resolve may have been applied (a lost reply), which may be reset or kept."}

var ruleWakeNotEarly = &rule{name: "wake-not-early", when: atCommand, check: (*world).wakeNotEarly,
	doc: "A wake takes only paused rows due by now."}

var ruleFlushNotEmpty = &rule{name: "flush-not-empty", when: atCommand, check: (*world).flushNotEmpty,
	doc: "A statistics flush is never empty and carries no empty stage delta."}

var ruleFlushSequenced = &rule{name: "flush-sequenced", when: atCommand, check: (*world).flushSequenced,
	doc: "A flush names its core life and carries the sequence of that life's last applied flush or the next; one re-sent under the same sequence is unchanged; " +
		"a flush of another life is only one carried over a lost lock, sent again unchanged."}

var ruleFlushNotEarly = &rule{name: "flush-not-early", when: atCommand, check: (*world).flushNotEarly,
	doc: "A new flush comes STATS_INTERVAL after the last, or when the core holds nothing at most once per core.IdleFlushMin, or once at a shutdown request (what was counted before it), or at a shutdown's end."}

var ruleInspect = &rule{name: "inspect-serial", when: atCommand, check: (*world).inspectSerial,
	doc: "An inspection of the queue's health is not asked for while another is outstanding, nor during a shutdown, nor sooner than core.InspectInterval after the core's last " +
		"unless its claims reported core.InspectGrowth rows added since, and as many as the last inspection's live rows; never sooner than core.InspectGrowthInterval. " +
		"Rows added count from the last inspection, or from the life's first claim result when that inspection went out before any: not the ids the queue handed out before the dispatcher started."}

var ruleVacuumCalledFor = &rule{name: "vacuum-only-when-called-for", when: atCommand, check: (*world).vacuumCalledFor,
	doc: "A vacuum only when VACUUM is on, none of the core's runs, no shutdown is under way, the last inspection called for one " +
		"(dead row versions past core.VacuumDeadMin, no vacuum running, the role may vacuum the queue) and core.VacuumIntervalMin has passed since the last; " +
		"an analyze likewise, where the inspection found the queue outgrew the size its statistics were taken at (more than twice, in pages from core.AnalyzePagesMin or in live rows from core.AnalyzeRowsMin), " +
		"and where both are called for one VACUUM (ANALYZE): exactly what the inspection calls for."}

var ruleExit = &rule{name: "exit", when: atCommand, check: (*world).exit,
	doc: "The core exits only when every worker is gone; exit 1 only after a second shutdown request; exit 0 only when nothing is held or owed " +
		"and no row this core could know of is left running (a lost claim's rows reset first)."}

var ruleClaimFloor = &rule{name: "claim-floor", when: atChange, check: (*world).claimFloor,
	doc: "A claim looks above each stage's floor (core.Cap.After) only, and when it runs no row is pending at or below the floor at its stage, " +
		"except a row an operator retried that the core has not yet heard of, a row it holds, a row a transaction sent after the claim's resolved, " +
		"or a keyed row the claim may not take or whose key's release is still owed (found busy, or a move of the key in the claim's own transaction was to claim and found an older message unfinished). Checked in the fake queue, between the commands of the transaction."}

var ruleOnlyClaimRuns = &rule{name: "only-claim-runs", when: atChange, check: (*world).onlyClaimRuns,
	doc: "Only the dispatcher's claim moves a row from pending to running (but for the fault of a stray tool that does, fakequeue.Stray, whose row the heartbeat's sweep must reset)."}

var ruleAttempts = &rule{name: "attempts", when: atChange, check: (*world).attempts,
	doc: "A row's attempts grow only by one, by a resolve that pauses it for a retry, which names the stage they count at (attempts_stage); " +
		"a row the dispatcher makes pending or running (a claim, a requeue, a move, the orphan reset; a wake or a release makes one pending where it was paused or blocked, which is where its retry was) has attempts 0 at any other stage. " +
		"Only a stage program's own move to another stage may keep them, until the dispatcher's next write of the row (schema 27: no trigger does it); " +
		"a claim, a reset, a wake or a release never lowers them otherwise."}

var ruleWakeKeepsHanded = &rule{name: "wake-keeps-handed", when: atChange, check: (*world).wakeKeepsHanded,
	doc: "A wake never takes a row still handed to a worker that has not answered it: a stage that paused its row with a timeout already due, committed, " +
		"and answers a moment later still holds it (the claim's exclusion would hide the wake's mistake; the wake itself is the fault)."}

var ruleNoStaleVerdict = &rule{name: "no-stale-verdict", when: atChange, check: (*world).noStaleVerdict,
	doc: "A verdict applies only to the claim it was made for: a resolve never fails or times out a row that has been claimed again since the claim its item was made for."}

var ruleEpochGuard = &rule{name: "epoch-guard", when: atChange, check: (*world).epochGuard,
	doc: "A 0 whose stage committed its transition on that visit (then lost to a PostgreSQL crash) is never failed as a stage bug: it is run again."}

var ruleVacuumWhenDue = &rule{name: "vacuum-when-due", when: afterStep, check: (*world).vacuumWhenDue,
	doc: "An inspection that shows dead row versions past core.VacuumDeadMin, or a queue that outgrew the size its statistics were taken at (more than twice, in pages or in live rows), " +
		"no vacuum running, the role may vacuum the queue, with VACUUM on, outside a shutdown and core.VacuumIntervalMin after the last, is answered by a vacuum or an analyze in that step."}

var ruleProtocolErrorKills = &rule{name: "protocol-error-kills", when: afterStep, check: (*world).protocolErrorKills,
	doc: "A protocol error (a line that is no status line, or a line while the worker holds nothing) is acted on in that step: the worker is killed."}

var ruleShutdownStops = &rule{name: "shutdown-stops-workers", when: afterStep, check: (*world).shutdownStops,
	doc: "After the first shutdown request every worker, a starting one included, is stopped or killed in that step; after the second every one is killed."}

var ruleStageCapacity = &rule{name: "stage-capacity", when: afterStep, check: (*world).stageCapacity,
	doc: "After every step each stage has at most PARALLELISM live workers and holds at most QUEUE_LIMIT × PARALLELISM messages."}

var ruleSpawnWhenNeeded = &rule{name: "spawn-when-needed", when: afterStep, check: (*world).spawnWhenNeeded,
	doc: "Claimed ids that the ready and starting workers cannot take, with room under PARALLELISM, outside a shutdown and a cooldown, get a worker in that step."}

var rulePromptness = &rule{name: "promptness", when: afterStep, check: (*world).promptness,
	doc: "When a stage has pending rows the core was told of (a NOTIFY, a wake or reset that moved rows, a requeue it resolved, the heartbeat, the start, " +
		"the database coming back, the look after Resting) and has not since claimed the stage dry, the stage has room, no transaction is outstanding, " +
		"the database is up as far as the core knows, no shutdown is under way, no cooldown applies and the RATE leaves a token, the core claims for that stage in that step. " +
		"The stage's room is derived here (rule-owned, room): QUEUE_LIMIT × PARALLELISM less what it holds, counting only slots of workers that will take more, " +
		"and new workers only when no cooldown holds the stage back; derived from what the world saw and not by the core's capacity function, which a bug of it would fool."}

var ruleInspectDue = &rule{name: "inspect-due", when: atDeadline, check: (*world).inspectDue,
	doc: "Outside a shutdown, the queue's health is asked for at least every core.InspectInterval."}

var ruleMovesLeaveALookSlot = &rule{name: "moves-leave-the-look-a-slot", when: atCommand, check: (*world).movesLeaveALookSlot,
	doc: "Moves that claim do not crowd out the look for a row committed without a notification: once such a row has waited gateBound at its stage, " +
		"a resolve's moves and emitted children that claim there leave at least one slot of the stage's room (rule-owned, room), unless a claim of the stage is in the same transaction. " +
		"Rule no-wait-for-heartbeat excuses a stage without room, and moves that took its last slot at every answer would keep it without room, and the row waiting, for as long as they flow."}

var ruleGate = &rule{name: "no-wait-for-heartbeat", when: atDeadline, check: (*world).checkGate,
	doc: "No message waits for the heartbeat (the gate, core.Rest and core.Busy). Producers notify only while the dispatcher holds or asks for the gate; " +
		"a row committed without a notification must be claimed, or its stage claimed, or the core must take the gate and look, within gateBound while its stage has room: core.RestAfter, then core.LookEvery while its Rest waits for producers holding the gate shared (for seconds, some of them) or the gate cannot be taken, plus one transaction in flight. " +
		"Producers commit at random points of the dispatcher's transition; gates fail to be taken, and held gates lose their connection."}

var ruleFlushNotLate = &rule{name: "flush-not-late", when: atDeadline, check: (*world).flushNotLate,
	doc: "Statistics are flushed by STATS_INTERVAL, or core.IdleFlushMin after the core went idle, unless a transaction is outstanding or the core knows the database is down."}

var ruleWakeDue = &rule{name: "wake-due", when: atDeadline, check: (*world).wakeDue,
	doc: "A paused row the core can know of (it learns timeouts from Woken and Resolved; a scheduled row's from the wake after a notification sent since its commit) is woken at its timeout, not at the next heartbeat."}

var ruleStopGraceDue = &rule{name: "stop-grace-due", when: atDeadline, check: (*world).stopGraceDue,
	doc: "A stopped worker is gone or killed by STOP_GRACE."}

var ruleWatchdogDue = &rule{name: "watchdog-due", when: atDeadline, check: (*world).watchdogDue,
	doc: "A head unanswered past its stage's MAX_RUNTIME is killed, unless the core knows the database is down; a stopping worker's too (a shutdown's grace does not stop the watchdog)."}

var ruleRecycleDue = &rule{name: "recycle-due", when: atDeadline, check: (*world).recycleDue,
	doc: "A worker that has handled MAX_MESSAGES and holds nothing is recycled."}

var ruleReapDue = &rule{name: "reap-due", when: atDeadline, check: (*world).reapDue,
	doc: "An idle worker is reaped by WORKER_IDLE_TIMEOUT."}

var ruleRateTokenDue = &rule{name: "rate-token-due", when: atDeadline, check: (*world).rateTokenDue,
	doc: "When the next token comes at a stage held by its RATE, with pending rows the core knew of and room for them, it claims then."}

var ruleCooldownEndDue = &rule{name: "cooldown-end-due", when: atDeadline, check: (*world).cooldownEndDue,
	doc: "What a spawn cooldown held back (a spawn, a claim) is done when it ends."}

var rulePressureHolds = &rule{name: "pressure-holds", when: atCommand, check: (*world).pressureHolds,
	doc: "Back-pressure (MAX_PENDING) holds the stages that feed a full one: a claim checks the MAX_PENDING of every stage back-pressure involves " +
		"(one with a limit that a stage fed this life, or that feeds one: Claim.Limits), each as its limit less, while no worker of the stage answered since its latest round of failed starts, what waits for it beside its pending rows " +
		"(the ids claimed for it and not handed out, what its workers that have not answered hold, and the rows the outstanding resolves' moves and emits claim there; -1 at the least), and names every stage that feeds one with a limit (Claim.Holds, so the claim itself holds it if its transaction took that one over), " +
		"and neither a claim nor a move that claims takes a row for a held stage: " +
		"one whose passes sent messages this life to a stage whose last check found more than its MAX_PENDING pending, unless the stage itself was over its own limit at its last check " +
		"(a claim that took rows of a stage none of whose workers answered since its latest round of failed starts does not show that stage back within its limit: its count, made after it took them, misses them). " +
		"Who feeds whom and who is over are derived here from what crossed (answered transitions, resolve outcomes, claims' results), not asked of the core."}

var rulePressureOnlyWhileOver = &rule{name: "pressure-held-only-while-over", when: afterStep, check: (*world).pressureOnlyWhileOver,
	doc: "A held stage is held only while a stage it feeds is over its limit: a stage that feeds others is owed its claim by rule promptness's terms " +
		"unless a stage it feeds was over its MAX_PENDING at its last check and it was not over its own (so a cycle of stages cannot stop), " +
		"and so claims resume in the step whose claim found the full stage back within its limit."}

var rulePressureNeverStops = &rule{name: "pressure-never-stops", when: atEnd, check: (*world).pressureNeverStops,
	doc: "Back-pressure never stops the whole pipeline: once every fault has healed, no message still waits at a stage held by back-pressure when the heal phase's time runs out " +
		"(the full stage drains, and a stage over its own limit is never held)."}

var ruleLiveness = &rule{name: "liveness", when: atEnd, check: (*world).liveness,
	doc: "After the heal phase every message is final within a bounded simulated time (a late claim's orphans included), and the queue holds every row inserted."}

var ruleStatisticsExact = &rule{name: "statistics-exact", when: atEnd, check: (*world).statisticsExact,
	doc: "The flushed statistics equal what happened: each core life's truth is counted from the fake world (passes answered 0, fused stages credited to their own stage, " +
		"the time of each pass as the core measures it, worker crashes, rows its own resolves failed or timed out once it has their outcome, messages seen leaving). " +
		"A life that ends with exit 0, that lost its lock (its unflushed statistics are carried to the next) or is the one running at the end must have flushed exactly its truth; " +
		"one that crashed or exited 1 may have lost any part of its unflushed deltas. So the totals lie between the sum over the exact lives and the sum over all lives."}

var ruleWorldConsistent = &rule{name: "world-consistent", when: atEvent,
	doc: "The fake world never meets what it cannot reach if the core is right: an event it did not make, a worker handed a row its stage does not hold, " +
		"a stage that cannot commit a row it holds, a core that does not settle at one instant or leaves the world with nothing to do, or a panic."}
