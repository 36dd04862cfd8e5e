// Package core is the pepsi-dispatch state machine: every decision the dispatcher
// takes is taken here, and nothing else happens here.
//
// One way in, one way out: the shell calls
//
//	cmds := c.Step(now, events...)
//
// with every event it has gathered since the last call (answers, exits, results of
// queue commands, notifications, ticks, signals) and the current instant, and then
// executes the returned commands in order. Step applies all the events first, so
// per-stage capacities are current, and only then decides what to claim, assign,
// spawn, stop, kill, requeue, fail, wake and flush, and when it next wants a Tick.
//
// The core must never do I/O, start goroutines, read the clock or keep global
// state: time comes in as the now argument, and the same events at the same
// instants always yield the same commands, which is what lets sim/ test it.
//
// Queue writes are strictly serial: the queue commands of one Step form one
// transaction, and no new one is issued until every result of the previous one has
// come back. A failed transaction may or may not have committed; the core is
// written so that re-sending what it owed is safe either way (see Item, Flush and
// ResetOrphans), and it re-sends only after the shell reports DatabaseUp.
package core

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// Thresholds that the reference text leaves to us; documented in pepsi-dispatch(1).
const (
	// StartWindow: a worker that exits having answered nothing within this long of
	// its spawn counts as a program that cannot start, not as a crash on a message.
	StartWindow = 5 * time.Second
	// StartFailLimit: a message at the head of this many failed starts in a row is
	// failed, so a message that kills every worker on sight cannot loop forever.
	StartFailLimit = 3
	// CooldownMin and CooldownMax bound the spawn cooldown of a stage whose program
	// cannot start; it doubles with each failed start and resets on an answer.
	CooldownMin = 1 * time.Second
	CooldownMax = 30 * time.Second
	// IdleFlushMin: a flush on going idle happens at most this often.
	IdleFlushMin = 1 * time.Second
	// startFailsMax bounds the memory of failed starts per message.
	startFailsMax = 10000
	// RestAfter: the core declares itself waiting (Rest) once it has had nothing
	// to claim, nothing to write and no transaction outstanding for this long
	// since its last claim. Until then producers do not notify, and a row they
	// commit waits at most this long (plus the rest handshake) for the last
	// look; a pipeline that claims more often than this never makes a producer
	// notify.
	RestAfter = 2 * time.Millisecond
	// RestRetryMin and RestRetryMax bound the pause before the core asks for the
	// gate again after it could not be taken (it doubles each time); the core
	// looks for work each time it fails, so no row waits longer than that.
	RestRetryMin = 10 * time.Millisecond
	RestRetryMax = 1 * time.Second
)

// gateState is where the core stands with the gate (see Rest and Busy).
type gateState int

const (
	gateAwake   gateState = iota // busy: producers do not notify; the core will look again
	gateAsking                   // Rest sent, Resting not yet back
	gateResting                  // the gate is held: every producer notifies
)

type workerState int

const (
	starting workerState = iota // Spawn sent, no WorkerStarted yet
	ready                       // running, may be handed ids
	stopping                    // stdin closed, waiting for exit
	killed                      // SIGKILL sent, waiting for exit
)

type killCause int

const (
	killNone     killCause = iota
	killTimeout            // head-of-line message exceeded MAX_RUNTIME
	killProtocol           // the worker broke the protocol
	killGrace              // it did not exit within the stop grace period
	killNow                // immediate shutdown
)

// msg is a message a worker holds, with the crash-sentinel epoch of its claim.
type msg struct {
	id    int64
	epoch string
}

type worker struct {
	id        WorkerID
	stage     *stage
	state     workerState
	pid       int
	queue     []msg // handed over, unanswered, in order; queue[0] is the head
	headSince time.Time
	idleSince time.Time
	spawnedAt time.Time
	stopBy    time.Time // stopping: killed if not exited by then
	handed    int
	answered  int
	cause     killCause
	timedOut  int64  // killTimeout: the head that timed out
	protoLine string // killProtocol: what it said
}

type stage struct {
	cfg       conf.Stage
	workers   []*worker // in id order
	backlog   []msg     // claimed, not yet handed to a worker
	maybeMore bool      // pending rows may exist: worth claiming
	// floor: the stage's claims look above this ingress_id only. No row is
	// pending at or below it that the core could know of: every pending row up
	// to it was claimed, and every row up to it had settled (Claimed.Settled).
	// Anything that may make older rows pending (a reset, a wake, a NOTIFY, the
	// heartbeat, the database coming back) sets it to zero; a resolve lowers the
	// claim in its own transaction below its items' ids (claimAfter).
	floor         int64
	cooldownUntil time.Time
	cooldownStep  time.Duration
	stuckReason   string // the reason for a 0 that left the row running here
}

// Core is the dispatcher state machine. Create it with New; drive it with Step.
type Core struct {
	cfg     conf.Dispatch
	stages  []*stage // sorted by name
	byName  map[string]*stage
	workers map[WorkerID]*worker
	nextWID WorkerID
	nextOp  int64
	now     time.Time
	out     []Command

	started   bool
	resetDone bool // the start-up orphan reset has committed
	needReset bool // a ResetOrphans must precede the next Claim
	// sweep: the heartbeat's ResetOrphans. With one dispatcher, a running row this
	// core does not hold is an orphan whatever made it (a transaction of a session
	// that lost the lock committing late, a mistaken tool); every POLL_INTERVAL
	// such rows are made pending, so nothing stays running for long.
	sweep  bool
	dbDown bool
	txn    []Command // queue commands awaiting results
	owed   []Item    // resolve items not yet sent (or sent and failed)
	// unsure: rows of resolve items sent in a transaction whose reply was lost.
	// That transaction may have applied them and then woken and claimed the same
	// rows again, so a reset after a lost claim must not keep them (see queueWork).
	unsure map[int64]bool

	epoch      string
	nextPaused time.Time
	wakeDue    bool
	lastPoll   time.Time
	ingressGen int64
	claimGen   int64
	// settled: the highest Claimed.Settled seen; lookGen counts lookAll calls,
	// claimLookGen is its value when the outstanding claim was sent (a look
	// asked for meanwhile keeps the floors at zero).
	settled      int64
	lookGen      int64
	claimLookGen int64

	stats      map[string]*StageDelta
	passes     int64
	left       int64
	flushSeq   int64
	unflushed  *Flush  // a flush whose result was lost: re-sent unchanged
	carry      []Flush // from Start: an earlier core's unflushed statistics
	lastFlush  time.Time
	startFails map[int64]int

	health health // the queue table's health (vacuum.go)
	// gate: whether the dispatcher counts as waiting (see Rest). lastClaim is
	// when the core last sent a Claim; restRetryAt, after a failed Rest, when it
	// may ask again, and restRetry the pause after the next failure.
	gate        gateState
	lastClaim   time.Time
	restRetryAt time.Time
	restRetry   time.Duration

	shutdown   int // 0 running, 1 graceful, 2 immediate
	waitLogged bool
	exited     bool
	timer      time.Time
}

// New returns a core for the configuration. It does nothing until the Start event.
func New(cfg *conf.Config) *Core {
	c := &Core{
		cfg:        cfg.Dispatch,
		byName:     map[string]*stage{},
		workers:    map[WorkerID]*worker{},
		stats:      map[string]*StageDelta{},
		startFails: map[int64]int{},
		unsure:     map[int64]bool{},
	}
	for _, sc := range cfg.Stages {
		st := &stage{cfg: sc, stuckReason: fmt.Sprintf("stage %s answered 0 but left the message running at %s (stage bug)", sc.Name, sc.Name)}
		c.stages = append(c.stages, st)
		c.byName[sc.Name] = st
	}
	slices.SortFunc(c.stages, func(a, b *stage) int { return cmpString(a.cfg.Name, b.cfg.Name) })
	return c
}

// Step applies events at instant now and returns the commands to execute, in order.
func (c *Core) Step(now time.Time, evs ...Event) []Command {
	if c.exited {
		return nil
	}
	if now.Before(c.now) {
		now = c.now // time never runs backwards inside the core
	}
	c.now = now
	c.out = nil
	for _, ev := range evs {
		c.apply(ev)
	}
	if c.started {
		c.timers()
		c.inspectDue()
		c.assign()
		c.queueWork()
		c.rest()
		c.finish()
		c.setTimer()
	}
	out := c.out
	c.out = nil
	return out
}

func (c *Core) emit(cmd Command) { c.out = append(c.out, cmd) }

func (c *Core) logf(level, format string, args ...any) {
	c.emit(Log{Level: level, Msg: fmt.Sprintf(format, args...)})
}

func (c *Core) apply(ev Event) {
	switch e := ev.(type) {
	case Start:
		assert(!c.started, "second Start event")
		c.started = true
		c.needReset = true
		c.wakeDue = true
		c.lastPoll = c.now
		c.lastFlush = c.now
		c.lastClaim = c.now
		c.carry = e.Carry
		c.lookAll()
	case Ingress:
		c.ingressGen++
		c.lookAll()
	case Resting:
		assert(c.gate == gateAsking, "Resting without a Rest outstanding")
		if e.Err != "" {
			c.gate = gateAwake
			c.restRetry = min(max(2*c.restRetry, RestRetryMin), RestRetryMax)
			c.restRetryAt = c.now.Add(c.restRetry)
			c.logf("warn", "cannot take the gate to wait for notifications; looking for work and asking again in %s: %s", c.restRetry, e.Err)
		} else {
			c.gate = gateResting
			c.restRetry = 0
		}
		// The last look: every producer that did not notify has committed (or
		// the gate failed and no one notifies), so the next claim, sent after
		// this, must cover every stage.
		c.ingressGen++
		c.lookAll()
	case RestLost:
		if c.gate == gateResting {
			c.gate = gateAwake
			c.logf("warn", "the gate's connection died: producers stopped notifying; looking for work")
			c.ingressGen++
			c.lookAll()
		}
	case Tick:
	case Shutdown:
		c.beginShutdown()
	case DatabaseUp:
		if c.dbDown {
			c.dbDown = false
			c.wakeDue = true
			c.lookAll()
			// The watchdog does not run while the database is down (a worker cannot
			// commit then); heads get a fresh MAX_RUNTIME from now.
			for _, w := range c.workers {
				if len(w.queue) > 0 {
					w.headSince = c.now
				}
			}
		}
	case WorkerStarted:
		w := c.worker(e.Worker)
		if w == nil {
			return
		}
		w.pid = e.PID
		if w.state == starting {
			w.state = ready
			w.idleSince = c.now
		}
	case SpawnFailed:
		w := c.worker(e.Worker)
		if w == nil {
			return
		}
		c.removeWorker(w)
		c.cooldown(w.stage)
		if st := w.stage; len(st.workers) == 0 && len(st.backlog) > 0 {
			// No worker can take the claimed rows before the cooldown ends: give
			// them back, so the queue shows them pending (nothing runs them) just
			// as it does the ids of a worker that exited at start.
			c.requeue(st, st.backlog)
			st.backlog = nil
		}
		c.logf("error", "stage %s: cannot start %s: %s; next try in %s", w.stage.cfg.Name, w.stage.cfg.Program, e.Err, w.stage.cooldownStep)
	case Answer:
		c.answer(e)
	case WorkerExited:
		c.exitedWorker(e)
	case Claimed:
		c.claimed(e)
	case Resolved:
		c.resolved(e)
	case Woken:
		c.result(e.Op, e.Err)
		if e.Err != "" {
			c.wakeDue = true
			return
		}
		c.nextPaused = e.Next
		if e.Count > 0 {
			c.lookAll()
		}
	case OrphansReset:
		c.result(e.Op, e.Err)
		if e.Err != "" {
			c.needReset = true
			return
		}
		if e.Count > 0 {
			c.lookAll() // the reset made rows pending at any stage, at any id
		}
		if !c.resetDone {
			c.resetDone = true
			c.flushSeq = e.FlushSeq
			for _, f := range c.carry {
				if f.Seq == 0 || f.Seq > e.FlushSeq {
					c.addFlush(f)
				}
			}
			c.carry = nil
			if e.Count > 0 {
				c.logf("info", "start-up: reset %d orphaned running rows to pending", e.Count)
			}
		} else if e.Count > 0 {
			c.logf("warn", "reset %d running rows this dispatcher does not hold (taken by a claim whose result was lost, or orphaned)", e.Count)
		}
	case Inspected:
		c.inspected(e)
	case Vacuumed:
		c.vacuumed(e)
	case Flushed:
		cmd := c.result(e.Op, e.Err).(Flush)
		if e.Err != "" {
			c.unflushed = &cmd
			return
		}
		c.flushSeq = cmd.Seq
	default:
		panic(fmt.Sprintf("core: unknown event %T", ev))
	}
}

// result takes the queue command that op answers off the outstanding transaction.
// Any error means the transaction failed: the database is down until the shell
// says otherwise.
func (c *Core) result(op int64, err string) Command {
	for i, cmd := range c.txn {
		if QueueOp(cmd) == op {
			c.txn = slices.Delete(c.txn, i, i+1)
			if err != "" && !c.dbDown {
				c.dbDown = true
				c.logf("warn", "queue write failed, holding results until the database is back: %s", err)
			}
			return cmd
		}
	}
	panic(fmt.Sprintf("core: result for op %d, which is not outstanding", op))
}

// QueueOp returns the Op of a queue command (0 for any other command).
func QueueOp(cmd Command) int64 {
	switch q := cmd.(type) {
	case ResetOrphans:
		return q.Op
	case Resolve:
		return q.Op
	case Wake:
		return q.Op
	case Claim:
		return q.Op
	case Flush:
		return q.Op
	}
	return 0
}

// QueueErr returns the error text of a queue result event: "" for a success or
// for any other event.
func QueueErr(ev Event) string {
	switch e := ev.(type) {
	case OrphansReset:
		return e.Err
	case Resolved:
		return e.Err
	case Woken:
		return e.Err
	case Claimed:
		return e.Err
	case Flushed:
		return e.Err
	}
	return ""
}

func (c *Core) worker(id WorkerID) *worker { return c.workers[id] }

// Unflushed returns the statistics this core counted but cannot know were
// written: a flush outstanding or whose result was lost (with its Seq), and the
// deltas not yet sent (Seq 0). The shell hands them to the next core's Start when
// it must start over after losing the lock, so a lost lock does not lose counts.
func (c *Core) Unflushed() []Flush {
	var out []Flush
	for _, cmd := range c.txn {
		if f, ok := cmd.(Flush); ok {
			out = append(out, f)
		}
	}
	if c.unflushed != nil {
		out = append(out, *c.unflushed)
	}
	out = append(out, c.carry...)
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

// verdictStatus is the status an item's verdict of failure gives its row
// ("failed" or "timeout"), or "" for the verdicts that fail nothing by
// themselves.
func verdictStatus(it Item) string {
	switch it.Verdict {
	case Fail, Answered:
		return "failed"
	case TimeOut:
		return "timeout"
	}
	return ""
}

// lookAll makes the next claim look at every stage from the start: rows may be
// pending anywhere, at any id.
func (c *Core) lookAll() {
	c.lookGen++
	for _, st := range c.stages {
		st.maybeMore = true
		st.floor = 0
	}
}

// claimAfter is the id above which stage st's claim looks: its floor, lowered
// for what the same transaction makes pending before the claim runs. A reset or
// a wake may make any row pending, so the claim looks from the start; a resolve
// makes pending only rows of its items, at whatever stage they reached.
func claimAfter(st *stage, txn []Command) int64 {
	after := st.floor
	for _, cmd := range txn {
		switch q := cmd.(type) {
		case ResetOrphans, Wake:
			return 0
		case Resolve:
			for _, it := range q.Items {
				after = min(after, it.ID-1)
			}
		}
	}
	return max(after, 0)
}

func (c *Core) stat(name string) *StageDelta {
	d := c.stats[name]
	if d == nil {
		d = &StageDelta{Stage: name}
		c.stats[name] = d
	}
	return d
}

// answer applies one status line.
func (c *Core) answer(e Answer) {
	w := c.worker(e.Worker)
	if w == nil || w.cause == killProtocol {
		return // lines after a protocol error, or from a forgotten worker
	}
	st := w.stage
	if len(w.queue) == 0 {
		c.protocolError(w, e.Line, "an answer with no message outstanding")
		return
	}
	s, err := ParseStatus(e.Line)
	if err != nil {
		c.protocolError(w, e.Line, err.Error())
		return
	}
	head := w.queue[0]
	w.queue = w.queue[1:]
	w.answered++
	elapsed := c.now.Sub(w.headSince).Microseconds()
	w.headSince = c.now
	if len(w.queue) == 0 {
		w.idleSince = c.now
	}
	// The program works: no cooldown holds the stage back any more.
	st.cooldownStep, st.cooldownUntil = 0, time.Time{}
	delete(c.startFails, head.id)

	var fusedUS int64
	for _, f := range s.Fused {
		d := c.stat(f.Stage)
		d.Processed++
		d.ProcessingUS += f.Micros
		fusedUS += f.Micros
	}
	c.passes += int64(len(s.Fused))
	d := c.stat(st.cfg.Name)
	d.ProcessingUS += max(0, elapsed-fusedUS)
	if t := s.Transition; s.Code == 0 && t != nil {
		c.answered(st, head, t)
		return
	}
	if s.Code == 0 {
		d.Processed++
		c.passes++
		c.owe(Item{ID: head.id, Stage: st.cfg.Name, Verdict: Answered, Epoch: head.epoch, Reason: st.stuckReason})
		return
	}
	reason := s.Reason
	if reason == "" {
		reason = fmt.Sprintf("stage %s answered %d", st.cfg.Name, s.Code)
	}
	c.owe(Item{ID: head.id, Stage: st.cfg.Name, Verdict: Fail, Reason: reason})
}

// answered owes the write of a transition the stage answered, or, when the
// dispatcher cannot write it (malformed, or a stage this dispatcher does not
// run), the message's failure. A pass whose transition is written counts as
// processed; one that fails counts as the failure it is.
func (c *Core) answered(st *stage, head msg, t *Transition) {
	name := st.cfg.Name
	why := t.Invalid
	if why == "" && t.To != TargetDone && t.To != TargetPaused && c.byName[t.To] == nil {
		why = fmt.Sprintf("target %q is not a stage this dispatcher runs", t.To)
	}
	if why != "" {
		c.owe(Item{ID: head.id, Stage: name, Verdict: Fail, Reason: fmt.Sprintf("stage %s answered a transition it cannot have: %s", name, why)})
		return
	}
	c.stat(name).Processed++
	c.passes++
	it := Item{ID: head.id, Stage: name, Verdict: Move, To: t.To, Patch: t.Patch}
	if t.To == TargetPaused {
		it.Until = c.now.Add(t.PauseFor)
	}
	c.owe(it)
}

func (c *Core) protocolError(w *worker, line, why string) {
	w.cause = killProtocol
	w.protoLine = clip(line, 200)
	w.state = killed
	c.emit(Kill{Worker: w.id})
	c.logf("error", "stage %s worker pid %d broke the protocol (%s); killing it", w.stage.cfg.Name, w.pid, why)
}

// owe queues an item for the next Resolve.
func (c *Core) owe(it Item) { c.owed = append(c.owed, it) }

func (c *Core) requeue(st *stage, ms []msg) {
	for _, m := range ms {
		c.owe(Item{ID: m.id, Stage: st.cfg.Name, Verdict: Requeue})
	}
}

func (c *Core) removeWorker(w *worker) {
	delete(c.workers, w.id)
	st := w.stage
	st.workers = slices.DeleteFunc(st.workers, func(x *worker) bool { return x == w })
}

func (c *Core) cooldown(st *stage) {
	st.cooldownStep = min(max(2*st.cooldownStep, CooldownMin), CooldownMax)
	st.cooldownUntil = c.now.Add(st.cooldownStep)
}

// exitedWorker decides what a worker's exit means for the messages it held.
func (c *Core) exitedWorker(e WorkerExited) {
	w := c.worker(e.Worker)
	if w == nil {
		return
	}
	c.removeWorker(w)
	st := w.stage
	name := st.cfg.Name
	how := fmt.Sprintf("exit status %d", e.Code)
	if e.Signal != "" {
		how = "signal " + e.Signal
	}
	q := w.queue
	switch w.cause {
	case killTimeout:
		if len(q) > 0 && q[0].id == w.timedOut {
			c.owe(Item{ID: q[0].id, Stage: name, Verdict: TimeOut,
				Reason: fmt.Sprintf("stage %s: no answer within MAX_RUNTIME %s; worker pid %d killed", name, c.cfg.MaxRuntime, w.pid)})
			q = q[1:]
		}
		c.requeue(st, q)
		return
	case killProtocol:
		c.stat(name).Crashes++
		if len(q) > 0 {
			c.owe(Item{ID: q[0].id, Stage: name, Verdict: Fail,
				Reason: fmt.Sprintf("stage %s: protocol error: worker pid %d answered %q", name, w.pid, w.protoLine)})
			q = q[1:]
		}
		c.requeue(st, q)
		return
	case killGrace, killNow:
		if len(q) > 0 {
			c.logf("warn", "stage %s worker pid %d killed while stopping; requeued %d messages", name, w.pid, len(q))
		}
		c.requeue(st, q)
		return
	}
	if w.state == stopping && len(q) == 0 && e.Code == 0 && e.Signal == "" {
		return // a clean stop: reaped, recycled or shut down
	}
	c.stat(name).Crashes++
	if w.answered == 0 && c.now.Sub(w.spawnedAt) < StartWindow {
		// A program that cannot start: not the message's fault, unless the same
		// message keeps being at the head of such failures.
		c.cooldown(st)
		if len(q) > 0 {
			head := q[0]
			if len(c.startFails) >= startFailsMax {
				clear(c.startFails)
			}
			c.startFails[head.id]++
			if n := c.startFails[head.id]; n >= StartFailLimit {
				delete(c.startFails, head.id)
				c.owe(Item{ID: head.id, Stage: name, Verdict: Fail,
					Reason: fmt.Sprintf("stage %s: message was at the head of %d failed worker starts in a row (last: %s)", name, n, how)})
				q = q[1:]
			}
		}
		c.requeue(st, q)
		c.logf("error", "stage %s worker pid %d exited (%s) before answering anything; requeued its messages; next start in %s",
			name, w.pid, how, st.cooldownStep)
		return
	}
	if len(q) == 0 {
		c.logf("error", "stage %s worker pid %d died unexpectedly (%s) holding no message", name, w.pid, how)
		return
	}
	c.owe(Item{ID: q[0].id, Stage: name, Verdict: Fail,
		Reason: fmt.Sprintf("stage %s: worker pid %d crashed (%s) while handling the message", name, w.pid, how)})
	c.requeue(st, q[1:])
	c.logf("error", "stage %s worker pid %d crashed (%s); failed message %d, requeued %d", name, w.pid, how, q[0].id, len(q)-1)
}

func (c *Core) claimed(e Claimed) {
	cmd := c.result(e.Op, e.Err).(Claim)
	if e.Err != "" {
		// The claim may have committed: rows may be running that no one holds.
		c.needReset = true
		return
	}
	c.epoch = e.Epoch
	c.settled = max(c.settled, e.Settled)
	if len(e.Rows) > 0 {
		// RestAfter counts from the last claim that found work.
		c.lastClaim = c.now
	}
	if len(e.Rows) > 0 && c.gate == gateResting {
		// Work: the core will claim again as it resolves it, so producers need
		// not notify until it rests again.
		c.gate = gateAwake
		c.emit(Busy{})
	}
	got := map[string]int{}
	reach := map[string]int64{} // the highest id claimed per stage
	for _, r := range e.Rows {
		st := c.byName[r.Stage]
		assert(st != nil, "claimed row %d at unknown stage %q", r.ID, r.Stage)
		got[r.Stage]++
		reach[r.Stage] = max(reach[r.Stage], r.ID)
		m := msg{id: r.ID, epoch: e.Epoch}
		if c.shutdown > 0 {
			c.requeue(st, []msg{m})
			continue
		}
		st.backlog = append(st.backlog, m)
	}
	for _, cp := range cmd.Caps {
		assert(got[cp.Stage] <= cp.N, "claim returned %d rows of stage %s, cap %d", got[cp.Stage], cp.Stage, cp.N)
		st := c.byName[cp.Stage]
		// A notification that came after the claim was sent may have added rows.
		st.maybeMore = got[cp.Stage] == cp.N || c.ingressGen != c.claimGen
		if c.lookGen == c.claimLookGen {
			st.floor = c.floorAfter(cp, got[cp.Stage], reach[cp.Stage])
		}
	}
}

// floorAfter is a stage's floor after a claim that looked above cp.After and
// took got rows, the highest reach. The claim took every pending row in
// (cp.After, reach], or above cp.After at all if it took fewer than its cap; of
// those rows, the ones up to c.settled cannot be joined by a late producer's
// row. So nothing the core could know of is pending up to the lower of the two.
func (c *Core) floorAfter(cp Cap, got int, reach int64) int64 {
	if got < cp.N {
		reach = math.MaxInt64
	}
	return max(cp.After, min(reach, c.settled))
}

func (c *Core) resolved(e Resolved) {
	cmd := c.result(e.Op, e.Err).(Resolve)
	if e.Err != "" {
		c.owed = append(slices.Clone(cmd.Items), c.owed...)
		for _, it := range cmd.Items {
			c.unsure[it.ID] = true
		}
		return
	}
	assert(len(e.Outcomes) == len(cmd.Items), "resolve of %d items returned %d outcomes", len(cmd.Items), len(e.Outcomes))
	for i, o := range e.Outcomes {
		it := cmd.Items[i]
		assert(o.ID == it.ID, "outcome %d is for row %d, want %d", i, o.ID, it.ID)
		unsure := c.unsure[o.ID]
		delete(c.unsure, o.ID)
		if it.Verdict == Move && !o.Matched && !unsure {
			// (After a lost reply the first send may have written it: no miss then.)
			c.stat(it.Stage).GuardMisses++
			c.logf("warn", "message %d: stage %s answered a transition, but the row is no longer running there (%s at %s); nothing written",
				o.ID, it.Stage, o.Status, o.Stage)
		}
		switch o.Status {
		case "pending":
			if st := c.byName[o.Stage]; st != nil {
				st.maybeMore = true
				// The transaction's own claim looked below it (claimAfter), but
				// a later claim of this stage must too, if that one did not.
				st.floor = min(st.floor, o.ID-1)
			} else {
				c.logf("warn", "message %d is pending at stage %q, which this dispatcher does not run", o.ID, o.Stage)
			}
		case "done":
			c.left++
		case "failed", "timeout":
			c.left++
			if o.Status == verdictStatus(it) && o.Error == it.Reason {
				if o.Status == "failed" {
					c.stat(it.Stage).Failed++
				} else {
					c.stat(it.Stage).Timeouts++
				}
				c.logf("warn", "message %d %s: %s", o.ID, o.Status, o.Error)
			}
		case "paused":
			if c.nextPaused.IsZero() || o.Timeout.Before(c.nextPaused) {
				c.nextPaused = o.Timeout
			}
		case "":
			c.logf("warn", "message %d disappeared from the queue while stage %s held it", o.ID, it.Stage)
		default:
			panic(fmt.Sprintf("core: row %d is %q after resolve", o.ID, o.Status))
		}
	}
}

func (c *Core) beginShutdown() {
	switch c.shutdown {
	case 0:
		c.shutdown = 1
		c.logf("info", "shutting down: stopping %d workers", len(c.workers))
		for _, id := range c.workerIDs() {
			w := c.workers[id]
			if w.state == starting || w.state == ready {
				c.stop(w)
			}
		}
		for _, st := range c.stages {
			c.requeue(st, st.backlog)
			st.backlog = nil
		}
	case 1:
		c.shutdown = 2
		c.logf("warn", "second shutdown request: killing %d workers and exiting now", len(c.workers))
		for _, id := range c.workerIDs() {
			w := c.workers[id]
			if w.state != killed {
				w.state = killed
				w.cause = killNow
				c.emit(Kill{Worker: w.id})
			}
		}
	}
}

func (c *Core) workerIDs() []WorkerID {
	ids := make([]WorkerID, 0, len(c.workers))
	for id := range c.workers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (c *Core) stop(w *worker) {
	w.state = stopping
	w.stopBy = c.now.Add(c.cfg.StopGrace)
	c.emit(Stop{Worker: w.id})
}

// timers fires everything that is due at c.now.
func (c *Core) timers() {
	if c.shutdown == 0 && !c.now.Before(c.lastPoll.Add(c.cfg.PollInterval)) {
		c.lastPoll = c.now
		c.wakeDue = true
		c.sweep = c.resetDone
		c.lookAll()
	}
	for _, id := range c.workerIDs() {
		w := c.workers[id]
		switch w.state {
		case ready:
			if len(w.queue) > 0 {
				if !c.dbDown && !c.now.Before(w.headSince.Add(c.cfg.MaxRuntime)) {
					w.state = killed
					w.cause = killTimeout
					w.timedOut = w.queue[0].id
					c.emit(Kill{Worker: w.id})
					c.logf("warn", "stage %s worker pid %d: message %d unanswered after MAX_RUNTIME %s; killing the worker",
						w.stage.cfg.Name, w.pid, w.timedOut, c.cfg.MaxRuntime)
				}
				continue
			}
			if w.handed >= w.stage.cfg.MaxMessages {
				c.stop(w) // recycle: its pipeline has drained
			} else if len(w.stage.backlog) == 0 && !c.now.Before(w.idleSince.Add(c.cfg.IdleTimeout)) {
				c.stop(w) // reap
			}
		case stopping:
			if !c.now.Before(w.stopBy) {
				w.state = killed
				w.cause = killGrace
				c.emit(Kill{Worker: w.id})
				c.logf("warn", "stage %s worker pid %d did not exit within %s of being stopped; killing it",
					w.stage.cfg.Name, w.pid, c.cfg.StopGrace)
			}
		}
	}
}

// room is how many more ids w may be handed now (counting a starting worker as
// empty, so that capacity is the same before and after it starts).
func (w *worker) room() int {
	if w.state != starting && w.state != ready {
		return 0
	}
	return max(0, min(w.stage.cfg.QueueLimit-len(w.queue), w.stage.cfg.MaxMessages-w.handed))
}

func (st *stage) coolingDown(now time.Time) bool { return now.Before(st.cooldownUntil) }

// capacity is how many more rows the stage may claim: QUEUE_LIMIT × PARALLELISM
// minus what its workers hold and what is claimed but not yet handed over. Slots of
// workers that will not take more (recycling, stopping) are not counted, and while
// the stage cools down only the workers it has count.
func (c *Core) capacity(st *stage) int {
	if c.shutdown > 0 {
		return 0
	}
	free := 0
	for _, w := range st.workers {
		free += w.room()
	}
	if !st.coolingDown(c.now) {
		free += (st.cfg.Parallelism - len(st.workers)) * min(st.cfg.QueueLimit, st.cfg.MaxMessages)
	}
	return max(0, free-len(st.backlog))
}

// assign hands claimed rows to workers, packing them onto the fewest, and spawns
// workers when the ones there are cannot take the backlog.
func (c *Core) assign() {
	if c.shutdown > 0 {
		return
	}
	for _, st := range c.stages {
		for len(st.backlog) > 0 {
			var best *worker
			for _, w := range st.workers {
				if w.state == ready && w.room() > 0 && (best == nil || len(w.queue) > len(best.queue)) {
					best = w
				}
			}
			if best == nil {
				break
			}
			n := min(best.room(), len(st.backlog))
			ids := make([]int64, n)
			for i, m := range st.backlog[:n] {
				ids[i] = m.id
			}
			if len(best.queue) == 0 {
				best.headSince = c.now
			}
			best.queue = append(best.queue, st.backlog[:n]...)
			best.handed += n
			st.backlog = slices.Delete(st.backlog, 0, n)
			c.emit(Write{Worker: best.id, IDs: ids})
		}
		need := len(st.backlog)
		for _, w := range st.workers {
			if w.state == starting {
				need -= w.room()
			}
		}
		for need > 0 && len(st.workers) < st.cfg.Parallelism && !st.coolingDown(c.now) {
			c.nextWID++
			w := &worker{id: c.nextWID, stage: st, state: starting, spawnedAt: c.now, idleSince: c.now}
			c.workers[w.id] = w
			st.workers = append(st.workers, w)
			c.emit(Spawn{Worker: w.id, Stage: st.cfg.Name})
			need -= w.room()
		}
	}
}

// held lists every row this core holds as running: handed to workers, claimed but
// not handed, and owed to a Resolve. A ResetOrphans keeps them.
func (c *Core) held() []int64 {
	var ids []int64
	for _, st := range c.stages {
		for _, w := range st.workers {
			for _, m := range w.queue {
				ids = append(ids, m.id)
			}
		}
		for _, m := range st.backlog {
			ids = append(ids, m.id)
		}
	}
	for _, it := range c.owed {
		ids = append(ids, it.ID)
	}
	slices.Sort(ids)
	return ids
}

// handed lists the ids handed to workers and not yet answered, in order.
func (c *Core) handed() []int64 {
	var ids []int64
	for _, st := range c.stages {
		for _, w := range st.workers {
			for _, m := range w.queue {
				ids = append(ids, m.id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

func (c *Core) idle() bool {
	if len(c.owed) > 0 {
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

func (c *Core) nextOpID() int64 {
	c.nextOp++
	return c.nextOp
}

// queueWork builds the step's transaction: reset, resolve, wake, claim, flush.
func (c *Core) queueWork() {
	if c.dbDown || len(c.txn) > 0 || c.shutdown == 2 {
		return
	}
	idle := c.idle() // before the owed items move into the transaction
	var txn []Command
	if c.needReset {
		// Rows whose resolve may already have been applied are not kept: the
		// lost transaction may have woken and claimed them again, and the re-sent
		// item would then fail a row that is running only because of that claim.
		// Reset, such a row is left alone by the re-sent item and runs again; at
		// worst a verdict becomes a retry.
		keep := slices.DeleteFunc(c.held(), func(id int64) bool { return c.unsure[id] })
		if !c.resetDone {
			keep = nil
		}
		txn = append(txn, ResetOrphans{Op: c.nextOpID(), Keep: keep})
		c.needReset = false
		c.sweep = false
	} else if c.sweep && c.shutdown == 0 {
		txn = append(txn, ResetOrphans{Op: c.nextOpID(), Keep: c.held()})
		c.sweep = false
	}
	resolving := false
	if len(c.owed) > 0 {
		txn = append(txn, Resolve{Op: c.nextOpID(), Items: c.owed})
		c.owed = nil
		resolving = true
	}
	waking := false
	if c.shutdown == 0 && (c.wakeDue || (!c.nextPaused.IsZero() && !c.now.Before(c.nextPaused))) {
		txn = append(txn, Wake{Op: c.nextOpID(), Now: c.now, Keep: c.handed()})
		c.wakeDue = false
		waking = true
	}
	if c.shutdown == 0 {
		var caps []Cap
		for _, st := range c.stages {
			if n := c.capacity(st); n > 0 && (st.maybeMore || resolving || waking) {
				caps = append(caps, Cap{Stage: st.cfg.Name, N: n, After: claimAfter(st, txn)})
			}
		}
		if len(caps) > 0 {
			txn = append(txn, Claim{Op: c.nextOpID(), Caps: caps})
			c.claimGen = c.ingressGen
			c.claimLookGen = c.lookGen
			c.lastClaim = c.now
		}
	}
	if f, ok := c.flushDue(idle); ok {
		f.Op = c.nextOpID()
		txn = append(txn, f)
	}
	for _, cmd := range txn {
		c.emit(cmd)
	}
	c.txn = txn
}

// restReady reports whether the core has nothing to do with the queue until
// something happens: nothing to write, nothing outstanding, nothing it would
// claim. Then it may declare itself waiting, RestAfter after its last claim.
func (c *Core) restReady() bool {
	return c.gate == gateAwake && c.resetDone && c.shutdown == 0 && !c.dbDown &&
		len(c.txn) == 0 && len(c.owed) == 0 && c.unflushed == nil
}

// restAt is when the core may send Rest, once restReady.
func (c *Core) restAt() time.Time {
	at := c.lastClaim.Add(RestAfter)
	if c.restRetryAt.After(at) {
		at = c.restRetryAt
	}
	return at
}

// rest declares the dispatcher waiting when it has had nothing to do with the
// queue for RestAfter (see Rest). queueWork ran first: a step that claims or
// writes leaves a transaction outstanding, so the core does not rest then.
func (c *Core) rest() {
	if c.restReady() && !c.now.Before(c.restAt()) {
		c.gate = gateAsking
		c.emit(Rest{})
	}
}

// flushDue returns the statistics flush to send now, if any: a lost one again, or
// the deltas when STATS_INTERVAL has passed, when the pipeline went idle (at most
// once a second) or at the end of a shutdown. Never an empty one.
func (c *Core) flushDue(idle bool) (Flush, bool) {
	if !c.resetDone {
		return Flush{}, false
	}
	if c.unflushed != nil {
		f := *c.unflushed
		c.unflushed = nil
		return f, true
	}
	if !c.hasDeltas() {
		return Flush{}, false
	}
	due := !c.now.Before(c.lastFlush.Add(c.cfg.StatsInterval))
	if idle && !c.now.Before(c.lastFlush.Add(IdleFlushMin)) {
		due = true
	}
	if c.shutdown > 0 && len(c.workers) == 0 && idle {
		due = true
	}
	if !due {
		return Flush{}, false
	}
	f := c.deltas()
	f.Seq = c.flushSeq + 1
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

// finish ends a shutdown once every worker is gone and every write is made (or, on
// the second request, as soon as every worker is gone).
func (c *Core) finish() {
	if c.shutdown == 0 || len(c.workers) > 0 {
		return
	}
	// needReset: a claim whose result was lost may have left rows running that no
	// one holds; Exit 0 promises every row was reset or resolved.
	if c.shutdown == 1 && (len(c.txn) > 0 || len(c.owed) > 0 || c.unflushed != nil || c.hasDeltas() || c.needReset) {
		if c.dbDown && !c.waitLogged {
			c.waitLogged = true
			c.logf("warn", "waiting for the database to write %d results; signal again to exit now (the next start-up resets what is left)", len(c.owed))
		}
		return
	}
	code := 0
	if len(c.owed) > 0 || len(c.txn) > 0 || c.unflushed != nil || c.hasDeltas() || c.needReset {
		code = 1
		c.logf("warn", "exiting with %d results unwritten; the next start-up resets their rows to pending", len(c.owed))
	}
	c.emit(SetTimer{})
	c.emit(Exit{Code: code})
	c.exited = true
}

// setTimer asks for a Tick at the earliest instant something becomes due.
func (c *Core) setTimer() {
	if c.exited {
		return
	}
	var next time.Time
	at := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	// While a transaction is outstanding or the database is down, its result or
	// DatabaseUp wakes the core: a queue deadline then would only spin.
	// After a second shutdown request nothing more is written either.
	queueBlocked := c.dbDown || len(c.txn) > 0 || c.shutdown == 2
	at(c.inspectAt())
	if c.shutdown == 0 {
		at(c.lastPoll.Add(c.cfg.PollInterval))
		if !queueBlocked {
			at(c.nextPaused)
		}
	}
	for _, w := range c.workers {
		switch w.state {
		case ready:
			if len(w.queue) > 0 {
				if !c.dbDown {
					at(w.headSince.Add(c.cfg.MaxRuntime))
				}
			} else if w.handed < w.stage.cfg.MaxMessages {
				at(w.idleSince.Add(c.cfg.IdleTimeout))
			}
		case stopping:
			at(w.stopBy)
		}
	}
	for _, st := range c.stages {
		// A cooling stage with work waiting (claimed, or requeued and pending)
		// is retried when the cooldown ends, not at the next heartbeat.
		if st.coolingDown(c.now) && (len(st.backlog) > 0 || st.maybeMore) {
			at(st.cooldownUntil)
		}
	}
	if c.restReady() {
		at(c.restAt())
	}
	if c.hasDeltas() && !queueBlocked {
		at(c.lastFlush.Add(c.cfg.StatsInterval))
		if c.idle() {
			at(c.lastFlush.Add(IdleFlushMin))
		}
	}
	if next.Before(c.now) && !next.IsZero() {
		next = c.now
	}
	if !next.Equal(c.timer) {
		c.timer = next
		c.emit(SetTimer{At: next})
	}
}

func assert(ok bool, format string, args ...any) {
	if !ok {
		panic("core: invariant broken: " + fmt.Sprintf(format, args...))
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
