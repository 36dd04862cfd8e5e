package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
)

// The checker's checks. The checker follows what crosses the core's boundary
// (the events the world feeds and the commands the core returns) and what the
// fake world does, keeps what it knows in its ledger (ledger.go), and holds the
// core to the rules (rules.go) at each command, event and row change, after
// every step, at every deadline and at the end. It never looks inside the core.
// Where a rule needs a decision the reference text leaves to the core, it
// derives it itself from the core's documented constants (the start window,
// the failed-start limit and the doubling cooldown; the watchdog pausing while
// the core knows the database is down, heads getting a fresh MAX_RUNTIME at
// DatabaseUp; a malformed line deciding the fate of a worker's head even after
// another kill; claimed rows not yet handed out may always be given back).

// gateBound is how long a row committed without a notification may stay
// pending, at a stage with room, before the core either claims its stage or
// takes the gate and looks: core.RestAfter, the wait for producers still
// holding the gate (up to 100 ms here), transactions retried after 40001, and
// the gate's round trips. Far below any POLL_INTERVAL the scenarios draw.
const gateBound = 500 * time.Millisecond

// checkGate holds the rule "no message waits for the heartbeat": a row whose
// producer did not notify is claimed, or its stage claimed, or the core takes
// the gate and looks, within gateBound. While the core cannot claim the stage
// (no room, a cooldown, no token of its RATE, the database down, a shutdown)
// the clock restarts.
func (w *world) checkGate(rl *rule) {
	for _, id := range sortedKeys(w.unnotified) {
		r, _ := w.q.Get(id)
		s, ok := w.stageOf(r.Stage)
		if r.Status != core.StatusPending || !ok {
			delete(w.unnotified, id)
			continue
		}
		if w.coreDown || w.shut > 0 || w.coolingAt(s, w.now) || w.room(s, w.now) <= 0 || w.tokens(s, w.now) < 1 {
			w.unnotified[id] = w.now
			continue
		}
		bound := gateBound
		if w.gateFailing {
			bound += core.RestRetryMax
		}
		if since := w.now.Sub(w.unnotified[id]); since > bound {
			w.broke(rl, "message row %d waits for the heartbeat: committed %s ago without NOTIFY (the dispatcher counted as busy), "+
				"and since then the core neither claimed stage %s nor took the gate and looked", id, since, r.Stage)
			return
		}
	}
}

// ---- commands, checked before the world executes them ----

func (w *world) modelCommands(cmds []core.Command) {
	if w.movesBesideLook(cmds); w.fail != nil {
		return
	}
	queued := false
	for _, cmd := range cmds {
		if core.IsQueue(cmd) {
			if w.txnOut && !queued {
				w.broke(ruleSerialWrites, "a queue transaction is issued while another is outstanding: %s", cmd)
				return
			}
			queued = true
		}
		if w.checkCommand(cmd); w.fail != nil {
			return
		}
		w.recordCommand(cmd)
	}
	if queued {
		if w.claimsYieldAtMostHalf(); w.fail != nil {
			return
		}
		w.txnOut = true
	}
}

// checkCommand holds one command to the rules of atCommand, against the
// ledger as it stood before the command. It changes nothing.
func (w *world) checkCommand(cmd core.Command) {
	switch x := cmd.(type) {
	case core.ResetOrphans:
		w.checkReset(x)
	case core.Resolve:
		for _, it := range x.Items {
			if w.checkItem(it); w.fail != nil {
				return
			}
		}
		w.checkMovesClaim(x)
	case core.Claim:
		w.checkClaim(x)
	case core.Wake:
		if x.Now.After(w.now) {
			w.broke(ruleWakeNotEarly, "%s wakes rows due by %s, later than now (%s)", x, x.Now.Sub(epoch), w.offset())
		}
	case core.Flush:
		w.checkFlush(x)
	case core.Inspect:
		if w.inspectOut || w.shut > 0 {
			w.broke(ruleInspect, "%s while another is outstanding (%v) or during a shutdown (%v)", x, w.inspectOut, w.shut > 0)
		}
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
}

func (w *world) checkReset(x core.ResetOrphans) {
	if !w.resetSent {
		if len(x.Keep) != 0 {
			w.broke(ruleResetKeepsHeld, "the start-up orphan reset keeps %v; a new core holds nothing", x.Keep)
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
			w.broke(ruleResetKeepsHeld, "reset-orphans would reset message %d, which this core holds (%s), keep %v", id, w.heldText(), x.Keep)
			return
		}
	}
}

// givesBack reports whether it gives back a claimed row no worker has seen,
// which is always safe (say, its stage cannot start a worker); whether it comes
// back is liveness's business.
func (w *world) givesBack(it core.Item) bool {
	s, ok := w.backlog[it.ID]
	return ok && w.expects[it.ID] == nil && it.Verdict == core.Requeue && it.Stage == s && it.Reason == "" && it.Epoch == ""
}

func (w *world) checkItem(it core.Item) {
	ex := w.expects[it.ID]
	if w.givesBack(it) {
		return
	}
	if ex == nil {
		who := "no one"
		if wid, ok := w.holder[it.ID]; ok {
			who = wid.String() + ", which has not answered it"
		} else if _, ok := w.backlog[it.ID]; ok {
			who = "the core, which has not handed it out"
		}
		w.broke(ruleItemForHeld, "resolve item %s for a message held by %s", it, who)
		return
	}
	switch {
	case it.Stage != ex.stage:
		w.broke(ruleItemStage, "resolve item %s names stage %s; the message was claimed for %s", it, it.Stage, ex.stage)
	case it.Verdict != ex.verdict:
		w.broke(ruleItemVerdict, "resolve item %s: want verdict %s (%s)", it, ex.verdict, ex.why)
	case ex.move != nil && (it.To != ex.move.To || !it.Until.Equal(ex.move.Until) || it.Patch != ex.move.Patch):
		w.broke(ruleItemTransition, "resolve item %s: want the answered transition to %s (until %s, patch %q)", it, ex.move.To, formatSim(ex.move.Until), ex.move.Patch)
	case ex.verdict == core.Retry && (it.Until.Before(ex.retryFrom) || !it.Until.Before(ex.retryTo)):
		w.broke(ruleRetryBackoff, "resolve item %s: a retry due at %s, want from %s (the delay) to before %s (plus the jitter) (%s)",
			it, formatSim(it.Until), formatSim(ex.retryFrom), formatSim(ex.retryTo), ex.why)
	case ex.move == nil && (it.To != "" || it.Patch != "" || (!it.Until.IsZero() && ex.verdict != core.Retry)):
		w.broke(ruleItemTransition, "resolve item %s carries a transition; only an answered one may (%s)", it, ex.why)
	case ex.answer && it.Epoch != ex.epoch:
		w.broke(ruleItemEpoch, "resolve item %s for a message answered 0: want the epoch of its claim %q", it, ex.epoch)
	case !ex.answer && it.Epoch != "":
		w.broke(ruleItemEpoch, "resolve item %s carries an epoch; only a message answered 0 may (%s)", it, ex.why)
	case (ex.verdict == core.Fail || ex.verdict == core.TimeOut || ex.verdict == core.Answered || ex.verdict == core.Retry) && it.Reason == "":
		w.broke(ruleItemReason, "resolve item %s fails the message without a reason", it)
	case (ex.verdict == core.Requeue || ex.verdict == core.Move) && it.Reason != "":
		w.broke(ruleItemReason, "resolve item %s requeues or moves with a reason", it)
	case ex.reason != "" && it.Reason != ex.reason:
		w.broke(ruleItemReason, "resolve item %s: want the worker's reason %q", it, ex.reason)
	}
}

func (w *world) checkClaim(x core.Claim) {
	if w.shut > 0 {
		w.broke(ruleClaimBounds, "claim during shutdown: %s", x)
		return
	}
	for _, cp := range x.Caps {
		s := w.stageIndex(cp.Stage)
		st := w.sc.stages[s]
		limit := st.parallelism * st.queueLimit
		if held := w.heldAt(cp.Stage) + w.movesOut[cp.Stage]; cp.N <= 0 || held+cp.N > limit {
			w.broke(ruleClaimBounds, "claim asks %d rows of %s, which already holds %d (moves of its transaction that claim included): more than QUEUE_LIMIT × PARALLELISM = %d", cp.N, cp.Stage, held, limit)
			return
		}
		if w.cfg.Stages[s].Rate > 0 {
			if tokens := w.tokens(s, w.now); cp.N > tokens {
				w.broke(ruleRate, "claim asks %d rows of %s, whose RATE %s leaves %d tokens now", cp.N, cp.Stage, st.rate, tokens)
				return
			}
		}
	}
}

// claimsYieldAtMostHalf holds rule claim-yields-at-most-half over the
// transaction a step issued, once its commands are recorded: every stage it
// claims, and every stage the promptness rule owes a claim, is asked for at
// least half its room.
func (w *world) claimsYieldAtMostHalf() {
	caps := map[string]int{}
	for _, cp := range w.claimCaps {
		caps[cp.Stage] = cp.N
	}
	for s, st := range w.sc.stages {
		n, claimed := caps[st.name]
		if !claimed && !w.claimOwed(s, w.now) {
			continue
		}
		// The claim is recorded: its own N is already off the bucket.
		room := min(w.room(s, w.now)-w.movesOut[st.name], w.tokens(s, w.now)+n)
		if n < room-room/2 {
			w.broke(ruleClaimYieldsHalf, "the transaction asks %d rows of stage %s, which has room for %d (moves of the transaction that claim there taken off, within its RATE): a stage may yield at most half its room",
				n, st.name, room)
			return
		}
	}
}

// movesBesideLook holds rule move-claims over a step's transaction: no move
// claims in a transaction that also resets orphans or wakes paused rows, which
// may make rows pending anywhere (at any id) before the claim runs.
func (w *world) movesBesideLook(cmds []core.Command) {
	var claiming *core.Item
	look := ""
	for _, cmd := range cmds {
		switch x := cmd.(type) {
		case core.Resolve:
			for i := range x.Items {
				if x.Items[i].Claim {
					claiming = &x.Items[i]
				}
			}
		case core.ResetOrphans, core.Wake:
			look = cmd.String()
		}
	}
	if claiming != nil && look != "" {
		w.broke(ruleMoveClaims, "resolve item %s claims in the transaction of %s, which may make rows pending at its target first", claiming, look)
	}
}

// checkMovesClaim holds the moves of a resolve that claim their row at their
// target (core.Item.Claim) to rule move-claims and, for the room they take,
// claim-bounds; a RATE's stage to rule rate.
func (w *world) checkMovesClaim(x core.Resolve) {
	claiming := map[string]int{}
	lowestLeft := map[string]int64{} // per target, the lowest id of a move there that does not claim
	for _, it := range x.Items {
		if it.Verdict == core.Move {
			if _, ok := w.stageOf(it.To); ok && !it.Claim && (lowestLeft[it.To] == 0 || it.ID < lowestLeft[it.To]) {
				lowestLeft[it.To] = it.ID
			}
		}
	}
	for _, it := range x.Items {
		if !it.Claim {
			continue
		}
		s, ok := w.stageOf(it.To)
		if it.Verdict != core.Move || !ok {
			w.broke(ruleMoveClaims, "resolve item %s claims, but it is no move to a stage this dispatcher runs", it)
			return
		}
		st := w.sc.stages[s]
		switch ex := w.expects[it.ID]; {
		case w.shut > 0:
			w.broke(ruleClaimBounds, "resolve item %s claims during a shutdown", it)
		case w.cfg.Stages[s].Rate > 0:
			w.broke(ruleRate, "resolve item %s claims at stage %s, which has a RATE: only its claims, counted by its bucket, take its rows", it, it.To)
		case w.toldLook[s]:
			w.broke(ruleMoveClaims, "resolve item %s claims at stage %s, where the core was told rows may be pending that it would overtake", it, it.To)
		case claiming[it.To]+1 > w.room(s, w.now)-w.ownPending[s]:
			w.broke(ruleMoveClaims, "resolve item %s claims at stage %s, whose room (%d) does not cover the %d rows the core left pending there and the %d moves of this resolve that claim: the claim after the resolve cannot take them all, so the moves overtake them",
				it, it.To, w.room(s, w.now), w.ownPending[s], claiming[it.To]+1)
		case lowestLeft[it.To] != 0 && lowestLeft[it.To] < it.ID:
			w.broke(ruleMoveClaims, "resolve item %s claims at stage %s, overtaking the move of row %d there, which does not", it, it.To, lowestLeft[it.To])
		case slices.ContainsFunc(x.Items, func(o core.Item) bool { return o.Verdict == core.Requeue && o.Stage == it.To }):
			w.broke(ruleMoveClaims, "resolve item %s claims at stage %s, where the same resolve gives a row back", it, it.To)
		case ex != nil && (ex.unsure || ex.raced):
			w.broke(ruleMoveClaims, "resolve item %s claims, but its row may have moved already (a lost reply, or a commit that raced its resolve)", it)
		case it.LineMax != 0 && (w.cfg.Stages[s].Input != conf.InputMessage || it.LineMax != w.cfg.Dispatch.LineMax):
			w.broke(ruleMessageLines, "resolve item %s reads the message with LINE_MAX %d; stage %s is INPUT = %s, LINE_MAX %d", it, it.LineMax, it.To, w.cfg.Stages[s].Input, w.cfg.Dispatch.LineMax)
		case it.LineMax == 0 && w.cfg.Stages[s].Input == conf.InputMessage:
			w.broke(ruleMessageLines, "resolve item %s claims at INPUT = message stage %s without reading the message", it, it.To)
		}
		if w.fail != nil {
			return
		}
		claiming[it.To]++
		if held, limit := w.heldAt(it.To), st.parallelism*st.queueLimit; held+claiming[it.To] > limit {
			w.broke(ruleClaimBounds, "resolve item %s claims at stage %s, which holds %d and is claimed %d by this resolve: more than QUEUE_LIMIT × PARALLELISM = %d",
				it, it.To, held, claiming[it.To], limit)
			return
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
		w.broke(ruleVacuumCalledFor, "%s although VACUUM = off", x)
	case w.vacuumOut:
		w.broke(ruleVacuumCalledFor, "%s while the core's last vacuum runs", x)
	case w.shut > 0:
		w.broke(ruleVacuumCalledFor, "%s during a shutdown", x)
	case in == nil || in.Dead < core.VacuumDeadMin || in.Vacuuming:
		w.broke(ruleVacuumCalledFor, "%s not called for by the last inspection %v", x, in)
	case !w.vacuumSent.IsZero() && w.now.Sub(w.vacuumSent) < core.VacuumIntervalMin:
		w.broke(ruleVacuumCalledFor, "%s %s after the last, before VacuumIntervalMin %s", x, w.now.Sub(w.vacuumSent), core.VacuumIntervalMin)
	}
}

func (w *world) checkFlush(x core.Flush) {
	if x.StagePasses == 0 && x.MessagesLeft == 0 && len(x.Stages) == 0 {
		w.broke(ruleFlushNotEmpty, "an empty statistics flush: %s", x)
		return
	}
	for _, d := range x.Stages {
		if d == (core.StageDelta{Stage: d.Stage}) {
			w.broke(ruleFlushNotEmpty, "a statistics flush with an empty delta for %s: %s", d.Stage, x)
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
		w.broke(ruleFlushSequenced, "a flush of life %d, which is not this life (%d), nor a flush it carried: %s", x.Life, w.life, x)
		return
	}
	if seq := w.q.FlushMark(x.Life); x.Seq != seq && x.Seq != seq+1 {
		w.broke(ruleFlushSequenced, "flush seq %d, but the last applied of life %d is %d: want it or the next", x.Seq, x.Life, seq)
		return
	}
	if last := w.lastFlush; last != nil && x.Seq == last.Seq {
		a, b := *last, x
		a.Op, b.Op = 0, 0
		if a.String() != b.String() {
			w.broke(ruleFlushSequenced, "a flush re-sent with seq %d differs from the first: %s, first %s", x.Seq, x, last)
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
		w.broke(ruleFlushNotEarly, "%s is not due: %s since the last, STATS_INTERVAL %s, idle %v (at most once every %s)",
			x, since, w.sc.stats, idle, core.IdleFlushMin)
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

func (w *world) checkSpawn(x core.Spawn) {
	s := w.stageIndex(x.Stage)
	st := w.sc.stages[s]
	if w.shut > 0 {
		w.broke(ruleSpawnNeeded, "spawn during shutdown: %s", x)
		return
	}
	if c := w.cool[s]; w.now.Before(c.until) {
		w.broke(ruleCooldown, "%s respawns stage %s during its cooldown (until %s)", x, x.Stage, c.until.Sub(epoch))
		return
	}
	if w.workers[x.Worker] != nil {
		w.broke(ruleSpawnNeeded, "%s reuses a worker id", x)
		return
	}
	if need := w.spawnNeed(s); need <= 0 {
		w.broke(ruleSpawnNeeded, "%s: its claimed messages (%d) fit in the workers it has, ready or starting", x, w.backlogAt(s))
		return
	}
	live := 1 + w.live(s)
	if live > st.parallelism {
		w.broke(ruleParallelism, "%s makes %d live workers of stage %s, PARALLELISM %d", x, live, x.Stage, st.parallelism)
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

func (w *world) checkWrite(x core.Write) {
	y := w.workers[x.Worker]
	switch {
	case y == nil || y.gone:
		w.broke(ruleHandToReady, "%s to a worker that is not alive", x)
		return
	case !y.started || y.stopped || y.killed:
		w.broke(ruleHandToReady, "%s to a worker that is not ready (started %v, stopped %v, killed %v)", x, y.started, y.stopped, y.killed)
		return
	}
	stage := w.sc.stages[y.stage]
	for _, z := range w.alive {
		if id := z.id; z != y && z.stage == y.stage && z.started && w.slots(z) > 0 && len(z.queue) > len(y.queue) {
			w.broke(ruleWorkPacked, "%s hands ids to a worker holding %d while %s holds %d and has room: work is not packed onto the fewest workers",
				x, len(y.queue), id, len(z.queue))
			return
		}
	}
	if stage.message != (x.Lines != nil) || x.Lines != nil && len(x.Lines) != len(x.IDs) {
		w.broke(ruleMessageLines, "%s to a worker of stage %s (INPUT = message: %v) carries %d lines for %d ids", x, stage.name, stage.message, len(x.Lines), len(x.IDs))
		return
	}
	for i := range x.IDs {
		if w.checkHanded(x, i, stage); w.fail != nil {
			return
		}
	}
	if n := len(y.queue) + len(x.IDs); n > stage.queueLimit {
		w.broke(ruleQueueLimit, "%s leaves %d unanswered ids with %s, QUEUE_LIMIT %d", x, n, x.Worker, stage.queueLimit)
	} else if n := y.handed + len(x.IDs); n > stage.maxMessages {
		w.broke(ruleQueueLimit, "%s hands %s its %dth id, MAX_MESSAGES %d", x, x.Worker, n, stage.maxMessages)
	}
}

// checkHanded holds the i-th id of x (and its line) to the rules: claimed for
// its stage, committed, handed once, and its line the row as it is now.
func (w *world) checkHanded(x core.Write, i int, stage stageConf) {
	id := x.IDs[i]
	if x.Lines != nil {
		if why := w.staleLine(id, x.Lines[i]); why != "" {
			w.broke(ruleMessageLines, "%s hands message %d the line %s, but %s: a message stage must get the row as it is now", x, id, x.Lines[i], why)
			return
		}
	}
	if s, ok := w.backlog[id]; !ok || s != stage.name || slices.Contains(x.IDs[:i], id) {
		who := "not claimed by this core"
		if wid, ok := w.holder[id]; ok {
			who = "held by " + wid.String()
		} else if slices.Contains(x.IDs[:i], id) {
			who = "handed twice in it"
		} else if ok {
			who = "claimed for stage " + s
		} else if _, ok := w.expects[id]; ok {
			who = "being resolved"
		}
		w.broke(ruleHandClaimed, "%s hands message %d to stage %s, but it is %s", x, id, stage.name, who)
		return
	}
	if r, _ := w.q.Get(id); r.Status != core.StatusRunning || r.Stage != stage.name {
		w.broke(ruleHandClaimed, "%s hands message %d, whose row is %s at %s (claim not committed?)", x, id, r.Status, r.Stage)
	}
}

func (w *world) checkStop(x core.Stop) {
	y := w.workers[x.Worker]
	if y == nil || y.gone {
		w.broke(ruleKillLive, "%s of a worker that is not alive", x)
		return
	}
	if y.stopped || y.killed || w.shut > 0 {
		return
	}
	st := w.sc.stages[y.stage]
	switch {
	case len(y.queue) > 0:
		w.broke(ruleReapIdle, "%s stops a worker holding %v outside a shutdown", x, y.queue)
	case y.handed >= st.maxMessages:
		// recycled
	case !y.started:
		w.broke(ruleReapIdle, "%s stops a worker that never became ready, outside a shutdown", x)
	case w.now.Sub(y.idleSince) < w.sc.idle:
		w.broke(ruleReapIdle, "%s reaps a worker idle for %s only, WORKER_IDLE_TIMEOUT %s", x, w.now.Sub(y.idleSince), w.sc.idle)
	}
}

func (w *world) checkKill(x core.Kill) {
	y := w.workers[x.Worker]
	if y != nil && y.gone && y.goneStep == w.steps {
		return // decided on a line that came in the same batch as its exit
	}
	if y == nil || y.gone {
		w.broke(ruleKillLive, "%s of a worker that is not alive", x)
		return
	}
	if y.killed {
		return
	}
	switch w.killCauseOf(y) {
	case causeGrace:
		if w.now.Sub(y.stoppedAt) < w.sc.grace {
			w.broke(ruleStopGrace, "%s kills a stopped worker after %s, before STOP_GRACE %s", x, w.now.Sub(y.stoppedAt), w.sc.grace)
		}
	case causeTimeout:
		if len(y.queue) == 0 {
			w.broke(ruleWatchdog, "%s kills a worker that holds nothing and broke no rule", x)
			return
		}
		if w.coreDown {
			w.broke(ruleWatchdog, "%s: the watchdog kills while the core knows the database is down (no stage can commit then)", x)
			return
		}
		if ran, own := w.now.Sub(y.headSince), w.sc.runtimeOf(y.stage); ran < own {
			w.broke(ruleWatchdog, "%s: the watchdog kills after %s at the head, before its stage's MAX_RUNTIME %s", x, ran, own)
		}
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
	case y.stopped:
		return causeGrace
	}
	return causeTimeout
}

func (w *world) checkExit(x core.Exit) {
	for _, y := range w.alive {
		w.broke(ruleExit, "%s while %s is alive", x, y.id)
		return
	}
	switch {
	case x.Code != 0 && w.shut < 2:
		w.broke(ruleExit, "%s after a single shutdown request: a graceful shutdown must wait for every write", x)
	case x.Code == 0 && !w.nothingHeld():
		w.broke(ruleExit, "%s although the core still holds or owes %s", x, w.heldText())
	case x.Code == 0:
		for _, r := range w.q.Rows() {
			if r.Status == core.StatusRunning && w.strayed[r.ID] != w.claimGen[r.ID-1]+1 {
				// (A row a stray tool made running since its last claim is an
				// orphan of the next start-up reset; the sweep only runs between.)
				w.broke(ruleExit, "%s (every row reset or resolved) but row %d is running at %s", x, r.ID, r.Stage)
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
	w.checkAt(atDeadline)
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
	w.checkAt(afterStep)
	w.inspectedNow, w.vacuumedNow = nil, false
}

func (w *world) inspectDue(r *rule) {
	if w.shut == 0 && !w.inspectOut && w.now.Sub(w.inspectSent) > core.InspectInterval {
		w.broke(r, "the queue's health was last asked for %s ago, InspectInterval %s", w.now.Sub(w.inspectSent), core.InspectInterval)
	}
}

func (w *world) flushNotLate(r *rule) {
	if w.txnOut || w.coreDown || w.shut > 0 || !w.unflushed() {
		return
	}
	since := w.now.Sub(w.flushedAt)
	if since > w.sc.stats || (w.nothingHeld() && since > core.IdleFlushMin) {
		w.broke(r, "statistics unflushed %s after the last flush (STATS_INTERVAL %s, idle %v), and no transaction is outstanding",
			since, w.sc.stats, w.nothingHeld())
	}
}

func (w *world) wakeDue(rl *rule) {
	if w.txnOut || w.coreDown || w.shut > 0 {
		return
	}
	for id := int64(1); id <= int64(len(w.msgOf)); id++ {
		r, _ := w.q.Get(id)
		if _, held := w.heldBy(id); r.Status == core.StatusPaused && r.Timeout.Before(w.now) && !held {
			w.broke(rl, "row %d is paused until %s, %s ago, and no wake is outstanding", id, r.Timeout.Sub(epoch), w.now.Sub(r.Timeout))
			return
		}
	}
}

func (w *world) stopGraceDue(r *rule) {
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

func (w *world) watchdogDue(r *rule) {
	for _, y := range w.working() {
		if own := w.sc.runtimeOf(y.stage); len(y.queue) > 0 && !w.coreDown && w.now.Sub(y.headSince) > own {
			w.broke(r, "%s's head %d has run %s unanswered and the watchdog has not killed it, its stage's MAX_RUNTIME %s",
				y.id, y.queue[0], w.now.Sub(y.headSince), own)
			return
		}
	}
}

func (w *world) recycleDue(r *rule) {
	for _, y := range w.working() {
		if st := w.sc.stages[y.stage]; len(y.queue) == 0 && y.handed >= st.maxMessages {
			w.broke(r, "%s has handled MAX_MESSAGES %d, holds nothing and is not recycled", y.id, st.maxMessages)
			return
		}
	}
}

func (w *world) reapDue(r *rule) {
	for _, y := range w.working() {
		st := w.sc.stages[y.stage]
		if len(y.queue) == 0 && y.handed < st.maxMessages && w.now.Sub(y.idleSince) > w.sc.idle {
			w.broke(r, "%s has been idle for %s and is not reaped, WORKER_IDLE_TIMEOUT %s", y.id, w.now.Sub(y.idleSince), w.sc.idle)
			return
		}
	}
}

// rateTokenDue: a token that came since the last step, at a stage held by its
// rate: the claim was due then.
func (w *world) rateTokenDue(r *rule) {
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
func (w *world) cooldownEndDue(r *rule) {
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

func (w *world) vacuumWhenDue(r *rule) {
	in := w.inspectedNow
	if in != nil && !w.vacuumedNow && w.sc.vacuum && w.shut == 0 && in.Dead >= core.VacuumDeadMin && !in.Vacuuming && !w.vacuumOut &&
		(w.vacuumSent.IsZero() || w.now.Sub(w.vacuumSent) >= core.VacuumIntervalMin) {
		w.broke(r, "the queue has %d dead row versions, no vacuum runs and VACUUM is on, and the step vacuumed nothing", in.Dead)
	}
}

func (w *world) protocolErrorKills(r *rule) {
	for _, y := range w.alive {
		if y.proto && !y.killed {
			w.broke(r, "%s broke the protocol and the core did not kill it in that step", y.id)
			return
		}
	}
}

func (w *world) shutdownStops(r *rule) {
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

func (w *world) stageCapacity(r *rule) {
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

func (w *world) spawnWhenNeeded(r *rule) {
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

func (w *world) promptness(r *rule) {
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
				w.broke(ruleClaimFloor, "claim op=%d looks above %d at stage %s and passes over pending row %d", c.Op, cp.After, cp.Stage, r.ID)
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
			w.broke(ruleRate, "stage %s: %d rows claimed from %s to %s, more than RATE × T + max(1, RATE) = %.3f (RATE %g)",
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

// observe checks every row change the fake queue makes, and counts the rows the
// dispatcher itself fails or times out.
func (w *world) observe(c fakequeue.Change) {
	if c.By == fakequeue.ByStray {
		w.strayed[c.After.ID] = w.claimGen[c.After.ID-1] + 1
	}
	if c.Before.Status == core.StatusPending && c.After.Status == core.StatusRunning && c.By != fakequeue.ByClaim && c.By != fakequeue.ByStray {
		w.broke(ruleOnlyClaimRuns, "row %d went from pending to running by %s; only the dispatcher's claim may", c.After.ID, c.By)
		return
	}
	// (A crash restores an earlier version of the row, attempts and all.)
	switch {
	case c.By == fakequeue.ByCrash:
	case c.After.Stage != c.Before.Stage && c.After.Attempts != 0:
		w.broke(ruleAttempts, "row %d moved from stage %s to %s by %s with attempts %d: a move to another stage sets it to 0",
			c.After.ID, c.Before.Stage, c.After.Stage, c.By, c.After.Attempts)
		return
	case c.After.Attempts > c.Before.Attempts+1 || (c.After.Attempts == c.Before.Attempts+1 && (c.By != fakequeue.ByResolve || c.After.Status != core.StatusPaused)):
		w.broke(ruleAttempts, "row %d's attempts went from %d to %d by %s (%s): only a retry adds one",
			c.After.ID, c.Before.Attempts, c.After.Attempts, c.By, c.After.Status)
		return
	}
	if _, handed := w.holder[c.After.ID]; c.By == fakequeue.ByWake && handed && w.execLife == w.life {
		w.broke(ruleWakeKeepsHanded, "a wake made row %d pending while %s holds it unanswered (its stage paused it and has not answered yet)",
			c.After.ID, w.holder[c.After.ID])
		return
	}
	if c.By == fakequeue.ByClaim || (c.By == fakequeue.ByResolve && c.Before.Status == core.StatusRunning && c.After.Status == core.StatusRunning) {
		// A claim, or a move that claims (running at its stage to running at
		// the next).
		delete(w.retried, c.After.ID)
		w.claimGen[c.After.ID-1]++
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
		w.broke(ruleNoStaleVerdict, "row %d was made %s by a resolve meant for its claim #%d, but it has been claimed again since (claim #%d): a verdict must only apply to the claim it was made for",
			id, c.After.Status, gen, w.claimGen[id-1])
		return
	}
	if ex := w.expects[id]; ex != nil && ex.answer && w.wrote[id-1] {
		w.broke(ruleEpochGuard, "message %d was failed as a stage bug (answered 0, left running), but its stage had committed a transition on that visit (which a PostgreSQL crash then lost): it must be requeued", id)
	}
}

// ---- the end ----

// finalCheck runs after healing, once everything is quiescent: nothing lost,
// every message final, and the statistics flushed as they happened.
func (w *world) finalCheck() {
	w.truth().exact = true // the life running at the end must have flushed everything
	rows := w.q.Rows()
	if len(rows) != w.inserted {
		w.broke(ruleLiveness, "%d rows in the queue, %d inserted", len(rows), w.inserted)
		return
	}
	for _, r := range rows {
		if !r.Status.Final() {
			w.broke(ruleLiveness, "row %d is %s at %s at the end", r.ID, r.Status, r.Stage)
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
				w.broke(ruleStatisticsExact, "flushed %s = %d, want %d (what happened)", what, got, lo)
			} else {
				w.broke(ruleStatisticsExact, "flushed %s = %d, want between %d (lives that must have flushed) and %d (all lives)", what, got, lo, hi)
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
