// Ordering per key: which messages of a key the core holds, what it excludes
// from claims, and when it releases a key (docs/protocol.md, "Ordering per key").

package core

import (
	"slices"
	"time"
)

// orderKeys is the core's part of ordering per key. The queue keeps every
// message of a key blocked but its head (the oldest unfinished one); the core
// decides the rest:
//   - at most one message of a key is held at any moment: a claim never takes a
//     message of a key the core holds (Claim.ExcludeKeys), and a claimed row of a
//     key already held (only a writer outside the rules can make two of a key
//     pending) is requeued at once, unhanded;
//   - after a pass that may end a keyed message's turn (it failed, timed
//     out, moved to done, or its stage wrote its own transition) the core
//     releases its key in the transaction that resolves the pass (Release),
//     which hands the key to its oldest unfinished message; after any other
//     pass only if an older message of the key is unfinished (an operator
//     retried it meanwhile): asked by the release (Release.Behind), or, for a
//     move that claims, by its resolve, whose outcome then owes the key a
//     release in the next transaction (keyOutcome). So a message that moves
//     on keeps its key without a release, and its move may claim at its
//     target;
//   - a key whose lock a producer held is released again every LookEvery until
//     it is taken, so a key's next message never waits for the heartbeat;
//   - the keys of the running rows a reset makes pending are released (an
//     orphan may have held its key while an operator retried an older
//     message of it); at start-up, and after a reset whose reply was lost,
//     every key with blocked messages is (ResetOrphans.ReleaseKeys), and once
//     more when every producer then in flight has ended (Release.All): one of
//     them may have inserted a row blocked behind a message that finished
//     while the earlier dispatcher was dying, unseen by the first release.
type orderKeys struct {
	// keyOf: the order key of each held keyed message, from its claim until its
	// resolve's result (a message not in it has no key).
	keyOf map[int64]string
	// holder: the held message of each key in keyOf (keyOf inverted).
	holder map[string]int64
	// owed: keys to release that were busy (a producer held their lock), or
	// whose release's transaction failed; due again at owedAt.
	owed   map[string]bool
	owedAt time.Time
	// sweep: the next reset releases every key with blocked messages
	// (ResetOrphans.ReleaseKeys), because a reset's reply, and with it the
	// keys of the rows it made pending, was lost.
	sweep bool
	// allAt: once ingress has settled up to this id, every key with blocked
	// messages is released once more (Release.All; see OrphansReset.Seq);
	// all: that release is owed now.
	allAt int64
	all   bool
}

// holdKey records that the core now holds message id of key (none: "").
// It reports false, recording nothing, when another held message holds key.
func (c *Core) holdKey(id int64, key string) (other int64, ok bool) {
	if key == "" {
		return 0, true
	}
	if h, held := c.keys.holder[key]; held && h != id {
		return h, false
	}
	c.keys.keyOf[id] = key
	c.keys.holder[key] = id
	return 0, true
}

// heldKeys lists the keys of the messages the core holds (c.held()), sorted.
func (c *Core) heldKeys() []string {
	var keys []string
	for _, id := range c.held() {
		if k := c.keys.keyOf[id]; k != "" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// releaseFor is the Release the step's transaction carries, if any: the keys of
// the items whose passes may have ended their messages' turns (endsTurn), the
// keys of the other keyed items but moves that claim if an older message of
// theirs is unfinished (Release.Behind), and the owed keys (with any
// transaction, or on their own once due). A move that claims needs no Behind:
// its resolve claims only where no older message of its key is unfinished,
// and one that finds one owes its key a release (keyOutcome). Asking anyway
// cost every keyed hop a look-up of its row, 2–3 µs of the backend's time
// (docs/performance.md, "Ordering per key").
func (c *Core) releaseFor(items []Item, others bool) (Release, bool) {
	var keys []string
	var behind []KeyAt
	for _, it := range items {
		switch {
		case it.Key == "":
		case endsTurn(it):
			keys = append(keys, it.Key)
		case !it.Claim:
			behind = append(behind, KeyAt{Key: it.Key, ID: it.ID})
		}
	}
	if len(c.keys.owed) > 0 && (others || len(keys)+len(behind) > 0 || !c.now.Before(c.keys.owedAt)) {
		for k := range c.keys.owed {
			keys = append(keys, k)
		}
		clear(c.keys.owed)
	}
	if c.keys.allAt > 0 && c.settled >= c.keys.allAt {
		c.keys.all, c.keys.allAt = true, 0
	}
	if len(keys)+len(behind) == 0 && !c.keys.all {
		return Release{}, false
	}
	slices.Sort(keys)
	all := c.keys.all
	c.keys.all = false
	return Release{Op: c.nextOpID(), Keys: slices.Compact(keys), Behind: behind, All: all}, true
}

// endsTurn reports whether item it may end its message's turn of its key: a
// failure, a timeout, a move to done, or a bare 0 (the stage wrote its own
// transition, which may have finished the row). Any other verdict leaves the
// message unfinished, its key's oldest: its key needs no release unless an
// operator made an older message unfinished again (Release.Behind, or a move
// that was to claim and did not), or its resolve finds the row finished after
// all (see keyOutcome).
func endsTurn(it Item) bool {
	switch it.Verdict {
	case Fail, TimeOut, Answered:
		return true
	case Move:
		return it.To == TargetDone
	}
	return false
}

// keyOutcome takes the outcome of a keyed item whose key its transaction did
// not release (see endsTurn): a row another writer finished while the item
// was decided (a stage's late commit, a guard miss), or that vanished, owes
// its key a release, now. So does a move that was to claim and left its row
// otherwise: it found an older message of its key unfinished (an operator
// retried one), which may wait blocked for the key (releaseFor asks no
// Behind for a move that claims: nearly every keyed move claims, and its
// resolve has asked already).
func (c *Core) keyOutcome(it Item, o Outcome) {
	if it.Key == "" || endsTurn(it) {
		return
	}
	switch o.Status {
	case StatusRunning:
		return
	case StatusPending, StatusPaused:
		if !it.Claim {
			return
		}
	}
	c.oweRelease([]string{it.Key}, c.now)
}

// released takes a Release's result: a pending head is claimed like any
// pending row of its stage (it may sit below the stage's floor), a paused
// head's due time is woken at; a busy key is released again after LookEvery.
func (c *Core) released(e Released) {
	sent, _ := c.result(e.Op, e.Err)
	cmd := sent.(Release)
	if e.Err != "" {
		// Applied or not, releasing again is harmless: owe every key again.
		c.oweRelease(cmd.Named(), c.now.Add(LookEvery))
		c.keys.all = c.keys.all || cmd.All
		return
	}
	c.takeHeads(e.Heads, e.Busy)
}

// takeHeads takes the heads and busy keys of a release (a Release's, or the
// start-up reset's).
func (c *Core) takeHeads(heads []Head, busy []string) {
	for _, h := range heads {
		switch h.Status {
		case StatusPending:
			if st := c.byName[h.Stage]; st != nil {
				st.headAt = minHead(st.headAt, h.ID)
				c.headPending(st)
			}
		case StatusPaused:
			c.nextPaused = earliest(c.nextPaused, h.Timeout)
		}
	}
	c.oweRelease(busy, c.now.Add(LookEvery))
}

// headPending makes a stage claim again, from below its new head st.headAt
// (see stage.headAt). Released calls it, and Claimed once more: the claim of
// the same transaction ran after the release but may have looked above the
// head, and its result must not end the look.
func (c *Core) headPending(st *stage) {
	if st.headAt == 0 {
		return
	}
	st.maybeMore = true
	st.dry = false
	st.floor = min(st.floor, st.headAt-1)
	if _, out := c.claimOut(); !out {
		st.headAt = 0
	}
}

// minHead is the lower of two head ids, zero standing for none.
func minHead(a, b int64) int64 {
	if a == 0 || b < a {
		return b
	}
	return a
}

// oweRelease owes keys a release, due at due: LookEvery from now for a key a
// producer held (its lock is not free before that producer commits), now for
// keys nothing held back. The owed keys go in one release, at the earliest
// of their due times: a key owed now is not put off by a busy one owed
// later (releasing a busy key early only finds it busy again).
func (c *Core) oweRelease(keys []string, due time.Time) {
	if len(keys) == 0 {
		return
	}
	if len(c.keys.owed) == 0 || due.Before(c.keys.owedAt) {
		c.keys.owedAt = due
	}
	for _, k := range keys {
		c.keys.owed[k] = true
	}
}

// forgetKeys drops the keys of the resolved items that the core no longer
// holds (not those owed again, nor those a move claimed).
func (c *Core) forgetKeys(items []Item) {
	held := c.held()
	for _, it := range items {
		if _, still := slices.BinarySearch(held, it.ID); it.Key == "" || still {
			continue
		}
		delete(c.keys.keyOf, it.ID)
		if c.keys.holder[it.Key] == it.ID {
			delete(c.keys.holder, it.Key)
		}
	}
}
