// The step's queue transaction: what to reset, resolve, wake, claim and flush,
// the results that come back, the claim floors, and the gate (Rest and Busy).

package core

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// txnOut is one queue transaction awaiting its results: its commands not yet
// answered. A full one is the step's transaction as it always was: it may
// keep the history, reset, resolve, release, wake, claim and flush. One
// that is not carries a single Resolve of items without an order key, sent
// beside the others (see queueWork).
type txnOut struct {
	cmds []Command
	full bool
}

// result takes the queue command that op answers off its outstanding
// transaction, and returns it with that transaction. Any error means the
// transaction failed: the database is down until the shell says otherwise.
func (c *Core) result(op int64, err string) (Command, *txnOut) {
	for ti, t := range c.txns {
		for i, cmd := range t.cmds {
			if QueueOp(cmd) != op {
				continue
			}
			t.cmds = slices.Delete(t.cmds, i, i+1)
			if len(t.cmds) == 0 {
				c.txns = slices.Delete(c.txns, ti, ti+1)
			}
			if err != "" && !c.dbDown {
				c.dbDown = true
				if c.downSince.IsZero() {
					c.downSince = c.now
				}
				c.logf(LevelWarn, "queue write failed, holding results and trying again: %s", err)
			}
			if err == "" && !c.dbDown && !c.downSince.IsZero() {
				c.logf(LevelInfo, "queue writes succeed again, %s after the first that failed", c.now.Sub(c.downSince).Round(time.Millisecond))
				c.downSince = time.Time{}
			}
			return cmd, t
		}
	}
	panic(fmt.Sprintf("core: result for op %d, which is not outstanding", op))
}

// claimOut returns the outstanding transaction that carries a Claim, if any
// (there is at most one: only a full transaction claims, and one full
// transaction is out at a time).
func (c *Core) claimOut() (*txnOut, bool) {
	for _, t := range c.txns {
		if slices.ContainsFunc(t.cmds, func(cmd Command) bool { _, ok := cmd.(Claim); return ok }) {
			return t, true
		}
	}
	return nil, false
}

// aloneOut reports whether an outstanding transaction carries what must go
// alone: a reset or the history's upkeep.
func (c *Core) aloneOut() bool {
	return slices.ContainsFunc(c.txns, func(t *txnOut) bool {
		return slices.ContainsFunc(t.cmds, func(cmd Command) bool {
			switch cmd.(type) {
			case ResetOrphans, KeepHistory:
				return true
			}
			return false
		})
	})
}

// fullOut reports whether a full transaction is outstanding.
func (c *Core) fullOut() bool {
	return slices.ContainsFunc(c.txns, func(t *txnOut) bool { return t.full })
}

// sessions is how many transactions may be outstanding at once (SESSIONS).
func (c *Core) sessions() int {
	return max(1, c.cfg.Sessions)
}

// pendsOut adds to stages those at which an outstanding transaction may make
// rows pending that the core could know of (a move that does not claim, a
// requeue, a child inserted pending), and reports true if one may make rows
// pending anywhere (a reset, a wake, a release). A move that claims at such
// a stage could overtake one of them (see claimMoves).
func (c *Core) pendsOut(stages map[string]bool) (anywhere bool) {
	for _, t := range c.txns {
		anywhere = pendsOf(t.cmds, stages) || anywhere
	}
	return anywhere
}

// pendsOf adds to stages those at which the transaction of cmds may make rows
// pending that the core could know of, and reports true if it may make rows
// pending anywhere (see pendsOut).
func pendsOf(cmds []Command, stages map[string]bool) (anywhere bool) {
	for _, cmd := range cmds {
		switch q := cmd.(type) {
		case ResetOrphans, Wake, Release:
			anywhere = true
		case Resolve:
			for _, it := range q.Items {
				switch {
				case it.Verdict == Requeue:
					stages[it.Stage] = true
				case it.Verdict == Move && !it.Claim:
					stages[it.To] = true
				}
				for _, e := range it.Emits {
					if !e.Claim {
						stages[e.Stage] = true
					}
				}
			}
		}
	}
	return anywhere
}

// firstKeyless reports whether item it has no order key and is sent for the
// first time (not again after a lost reply or a racing commit): only such an
// item may go beside a full transaction (besideOK).
func (c *Core) firstKeyless(it Item) bool {
	return it.Key == "" && !c.unsure[it.ID] && c.races[it.ID] == 0
}

// besideOK reports whether item it may be resolved beside a full transaction
// (resolveBeside): it has no order key (its release rides with a full
// transaction), and its resolve makes no row pending that the core could
// know of: a move that claims at its stage or leaves the pipeline, a
// failure, a timeout, a retry (the row is paused), with every child it
// emits claimed by its insert. A requeue, a move left pending, a bare 0 (the
// row is wherever its stage put it) and an item sent again (its first send
// may have applied) go with the next full transaction, whose claim follows
// its resolve and takes such rows in order: beside it they would keep the
// stage from counting as claimed dry, and its moves from claiming.
func (c *Core) besideOK(it Item) bool {
	if !c.firstKeyless(it) {
		return false
	}
	for _, e := range it.Emits {
		if !e.Claim {
			return false
		}
	}
	switch it.Verdict {
	case Fail, TimeOut, Retry:
		return true
	case Move:
		return it.Claim || it.To == TargetDone || it.To == TargetPaused
	}
	return false
}

// outstandingItems lists the ids of the items of the outstanding resolves.
func (c *Core) outstandingItems() []int64 {
	var ids []int64
	for _, t := range c.txns {
		for _, cmd := range t.cmds {
			if r, ok := cmd.(Resolve); ok {
				for _, it := range r.Items {
					ids = append(ids, it.ID)
				}
			}
		}
	}
	return ids
}

// QueueOp returns the Op of a queue command (0 for any other command).
func QueueOp(cmd Command) int64 {
	if q, ok := cmd.(QueueCommand); ok {
		return q.queueOp()
	}
	return 0
}

// QueueErr returns the error text of a queue result event: "" for a success or
// for any other event.
func QueueErr(ev Event) string {
	if r, ok := ev.(queueResult); ok {
		return r.queueErr()
	}
	return ""
}

// verdictStatus is the status an item's verdict of failure gives its row
// (failed or timeout), or "" for the verdicts that fail nothing by themselves.
func verdictStatus(it Item) RowStatus {
	switch it.Verdict {
	case Fail, Answered:
		return StatusFailed
	case TimeOut:
		return StatusTimeout
	}
	return ""
}

// lookAll makes the next claim look at every stage from the start: rows may be
// pending anywhere, at any id.
func (c *Core) lookAll() {
	c.lookGen++
	for _, st := range c.stages {
		// Rows are likely pending (a notification, the heartbeat, the
		// database back, a reset): no move claims past them before a claim
		// has looked.
		st.dry = false
	}
	c.lookAbove()
	for _, st := range c.stages {
		st.floor = 0
	}
}

// lookAbove makes the next claim cover every stage, each above its floor. It
// is the look for rows producers committed without notifying: such a row is
// above every floor, since a floor rises only to an id that had settled (no
// producer held an id at or below it, and ids only grow), so this look need
// not walk the index entries below the floors, which a look from the start
// (lookAll) steps over one by one, dead entries of claimed rows included.
//
// Such a row may exist or not (nothing said so), so the look leaves what
// the core knows of each stage (dry) to the claim that looks: until one
// has, moves to the stage leave a slot of its room for it (stage.lookOwed),
// and claim the rest. Ending the stage's dryness instead kept every move to
// it from claiming whenever the look found the stage's room taken by the
// moves of its own transaction: a row version more for each of the next
// transaction's moves there, for about one move in three with order keys
// (docs/performance.md, "Ordering per key").
func (c *Core) lookAbove() {
	for _, st := range c.stages {
		st.maybeMore = true
		st.lookOwed = true
	}
}

// claimAfter is the id above which stage st's claim looks: its floor, lowered
// for what the same transaction makes pending before the claim runs. A reset or
// a wake may make any row pending, so the claim looks from the start; a resolve
// makes pending only rows of its items, at whatever stage they reached. (The
// rows of resolves out beside it are held, so the claim may not take them
// anyway; one such resolve that leaves its row pending lowers the floor with
// its outcome, and its stage is tainted for the claim's result.)
func (c *Core) claimAfter(st *stage, txn []Command) int64 {
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

// owe queues an item for the next Resolve.
// An item of a keyed message carries its key, for the release that follows
// its resolve.
func (c *Core) owe(it Item) {
	c.recordPass(&it)
	if it.Key == "" {
		it.Key = c.keys.keyOf[it.ID]
	}
	c.owed = append(c.owed, it)
}

func (c *Core) claimed(e Claimed) {
	sent, _ := c.result(e.Op, e.Err)
	cmd := sent.(Claim)
	tainted := maps.Clone(c.tainted)
	clear(c.tainted)
	for _, cp := range cmd.Caps {
		c.byName[cp.Stage].claiming = 0
	}
	if e.Err != "" {
		// The claim may have committed: rows may be running that no one holds.
		// Not if it certainly did not: then nothing is to be reset (a lost
		// session costs the retry, not a reset; docs/durability.md).
		c.needReset = c.needReset || !e.Aborted
		// The rate counts what it may have taken (all of it), or nothing.
		for _, cp := range cmd.Caps {
			n := cp.N
			if e.Aborted {
				n = 0
			}
			c.byName[cp.Stage].rate.settle(c.now, n)
		}
		return
	}
	c.epoch = e.Epoch
	c.settled = max(c.settled, e.Settled)
	c.claimedSettled()
	c.checkedLimits(cmd.Limits, e.Over, e.Rows)
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
		m := c.hold(r.ID, e.Epoch, r.Attempts, r.Trace, "")
		if other, ok := c.holdKey(r.ID, r.Key); !ok {
			// Two messages of one key pending at once: a writer outside the
			// rules (the release that follows puts the key in order again).
			c.logf(LevelWarn, "message %d: claimed while message %d of its order key %q is held; requeued unhanded", r.ID, other, r.Key)
			c.owe(Item{ID: r.ID, Stage: st.cfg.Name, Verdict: Requeue, Key: r.Key})
			continue
		}
		if c.shutdown > 0 {
			c.requeue(st, []msg{m})
			continue
		}
		if st.cfg.Input == conf.InputMessage {
			line, why := MessageLine(r, c.cfg.LineMax)
			if why != "" {
				// The message's fault, not the worker's: it alone fails (its
				// failure is logged when resolved).
				c.owe(Item{ID: r.ID, Stage: st.cfg.Name, Verdict: Fail, Reason: why})
				continue
			}
			m.line = line
		}
		st.backlog = append(st.backlog, m)
	}
	for _, cp := range cmd.Caps {
		c.claimedCap(cp, got[cp.Stage], reach[cp.Stage], slices.Contains(e.More, cp.Stage), tainted[cp.Stage])
	}
	for _, st := range c.stages {
		c.headPending(st)
	}
}

// claimedCap takes in what a claim's walk of one stage found: got rows, the
// highest reach, whether more were pending than its cap (more), and whether
// another transaction made rows pending there while the claim was out
// (tainted).
func (c *Core) claimedCap(cp Cap, got int, reach int64, more, tainted bool) {
	assert(got <= cp.N, "claim returned %d rows of stage %s, cap %d", got, cp.Stage, cp.N)
	st := c.byName[cp.Stage]
	st.lookOwed = false
	st.rate.settle(c.now, got)
	if tainted {
		// Rows made pending here while the claim was out, perhaps after
		// its walk: the look goes on, from the floor their outcomes lowered.
		st.maybeMore, st.dry = true, false
		return
	}
	// A notification that came after the claim was sent may have added rows.
	// The claim says whether its walk found more than its cap, whatever it
	// then took: a picked row another writer changed meanwhile is not
	// taken, so a stage with more pending rows may come back short.
	st.maybeMore = more || c.ingressGen != c.claimGen
	st.dry, st.known = !st.maybeMore, 0
	if c.lookGen == c.claimLookGen {
		st.floor = c.floorAfter(cp, got, reach, more)
	}
}

// floorAfter is a stage's floor after a claim that looked above cp.After and
// took got rows, the highest reach, and found more pending rows than its cap
// or not. The claim took every pending row in (cp.After, reach], or above
// cp.After at all if it found no more than it took; of those rows, the ones
// up to c.settled cannot be joined by a late producer's row. So nothing the
// core could know of is pending up to the lower of the two.
func (c *Core) floorAfter(cp Cap, got int, reach int64, more bool) int64 {
	if got < cp.N && !more {
		reach = math.MaxInt64
	}
	return max(cp.After, min(reach, c.settled))
}

func (c *Core) resolved(e Resolved) {
	sent, t := c.result(e.Op, e.Err)
	cmd := sent.(Resolve)
	if e.Err != "" {
		c.resolveFailed(cmd, e.Aborted)
		return
	}
	// Rows this resolve made pending are rows the outstanding claim of
	// another transaction may not have seen (see claimed).
	if ct, ok := c.claimOut(); ok && ct != t {
		c.taintOn = true
		defer func() { c.taintOn = false }()
	}
	assert(len(e.Outcomes) == len(cmd.Items), "resolve of %d items returned %d outcomes", len(cmd.Items), len(e.Outcomes))
	c.releaseAfterQueuedTry(cmd, e.Outcomes)
	defer c.forgetKeys(cmd.Items)
	defer c.owedFirst()
	for i, o := range e.Outcomes {
		it := cmd.Items[i]
		assert(o.ID == it.ID, "outcome %d is for row %d, want %d", i, o.ID, it.ID)
		unsure := c.unsure[o.ID]
		delete(c.unsure, o.ID)
		c.unreserve(it)
		if o.KeyBusy {
			c.keyBusy(it, unsure)
			continue
		}
		c.keyWaitEnded(it.ID)
		// What the step decided (its release: keyOutcome), and what is owed
		// again if a commit raced the write (raced): the message's own
		// outcome, which the row as it is now may take.
		sentAs := it
		if o.Refused == "" && unsure {
			o.Refused = refusedBefore(it, o)
		}
		if o.Refused != "" && o.Status != StatusRunning {
			// The database would not take the item's outcome: what was
			// written is its failure (RefusedFallback), its emits dropped;
			// outcome logs the failure with its reason, which says why,
			// and counts it by the reason as the row has it (a lost send
			// wrote it, cut or not). (A fallback a commit raced wrote
			// nothing: raced owes the item as sent again, its emits with it.)
			c.emitsDropped(c.byName[it.Stage], len(it.Emits), o.ID, "the database refused its pass's outcome")
			it = RefusedFallback(it, o.Refused)
			it.Reason = o.Error
		}
		c.emitted(it, o)
		c.childrenClaimed(it, o)
		if o.Status == StatusRunning && it.Claim && o.Matched {
			// Moved and claimed: not a race, the row is this core's at To.
			// A claim that found work, as a claim's rows are: RestAfter
			// counts from here, so a message whose stages answer promptly
			// goes through them without a Rest and a last look between its
			// hops, each a transaction its next resolve would wait for.
			delete(c.races, o.ID)
			c.lastClaim = c.now
			c.movedClaimed(it, o)
			continue
		}
		if o.Status == StatusRunning {
			c.raced(sentAs, o, unsure)
			continue
		}
		raced := c.races[o.ID] > 0
		delete(c.races, o.ID)
		if it.Verdict != Requeue && o.Stage != it.Stage && o.Status == StatusPending {
			c.learnFeeder(it.Stage, o.Stage) // the pass sent its message on (pressure.go)
		}
		c.keyOutcome(sentAs, o)
		if guarded(sentAs.Verdict) && o.Refused == "" && !o.Matched && !unsure && !raced {
			// (After a lost reply the first send may have written it: no miss then.)
			c.guardMissed(sentAs, o)
		}
		c.outcome(it, o, unsure)
	}
}

// unreserve gives back the room a resolved item's move and emits that
// claim had reserved at their stages (stage.reserved).
func (c *Core) unreserve(it Item) {
	if it.Claim {
		c.byName[it.To].reserved--
	}
	for _, e := range it.Emits {
		if e.Claim {
			c.byName[e.Stage].reserved--
		}
	}
}

// outcome takes what a resolved item's row became, once it is no longer
// running: where it is pending now, a message that left the pipeline, a
// pause's due time. unsure: the item was in a transaction whose reply was
// lost, which may have written it.
func (c *Core) outcome(it Item, o Outcome, unsure bool) {
	switch o.Status {
	case StatusPending:
		if st := c.byName[o.Stage]; st != nil {
			c.taint(st)
			st.maybeMore = true
			st.known++ // (counted while the stage is dry: see stage.dry)
			// The transaction's own claim looked below it (claimAfter), but
			// a later claim of this stage must too, if that one did not.
			st.floor = min(st.floor, o.ID-1)
		} else {
			c.logf(LevelWarn, "message %d is pending at stage %s, which this dispatcher does not run", o.ID, conf.Quote(o.Stage))
		}
	case StatusDone:
		c.left++
	case StatusFailed, StatusTimeout:
		c.left++
		// The core's own verdict counts once: the write this send matched,
		// or, after a lost reply, the one the lost send may have made,
		// known only by the reason it left. A stage that wrote the status
		// itself over an earlier retry's reason of the same text is then
		// counted too: the row cannot tell them apart (docs/pepsi-dispatch.1.md,
		// "Statistics"). Without the lost reply the guard says exactly, and
		// an earlier retry's reason is no longer taken for this verdict.
		if o.Status == verdictStatus(it) && (o.Matched || unsure && o.Error == it.Reason) {
			if o.Status == StatusFailed {
				c.stat(it.Stage).Failed++
			} else {
				c.stat(it.Stage).Timeouts++
			}
			c.logf(LevelWarn, "message %d %s: %s", o.ID, o.Status, o.Error)
		}
	case StatusPaused:
		if it.Verdict == Retry && o.Matched {
			c.stat(it.Stage).Retries++
		}
		// A row with no due time (a stage paused it with a NULL timeout,
		// or 'infinity') is never woken; it must not hide when another is.
		c.nextPaused = earliest(c.nextPaused, o.Timeout)
		c.txnPaused = earliest(c.txnPaused, o.Timeout)
	case StatusBlocked:
		// A keyed message a release put behind an older one of its key
		// (keyOutcome owes the key a release, which decides).
	case "":
		c.logf(LevelWarn, "message %d disappeared from the queue while stage %s held it", o.ID, it.Stage)
	default:
		// The schema allows no other status; a future one must not stop
		// the dispatcher, and the row is not running, so nobody loses it.
		c.logf(LevelWarn, "message %d is %s at stage %s after its resolve, a status this dispatcher does not know", o.ID, conf.Quote(string(o.Status)), conf.Quote(o.Stage))
	}
}

// taint records, while a resolve of a transaction other than the
// outstanding claim's is taken in (taintOn), that it made rows pending at
// st (see claimed).
func (c *Core) taint(st *stage) {
	if c.taintOn {
		c.tainted[st.cfg.Name] = true
	}
}

// guardMissed counts and logs a move whose row was no longer running at its
// stage: nothing was written, its emits inserted nothing.
func (c *Core) guardMissed(it Item, o Outcome) {
	c.stat(it.Stage).GuardMisses++
	if it.Verdict == Move {
		c.logf(LevelWarn, "message %d: stage %s answered a transition, but the row is no longer running there (%s at %s); nothing written",
			o.ID, it.Stage, o.Status, o.Stage)
		c.emitsDropped(c.byName[it.Stage], len(it.Emits), o.ID, "missed its guard")
		return
	}
	what := map[Verdict]string{Fail: "failure", TimeOut: "timeout", Retry: "retry"}[it.Verdict]
	if it.Reason != "" {
		what += " (" + clip(it.Reason, 200) + ")"
	}
	c.logf(LevelWarn, "message %d: its %s at stage %s was not written: the row is no longer running there (%s at %s; the stage wrote it itself)",
		o.ID, what, it.Stage, o.Status, o.Stage)
}

// guarded says whether an item of verdict v whose guard missed (the row no
// longer running at its stage: the stage wrote it itself) is a guard miss:
// an outcome the dispatcher decided and could not write. A requeue of a row
// its stage moved on is not (the row goes where the stage sent it, as
// meant), nor a bare 0 (the stage was to write the row).
func guarded(v Verdict) bool {
	return v == Move || v == Fail || v == TimeOut || v == Retry
}

// emitted takes in the children a matched move inserted (Item.Emits, when
// its Outcome o Matched): but for those inserted running (Outcome.Children,
// see childrenClaimed) they are pending at their stages (or blocked behind
// their order key, or not there at all when their key was known), rows the
// core did not count, so each such stage may have more and is no longer
// known to be dry.
func (c *Core) emitted(it Item, o Outcome) {
	if len(it.Emits) == 0 || !o.Matched || it.Verdict != Move {
		return
	}
	c.stat(it.Stage).Emitted += int64(len(it.Emits))
	running := map[string]int{} // per stage, the children inserted running
	for _, ch := range o.Children {
		running[ch.Stage]++
	}
	for _, e := range it.Emits {
		if e.Claim && running[e.Stage] > 0 {
			running[e.Stage]--
			continue
		}
		if st := c.byName[e.Stage]; st != nil {
			c.taint(st)
			st.maybeMore, st.dry = true, false
		}
	}
}

// childrenClaimed takes in the children a matched move's resolve inserted
// running (Outcome.Children): the core holds each for its stage exactly as
// if a claim had returned it (claimedByResolve).
func (c *Core) childrenClaimed(it Item, o Outcome) {
	if len(o.Children) == 0 {
		return
	}
	claims := 0
	for _, e := range it.Emits {
		if e.Claim {
			claims++
		}
	}
	assert(o.Matched && it.Verdict == Move && len(o.Children) <= claims,
		"resolve of message %d returned %d children running for %d emits that claim (matched %v)", it.ID, len(o.Children), claims, o.Matched)
	c.lastClaim = c.now
	for _, ch := range o.Children {
		st := c.byName[ch.Stage]
		assert(st != nil, "child %d running at unknown stage %q", ch.ID, ch.Stage)
		c.claimedByResolve(st, Row{ID: ch.ID, Stage: ch.Stage, Trace: ch.Trace})
	}
}

// resolveFailed owes a failed resolve's items again, first, without the
// claims of their moves; unless the transaction certainly did not commit, it
// may have applied them (see unsure), and its moves that claimed may have left
// rows running that no one holds, as a lost claim may.
func (c *Core) resolveFailed(cmd Resolve, aborted bool) {
	items, claimed := c.unclaimMoves(cmd.Items)
	if !aborted {
		for i := range items {
			items[i].Again = true
		}
	}
	c.owed = append(items, c.owed...)
	if aborted {
		return
	}
	// Applied or not: the re-sent items may find their rows moved on.
	for _, it := range cmd.Items {
		c.unsure[it.ID] = true
	}
	c.needReset = c.needReset || claimed
}

// racesMax bounds how many times in a row one item is resolved again because
// its row was still running after the resolve (see raced).
const racesMax = 3

// raced handles a row still running after its resolve. Its worker has answered
// or exited, but a commit of the stage's was still on its way to the server (a
// worker killed between COMMIT and its answer, a stage's helper process): the
// resolve's UPDATE waited for that commit, found the row changed and left it,
// and read it back as it was before. Nothing was written. The row is a guard
// miss of its stage, and the item is owed again, so the row stays held (reset
// keeps it, claims exclude it) and the next resolve decides on the committed
// row. A row that keeps changing under racesMax resolves in a row is let go:
// it is running and no one holds it, so the heartbeat's sweep makes it pending.
func (c *Core) raced(it Item, o Outcome, unsure bool) {
	c.stat(it.Stage).GuardMisses++
	n := c.races[o.ID] + 1
	if n > racesMax {
		delete(c.races, o.ID)
		c.logf(LevelError, "message %d: still running at %s after %d resolves, changed each time by another writer; left to the heartbeat's sweep", o.ID, o.Stage, racesMax)
		return
	}
	c.races[o.ID] = n
	if unsure {
		c.unsure[o.ID] = true
	}
	c.logf(LevelWarn, "message %d changed while its resolve wrote it (a late commit of stage %s?): still running at %s, nothing written; resolving it again", o.ID, it.Stage, o.Stage)
	c.owe(it)
}

func (c *Core) nextOpID() int64 {
	c.nextOp++
	return c.nextOp
}

// queueWork sends the next queue transaction, if one is due and a session
// is free (SESSIONS; at most one transaction a Step, so the shell runs each
// Step's queue commands as one transaction). With none outstanding it is a
// full one (fullWork). Beside outstanding ones, it is a full one while none
// of them is, without what must go alone (a reset: every running row it
// does not keep is made pending, a row an outstanding move claims among
// them; the history's upkeep: its DDL would wait for the others' inserts),
// or else one Resolve of the owed items without an order key
// (resolveBeside). What an outstanding transaction may touch is left out of
// the next: its items (held), the rows it may make pending (no move claims
// there: pendsOut), the room its claim may fill (stage.claiming).
func (c *Core) queueWork() {
	if c.dbDown || c.shutdown == 2 || len(c.txns) >= c.sessions() {
		return
	}
	if len(c.txns) == 0 {
		if c.shutdown > 0 || c.needReset || c.historyDue(c.owed) || !c.sendQueuedTry() {
			c.fullWork(false)
		}
		return
	}
	if c.shutdown > 0 || c.needReset || c.sweep || c.aloneOut() || c.historyDue(c.owed) {
		// A reset or the history's upkeep goes alone: when one is due,
		// what is out drains first; when one is out, nothing goes beside
		// it. A shutdown drains what is out.
		return
	}
	if !c.fullOut() && c.fullWork(true) {
		return
	}
	c.resolveBeside()
}

// fullWork builds a full transaction: the history's upkeep, reset, resolve,
// release, wake, claim, flush. beside: other transactions are outstanding
// (queueWork sends none then while a reset or the upkeep is due). It reports
// whether it sent a transaction.
func (c *Core) fullWork(beside bool) bool {
	idle := c.idle() // before the owed items move into the transaction
	var txn []Command
	// The history's partitions first: every row the transaction writes then
	// finds its day made.
	if kh, ok := c.keepHistory(c.owed); ok {
		txn = append(txn, kh)
	}
	upkeep := len(txn) // the commands before the reset
	if reset, ok := c.resetFor(); ok {
		txn = append(txn, reset)
	}
	resolving := false
	waking := c.shutdown == 0 && (c.wakeDue || (!c.nextPaused.IsZero() && !c.now.Before(c.nextPaused)))
	var yielded map[string]int
	items, waiting := c.owedNow()
	if len(items) > 0 {
		// A reset or a wake in the same transaction may make rows pending
		// anywhere, which the moves would overtake: then no move claims.
		yielded = c.claimMoves(items, len(txn) > upkeep || waking, false)
		txn = append(txn, Resolve{Op: c.nextOpID(), Items: items, Traces: c.tracePasses})
		resolving = true
	}
	if rel, ok := c.releaseFor(items, len(txn) > upkeep); ok {
		txn = append(txn, rel)
	}
	c.owed = waiting
	if waking {
		txn = append(txn, Wake{Op: c.nextOpID(), Now: c.now, Keep: c.wakeKeep(txn)})
		c.wakeDue = false
		// From here, the paused rows other results report are the ones its
		// Next may leave out (see woken).
		c.txnPaused = time.Time{}
	}
	if c.shutdown == 0 {
		if claim, ok := c.claimFor(txn, yielded, resolving || waking, beside); ok {
			txn = append(txn, claim)
		}
	}
	if f, ok := c.flushDue(idle); ok {
		f.Op = c.nextOpID()
		txn = append(txn, f)
	}
	if len(txn) == 0 {
		return false
	}
	for _, cmd := range txn {
		c.emit(cmd)
	}
	c.txns = append(c.txns, &txnOut{cmds: txn, full: true})
	return true
}

// resolveBeside sends, beside the outstanding transactions, one Resolve of
// the owed items that may go there (besideOK: their moves claim on
// claimMoves' terms, decided here). The others stay owed for the next full
// transaction.
func (c *Core) resolveBeside() {
	owed, rest := c.owedNow()
	var cand []Item
	for _, it := range owed {
		if c.firstKeyless(it) {
			cand = append(cand, it)
		} else {
			rest = append(rest, it)
		}
	}
	if len(cand) == 0 {
		return
	}
	c.claimMoves(cand, false, true)
	var items, back []Item
	for _, it := range cand {
		if c.besideOK(it) {
			items = append(items, it)
		} else {
			back = append(back, it)
		}
	}
	// Those that stay owed give back the room their claims reserved: the
	// next transaction decides them anew.
	back, _ = c.unclaimMoves(back)
	c.owed = append(rest, back...)
	if len(items) == 0 {
		return
	}
	r := Resolve{Op: c.nextOpID(), Items: items, Traces: c.tracePasses}
	c.emit(r)
	c.txns = append(c.txns, &txnOut{cmds: []Command{r}})
}

// claimFor is the claim the step's transaction ends with, if any: at every
// stage with room that may have pending rows, or at every stage with room
// when the transaction resolves or wakes (all claims after them look at
// every stage), or when a look is due.
func (c *Core) claimFor(txn []Command, yielded map[string]int, all, beside bool) (Claim, bool) {
	// While the core counts as busy no producer notifies it, and a row
	// committed meanwhile at a stage it claimed dry waits for its next
	// look. A core kept busy by transactions that claim no such stage (a
	// key's release, a rated stage's claim; each as long as a 40001 retry
	// makes it) would not rest, so would not look, for as long as they
	// last: it looks by itself, with the transaction it sends anyway, at
	// least every LookEvery. (A transaction of statistics alone is sent
	// after this, at most every STATS_INTERVAL or IdleFlushMin: one
	// transaction in flight, which the bound allows.) Transactions beside
	// this one (beside) keep it busy too, and it cannot rest while they
	// are out: it looks then even with nothing else to send (lookTimer
	// asks for the step).
	// (Probes are named before a due look marks every stage: this look's
	// claim of a stage claimed dry asks for one row too, as it did when a
	// look ended dryness; a stage an earlier look is owed at, the one
	// lookUnwatched makes included, is claimed for its room.)
	probes := c.probes(txn)
	looked := false // this claim is the periodic look, whatever it leaves out
	if c.gate == gateAwake && !c.now.Before(c.lookedAt.Add(LookEvery)) && (len(txn) > 0 || beside || slices.ContainsFunc(c.stages, func(st *stage) bool { return st.maybeMore })) {
		c.lookAbove()
		looked = true
	}
	covers := true // the claim looks at every stage with room, and at every full one no move filled since its last claim
	var caps []Cap
	for _, st := range c.stages {
		// Fewer new rows where the stage's own moves found no room: a
		// queue at their target then drains (see yieldedCap).
		n := yieldedCap(min(c.capacity(st), st.rate.tokens(c.now)), yielded[st.cfg.Name])
		if c.heldBy(st) != nil {
			n = 0 // held by back-pressure (pressure.go)
		}
		if n <= 0 {
			if st.movedIn {
				covers = false // its room went to moves: not looked at (see lookedAt)
			}
			continue
		}
		if !st.maybeMore && !all {
			covers = false
			continue
		}
		if probes[st.cfg.Name] {
			n = 1
		}
		cp := Cap{Stage: st.cfg.Name, N: n, After: c.claimAfter(st, txn)}
		st.claiming = n
		st.movedIn = false // this claim looks after the moves made so far
		if st.cfg.Input == conf.InputMessage {
			cp.LineMax = c.cfg.LineMax
		}
		caps = append(caps, cp)
		st.rate.take(c.now, n)
	}
	limits := c.limits(txn)
	if len(caps) == 0 && !(c.checkDue && c.anyOver()) {
		return Claim{}, false
	}
	// What the core still holds once this transaction's resolve has run
	// (every owed item is in it): the claim must not take it again.
	claim := Claim{Op: c.nextOpID(), Caps: caps, Exclude: c.held(), ExcludeKeys: c.heldKeys(), Limits: limits, Holds: c.holds(), Traces: c.tracePasses, Settled: c.settled}
	c.claimGen = c.ingressGen
	c.claimLookGen = c.lookGen
	c.lastClaim = c.now
	if covers || looked {
		c.lookedAt = c.now
	}
	c.checkDue = false
	return claim, true
}

// probes names the stages a claim sent after txn only probes (a cap of one,
// whose walk still says whether more rows are pending: Claimed.More), with
// SESSIONS above 1: those claimed dry with no row known pending since, at
// which txn makes no row pending that the core could know of. The claim of
// a full transaction reserves its cap's room until its result
// (stage.claiming), and moves beside it claim only in the room left: a
// stage that moves feed is dry nearly always, and claimed for its whole
// room it would turn every move to it beside the claim into a pending row
// and a claim of its own.
func (c *Core) probes(txn []Command) map[string]bool {
	own := map[string]bool{}
	if c.sessions() == 1 || pendsOf(txn, own) {
		return nil
	}
	probes := map[string]bool{}
	for _, st := range c.stages {
		if st.dry && st.known == 0 && !st.lookOwed && !own[st.cfg.Name] {
			probes[st.cfg.Name] = true
		}
	}
	return probes
}

// lookTimer is when the core looks for work by itself beside outstanding
// transactions (see claimFor), zero for never: while awake, with only
// transactions out that claim nothing and a session free for one that does,
// and a stage with room to claim into. (With none out the core rests
// instead, and the gate's look follows.)
func (c *Core) lookTimer() time.Time {
	if c.gate != gateAwake || c.dbDown || c.shutdown > 0 || len(c.txns) == 0 || len(c.txns) >= c.sessions() || c.fullOut() ||
		c.needReset || c.sweep || c.historyDue(c.owed) {
		return time.Time{} // (no full transaction may go beside them now)
	}
	for _, st := range c.stages {
		if min(c.capacity(st), st.rate.tokens(c.now)) > 0 && c.heldBy(st) == nil {
			return c.lookedAt.Add(LookEvery)
		}
	}
	return time.Time{}
}

// resetFor is the reset the step's transaction begins with (after the
// history's upkeep), if one is due: the start-up reset or one after a lost
// claim (needReset), or the heartbeat's sweep.
func (c *Core) resetFor() (ResetOrphans, bool) {
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
		c.needReset = false
		c.sweep = false
		return ResetOrphans{Op: c.nextOpID(), Keep: keep, ReleaseKeys: !c.resetDone || c.keys.sweep, Now: c.now}, true
	}
	if c.sweep && c.shutdown == 0 {
		c.sweep = false
		return ResetOrphans{Op: c.nextOpID(), Keep: c.held(), Now: c.now}, true
	}
	return ResetOrphans{}, false
}

// wakeKeep lists the rows a wake sent after txn must leave paused: those
// handed to workers and not yet answered, and those of txn's resolve and of
// the outstanding transactions' (see Wake).
func (c *Core) wakeKeep(txn []Command) []int64 {
	keep := append(c.handed(), c.outstandingItems()...)
	for _, cmd := range txn {
		if r, ok := cmd.(Resolve); ok {
			for _, it := range r.Items {
				keep = append(keep, it.ID)
			}
		}
	}
	slices.Sort(keep)
	return slices.Compact(keep)
}

// restReady reports whether the core has nothing to do with the queue until
// something happens: nothing to write, nothing outstanding, nothing it would
// claim. Then it may declare itself waiting, RestAfter after its last claim.
func (c *Core) restReady() bool {
	return c.gate == gateAwake && c.resetDone && c.shutdown == 0 && !c.dbDown &&
		len(c.txns) == 0 && len(c.owed) == 0 && len(c.resendFlushes) == 0
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
		c.lookAt = c.now.Add(LookEvery)
		c.emit(Rest{})
	}
}

// lookUnwatched looks for work every LookEvery while no producer would
// notify the core of a row it commits: while a Rest waits for the gate, and
// while the gate cannot be taken. Taking the gate waits for every producer
// transaction that inserted while the core was busy, and one of them may stay
// open for minutes (a bulk import): the rows of every other such producer,
// committed meanwhile, did not notify, and without these looks they would
// wait for that one transaction, or for the heartbeat. Each look walks only
// above the floors (lookAbove), so its cost does not grow with the dead index
// entries that claimed rows left below them. The pause does not
// grow with the wait (it once doubled up to a second, and a producer holding
// its transaction a few hundred milliseconds then held back the others' rows
// as long).
func (c *Core) lookUnwatched() {
	if c.lookAt.IsZero() || c.now.Before(c.lookAt) {
		return
	}
	c.lookAbove()
	c.lookAt = c.now.Add(LookEvery)
}

// resting is the answer to Rest: the gate is held (or could not be taken).
func (c *Core) resting(e Resting) {
	assert(c.gate == gateAsking, "Resting without a Rest outstanding")
	if e.Err != "" {
		c.gate = gateAwake
		c.restRetry = min(max(2*c.restRetry, RestRetryMin), RestRetryMax)
		c.restRetryAt = c.now.Add(c.restRetry)
		c.lookAt = c.now.Add(LookEvery)
		c.logf(LevelWarn, "cannot take the gate to wait for notifications; looking for work every %s and asking again in %s: %s", LookEvery, c.restRetry, e.Err)
	} else {
		c.gate = gateResting
		c.lookAt = time.Time{}
		c.restRetry = 0
	}
	// The last look: every producer that did not notify has committed (or
	// the gate failed and no one notifies), so the next claim, sent after
	// this, must cover every stage.
	c.ingressGen++
	c.lookAll()
}

// restLost: the gate's connection died, so producers stopped notifying.
func (c *Core) restLost() {
	if c.gate == gateResting {
		c.gate = gateAwake
		c.logf(LevelWarn, "the gate's connection died: producers stopped notifying; looking for work")
		c.ingressGen++
		c.lookAll()
	}
}

func (c *Core) woken(e Woken) {
	c.result(e.Op, e.Err)
	if e.Err != "" {
		c.wakeDue = true
		return
	}
	// Next leaves out the rows the wake kept, so it must not hide a due time
	// the same transaction's resolve reported for one of them (see Wake).
	c.nextPaused = earliest(e.Next, c.txnPaused)
	if e.Count > 0 {
		c.lookAll()
	}
}

// earliest is the earlier of two instants, zero standing for none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

func (c *Core) orphansReset(e OrphansReset) {
	sent, _ := c.result(e.Op, e.Err)
	cmd := sent.(ResetOrphans)
	if e.Err != "" {
		c.needReset = true
		// The reset may have committed, and the keys of the rows it made
		// pending are lost with its reply: the next reset releases every key
		// with blocked messages, as at start-up.
		c.keys.sweep = true
		return
	}
	if cmd.ReleaseKeys {
		c.keys.sweep = false
		c.keys.allAt = e.Seq // (0: no id was ever taken, so no producer was in flight)
	}
	if e.Count > 0 {
		c.lookAll() // the reset made rows pending at any stage, at any id
	}
	c.takeHeads(e.Heads, e.Busy)
	c.oweRelease(e.Keys, c.now)
	if !c.resetDone {
		c.resetDone = true
		if e.Count > 0 {
			c.logf(LevelInfo, "start-up: reset %d orphaned running rows to pending", e.Count)
		}
	} else if e.Count > 0 {
		c.logf(LevelWarn, "reset %d running rows this dispatcher does not hold (taken by a claim whose result was lost, or orphaned)", e.Count)
	}
}

func (c *Core) flushed(e Flushed) {
	sent, _ := c.result(e.Op, e.Err)
	cmd := sent.(Flush)
	if e.Err != "" {
		// First again: a life's flushes must reach the database in Seq order.
		c.resendFlushes = append([]Flush{cmd}, c.resendFlushes...)
	}
}
