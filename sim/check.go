package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
)

// The checker. It follows what crosses the core's boundary — the events the world
// feeds and the commands the core returns — and what the fake world does, and
// holds the core to the specification after every step. It never looks inside the
// core. Where a check needs a rule the reference text leaves to the core, it uses
// the core's documented constants and comments: the start window, the failed-start
// limit and the doubling cooldown; the watchdog pausing while the core knows the
// database is down, heads getting a fresh MAX_RUNTIME at DatabaseUp; a malformed
// line deciding the fate of a worker's head even after another kill; claimed rows
// not yet handed out may always be given back (requeued).

type killCause int

const (
	causeNone     killCause = iota
	causeTimeout            // the watchdog: the head ran past MAX_RUNTIME
	causeProtocol           // the worker wrote a line that is not a status line
	causeGrace              // it did not exit within STOP_GRACE of being stopped
	causeNow                // second shutdown request
)

// wmodel is what the checker knows of one worker of the current life.
type wmodel struct {
	id        core.WorkerID
	stage     int
	spawnAt   time.Time
	started   bool // WorkerStarted delivered while it was starting: ready
	gone      bool // SpawnFailed or WorkerExited delivered
	goneStep  int  // the step that delivered it
	stopped   bool
	stoppedAt time.Time
	killed    bool
	cause     killCause
	timedOut  int64
	proto     bool         // it broke the protocol: the core ignores it from then on
	queue     []int64      // handed and not answered, in order
	handed    int          // ids ever handed
	answered  int          // answers the core took
	headSince time.Time    // when queue[0] became the head, as the core saw it
	idleSince time.Time    // when it last had nothing to do
	answers   []answerInfo // lines written, not yet delivered
}

// expect is how the core must resolve a message it no longer hands to a worker.
type expect struct {
	verdict core.Verdict
	why     string
	stage   string     // the stage it was claimed for
	epoch   string     // answered 0: the epoch of its claim
	reason  string     // a non-zero answer's reason ("" when the line had none)
	answer  bool       // answered 0: failing it is right only if the stage did not write
	move    *core.Item // answered a transition: the To, Until and Patch the item must carry
	// retryFrom and retryTo bound a Retry's timeout: [delay, delay × (1 +
	// core.RetryJitter)) after the answer.
	retryFrom, retryTo time.Time
	sent               bool // its item is in the outstanding transaction
	unsure             bool // its item was in a transaction whose reply was lost
	raced              bool // a resolve of it found the row still running (a commit landed meanwhile)
}

// truth is what one core life did, counted from the world.
type truth struct {
	stages map[string]*core.StageDelta
	passes int64
	left   int64
	exact  bool // its statistics must all have been flushed
	// carriedFrom is the life whose unflushed statistics this life was handed
	// at Start (it lost its lock), 0 if none; carried is what of them the core
	// took on (the flushes its start-up reset showed unapplied).
	carriedFrom int
	carried     *truth
}

func (t *truth) stage(name string) *core.StageDelta {
	d := t.stages[name]
	if d == nil {
		d = &core.StageDelta{Stage: name}
		t.stages[name] = d
	}
	return d
}

type cooldown struct {
	step  time.Duration
	until time.Time
	at    time.Time // the instant of the failed start that set step
}

type model struct {
	// Of the current life.
	shut       int  // shutdown signals delivered
	coreDown   bool // the core saw a failed transaction and no DatabaseUp since
	txnOut     bool // a queue transaction is outstanding
	resetSent  bool // the start-up orphan reset was sent
	workers    map[core.WorkerID]*wmodel
	backlog    map[int64]string // claimed, not handed: id -> stage
	holder     map[int64]core.WorkerID
	expects    map[int64]*expect
	claimEpoch map[int64]string
	claimGenOf map[int64]int // the claim (see claimGen) each held message came with
	// claimAttempts: the attempts column each held message was claimed with.
	claimAttempts map[int64]int
	// rateLog: per stage with a RATE, the claims this life sent for it: when,
	// when their result came, and how many rows they took (their cap while the
	// result is out or when it was lost). rateOut: the index in it of the
	// outstanding claim's entry.
	rateLog    [][]rateClaim
	startedAt  time.Time // when the core got its Start: its buckets are empty then
	rateOut    map[int]int
	cool       []cooldown
	startFails map[int64]int
	verdicts   map[int64]core.RowStatus // rows this life's resolves failed or timed out, until the core hears of it
	flushedAt  time.Time                // when the core made its last new flush (or started)
	lastFlush  *core.Flush              // the last flush it sent
	issued     *truth                   // what its new flushes carried, summed
	resetSeen  bool                     // the start-up reset's result came back
	startCarry []core.Flush             // what Start carried
	// told: per stage, whether the core has been told that rows may be pending
	// there and has not since claimed it dry (the promptness obligation).
	told       []bool
	claimCaps  []core.Cap // the caps of the claim outstanding
	toldInTxn  bool       // a notification came while the claim was outstanding
	lastPoll   time.Time  // the heartbeat's last instant (POLL_INTERVAL)
	txnAtStart bool       // a queue transaction was outstanding when the step began
	// The queue's health: an Inspect outstanding and when the last was sent, a
	// Vacuum outstanding and when the last was sent, the last inspection's
	// result, and one delivered in this step (the vacuum obligation).
	inspectOut    bool
	inspectSent   time.Time
	vacuumOut     bool
	vacuumSent    time.Time
	lastInspected *core.Inspected
	inspectedNow  *core.Inspected
	vacuumedNow   bool // the step's commands include a Vacuum
	// unnotified: rows whose producer did not notify (the gate was free: the
	// dispatcher counted as busy), with when they committed (or were last
	// excused), until the core claims their stage or looks after taking the gate.
	unnotified map[int64]time.Time
	resting    bool // the core holds the gate as far as it knows (Resting, no Busy since)

	// Of every life.
	claimGen []int // per row (id-1): how many times a claim took it
	// retried: rows an operator made pending again, until a claim takes them,
	// with when the core heard of it (a NOTIFY, or anything else after which it
	// must look at every stage); zero while it has not. Until then a claim's
	// floor may pass over them: the core cannot know.
	retried  map[int64]time.Time
	truths   []*truth
	execLife int // the life whose transaction the fake queue is applying
}

func (w *world) newLifeModel() {
	m := &w.model
	m.shut, m.coreDown, m.txnOut, m.resetSent = 0, false, false, false
	m.workers = map[core.WorkerID]*wmodel{}
	m.backlog = map[int64]string{}
	m.holder = map[int64]core.WorkerID{}
	m.expects = map[int64]*expect{}
	m.claimEpoch = map[int64]string{}
	m.claimGenOf = map[int64]int{}
	m.claimAttempts = map[int64]int{}
	m.rateLog = make([][]rateClaim, len(w.sc.stages))
	m.rateOut = map[int]int{}
	m.cool = make([]cooldown, len(w.sc.stages))
	m.startFails = map[int64]int{}
	m.verdicts = map[int64]core.RowStatus{}
	m.lastFlush = nil
	m.issued = &truth{stages: map[string]*core.StageDelta{}}
	m.resetSeen = false
	m.inspectOut, m.vacuumOut, m.lastInspected = false, false, nil
	m.inspectSent, m.vacuumSent = time.Time{}, time.Time{}
	m.told = make([]bool, len(w.sc.stages))
	m.claimCaps, m.toldInTxn = nil, false
	m.unnotified, m.resting = map[int64]time.Time{}, false
	t := &truth{stages: map[string]*core.StageDelta{}, carried: &truth{stages: map[string]*core.StageDelta{}}}
	if len(m.startCarry) > 0 {
		t.carriedFrom = len(m.truths)
	}
	m.truths = append(m.truths, t)
}

// lookAll records that the core must look at every stage now, and so answers
// for every row committed without a notification so far (the promptness
// obligation takes over).
func (w *world) lookAll() {
	w.tellAll()
	if w.claimCaps != nil {
		w.toldInTxn = true
	}
	clear(w.unnotified)
}

// gateBound is how long a row committed without a notification may stay
// pending, at a stage with room, before the core either claims its stage or
// takes the gate and looks: core.RestAfter, the wait for producers still
// holding the gate (up to 100 ms here), transactions retried after 40001, and
// the gate's round trips. Far below any POLL_INTERVAL the scenarios draw.
const gateBound = 500 * time.Millisecond

// checkGate holds the rule "no message waits for the heartbeat": a row whose
// producer did not notify is claimed, or its stage claimed, or the core takes
// the gate and looks, within gateBound. While the core cannot claim the stage
// (no room, a cooldown, the database down, a shutdown) the clock restarts.
func (w *world) checkGate() {
	for _, id := range sortedKeys(w.unnotified) {
		r, _ := w.q.Get(id)
		s, ok := w.stageOf(r.Stage)
		if r.Status != core.StatusPending || !ok {
			delete(w.unnotified, id)
			continue
		}
		if w.coreDown || w.shut > 0 || w.coolingAt(s, w.now) || w.room(s, w.now) <= 0 {
			w.unnotified[id] = w.now
			continue
		}
		if since := w.now.Sub(w.unnotified[id]); since > gateBound {
			w.violation("message row %d waits for the heartbeat: committed %s ago without NOTIFY (the dispatcher counted as busy), "+
				"and since then the core neither claimed stage %s nor took the gate and looked", id, since, r.Stage)
			return
		}
	}
}

// tellAll records that the core learnt rows may be pending at every stage, at
// any id.
func (w *world) tellAll() {
	for s := range w.told {
		w.told[s] = true
	}
	for id, at := range w.retried {
		if at.IsZero() {
			w.retried[id] = w.now
		}
	}
}

func (w *world) truth() *truth { return w.truths[w.life-1] }

func (w *world) violation(format string, args ...any) {
	w.failf("invariant: "+format, args...)
}

// ---- events, applied in batch order, as the core applies them ----

func (w *world) modelEvent(ev core.Event) {
	switch e := ev.(type) {
	case core.Start:
		w.flushedAt = w.now
		w.startedAt = w.now
		w.lastPoll = w.now
		w.inspectSent = w.now
		w.tellAll()
	case core.Inspected:
		w.inspectOut = false
		if e.Err == "" {
			in := e
			w.lastInspected, w.inspectedNow = &in, &in
		}
	case core.Vacuumed:
		w.vacuumOut = false
	case core.Ingress:
		w.tellAll()
		if w.claimCaps != nil {
			// Rows may have come after the outstanding claim looked.
			w.toldInTxn = true
		}
	case core.Resting:
		// The last look: every producer that did not notify has committed, so
		// the core must claim every stage with room in this step. (A gate it
		// could not take means no one notifies: it must look all the same.)
		w.resting = e.Err == ""
		w.lookAll()
	case core.RestLost:
		if w.resting {
			w.resting = false
			w.lookAll()
		}
	case core.Shutdown:
		w.shut++
		if w.shut == 1 {
			for _, id := range sortedKeys(w.backlog) {
				w.expects[id] = &expect{verdict: core.Requeue, why: "claimed but not handed out at shutdown", stage: w.backlog[id]}
			}
			clear(w.backlog)
		}
	case core.DatabaseUp:
		if w.coreDown {
			// The watchdog does not run while the database is down; heads get a
			// fresh MAX_RUNTIME (core.Core's documented rule).
			w.coreDown = false
			w.tellAll()
			for _, x := range w.workers {
				if !x.gone && len(x.queue) > 0 {
					x.headSince = w.now
				}
			}
		}
	case core.WorkerStarted:
		x := w.workers[e.Worker]
		if x == nil {
			w.failf("sim: WorkerStarted for unknown %s", e.Worker)
			return
		}
		if !x.stopped && !x.killed && !x.started {
			x.started = true
			x.idleSince = w.now
		}
	case core.SpawnFailed:
		x := w.workers[e.Worker]
		x.gone = true
		w.coolDown(x.stage)
		if w.live(x.stage) == 0 {
			// No worker can take the stage's claimed rows before the cooldown
			// ends: the core gives them back (core.Core's documented rule).
			name := w.sc.stages[x.stage].name
			for _, id := range sortedKeys(w.backlog) {
				if w.backlog[id] == name {
					delete(w.backlog, id)
					w.expects[id] = &expect{verdict: core.Requeue, why: "claimed for a stage that cannot start a worker", stage: name}
				}
			}
		}
	case core.Answer:
		w.modelAnswer(e)
	case core.WorkerExited:
		w.modelExit(e)
	case core.Claimed:
		w.txnResult(e.Err)
		caps, told := w.claimCaps, w.toldInTxn
		w.claimCaps, w.toldInTxn = nil, false
		if e.Err != "" {
			// The claim may have taken its whole cap (unless it certainly
			// aborted): the core counts it so.
			for _, s := range sortedKeys(w.rateOut) {
				w.rateLog[s][w.rateOut[s]].done = w.now
				if e.Aborted {
					w.rateLog[s][w.rateOut[s]].n = 0 // it certainly took nothing
				}
				w.checkRateBound(s)
			}
			clear(w.rateOut)
			return
		}
		for _, cp := range caps {
			got := 0
			for _, r := range e.Rows {
				if r.Stage == cp.Stage {
					got++
				}
			}
			if i, ok := w.rateOut[w.stageIndex(cp.Stage)]; ok {
				s := w.stageIndex(cp.Stage)
				w.rateLog[s][i].n, w.rateLog[s][i].done = got, w.now
				delete(w.rateOut, s)
				if w.checkRateBound(s); w.fail != nil {
					return
				}
			}
			// A claim that took less than its cap found the stage dry, unless a
			// notification came while it was outstanding.
			w.told[w.stageIndex(cp.Stage)] = got == cp.N || told
		}
		for _, r := range e.Rows {
			if row, _ := w.q.Get(r.ID); r.Attempts != row.Attempts {
				w.violation("claim returned message %d with attempts %d, the row has %d", r.ID, r.Attempts, row.Attempts)
				return
			}
			w.claimAttempts[r.ID] = r.Attempts
			w.claimEpoch[r.ID] = e.Epoch
			w.claimGenOf[r.ID] = w.claimGen[r.ID-1]
			if _, held := w.heldBy(r.ID); held {
				w.violation("claim returned message %d, which this core already holds (%s)", r.ID, w.heldText())
				return
			}
			if w.shut > 0 {
				w.expects[r.ID] = &expect{verdict: core.Requeue, why: "claimed during shutdown", stage: r.Stage}
			} else {
				w.backlog[r.ID] = r.Stage
			}
		}
	case core.Resolved:
		w.txnResult(e.Err)
		if e.Err != "" {
			// A send that may have committed may have written its items; an
			// aborted one (the fake queue says so only when it did not
			// apply) wrote nothing, so a later miss is a miss.
			for _, ex := range w.expects {
				if ex.sent {
					ex.sent, ex.unsure = false, ex.unsure || !e.Aborted
				}
			}
			return
		}
		for _, o := range e.Outcomes {
			if _, ok := w.expects[o.ID]; !ok {
				w.failf("sim: outcome for message %d, which was not being resolved", o.ID)
				return
			}
			ex := w.expects[o.ID]
			if o.Status == core.StatusRunning {
				// A stage's commit landed while the resolve waited on the row:
				// nothing written, a guard miss, and the core still holds the
				// row and owes the same item.
				ex.sent, ex.raced = false, true
				w.truth().stage(ex.stage).GuardMisses++
				continue
			}
			delete(w.expects, o.ID)
			if o.Status.Final() {
				w.truth().left++
			}
			if ex.verdict == core.Retry && o.Matched {
				w.truth().stage(ex.stage).Retries++
			}
			if ex.verdict == core.Move && !o.Matched && !ex.unsure && !ex.raced {
				// The row was no longer running at the stage: a guard miss (unless
				// an earlier send, whose reply was lost, wrote it).
				w.truth().stage(ex.stage).GuardMisses++
			}
			if o.Status == core.StatusPending {
				if s, ok := w.stageOf(o.Stage); ok {
					w.told[s] = true
				}
			}
			if v, ok := w.verdicts[o.ID]; ok {
				// The core learns now that its resolve failed or timed out the row.
				delete(w.verdicts, o.ID)
				if v == core.StatusFailed {
					w.truth().stage(o.Stage).Failed++
				} else {
					w.truth().stage(o.Stage).Timeouts++
				}
			}
		}
	case core.Woken:
		w.txnResult(e.Err)
		if e.Count > 0 {
			w.tellAll()
		}
	case core.OrphansReset:
		w.txnResult(e.Err)
		if e.Err != "" {
			return
		}
		if e.Count > 0 {
			w.tellAll()
		}
		if !w.resetSeen {
			w.resetSeen = true
			// The core takes on the carried deltas never sent; a carried flush
			// that was sent is sent again unchanged, under its own life.
			for _, f := range w.startCarry {
				if f.Seq == 0 {
					c := w.truth().carried
					c.passes += f.StagePasses
					c.left += f.MessagesLeft
					for _, d := range f.Stages {
						addDelta(c.stage(d.Stage), d)
					}
				}
			}
		}
	case core.Flushed:
		w.txnResult(e.Err)
	}
}

func (w *world) txnResult(err string) {
	w.txnOut = false
	if err != "" {
		w.coreDown = true
	}
}

// queueAnswer records a line a worker wrote, to be matched with its delivery.
func (w *world) queueAnswer(id core.WorkerID, a answerInfo) {
	x := w.workers[id]
	x.answers = append(x.answers, a)
}

// coolDown is a failed start of stage s: the cooldown doubles once per
// instant, however many workers failed to start at it.
func (w *world) coolDown(s int) {
	c := &w.cool[s]
	if c.step > 0 && c.at.Equal(w.now) {
		return
	}
	c.step = min(max(2*c.step, core.CooldownMin), core.CooldownMax)
	c.until, c.at = w.now.Add(c.step), w.now
}

func (w *world) modelAnswer(e core.Answer) {
	x := w.workers[e.Worker]
	if x == nil || x.gone || len(x.answers) == 0 {
		w.failf("sim: answer from %s that the world did not write", e.Worker)
		return
	}
	a := x.answers[0]
	x.answers = x.answers[1:]
	if x.proto {
		return // the core ignores a worker after its protocol error
	}
	if len(x.queue) == 0 {
		// A line with nothing outstanding is a protocol error: the core must
		// kill the worker in this step.
		x.proto = true
		if x.killed {
			x.cause = causeProtocol
		}
		return
	}
	if a.malformed {
		// The core kills it for the protocol error, even if it had already killed
		// it for another reason: the line decides how its head ends.
		x.proto = true
		if x.killed {
			x.cause = causeProtocol
		}
		return
	}
	stage := w.sc.stages[x.stage].name
	head := x.queue[0]
	x.queue = x.queue[1:]
	delete(w.holder, head)
	x.answered++
	elapsed := w.now.Sub(x.headSince).Microseconds()
	x.headSince = w.now
	if len(x.queue) == 0 {
		x.idleSince = w.now
	}
	w.cool[x.stage] = cooldown{} // the program works: its cooldown ends
	delete(w.startFails, head)

	t := w.truth()
	var fusedUS int64
	for _, f := range a.fused {
		d := t.stage(f.Stage)
		d.Processed++
		d.ProcessingUS += f.Micros
		fusedUS += f.Micros
	}
	t.stage(stage).ProcessingUS += max(0, elapsed-fusedUS)
	t.passes += int64(len(a.fused))
	switch {
	case a.bad:
		// A transition the dispatcher cannot write fails the message.
		w.expects[head] = &expect{verdict: core.Fail, why: "answered " + a.line, stage: stage}
	case a.move != nil:
		t.stage(stage).Processed++
		t.passes++
		m := *a.move
		if m.To == core.TargetPaused {
			m.Until = w.now.Add(a.pauseFor)
		}
		w.expects[head] = &expect{verdict: core.Move, why: "answered " + a.line, stage: stage, move: &m}
	case a.code == 0:
		t.stage(stage).Processed++
		t.passes++
		w.expects[head] = &expect{verdict: core.Answered, why: "answered 0", stage: stage, epoch: w.claimEpoch[head], answer: true}
	case a.code == core.RetryCode && w.cfg.Stages[x.stage].RetryLimit > 0:
		st := w.cfg.Stages[x.stage]
		attempts := w.claimAttempts[head]
		if attempts >= st.RetryLimit {
			w.expects[head] = &expect{verdict: core.Fail, why: fmt.Sprintf("answered %s with %d retries had, RETRY_LIMIT %d", a.line, attempts, st.RetryLimit),
				stage: stage, reason: a.reason}
			return
		}
		d := retryDelay(st.RetryDelay, st.RetryDelayMax, attempts)
		w.expects[head] = &expect{verdict: core.Retry, why: fmt.Sprintf("answered %s with %d retries had, RETRY_LIMIT %d", a.line, attempts, st.RetryLimit),
			stage: stage, reason: a.reason,
			retryFrom: w.now.Add(d), retryTo: w.now.Add(d + time.Duration(float64(d)*core.RetryJitter))}
	default:
		w.expects[head] = &expect{verdict: core.Fail, why: "answered " + a.line, stage: stage, reason: a.reason}
	}
}

func (w *world) modelExit(e core.WorkerExited) {
	x := w.workers[e.Worker]
	if x == nil || x.gone {
		w.failf("sim: exit of %s, which is not alive", e.Worker)
		return
	}
	x.gone, x.goneStep = true, w.steps
	q := x.queue
	x.queue = nil
	for _, id := range q {
		delete(w.holder, id)
	}
	stage := w.sc.stages[x.stage].name
	owe := func(ids []int64, verdict core.Verdict, why string) {
		for _, id := range ids {
			w.expects[id] = &expect{verdict: verdict, why: why, stage: stage}
		}
	}
	switch x.cause {
	case causeTimeout:
		if len(q) > 0 && q[0] == x.timedOut {
			owe(q[:1], core.TimeOut, "head of a worker the watchdog killed")
			q = q[1:]
		}
		owe(q, core.Requeue, "behind the head of a worker the watchdog killed")
		return
	case causeProtocol:
		w.truth().stage(stage).Crashes++
		if len(q) > 0 {
			owe(q[:1], core.Fail, "head of a worker that broke the protocol")
			q = q[1:]
		}
		owe(q, core.Requeue, "behind the head of a worker that broke the protocol")
		return
	case causeGrace, causeNow:
		owe(q, core.Requeue, "held by a worker killed while stopping")
		return
	}
	if x.stopped && len(q) == 0 && e.Code == 0 && e.Signal == "" {
		return // a clean stop
	}
	w.truth().stage(stage).Crashes++
	if x.answered == 0 && w.now.Sub(x.spawnAt) < core.StartWindow {
		w.coolDown(x.stage)
		if len(q) > 0 {
			w.startFails[q[0]]++
			if w.startFails[q[0]] >= core.StartFailLimit {
				delete(w.startFails, q[0])
				owe(q[:1], core.Fail, fmt.Sprintf("head of %d failed starts in a row", core.StartFailLimit))
				q = q[1:]
			}
		}
		owe(q, core.Requeue, "held by a worker that could not start")
		return
	}
	if len(q) > 0 {
		owe(q[:1], core.Fail, "head of a crashed worker")
		owe(q[1:], core.Requeue, "behind the head of a crashed worker")
	}
}

// ---- commands, checked before the world executes them ----

func (w *world) modelCommands(cmds []core.Command) {
	queued := false
	for _, cmd := range cmds {
		if core.IsQueue(cmd) {
			if w.txnOut && !queued {
				w.violation("a queue transaction is issued while another is outstanding: %s", cmd)
				return
			}
			queued = true
		}
		switch x := cmd.(type) {
		case core.ResetOrphans:
			w.checkReset(x)
		case core.Resolve:
			for _, it := range x.Items {
				w.checkItem(it)
				if ex := w.expects[it.ID]; ex != nil {
					ex.sent = true
				}
			}
		case core.Claim:
			w.checkClaim(x)
			w.claimCaps, w.toldInTxn = x.Caps, false
			for _, id := range sortedKeys(w.unnotified) {
				r, _ := w.q.Get(id)
				for _, cp := range x.Caps {
					if cp.Stage == r.Stage {
						delete(w.unnotified, id)
					}
				}
			}
		case core.Busy:
			w.resting = false
		case core.Wake:
			if x.Now.After(w.now) {
				w.violation("%s wakes rows due by %s, later than now (%s)", x, x.Now.Sub(epoch), w.offset())
			}
		case core.Flush:
			w.checkFlush(x)
		case core.Inspect:
			if w.inspectOut || w.shut > 0 {
				w.violation("%s while another is outstanding (%v) or during a shutdown (%v)", x, w.inspectOut, w.shut > 0)
			}
			w.inspectOut, w.inspectSent = true, w.now
		case core.Vacuum:
			w.checkVacuum(x)
		case core.Spawn:
			w.checkSpawn(x)
		case core.Write:
			w.checkWrite(x)
		case core.Stop:
			w.checkStop(x)
		case core.Kill:
			w.checkKill(x)
		case core.Exit:
			w.checkExit(x)
		}
		if w.fail != nil {
			return
		}
	}
	if queued {
		w.txnOut = true
	}
}

func (w *world) checkReset(x core.ResetOrphans) {
	if !w.resetSent {
		w.resetSent = true
		if len(x.Keep) != 0 {
			w.violation("the start-up orphan reset keeps %v; a new core holds nothing", x.Keep)
		}
		return
	}
	for _, id := range w.heldIDs() {
		if ex := w.expects[id]; ex != nil && ex.unsure {
			// A row whose resolve may already have been applied (and which the
			// lost transaction may have claimed again) may be reset or kept.
			continue
		}
		if !slices.Contains(x.Keep, id) {
			w.violation("reset-orphans would reset message %d, which this core holds (%s), keep %v", id, w.heldText(), x.Keep)
			return
		}
	}
}

func (w *world) checkItem(it core.Item) {
	ex := w.expects[it.ID]
	if s, ok := w.backlog[it.ID]; ok && ex == nil && it.Verdict == core.Requeue && it.Stage == s && it.Reason == "" && it.Epoch == "" {
		// Giving back a claimed row no worker has seen is always safe (say, its
		// stage cannot start a worker); whether it comes back is liveness's business.
		delete(w.backlog, it.ID)
		w.expects[it.ID] = &expect{verdict: core.Requeue, why: "claimed, not handed out, given back", stage: s}
		return
	}
	if ex == nil {
		who := "no one"
		if wid, ok := w.holder[it.ID]; ok {
			who = wid.String() + ", which has not answered it"
		} else if _, ok := w.backlog[it.ID]; ok {
			who = "the core, which has not handed it out"
		}
		w.violation("resolve item %s for a message held by %s", it, who)
		return
	}
	switch {
	case it.Stage != ex.stage:
		w.violation("resolve item %s names stage %s; the message was claimed for %s", it, it.Stage, ex.stage)
	case it.Verdict != ex.verdict:
		w.violation("resolve item %s: want verdict %s (%s)", it, ex.verdict, ex.why)
	case ex.move != nil && (it.To != ex.move.To || !it.Until.Equal(ex.move.Until) || it.Patch != ex.move.Patch):
		w.violation("resolve item %s: want the answered transition to %s (until %s, patch %q)", it, ex.move.To, formatSim(ex.move.Until), ex.move.Patch)
	case ex.verdict == core.Retry && (it.Until.Before(ex.retryFrom) || !it.Until.Before(ex.retryTo)):
		w.violation("resolve item %s: a retry due at %s, want from %s (the delay) to before %s (plus the jitter) (%s)",
			it, formatSim(it.Until), formatSim(ex.retryFrom), formatSim(ex.retryTo), ex.why)
	case ex.move == nil && (it.To != "" || it.Patch != "" || (!it.Until.IsZero() && ex.verdict != core.Retry)):
		w.violation("resolve item %s carries a transition; only an answered one may (%s)", it, ex.why)
	case ex.answer && it.Epoch != ex.epoch:
		w.violation("resolve item %s for a message answered 0: want the epoch of its claim %q", it, ex.epoch)
	case !ex.answer && it.Epoch != "":
		w.violation("resolve item %s carries an epoch; only a message answered 0 may (%s)", it, ex.why)
	case (ex.verdict == core.Fail || ex.verdict == core.TimeOut || ex.verdict == core.Answered || ex.verdict == core.Retry) && it.Reason == "":
		w.violation("resolve item %s fails the message without a reason", it)
	case (ex.verdict == core.Requeue || ex.verdict == core.Move) && it.Reason != "":
		w.violation("resolve item %s requeues or moves with a reason", it)
	case ex.reason != "" && it.Reason != ex.reason:
		w.violation("resolve item %s: want the worker's reason %q", it, ex.reason)
	}
}

func (w *world) checkClaim(x core.Claim) {
	if w.shut > 0 {
		w.violation("claim during shutdown: %s", x)
		return
	}
	for _, cp := range x.Caps {
		s := w.stageIndex(cp.Stage)
		st := w.sc.stages[s]
		limit := st.parallelism * st.queueLimit
		if held := w.heldAt(cp.Stage); cp.N <= 0 || held+cp.N > limit {
			w.violation("claim asks %d rows of %s, which already holds %d: more than QUEUE_LIMIT × PARALLELISM = %d", cp.N, cp.Stage, held, limit)
			return
		}
		if w.cfg.Stages[s].Rate > 0 {
			if tokens := w.tokens(s, w.now); cp.N > tokens {
				w.violation("claim asks %d rows of %s, whose RATE %s leaves %d tokens now", cp.N, cp.Stage, st.rate, tokens)
				return
			}
			w.rateOut[s] = len(w.rateLog[s])
			w.rateLog[s] = append(w.rateLog[s], rateClaim{at: w.now, n: cp.N})
		}
	}
}

// checkVacuum: a vacuum only when the last inspection called for one (dead rows
// past core.VacuumDeadMin, no vacuum running), VACUUM is on, none of the core's
// is running, no shutdown is under way, and core.VacuumIntervalMin has passed.
func (w *world) checkVacuum(x core.Vacuum) {
	in := w.lastInspected
	switch {
	case !w.sc.vacuum:
		w.violation("%s although VACUUM = off", x)
	case w.vacuumOut:
		w.violation("%s while the core's last vacuum runs", x)
	case w.shut > 0:
		w.violation("%s during a shutdown", x)
	case in == nil || in.Dead < core.VacuumDeadMin || in.Vacuuming:
		w.violation("%s not called for by the last inspection %v", x, in)
	case !w.vacuumSent.IsZero() && w.now.Sub(w.vacuumSent) < core.VacuumIntervalMin:
		w.violation("%s %s after the last, before VacuumIntervalMin %s", x, w.now.Sub(w.vacuumSent), core.VacuumIntervalMin)
	}
	w.vacuumOut, w.vacuumSent, w.vacuumedNow = true, w.now, true
}

func (w *world) checkFlush(x core.Flush) {
	if x.StagePasses == 0 && x.MessagesLeft == 0 && len(x.Stages) == 0 {
		w.violation("an empty statistics flush: %s", x)
		return
	}
	for _, d := range x.Stages {
		if d == (core.StageDelta{Stage: d.Stage}) {
			w.violation("a statistics flush with an empty delta for %s: %s", d.Stage, x)
			return
		}
	}
	if x.Life != int64(w.life) {
		// Only a carried flush, sent again unchanged, may name another life.
		for _, f := range w.startCarry {
			a, b := f, x
			a.Op, b.Op = 0, 0
			if f.Seq != 0 && a.String() == b.String() {
				return
			}
		}
		w.violation("a flush of life %d, which is not this life (%d), nor a flush it carried: %s", x.Life, w.life, x)
		return
	}
	if seq := w.q.FlushMark(x.Life); x.Seq != seq && x.Seq != seq+1 {
		w.violation("flush seq %d, but the last applied of life %d is %d: want it or the next", x.Seq, x.Life, seq)
		return
	}
	if last := w.lastFlush; last != nil && x.Seq == last.Seq {
		a, b := *last, x
		a.Op, b.Op = 0, 0
		if a.String() != b.String() {
			w.violation("a flush re-sent with seq %d differs from the first: %s, first %s", x.Seq, x, last)
		}
		return
	}
	since := w.now.Sub(w.flushedAt)
	idle := w.nothingHeld()
	switch {
	case since >= w.sc.stats:
	case idle && since >= core.IdleFlushMin:
	case w.shut > 0 && idle && w.allGone():
	default:
		w.violation("%s is not due: %s since the last, STATS_INTERVAL %s, idle %v (at most once every %s)",
			x, since, w.sc.stats, idle, core.IdleFlushMin)
		return
	}
	w.flushedAt = w.now
	f := x
	w.lastFlush = &f
	w.issued.passes += x.StagePasses
	w.issued.left += x.MessagesLeft
	for _, d := range x.Stages {
		addDelta(w.issued.stage(d.Stage), d)
	}
}

func (w *world) allGone() bool {
	for _, y := range w.workers {
		if !y.gone {
			return false
		}
	}
	return true
}

// unflushed reports whether the current life has statistics its flushes have
// not carried yet.
func (w *world) unflushed() bool {
	t, f := &truth{stages: map[string]*core.StageDelta{}}, w.issued
	add(t, w.truth())
	add(t, w.truth().carried)
	if t.passes != f.passes || t.left != f.left {
		return true
	}
	for _, n := range sortedStrings(keysOf(t.stages)) {
		// The time a stage was held by its rate is the core's own measure;
		// the world does not count it.
		a, b := *t.stages[n], *f.stage(n)
		a.RateHeldUS, b.RateHeldUS = 0, 0
		if a != b {
			return true
		}
	}
	return false
}

func (w *world) checkSpawn(x core.Spawn) {
	s := w.stageIndex(x.Stage)
	st := w.sc.stages[s]
	if w.shut > 0 {
		w.violation("spawn during shutdown: %s", x)
		return
	}
	if c := w.cool[s]; w.now.Before(c.until) {
		w.violation("%s respawns stage %s during its cooldown (until %s)", x, x.Stage, c.until.Sub(epoch))
		return
	}
	if w.workers[x.Worker] != nil {
		w.violation("%s reuses a worker id", x)
		return
	}
	if need := w.spawnNeed(s); need <= 0 {
		w.violation("%s: its claimed messages (%d) fit in the workers it has, ready or starting", x, w.backlogAt(s))
		return
	}
	live := 1 + w.live(s)
	if live > st.parallelism {
		w.violation("%s makes %d live workers of stage %s, PARALLELISM %d", x, live, x.Stage, st.parallelism)
		return
	}
	w.workers[x.Worker] = &wmodel{id: x.Worker, stage: s, spawnAt: w.now, idleSince: w.now}
}

// staleLine holds the rule "a handed-out line is the row's current state": the
// line handed to an INPUT = message stage for id carries the row's id, stage,
// attempts, state and payload as the queue holds them now (the claim
// committed, and nothing writes a row the core holds but the core), never those
// of an earlier claim, before a retry or a requeue. It returns what differs.
func (w *world) staleLine(id int64, line string) string {
	var got struct {
		ID            int64           `json:"id"`
		Stage         string          `json:"stage"`
		Attempts      *int            `json:"attempts"`
		State         json.RawMessage `json:"state"`
		Payload       *string         `json:"payload"`
		PayloadBase64 *string         `json:"payload_base64"`
	}
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		return fmt.Sprintf("it is not a JSON object: %v", err)
	}
	r, _ := w.q.Get(id)
	var gotState, rowState any
	_ = json.Unmarshal(got.State, &gotState)
	_ = json.Unmarshal([]byte(r.StateJSON()), &rowState)
	switch {
	case got.ID != id:
		return fmt.Sprintf("its id is %d", got.ID)
	case got.Stage != r.Stage:
		return fmt.Sprintf("the row is at stage %s", r.Stage)
	case got.Attempts == nil || *got.Attempts != r.Attempts:
		return fmt.Sprintf("the row's attempts are %d", r.Attempts)
	case !reflect.DeepEqual(gotState, rowState):
		return fmt.Sprintf("the row's state is %s", r.StateJSON())
	case r.HasPayload != (got.Payload != nil || got.PayloadBase64 != nil):
		return fmt.Sprintf("the row's payload is present: %v", r.HasPayload)
	case got.Payload != nil && *got.Payload != r.Payload:
		return fmt.Sprintf("the row's payload is %q", r.Payload)
	}
	return ""
}

func (w *world) checkWrite(x core.Write) {
	y := w.workers[x.Worker]
	switch {
	case y == nil || y.gone:
		w.violation("%s to a worker that is not alive", x)
		return
	case !y.started || y.stopped || y.killed:
		w.violation("%s to a worker that is not ready (started %v, stopped %v, killed %v)", x, y.started, y.stopped, y.killed)
		return
	}
	stage := w.sc.stages[y.stage]
	for _, id := range sortedKeys(w.workers) {
		z := w.workers[id]
		if z != y && z.stage == y.stage && z.started && w.slots(z) > 0 && len(z.queue) > len(y.queue) {
			w.violation("%s hands ids to a worker holding %d while %s holds %d and has room: work is not packed onto the fewest workers",
				x, len(y.queue), id, len(z.queue))
			return
		}
	}
	if stage.message != (x.Lines != nil) || x.Lines != nil && len(x.Lines) != len(x.IDs) {
		w.violation("%s to a worker of stage %s (INPUT = message: %v) carries %d lines for %d ids", x, stage.name, stage.message, len(x.Lines), len(x.IDs))
		return
	}
	for i, id := range x.IDs {
		if x.Lines != nil {
			if why := w.staleLine(id, x.Lines[i]); why != "" {
				w.violation("%s hands message %d the line %s, but %s: a message stage must get the row as it is now", x, id, x.Lines[i], why)
				return
			}
		}
		if s, ok := w.backlog[id]; !ok || s != stage.name {
			who := "not claimed by this core"
			if wid, ok := w.holder[id]; ok {
				who = "held by " + wid.String()
			} else if ok {
				who = "claimed for stage " + s
			} else if _, ok := w.expects[id]; ok {
				who = "being resolved"
			}
			w.violation("%s hands message %d to stage %s, but it is %s", x, id, stage.name, who)
			return
		}
		if r, _ := w.q.Get(id); r.Status != core.StatusRunning || r.Stage != stage.name {
			w.violation("%s hands message %d, whose row is %s at %s (claim not committed?)", x, id, r.Status, r.Stage)
			return
		}
		delete(w.backlog, id)
		w.holder[id] = x.Worker
	}
	if len(y.queue) == 0 {
		y.headSince = w.now
	}
	y.queue = append(y.queue, x.IDs...)
	y.handed += len(x.IDs)
	if len(y.queue) > stage.queueLimit {
		w.violation("%s leaves %d unanswered ids with %s, QUEUE_LIMIT %d", x, len(y.queue), x.Worker, stage.queueLimit)
	} else if y.handed > stage.maxMessages {
		w.violation("%s hands %s its %dth id, MAX_MESSAGES %d", x, x.Worker, y.handed, stage.maxMessages)
	}
}

func (w *world) checkStop(x core.Stop) {
	y := w.workers[x.Worker]
	if y == nil || y.gone {
		w.violation("%s of a worker that is not alive", x)
		return
	}
	if y.stopped || y.killed {
		return
	}
	y.stopped, y.stoppedAt = true, w.now
	if w.shut > 0 {
		return
	}
	st := w.sc.stages[y.stage]
	switch {
	case len(y.queue) > 0:
		w.violation("%s stops a worker holding %v outside a shutdown", x, y.queue)
	case y.handed >= st.maxMessages:
		// recycled
	case !y.started:
		w.violation("%s stops a worker that never became ready, outside a shutdown", x)
	case w.now.Sub(y.idleSince) < w.sc.idle:
		w.violation("%s reaps a worker idle for %s only, WORKER_IDLE_TIMEOUT %s", x, w.now.Sub(y.idleSince), w.sc.idle)
	}
}

func (w *world) checkKill(x core.Kill) {
	y := w.workers[x.Worker]
	if y != nil && y.gone && y.goneStep == w.steps {
		return // decided on a line that came in the same batch as its exit
	}
	if y == nil || y.gone {
		w.violation("%s of a worker that is not alive", x)
		return
	}
	if y.killed {
		return
	}
	y.killed = true
	switch {
	case y.proto:
		y.cause = causeProtocol
	case w.shut >= 2:
		y.cause = causeNow
	case y.stopped:
		y.cause = causeGrace
		if w.now.Sub(y.stoppedAt) < w.sc.grace {
			w.violation("%s kills a stopped worker after %s, before STOP_GRACE %s", x, w.now.Sub(y.stoppedAt), w.sc.grace)
		}
	default:
		y.cause = causeTimeout
		if len(y.queue) == 0 {
			w.violation("%s kills a worker that holds nothing and broke no rule", x)
			return
		}
		if w.coreDown {
			w.violation("%s: the watchdog kills while the core knows the database is down (no stage can commit then)", x)
			return
		}
		if ran := w.now.Sub(y.headSince); ran < w.sc.maxRuntime {
			w.violation("%s: the watchdog kills after %s at the head, before MAX_RUNTIME %s", x, ran, w.sc.maxRuntime)
			return
		}
		y.timedOut = y.queue[0]
	}
}

func (w *world) checkExit(x core.Exit) {
	for _, id := range sortedKeys(w.workers) {
		if !w.workers[id].gone {
			w.violation("%s while %s is alive", x, id)
			return
		}
	}
	switch {
	case x.Code != 0 && w.shut < 2:
		w.violation("%s after a single shutdown request: a graceful shutdown must wait for every write", x)
	case x.Code == 0 && !w.nothingHeld():
		w.violation("%s although the core still holds or owes %s", x, w.heldText())
	case x.Code == 0:
		for _, r := range w.q.Rows() {
			if r.Status == core.StatusRunning && w.lateClaimed[r.ID] != w.claimGen[r.ID-1] {
				// (A row a late claim took after the core's reset is an orphan the
				// core cannot know of; the next start-up reset takes care of it.)
				w.violation("%s (every row reset or resolved) but row %d is running at %s", x, r.ID, r.Stage)
				return
			}
		}
	}
}

// ---- the state between and after steps ----

// checkTimely holds the core to its deadlines. It runs after every step and
// again whenever the simulated clock moves on, before anything else happens at
// the new instant: a deadline that passed while the core slept (it asked for no
// timer, or a late one) is caught then, not at the next unrelated event, when
// the core would act late and look punctual.
func (w *world) checkTimely() {
	if w.fail != nil || !w.running {
		return
	}
	if w.shut == 0 && !w.inspectOut && w.now.Sub(w.inspectSent) > core.InspectInterval {
		w.violation("the queue's health was last asked for %s ago, InspectInterval %s", w.now.Sub(w.inspectSent), core.InspectInterval)
		return
	}
	if w.checkGate(); w.fail != nil {
		return
	}
	if !w.txnOut && !w.coreDown && w.shut == 0 && w.unflushed() {
		since := w.now.Sub(w.flushedAt)
		if since > w.sc.stats || (w.nothingHeld() && since > core.IdleFlushMin) {
			w.violation("statistics unflushed %s after the last flush (STATS_INTERVAL %s, idle %v), and no transaction is outstanding",
				since, w.sc.stats, w.nothingHeld())
			return
		}
	}
	if !w.txnOut && !w.coreDown && w.shut == 0 {
		// Every paused row this core can know of is woken at its timeout: the
		// core learns timeouts from Woken and Resolved, and sets its timer.
		for id := int64(1); id <= int64(len(w.msgOf)); id++ {
			r, _ := w.q.Get(id)
			if _, held := w.heldBy(id); r.Status == core.StatusPaused && r.Timeout.Before(w.now) && !held {
				w.violation("row %d is paused until %s, %s ago, and no wake is outstanding", id, r.Timeout.Sub(epoch), w.now.Sub(r.Timeout))
				return
			}
		}
	}
	for _, id := range sortedKeys(w.workers) {
		y := w.workers[id]
		if y.gone {
			continue
		}
		st := w.sc.stages[y.stage]
		if y.stopped && !y.killed && w.now.Sub(y.stoppedAt) > w.sc.grace {
			w.violation("%s was stopped %s ago and is neither gone nor killed, STOP_GRACE %s", id, w.now.Sub(y.stoppedAt), w.sc.grace)
			return
		}
		if w.shut > 0 || !y.started || y.stopped || y.killed {
			continue
		}
		switch {
		case len(y.queue) > 0:
			if !w.coreDown && w.now.Sub(y.headSince) > w.sc.maxRuntime {
				w.violation("%s's head %d has run %s unanswered and the watchdog has not killed it, MAX_RUNTIME %s",
					id, y.queue[0], w.now.Sub(y.headSince), w.sc.maxRuntime)
				return
			}
		case y.handed >= st.maxMessages:
			w.violation("%s has handled MAX_MESSAGES %d, holds nothing and is not recycled", id, st.maxMessages)
			return
		case w.now.Sub(y.idleSince) > w.sc.idle:
			w.violation("%s has been idle for %s and is not reaped, WORKER_IDLE_TIMEOUT %s", id, w.now.Sub(y.idleSince), w.sc.idle)
			return
		}
	}
	// A token that came since the last step, at a stage held by its rate: the
	// claim was due then.
	for s, st := range w.sc.stages {
		if w.cfg.Stages[s].Rate == 0 || w.tokens(s, w.steppedAt) >= 1 {
			continue
		}
		due := w.nextToken(s)
		if due.After(w.steppedAt) && due.Before(w.now) && w.claimOwed(s, due) {
			w.violation("stage %s's next token under RATE %s came at %s, with pending rows the core knew of and room for them, and nothing was claimed by %s",
				st.name, st.rate, due.Sub(epoch), w.offset())
			return
		}
	}
	// A cooldown that ended since the last step: what it held back was due then.
	for s, st := range w.sc.stages {
		until := w.cool[s].until
		if !until.After(w.steppedAt) || !until.Before(w.now) {
			continue
		}
		if need := w.spawnNeed(s); need > 0 && w.live(s) < st.parallelism && w.shut == 0 {
			w.violation("stage %s's cooldown ended at %s with %d claimed messages no worker can take, and no worker was spawned by %s",
				st.name, until.Sub(epoch), need, w.offset())
			return
		}
		if w.claimOwed(s, until) {
			w.violation("stage %s's cooldown ended at %s with pending rows the core knew of and room for them, and nothing was claimed by %s",
				st.name, until.Sub(epoch), w.offset())
			return
		}
	}
}

// checkStep holds the core to what it must do in the step itself. free says
// whether the core could start a queue transaction in it (none outstanding once
// the step's results were in).
func (w *world) checkStep(free bool) {
	w.checkTimely()
	if w.fail != nil || !w.running {
		return
	}
	in, vacuumed := w.inspectedNow, w.vacuumedNow
	w.inspectedNow, w.vacuumedNow = nil, false
	if in != nil && !vacuumed && w.sc.vacuum && w.shut == 0 && in.Dead >= core.VacuumDeadMin && !in.Vacuuming && !w.vacuumOut &&
		(w.vacuumSent.IsZero() || w.now.Sub(w.vacuumSent) >= core.VacuumIntervalMin) {
		w.violation("the queue has %d dead row versions, no vacuum runs and VACUUM is on, and the step vacuumed nothing", in.Dead)
		return
	}
	for _, id := range sortedKeys(w.workers) {
		y := w.workers[id]
		switch {
		case y.gone:
		case y.proto && !y.killed:
			w.violation("%s broke the protocol and the core did not kill it in that step", id)
		case w.shut >= 2 && !y.killed:
			w.violation("%s is not killed after a second shutdown request", id)
		case w.shut == 1 && !y.stopped && !y.killed:
			w.violation("%s is neither stopped nor killed after a shutdown request", id)
		}
		if w.fail != nil {
			return
		}
	}
	for s, st := range w.sc.stages {
		if live := w.live(s); live > st.parallelism {
			w.violation("stage %s has %d live workers, PARALLELISM %d", st.name, live, st.parallelism)
			return
		}
		if held, limit := w.heldAt(st.name), st.parallelism*st.queueLimit; held > limit {
			w.violation("stage %s holds %d messages, more than QUEUE_LIMIT × PARALLELISM = %d", st.name, held, limit)
			return
		}
		if w.shut > 0 || w.coolingAt(s, w.now) {
			continue
		}
		if need := w.spawnNeed(s); need > 0 && w.live(s) < st.parallelism {
			w.violation("stage %s has %d claimed messages that its ready and starting workers cannot take, room for %d more workers, and spawned none",
				st.name, need, st.parallelism-w.live(s))
			return
		}
		if free && w.claimOwed(s, w.now) && !slices.ContainsFunc(w.claimCaps, func(c core.Cap) bool { return c.Stage == st.name }) {
			w.violation("stage %s has pending rows the core was told of, room for %d, no transaction outstanding and no cooldown, and the step claimed none of them",
				st.name, w.room(s, w.now))
			return
		}
	}
}

// checkFloors holds the claim floor rule: a claim looks above each stage's floor
// (core.Cap.After) only, and no row is pending at or below it when the claim
// runs. Every way a row becomes pending below a floor is one the core hears of:
// its own resolve, wake or reset, a NOTIFY, the heartbeat; and a producer's row
// lands below ids a claim saw only while that claim reported nothing settled.
// The exception: a row an operator retried, while the core has not heard of it
// (its NOTIFY lost) or heard only after it sent the claim (sent).
func (w *world) checkFloors(c core.Claim, sent time.Time) {
	for _, cp := range c.Caps {
		for _, r := range w.q.Rows() {
			if r.ID > cp.After {
				break
			}
			if at, ok := w.retried[r.ID]; ok && (at.IsZero() || at.After(sent)) {
				continue
			}
			if slices.Contains(c.Exclude, r.ID) {
				continue // held: the core lowers the floor when its resolve reports it pending
			}
			if r.Status == core.StatusPending && r.Stage == cp.Stage {
				w.violation("claim op=%d looks above %d at stage %s and passes over pending row %d", c.Op, cp.After, cp.Stage, r.ID)
				return
			}
		}
	}
}

// claimOwed is the promptness rule: at instant at, the core was told that rows
// may be pending at stage s (and has not since claimed the stage dry), rows
// there were pending then, the stage has room, the database is up as far as the
// core knows, no transaction is outstanding, no shutdown is under way and no
// cooldown holds the stage back. Then the core must claim for s.
func (w *world) claimOwed(s int, at time.Time) bool {
	if !w.told[s] || w.txnOut || w.coreDown || w.shut > 0 || w.coolingAt(s, at) || w.room(s, at) <= 0 || w.tokens(s, at) < 1 {
		return false
	}
	name := w.sc.stages[s].name
	for _, r := range w.q.Rows() {
		if r.Status == core.StatusPending && r.Stage == name && !w.insertedAt[r.ID-1].After(at) {
			return true
		}
	}
	return false
}

// retryDelay is pepsi.conf(5)'s delay of retry number attempts (0 for the
// first), before jitter: RETRY_DELAY × 2^attempts, capped at RETRY_DELAY_MAX.
// The world's own, so that a mutant of the core's cannot fool the check.
func retryDelay(delay, max time.Duration, attempts int) time.Duration {
	d := float64(delay) * math.Pow(2, float64(attempts))
	if d >= float64(max) {
		return max
	}
	return time.Duration(d)
}

// rateClaim is one claim sent for a stage with a RATE: when, when its result
// came (zero while it is out), and how many rows it took (or may have taken).
type rateClaim struct {
	at, done time.Time
	n        int
}

// rateFull replays stage s's bucket over this life's claims as the core
// documents it (empty at the start, so that a restart cannot claim a second
// burst; a token every core.RateInterval, at most core.RateBurst's worth; a
// claim counted from its result once that came): the instant the bucket is
// full again.
func (w *world) rateFull(s int) time.Time {
	interval := core.RateInterval(w.cfg.Stages[s].Rate)
	full := w.startedAt.Add(core.RateBurst(w.cfg.Stages[s].Rate))
	for _, c := range w.rateLog[s] {
		at := c.at
		if !c.done.IsZero() {
			at = c.done
		}
		if full.Before(at) {
			full = at
		}
		full = full.Add(time.Duration(c.n) * interval)
	}
	return full
}

// tokens is how many rows the core may claim for stage s at instant at.
func (w *world) tokens(s int, at time.Time) int {
	rate := w.cfg.Stages[s].Rate
	if rate == 0 {
		return 1 << 30
	}
	debt := time.Duration(0)
	if full := w.rateFull(s); full.After(at) {
		debt = full.Sub(at)
	}
	return int(max(core.RateBurst(rate)-debt, 0) / core.RateInterval(rate))
}

// nextToken is when stage s's bucket next holds a whole token.
func (w *world) nextToken(s int) time.Time {
	rate := w.cfg.Stages[s].Rate
	return w.rateFull(s).Add(core.RateInterval(rate) - core.RateBurst(rate))
}

// checkRateBound holds stage s's claims of this life to its RATE as
// pepsi.conf(5) states it, in every window ending at the latest claim: at most
// RATE × T + max(1, RATE) rows claimed in T seconds, however the database
// timed each claim between its sending and its result: the window runs from
// the result of the earliest claim in it to the sending of the latest.
func (w *world) checkRateBound(s int) {
	log, rate := w.rateLog[s], w.cfg.Stages[s].Rate
	if len(log) == 0 {
		return
	}
	last, sum := log[len(log)-1], 0
	for i := len(log) - 1; i >= 0; i-- {
		sum += log[i].n
		from := log[i].done
		if i == len(log)-1 || from.After(last.at) {
			from = last.at
		}
		if limit := rate*last.at.Sub(from).Seconds() + max(1, rate); float64(sum) > limit+1e-9 {
			w.violation("stage %s: %d rows claimed from %s to %s, more than RATE × T + max(1, RATE) = %.3f (RATE %g)",
				w.sc.stages[s].name, sum, from.Sub(epoch), last.at.Sub(epoch), limit, rate)
			return
		}
	}
}

func (w *world) coolingAt(s int, at time.Time) bool { return at.Before(w.cool[s].until) }

// live counts the workers of stage s that have not exited.
func (w *world) live(s int) int {
	n := 0
	for _, y := range w.workers {
		if y.stage == s && !y.gone {
			n++
		}
	}
	return n
}

// slots is how many more ids worker y may be handed: none once it is stopping
// or killed, else what QUEUE_LIMIT and MAX_MESSAGES leave (a starting worker
// counts as empty).
func (w *world) slots(y *wmodel) int {
	if y.gone || y.stopped || y.killed || y.proto {
		return 0
	}
	st := w.sc.stages[y.stage]
	return max(0, min(st.queueLimit-len(y.queue), st.maxMessages-y.handed))
}

// room is stage s's spare in-flight capacity at instant at: QUEUE_LIMIT ×
// PARALLELISM less what it holds, counting only the slots of workers that will
// take more, and new workers only when no cooldown holds the stage back.
func (w *world) room(s int, at time.Time) int {
	st := w.sc.stages[s]
	free := 0
	for _, y := range w.workers {
		if y.stage == s {
			free += w.slots(y)
		}
	}
	if !w.coolingAt(s, at) {
		free += (st.parallelism - w.live(s)) * min(st.queueLimit, st.maxMessages)
	}
	return free - w.backlogAt(s)
}

// spawnNeed is how many claimed messages of stage s its ready and starting
// workers cannot take.
func (w *world) spawnNeed(s int) int {
	need := w.backlogAt(s)
	for _, y := range w.workers {
		if y.stage == s {
			need -= w.slots(y)
		}
	}
	return need
}

func (w *world) backlogAt(s int) int {
	n := 0
	for _, name := range w.backlog {
		if name == w.sc.stages[s].name {
			n++
		}
	}
	return n
}

// ---- what the core holds ----

// heldBy reports who in this life holds id: the backlog, a worker, or a resolve.
func (w *world) heldBy(id int64) (string, bool) {
	if s, ok := w.backlog[id]; ok {
		return "claimed for " + s, true
	}
	if wid, ok := w.holder[id]; ok {
		return "held by " + wid.String(), true
	}
	if ex, ok := w.expects[id]; ok {
		return "owed " + string(ex.verdict), true
	}
	return "", false
}

func (w *world) heldIDs() []int64 {
	var ids []int64
	ids = append(ids, sortedKeys(w.backlog)...)
	ids = append(ids, sortedKeys(w.holder)...)
	ids = append(ids, sortedKeys(w.expects)...)
	slices.Sort(ids)
	return ids
}

func (w *world) nothingHeld() bool {
	return len(w.backlog) == 0 && len(w.holder) == 0 && len(w.expects) == 0
}

func (w *world) heldText() string {
	var parts []string
	for _, id := range w.heldIDs() {
		why, _ := w.heldBy(id)
		parts = append(parts, fmt.Sprintf("%d %s", id, why))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// heldAt counts the messages of stage the core has claimed and not yet taken back
// from a worker: its in-flight capacity.
func (w *world) heldAt(stage string) int {
	n := 0
	for _, s := range w.backlog {
		if s == stage {
			n++
		}
	}
	for _, y := range w.workers {
		if !y.gone && w.sc.stages[y.stage].name == stage {
			n += len(y.queue)
		}
	}
	return n
}

// ---- the fake queue's changes ----

// observe checks every row change the fake queue makes, and counts the rows the
// dispatcher itself fails or times out.
func (w *world) observe(c fakequeue.Change) {
	if c.Before.Status == core.StatusPending && c.After.Status == core.StatusRunning && c.By != fakequeue.ByClaim {
		w.violation("row %d went from pending to running by %s; only the dispatcher's claim may", c.After.ID, c.By)
		return
	}
	// (A crash restores an earlier version of the row, attempts and all.)
	switch {
	case c.By == fakequeue.ByCrash:
	case c.After.Stage != c.Before.Stage && c.After.Attempts != 0:
		w.violation("row %d moved from stage %s to %s by %s with attempts %d: a move to another stage sets it to 0",
			c.After.ID, c.Before.Stage, c.After.Stage, c.By, c.After.Attempts)
		return
	case c.After.Attempts > c.Before.Attempts+1 || (c.After.Attempts == c.Before.Attempts+1 && (c.By != fakequeue.ByResolve || c.After.Status != core.StatusPaused)):
		w.violation("row %d's attempts went from %d to %d by %s (%s): only a retry adds one",
			c.After.ID, c.Before.Attempts, c.After.Attempts, c.By, c.After.Status)
		return
	}
	if c.By == fakequeue.ByClaim {
		delete(w.retried, c.After.ID)
		w.claimGen[c.After.ID-1]++
		if w.lateExec {
			w.lateClaimed[c.After.ID] = w.claimGen[c.After.ID-1]
		}
	}
	if c.By != fakequeue.ByResolve || !(c.After.Status == core.StatusFailed || c.After.Status == core.StatusTimeout) {
		return
	}
	if w.execLife != w.life {
		return // a dead core's last transaction, applied as it died: it never hears of it
	}
	id := c.After.ID
	w.verdicts[id] = c.After.Status
	if gen := w.claimGenOf[id]; gen != w.claimGen[id-1] {
		w.violation("row %d was made %s by a resolve meant for its claim #%d, but it has been claimed again since (claim #%d): a verdict must only apply to the claim it was made for",
			id, c.After.Status, gen, w.claimGen[id-1])
		return
	}
	if ex := w.expects[id]; ex != nil && ex.answer && w.wrote[id-1] {
		w.violation("message %d was failed as a stage bug (answered 0, left running), but its stage had committed a transition on that visit (which a PostgreSQL crash then lost): it must be requeued", id)
	}
}

// ---- the end ----

func (w *world) endLifeModel(exact bool) {
	t := w.truth()
	t.exact = exact
	if !exact {
		// Statistics carried into this life from lives that lost their lock
		// may be lost with it.
		for k := t.carriedFrom; k > 0; k = w.truths[k-1].carriedFrom {
			w.truths[k-1].exact = false
		}
	}
}

// finalCheck runs after healing, once everything is quiescent: nothing lost,
// every message final, and the statistics flushed as they happened.
func (w *world) finalCheck() {
	w.truth().exact = true // the life running at the end must have flushed everything
	rows := w.q.Rows()
	if len(rows) != w.inserted {
		w.violation("%d rows in the queue, %d inserted", len(rows), w.inserted)
		return
	}
	for _, r := range rows {
		if !r.Status.Final() {
			w.violation("row %d is %s at %s at the end", r.ID, r.Status, r.Stage)
			return
		}
	}
	stages, passes, left, _ := w.q.Stats()
	lo, hi := &truth{stages: map[string]*core.StageDelta{}}, &truth{stages: map[string]*core.StageDelta{}}
	for _, t := range w.truths {
		add(hi, t)
		if t.exact {
			add(lo, t)
		}
	}
	check := func(what string, got, lo, hi int64) bool {
		if got < lo || got > hi {
			if lo == hi {
				w.violation("flushed %s = %d, want %d (what happened)", what, got, lo)
			} else {
				w.violation("flushed %s = %d, want between %d (lives that must have flushed) and %d (all lives)", what, got, lo, hi)
			}
			return false
		}
		return true
	}
	if !check("dispatch_stats.stage_passes", passes, lo.passes, hi.passes) ||
		!check("dispatch_stats.messages_left", left, lo.left, hi.left) {
		return
	}
	names := map[string]bool{}
	for n := range stages {
		names[n] = true
	}
	for n := range hi.stages {
		names[n] = true
	}
	for _, n := range sortedStrings(names) {
		g, l, h := stages[n], lo.stage(n), hi.stage(n)
		if !check("stage_stats["+n+"].processed", g.Processed, l.Processed, h.Processed) ||
			!check("stage_stats["+n+"].failed", g.Failed, l.Failed, h.Failed) ||
			!check("stage_stats["+n+"].timeouts", g.Timeouts, l.Timeouts, h.Timeouts) ||
			!check("stage_stats["+n+"].crashes", g.Crashes, l.Crashes, h.Crashes) ||
			!check("stage_stats["+n+"].processing_us", g.ProcessingUS, l.ProcessingUS, h.ProcessingUS) ||
			!check("stage_stats["+n+"].guard_misses", g.GuardMisses, l.GuardMisses, h.GuardMisses) ||
			!check("stage_stats["+n+"].retries", g.Retries, l.Retries, h.Retries) {
			return
		}
	}
	w.note("final check passed: %d messages, %d lives, passes %d, left %d", w.inserted, w.life, passes, left)
}

func add(sum, t *truth) {
	sum.passes += t.passes
	sum.left += t.left
	for _, n := range sortedStrings(keysOf(t.stages)) {
		addDelta(sum.stage(n), *t.stages[n])
	}
}

func addDelta(s *core.StageDelta, d core.StageDelta) { s.Add(d) }

func keysOf[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func sortedStrings(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// formatSim shows an instant as its offset in the run ("-" for none).
func formatSim(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Sub(epoch).String()
}
