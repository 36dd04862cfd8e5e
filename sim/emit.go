package sim

import (
	"fmt"
	"strings"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
)

// Emitted messages (docs/protocol.md, "Emitting messages"). Every try of a
// visit that emits writes its emit lines before its status line, each a
// message whose payload names its pass ("child K of ID at STAGE try N"), so
// the world can tell, for every child the fake queue inserts, the pass that
// emitted it. The ledger keeps each pass: how many children it must have if
// its transition is written (none when its answer writes no transition or
// one of its emit lines must be refused), and whether its transition was
// written, as the fake queue's changes show it. Rule children-once holds the
// two to each other.

var ruleChildrenOnce = &rule{name: "children-iff-committed-once", when: atCommand | atEnd, check: (*world).childrenOnce,
	doc: "Children exist iff their parent's pass committed, once: the messages a pass emitted are inserted exactly when the resolve that writes its answered transition commits with its guard matched, " +
		"all of them and once (a resend after a lost reply inserts none again); a pass whose answer writes no transition (a failure, a bare 0, a refused emit line) or whose guard missed has none; " +
		"and a resolve item carries only the emits of the pass its worker just answered, none of an earlier pass. Derived from the emit lines the world wrote and the rows the fake queue changed and inserted."}

// emitPass is one try of one message at one stage that wrote emit lines.
type emitPass struct {
	parent int64
	stage  string
	// n is how many children it must have if its transition is written: its
	// emits, or 0 when its answer writes no transition or it must fail.
	n int
	// written: a resolve that carried its item wrote the parent's row from
	// running at stage (its guard matched); children: inserted so far.
	written  bool
	children int
	// emitted: the emit lines it wrote; bad: one of them the dispatcher
	// must refuse (its message fails).
	emitted int
	bad     bool
}

// passKey names a pass: the message, the stage and the try.
func passKey(id int64, stage string, try int) string {
	return fmt.Sprintf("%d at %s try %d", id, stage, try)
}

// emitLines writes the emit lines of the try in hand before its status line
// a: its visit's emits, or, for a bad-emit try, the line the dispatcher must
// refuse (one more than EMIT_MAX for ""). A malformed status line or a
// babble carries none of them to any message that could insert them.
func (w *world) emitLines(p *proc, id int64, a answerInfo) {
	m := w.sc.messages[w.msgOf[w.slot(id)]]
	v := m.visits[p.stage-m.first]
	if v.emits == 0 {
		return
	}
	stage := w.sc.stages[p.stage].name
	key := passKey(id, stage, w.tries[w.slot(id)][p.stage])
	to := w.sc.stages[v.emitTo].name
	n := v.emits
	var bad string
	if p.try.kind == kBadEmit {
		n, bad = 1, p.try.line
		if bad == "" {
			n = w.sc.emitMax + 1
		}
	}
	for k := range n {
		line := core.Emit{Stage: to, Payload: []byte(fmt.Sprintf("child %d of %s", k, key)), OrderKey: v.emitKey}.Line()
		info := answerInfo{line: line, emit: true, pass: key}
		if bad != "" {
			info.line, info.emitBad = bad, true
		} else if k >= w.sc.emitMax {
			info.emitBad = true
		}
		w.queueAnswer(p.id, info)
		w.at(w.outTime(p), p.life, w.deliver(core.Answer{Worker: p.id, Line: info.line}))
	}
	w.note("%s writes %d emit lines for message %d (%s) to %s before %q", p.id, n, id, key, to, a.line)
}

// modelEmit takes an emit line the core reads for worker x's head.
func (w *world) modelEmit(x *wmodel, a answerInfo) {
	if len(x.queue) == 0 {
		x.proto = true // an emit with nothing outstanding is a protocol error
		return
	}
	x.emits = append(x.emits, a)
}

// modelPass records the pass whose status line a answers worker x's head
// with, after the emit lines it took (x.emits), and says whether one of them
// must fail the message.
//
// n is how many emits ride the answer's item (its transition is one the
// dispatcher writes); the others of a good pass are dropped, counted in the
// stage's statistics (StageDelta.EmitsDropped), unless the line is no status
// line at all (the worker dies for it).
func (w *world) modelPass(x *wmodel, head int64, a answerInfo) (bad bool, n int) {
	emits := x.emits
	x.emits = nil
	if len(emits) == 0 {
		return false, 0
	}
	for _, e := range emits {
		bad = bad || e.emitBad
	}
	n = len(emits)
	if bad || a.bad || a.move == nil || a.malformed {
		n = 0
	}
	if !bad && !a.malformed && n == 0 {
		w.truth().stage(w.sc.stages[x.stage].name).EmitsDropped += int64(len(emits))
	}
	if w.passes == nil {
		w.passes, w.lastPass = map[string]*emitPass{}, map[int64]string{}
	}
	key := emits[0].pass
	w.passes[key] = &emitPass{parent: head, stage: w.sc.stages[x.stage].name, n: n, emitted: len(emits), bad: bad}
	w.lastPass[head] = key
	x.pass = key
	if n > 0 {
		if t, ok := w.stageOf(strings.TrimSpace(emitStage(emits[0].line))); ok {
			w.learnFeed(x.stage, w.sc.stages[t].name)
		}
	}
	return bad, n
}

// emitStage is the stage an emit line the world wrote names.
func emitStage(line string) string {
	e, err := core.ParseEmit(line)
	if err != nil {
		return ""
	}
	return e.Stage
}

// childPass is the pass a child's payload names.
func childPass(payload string) (key string, ok bool) {
	_, key, ok = strings.Cut(payload, " of ")
	return key, ok && strings.HasPrefix(payload, "child ")
}

// resolvingPasses, at a transaction the world is about to run, notes for each
// item of its resolves the pass it writes: the pass of its emits, or of the
// move its worker answered last.
func (w *world) resolvingPasses(cmds []core.Command) {
	w.resolving = map[int64]string{}
	for _, cmd := range cmds {
		r, ok := cmd.(core.Resolve)
		if !ok {
			continue
		}
		for _, it := range r.Items {
			if len(it.Emits) > 0 {
				key, _ := childPass(string(it.Emits[0].Payload))
				w.resolving[it.ID] = key
			} else if key := w.lastPass[it.ID]; key != "" && it.Verdict == core.Move && w.passes[key].stage == it.Stage {
				w.resolving[it.ID] = key
			}
		}
	}
}

// observeResolved marks a pass written when a resolve writes its parent's
// row from running at the pass's stage.
func (w *world) observeResolved(c fakequeue.Change) {
	if c.By != fakequeue.ByResolve || c.Before.Status != core.StatusRunning {
		return
	}
	if c.After.Status == core.StatusFailed && strings.Contains(c.After.DispatchError, refusedReason) {
		return // its failure, written in place of the refused transition
	}
	key := w.resolving[c.Before.ID]
	if p := w.passes[key]; p != nil && p.stage == c.Before.Stage {
		p.written = true
	}
}

// childInserted takes in a child the fake queue inserted: a message of the
// world from now on (the template of its stage), counted for its pass.
func (w *world) childInserted(r fakequeue.Row) {
	w.msgOf = append(w.msgOf, w.sc.produced+w.stageIndex(r.Stage))
	w.insertedAt = append(w.insertedAt, w.now)
	w.tries = append(w.tries, make([]int, len(w.sc.stages)))
	w.wrote = append(w.wrote, false)
	w.claimGen = append(w.claimGen, 0)
	w.childrenIn++
	key, ok := childPass(r.Payload)
	p := w.passes[key]
	if p != nil && w.resolving[r.ParentID] == key && !p.written {
		// A move to the stage it was answered at, claimed again at once,
		// leaves the row as it was: no change to observe, but written.
		if row, _ := w.q.Get(r.ParentID); row.Status == core.StatusRunning && row.Stage == p.stage {
			p.written = true
		}
	}
	switch {
	case !ok || p == nil:
		w.broke(ruleChildrenOnce, "row %d inserted with parent %d and payload %q, which no pass of the world emitted", r.ID, r.ParentID, r.Payload)
	case r.ParentID != p.parent:
		w.broke(ruleChildrenOnce, "row %d, a child of pass %s, has parent_id %d, want %d", r.ID, key, r.ParentID, p.parent)
	case !p.written:
		w.broke(ruleChildrenOnce, "row %d, a child of pass %s, inserted though that pass's transition was not written (its parent was not running at %s)", r.ID, key, p.stage)
	default:
		p.children++
		if p.children > p.n {
			w.broke(ruleChildrenOnce, "pass %s has %d children inserted, but it may have %d (once, and none unless its answer writes a transition)", key, p.children, p.n)
		}
	}
}

// childrenOnce: as the core issues a resolve, each item carries exactly
// the emits of the pass its worker answered (none of another pass, all of
// its own when the answer writes a transition, none when it does not), and
// a pass with an emit line the dispatcher must refuse fails; at the end, and
// at each command, every pass whose transition was written has all its
// children.
func (w *world) childrenOnce(r *rule, x crossing) {
	for _, key := range sortedStrings(keysOf(w.passes)) {
		if p := w.passes[key]; p.written && p.children != p.n {
			w.broke(r, "pass %s: its transition was written, with %d children inserted, want %d", key, p.children, p.n)
			return
		}
	}
	res, ok := x.cmd.(core.Resolve)
	if !ok {
		return
	}
	for _, it := range res.Items {
		var key string
		if ex := w.expects[it.ID]; ex != nil {
			key = ex.pass
		}
		p := w.passes[key]
		for _, e := range it.Emits {
			if k, _ := childPass(string(e.Payload)); k != key {
				w.broke(r, "resolve item %s carries an emit of pass %s; the pass it answers is %q", it, k, key)
				return
			}
		}
		switch {
		case p == nil:
			if strings.Contains(it.Reason, "EMIT_MAX") {
				w.broke(r, "resolve item %s fails its message for too many emits, but its pass emitted none", it)
			}
		case p.bad && it.Verdict != core.Fail:
			w.broke(r, "resolve item %s: pass %s wrote an emit line the dispatcher must refuse, so its message must fail, with none of its children", it, key)
		case !p.bad && strings.Contains(it.Reason, "EMIT_MAX"):
			w.broke(r, "resolve item %s fails its message for too many emits, but its pass %s emitted %d, within EMIT_MAX %d", it, key, p.emitted, w.sc.emitMax)
		case len(it.Emits) > 0 && len(it.Emits) != p.n:
			w.broke(r, "resolve item %s carries %d emits of pass %s, which may insert %d", it, len(it.Emits), key, p.n)
		case p.n > 0 && it.Verdict == core.Move && len(it.Emits) == 0:
			w.broke(r, "resolve item %s writes pass %s's transition without its %d emits", it, key, p.n)
		}
		if w.fail != nil {
			return
		}
	}
}
