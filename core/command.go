package core

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Command is one thing the core asks the shell to do. The set is closed: only
// this package's types implement it, those of this file and Inspect and Vacuum
// (vacuum.go). The shell executes the commands of one Step other than queue
// commands in the order given. Queue commands (KeepHistory, ResetOrphans, Resolve, Release, Wake,
// Claim, Flush) of one Step form one transaction: the shell gathers them and,
// after every other command of the Step, runs them in the order given in a
// single transaction, and answers each with its result event (same Op), all
// failed if the transaction failed. So no command of a Step waits for that
// Step's queue writes, and the core relies on none of them being made before a
// later Step. The core has at most SESSIONS such transactions outstanding
// (one, so queue writes strictly serial, by default); the shell runs each on
// a database session of its own, and their results may come back in any
// order. Exit ends the shell's loop: neither the
// commands after it nor the queue commands of its Step are executed.
type Command interface {
	isCommand()
	String() string
}

// Verdict is what the dispatcher writes for a message it is done with (see
// Item). Each is written under the same guard: only a row still running at the
// stage it was claimed for takes the verdict; a row running at another stage was
// advanced by its stage and becomes pending there; any other row is left alone.
type Verdict string

// The verdicts.
const (
	// Requeue makes the row pending again at its stage: the messages behind a
	// crashed or killed worker's head, claimed rows not handed out, shutdown.
	Requeue Verdict = "requeue"
	// Fail makes the row failed, with Reason in state.dispatch_error.
	Fail Verdict = "fail"
	// TimeOut makes the row timeout, with Reason in state.dispatch_error.
	TimeOut Verdict = "timeout"
	// Answered is a bare "0": the stage wrote its own transition, so the row is
	// normally no longer running at the stage. If it still is, the stage answered
	// 0 without moving it (a stage bug) and it fails with Reason, provided the
	// crash sentinel still holds Epoch (the epoch of its claim): otherwise a
	// database crash may have lost the stage's commit, and it becomes pending.
	Answered Verdict = "answered"
	// Move is a transition the stage answered ("0 >TARGET"): the dispatcher
	// writes it, straight to what the row becomes next: pending at stage To,
	// done, or paused until Until; Patch, if set, is merged into state.
	Move Verdict = "move"
	// Retry is an answer "75 REASON" at a stage with RETRY_LIMIT > 0 that has
	// retries left: the row is paused at its stage until Until, its attempts
	// column goes up by one, and Reason goes into state.dispatch_error, where it
	// stays while the row waits (the wake that ends the wait removes it).
	Retry Verdict = "retry"
)

// Item is one message the dispatcher is done with, for Resolve: its id, the stage
// it was claimed for, and the verdict to write (see Verdict).
type Item struct {
	ID      int64
	Stage   string
	Verdict Verdict
	// Reason goes into state.dispatch_error: Fail, TimeOut, Retry, and Answered
	// when the row is still running (the stage bug).
	Reason string
	// Epoch is set only for Answered (see Verdict).
	Epoch string
	// To, Until and Patch are set only for Move: To is a stage name, TargetDone
	// or TargetPaused; Until is the paused row's timeout; Patch is a JSON object
	// (already checked to be one jsonb accepts) or "". Until is also the timeout
	// of a Retry.
	To    string
	Until time.Time
	Patch string
	// Claim is set only on a Move to a stage (To names one) that the core has
	// room for and may claim for at once (a move that claims, see
	// core/moveclaim.go): the row is written straight to running at To, not
	// pending, and its Outcome reports it running and Matched; the core then
	// holds it for To as if a Claim had returned it. LineMax is set with Claim
	// when To's INPUT is message: the Outcome then also carries the row's
	// state and payload (Outcome.Message), read as Cap.LineMax says. A keyed
	// message's move claims only if no older message of its key is
	// unfinished; else it is written pending at To, as without Claim.
	Claim   bool
	LineMax int
	// Key is the message's order key ("" for none), as its claim read it: the
	// release that follows the resolve needs it (see Release). The statement
	// itself reads the row's own order_key (for Claim).
	Key string

	// The item's row in pepsi.history, written by the same statement, only
	// for what it actually did: with History set (the stage's HISTORY is on),
	// a row whose guard held or that is no longer running gets one row,
	// Event (an item that missed its guard records guard-miss instead, and
	// a bare 0 that left the row running records failed); a row left running
	// (a commit raced the statement) gets none, its item being owed again.
	// HandedAt is when its line was handed to the worker (zero: never
	// handed), At when its answer was read (or its worker's exit seen), PID
	// the worker's, Attempts the row's attempts as claimed. Again marks an
	// item sent again after a transaction whose reply was lost: it records
	// nothing if that transaction already recorded its pass (same id, stage
	// and At).
	History  bool
	Event    string
	HandedAt time.Time
	At       time.Time
	PID      int
	Attempts int
	Again    bool
	// Emits are set only on a Move: the messages the pass emitted, in order.
	// The statement inserts them pending at their stages (running, for an
	// emit that claims: Emit.Claim), with parent_id ID,
	// in the same transaction and only if the item's guard matched (the row
	// was still running at Stage), so they exist exactly when the pass's
	// transition committed; a key (Emit.Key) already in the queue inserts
	// nothing, and an order key goes through the queue's insert rules as any
	// producer's. They are held only until then (see core/emit.go).
	Emits []Emit
}

func (it Item) String() string {
	s := fmt.Sprintf("%d@%s->%s", it.ID, it.Stage, it.Verdict)
	if it.Verdict == Move {
		s += ":" + it.To
		if it.To == TargetPaused {
			s += "(until " + formatTime(it.Until) + ")"
		}
		if it.Patch != "" {
			s += " " + strconv.Quote(it.Patch)
		}
		if it.Claim {
			s += "+claim"
			if it.LineMax > 0 {
				s += fmt.Sprintf("(message<=%d)", it.LineMax)
			}
		}
	}
	if it.Verdict == Retry {
		s += "(until " + formatTime(it.Until) + ")"
	}
	if it.Reason != "" {
		s += fmt.Sprintf("(%q)", it.Reason)
	}
	if it.Epoch != "" {
		s += "[epoch=" + it.Epoch + "]"
	}
	if it.Key != "" {
		s += "[key=" + strconv.Quote(it.Key) + "]"
	}
	if it.History {
		s += "{" + it.Event
		if it.PID != 0 {
			s += fmt.Sprintf(" pid=%d", it.PID)
		}
		if it.Attempts != 0 {
			s += fmt.Sprintf(" attempts=%d", it.Attempts)
		}
		if !it.HandedAt.IsZero() {
			s += " handed=" + formatTime(it.HandedAt)
		}
		s += " at=" + formatTime(it.At)
		if it.Again {
			s += " again"
		}
		s += "}"
	}
	if len(it.Emits) > 0 {
		s += fmt.Sprintf("+emits%v", it.Emits)
	}
	return s
}

// ResetOrphans makes every running row pending except the ids in Keep (rows this
// core holds). Sent first at start-up, with Keep empty, and again after a Claim
// whose result was lost, so rows it may have claimed are not stuck running. Answered
// by OrphansReset. Precondition: the single-dispatcher lock is held.
//
// With ReleaseKeys (the start-up reset) it then also releases every key that
// has blocked messages, as Release does: a stage's own commit of a key's last
// pass may have been followed by a crash before the dispatcher released the
// key, and nothing else would.
//
// Each row it resets gets a history row, reset, at Now.
type ResetOrphans struct {
	Op          int64
	Keep        []int64
	ReleaseKeys bool
	Now         time.Time
}

// Resolve applies Items (see Item) in one statement. Answered by Resolved.
// Rows its items claim (Item.Claim) reach workers only after the transaction
// has committed, as a Claim's do.
// Precondition: every worker that was handed these ids has answered them or has
// exited. A commit of a stage's may still land meanwhile (one in flight when its
// worker was killed): the statement then writes nothing to that row and reports
// it running as it was, and the core resolves it again.
//
// Traces asks, as Claim.Traces does, for the trace context of every row its
// items claim (Outcome.Trace).
//
// QueueKeys: the transaction is this Resolve alone, of passes that waited
// long for a producer's order-key lock (keywait.go), and it queues for its
// children's locks, as a producer does, for a short while (the store's
// lock wait), where any other resolve only tries them (Outcome.KeyBusy): a
// try never queues, so producers that hold a bucket's lock one after
// another without a gap would hold such a pass for good. A wait that runs
// out writes nothing and answers every item KeyBusy.
type Resolve struct {
	Op        int64
	Items     []Item
	Traces    bool
	QueueKeys bool
}

// Wake makes paused rows whose timeout is at or before Now pending, except the
// rows in Keep, each with a history row, woken, at Now; a row that waited out a retry (attempts > 0) loses
// state.dispatch_error, its retry's reason, in the same write. Answered by Woken, which also reports the earliest timeout of the
// paused rows not in Keep.
//
// Keep lists the ids handed to workers and not yet answered: a stage may pause a
// row with a timeout already due and commit before its answer is read, and waking
// (and claiming) that row then would hand one message to two workers. Once the
// answer is resolved the row is no longer kept, and its outcome reports the due
// timeout, so the next Wake takes it. Keep also lists the rows of the same
// transaction's Resolve: a stage's own commit may land while the resolve waits on
// a row (see Resolve), pausing it, due at once, while the resolve writes nothing
// and its item is owed again; woken and claimed in the same transaction, the row
// would be held twice (as the owed item and as the claimed row). A row the
// resolve itself pauses, due at once, is woken by the next Wake. For the same
// reason Keep lists the rows of the resolves of other transactions still out
// (SESSIONS above 1).
//
// One Wake wakes at most WakeMax rows, those due first; when it found that
// many, its Woken.Next is Now, so the next transaction wakes again.
type Wake struct {
	Op   int64
	Now  time.Time
	Keep []int64
}

// WakeMax bounds the rows one Wake makes pending (and records in the
// history): scheduled messages may fall due by the hundred thousand at one
// instant (pepsi-queue enqueue -not-before 2h), and one statement waking
// them all would hold up every other write of its transaction for seconds.
const WakeMax = 2000

// Cap is how many pending rows of Stage one Claim may take, and where it starts
// looking: only rows with an ingress_id above After. After is the stage's claim
// floor (see Core): no pending row at or below it that the core could know of,
// so the claim does not walk the dead index entries that every earlier claim of
// the stage left behind (docs/durability.md, "Claims look above a floor"). Zero looks
// from the start.
//
// LineMax is set only for a stage whose INPUT is message: the claim then also
// reads each row's state and payload (Row.Message), but not a payload longer
// than LineMax bytes (its size only), so one outsized row cannot swell the
// dispatcher; the core fails such a message (docs/protocol.md, "Bounded
// lines").
type Cap struct {
	Stage   string
	N       int
	After   int64
	LineMax int
}

// Release hands each key in Keys to its oldest unfinished message
// (docs/protocol.md, "Ordering per key"): if no worker holds a message of the
// key, its oldest unfinished message becomes its head (blocked -> pending, or
// paused while its timeout is still ahead) and any other of its messages that
// is not blocked becomes blocked. The core sends it in the transaction that
// resolves a keyed message's pass, after the Resolve, for the key of a pass
// that may have ended its message's turn (a failure, a timeout, a move to
// done, a bare 0: Keys), and for the key of any other pass but a move that
// claims only if an older message of the key is unfinished (Behind: an
// operator retried one while this pass ran, and the key must go to it). A
// move that claims asks in its resolve, and one that finds an older message
// unfinished owes its key a release in the next transaction. So a message
// that moves on and claims costs its key no release at all (should the
// dispatcher die first, the start-up reset releases every key:
// ResetOrphans.ReleaseKeys). It never waits for a producer: a key
// whose lock a producer holds (one may be inserting a row of that key that
// this release would not see) is reported busy and released again later.
// Answered by Released.
//
// With All it also releases every key that has blocked messages: the core
// sends it once ingress has settled past the start-up reset (see
// OrphansReset.Seq).
type Release struct {
	Op     int64
	Keys   []string
	Behind []KeyAt
	All    bool
}

// Named is every key the release names, Keys then Behind's (not All's, which
// the queue finds): the keys it must release again if it failed.
func (r Release) Named() []string {
	keys := slices.Clone(r.Keys)
	for _, k := range r.Behind {
		keys = append(keys, k.Key)
	}
	return keys
}

// KeyAt is a message of an order key, for Release.Behind: its key is
// released only if a message of the key older than ID is unfinished.
type KeyAt struct {
	Key string
	ID  int64
}

// Claim moves pending rows to running, for each stage up to its cap, in
// ingress_id order, in one statement, and reports the stages where it found
// more pending rows than its cap (Claimed.More). It also makes sure the crash sentinel holds a
// token and reports it, and reports how far ingress has settled (Claimed.Settled).
// Answered by Claimed. Ids reach workers only after the transaction that claimed
// them has committed.
//
// Exclude lists the rows the core holds (handed to a worker that has neither
// answered nor exited, or claimed and not yet handed out): the claim never takes
// them, whatever made them pending meanwhile (an operator's pepsi-queue retry, a
// stray tool, a stage's late commit), so a message is never held by two workers
// at once and a stale answer never meets a newer pass. The core claims such a
// row again once its holder is done with it (its resolve reports it pending).
// The rows of the resolves of other transactions still out (SESSIONS above 1)
// are held too, until their outcomes come.
//
// ExcludeKeys lists the order keys of the messages the core holds: the claim
// never takes another message of such a key (at most one message of a key is
// held at any moment; docs/protocol.md, "Ordering per key").
//
// Limits are the back-pressure limits to check (core/pressure.go): after
// taking its rows, the claim reports each Limit's stage that has more than
// Max messages pending above After (Claimed.Over). The check walks at most
// Max + 1 entries of the pending index per stage, above After. A Claim may
// have Limits and no Caps: it then only checks them.
//
// Traces asks for every claimed row's trace context (Row.Trace, both parts),
// whatever its stage's INPUT: the core reports passes (Pass, TracePasses).
//
// Settled is how far the core knows ingress has settled (the highest
// Claimed.Settled it has seen). A claim that sees no row above it need not
// ask whether a producer is mid-transaction: every row it can see has
// settled, and it reports the newest (Claimed.Settled). Asking reads the
// server's whole lock table, a fixed cost of every transaction that grows
// with the server's max_connections; a queue that drains a backlog, with no
// producer adding rows and no stage emitting, then never pays it. The text
// form leaves Settled out: it changes what a claim must read, not what it
// takes.
//
// Holds name, for each stage that feeds a stage of Limits, that stage: the
// claim first checks the limits as the transaction stands before it (after
// its resolve), and takes no row for a stage one of whose Holds' By is over
// its limit then, unless the stage is over its own. So a claim sent before
// the core knew a stage was over gives its feeders nothing more once the
// same transaction's moves took it over.
type Claim struct {
	Op          int64
	Caps        []Cap
	Exclude     []int64
	ExcludeKeys []string
	Limits      []Limit
	Holds       []Hold
	Traces      bool
	Settled     int64
}

// Hold says Stage feeds By, for Claim.Holds.
type Hold struct {
	Stage, By string
}

// Limit is a stage's MAX_PENDING, checked by a Claim (Claim.Limits): Max is
// that less the messages claimed for the stage that wait for it beside its
// pending ones (Core.limits), at least -1, so the claim reports the stage
// over it (Claimed.Over) when more than Max are pending. After
// is the stage's claim floor as its Cap would have it (Cap.After): no row is
// pending at or below it that the core could know of, so the count need not
// walk the index entries below it, which are dead ones of claimed rows.
type Limit struct {
	Stage string
	Max   int64
	After int64
}

// StageDelta is what one stage did since the last flush.
type StageDelta struct {
	Stage        string
	Processed    int64
	Failed       int64
	Timeouts     int64
	Crashes      int64
	ProcessingUS int64
	// GuardMisses counts transitions the stage answered that the dispatcher
	// could not write (the row was no longer running at the stage), and resolves
	// that found their row changed by a commit landing during them.
	GuardMisses int64
	// Retries counts messages paused for a retry (answer 75) at this stage.
	Retries int64
	// RateHeldUS is how long, in microseconds, the stage had work it could
	// have claimed but its RATE had no token for it.
	RateHeldUS int64
	// Emitted counts the messages the stage's passes emitted whose
	// transition was written (the guard matched), children with a key
	// already in the queue included.
	Emitted int64
	// EmitsDropped counts the messages the stage's passes emitted that
	// inserted nothing: emitted before an answer other than a transition
	// the dispatcher writes, or before a guard miss.
	EmitsDropped int64
}

func (d StageDelta) zero() bool { return d == StageDelta{Stage: d.Stage} }

// satAdd is a + b for counts that are never negative, stopping at an
// int64's largest value instead of wrapping below zero: stages report the
// fused microseconds summed into ProcessingUS themselves.
func satAdd(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// Add adds o's counts to d's.
func (d *StageDelta) Add(o StageDelta) {
	d.Processed += o.Processed
	d.Failed += o.Failed
	d.Timeouts += o.Timeouts
	d.Crashes += o.Crashes
	d.ProcessingUS = satAdd(d.ProcessingUS, o.ProcessingUS)
	d.GuardMisses += o.GuardMisses
	d.Retries += o.Retries
	d.RateHeldUS += o.RateHeldUS
	d.Emitted += o.Emitted
	d.EmitsDropped += o.EmitsDropped
}

// Flush adds statistics deltas to stage_stats and dispatch_stats in one
// transaction. (Life, Seq) makes it idempotent: the shell applies it only if the
// sequence stored for Life is below Seq (and then stores Seq), and a Flush whose
// result was lost is sent again unchanged, by this core or, after a lost lock,
// by the next (Start.Carry). A life numbers its flushes 1, 2, … and sends the
// next only once the last is known applied, so a late commit of an earlier
// send can only be dropped.
// Answered by Flushed.
type Flush struct {
	Op           int64
	Life         int64
	Seq          int64
	Stages       []StageDelta
	StagePasses  int64
	MessagesLeft int64
}

// Spawn starts "PROGRAM worker [-c CONFIG_FILE]" for Stage with PEPSI_STAGE set and
// a parent-death signal. Answered by WorkerStarted or SpawnFailed, later by
// WorkerExited.
type Spawn struct {
	Worker WorkerID
	Stage  string
}

// CheckProgram asks whether Stage's PROGRAM can be run (found, executable),
// checked without running it (program.go). Answered by ProgramChecked.
type CheckProgram struct {
	Stage string
}

// Write hands ids to a started worker, in one buffer: one decimal id per line,
// or, for a stage whose INPUT is message, Lines (one per id, in the same
// order, each without its newline; docs/protocol.md, "Standard input"). The
// core keeps no copy of the lines it hands out. Precondition: the claims of
// these ids have committed.
type Write struct {
	Worker WorkerID
	IDs    []int64
	Lines  []string
}

// Pass reports that a pass ended, for the shell's traces: sent only when
// the core was asked to (Core.TracePasses), as soon as the core knows how the
// pass ended, whether or not its verdict is written yet. A pass is one
// message handed to one worker of its stage, from Handed (the Write that
// handed it) to Ended (its answer, or the exit of the worker that held it at
// the head). The core keeps nothing of it after.
type Pass struct {
	ID    int64
	Stage string
	// PID is the worker's process id.
	PID int
	// Attempts is the row's attempts column when it was claimed: the
	// retries it had had at this stage.
	Attempts int
	// Claimed is when the core took the claim of the message in (a claim's
	// result, or a move that claimed it); Handed when its Write handed it to
	// the worker; Ended when the pass ended.
	Claimed, Handed, Ended time.Time
	// Outcome is how the pass ended (PassOutcome); To is the target of an
	// advance, Reason the reason of a failure or a retry.
	Outcome PassOutcome
	To      string
	Reason  string
	// Trace is the pass's trace context, as its claim read it.
	Trace Trace
}

// PassOutcome is how a pass ended: the value of the span attribute
// pepsi.outcome (docs/operations.md, "Traces").
type PassOutcome string

// The outcomes of a pass.
const (
	// PassAdvance: the stage answered a move to another stage (0 >STAGE).
	PassAdvance PassOutcome = "advance"
	// PassDone: the stage answered 0 >done.
	PassDone PassOutcome = "done"
	// PassPause: the stage answered 0 >paused:SECONDS.
	PassPause PassOutcome = "pause"
	// PassWritten: a bare 0: the stage wrote its transition itself.
	PassWritten PassOutcome = "written"
	// PassRetry: a 75 with retries left: paused for a retry.
	PassRetry PassOutcome = "retry"
	// PassFail: a failure the stage answered (or a transition it cannot have).
	PassFail PassOutcome = "fail"
	// PassTimeout: no answer within MAX_RUNTIME; the worker was killed.
	PassTimeout PassOutcome = "timeout"
	// PassCrash: the worker died or broke the protocol holding it at the head.
	PassCrash PassOutcome = "crash"
	// PassRequeue: handed to a worker that ended (a crash, a timeout, a
	// shutdown) before it answered it: the message was requeued.
	PassRequeue PassOutcome = "requeue"
)

// Stop closes a worker's standard input: it finishes what it was handed, answers,
// and exits. The core kills it if it has not exited within its grace period.
type Stop struct {
	Worker WorkerID
}

// Kill sends SIGKILL to a worker. Its exit is reported by WorkerExited.
type Kill struct {
	Worker WorkerID
}

// SetTimer asks for a Tick at At (replacing any earlier request). The zero time
// means no timer is needed.
type SetTimer struct {
	At time.Time
}

// Rest declares the dispatcher waiting: the core has nothing to claim and is about
// to rely on NOTIFY ingress for new rows. The shell takes the gate (an advisory
// lock, store.GateKey) exclusively on its own connection and keeps it until
// Busy. Taking it waits for every producer transaction that saw the gate free
// (and so did not notify) to end; while the gate is held or asked for, every
// producer notifies. Answered by Resting once the lock is granted (or with Err
// when it could not be taken). Ordering: nothing need be durable before it; but
// the core relies on notifications only after Resting, and its first claim sent
// after Resting (the last look) sees every row of every producer that did not
// notify (docs/durability.md, "Notifications only when the dispatcher waits").
type Rest struct{}

// Busy declares the dispatcher busy: the shell releases the gate, and producers
// stop notifying. Not answered. Ordering: none; the core sends it only after a
// claim that found rows, and before it relies on notifications again it sends
// Rest and looks once more.
type Busy struct{}

// Level is how much a Log line matters to the operator; the shell maps it onto
// its logger's levels.
type Level string

// The levels of Log lines.
const (
	// LevelInfo: a decision worth knowing of (a start-up reset, a cooldown ended).
	LevelInfo Level = "info"
	// LevelWarn: something went wrong and the dispatcher copes (a failed write
	// held until the database is back, a failed message).
	LevelWarn Level = "warn"
	// LevelError: a worker crashed, hung or cannot start.
	LevelError Level = "error"
)

// Log is a line for the operator about a decision the core took (a crash, a
// timeout, a cooldown), at Level.
type Log struct {
	Level Level
	Msg   string
}

// Exit tells the shell the core has finished shutting down; the process exits with
// Code (0: every row was reset or resolved; 1: some writes could not be made and
// the next start-up reset will take care of them).
type Exit struct {
	Code int
}

func (ResetOrphans) isCommand() {}
func (Resolve) isCommand()      {}
func (Wake) isCommand()         {}
func (Release) isCommand()      {}
func (Claim) isCommand()        {}
func (Flush) isCommand()        {}
func (Spawn) isCommand()        {}
func (CheckProgram) isCommand() {}
func (Write) isCommand()        {}
func (Pass) isCommand()         {}
func (Stop) isCommand()         {}
func (Kill) isCommand()         {}
func (SetTimer) isCommand()     {}
func (Log) isCommand()          {}
func (Rest) isCommand()         {}
func (Busy) isCommand()         {}
func (Exit) isCommand()         {}

// QueueCommand is a command executed in the step's queue transaction (see
// Command): KeepHistory, ResetOrphans, Resolve, Release, Wake, Claim and Flush. Each is answered by
// one result event carrying its Op.
type QueueCommand interface {
	Command
	queueOp() int64
}

func (c ResetOrphans) queueOp() int64 { return c.Op }
func (c Resolve) queueOp() int64      { return c.Op }
func (c Wake) queueOp() int64         { return c.Op }
func (c Release) queueOp() int64      { return c.Op }
func (c Claim) queueOp() int64        { return c.Op }
func (c Flush) queueOp() int64        { return c.Op }

// IsQueue reports whether c is a queue command, executed in the step's transaction.
func IsQueue(c Command) bool {
	_, ok := c.(QueueCommand)
	return ok
}

func (c ResetOrphans) String() string {
	s := fmt.Sprintf("reset-orphans op=%d now=%s keep=%s", c.Op, formatTime(c.Now), formatIDs(c.Keep))
	if c.ReleaseKeys {
		s += " release-keys"
	}
	return s
}
func (c Resolve) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "resolve op=%d", c.Op)
	if c.QueueKeys {
		b.WriteString(" queue-keys")
	}
	for _, it := range c.Items {
		b.WriteByte(' ')
		b.WriteString(it.String())
	}
	return b.String()
}
func (c Wake) String() string {
	s := fmt.Sprintf("wake op=%d now=%s", c.Op, formatTime(c.Now))
	if len(c.Keep) > 0 {
		s += " keep=" + formatIDs(c.Keep)
	}
	return s
}
func (c Claim) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "claim op=%d", c.Op)
	for _, cp := range c.Caps {
		fmt.Fprintf(&b, " %s:%d", cp.Stage, cp.N)
		if cp.After > 0 {
			fmt.Fprintf(&b, ">%d", cp.After)
		}
		if cp.LineMax > 0 {
			fmt.Fprintf(&b, "(message<=%d)", cp.LineMax)
		}
	}
	if len(c.Exclude) > 0 {
		b.WriteString(" exclude=" + formatIDs(c.Exclude))
	}
	if len(c.ExcludeKeys) > 0 {
		b.WriteString(" exclude-keys=" + formatKeys(c.ExcludeKeys))
	}
	for _, l := range c.Limits {
		fmt.Fprintf(&b, " limit %s<=%d", l.Stage, l.Max)
		if l.After > 0 {
			fmt.Fprintf(&b, ">%d", l.After)
		}
	}
	for _, h := range c.Holds {
		fmt.Fprintf(&b, " hold %s<-%s", h.Stage, h.By)
	}
	return b.String()
}
func (c Release) String() string {
	s := fmt.Sprintf("release op=%d keys=%s", c.Op, formatKeys(c.Keys))
	if len(c.Behind) > 0 {
		s += " behind=["
		for i, k := range c.Behind {
			if i > 0 {
				s += " "
			}
			s += fmt.Sprintf("%s@%d", strconv.Quote(k.Key), k.ID)
		}
		s += "]"
	}
	if c.All {
		s += " all"
	}
	return s
}
func (c Flush) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "flush op=%d", c.Op)
	if c.Life != 0 {
		fmt.Fprintf(&b, " life=%d", c.Life)
	}
	fmt.Fprintf(&b, " seq=%d passes=%d left=%d", c.Seq, c.StagePasses, c.MessagesLeft)
	for _, d := range c.Stages {
		fmt.Fprintf(&b, " %s{processed=%d failed=%d timeouts=%d crashes=%d us=%d",
			d.Stage, d.Processed, d.Failed, d.Timeouts, d.Crashes, d.ProcessingUS)
		if d.GuardMisses != 0 {
			fmt.Fprintf(&b, " guard-misses=%d", d.GuardMisses)
		}
		if d.Retries != 0 {
			fmt.Fprintf(&b, " retries=%d", d.Retries)
		}
		if d.RateHeldUS != 0 {
			fmt.Fprintf(&b, " rate-held-us=%d", d.RateHeldUS)
		}
		if d.Emitted != 0 {
			fmt.Fprintf(&b, " emitted=%d", d.Emitted)
		}
		if d.EmitsDropped != 0 {
			fmt.Fprintf(&b, " emits-dropped=%d", d.EmitsDropped)
		}
		b.WriteString("}")
	}
	return b.String()
}
func (c Spawn) String() string        { return fmt.Sprintf("spawn %s stage=%s", c.Worker, c.Stage) }
func (c CheckProgram) String() string { return "check-program " + c.Stage }
func (c Write) String() string {
	s := fmt.Sprintf("write %s %s", c.Worker, formatIDs(c.IDs))
	if c.Lines != nil {
		n := 0
		for _, l := range c.Lines {
			n += len(l) + 1
		}
		s += fmt.Sprintf(" (messages, %d bytes)", n)
	}
	return s
}
func (c Pass) String() string {
	return fmt.Sprintf("pass %d stage=%s pid=%d outcome=%s", c.ID, c.Stage, c.PID, c.Outcome)
}
func (c Stop) String() string     { return fmt.Sprintf("stop %s", c.Worker) }
func (c Kill) String() string     { return fmt.Sprintf("kill %s", c.Worker) }
func (c SetTimer) String() string { return "timer " + formatTime(c.At) }
func (c Log) String() string      { return fmt.Sprintf("log %s %q", c.Level, c.Msg) }
func (Rest) String() string       { return "rest" }
func (Busy) String() string       { return "busy" }
func (c Exit) String() string     { return fmt.Sprintf("exit %d", c.Code) }

func formatKeys(keys []string) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = strconv.Quote(k)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func formatIDs(ids []int64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	return "[" + strings.Join(parts, ",") + "]"
}
