package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// proc is a fake worker process. Like a real one it reads ids in order, handles
// one message at a time (commit, then answer), answers strictly in order, and
// after its standard input closes finishes what it was handed and exits 0. What it
// does with each message comes from the scenario (the message's visit at this
// stage); how the process itself misbehaves (cannot start, dies at once, starts
// slowly) from the world's fault schedule.
type proc struct {
	id      core.WorkerID
	life    int
	stage   int
	pid     int
	never   bool             // the program could not be started: no process exists
	readyAt time.Time        // it reads its first id no earlier (a slow start)
	inbox   []int64          // handed, not yet started
	lines   map[int64]string // INPUT = message: the line handed with each id
	busy    bool             // handling cur
	cur     int64
	try     attempt
	written bool // the current try has committed its transition
	feeding bool // a read is scheduled
	eof     bool // standard input closed
	hung    bool // it wrote a malformed line and does nothing more
	// tail: the line it began writing without a newline (kCutOff), which
	// reaches the dispatcher when its output ends, just before its exit.
	tail    *answerInfo
	exiting bool // an exit (or death) is scheduled
	dead    bool
	outAt   time.Time // its last output's delivery: output stays in order
}

func (w *world) proc(id core.WorkerID) *proc {
	p := w.procs[id]
	if p == nil {
		w.broke(ruleWorldConsistent, "command for %s, which was never spawned in this life", id)
	}
	return p
}

// brokenNow returns the broken-program window of stage s in force now, if any.
func (w *world) brokenNow(s int) (broken, bool) {
	if w.healing {
		return broken{}, false
	}
	off := w.offset()
	for _, b := range w.sc.faults.broken {
		if b.stage == s && b.w.from <= off && off < b.w.to {
			return b, true
		}
	}
	return broken{}, false
}

// stageOf returns the index of the configured stage name.
func (w *world) stageOf(name string) (int, bool) {
	for i, st := range w.sc.stages {
		if st.name == name {
			return i, true
		}
	}
	return 0, false
}

func (w *world) stageIndex(name string) int {
	for i, st := range w.sc.stages {
		if st.name == name {
			return i
		}
	}
	panic(fmt.Sprintf("sim: unknown stage %q", name))
}

// spawn answers a Spawn at once, as the shell does: the program starts or it
// cannot be started.
func (w *world) spawn(x core.Spawn) {
	s := w.stageIndex(x.Stage)
	p := &proc{id: x.Worker, life: w.life, stage: s, readyAt: w.now}
	w.procs[x.Worker] = p
	b, isBroken := w.brokenNow(s)
	if isBroken && !b.diesAtOnce {
		p.never, p.dead = true, true
		w.pending = append(w.pending, core.SpawnFailed{Worker: x.Worker,
			Err: fmt.Sprintf("exec: %q: executable file not found in $PATH", x.Stage+"-stage")})
		return
	}
	w.pids++
	p.pid = 1000 + w.pids
	if w.chance(w.rFault, w.sc.faults.lateStart) {
		// The shell reports the start late: until then the core sees a worker
		// starting, which it may stop or kill but must not hand ids.
		p.readyAt = w.now.Add(w.randDur(w.rFault, time.Millisecond, 2*time.Second))
		p.outAt = p.readyAt
		w.note("%s pid %d: its start is reported at %s", x.Worker, p.pid, p.readyAt.Sub(epoch))
		w.at(p.readyAt, p.life, w.deliver(core.WorkerStarted{Worker: x.Worker, PID: p.pid}))
	} else {
		w.pending = append(w.pending, core.WorkerStarted{Worker: x.Worker, PID: p.pid})
	}
	if w.chance(w.rFault, w.sc.faults.babble) {
		w.after(w.randDur(w.rFault, 0, 10*time.Second), func() { w.babble(p) })
	}
	switch {
	case isBroken:
		w.note("%s pid %d cannot connect and will exit at once", x.Worker, p.pid)
		p.exiting = true
		w.after(w.randDur(w.rProc, time.Millisecond, 500*time.Millisecond), func() { w.die(p, 1, "") })
	case w.chance(w.rProc, w.sc.faults.slowStart):
		p.readyAt = p.readyAt.Add(w.randDur(w.rProc, time.Second, 8*time.Second))
		w.note("%s pid %d starts slowly: reads its first id at %s", x.Worker, p.pid, p.readyAt.Sub(epoch))
	}
}

func (w *world) write(x core.Write) {
	p := w.proc(x.Worker)
	if p == nil || p.never {
		return
	}
	p.inbox = append(p.inbox, x.IDs...)
	for i, line := range x.Lines {
		if p.lines == nil {
			p.lines = map[int64]string{}
		}
		p.lines[x.IDs[i]] = line
	}
	w.feed(p)
}

func (w *world) stop(x core.Stop) {
	p := w.proc(x.Worker)
	if p == nil || p.never || p.dead {
		return
	}
	p.eof = true
	w.feed(p)
}

func (w *world) kill(x core.Kill) {
	p := w.proc(x.Worker)
	if p == nil || p.never || p.dead {
		return
	}
	if id := p.cur; p.busy && p.try.kind.writes() && !w.answers(p, id, p.try) && !p.written && !w.dbDown() && w.chance(w.rProc, w.sc.faults.lateCommit) {
		// Its COMMIT was on its way: the server applies it while the resolve
		// the kill leads to waits on the row.
		w.note("%s's commit of message %d is on its way as it is killed", p.id, id)
		w.q.CommitDuringResolve(id, func() {
			from, to, status, timeout := w.transition(p, id)
			if w.q.StageWrite(id, from, to, status, timeout) {
				w.wrote[w.slot(id)], p.written = true, true
				w.note("%s's late commit of message %d lands: %s -> %s %s", p.id, id, from, to, status)
			}
		})
	}
	// SIGKILL takes a moment to land; until then the process may still commit
	// and answer.
	w.after(w.randDur(w.rProc, 0, 50*time.Millisecond), func() { w.die(p, -1, "killed") })
}

// feed makes an idle process read its next id, or exit after end of input.
func (w *world) feed(p *proc) {
	if p.dead || p.busy || p.hung || p.exiting || p.feeding {
		return
	}
	if w.now.Before(p.readyAt) {
		p.feeding = true
		w.at(p.readyAt, p.life, func() { p.feeding = false; w.feed(p) })
		return
	}
	if len(p.inbox) == 0 {
		if p.eof {
			p.exiting = true
			w.after(w.randDur(w.rProc, 0, 50*time.Millisecond), func() { w.die(p, 0, "") })
		}
		return
	}
	id := p.inbox[0]
	p.inbox = p.inbox[1:]
	p.busy, p.cur = true, id
	w.begin(p, id)
}

// begin starts handling id: the stage reads its row, and the try is chosen.
func (w *world) begin(p *proc, id int64) {
	name := w.sc.stages[p.stage].name
	if !w.dbDown() {
		r, _ := w.q.Get(id)
		if r.Status != core.StatusRunning || r.Stage != name {
			w.broke(ruleWorldConsistent, "%s (stage %s) was handed message %d, but its row is %s at %s: not claimed for this stage",
				p.id, name, id, r.Status, r.Stage)
			return
		}
	}
	if w.sc.stages[p.stage].message {
		// The stage reads its message from the line it was handed, never from
		// the database.
		line, ok := p.lines[id]
		delete(p.lines, id)
		if !ok || !strings.HasPrefix(line, fmt.Sprintf(`{"id":%d,`, id)) {
			w.broke(ruleWorldConsistent, "%s (stage %s, INPUT = message) read message %d without its line (got %q)", p.id, name, id, line)
			return
		}
	}
	m := w.sc.messages[w.msgOf[w.slot(id)]]
	if p.stage < m.first || p.stage > m.last {
		w.broke(ruleWorldConsistent, "message %d reached stage %s, which its route (%s..%s) never visits",
			id, name, w.sc.stages[m.first].name, w.sc.stages[m.last].name)
		return
	}
	v := m.visits[p.stage-m.first]
	n := w.tries[w.slot(id)][p.stage]
	w.tries[w.slot(id)][p.stage]++
	a := attempt{kind: kGood, latency: v.latency}
	if !w.healing && n < len(v.trouble) {
		a = v.trouble[n]
	}
	p.try, p.written = a, false
	w.wrote[w.slot(id)] = false
	w.note("%s starts message %d at %s: %s, %s", p.id, id, name, a.kind, a.latency)
	w.after(a.latency, func() { w.conclude(p, id) })
}

// conclude ends the try of id: commit (waiting for the database if it is down),
// then answer, die or babble.
func (w *world) conclude(p *proc, id int64) {
	if p.dead {
		return
	}
	a := p.try
	if a.kind == kCrash {
		c := crashCodes[w.rProc.IntN(len(crashCodes))]
		w.die(p, c.code, c.signal)
		return
	}
	answers := w.answers(p, id, a)
	if a.kind.writes() && !answers {
		if w.dbDown() {
			// The stage library reconnects and runs the message again.
			w.at(w.upAt().Add(w.randDur(w.rProc, 100*time.Millisecond, time.Second)), p.life, func() { w.conclude(p, id) })
			return
		}
		w.commit(p, id)
	}
	if answers && !w.dbDown() && w.chance(w.rWrite, w.sc.faults.answerWrite) {
		w.alsoWrite(p, id)
	}
	switch a.kind {
	case kCrashAfter:
		w.die(p, 1, "")
		return
	case kMalformed, kMalformedAfter:
		w.answer(p, answerInfo{line: a.line, malformed: true})
		p.hung = true
		return
	case kCutOff:
		good := w.goodAnswer(p, id)
		half := answerInfo{line: good.line[:max(1, len(good.line)/2)], cutOff: true, malformed: true}
		switch a.cut {
		case cutWholeExit0: // its last answer, whole, then it exits by itself
			w.emitLines(p, p.cur, good)
			good.cutOff = true
			p.tail = &good
			w.die(p, 0, "")
		case cutHalfExit1: // set -e: what it ran between the halves failed
			p.tail = &half
			w.die(p, 1, "")
		default: // killed while writing it
			p.tail = &half
			p.hung = true
		}
		return
	case kFail, kFailAfter:
		w.answer(p, parseFailLine(a.line))
	case kStageBug:
		w.answer(p, answerInfo{line: "0"})
	case kBadAnswer:
		w.answer(p, answerInfo{line: a.line, bad: true})
	case kRefused:
		w.answer(p, w.refusedAnswer(p, id))
	case kDoubleWrite:
		w.answer(p, w.moveAnswer(p, id, a))
	case kPause:
		// The answer may reach the dispatcher well after the commit (a worker
		// descheduled between its COMMIT and its write): a pause already due
		// must not be woken and handed out again in between.
		w.answerAfter(p, w.randDur(w.rProc, 0, 2*time.Second), func() answerInfo {
			if answers {
				return w.moveAnswer(p, id, a)
			}
			return answerInfo{line: "0"}
		})
		return
	default:
		if answers {
			w.answer(p, w.moveAnswer(p, id, a))
			break
		}
		m := w.sc.messages[w.msgOf[w.slot(id)]]
		if lag := m.visits[p.stage-m.first].lag; lag > 0 && a.kind == kGood && !w.healing {
			// Committed; the answer follows a while later.
			w.answerAfter(p, lag, func() answerInfo { return w.goodAnswer(p, id) })
			return
		}
		w.answer(p, w.goodAnswer(p, id))
	}
	p.busy, p.cur = false, 0
	w.feed(p)
}

// answerAfter writes the answer line makes d from now (a worker descheduled
// between its COMMIT and its write), unless the worker died meanwhile, then
// takes its next message.
func (w *world) answerAfter(p *proc, d time.Duration, line func() answerInfo) {
	w.at(w.now.Add(d), p.life, func() {
		if p.dead {
			return
		}
		w.answer(p, line())
		p.busy, p.cur = false, 0
		w.feed(p)
	})
}

// goodAnswer is the status line of the good pass: "0" plus the fused stage.
func (w *world) goodAnswer(p *proc, id int64) answerInfo {
	m := w.sc.messages[w.msgOf[w.slot(id)]]
	v := m.visits[p.stage-m.first]
	if v.fuse && p.stage+1 <= m.last {
		f := w.sc.stages[p.stage+1].name
		st := core.Status{Fused: []core.Fused{{Stage: f, Micros: v.fusedUS}}}
		return answerInfo{line: st.Line(), fused: st.Fused}
	}
	return answerInfo{line: "0"}
}

// answers reports whether this try answers its transition instead of writing
// it: its visit answers, the kind has an answer form, and it is not a finish as
// failed (which has none).
func (w *world) answers(p *proc, id int64, a attempt) bool {
	m := w.sc.messages[w.msgOf[w.slot(id)]]
	v := m.visits[p.stage-m.first]
	if !v.answers || !a.kind.answerable() {
		return false
	}
	return a.kind == kPause || a.kind == kAgain || a.kind == kBack || w.next(p, id) <= m.last || m.end == core.StatusDone
}

// next is the stage the good pass moves the message to (past the last stage:
// it finishes).
func (w *world) next(p *proc, id int64) int {
	m := w.sc.messages[w.msgOf[w.slot(id)]]
	v := m.visits[p.stage-m.first]
	next := p.stage + 1
	if v.fuse && p.stage+1 <= m.last {
		next++
	}
	return next
}

// lineMax is the longest status line the protocol allows, newline included.
const lineMax = 64 << 10

// moveAnswer is the status line of a try that answers its transition:
// "0 >TARGET", the fused stage's time, and a state patch.
func (w *world) moveAnswer(p *proc, id int64, a attempt) answerInfo {
	m := w.sc.messages[w.msgOf[w.slot(id)]]
	v := m.visits[p.stage-m.first]
	info := answerInfo{move: &core.Item{}}
	switch next := w.next(p, id); {
	case a.kind == kPause:
		info.move.To, info.pauseFor = core.TargetPaused, a.pause
	case a.kind == kAgain:
		info.move.To = w.sc.stages[p.stage].name
	case a.kind == kBack:
		info.move.To = w.sc.stages[p.stage-1].name
	case next > m.last:
		info.move.To = core.TargetDone
	default:
		info.move.To = w.sc.stages[next].name
	}
	st := core.Status{Transition: &core.Transition{To: info.move.To, PauseFor: info.pauseFor}}
	if a.kind != kPause && a.kind != kAgain && a.kind != kBack && v.fuse && p.stage+1 <= m.last {
		st.Fused = []core.Fused{{Stage: w.sc.stages[p.stage+1].name, Micros: v.fusedUS}}
		info.fused = st.Fused
	}
	if v.patch {
		info.move.Patch = fmt.Sprintf(`{"by":%q,"id":%d,"try":%d}`, w.sc.stages[p.stage].name, id, w.tries[w.slot(id)][p.stage])
		if v.bigPatch {
			// Padded so the whole line is 64 KiB less one byte (its newline).
			room := lineMax - 1 - len(spell(st, v.fraction)) - len(" ") - len(info.move.Patch) - len(`,"pad":""`)
			info.move.Patch = info.move.Patch[:len(info.move.Patch)-1] + `,"pad":"` + strings.Repeat("x", room) + `"}`
		}
		st.Transition.Patch = info.move.Patch
	}
	info.line = spell(st, v.fraction)
	return info
}

// refusedAnswer is the good pass's transition with refusedPatch, which the
// world's database refuses.
func (w *world) refusedAnswer(p *proc, id int64) answerInfo {
	m := w.sc.messages[w.msgOf[w.slot(id)]]
	info := w.moveAnswer(p, id, attempt{kind: kGood})
	info.move.Patch = refusedPatch
	st := core.Status{Transition: &core.Transition{To: info.move.To, Patch: refusedPatch}, Fused: info.fused}
	info.line = spell(st, m.visits[p.stage-m.first].fraction)
	return info
}

// spell writes st as its status line. With fraction, a pause is written with
// six decimals (zero included): another spelling the dispatcher must read as
// well as the one core.Status.Line writes.
func spell(st core.Status, fraction bool) string {
	line := st.Line()
	if t := st.Transition; fraction && t.To == core.TargetPaused {
		head := core.Status{Transition: &core.Transition{To: t.To, PauseFor: t.PauseFor}}.Line()
		line = fmt.Sprintf("0 >%s:%.6f", t.To, t.PauseFor.Seconds()) + strings.TrimPrefix(line, head)
	}
	return line
}

// commit makes the try's transition, guarded like a real stage's. A try whose
// COMMIT already landed late, while a kill's resolve waited on the row (see
// kill), has nothing left to commit: that was this same COMMIT.
func (w *world) commit(p *proc, id int64) {
	if p.written {
		return
	}
	from, to, status, timeout := w.transition(p, id)
	if !w.q.StageWrite(id, from, to, status, timeout) {
		r, _ := w.q.Get(id)
		w.broke(ruleWorldConsistent, "%s (stage %s) cannot commit message %d: its row is %s at %s, not running here", p.id, from, id, r.Status, r.Stage)
		return
	}
	w.wrote[w.slot(id)], p.written = true, true
	w.note("%s commits message %d: %s -> %s %s", p.id, id, from, to, status)
}

// alsoWrite makes a try that answers its transition commit a write of its own
// too, the one its kind makes when its visit writes (see transition): a protocol
// misuse the dispatcher tolerates. Either the COMMIT lands before the answer is
// written, and the resolve's guarded write of the answer misses, or it is still
// on its way and lands while the resolve waits on the row (PostgreSQL's UPDATE
// then finds the row changed, writes nothing and reads it back running; see
// fakequeue.CommitDuringResolve).
func (w *world) alsoWrite(p *proc, id int64) {
	if !w.chance(w.rWrite, w.sc.faults.lateCommit) {
		w.note("%s answers its transition of message %d and writes one of its own too", p.id, id)
		w.commit(p, id)
		return
	}
	// The write is the one of this try, made now: when it lands the process
	// may be on its next message.
	from, to, status, timeout := w.transition(p, id)
	w.note("%s answers its transition of message %d and writes one of its own too, whose commit is on its way", p.id, id)
	w.q.CommitDuringResolve(id, func() {
		if w.q.StageWrite(id, from, to, status, timeout) {
			w.wrote[w.slot(id)] = true
			w.note("%s's late commit of message %d lands: %s -> %s %s", p.id, id, from, to, status)
		}
	})
}

// transition is the write of the try of p on id: from its stage to a stage and
// status (with a paused row's timeout).
func (w *world) transition(p *proc, id int64) (from, to string, status core.RowStatus, timeout time.Time) {
	m := w.sc.messages[w.msgOf[w.slot(id)]]
	v := m.visits[p.stage-m.first]
	from = w.sc.stages[p.stage].name
	to, status = from, core.StatusRunning
	switch {
	case p.try.kind == kPause:
		status, timeout = core.StatusPaused, w.now.Add(p.try.pause)
	default:
		next := p.stage + 1
		if v.fuse && p.stage+1 <= m.last {
			next++
		}
		if next > m.last {
			status = m.end
		} else {
			to = w.sc.stages[next].name
		}
	}
	return from, to, status, timeout
}

var crashCodes = []struct {
	code   int
	signal string
}{{1, ""}, {2, ""}, {139, ""}, {-1, "segmentation fault"}, {-1, "aborted"}}

// answerInfo is what the world knows about a line it made a worker write.
type answerInfo struct {
	line string
	// emit: an emit line ("+{…}") of the head's pass, not a status line;
	// emitBad: one the dispatcher must refuse (its message fails); pass:
	// the pass it belongs to (emitPass).
	emit, emitBad bool
	pass          string
	malformed     bool
	cutOff        bool // written without a newline (answerCutOff)
	code          int
	reason        string
	fused         []core.Fused
	bad           bool          // a transition the dispatcher cannot write
	move          *core.Item    // an answered transition: its To and Patch
	pauseFor      time.Duration // with To paused
}

// parseFailLine splits one of failLines (the world's own, so it knows the shape).
func parseFailLine(line string) answerInfo {
	head, rest, _ := strings.Cut(line, " ")
	code, err := strconv.Atoi(head)
	if err != nil {
		panic(fmt.Sprintf("sim: fail line %q has no code", line))
	}
	return answerInfo{line: line, code: code, reason: strings.TrimSpace(rest)}
}

// answer writes a status line; it reaches the core after the pipe's latency,
// after everything the process wrote before.
func (w *world) answer(p *proc, a answerInfo) {
	if p.busy {
		w.emitLines(p, p.cur, a)
	}
	t := w.outTime(p)
	w.queueAnswer(p.id, a)
	w.at(t, p.life, w.deliver(core.Answer{Worker: p.id, Line: a.line}))
}

// outTime is when what p writes now reaches the dispatcher: after the pipe's
// latency, which the workers of the arrival chapter's stage do not have, so
// that their answers written at one instant reach it at one instant
// (chooseArrivalOrder); and never before p's earlier output.
func (w *world) outTime(p *proc) time.Time {
	t := w.now
	if !w.sc.shuffle || p.stage != w.sc.arrivalStage {
		t = t.Add(w.randDur(w.rProc, 0, 5*time.Millisecond))
	}
	if t.Before(p.outAt) {
		t = p.outAt
	}
	p.outAt = t
	return t
}

// babble makes an idle worker write a status line nobody asked for. It writes
// only while the core holds nothing for it, as the world can tell (nothing
// handed and unanswered, no line of its own on the way): otherwise the core
// would rightly take the line as the answer to its head, which a real worker's
// stray line could also be, but which would leave the fake stage's own
// bookkeeping behind.
func (w *world) babble(p *proc) {
	x := w.workers[p.id]
	if p.dead || p.exiting || p.hung || p.busy || len(p.inbox) > 0 || p.eof || w.now.Before(p.readyAt) ||
		x == nil || len(x.queue) > 0 || len(x.answers) > 0 || w.now.Before(p.outAt) {
		return
	}
	w.note("%s pid %d writes a line with nothing outstanding", p.id, p.pid)
	w.queueAnswer(p.id, answerInfo{line: "0"})
	p.outAt = w.now
	w.pending = append(w.pending, core.Answer{Worker: p.id, Line: "0"})
}

// die ends the process; its exit is reported after its last output.
func (w *world) die(p *proc, code int, signal string) {
	if p.dead {
		return
	}
	p.dead, p.exiting = true, true
	switch {
	case signal != "":
		w.note("%s pid %d dies (signal %s) holding %v", p.id, p.pid, signal, p.held())
	case code != 0:
		w.note("%s pid %d dies (exit status %d) holding %v", p.id, p.pid, code, p.held())
	}
	if a := p.tail; a != nil {
		// Its output ends here: the line it had begun reaches the
		// dispatcher, without a newline, just before its exit.
		p.tail = nil
		w.queueAnswer(p.id, *a)
		w.at(w.outTime(p), p.life, w.deliver(core.Answer{Worker: p.id, Line: a.line, Unterminated: true}))
	}
	w.at(w.outTime(p), p.life, w.deliver(core.WorkerExited{Worker: p.id, Code: code, Signal: signal}))
}

func (p *proc) held() []int64 {
	var ids []int64
	if p.busy {
		ids = append(ids, p.cur)
	}
	return append(ids, p.inbox...)
}

// vanish kills the process with its dispatcher: nothing is reported to anyone, and
// a commit it was making happened or not.
func (w *world) vanish(p *proc) {
	if p.dead {
		return
	}
	if p.busy && p.try.kind.writes() && !w.answers(p, p.cur, p.try) && !p.written && !w.dbDown() && w.rCrash.IntN(2) == 0 {
		w.note("%s commits message %d as it dies with the dispatcher", p.id, p.cur)
		w.commit(p, p.cur)
	}
	p.dead = true
}

func sortedKeys[K ~int | ~int64 | ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
