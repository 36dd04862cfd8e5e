// The worker pools: answers and exits, assigning claimed ids to the fewest
// workers, spawning, stopping idle and recycled workers, and the watchdog.

package core

import (
	"fmt"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

func (c *Core) worker(id WorkerID) *worker { return c.workers[id] }

// answer applies one status line.
func (c *Core) answer(e Answer) {
	w := c.worker(e.Worker)
	if w == nil || w.cause == killProtocol {
		return // lines after a protocol error, or from a forgotten worker
	}
	if e.Unterminated {
		w.tail = &e // judged at the exit, which says how the output ended
		return
	}
	st := w.stage
	if len(w.queue) == 0 {
		c.protocolError(w, e.Line, "an answer with no message outstanding")
		return
	}
	if IsEmitLine(e.Line) {
		c.emitLine(w, e)
		return
	}
	if e.Cut {
		w.protoHow = protoCut
		c.protocolError(w, e.Line, fmt.Sprintf("a line longer than %d bytes", AnswerMax))
		return
	}
	s, err := ParseStatus(e.Line)
	if err != nil {
		if w.answered == 0 {
			w.protoHow = protoFirst
		}
		c.protocolError(w, e.Line, err.Error())
		return
	}
	head := w.queue[0]
	w.queue = w.queue[1:]
	w.answered++
	st.answeredAt = c.now
	emits, emitErr := w.takeEmits()
	elapsed := c.now.Sub(w.headSince).Microseconds()
	w.headSince = c.now
	if len(w.queue) == 0 {
		w.idleSince = c.now
	}
	// The program works: no cooldown holds the stage back any more, and
	// its workers do not all crash.
	if c.answerEndsCooldown(w) {
		st.cooldownStep, st.cooldownUntil = 0, time.Time{}
	}
	st.crashRun = 0
	c.proveStage(w)
	delete(c.startFails, head.id)

	d := c.creditPass(st, s.Fused, elapsed)
	if emitErr != "" {
		// Its emits cannot be inserted as the stage meant them: the message
		// fails, whatever the answer said, and the worker lives on.
		c.passEnded(w, head, Pass{Outcome: PassFail, Reason: emitErr})
		c.owe(Item{ID: head.id, Stage: st.cfg.Name, Verdict: Fail, Reason: emitErr})
		return
	}
	if t := s.Transition; s.Code == 0 && t != nil {
		c.answered(w, head, t, emits)
		return
	}
	c.emitsDropped(st, len(emits), head.id, fmt.Sprintf("answered %s", conf.Quote(clip(e.Line, 100))))
	if s.Code == 0 {
		d.Processed++
		c.passEnded(w, head, Pass{Outcome: PassWritten})
		c.owe(Item{ID: head.id, Stage: st.cfg.Name, Verdict: Answered, Epoch: head.epoch, Reason: st.stuckReason})
		return
	}
	reason := s.Reason
	if reason == "" {
		reason = defaultReason(st.cfg.Name, s.Code)
	}
	if s.Code == RetryCode && st.cfg.RetryLimit > 0 {
		c.retry(w, head, reason)
		return
	}
	c.passEnded(w, head, Pass{Outcome: PassFail, Reason: reason})
	c.owe(Item{ID: head.id, Stage: st.cfg.Name, Verdict: Fail, Reason: reason})
}

// creditPass credits a pass that took elapsed microseconds at stage st, the
// stages fused into it included, and returns st's statistics.
func (c *Core) creditPass(st *stage, fused []Fused, elapsed int64) *StageDelta {
	var fusedUS int64
	for _, f := range fused {
		d := c.stat(f.Stage)
		d.Processed++
		d.ProcessingUS = satAdd(d.ProcessingUS, f.Micros)
		fusedUS = satAdd(fusedUS, f.Micros)
	}
	c.passes += int64(len(fused))
	d := c.stat(st.cfg.Name)
	d.ProcessingUS += max(0, elapsed-fusedUS)
	return d
}

// passEnded counts the end of head's pass at worker w in stage_passes, and
// reports it (Pass) when the core reports passes; p says how it ended. Every
// pass counts, whatever its outcome (an answer of any code, a retry, a
// timeout, a crash or a protocol error at the head): stage_passes is all the
// stages' passes, processed only those answered 0. A message requeued
// behind a head had no pass.
func (c *Core) passEnded(w *worker, head msg, p Pass) {
	c.passes++
	// A pass that ended, whatever its outcome, ends the message's run of
	// failed starts: a later one is no longer "in a row" with those before,
	// and must not be held against it by a proof older than it.
	delete(c.startFails, head.id)
	if !c.tracePasses {
		return
	}
	p.ID, p.Stage, p.PID, p.Attempts = head.id, w.stage.cfg.Name, w.pid, head.attempts
	p.Claimed, p.Handed, p.Ended, p.Trace = head.claimed, c.hist.passes[head.id].handedAt, c.now, head.trace
	c.emit(p)
}

// answered owes the write of a transition the stage answered, or, when the
// dispatcher cannot write it (malformed, or a stage this dispatcher does not
// run), the message's failure. A pass with a transition the dispatcher can
// write counts as processed now, at its answer, whether or not the write
// commits (a guard miss, a lost lock: the stage did the work); one that
// fails counts as the failure it is.
//
// The pass's emits ride the item of a transition it can write (Item.Emits);
// those of one it cannot are dropped with the failure.
func (c *Core) answered(w *worker, head msg, t *Transition, emits []Emit) {
	name := w.stage.cfg.Name
	why := t.Invalid
	if why == "" && t.To != TargetDone && t.To != TargetPaused && c.byName[t.To] == nil {
		why = fmt.Sprintf("target %s is not a stage this dispatcher runs", conf.Quote(t.To))
	}
	if why != "" {
		c.emitsDropped(w.stage, len(emits), head.id, "answered a transition it cannot have")
		reason := fmt.Sprintf("stage %s answered a transition it cannot have: %s", name, why)
		c.passEnded(w, head, Pass{Outcome: PassFail, Reason: reason})
		c.owe(Item{ID: head.id, Stage: name, Verdict: Fail, Reason: reason})
		return
	}
	c.stat(name).Processed++
	it := Item{ID: head.id, Stage: name, Verdict: Move, To: t.To, Patch: t.Patch, Emits: emits}
	p := Pass{Outcome: PassAdvance, To: t.To}
	switch t.To {
	case TargetPaused:
		it.Until = c.now.Add(t.PauseFor)
		p = Pass{Outcome: PassPause}
	case TargetDone:
		p = Pass{Outcome: PassDone}
	}
	c.learnFeeder(name, t.To)
	for _, e := range emits {
		c.learnFeeder(name, e.Stage) // its emits feed their stages too
	}
	c.passEnded(w, head, p)
	c.owe(it)
}

// How a worker broke the protocol, for its head's reason (protoReason).
const (
	protoLine  = iota // a line that is not a status line
	protoCut          // a line longer than AnswerMax
	protoFirst        // its first line is not a status line: a banner?
)

// protoReason is the failure reason of the head of worker w of stage name,
// killed for a protocol error. A first line that is not an answer gets a
// hint: the protocol cannot tell a banner or a log line from an answer (one
// starting "0 " would be taken as one), so such a line is not skipped; the
// reason says what it likely is.
func protoReason(name string, w *worker) string {
	switch w.protoHow {
	case protoCut:
		return fmt.Sprintf("stage %s: protocol error: worker pid %d answered a line longer than %d bytes, the most an answer may have; it began %s",
			name, w.pid, AnswerMax, conf.Quote(w.protoLine))
	case protoFirst:
		return fmt.Sprintf("stage %s: protocol error: worker pid %d answered %s, its first line, which is not an answer (a banner or a log line on standard output? it carries answers only)",
			name, w.pid, conf.Quote(w.protoLine))
	}
	return fmt.Sprintf("stage %s: protocol error: worker pid %d answered %s", name, w.pid, conf.Quote(w.protoLine))
}

func (c *Core) protocolError(w *worker, line, why string) {
	w.cause = killProtocol
	w.protoLine = clip(line, 200)
	w.state = killed
	if w.exited {
		// Its last line, judged at its exit (judgeTail): nothing to kill.
		c.logf(LevelError, "stage %s worker pid %d broke the protocol (%s) in the last line it wrote before it exited", w.stage.cfg.Name, w.pid, why)
		return
	}
	c.emit(Kill{Worker: w.id})
	c.logf(LevelError, "stage %s worker pid %d broke the protocol (%s); killing it", w.stage.cfg.Name, w.pid, why)
}

func (c *Core) requeue(st *stage, ms []msg) {
	for _, m := range ms {
		c.requeuedPass(st, m)
		c.owe(Item{ID: m.id, Stage: st.cfg.Name, Verdict: Requeue})
	}
}

// requeuedPass reports the pass of m, requeued at stage st, when its line
// had been handed to a worker: that worker ended without answering it (it
// waited behind a crash, a timeout or a shutdown). The line carried the
// pass's traceparent, and the first pass of a trace the claim began is the
// trace's root, every later pass's parent: without its span the trace would
// name a parent no one exported. A message requeued before it was handed
// had no pass. Not counted among the passes (c.passes): no answer ended it.
// Read before its item is owed, which ends what history knows of it.
func (c *Core) requeuedPass(st *stage, m msg) {
	h, ok := c.hist.passes[m.id]
	if !c.tracePasses || !ok || h.handedAt.IsZero() {
		return
	}
	c.emit(Pass{ID: m.id, Stage: st.cfg.Name, PID: h.pid, Attempts: m.attempts, Outcome: PassRequeue,
		Reason: "requeued: its worker ended without answering it", Claimed: m.claimed, Handed: h.handedAt, Ended: c.now, Trace: m.trace})
}

// crashed counts a worker crash in the stage's run of them (health.go).
func (st *stage) crashed(how string) {
	st.crashRun++
	st.crashErr = how
}

func (c *Core) removeWorker(w *worker) {
	delete(c.workers, w.id)
	st := w.stage
	st.workers = slices.DeleteFunc(st.workers, func(x *worker) bool { return x == w })
}

// cooldown holds the stage's spawns back after a failed start of a worker
// spawned at spawnedAt. It doubles once per round of starts: workers spawned
// before the cooldown last doubled were started in the round that doubled it
// (a missing program fails every spawn of a step; a program that exits at
// once, on a bad config, exits from each worker at a slightly different
// instant), so their failures are one failed start, not one per worker. Only
// a worker spawned after that, a new try, doubles it again. A later failure
// of the same round holds the stage back as long again from its own instant,
// so that no start follows a failure sooner than its log line says.
func (c *Core) cooldown(st *stage, spawnedAt time.Time) {
	if st.cooldownStep > 0 && !spawnedAt.After(st.cooldownAt) {
		if until := c.now.Add(st.cooldownStep); until.After(st.cooldownUntil) {
			st.cooldownUntil = until
		}
		return
	}
	st.cooldownFrom = spawnedAt // a new round: only workers spawned since prove it over
	st.cooldownStep = min(max(2*st.cooldownStep, CooldownMin), CooldownMax)
	st.cooldownUntil, st.cooldownAt = c.now.Add(st.cooldownStep), c.now
}

// judgeTail takes w's last line, written without a newline, as an answer if
// w exited by itself with status 0, and drops it if w was killed, by the
// dispatcher (a timeout, a stop's grace, a shutdown) or by a signal, or
// exited with another status (a shell stage under set -e whose command
// failed between "0 >b" and the rest of its line): a line cut off by the
// kill ("0 >b" of "0 >bx") would be judged as another answer than the one
// the stage was writing. Its head then ends as the kill says (timed out,
// requeued, failed as a crash).
func (c *Core) judgeTail(w *worker, e WorkerExited) {
	t := w.tail
	if t == nil {
		return
	}
	w.tail = nil
	if w.cause == killNone && e.Signal == "" && e.Code == 0 {
		t.Unterminated = false
		c.answer(*t)
		return
	}
	c.logf(LevelWarn, "stage %s worker pid %d: its last line %s had no newline when it ended (%s); dropped, not taken as an answer",
		w.stage.cfg.Name, w.pid, conf.Quote(clip(t.Line, 100)), exitHow(w, e))
}

// exitHow says how a worker ended for a log line: killed by the dispatcher
// (and why), by a signal, or with a non-zero exit status.
func exitHow(w *worker, e WorkerExited) string {
	switch {
	case w.cause == killTimeout:
		return "killed at MAX_RUNTIME"
	case w.cause == killGrace:
		return "killed at STOP_GRACE"
	case w.cause != killNone:
		return "killed by the dispatcher"
	case e.Killed != "" && e.Signal == "killed":
		// (A worker that exited by itself just before the shell's kill
		// reports its own status: the kill did not happen.)
		return "killed by the dispatcher: " + e.Killed
	case e.Signal != "":
		return "signal " + e.Signal
	}
	return fmt.Sprintf("exit status %d", e.Code)
}

// answerEndsCooldown says whether an answer of w shows that its stage's
// program starts, so that its cooldown ends. An answer of a worker started
// no earlier than the one whose failed start began the cooldown's latest
// round (cooldownFrom) does. An older worker may run the program as it
// was before a deployment that broke it: ending the cooldown at its answers
// would show the stage ok and start failing workers at once. Its answers end
// the cooldown only once it has run out with no new try alive (none was
// needed): else a stage whose workers suffice would show cannot_start for
// good.
func (c *Core) answerEndsCooldown(w *worker) bool {
	st := w.stage
	if !w.spawnedAt.Before(st.cooldownFrom) {
		return true
	}
	if c.now.Before(st.cooldownUntil) {
		return false
	}
	return !slices.ContainsFunc(st.workers, func(x *worker) bool { return x.spawnedAt.After(st.cooldownAt) })
}

// exitedWorker decides what a worker's exit means for the messages it held.
func (c *Core) exitedWorker(e WorkerExited) {
	w := c.worker(e.Worker)
	if w == nil {
		return
	}
	w.exited = true
	c.judgeTail(w, e)
	c.removeWorker(w)
	st := w.stage
	name := st.cfg.Name
	how := exitHow(w, e) // w.cause is killNone where how is used
	q := w.queue
	switch w.cause {
	case killTimeout:
		if len(q) > 0 && q[0].id == w.timedOut {
			reason := fmt.Sprintf("stage %s: no answer within MAX_RUNTIME %s; worker pid %d killed", name, st.maxRuntime, w.pid)
			c.passEnded(w, q[0], Pass{Outcome: PassTimeout, Reason: reason})
			c.owe(Item{ID: q[0].id, Stage: name, Verdict: TimeOut, Reason: reason})
			q = q[1:]
		}
		c.requeue(st, q)
		return
	case killProtocol:
		c.stat(name).Crashes++
		st.crashed(fmt.Sprintf("worker pid %d broke the protocol", w.pid))
		if len(q) > 0 {
			c.passEnded(w, q[0], Pass{Outcome: PassCrash, Reason: protoReason(name, w)})
			c.owe(Item{ID: q[0].id, Stage: name, Verdict: Fail, Reason: protoReason(name, w), Event: HistoryCrashed})
			q = q[1:]
		}
		c.requeue(st, q)
		return
	case killGrace, killNow:
		// After a second shutdown request nothing more is written (no
		// transaction starts, shutdown.go): the requeues are owed only to be
		// counted among the results unwritten, and the rows stay running
		// until the next start-up resets them. Whatever killed the worker,
		// the log says so then.
		switch {
		case len(q) == 0:
		case c.shutdown == 2:
			c.logf(LevelWarn, "stage %s worker pid %d killed while stopping; its %d messages are left running for the next start-up's reset", name, w.pid, len(q))
		default:
			c.logf(LevelWarn, "stage %s worker pid %d killed while stopping; requeued %d messages", name, w.pid, len(q))
		}
		c.requeue(st, q)
		return
	}
	if w.state == stopping && len(q) == 0 && e.Code == 0 && e.Signal == "" {
		return // a clean stop: reaped, recycled or shut down
	}
	c.stat(name).Crashes++
	if w.answered == 0 && c.now.Sub(w.spawnedAt) < StartWindow {
		c.startFailed(w, q, how)
		return
	}
	st.crashed(fmt.Sprintf("worker pid %d died (%s)", w.pid, how))
	if len(q) == 0 {
		c.logf(LevelError, "stage %s worker pid %d died unexpectedly (%s) holding no message", name, w.pid, how)
		return
	}
	reason := fmt.Sprintf("stage %s: worker pid %d crashed (%s) while handling the message", name, w.pid, how)
	c.passEnded(w, q[0], Pass{Outcome: PassCrash, Reason: reason})
	c.owe(Item{ID: q[0].id, Stage: name, Verdict: Fail, Event: HistoryCrashed, Reason: reason})
	c.requeue(st, q[1:])
	c.logf(LevelError, "stage %s worker pid %d crashed (%s); failed message %d unless its stage had moved it on, requeued %d", name, w.pid, how, q[0].id, len(q)-1)
}

// startFailed takes the exit of worker w, which held q, before it answered
// anything, early in its life (StartWindow): a program that cannot start,
// which is not the message's fault, unless the same message keeps being at
// the head of such failures. how says how it exited.
func (c *Core) startFailed(w *worker, q []msg, how string) {
	st := w.stage
	name := st.cfg.Name
	c.cooldown(st, w.spawnedAt)
	st.startErr = fmt.Sprintf("program %s: worker pid %d exited (%s) before answering anything", conf.Quote(st.cfg.Program), w.pid, how)
	if len(q) > 0 {
		head := q[0]
		if len(c.startFails) >= startFailsMax {
			clear(c.startFails)
		}
		f, ok := c.startFails[head.id]
		if !ok {
			f.firstSpawn = w.spawnedAt
		}
		f.n++
		c.startFails[head.id] = f
		switch {
		case f.n < StartFailLimit:
		case !st.provenSpawn.Before(f.firstSpawn):
			// A worker started no earlier than this message's first failed
			// start has shown the program starts (it answered, or a probe
			// lived): the message kills its workers, not the deployment.
			// An older worker's answers prove nothing: it may run the
			// program as it was before the deployment that broke it.
			delete(c.startFails, head.id)
			reason := fmt.Sprintf("stage %s: message was at the head of %d failed worker starts in a row (last: %s), while the stage's program could start", name, f.n, how)
			c.passEnded(w, head, Pass{Outcome: PassCrash, Reason: reason})
			c.owe(Item{ID: head.id, Stage: name, Verdict: Fail, Event: HistoryCrashed, Reason: reason})
			q = q[1:]
		case !st.probe:
			// Nothing has shown the program can start at all: a broken
			// deployment fails no message. The next worker proves it or not.
			st.probe, st.probeFrom = true, f.firstSpawn
			c.logf(LevelWarn, "stage %s: message %d was at the head of %d failed worker starts in a row; the stage's next worker is handed nothing until it has lived %s, to tell a message that kills its workers from a program that cannot start",
				name, head.id, f.n, StartWindow)
		}
	}
	c.requeue(st, q)
	c.giveBackClaimed(st)
	held := "requeued its messages"
	if len(q) == 0 {
		held = "it held no message"
	}
	c.logf(LevelError, "stage %s worker pid %d exited (%s) before answering anything; %s; next start in %s",
		name, w.pid, how, held, st.cooldownStep)
}

// giveBackClaimed requeues st's claimed rows after a failed start when no
// worker of st is left: none can take them before the cooldown ends (nor for
// StartWindow after, should the next be a probe), so the queue shows them
// pending, as nothing runs them, just as the ids of the worker that failed.
func (c *Core) giveBackClaimed(st *stage) {
	if len(st.workers) == 0 && len(st.backlog) > 0 {
		c.requeue(st, st.backlog)
		st.backlog = nil
	}
}

// startFail is a message's run of failed starts at the head of a worker:
// how many, and when the worker of the first of them was spawned.
type startFail struct {
	n          int
	firstSpawn time.Time
}

// proveStage records that st's program, as worker w was started with it,
// starts: a failed start of a message since w's spawn counts against the
// message, and once a worker spawned since probing began proves it, the
// probes become workers like the others.
func (c *Core) proveStage(w *worker) {
	st := w.stage
	if w.spawnedAt.After(st.provenSpawn) {
		st.provenSpawn = w.spawnedAt
	}
	if !st.probe || st.provenSpawn.Before(st.probeFrom) {
		return // an older worker's answer: it says nothing of the program now
	}
	st.probe = false
	for _, w := range st.workers {
		if w.probe {
			// Idle from now: until now it could be handed nothing.
			w.probe, w.idleSince = false, c.now
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

// reapIdle stops ready worker w if it has been idle for WORKER_IDLE_TIMEOUT
// with nothing waiting at its stage.
func (c *Core) reapIdle(w *worker) {
	if w.state == ready && len(w.queue) == 0 && len(w.stage.backlog) == 0 && !c.now.Before(w.idleSince.Add(c.cfg.IdleTimeout)) {
		c.stop(w) // reap
	}
}

// reapAfterAssign reaps the workers a step's hand-out left idle past
// WORKER_IDLE_TIMEOUT: its stage's backlog, which kept them (a probe, idle
// beside it until StartWindow), went to other workers in this step, after
// timers looked.
func (c *Core) reapAfterAssign() {
	for _, id := range c.workerIDs() {
		if w := c.workers[id]; w.handed < w.stage.cfg.MaxMessages {
			c.reapIdle(w)
		}
	}
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
		c.checkDue = true
		c.lookAll()
	}
	c.lookUnwatched()
	for _, id := range c.workerIDs() {
		w := c.workers[id]
		switch w.state {
		case ready:
			if len(w.queue) > 0 {
				c.watchdog(w)
				continue
			}
			if w.probe && !c.now.Before(w.spawnedAt.Add(StartWindow)) {
				c.proveStage(w) // it lived: the program starts
			}
			if w.handed >= w.stage.cfg.MaxMessages {
				c.stop(w) // recycle: its pipeline has drained
			} else {
				c.reapIdle(w)
			}
		case stopping:
			// A stop's grace does not stop the watchdog: a head already
			// past MAX_RUNTIME times out, rather than being requeued to
			// start its MAX_RUNTIME afresh at the next start.
			if len(w.queue) > 0 && c.watchdog(w) {
				continue
			}
			if !c.now.Before(w.stopBy) {
				w.state = killed
				w.cause = killGrace
				c.emit(Kill{Worker: w.id})
				c.logf(LevelWarn, "stage %s worker pid %d did not exit within %s of being stopped; killing it",
					w.stage.cfg.Name, w.pid, c.cfg.StopGrace)
			}
		}
	}
}

// watchdog kills w, which holds messages, if its head has run its stage's
// MAX_RUNTIME (not while the database is down: no stage can commit then),
// and says whether it did.
func (c *Core) watchdog(w *worker) bool {
	if c.dbDown || c.now.Before(w.headSince.Add(w.stage.maxRuntime)) {
		return false
	}
	w.state = killed
	w.cause = killTimeout
	w.timedOut = w.queue[0].id
	c.emit(Kill{Worker: w.id})
	c.logf(LevelWarn, "stage %s worker pid %d: message %d unanswered after MAX_RUNTIME %s; killing the worker",
		w.stage.cfg.Name, w.pid, w.timedOut, w.stage.maxRuntime)
	return true
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
// minus what its workers hold, what is claimed but not yet handed over, and
// what the outstanding resolves' moves may claim (stage.reserved). Slots of
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
	free -= st.reserved // moves the outstanding resolves may claim
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
				if w.state == ready && !w.probe && w.room() > 0 && (best == nil || len(w.queue) > len(best.queue)) {
					best = w
				}
			}
			if best == nil {
				break
			}
			n := min(best.room(), len(st.backlog))
			wr := Write{Worker: best.id, IDs: make([]int64, n)}
			if st.cfg.Input == conf.InputMessage {
				wr.Lines = make([]string, n)
			}
			for i := range st.backlog[:n] {
				m := &st.backlog[i]
				wr.IDs[i] = m.id
				c.handPass(m.id, best)
				if wr.Lines != nil {
					wr.Lines[i], m.line = m.line, ""
				}
			}
			if len(best.queue) == 0 {
				best.headSince = c.now
			}
			best.queue = append(best.queue, st.backlog[:n]...)
			best.handed += n
			st.backlog = slices.Delete(st.backlog, 0, n)
			c.emit(wr)
		}
		need := len(st.backlog)
		for _, w := range st.workers {
			if w.state == starting || w.probe {
				need -= w.room()
			}
		}
		for need > 0 && len(st.workers) < st.cfg.Parallelism && !st.coolingDown(c.now) {
			c.nextWID++
			w := &worker{id: c.nextWID, stage: st, state: starting, spawnedAt: c.now, idleSince: c.now, probe: st.probe}
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
	ids = append(ids, c.outstandingItems()...)
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

func (c *Core) workerStarted(e WorkerStarted) {
	w := c.worker(e.Worker)
	if w == nil {
		return
	}
	w.pid = e.PID
	// The program could be run: what its last check found no longer holds.
	w.stage.programErr, w.stage.programCheckAt = "", time.Time{}
	if w.state == starting {
		w.state = ready
		w.idleSince = c.now
	}
}

func (c *Core) spawnFailed(e SpawnFailed) {
	w := c.worker(e.Worker)
	if w == nil {
		return
	}
	c.removeWorker(w)
	c.cooldown(w.stage, w.spawnedAt)
	w.stage.startErr = e.Err
	c.giveBackClaimed(w.stage)
	c.logf(LevelError, "stage %s: cannot start %s: %s; next try in %s", w.stage.cfg.Name, w.stage.cfg.Program, e.Err, w.stage.cooldownStep)
}
