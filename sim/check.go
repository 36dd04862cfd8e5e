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
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
)

// The checker's checks. The checker follows what crosses the core's boundary
// (the events the world feeds and the commands the core returns) and what the
// fake world does, keeps what it knows in its ledger (ledger.go), and holds the
// core to the rules (rules.go) at each command, event and row change, after
// every step, at every deadline and at the end: each rule by its own check
// function, here, which the hooks call through checkAt with what crossed. It
// never looks inside the core.
// Where a rule needs a decision the reference text leaves to the core, it
// derives it itself from the core's documented constants (the start window,
// the failed-start limit and the doubling cooldown; the watchdog pausing while
// the core knows the database is down, heads getting a fresh MAX_RUNTIME at
// DatabaseUp; a malformed line deciding the fate of a worker's head even after
// another kill; claimed rows not yet handed out may always be given back).

// gateBound is how long a row committed without a notification may stay
// pending, at a stage with room, before the core either claims its stage or
// takes the gate and looks: core.RestAfter before it asks for the gate, then
// core.LookEvery until it looks by itself, however long producers hold the
// gate shared (up to 5 s here) and whether or not the gate can be taken; plus
// the transaction outstanding when it wants to look, which it waits for (up to
// 225 ms here: 20 ms, and 200 ms more when the shell retries a 40001, and 5 ms
// to deliver its result), and the gate's round trips (4 ms). Far below any
// POLL_INTERVAL the scenarios draw, and far below a second: a bound that a
// pause doubling up to core.RestRetryMax would break.
const gateBound = core.RestAfter + core.LookEvery + 225*time.Millisecond + 5*time.Millisecond + 4*time.Millisecond

// checkGate holds the rule "no message waits for the heartbeat": a row whose
// producer did not notify is claimed, or its stage claimed, or the core takes
// the gate and looks, within gateBound. While the core cannot claim the stage
// (no room, a cooldown, no token of its RATE, the database down, a shutdown)
// the clock restarts.
func (w *world) checkGate(rl *rule, _ crossing) {
	for _, id := range sortedKeys(w.unnotified) {
		r, _ := w.q.Get(id)
		s, ok := w.stageOf(r.Stage)
		if r.Status != core.StatusPending || !ok {
			delete(w.unnotified, id)
			continue
		}
		if _, held := w.pressureHeld(s); held || w.coreDown || w.shut > 0 || w.coolingAt(s, w.now) || w.room(s, w.now) <= 0 || w.tokens(s, w.now) < 1 {
			w.unnotified[id] = unnotified{committed: w.unnotified[id].committed, since: w.now}
			continue
		}
		if since := w.now.Sub(w.unnotified[id].since); since > gateBound {
			w.broke(rl, "message row %d waits for the heartbeat: committed %s ago without NOTIFY (the dispatcher counted as busy), "+
				"and since then the core neither claimed stage %s nor took the gate and looked", id, since, r.Stage)
			return
		}
	}
}

// movesLeaveALookSlot holds the rule "moves leave the look a slot": a
// resolve's moves (and emitted children) that claim at a stage where a row committed without a
// notification has waited gateBound do not take the stage's last slot
// (room, less the rows the core's own resolves left pending there), unless a
// claim of the stage goes in the same transaction. By then the core has
// looked by itself (core.LookEvery, plus the transaction outstanding when the
// look fell due) and must keep room for the claim that looks.
func (w *world) movesLeaveALookSlot(rl *rule, x crossing) {
	res, ok := x.cmd.(core.Resolve)
	if !ok {
		return
	}
	claiming := map[string]int{} // moves and emitted children that claim, by stage
	for _, it := range res.Items {
		if it.Claim {
			claiming[it.To]++
		}
		for _, e := range it.Emits {
			if e.Claim {
				claiming[e.Stage]++
			}
		}
	}
	for _, id := range sortedKeys(w.unnotified) {
		r, _ := w.q.Get(id)
		s, ok := w.stageOf(r.Stage)
		n := claiming[r.Stage]
		if !ok || n == 0 || r.Status != core.StatusPending || w.now.Sub(w.unnotified[id].committed) <= gateBound {
			continue
		}
		if slices.ContainsFunc(x.step, func(c core.Command) bool {
			cl, ok := c.(core.Claim)
			return ok && slices.ContainsFunc(cl.Caps, func(cp core.Cap) bool { return cp.Stage == r.Stage })
		}) {
			continue
		}
		if room := w.room(s, w.now) - w.ownPending[s]; n >= room {
			w.broke(rl, "%d moves claim at stage %s, whose room is %d: they take its last slot while row %d, committed %s ago without NOTIFY, waits there for a claim that looks",
				n, r.Stage, room, id, w.now.Sub(w.unnotified[id].committed))
			return
		}
	}
}

// ---- commands, checked before the world executes them ----

// modelCommands holds each command of a step to the rules of atCommand,
// against the ledger as it stood before the command, then records it; once
// every command is recorded, the step's queue transaction to the rules of
// atTransaction.
func (w *world) modelCommands(cmds []core.Command) {
	w.provenByProbes()
	queued := false
	for _, cmd := range cmds {
		queued = queued || core.IsQueue(cmd)
		if w.checkAt(atCommand, crossing{cmd: cmd, step: cmds}); w.fail != nil {
			return
		}
		w.recordCommand(cmd)
	}
	if queued {
		if w.checkAt(atTransaction, crossing{step: cmds}); w.fail != nil {
			return
		}
		var t txnModel
		for _, cmd := range cmds {
			if core.IsQueue(cmd) {
				t.ops = append(t.ops, core.QueueOp(cmd))
				t.kinds = append(t.kinds, kindOf(cmd))
			}
		}
		t.items = resolveItems(cmds)
		t.pendsOf(cmds)
		w.txnsOut = append(w.txnsOut, t)
	}
}

// kindOf is the kind of a queue command, as rule serial-writes counts them.
func kindOf(cmd core.Command) string {
	return strings.SplitN(cmd.String(), " ", 2)[0]
}

// serialWrites holds each queue command sent while other transactions are
// outstanding to what may go beside them: no more than SESSIONS at once,
// neither a reset nor the history's upkeep (each goes alone), nothing but a
// resolve beside a transaction that claims, wakes, releases or flushes (so
// at most one claim, one wake, one release, one flush out), and no row of an
// outstanding resolve's items.
func (w *world) serialWrites(r *rule, x crossing) {
	if x.cmd == nil || !core.IsQueue(x.cmd) || !w.txnOut() {
		return
	}
	if len(w.txnsOut) >= max(1, w.sc.sessions) {
		w.broke(r, "a queue transaction is issued while %d are outstanding (SESSIONS %d): %s", len(w.txnsOut), max(1, w.sc.sessions), x.cmd)
		return
	}
	for _, t := range w.txnsOut {
		if slices.Contains(t.kinds, "reset-orphans") || slices.Contains(t.kinds, "keep-history") {
			w.broke(r, "%s is issued beside an outstanding transaction that resets orphans or keeps the history: those go alone", x.cmd)
			return
		}
	}
	full := slices.ContainsFunc(w.txnsOut, func(t txnModel) bool {
		return slices.ContainsFunc(t.kinds, func(k string) bool { return k != "resolve" })
	})
	switch c := x.cmd.(type) {
	case core.ResetOrphans, core.KeepHistory:
		w.broke(r, "%s is issued beside an outstanding transaction: it must go alone", x.cmd)
		return
	case core.Resolve:
		out := w.outstandingItems()
		for _, id := range resolveItems([]core.Command{x.cmd}) {
			if slices.Contains(out, id) {
				w.broke(r, "row %d is resolved beside an outstanding transaction that resolves it too: %s", id, x.cmd)
				return
			}
		}
		if full {
			w.besideResolve(r, c, x.step)
		}
		return
	}
	if full {
		w.broke(r, "%s is issued beside an outstanding transaction that claims, wakes, releases or flushes: beside it goes a resolve alone", x.cmd)
	}
	// Else only resolves are out, so x.cmd, no resolve, is the first of
	// its kind among them.
}

// besideResolve holds a resolve sent beside the step's full transaction to
// items whose resolve makes no row pending that the core could know of: no
// keyed item (its release goes in a full transaction), no requeue, no bare
// 0, no move that does not claim at a stage, no child inserted pending.
func (w *world) besideResolve(r *rule, res core.Resolve, step []core.Command) {
	if len(queueOf(step)) != 1 {
		w.broke(r, "beside the step's full transaction, a transaction of %d commands: want a resolve alone", len(queueOf(step)))
		return
	}
	for _, it := range res.Items {
		_, toStage := w.stageOf(it.To)
		bad := it.Key != "" || it.Verdict == core.Requeue || it.Verdict == core.Answered ||
			it.Verdict == core.Move && toStage && !it.Claim ||
			slices.ContainsFunc(it.Emits, func(e core.Emit) bool { return !e.Claim })
		if bad {
			w.broke(r, "resolve item %s is sent beside the step's full transaction, though it may make a row pending (or carries an order key)", it)
			return
		}
	}
}

// pendsAt reports whether the transaction of cmds may make a row pending at
// stage (see txnModel).
func pendsAt(cmds []core.Command, stage string) bool {
	var t txnModel
	t.pendsOf(cmds)
	return t.anywhere || t.pends[stage]
}

// queueOf lists the queue commands of cmds.
func queueOf(cmds []core.Command) []core.Command {
	var out []core.Command
	for _, c := range cmds {
		if core.IsQueue(c) {
			out = append(out, c)
		}
	}
	return out
}

// claimBounds holds claims, and moves that claim, to a stage's room
// (QUEUE_LIMIT × PARALLELISM) and keeps them out of a shutdown.
func (w *world) claimBounds(r *rule, x crossing) {
	switch c := x.cmd.(type) {
	case core.Claim:
		if w.shut > 0 {
			w.broke(r, "claim during shutdown: %s", c)
			return
		}
		for _, cp := range c.Caps {
			st := w.sc.stages[w.stageIndex(cp.Stage)]
			limit := st.parallelism * st.queueLimit
			if held := w.heldAt(cp.Stage) + w.movesOutAt(cp.Stage); cp.N <= 0 || held+cp.N > limit {
				w.broke(r, "claim asks %d rows of %s, which already holds %d (moves of its transaction that claim included): more than QUEUE_LIMIT × PARALLELISM = %d", cp.N, cp.Stage, held, limit)
				return
			}
		}
	case core.Resolve:
		claiming := map[string]int{}
		for _, it := range c.Items {
			var at []string // the stages its move and its emits claim at
			if it.Claim {
				at = append(at, it.To)
			}
			for _, e := range it.Emits {
				if e.Claim {
					at = append(at, e.Stage)
				}
			}
			for _, stage := range at {
				if w.shut > 0 {
					w.broke(r, "resolve item %s claims during a shutdown", it)
					return
				}
				s, ok := w.stageOf(stage)
				if !ok {
					continue // rule move-claims's
				}
				claiming[stage]++
				st := w.sc.stages[s]
				// What the outstanding transactions may claim there too.
				out := w.movesOutAt(stage)
				for _, cp := range w.claimCaps {
					if cp.Stage == stage {
						out += cp.N
					}
				}
				if held, limit := w.heldAt(stage)+out, st.parallelism*st.queueLimit; held+claiming[stage] > limit {
					w.broke(r, "resolve item %s claims at stage %s, which holds %d (outstanding claims included) and is claimed %d by this resolve: more than QUEUE_LIMIT × PARALLELISM = %d",
						it, stage, held, claiming[stage], limit)
					return
				}
			}
		}
	}
}

// resetAfterLoss holds the step's transaction, once its commands are
// recorded (a ResetOrphans among them clears resetOwed), to the reset a lost
// transaction owes.
func (w *world) resetAfterLoss(r *rule, x crossing) {
	if w.resetOwed {
		w.broke(r, "the transaction after a lost reply that may have left rows running (a claim, or a move or an emit that claims) resets no orphans: %v", x.step)
	}
}

// claimYieldsHalf holds the step's transaction, once its commands are
// recorded: every stage it claims, and every stage the promptness rule owes a
// claim, is asked for at least half its room; but for a probe (a cap of one,
// SESSIONS above 1) of a stage the core was told nothing of since it claimed
// it dry and where its own resolves left no row pending.
func (w *world) claimYieldsHalf(r *rule, x crossing) {
	caps := map[string]int{}
	for _, cmd := range x.step {
		if c, ok := cmd.(core.Claim); ok {
			for _, cp := range c.Caps {
				caps[cp.Stage] = cp.N
			}
		}
	}
	for s, st := range w.sc.stages {
		n, claimed := caps[st.name]
		if !claimed && !w.claimOwed(s, w.now) {
			continue
		}
		if claimed && n == 1 && w.sc.sessions > 1 && !w.told[s] && w.ownPending[s] == 0 && !pendsAt(x.step, st.name) {
			continue // a probe of a stage claimed dry (core.Core.probes)
		}
		// The claim is recorded: its own N is already off the bucket.
		room := min(w.room(s, w.now)-w.movesOutAt(st.name), w.tokens(s, w.now)+n)
		if n < room-room/2 {
			w.broke(r, "the transaction asks %d rows of stage %s, which has room for %d (moves and emits of the transaction that claim there taken off, within its RATE): a stage may yield at most half its room",
				n, st.name, room)
			return
		}
	}
}

// rate holds a claim to the tokens of its stage's bucket and keeps moves that
// claim off a stage with a RATE (at each command), and each claim's result to
// the RATE's bound over every window (at each claim's result).
func (w *world) rate(r *rule, x crossing) {
	if x.rated != nil {
		w.checkRateBound(r, *x.rated)
		return
	}
	switch c := x.cmd.(type) {
	case core.Claim:
		if w.shut > 0 {
			return // rule claim-bounds's
		}
		for _, cp := range c.Caps {
			s := w.stageIndex(cp.Stage)
			if w.cfg.Stages[s].Rate == 0 {
				continue
			}
			if tokens := w.tokens(s, w.now); cp.N > tokens {
				w.broke(r, "claim asks %d rows of %s, whose RATE %s leaves %d tokens now", cp.N, cp.Stage, w.sc.stages[s].rate, tokens)
				return
			}
		}
	case core.Resolve:
		for _, it := range c.Items {
			if s, ok := w.stageOf(it.To); ok && it.Claim && w.cfg.Stages[s].Rate > 0 {
				w.broke(r, "resolve item %s claims at stage %s, which has a RATE: only its claims, counted by its bucket, take its rows", it, it.To)
				return
			}
			for _, e := range it.Emits {
				if s, ok := w.stageOf(e.Stage); ok && e.Claim && w.cfg.Stages[s].Rate > 0 {
					w.broke(r, "resolve item %s inserts a child running at stage %s, which has a RATE: only its claims, counted by its bucket, take its rows", it, e.Stage)
					return
				}
			}
		}
	}
}

// claimReadsRow: a row a claim (or a move that claims) hands the core comes
// with the attempts the row has.
func (w *world) claimReadsRow(r *rule, x crossing) {
	if t := x.took; t != nil {
		if row, _ := w.q.Get(t.id); t.attempts != row.Attempts {
			w.broke(r, "%s returned message %d with attempts %d, the row has %d", t.what, t.id, t.attempts, row.Attempts)
		}
	}
}

func (w *world) neverTwoHolders(r *rule, x crossing) {
	if t := x.took; t != nil {
		if _, held := w.heldBy(t.id); held {
			w.broke(r, "%s returned message %d, which this core already holds (%s)", t.what, t.id, w.heldText())
		}
	}
}

// writeTo is the worker a Write hands ids to, when the command is one and
// the worker is alive (rule hand-to-ready judges the rest).
func (w *world) writeTo(cmd core.Command) (core.Write, *wmodel, bool) {
	x, ok := cmd.(core.Write)
	if !ok {
		return x, nil, false
	}
	y := w.workers[x.Worker]
	return x, y, y != nil && !y.gone
}

func (w *world) handToReady(r *rule, x crossing) {
	c, ok := x.cmd.(core.Write)
	if !ok {
		return
	}
	switch y := w.workers[c.Worker]; {
	case y == nil || y.gone:
		w.broke(r, "%s to a worker that is not alive", c)
	case !y.started || y.stopped || y.killed:
		w.broke(r, "%s to a worker that is not ready (started %v, stopped %v, killed %v)", c, y.started, y.stopped, y.killed)
	case y.probe:
		w.broke(r, "%s to a probe that has not lived %s: nothing shows yet that its program starts", c, core.StartWindow)
	}
}

func (w *world) workPacked(r *rule, x crossing) {
	c, y, alive := w.writeTo(x.cmd)
	if !alive {
		return
	}
	for _, z := range w.alive {
		if id := z.id; z != y && z.stage == y.stage && z.started && w.slots(z) > 0 && len(z.queue) > len(y.queue) {
			w.broke(r, "%s hands ids to a worker holding %d while %s holds %d and has room: work is not packed onto the fewest workers",
				c, len(y.queue), id, len(z.queue))
			return
		}
	}
}

// messageLines holds the lines handed to workers (one per id for an INPUT =
// message stage, each the row as it is now; none for others), and the
// LINE_MAX of a move that claims into a message stage.
func (w *world) messageLines(r *rule, x crossing) {
	if res, ok := x.cmd.(core.Resolve); ok {
		w.moveLines(r, res)
		return
	}
	c, y, alive := w.writeTo(x.cmd)
	if !alive {
		return
	}
	stage := w.sc.stages[y.stage]
	if stage.message != (c.Lines != nil) || c.Lines != nil && len(c.Lines) != len(c.IDs) {
		w.broke(r, "%s to a worker of stage %s (INPUT = message: %v) carries %d lines for %d ids", c, stage.name, stage.message, len(c.Lines), len(c.IDs))
		return
	}
	for i, id := range c.IDs {
		if c.Lines == nil {
			break
		}
		if why := w.staleLine(id, c.Lines[i]); why != "" {
			w.broke(r, "%s hands message %d the line %s, but %s: a message stage must get the row as it is now", c, id, c.Lines[i], why)
			return
		}
	}
}

// moveLines: a move that claims reads its message with the dispatcher's
// LINE_MAX exactly when its target is an INPUT = message stage.
func (w *world) moveLines(r *rule, res core.Resolve) {
	for _, it := range res.Items {
		s, ok := w.stageOf(it.To)
		if !it.Claim || !ok {
			continue
		}
		switch {
		case it.LineMax != 0 && (w.cfg.Stages[s].Input != conf.InputMessage || it.LineMax != w.cfg.Dispatch.LineMax):
			w.broke(r, "resolve item %s reads the message with LINE_MAX %d; stage %s is INPUT = %s, LINE_MAX %d", it, it.LineMax, it.To, w.cfg.Stages[s].Input, w.cfg.Dispatch.LineMax)
			return
		case it.LineMax == 0 && w.cfg.Stages[s].Input == conf.InputMessage:
			w.broke(r, "resolve item %s claims at INPUT = message stage %s without reading the message", it, it.To)
			return
		}
	}
}

// handClaimed: each id handed out was claimed for the worker's stage by this
// core, not handed out before, and its claim committed.
func (w *world) handClaimed(r *rule, x crossing) {
	c, y, alive := w.writeTo(x.cmd)
	if !alive {
		return
	}
	stage := w.sc.stages[y.stage]
	for i, id := range c.IDs {
		if s, ok := w.backlog[id]; !ok || s != stage.name || slices.Contains(c.IDs[:i], id) {
			who := "not claimed by this core"
			if wid, ok := w.holder[id]; ok {
				who = "held by " + wid.String()
			} else if slices.Contains(c.IDs[:i], id) {
				who = "handed twice in it"
			} else if ok {
				who = "claimed for stage " + s
			} else if _, ok := w.expects[id]; ok {
				who = "being resolved"
			}
			w.broke(r, "%s hands message %d to stage %s, but it is %s", c, id, stage.name, who)
			return
		}
		if row, _ := w.q.Get(id); row.Status != core.StatusRunning || row.Stage != stage.name {
			w.broke(r, "%s hands message %d, whose row is %s at %s (claim not committed?)", c, id, row.Status, row.Stage)
			return
		}
	}
}

func (w *world) queueLimit(r *rule, x crossing) {
	c, y, alive := w.writeTo(x.cmd)
	if !alive {
		return
	}
	stage := w.sc.stages[y.stage]
	if n := len(y.queue) + len(c.IDs); n > stage.queueLimit {
		w.broke(r, "%s leaves %d unanswered ids with %s, QUEUE_LIMIT %d", c, n, c.Worker, stage.queueLimit)
	} else if n := y.handed + len(c.IDs); n > stage.maxMessages {
		w.broke(r, "%s hands %s its %dth id, MAX_MESSAGES %d", c, c.Worker, n, stage.maxMessages)
	}
}

// cooldown: no spawn while the stage cools down (a spawn during a shutdown is
// rule spawn-only-when-needed's).
func (w *world) cooldown(r *rule, x crossing) {
	if c, ok := x.cmd.(core.Spawn); ok && w.shut == 0 {
		if cool := w.cool[w.stageIndex(c.Stage)]; w.now.Before(cool.until) {
			w.broke(r, "%s respawns stage %s during its cooldown (until %s)", c, c.Stage, cool.until.Sub(epoch))
		}
	}
}

func (w *world) spawnNeeded(r *rule, x crossing) {
	c, ok := x.cmd.(core.Spawn)
	if !ok {
		return
	}
	s := w.stageIndex(c.Stage)
	switch {
	case w.shut > 0:
		w.broke(r, "spawn during shutdown: %s", c)
	case w.workers[c.Worker] != nil:
		w.broke(r, "%s reuses a worker id", c)
	case w.spawnNeed(s) <= 0:
		w.broke(r, "%s: its claimed messages (%d) fit in the workers it has, ready or starting", c, w.backlogAt(s))
	}
}

func (w *world) parallelism(r *rule, x crossing) {
	c, ok := x.cmd.(core.Spawn)
	if !ok {
		return
	}
	s := w.stageIndex(c.Stage)
	if live, st := 1+w.live(s), w.sc.stages[s]; live > st.parallelism {
		w.broke(r, "%s makes %d live workers of stage %s, PARALLELISM %d", c, live, c.Stage, st.parallelism)
	}
}

// reapIdle: outside a shutdown a worker is stopped only when recycled or idle
// past WORKER_IDLE_TIMEOUT.
func (w *world) reapIdle(r *rule, x crossing) {
	c, ok := x.cmd.(core.Stop)
	if !ok {
		return
	}
	y := w.workers[c.Worker]
	if y == nil || y.gone || y.stopped || y.killed || w.shut > 0 {
		return
	}
	st := w.sc.stages[y.stage]
	switch {
	case len(y.queue) > 0:
		w.broke(r, "%s stops a worker holding %v outside a shutdown", c, y.queue)
	case y.handed >= st.maxMessages:
		// recycled
	case !y.started:
		w.broke(r, "%s stops a worker that never became ready, outside a shutdown", c)
	case w.now.Sub(y.idleSince) < w.sc.idle:
		w.broke(r, "%s reaps a worker idle for %s only, WORKER_IDLE_TIMEOUT %s", c, w.now.Sub(y.idleSince), w.sc.idle)
	}
}

func (w *world) killLive(r *rule, x crossing) {
	var id core.WorkerID
	switch c := x.cmd.(type) {
	case core.Stop:
		id = c.Worker
	case core.Kill:
		id = c.Worker
		if y := w.workers[id]; y != nil && y.gone && y.goneStep == w.steps {
			return // decided on a line that came in the same batch as its exit
		}
	default:
		return
	}
	if y := w.workers[id]; y == nil || y.gone {
		w.broke(r, "%s of a worker that is not alive", x.cmd)
	}
}

// killed is the live worker a Kill names that was not killed before, with
// why the core kills it as the checker reads it.
func (w *world) killed(cmd core.Command) (core.Kill, *wmodel, killCause, bool) {
	c, ok := cmd.(core.Kill)
	if !ok {
		return c, nil, 0, false
	}
	y := w.workers[c.Worker]
	if y == nil || y.gone || y.killed {
		return c, nil, 0, false
	}
	return c, y, w.killCauseOf(y), true
}

func (w *world) stopGrace(r *rule, x crossing) {
	if c, y, cause, ok := w.killed(x.cmd); ok && cause == causeGrace && w.now.Sub(y.stoppedAt) < w.sc.grace {
		w.broke(r, "%s kills a stopped worker after %s, before STOP_GRACE %s", c, w.now.Sub(y.stoppedAt), w.sc.grace)
	}
}

func (w *world) watchdog(r *rule, x crossing) {
	c, y, cause, ok := w.killed(x.cmd)
	if !ok || cause != causeTimeout {
		return
	}
	switch {
	case len(y.queue) == 0:
		w.broke(r, "%s kills a worker that holds nothing and broke no rule", c)
	case w.coreDown:
		w.broke(r, "%s: the watchdog kills while the core knows the database is down (no stage can commit then)", c)
	case w.now.Sub(y.headSince) < w.sc.runtimeOf(y.stage):
		w.broke(r, "%s: the watchdog kills after %s at the head, before its stage's MAX_RUNTIME %s", c, w.now.Sub(y.headSince), w.sc.runtimeOf(y.stage))
	}
}

// killCauseOf is why the core kills live worker y now, as the checker reads
// it from what it saw: a protocol error, a second shutdown request, a stop
// past its grace, or else the watchdog. Rule item-verdict judges the kill's
// items by it.
func (w *world) killCauseOf(y *wmodel) killCause {
	switch {
	case y.proto:
		return causeProtocol
	case w.shut >= 2:
		return causeNow
	case y.stopped && (len(y.queue) == 0 || w.coreDown || w.now.Sub(y.headSince) < w.sc.runtimeOf(y.stage)):
		return causeGrace // (a stopped worker whose head ran past MAX_RUNTIME is the watchdog's)
	}
	return causeTimeout
}

// givesBack reports whether it gives back a claimed row no worker has seen,
// which is always safe (say, its stage cannot start a worker); whether it comes
// back is liveness's business.
func (w *world) givesBack(it core.Item) bool {
	s, ok := w.backlog[it.ID]
	return ok && w.expects[it.ID] == nil && it.Verdict == core.Requeue && it.Stage == s && it.Reason == "" && it.Epoch == ""
}

// expected calls judge with each item of a Resolve that the ledger expects
// (every other is rule item-for-held's), and its expectation, until a rule
// broke.
func (w *world) expected(cmd core.Command, judge func(it core.Item, ex *expect)) {
	res, ok := cmd.(core.Resolve)
	if !ok {
		return
	}
	for _, it := range res.Items {
		if ex := w.expects[it.ID]; ex != nil && !w.givesBack(it) {
			if judge(it, ex); w.fail != nil {
				return
			}
		}
	}
}

func (w *world) itemForHeld(r *rule, x crossing) {
	res, ok := x.cmd.(core.Resolve)
	if !ok {
		return
	}
	for _, it := range res.Items {
		if w.expects[it.ID] != nil || w.givesBack(it) {
			continue
		}
		who := "no one"
		if wid, ok := w.holder[it.ID]; ok {
			who = wid.String() + ", which has not answered it"
		} else if _, ok := w.backlog[it.ID]; ok {
			who = "the core, which has not handed it out"
		}
		w.broke(r, "resolve item %s for a message held by %s", it, who)
		return
	}
}

func (w *world) keyWaitPaced(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		if !ex.keyBusyAt.IsZero() && w.now.Before(ex.keyBusyAt.Add(core.LookEvery)) {
			w.broke(r, "resolve item %s sent again %s after its last send found a child's order key locked, sooner than %s", it, w.now.Sub(ex.keyBusyAt), core.LookEvery)
		}
	})
}

func (w *world) itemStage(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		if it.Stage != ex.stage {
			w.broke(r, "resolve item %s names stage %s; the message was claimed for %s", it, it.Stage, ex.stage)
		}
	})
}

func (w *world) itemVerdict(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		if it.Verdict != ex.verdict {
			w.broke(r, "resolve item %s: want verdict %s (%s)", it, ex.verdict, ex.why)
		}
	})
}

func (w *world) itemTransition(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		switch {
		case ex.move != nil && (it.To != ex.move.To || it.Patch != ex.move.Patch || (ex.move.To != core.TargetPaused && !it.Until.IsZero())):
			w.broke(r, "resolve item %s: want the answered transition to %s (patch %q)", it, ex.move.To, ex.move.Patch)
		case ex.move == nil && (it.To != "" || it.Patch != "" || (!it.Until.IsZero() && ex.verdict != core.Retry)):
			w.broke(r, "resolve item %s carries a transition; only an answered one may (%s)", it, ex.why)
		}
	})
}

func (w *world) pauseDueExact(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		if ex.move != nil && ex.move.To == core.TargetPaused && !it.Until.Equal(ex.move.Until) {
			w.broke(r, "resolve item %s: a pause due at %s, want %s (%s)", it, formatSim(it.Until), formatSim(ex.move.Until), ex.why)
		}
	})
}

func (w *world) retryBackoff(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		if ex.verdict == core.Retry && (it.Until.Before(ex.retryFrom) || !it.Until.Before(ex.retryTo)) {
			w.broke(r, "resolve item %s: a retry due at %s, want from %s (the delay) to before %s (plus the jitter) (%s)",
				it, formatSim(it.Until), formatSim(ex.retryFrom), formatSim(ex.retryTo), ex.why)
		}
	})
}

func (w *world) itemEpoch(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		switch {
		case ex.answer && it.Epoch != ex.epoch:
			w.broke(r, "resolve item %s for a message answered 0: want the epoch of its claim %q", it, ex.epoch)
		case !ex.answer && it.Epoch != "":
			w.broke(r, "resolve item %s carries an epoch; only a message answered 0 may (%s)", it, ex.why)
		}
	})
}

func (w *world) itemReason(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		switch {
		case (ex.verdict == core.Fail || ex.verdict == core.TimeOut || ex.verdict == core.Answered || ex.verdict == core.Retry) && it.Reason == "":
			w.broke(r, "resolve item %s fails the message without a reason", it)
		case (ex.verdict == core.Requeue || ex.verdict == core.Move) && it.Reason != "":
			w.broke(r, "resolve item %s requeues or moves with a reason", it)
		case ex.reason != "" && it.Reason != ex.reason:
			w.broke(r, "resolve item %s: want the worker's reason %q", it, ex.reason)
		}
	})
}

// moveClaims holds the moves of a resolve that claim their row at their
// target (core.Item.Claim): no move claims in a step whose transaction also
// resets orphans or wakes paused rows (which may make rows pending anywhere,
// at any id, before the claim runs), nor past rows that may be pending there.
// Their room is rule claim-bounds's, a RATE's stage rule rate's, and their
// line rule message-lines's.
func (w *world) moveClaims(r *rule, x crossing) {
	res, ok := x.cmd.(core.Resolve)
	if !ok {
		return
	}
	for _, cmd := range x.step {
		switch cmd.(type) {
		case core.ResetOrphans, core.Wake:
			for _, it := range res.Items {
				if it.Claim {
					w.broke(r, "resolve item %s claims in the transaction of %s, which may make rows pending at its target first", it, cmd)
					return
				}
			}
		}
	}
	claiming := map[string]int{}
	for _, it := range res.Items {
		if !it.Claim {
			continue
		}
		if w.moveClaim(r, x.step, res, it, claiming[it.To]); w.fail != nil {
			return
		}
		claiming[it.To]++
	}
}

// moveClaim judges one move that claims, it, with before moves of the same
// resolve claiming at its target ahead of it; step is its transaction.
func (w *world) moveClaim(r *rule, step []core.Command, res core.Resolve, it core.Item, before int) {
	s, ok := w.stageOf(it.To)
	if it.Verdict != core.Move || !ok {
		w.broke(r, "resolve item %s claims, but it is no move to a stage this dispatcher runs", it)
		return
	}
	switch ex := w.expects[it.ID]; {
	case w.toldLook[s]:
		w.broke(r, "resolve item %s claims at stage %s, where the core was told rows may be pending that it would overtake", it, it.To)
	case before+1 > w.room(s, w.now)-w.ownPending[s]:
		w.broke(r, "resolve item %s claims at stage %s, whose room (%d) does not cover the %d rows the core left pending there and the %d moves of this resolve that claim: the claim after the resolve cannot take them all, so the moves overtake them",
			it, it.To, w.room(s, w.now), w.ownPending[s], before+1)
	case slices.ContainsFunc(res.Items, func(o core.Item) bool { return o.Verdict == core.Requeue && o.Stage == it.To }):
		w.broke(r, "resolve item %s claims at stage %s, where the same resolve gives a row back", it, it.To)
	case w.ownPending[s] > 0 && !slices.ContainsFunc(step, func(c core.Command) bool {
		cl, ok := c.(core.Claim)
		return ok && slices.ContainsFunc(cl.Caps, func(cp core.Cap) bool { return cp.Stage == it.To })
	}):
		w.broke(r, "resolve item %s claims at stage %s, where the core left %d rows pending, and no claim of the stage follows in its transaction to take them first", it, it.To, w.ownPending[s])
	case slices.ContainsFunc(w.txnsOut, func(t txnModel) bool { return t.anywhere || t.pends[it.To] }):
		w.broke(r, "resolve item %s claims at stage %s, where a transaction out beside it may make rows pending that it would overtake", it, it.To)
	case ex != nil && (ex.unsure || ex.raced):
		w.broke(r, "resolve item %s claims, but its row may have moved already (a lost reply, or a commit that raced its resolve)", it)
	}
}

// movesClaimOldestFirst: no move of a resolve that claims at a stage has a
// higher ingress_id than a move there, in the same resolve, that does not.
func (w *world) movesClaimOldestFirst(r *rule, x crossing) {
	res, ok := x.cmd.(core.Resolve)
	if !ok {
		return
	}
	lowestLeft := map[string]int64{} // per target, the lowest id of a move there that does not claim
	for _, it := range res.Items {
		if _, ok := w.stageOf(it.To); ok && it.Verdict == core.Move && !it.Claim && (lowestLeft[it.To] == 0 || it.ID < lowestLeft[it.To]) {
			lowestLeft[it.To] = it.ID
		}
	}
	for _, it := range res.Items {
		if left := lowestLeft[it.To]; it.Claim && left != 0 && left < it.ID {
			w.broke(r, "resolve item %s claims at stage %s, overtaking the move of row %d there, which does not", it, it.To, left)
			return
		}
	}
}

func (w *world) resetKeepsHeld(r *rule, x crossing) {
	c, ok := x.cmd.(core.ResetOrphans)
	if !ok {
		return
	}
	if !w.resetSent {
		if len(c.Keep) != 0 {
			w.broke(r, "the start-up orphan reset keeps %v; a new core holds nothing", c.Keep)
		}
		return
	}
	for _, id := range w.heldIDs() {
		if ex := w.expects[id]; ex != nil && ex.unsure {
			// A row whose resolve may already have been applied (and which the
			// lost transaction may have claimed again) may be reset or kept.
			continue
		}
		if !slices.Contains(c.Keep, id) {
			w.broke(r, "reset-orphans would reset message %d, which this core holds (%s), keep %v", id, w.heldText(), c.Keep)
			return
		}
	}
}

func (w *world) wakeNotEarly(r *rule, x crossing) {
	if c, ok := x.cmd.(core.Wake); ok && c.Now.After(w.now) {
		w.broke(r, "%s wakes rows due by %s, later than now (%s)", c, c.Now.Sub(epoch), w.offset())
	}
}

func (w *world) flushNotEmpty(r *rule, x crossing) {
	c, ok := x.cmd.(core.Flush)
	if !ok {
		return
	}
	if c.StagePasses == 0 && c.MessagesLeft == 0 && len(c.Stages) == 0 {
		w.broke(r, "an empty statistics flush: %s", c)
		return
	}
	for _, d := range c.Stages {
		if d == (core.StageDelta{Stage: d.Stage}) {
			w.broke(r, "a statistics flush with an empty delta for %s: %s", d.Stage, c)
			return
		}
	}
}

// newFlush is the Flush cmd is when it is a new one of this life: not a
// carried flush sent again, nor one of this life's re-sent under its sequence.
func (w *world) newFlush(cmd core.Command) (core.Flush, bool) {
	c, ok := cmd.(core.Flush)
	if !ok || c.Life != int64(w.life) {
		return c, false
	}
	return c, w.lastFlush == nil || c.Seq != w.lastFlush.Seq
}

func (w *world) flushSequenced(r *rule, x crossing) {
	c, ok := x.cmd.(core.Flush)
	if !ok {
		return
	}
	if c.Life != int64(w.life) {
		// Only a carried flush, sent again unchanged, may name another life.
		for _, f := range w.startCarry {
			a, b := f, c
			a.Op, b.Op = 0, 0
			if f.Seq != 0 && a.String() == b.String() {
				return
			}
		}
		w.broke(r, "a flush of life %d, which is not this life (%d), nor a flush it carried: %s", c.Life, w.life, c)
		return
	}
	if seq := w.q.FlushMark(c.Life); c.Seq != seq && c.Seq != seq+1 {
		w.broke(r, "flush seq %d, but the last applied of life %d is %d: want it or the next", c.Seq, c.Life, seq)
		return
	}
	if last := w.lastFlush; last != nil && c.Seq == last.Seq {
		a, b := *last, c
		a.Op, b.Op = 0, 0
		if a.String() != b.String() {
			w.broke(r, "a flush re-sent with seq %d differs from the first: %s, first %s", c.Seq, c, last)
		}
	}
}

func (w *world) flushNotEarly(r *rule, x crossing) {
	c, ok := w.newFlush(x.cmd)
	if !ok {
		return
	}
	since := w.now.Sub(w.flushedAt)
	idle := w.nothingHeld()
	switch {
	case since >= w.sc.stats:
	case idle && since >= core.IdleFlushMin:
	case w.shut > 0 && idle && w.allGone():
	case w.shut > 0 && !w.shutFlushed: // what was counted before the request, at once
	default:
		w.broke(r, "%s is not due: %s since the last, STATS_INTERVAL %s, idle %v (at most once every %s)",
			c, since, w.sc.stats, idle, core.IdleFlushMin)
	}
}

func (w *world) allGone() bool { return len(w.alive) == 0 }

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

func (w *world) inspectSerial(r *rule, x crossing) {
	c, ok := x.cmd.(core.Inspect)
	if !ok {
		return
	}
	if w.inspectOut || w.shut > 0 {
		w.broke(r, "%s while another is outstanding (%v) or during a shutdown (%v)", c, w.inspectOut, w.shut > 0)
		return
	}
	// Sooner than core.InspectInterval after the life's last only when its
	// claims reported core.InspectGrowth rows added since, and as many as the
	// live rows the last inspection found; never sooner than
	// core.InspectGrowthInterval. The rows added count from the life's
	// first claim result when the last went out before any (baselineOwed).
	if w.inspectCmdAt.IsZero() {
		return
	}
	since := w.now.Sub(w.inspectCmdAt)
	grew := w.settledSeen-w.settledAtInspect >= max(core.InspectGrowth, w.liveInspected)
	if since < core.InspectGrowthInterval || since < core.InspectInterval && !grew {
		w.broke(r, "%s %s after the last, with %d rows reported added since beside %d live", c, since, w.settledSeen-w.settledAtInspect, w.liveInspected)
	}
}

// vacuumCalledFor: a vacuum or an analyze only when the last inspection called
// for one (dead rows past core.VacuumDeadMin, or a queue that outgrew its
// statistics: outgrewPlans; no vacuum running; the role may vacuum the queue),
// of exactly the kind it called for (maintenanceFor), VACUUM is on, none of
// the core's is running, no shutdown is under way, and core.VacuumIntervalMin
// has passed.
func (w *world) vacuumCalledFor(r *rule, x crossing) {
	c, ok := x.cmd.(core.Vacuum)
	if !ok {
		return
	}
	in := w.lastInspected
	switch {
	case !w.sc.vacuum:
		w.broke(r, "%s although VACUUM = off", c)
	case w.vacuumOut:
		w.broke(r, "%s while the core's last vacuum runs", c)
	case w.shut > 0:
		w.broke(r, "%s during a shutdown", c)
	case in == nil || in.Vacuuming || in.NotOwner || maintenanceFor(in) < 0:
		w.broke(r, "%s not called for by the last inspection %v", c, in)
	case c.Kind != maintenanceFor(in):
		w.broke(r, "%s where the last inspection %v calls for %s (VACUUM for dead rows, ANALYZE for a queue that outgrew its statistics, both at once)",
			c, in, core.Vacuum{Op: c.Op, Kind: maintenanceFor(in)})
	case !w.vacuumSent.IsZero() && w.now.Sub(w.vacuumSent) < core.VacuumIntervalMin:
		w.broke(r, "%s %s after the last, before VacuumIntervalMin %s", c, w.now.Sub(w.vacuumSent), core.VacuumIntervalMin)
	}
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

func (w *world) exit(r *rule, x crossing) {
	c, ok := x.cmd.(core.Exit)
	if !ok {
		return
	}
	for _, y := range w.alive {
		w.broke(r, "%s while %s is alive", c, y.id)
		return
	}
	switch {
	case c.Code != 0 && w.shut < 2:
		w.broke(r, "%s after a single shutdown request: a graceful shutdown must wait for every write", c)
	case c.Code == 0 && !w.nothingHeld():
		w.broke(r, "%s although the core still holds or owes %s", c, w.heldText())
	case c.Code == 0:
		for _, row := range w.q.Rows() {
			if row.Status == core.StatusRunning && w.strayed[row.ID] != w.claimGen[w.slot(row.ID)]+1 {
				// (A row a stray tool made running since its last claim is an
				// orphan of the next start-up reset; the sweep only runs between.)
				w.broke(r, "%s (every row reset or resolved) but row %d is running at %s", c, row.ID, row.Stage)
				return
			}
		}
	}
}

// ---- the state between and after steps ----

// checkTimely holds the core to its deadlines (the rules of atDeadline). It
// runs after every step and again whenever the simulated clock moves on, before
// anything else happens at the new instant: a deadline that passed while the
// core slept (it asked for no timer, or a late one) is caught then, not at the
// next unrelated event, when the core would act late and look punctual.
func (w *world) checkTimely() {
	if w.fail != nil || !w.running {
		return
	}
	w.checkAt(atDeadline, crossing{})
}

// checkStep holds the core to what it must do in the step itself (the rules of
// afterStep), after its deadlines. free says whether the core could start a
// queue transaction in it (none outstanding once the step's results were in).
func (w *world) checkStep(free bool) {
	w.checkTimely()
	if w.fail != nil || !w.running {
		return
	}
	w.stepFree = free
	w.checkAt(afterStep, crossing{})
	w.inspectedNow, w.vacuumedNow = nil, false
}

func (w *world) inspectDue(r *rule, _ crossing) {
	if w.shut == 0 && !w.inspectOut && w.now.Sub(w.inspectSent) > core.InspectInterval {
		w.broke(r, "the queue's health was last asked for %s ago, InspectInterval %s", w.now.Sub(w.inspectSent), core.InspectInterval)
	}
}

func (w *world) flushNotLate(r *rule, _ crossing) {
	if w.txnOut() || w.coreDown || w.shut > 0 || !w.unflushed() {
		return
	}
	since := w.now.Sub(w.flushedAt)
	if since > w.sc.stats || (w.nothingHeld() && since > core.IdleFlushMin) {
		w.broke(r, "statistics unflushed %s after the last flush (STATS_INTERVAL %s, idle %v), and no transaction is outstanding",
			since, w.sc.stats, w.nothingHeld())
	}
}

func (w *world) wakeDue(rl *rule, _ crossing) {
	if w.txnOut() || w.coreDown || w.shut > 0 {
		return
	}
	for id := w.idBase + 1; id <= w.idBase+int64(len(w.msgOf)); id++ {
		r, _ := w.q.Get(id)
		if _, held := w.heldBy(id); r.Status == core.StatusPaused && r.Timeout.Before(w.now) && !held && !w.unseen[id] {
			w.broke(rl, "row %d is paused until %s, %s ago, and no wake is outstanding", id, r.Timeout.Sub(epoch), w.now.Sub(r.Timeout))
			return
		}
	}
}

func (w *world) stopGraceDue(r *rule, _ crossing) {
	for _, y := range w.alive {
		if y.stopped && !y.killed && w.now.Sub(y.stoppedAt) > w.sc.grace {
			w.broke(r, "%s was stopped %s ago and is neither gone nor killed, STOP_GRACE %s", y.id, w.now.Sub(y.stoppedAt), w.sc.grace)
			return
		}
	}
}

// working lists, in id order, the live workers outside a shutdown that are
// ready and neither stopped nor killed: those the watchdog, recycling and
// reaping apply to.
func (w *world) working() []*wmodel {
	var out []*wmodel
	if w.shut > 0 {
		return nil
	}
	for _, y := range w.alive {
		if y.started && !y.stopped && !y.killed {
			out = append(out, y)
		}
	}
	return out
}

func (w *world) watchdogDue(r *rule, _ crossing) {
	stopping := func() []*wmodel { // stopped, at a shutdown's request or not: the watchdog still runs
		var out []*wmodel
		for _, y := range w.alive {
			if y.started && y.stopped && !y.killed && w.shut < 2 {
				out = append(out, y)
			}
		}
		return out
	}
	for _, y := range append(w.working(), stopping()...) {
		if own := w.sc.runtimeOf(y.stage); len(y.queue) > 0 && !w.coreDown && w.now.Sub(y.headSince) > own {
			w.broke(r, "%s's head %d has run %s unanswered and the watchdog has not killed it, its stage's MAX_RUNTIME %s",
				y.id, y.queue[0], w.now.Sub(y.headSince), own)
			return
		}
	}
}

func (w *world) recycleDue(r *rule, _ crossing) {
	for _, y := range w.working() {
		if st := w.sc.stages[y.stage]; len(y.queue) == 0 && y.handed >= st.maxMessages {
			w.broke(r, "%s has handled MAX_MESSAGES %d, holds nothing and is not recycled", y.id, st.maxMessages)
			return
		}
	}
}

func (w *world) reapDue(r *rule, _ crossing) {
	for _, y := range w.working() {
		st := w.sc.stages[y.stage]
		if y.probe && w.backlogAt(y.stage) > 0 {
			continue // a probe is handed nothing until it has lived core.StartWindow
		}
		if len(y.queue) == 0 && y.handed < st.maxMessages && w.now.Sub(y.idleSince) > w.sc.idle {
			w.broke(r, "%s has been idle for %s and is not reaped, WORKER_IDLE_TIMEOUT %s", y.id, w.now.Sub(y.idleSince), w.sc.idle)
			return
		}
	}
}

// rateTokenDue: a token that came since the last step, at a stage held by its
// rate: the claim was due then.
func (w *world) rateTokenDue(r *rule, _ crossing) {
	for s, st := range w.sc.stages {
		if w.cfg.Stages[s].Rate == 0 || w.tokens(s, w.steppedAt) >= 1 {
			continue
		}
		due := w.nextToken(s)
		if due.After(w.steppedAt) && due.Before(w.now) && w.claimOwed(s, due) {
			w.broke(r, "stage %s's next token under RATE %s came at %s, with pending rows the core knew of and room for them, and nothing was claimed by %s",
				st.name, st.rate, due.Sub(epoch), w.offset())
			return
		}
	}
}

// cooldownEndDue: a cooldown that ended since the last step: what it held
// back was due then.
func (w *world) cooldownEndDue(r *rule, _ crossing) {
	for s, st := range w.sc.stages {
		until := w.cool[s].until
		if !until.After(w.steppedAt) || !until.Before(w.now) {
			continue
		}
		if need := w.spawnNeed(s); need > 0 && w.live(s) < st.parallelism && w.shut == 0 {
			w.broke(r, "stage %s's cooldown ended at %s with %d claimed messages no worker can take, and no worker was spawned by %s",
				st.name, until.Sub(epoch), need, w.offset())
			return
		}
		if w.claimOwed(s, until) {
			w.broke(r, "stage %s's cooldown ended at %s with pending rows the core knew of and room for them, and nothing was claimed by %s",
				st.name, until.Sub(epoch), w.offset())
			return
		}
	}
}

// outgrewPlans: the inspection found the queue at core.AnalyzePagesMin or more
// and more than twice the size in pages its statistics were taken at
// (PostgreSQL plans a table never vacuumed nor analyzed as 10 pages at least),
// or at core.AnalyzeRowsMin live rows or more and more than twice their rows.
// Derived here, not by core.OutgrewPlans, which a bug of it would fool.
func outgrewPlans(in *core.Inspected) bool {
	return in.Pages >= core.AnalyzePagesMin && in.Pages > 2*max(in.PlannedPages, 10) ||
		in.Live >= core.AnalyzeRowsMin && in.Live > 2*in.PlannedRows
}

// maintenanceFor is what inspection in calls for, if it calls for anything:
// VACUUM for dead rows past core.VacuumDeadMin, ANALYZE for a queue that
// outgrew its statistics, VACUUM (ANALYZE) for both.
func maintenanceFor(in *core.Inspected) core.Maintenance {
	switch dead, outgrew := in.Dead >= core.VacuumDeadMin, outgrewPlans(in); {
	case dead && outgrew:
		return core.VacuumAnalyze
	case outgrew:
		return core.AnalyzeOnly
	case dead:
		return core.VacuumOnly
	}
	return -1
}

func (w *world) vacuumWhenDue(r *rule, _ crossing) {
	in := w.inspectedNow
	if in != nil && !w.vacuumedNow && w.sc.vacuum && w.shut == 0 && !in.Vacuuming && !in.NotOwner && !w.vacuumOut &&
		(in.Dead >= core.VacuumDeadMin || outgrewPlans(in)) &&
		(w.vacuumSent.IsZero() || w.now.Sub(w.vacuumSent) >= core.VacuumIntervalMin) {
		w.broke(r, "the queue has %d dead row versions and %d pages, planned for %d; no vacuum runs and VACUUM is on, and the step neither vacuumed nor analyzed it",
			in.Dead, in.Pages, in.PlannedPages)
	}
}

func (w *world) protocolErrorKills(r *rule, _ crossing) {
	for _, y := range w.alive {
		if y.proto && !y.killed {
			w.broke(r, "%s broke the protocol and the core did not kill it in that step", y.id)
			return
		}
	}
}

func (w *world) shutdownStops(r *rule, _ crossing) {
	for _, y := range w.alive {
		id := y.id
		switch {
		case y.proto && !y.killed:
		case w.shut >= 2 && !y.killed:
			w.broke(r, "%s is not killed after a second shutdown request", id)
			return
		case w.shut == 1 && !y.stopped && !y.killed:
			w.broke(r, "%s is neither stopped nor killed after a shutdown request", id)
			return
		}
	}
}

func (w *world) stageCapacity(r *rule, _ crossing) {
	for s, st := range w.sc.stages {
		if live := w.live(s); live > st.parallelism {
			w.broke(r, "stage %s has %d live workers, PARALLELISM %d", st.name, live, st.parallelism)
			return
		}
		if held, limit := w.heldAt(st.name), st.parallelism*st.queueLimit; held > limit {
			w.broke(r, "stage %s holds %d messages, more than QUEUE_LIMIT × PARALLELISM = %d", st.name, held, limit)
			return
		}
	}
}

func (w *world) spawnWhenNeeded(r *rule, _ crossing) {
	for s, st := range w.sc.stages {
		if w.shut > 0 || w.coolingAt(s, w.now) {
			continue
		}
		if need := w.spawnNeed(s); need > 0 && w.live(s) < st.parallelism {
			w.broke(r, "stage %s has %d claimed messages that its ready and starting workers cannot take, room for %d more workers, and spawned none",
				st.name, need, st.parallelism-w.live(s))
			return
		}
	}
}

func (w *world) promptness(r *rule, _ crossing) {
	for s, st := range w.sc.stages {
		if w.shut > 0 || w.coolingAt(s, w.now) {
			continue
		}
		if w.stepFree && w.claimOwed(s, w.now) && !slices.ContainsFunc(w.claimCaps, func(c core.Cap) bool { return c.Stage == st.name }) {
			w.broke(r, "stage %s has pending rows the core was told of, room for %d, no transaction outstanding and no cooldown, and the step claimed none of them",
				st.name, w.room(s, w.now))
			return
		}
	}
}

// claimFloor holds the claim floor rule, as the fake queue runs a claim of the
// core's transaction: a claim looks above each stage's floor
// (core.Cap.After) only, and no row is pending at or below it when the claim
// runs. Every way a row becomes pending below a floor is one the core hears of:
// its own resolve, wake or reset, a NOTIFY, the heartbeat; and a producer's row
// lands below ids a claim saw only while that claim reported nothing settled.
// The exceptions: a row an operator retried, while the core has not heard of it
// (its NOTIFY lost) or heard only after it sent the claim (sent); and a row
// of an order key the claim may not take, or whose head a release reported or
// found busy and no later release has handed on (the core lowers the floor
// when a release reports the head).
func (w *world) claimFloor(rl *rule, x crossing) {
	if x.claimRun == nil {
		return
	}
	c, sent := x.claimRun.claim, x.claimRun.sent
	for _, cp := range c.Caps {
		for _, r := range w.q.Rows() {
			if r.ID > cp.After {
				break
			}
			if at, ok := w.retried[r.ID]; ok && (at.IsZero() || at.After(sent)) {
				continue
			}
			if slices.Contains(c.Exclude, r.ID) || slices.Contains(x.claimRun.beside, r.ID) {
				// Held, or resolved by a transaction sent beside the claim's:
				// the core lowers the floor when the resolve reports it pending.
				continue
			}
			if r.Key != "" && (slices.Contains(c.ExcludeKeys, r.Key) || w.olderUnfinished(r) ||
				slices.ContainsFunc(x.claimRun.heads, func(h core.Head) bool { return h.ID == r.ID }) || slices.Contains(x.claimRun.busy, r.Key) ||
				slices.Contains(x.claimRun.unclaimed, r.Key) || w.keysBusy[r.Key]) {
				// Not the claim's to take, or a head its own transaction's
				// release reported or left to a later release (busy, in this
				// transaction or an earlier one not yet followed by a release
				// of the key; a move of the key that was to claim and did
				// not): the core lowers the floor when a release reports it.
				continue
			}
			if r.Status == core.StatusPending && r.Stage == cp.Stage {
				w.broke(rl, "claim op=%d looks above %d at stage %s and passes over pending row %d%s", c.Op, cp.After, cp.Stage, r.ID, w.keyText(r.Key))
				return
			}
		}
	}
}

// claimOwed is the promptness rule: at instant at, the core was told that rows
// may be pending at stage s (and has not since claimed the stage dry), rows
// there were pending then, the stage has room, the database is up as far as the
// core knows, no transaction is outstanding, no shutdown is under way, no
// cooldown holds the stage back and no back-pressure does (pressureHeld).
// Then the core must claim for s.
func (w *world) claimOwed(s int, at time.Time) bool {
	if !w.told[s] || w.txnOut() || w.coreDown || w.shut > 0 || w.coolingAt(s, at) || w.room(s, at) <= 0 || w.tokens(s, at) < 1 {
		return false
	}
	if _, held := w.pressureHeld(s); held {
		return false // rule pressure-held-only-while-over's
	}
	name := w.sc.stages[s].name
	for _, r := range w.q.Rows() {
		if r.Status == core.StatusPending && r.Stage == name && !w.insertedAt[w.slot(r.ID)].After(at) {
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
func (w *world) checkRateBound(r *rule, s int) {
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
			w.broke(r, "stage %s: %d rows claimed from %s to %s, more than RATE × T + max(1, RATE) = %.3f (RATE %g)",
				w.sc.stages[s].name, sum, from.Sub(epoch), last.at.Sub(epoch), limit, rate)
			return
		}
	}
}

func (w *world) coolingAt(s int, at time.Time) bool { return at.Before(w.cool[s].until) }

// live counts the workers of stage s that have not exited.
func (w *world) live(s int) int {
	n := 0
	for _, y := range w.alive {
		if y.stage == s {
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
	for _, y := range w.alive {
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
	for _, y := range w.alive {
		if y.stage == s {
			need -= w.slots(y)
		}
	}
	return need
}

// pressureMax is the Max a claim must check stage s's MAX_PENDING with
// (core.Limit): while no worker of it answered since its latest round of
// failed starts (a cooldown no answer has ended yet), the limit less what waits for the stage beside its
// pending rows, derived here: the ids claimed for it and not handed out,
// what its workers that have not answered hold, which a failed start
// gives back, and the rows the outstanding resolves' moves and emits claim
// there (those of the claim's own transaction among them), which the
// claim's count finds running and the core holds only once their outcomes
// come; -1 at the least (the stage is over whatever is pending).
func (w *world) pressureMax(s int) int64 {
	if !w.unproven(s) {
		return w.cfg.Stages[s].MaxPending
	}
	n := w.backlogAt(s) + w.movesOutAt(w.sc.stages[s].name)
	for _, y := range w.alive {
		if y.stage == s && y.answered == 0 {
			n += len(y.queue)
		}
	}
	return max(-1, w.cfg.Stages[s].MaxPending-int64(n))
}

// unproven reports whether no worker of stage s answered since its latest
// round of failed starts (a cooldown no answer has ended yet).
func (w *world) unproven(s int) bool {
	return w.cool[s].step != 0 && !w.answeredAt[s].After(w.cool[s].at)
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

// ---- the fake queue's changes ----

// observe holds every row change the fake queue makes to the rules of
// atChange, then counts what the rules keep: the rows the dispatcher itself
// fails or times out, and each row's claims.
func (w *world) observe(c fakequeue.Change) {
	if c.By == fakequeue.ByStray {
		w.strayed[c.After.ID] = w.claimGen[w.slot(c.After.ID)] + 1
	}
	if w.checkAt(atChange, crossing{change: &c}); w.fail != nil {
		return
	}
	if c.By == fakequeue.ByClaim || (c.By == fakequeue.ByResolve && c.Before.Status == core.StatusRunning && c.After.Status == core.StatusRunning) {
		// A claim, or a move that claims (running at its stage to running at
		// the next).
		delete(w.retried, c.After.ID)
		w.claimGen[w.slot(c.After.ID)]++
	}
	if w.ownVerdict(c) {
		w.verdicts[c.After.ID] = c.After.Status
	}
}

// ownVerdict reports whether c is this core's resolve failing or timing out a
// row (a dead core's last transaction, applied as it died, is not: it never
// hears of it).
func (w *world) ownVerdict(c fakequeue.Change) bool {
	return c.By == fakequeue.ByResolve && (c.After.Status == core.StatusFailed || c.After.Status == core.StatusTimeout) && w.execLife == w.life
}

func (w *world) onlyClaimRuns(r *rule, x crossing) {
	if c := x.change; c != nil && c.Before.Status == core.StatusPending && c.After.Status == core.StatusRunning && c.By != fakequeue.ByClaim && c.By != fakequeue.ByStray {
		w.broke(r, "row %d went from pending to running by %s; only the dispatcher's claim may", c.After.ID, c.By)
	}
}

func (w *world) attempts(r *rule, x crossing) {
	c := x.change
	// (A crash restores an earlier version of the row, attempts and all.)
	switch {
	case c == nil || c.By == fakequeue.ByCrash:
	case c.By != fakequeue.ByStage && (c.After.Status == core.StatusPending || c.After.Status == core.StatusRunning) &&
		c.After.Attempts != 0 && c.After.AttemptsStage != c.After.Stage:
		w.broke(r, "row %d was made %s at stage %s by %s with attempts %d, counted at stage %q: at another stage they are 0",
			c.After.ID, c.After.Status, c.After.Stage, c.By, c.After.Attempts, c.After.AttemptsStage)
	case c.After.Attempts > c.Before.Attempts+1 || (c.After.Attempts == c.Before.Attempts+1 && (c.By != fakequeue.ByResolve || c.After.Status != core.StatusPaused)):
		w.broke(r, "row %d's attempts went from %d to %d by %s (%s): only a retry adds one",
			c.After.ID, c.Before.Attempts, c.After.Attempts, c.By, c.After.Status)
	case c.After.Attempts == c.Before.Attempts+1 && c.After.AttemptsStage != c.After.Stage:
		w.broke(r, "row %d's retry at stage %s counted its attempts at stage %q", c.After.ID, c.After.Stage, c.After.AttemptsStage)
	case c.After.Attempts < c.Before.Attempts && !attemptsMayDrop(*c):
		w.broke(r, "row %d's attempts went from %d (counted at stage %q) to %d by %s at stage %s: only a move, a requeue, an operator's retry, "+
			"or a claim or reset of a row whose attempts were counted at another stage sets them to 0",
			c.After.ID, c.Before.Attempts, c.Before.AttemptsStage, c.After.Attempts, c.By, c.Before.Stage)
	}
}

// attemptsMayDrop says whether change c may lower a row's attempts: a
// resolve (a move, the requeue of a row its stage advanced), an operator's
// retry, a stage's own move to another stage (the stage library's sets them
// to 0), or a claim or an orphan reset of a row whose attempts were counted
// at another stage, to 0.
func attemptsMayDrop(c fakequeue.Change) bool {
	switch c.By {
	case fakequeue.ByOperator:
		return true
	case fakequeue.ByResolve: // a move to another stage, or the requeue of a row its stage advanced
		return c.After.Attempts == 0 && (c.After.Stage != c.Before.Stage || c.Before.AttemptsStage != c.Before.Stage)
	case fakequeue.ByStage:
		return c.After.Stage != c.Before.Stage
	case fakequeue.ByClaim, fakequeue.ByReset:
		return c.After.Attempts == 0 && c.Before.AttemptsStage != "" && c.Before.AttemptsStage != c.Before.Stage
	}
	return false
}

func (w *world) wakeKeepsHanded(r *rule, x crossing) {
	c := x.change
	if c == nil || c.By != fakequeue.ByWake || w.execLife != w.life {
		return
	}
	if wid, handed := w.holder[c.After.ID]; handed {
		w.broke(r, "a wake made row %d pending while %s holds it unanswered (its stage paused it and has not answered yet)", c.After.ID, wid)
	}
}

func (w *world) noStaleVerdict(r *rule, x crossing) {
	if c := x.change; c != nil && w.ownVerdict(*c) {
		id := c.After.ID
		if gen := w.claimGenOf[id]; gen != w.claimGen[w.slot(id)] {
			w.broke(r, "row %d was made %s by a resolve meant for its claim #%d, but it has been claimed again since (claim #%d): a verdict must only apply to the claim it was made for",
				id, c.After.Status, gen, w.claimGen[w.slot(id)])
		}
	}
}

func (w *world) epochGuard(r *rule, x crossing) {
	if c := x.change; c != nil && w.ownVerdict(*c) {
		id := c.After.ID
		if ex := w.expects[id]; ex != nil && ex.answer && w.wrote[w.slot(id)] {
			w.broke(r, "message %d was failed as a stage bug (answered 0, left running), but its stage had committed a transition on that visit (which a PostgreSQL crash then lost): it must be requeued", id)
		}
	}
}

// ---- the end ----

// finalCheck runs after healing, once everything is quiescent: the rules of
// atEnd, nothing lost, every message final, and the statistics flushed as
// they happened.
func (w *world) finalCheck() {
	w.truth().exact = true // the life running at the end must have flushed everything
	if w.checkAt(atEnd, crossing{}); w.fail != nil {
		return
	}
	_, passes, left, _ := w.q.Stats()
	w.note("final check passed: %d messages, %d lives, passes %d, left %d", w.inserted, w.life, passes, left)
}

func (w *world) liveness(r *rule, x crossing) {
	if x.overdue {
		w.broke(r, "%s after healing began, messages are not all final: %s", w.deadline.Sub(w.healAt), w.unfinished())
		return
	}
	rows := w.q.Rows()
	if len(rows) != w.inserted+w.childrenIn {
		w.broke(r, "%d rows in the queue, %d inserted and %d emitted", len(rows), w.inserted, w.childrenIn)
		return
	}
	for _, row := range rows {
		if !row.Status.Final() {
			w.broke(r, "row %d is %s at %s at the end", row.ID, row.Status, row.Stage)
			return
		}
	}
}

func (w *world) statisticsExact(r *rule, _ crossing) {
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
				w.broke(r, "flushed %s = %d, want %d (what happened)", what, got, lo)
			} else {
				w.broke(r, "flushed %s = %d, want between %d (lives that must have flushed) and %d (all lives)", what, got, lo, hi)
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

// ---- back-pressure (MAX_PENDING) ----

// pressureHeld is the stage whose back-pressure holds stage s, as the
// pressure rules derive it from what crossed (pressureState): a stage s fed
// (its passes sent messages to it this life) whose last check found more than
// its MAX_PENDING pending, unless s itself was over its own at its last
// check, or a shutdown is under way. Derived here, not asked of the core.
func (w *world) pressureHeld(s int) (int, bool) {
	if w.shut > 0 || w.over[s] {
		return 0, false
	}
	for _, t := range w.feeds[s] {
		if w.over[t] {
			return t, true
		}
	}
	return 0, false
}

// inPressure reports whether stage s takes part in back-pressure: it has a
// MAX_PENDING and a stage feeds it, or it feeds one.
func (w *world) inPressure(s int) bool {
	if w.cfg.Stages[s].MaxPending <= 0 {
		return false
	}
	return len(w.feeds[s]) > 0 || slices.ContainsFunc(w.feeds, func(ts []int) bool { return slices.Contains(ts, s) })
}

// pressureHolds holds rule pressure-holds at each command.
func (w *world) pressureHolds(r *rule, x crossing) {
	switch c := x.cmd.(type) {
	case core.Claim:
		for s, st := range w.sc.stages {
			max := w.cfg.Stages[s].MaxPending
			if w.inPressure(s) && !slices.ContainsFunc(c.Limits, func(l core.Limit) bool { return l.Stage == st.name && l.Max == w.pressureMax(s) }) {
				w.broke(r, "claim op=%d does not check stage %s's MAX_PENDING %d as %d (less, while none of its workers answered since its latest failed starts, what waits for it beside its pending rows: %d claimed not handed out, what its workers that have not answered hold, and what outstanding moves and emits claim there), though back-pressure involves it (feeds %v): %v",
					c.Op, st.name, max, w.pressureMax(s), w.backlogAt(s), w.feeds, c.Limits)
				return
			}
		}
		for s, ts := range w.feeds {
			for _, t := range ts {
				if !slices.Contains(c.Holds, core.Hold{Stage: w.sc.stages[s].name, By: w.sc.stages[t].name}) {
					w.broke(r, "claim op=%d does not hold stage %s by stage %s, which it feeds: a claim sent before the core knew %s was over would still give %s rows once its own transaction took %s over",
						c.Op, w.sc.stages[s].name, w.sc.stages[t].name, w.sc.stages[t].name, w.sc.stages[s].name, w.sc.stages[t].name)
					return
				}
			}
		}
		for _, cp := range c.Caps {
			s, ok := w.stageOf(cp.Stage)
			if t, held := w.pressureHeld(s); ok && held && cp.N > 0 {
				w.broke(r, "claim op=%d asks %d rows of stage %s, held: it feeds stage %s, which had more than its MAX_PENDING %d pending at its last check",
					c.Op, cp.N, cp.Stage, w.sc.stages[t].name, w.cfg.Stages[t].MaxPending)
				return
			}
		}
	case core.Resolve:
		for _, it := range c.Items {
			s, ok := w.stageOf(it.To)
			if t, held := w.pressureHeld(s); ok && held && it.Claim {
				w.broke(r, "resolve item %s claims at stage %s, held: it feeds stage %s, which had more than its MAX_PENDING %d pending at its last check",
					it, it.To, w.sc.stages[t].name, w.cfg.Stages[t].MaxPending)
				return
			}
		}
	}
}

// pressureOnlyWhileOver holds rule pressure-held-only-while-over after each
// step: a stage that feeds others is owed its claim (rule promptness's
// obligation, which a held stage is exempt from) unless pressureHeld.
func (w *world) pressureOnlyWhileOver(r *rule, _ crossing) {
	for s, st := range w.sc.stages {
		if len(w.feeds[s]) == 0 || !w.stepFree || !w.claimOwed(s, w.now) {
			continue
		}
		if !slices.ContainsFunc(w.claimCaps, func(c core.Cap) bool { return c.Stage == st.name }) {
			var over []string
			for _, t := range w.feeds[s] {
				over = append(over, fmt.Sprintf("%s over %v", w.sc.stages[t].name, w.over[t]))
			}
			w.broke(r, "stage %s has pending rows the core was told of and room for %d, and the step claimed none, though no stage it feeds is over its MAX_PENDING at its last check or it is over its own (%s; %s over %v)",
				st.name, w.room(s, w.now), strings.Join(over, ", "), st.name, w.over[s])
			return
		}
	}
}

// pressureNeverStops holds rule pressure-never-stops at the end: a heal phase
// that ran out of time must not end with a stage held by back-pressure while
// messages wait there.
func (w *world) pressureNeverStops(r *rule, x crossing) {
	if !x.overdue {
		return
	}
	for s, st := range w.sc.stages {
		t, held := w.pressureHeld(s)
		if !held {
			continue
		}
		for _, row := range w.q.Rows() {
			if row.Stage == st.name && row.Status == core.StatusPending {
				w.broke(r, "%s after healing began, row %d waits pending at stage %s, held by back-pressure: stage %s had more than its MAX_PENDING %d pending at its last check",
					w.deadline.Sub(w.healAt), row.ID, st.name, w.sc.stages[t].name, w.cfg.Stages[t].MaxPending)
				return
			}
		}
	}
}
