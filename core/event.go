package core

import (
	"fmt"
	"strings"
	"time"
)

// Event is something that happened outside the core: a notification, a timer, a
// worker's answer or exit, the result of a queue command. The set is closed: only
// this package's types implement it, those of this file and Inspected and
// Vacuumed (vacuum.go). String is the canonical text used in logs, golden files
// and simulation traces.
type Event interface {
	isEvent()
	String() string
}

// WorkerID names a worker process for the life of one core. IDs are handed out in
// increasing order and never reused, so traces are deterministic.
type WorkerID int

func (w WorkerID) String() string { return fmt.Sprintf("w%d", w) }

// Start is the first event: the shell holds the single-dispatcher lock and the
// database may be written. The core answers with the start-up orphan reset.
//
// Carry holds statistics an earlier core of the same process counted but could
// not be sure were written (its Unflushed), when the shell had to start over after
// losing the lock. A carried flush that was sent (Seq > 0) is sent again unchanged,
// under its own Life, so the database applies it at most once; deltas never sent
// (Seq 0) are added to this core's counts.
//
// Life identifies this core among every dispatcher that ever flushed to the
// database: a flush is applied at most once per (Life, Seq). The shell draws it at
// random, the simulator from its scenario. Sequence numbers alone cannot be
// shared between lives: an earlier dispatcher's flush whose reply was lost may
// commit after this one started, with a number this one also uses.
//
// Seed seeds the core's pseudo-random source, whose only use is the jitter of
// retry delays (see Retry): the shell draws it at random, the simulator from its
// scenario, so the same seed and events always yield the same commands.
//
// Unrunnable lists the stages whose PROGRAM the shell found, just before,
// it cannot run (not found, not executable), checked without running it.
type Start struct {
	Carry      []Flush
	Seed       uint64
	Life       int64
	Unrunnable []ProgramChecked
}

// Ingress reports a NOTIFY on the ingress channel: new or retried rows are pending.
type Ingress struct{}

// Tick reports that time has passed (the timer the core asked for fired). The
// instant itself is the one passed to Step.
type Tick struct{}

// Shutdown reports SIGINT or SIGTERM. A second Shutdown means "now": workers are
// killed and the core exits without waiting for the database.
type Shutdown struct{}

// DatabaseUp reports that the shell reached the database again after a queue
// command failed (and re-established LISTEN). Owed writes are retried only after it.
type DatabaseUp struct{}

// Resting is the answer to Rest: the gate is held (Err empty), so from now on
// every producer notifies, and every producer that did not has ended. With Err,
// the gate could not be taken and the dispatcher still counts as busy.
type Resting struct {
	Err string
}

// RestLost reports that the gate's connection died while the gate was held:
// PostgreSQL released the lock, so producers may have stopped notifying.
type RestLost struct{}

// WorkerStarted reports that a Spawn succeeded: the process runs with this PID.
type WorkerStarted struct {
	Worker WorkerID
	PID    int
}

// SpawnFailed reports that a Spawn could not start the program at all (not found,
// not executable). The worker never existed.
type SpawnFailed struct {
	Worker WorkerID
	Err    string
}

// ProgramChecked answers CheckProgram: whether the stage's PROGRAM can be
// run (found, executable), checked without running it; Err empty: it can.
type ProgramChecked struct {
	Stage string
	Err   string
}

// Answer is one line a worker wrote to standard output, without the newline.
// The core parses it: anything but a valid status line is a protocol error.
// Cut says the line was longer than AnswerMax bytes and Line is its first
// AnswerMax: a protocol error too, whatever those bytes say (cut, a valid
// answer would fail as a patch that is not JSON).
//
// Unterminated says the worker's output ended in this line, with no
// newline: the core judges it when the worker's exit says how it ended. A
// worker that exited by itself wrote its last line whole; one killed (by
// the dispatcher or by a signal) may have been cut off writing it, and
// "0 >b" of "0 >bx {...}" would send its message to another stage.
type Answer struct {
	Worker       WorkerID
	Line         string
	Cut          bool
	Unterminated bool
}

// AnswerMax is the longest line a worker may answer, in bytes (64 KiB): the
// shell never buffers more of one line, and a longer one is a protocol error.
const AnswerMax = 64 << 10

// WorkerExited reports that a worker process ended, after every Answer it wrote.
// Code is the exit status, or -1 when Signal names the signal that killed it.
type WorkerExited struct {
	Worker WorkerID
	Code   int
	Signal string
	// Killed, when not empty, says why the shell killed the worker without
	// the core asking ("it closed its standard output and did not exit"):
	// the reasons and log lines of its exit name it, where "signal killed"
	// alone would read as a crash of the stage's own. It counts only with
	// Signal "killed": a worker that exited by itself as the shell decided
	// to kill it reports its own status.
	Killed string
}

// Row is one claimed queue row: its id, the stage it was claimed for, its
// attempts column (the retries it has had at that stage, see Retry) and, for a
// stage whose INPUT is message, its content.
type Row struct {
	ID       int64
	Stage    string
	Attempts int
	// Key is the row's order_key, "" for none (docs/protocol.md, "Ordering
	// per key").
	Key string
	// Message is the row's state and payload, read only for a stage whose
	// INPUT is message (Cap.LineMax > 0); nil for any other.
	Message *Message
	// Trace is the row's trace context (docs/protocol.md, "Traces").
	Trace Trace
}

// Trace is a claimed row's W3C trace context: the message's traceparent (the
// column, which the claim of its first pass fills when it has none) and this
// pass's, the same with the pass's own span id in place of its parent's
// (the span id is pepsi.pass_span's, of the row's id and the claim's instant,
// which store computes with internal/traceparent). Pass is
// read for a stage whose INPUT is message (its line carries it) and, like
// Message, only when the core asked for traces (Claim.Traces); each is ""
// when not read.
type Trace struct {
	Message string
	Pass    string
}

// Claimed is the result of a Claim. Rows are running in the database and belong to
// this core. Epoch is the crash-sentinel token the claim's transaction saw (see
// Item.Epoch). A non-empty Err means the claim may or may not have committed,
// unless Aborted says it certainly did not.
//
// Settled is how far ingress had settled when the claim looked: every row with an
// ingress_id at or below it was committed (or rolled back) before the claim's
// snapshot, so no producer can still add a row there. Zero when a producer was
// mid-transaction: a row with a lower id than those the claim saw may still
// commit (ids are taken at insert, rows appear at commit); but when no row
// the claim saw was above Claim.Settled, it is the newest of them, whatever
// producers were doing (it says nothing the core did not know).
type Claimed struct {
	Op      int64
	Epoch   string
	Rows    []Row
	Settled int64
	// More names the stages at which the claim's walk found more pending
	// rows than its cap (it looks one row past each cap), whatever the claim
	// then took: a row it picked that another writer changed meanwhile is not
	// taken, so a stage named may have come back with fewer rows than its
	// cap. A stage not named was emptied, as far as the claim saw. A move
	// that claims waits for an emptied stage (core/moveclaim.go).
	More []string
	// Over names the stages of Claim.Limits that had more than their Max
	// messages pending once the claim had taken its rows.
	Over []string
	Err  string
	// Aborted, with Err: the transaction certainly did not commit (it never
	// reached the server, or the server answered an error before the COMMIT
	// ran: the session ended, or the transaction aborted). The shell sets it
	// only when it knows; a reply lost at or after the COMMIT is not Aborted.
	Aborted bool
}

// Outcome is what a Resolve found or did for one Item: the row's stage and status
// after the statement, its paused timeout (zero for a paused row with no due
// time: a NULL timeout, or 'infinity'; such a row is never woken), and its
// state.dispatch_error. An empty
// Status means the row no longer exists. Matched reports that the row was still
// running at the item's stage, so the item's verdict was the one written (for a
// Move: false is a guard miss).
//
// For an item with Claim that Matched, the row is running at the item's To
// (moved and claimed in one write; or pending there, unclaimed, for a keyed
// message with an older message of its key unfinished), and Attempts is its attempts column; with
// the item's LineMax, Message is its state (after the patch) and payload, read
// as a Claim reads them (Row.Message). A running outcome that did not match is
// a row a commit changed during the statement (see Resolve).
type Outcome struct {
	ID       int64
	Stage    string
	Status   RowStatus
	Timeout  time.Time
	Error    string
	Matched  bool
	Attempts int
	Message  *Message
	// Trace is the row's trace context, read as a claim reads it, for a
	// move that claimed (Item.Claim).
	Trace Trace
	// Children are the children of a matched move that its resolve inserted
	// running (Emit.Claim), in the order emitted: the core holds them as if
	// a claim had returned them. A child whose Emit had Claim and that is
	// not here was inserted pending.
	Children []Child
	// Refused is the database's error when it refused the write of the
	// item's outcome for the data itself: the store then wrote
	// RefusedFallback(item, Refused) instead, and the rest of the Outcome is
	// that write's.
	Refused string
	// KeyBusy: the item is a move whose emits carry an order key whose lock
	// a producer's open transaction holds, so nothing of it was written (its
	// row is still running at its stage, the core's; no child inserted, no
	// history). Inserting the child would have waited for that producer, and
	// with it every stage behind the dispatcher's one transaction. The core
	// sends the item again after LookEvery.
	KeyBusy bool
}

// Child is a message a resolve inserted running at Stage for an emit that
// claims (Emit.Claim), read as a claim reads a row of an INPUT = id stage:
// its attempts are 0.
type Child struct {
	ID    int64
	Stage string
	Trace Trace
}

// Resolved is the result of a Resolve: one Outcome per Item, in Item order.
// Aborted is Claimed's: with Err, none of the items was applied.
type Resolved struct {
	Op       int64
	Outcomes []Outcome
	Err      string
	Aborted  bool
}

// Woken is the result of a Wake: how many due paused rows became pending and the
// earliest timeout of the rows still paused and not kept (zero when none is; a
// row with no due time, a NULL timeout or 'infinity', never is).
type Woken struct {
	Op    int64
	Count int
	Next  time.Time
	Err   string
}

// Head is a message a Release made (or found to be) its key's head: its key's
// oldest unfinished message, which no worker holds, now pending or paused
// (until Timeout; zero for no due time) at Stage.
type Head struct {
	Key     string
	ID      int64
	Stage   string
	Status  RowStatus
	Timeout time.Time
}

// Released is the result of a Release: the heads of the keys it released that
// are not held (a key none of whose messages is unfinished has none), and the
// keys it could not take because a producer held their lock (to be released
// again). A non-empty Err means the transaction may or may not have committed.
type Released struct {
	Op    int64
	Heads []Head
	Busy  []string
	Err   string
}

// OrphansReset is the result of a ResetOrphans: how many running rows became
// pending.
// Keys are the order keys of the rows it made pending: a running row no one
// held (an orphan, or a row a lost claim took) may have kept an older
// message of its key, which an operator retried meanwhile, waiting blocked,
// so the core releases them. With ResetOrphans.ReleaseKeys, Heads and Busy
// are the start-up release's, as in Released, and Seq, when a producer held an
// order key's lock as it ran, is the highest ingress_id taken then (else 0):
// that producer may have inserted a row blocked behind a message that has
// finished since, which the release could not see, so the core releases
// every key once more when ingress has settled up to Seq (Claimed.Settled).
type OrphansReset struct {
	Op    int64
	Count int
	Seq   int64
	Keys  []string
	Heads []Head
	Busy  []string
	Err   string
}

// Flushed is the result of a Flush.
type Flushed struct {
	Op  int64
	Err string
}

func (Start) isEvent()          {}
func (Ingress) isEvent()        {}
func (Tick) isEvent()           {}
func (Shutdown) isEvent()       {}
func (DatabaseUp) isEvent()     {}
func (WorkerStarted) isEvent()  {}
func (SpawnFailed) isEvent()    {}
func (ProgramChecked) isEvent() {}
func (Answer) isEvent()         {}
func (WorkerExited) isEvent()   {}
func (Claimed) isEvent()        {}
func (Resolved) isEvent()       {}
func (Woken) isEvent()          {}
func (Released) isEvent()       {}
func (OrphansReset) isEvent()   {}
func (Flushed) isEvent()        {}
func (Resting) isEvent()        {}
func (RestLost) isEvent()       {}

func (e Start) String() string {
	s := "start"
	if e.Seed != 0 {
		s += fmt.Sprintf(" seed=%d", e.Seed)
	}
	if e.Life != 0 {
		s += fmt.Sprintf(" life=%d", e.Life)
	}
	for _, f := range e.Carry {
		s += " carry{" + f.String() + "}"
	}
	for _, p := range e.Unrunnable {
		s += " unrunnable{" + p.String() + "}"
	}
	return s
}
func (Ingress) String() string    { return "ingress" }
func (Tick) String() string       { return "tick" }
func (Shutdown) String() string   { return "shutdown" }
func (DatabaseUp) String() string { return "database-up" }
func (e Resting) String() string {
	if e.Err != "" {
		return fmt.Sprintf("resting err=%q", e.Err)
	}
	return "resting"
}
func (RestLost) String() string { return "rest-lost" }
func (e WorkerStarted) String() string {
	return fmt.Sprintf("started %s pid=%d", e.Worker, e.PID)
}
func (e SpawnFailed) String() string {
	return fmt.Sprintf("spawn-failed %s err=%q", e.Worker, e.Err)
}
func (e ProgramChecked) String() string {
	if e.Err == "" {
		return "program-checked " + e.Stage
	}
	return fmt.Sprintf("program-checked %s err=%q", e.Stage, e.Err)
}
func (e Answer) String() string {
	if e.Cut {
		return fmt.Sprintf("answer %s cut at %d bytes %q", e.Worker, len(e.Line), clip(e.Line, 200))
	}
	return fmt.Sprintf("answer %s %q", e.Worker, e.Line)
}
func (e WorkerExited) String() string {
	killed := ""
	if e.Killed != "" {
		killed = fmt.Sprintf(" killed=%q", e.Killed)
	}
	if e.Signal != "" {
		return fmt.Sprintf("exited %s signal=%s%s", e.Worker, e.Signal, killed)
	}
	return fmt.Sprintf("exited %s code=%d%s", e.Worker, e.Code, killed)
}
func (e Claimed) String() string {
	if e.Err != "" {
		return fmt.Sprintf("claimed op=%d err=%q%s", e.Op, e.Err, abortedText(e.Aborted))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "claimed op=%d epoch=%s", e.Op, e.Epoch)
	if e.Settled > 0 {
		fmt.Fprintf(&b, " settled=%d", e.Settled)
	}
	if len(e.More) > 0 {
		fmt.Fprintf(&b, " more=%s", strings.Join(e.More, ","))
	}
	if len(e.Over) > 0 {
		fmt.Fprintf(&b, " over=%s", strings.Join(e.Over, ","))
	}
	for _, r := range e.Rows {
		fmt.Fprintf(&b, " %d@%s", r.ID, r.Stage)
		if r.Attempts != 0 {
			fmt.Fprintf(&b, "#%d", r.Attempts)
		}
		if r.Key != "" {
			fmt.Fprintf(&b, "[key=%q]", r.Key)
		}
		if r.Message != nil {
			b.WriteString(r.Message.String())
		}
	}
	return b.String()
}
func (e Resolved) String() string {
	if e.Err != "" {
		return fmt.Sprintf("resolved op=%d err=%q%s", e.Op, e.Err, abortedText(e.Aborted))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "resolved op=%d", e.Op)
	for _, o := range e.Outcomes {
		b.WriteByte(' ')
		b.WriteString(o.String())
	}
	return b.String()
}

func abortedText(aborted bool) string {
	if aborted {
		return " aborted"
	}
	return ""
}

func (o Outcome) String() string {
	s := fmt.Sprintf("%d@%s:%s", o.ID, o.Stage, o.Status)
	if o.Status == "" {
		s = fmt.Sprintf("%d:gone", o.ID)
	}
	if !o.Timeout.IsZero() {
		s += "(until " + formatTime(o.Timeout) + ")"
	}
	if o.Error != "" {
		s += fmt.Sprintf("(%q)", o.Error)
	}
	if o.Matched {
		s += "*"
	}
	if o.Attempts != 0 {
		s += fmt.Sprintf("#%d", o.Attempts)
	}
	if o.Message != nil {
		s += o.Message.String()
	}
	for _, ch := range o.Children {
		s += fmt.Sprintf("+%d@%s:running", ch.ID, ch.Stage)
	}
	if o.Refused != "" {
		s += " refused"
	}
	if o.KeyBusy {
		s += " key-busy"
	}
	return s
}

func (e Woken) String() string {
	if e.Err != "" {
		return fmt.Sprintf("woken op=%d err=%q", e.Op, e.Err)
	}
	return fmt.Sprintf("woken op=%d count=%d next=%s", e.Op, e.Count, formatTime(e.Next))
}
func (e Released) String() string {
	if e.Err != "" {
		return fmt.Sprintf("released op=%d err=%q", e.Op, e.Err)
	}
	return fmt.Sprintf("released op=%d", e.Op) + formatHeads(e.Heads, e.Busy)
}

// formatHeads is the text form of a release's result, "" for none.
func formatHeads(heads []Head, busy []string) string {
	var b strings.Builder
	for _, h := range heads {
		fmt.Fprintf(&b, " %q:%d@%s:%s", h.Key, h.ID, h.Stage, h.Status)
		if !h.Timeout.IsZero() {
			b.WriteString("(until " + formatTime(h.Timeout) + ")")
		}
	}
	if len(busy) > 0 {
		b.WriteString(" busy=" + formatKeys(busy))
	}
	return b.String()
}
func (e OrphansReset) String() string {
	if e.Err != "" {
		return fmt.Sprintf("orphans-reset op=%d err=%q", e.Op, e.Err)
	}
	s := fmt.Sprintf("orphans-reset op=%d count=%d", e.Op, e.Count)
	if e.Seq > 0 {
		s += fmt.Sprintf(" seq=%d", e.Seq)
	}
	if len(e.Keys) > 0 {
		s += " keys=" + formatKeys(e.Keys)
	}
	return s + formatHeads(e.Heads, e.Busy)
}
func (e Flushed) String() string {
	if e.Err != "" {
		return fmt.Sprintf("flushed op=%d err=%q", e.Op, e.Err)
	}
	return fmt.Sprintf("flushed op=%d", e.Op)
}

// formatTime is the one text form of an instant in traces: UTC, nanoseconds,
// "-" for the zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// queueResult is the result event of a queue command: OrphansReset, Resolved,
// Released, Woken, Claimed, Flushed. A non-empty error means the transaction failed.
type queueResult interface {
	Event
	queueErr() string
}

func (e OrphansReset) queueErr() string { return e.Err }
func (e Resolved) queueErr() string     { return e.Err }
func (e Woken) queueErr() string        { return e.Err }
func (e Released) queueErr() string     { return e.Err }
func (e Claimed) queueErr() string      { return e.Err }
func (e Flushed) queueErr() string      { return e.Err }
