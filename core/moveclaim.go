// A move that claims: the resolve of a transition a stage answered ("0 >b")
// writes the row straight to running at b, and the core holds it for b as if
// a claim had returned it. One row version per hop instead of two (the
// resolve's running at a → pending at b, and the next claim's pending at b →
// running at b); docs/performance.md, "What bounds it".

package core

import (
	"cmp"
	"slices"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// claimMoves decides, as the step's transaction is built, which Move items of
// items also claim their row at their target stage (Item.Claim), and reserves
// the target's room for them until the outcomes come (stage.reserved). A move
// to stage b claims when:
//   - no shutdown is under way, and the transaction neither resets orphans
//     nor wakes paused rows (noClaims: either may make rows pending anywhere);
//   - b has no RATE: its bucket counts the claims it sends and their results
//     (see bucket), and a stage held by its rate gains nothing from a faster
//     hop, so its rows go pending and its claims take them under the rate;
//   - b is not held by back-pressure (core/pressure.go): a held stage claims
//     nothing, by a move neither;
//   - the core knows of every row pending at b (stage.dry: b's last claim
//     emptied it and since then only the core's own resolves left rows
//     pending there, stage.known of them), and b has room for the move beyond
//     those rows: capacity (what b holds, its backlog, what is reserved
//     already) less known. The same transaction's claim of b, sent after the
//     resolve with the room left, then takes every such row, in ingress_id
//     order, so no move overtakes a row the core knows is pending at b;
//   - no other item of this resolve gives a row back to b (a requeue) or may
//     leave one pending there that the core cannot count (a re-sent item
//     whose first send may have applied, a row a late commit changed), and
//     the item itself is not such an item;
//   - no outstanding transaction may make rows pending at b (pendsOut), and,
//     in a transaction with no claim after its resolve (claimless: one sent
//     beside a full one), the core knows of no row pending at b.
//
// The candidates are taken in ingress_id order, so that when b's room runs out
// the moves left pending at b are all younger than the ones claimed. Rows a
// stage moves itself (a bare 0) are known only from their outcome: such a row
// may be overtaken by the moves of one transaction.
//
// It returns, per stage that answered them, how many of the moves it decided
// on do not claim: the target, another stage without a RATE, had no room for
// them or was not known to be empty, or another item of the resolve blocked
// it. The same transaction's claim of that stage yields as many of its slots
// (see yieldedCap). Not counted: moves to a stage with a RATE or held by
// back-pressure, whose moves never claim, so yielding to them would only halve the sender for good; a
// stage's moves to itself, whose queue its own claim drains; and items this
// resolve decides nothing for (re-sent, raced, or a reset, a wake or a
// shutdown in the transaction: then it returns nil).
func (c *Core) claimMoves(items []Item, noClaims, claimless bool) (yielded map[string]int) {
	for i := range items {
		// Decided anew for each send: an item owed again (a raced one) may
		// carry the claim of its last send.
		items[i].Claim, items[i].LineMax = false, 0
		dropEmitClaims(&items[i])
	}
	if c.shutdown > 0 || noClaims {
		return nil
	}
	yielded = map[string]int{}
	var cand []int
	for i, it := range items {
		if it.Verdict == Move && c.byName[it.To] != nil && !c.unsure[it.ID] && c.races[it.ID] == 0 {
			cand = append(cand, i)
		}
	}
	slices.SortFunc(cand, func(a, b int) int { return cmp.Compare(items[a].ID, items[b].ID) })
	blocked := movesBlocked(items, c.unsure, c.races)
	if c.pendsOut(blocked) {
		blocked = nil // an outstanding transaction may make rows pending anywhere
	}
	for _, st := range c.stages {
		if claimless && st.known > 0 && blocked != nil {
			// No claim follows in the transaction to take the rows known
			// pending there first (resolveBeside).
			blocked[st.cfg.Name] = true
		}
	}
	for _, i := range cand {
		st := c.byName[items[i].To]
		if !c.mayClaimMoves(st, blocked) || c.moveRoom(st) <= 0 {
			if st.rate == nil && items[i].To != items[i].Stage && c.heldBy(st) == nil {
				yielded[items[i].Stage]++
			}
			continue
		}
		items[i].Claim = true
		if st.cfg.Input == conf.InputMessage {
			items[i].LineMax = c.cfg.LineMax
		}
		st.reserved++
		st.movedIn = true
	}
	c.claimEmits(items, blocked)
	return yielded
}

// claimEmits decides, after the moves, which emits of items' moves are
// inserted running at their stage (Emit.Claim) instead of pending: the
// child's claim made by its insert, one row version and its claim saved per
// child. A child claims on the moves' terms (see claimMoves: no shutdown,
// reset or wake in the transaction, a stage without a RATE, not held by
// back-pressure, known dry, with room beyond its known pending rows and
// what is reserved, the moves' claims first, and no other item blocking
// it), and also only when
//   - its stage has INPUT = id: an INPUT = message line is read from the
//     row, which the insert does not return;
//   - it has neither a key nor an order key: a key seen before inserts
//     nothing, and a keyed child may have to wait behind its key;
//   - its item is not sent again (unsure or raced): the first send may have
//     inserted the children already.
//
// They are decided in the order their item's children are inserted
// (emitArgs: item order, then emit order), so where a stage's room runs out
// the children left pending there are younger than the ones claimed. A
// child marked Claim that the statement finds it cannot claim (its parent's
// pass had no trace context to give it) is inserted pending and reported
// as one (Outcome.Children lists only the running ones).
func (c *Core) claimEmits(items []Item, blocked map[string]bool) {
	for i := range items {
		it := &items[i]
		if it.Verdict != Move || len(it.Emits) == 0 || c.unsure[it.ID] || c.races[it.ID] > 0 {
			continue
		}
		cloned := false
		for j, e := range it.Emits {
			st := c.byName[e.Stage]
			if st == nil || e.Key != "" || e.OrderKey != "" || st.cfg.Input != conf.InputID ||
				!c.mayClaimMoves(st, blocked) || c.moveRoom(st) <= 0 {
				continue
			}
			if !cloned {
				// Its own emits, not shared with an earlier send's command.
				it.Emits, cloned = slices.Clone(it.Emits), true
			}
			// The child's room is reserved until its resolve's result.
			it.Emits[j].Claim, st.reserved = true, st.reserved+1
			st.movedIn = true
		}
	}
}

// dropEmitClaims takes the claims off its emits (Emit.Claim), on a copy of
// them (the command that carried them keeps its own), and returns the stages
// of the emits that had one.
func dropEmitClaims(it *Item) (stages []string) {
	for j, e := range it.Emits {
		if !e.Claim {
			continue
		}
		if stages == nil {
			it.Emits = slices.Clone(it.Emits)
		}
		it.Emits[j].Claim = false
		stages = append(stages, e.Stage)
	}
	return stages
}

// yieldedCap is a stage's claim cap n (its room, within its RATE) less the
// slots it yields: one for each of its moves in the same resolve that does not
// claim (see claimMoves), but never more than half of n, rounded down.
//
// Why: in a pipeline whose stages all keep pace, each stage's room in a step
// is just what the next stage is sent, so a queue of pending rows at b, once a
// slow spawn or a late answer has left one there, never drains. Its rows are
// older than the moves, so no move claims past them, and every hop through b
// costs two row versions (pending, then claimed) for as long as the pipeline
// runs. Taking fewer new rows at a when a's moves found no room lets b's claim
// catch up within a few steps, after which the moves claim again (one row
// version per hop; docs/performance.md, "A stage yields"). At most half: a
// stage whose target is the pipeline's bottleneck still takes half its room
// each step, and a stage with room 1 still takes its row.
func yieldedCap(n, yielded int) int {
	return n - min(yielded, n/2)
}

// moveRoom is the room at stage st that moves (and emits) may claim: its
// capacity less the rows known pending there, which a claim after them
// takes first, the outstanding claim's cap, and the slot a look owed there
// keeps for the claim that looks (see lookAbove).
func (c *Core) moveRoom(st *stage) int {
	n := c.capacity(st) - st.known - st.claiming
	if st.lookOwed {
		n--
	}
	return n
}

// mayClaimMoves reports whether moves to st may claim, given the stages the
// other items of the same resolve block (see claimMoves, movesBlocked); nil
// blocks every stage (an outstanding transaction may make rows pending
// anywhere).
func (c *Core) mayClaimMoves(st *stage, blocked map[string]bool) bool {
	if st.rate != nil || !st.dry || c.heldBy(st) != nil || blocked == nil {
		return false
	}
	return !blocked[st.cfg.Name]
}

// movesBlocked names the stages to which no move of items may claim: one an
// item gives a row back to (a requeue), or one a move goes to that may leave
// its row pending there uncounted (a re-sent item whose first send may have
// applied, a row a late commit changed). One pass, so that a resolve of n
// items costs n, not n² (a stage of PARALLELISM 16 and QUEUE_LIMIT 1000 sends
// resolves of thousands).
//
// A keyed message's move claims like any other: the statement claims it only
// if no older message of its key is unfinished (an operator may have retried
// one), and otherwise leaves it pending, for the release the next transaction
// carries (keyOutcome) to put behind the older one; a younger
// move may then claim past it, as a claim walks past a message waiting
// behind its key (docs/protocol.md, "Ordering per key").
func movesBlocked(items []Item, unsure map[int64]bool, races map[int64]int) map[string]bool {
	blocked := map[string]bool{}
	for _, it := range items {
		switch {
		case it.Verdict == Requeue:
			blocked[it.Stage] = true
		case it.Verdict == Move && (unsure[it.ID] || races[it.ID] > 0):
			blocked[it.To] = true
		}
	}
	return blocked
}

// unclaimMoves is for a resolve whose transaction failed: its items are owed
// again without their claims (the next transaction decides anew), and the room
// reserved for them is given back. claimed reports whether any item claimed.
func (c *Core) unclaimMoves(sent []Item) (items []Item, claimed bool) {
	items = slices.Clone(sent)
	for i := range items {
		if items[i].Claim {
			c.byName[items[i].To].reserved--
			items[i].Claim, items[i].LineMax = false, 0
			claimed = true
		}
		for _, stage := range dropEmitClaims(&items[i]) {
			c.byName[stage].reserved--
			claimed = true // its children may be running, held by no one
		}
	}
	return items, claimed
}

// movedClaimed takes in a row its resolve moved and claimed (Outcome running at
// the item's To, Matched): the core holds it for To exactly as if a Claim had
// returned it (claimedByResolve).
func (c *Core) movedClaimed(it Item, o Outcome) {
	c.claimedByResolve(c.byName[it.To], Row{ID: o.ID, Stage: it.To, Attempts: o.Attempts, Key: it.Key, Message: o.Message, Trace: o.Trace})
}

// claimedByResolve takes in row r that a resolve wrote running at st (a move
// that claims, an emit that claims): the core holds it there as if a Claim
// had returned it. During a shutdown it is given back at once; at an INPUT =
// message stage a message over the line limit fails instead. Its epoch is
// the last claim's: the crash sentinel that still holds it then has not lost
// a commit since this write either, and one that does not makes a bare 0 run
// again rather than fail (see Answered).
func (c *Core) claimedByResolve(st *stage, r Row) {
	if c.shutdown > 0 {
		c.requeue(st, []msg{{id: r.ID}})
		return
	}
	var line string
	if st.cfg.Input == conf.InputMessage {
		var why string
		if line, why = MessageLine(r, c.cfg.LineMax); why != "" {
			c.owe(Item{ID: r.ID, Stage: st.cfg.Name, Verdict: Fail, Reason: why})
			return
		}
	}
	st.backlog = append(st.backlog, c.hold(r.ID, c.epoch, r.Attempts, r.Trace, line))
}
