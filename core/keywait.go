// A pass whose emits wait for a producer: the item is held back, not the
// pipeline (docs/protocol.md, "Emitting messages").

package core

import (
	"slices"
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// KeyWaitMax bounds the pause between two tries of a pass whose emits wait
// for a producer's order-key lock: the first try again comes LookEvery
// after the first refusal, each later one twice as long after the last,
// up to KeyWaitMax. Each try sends the pass again with its emits, in the
// dispatcher's one serial transaction: retried every LookEvery, a thousand
// such passes behind one producer made every transaction carry hundreds of
// them and the pipeline ten to twenty-five times slower.
const KeyWaitMax = time.Second

// keyQueueAfter is how many refusals in a row make a waiting pass one whose
// next try queues for its locks (Resolve.QueueKeys): its pauses have grown
// to KeyWaitMax by then (10 ms, doubled, past 640 ms).
const keyQueueAfter = 7

// keyWaits are the owed items whose last resolve found an order key of
// their emits locked by a producer's open transaction (Outcome.KeyBusy).
// Inserting such a child waits for that producer's commit; the dispatcher's
// transactions are serial, so waiting in the statement would hold every
// stage and every key behind one producer. So the store writes nothing of
// such an item, and the core sends it again later (KeyWaitMax), until the
// lock is free. Its row stays running, the core's, meanwhile; its worker
// went on to its next messages.
type keyWaits struct {
	// after: owed items not to be sent before this instant.
	after map[int64]time.Time
	// busyAt and tries: when each waiting item's last resolve found its keys
	// locked, and how many resolves in a row did.
	busyAt map[int64]time.Time
	tries  map[int64]int
	// saidAt: when each stage's waits were last logged (once a minute).
	saidAt map[string]time.Time
	// first: the items of the resolve being taken in that are owed again
	// ahead of the others (oweFirst).
	first []Item
	// queuedAt: when the last try that queues for its locks was sent
	// (queuedTry): one a KeyWaitMax at most, as each may hold the pipeline
	// for the store's short lock wait.
	queuedAt time.Time
}

func newKeyWaits() keyWaits {
	return keyWaits{after: map[int64]time.Time{}, busyAt: map[int64]time.Time{}, tries: map[int64]int{}, saidAt: map[string]time.Time{}}
}

// keyBusy owes item it again, its first send's uncertainty kept (unsure:
// the item was sent again after a lost reply, and this send wrote nothing
// either), LookEvery after this refusal, or twice the last pause, up to
// KeyWaitMax. During a shutdown it is not owed again: the producer may
// hold its transaction open for as long as it likes, and the shutdown
// would wait for it (finish waits for every owed item). Its pass is given
// up instead, as a pass whose worker was stopped unanswered is: the item is
// owed as a Requeue, which makes its row pending at its stage (nothing of
// the pass was written, no child), and the next start-up runs the pass
// again, emits and all.
func (c *Core) keyBusy(it Item, unsure bool) {
	if unsure {
		c.unsure[it.ID] = true
	}
	if c.shutdown > 0 {
		c.keyWaitEnded(it.ID)
		c.logf(LevelWarn, "message %d: stage %s emitted a child with order key %s, whose lock a producer's open transaction holds; shutting down, its pass is requeued (run again at the next start)",
			it.ID, it.Stage, emitKeys(it))
		c.owe(Item{ID: it.ID, Stage: it.Stage, Verdict: Requeue, Key: it.Key,
			History: it.History, HandedAt: it.HandedAt, At: it.At, PID: it.PID, Attempts: it.Attempts, Event: HistoryRequeued})
		return
	}
	w := &c.keyWaits
	n := w.tries[it.ID] + 1
	w.tries[it.ID], w.busyAt[it.ID] = n, c.now
	w.after[it.ID] = c.now.Add(min(LookEvery<<min(n-1, 16), KeyWaitMax))
	c.oweFirst(it)
	if said, ok := w.saidAt[it.Stage]; !ok || c.now.Sub(said) >= time.Minute {
		w.saidAt[it.Stage] = c.now
		c.logf(LevelWarn, "stage %s: message %d emitted a child with order key %s, whose lock a producer's open transaction holds; its pass is written once that transaction ends, tried again at least once every %s (other messages go on); %d passes of the stage wait so (said once a minute)",
			it.Stage, it.ID, emitKeys(it), KeyWaitMax, c.keyWaitsAt(it.Stage))
	}
}

// oweFirst owes item it again ahead of the items owed before this
// resolve's result (resolved moves them behind, keyWaits.first, in item
// order): a pass answered while the resolve was out, with a child of the
// same order key, is a later pass and must not go first (owedNow holds it
// behind it).
func (c *Core) oweFirst(it Item) {
	c.recordPass(&it)
	if it.Key == "" {
		it.Key = c.keys.keyOf[it.ID]
	}
	c.keyWaits.first = append(c.keyWaits.first, it)
}

// owedFirst puts the items oweFirst owed ahead of the other owed items.
func (c *Core) owedFirst() {
	if len(c.keyWaits.first) > 0 {
		c.owed = append(c.keyWaits.first, c.owed...)
		c.keyWaits.first = nil
	}
}

// keyWaitsAt counts the owed items of stage that wait for a producer's
// order-key lock.
func (c *Core) keyWaitsAt(stage string) int {
	n := 0
	for _, it := range slices.Concat(c.keyWaits.first, c.owed) {
		if _, ok := c.keyWaits.tries[it.ID]; ok && it.Stage == stage {
			n++
		}
	}
	return n
}

// keyWaitEnded forgets a wait of item id once a resolve wrote or settled it.
// A lock it waited for may be free now (that producer's transaction ended),
// and so may those the other waiting items wait for, often the same: each
// is sent again once LookEvery has passed since its last refusal, not after
// its whole pause.
func (c *Core) keyWaitEnded(id int64) {
	w := &c.keyWaits
	if _, ok := w.tries[id]; !ok {
		return
	}
	delete(w.tries, id)
	delete(w.busyAt, id)
	delete(w.after, id)
	for other, at := range w.busyAt {
		w.after[other] = at.Add(LookEvery)
	}
}

// owedNow splits the owed items into those that may be sent now and those
// that wait for a producer's order-key lock (keyWaits), each in owed order.
// An item whose emits carry an order key of an earlier item that waits so
// waits with it, and goes after it: its children would otherwise be
// inserted before the earlier pass's, and go first in their key.
func (c *Core) owedNow() (now, waiting []Item) {
	if len(c.keyWaits.after) == 0 {
		return c.owed, nil
	}
	held := map[string]bool{}
	for _, it := range c.owed {
		after, ok := c.keyWaits.after[it.ID]
		if ok && c.now.Before(after) || emitsInto(it, held) {
			waiting = append(waiting, it)
			for _, e := range it.Emits {
				if e.OrderKey != "" {
					held[e.OrderKey] = true
				}
			}
			continue
		}
		now = append(now, it)
	}
	return now, waiting
}

// emitsInto reports whether an emit of it carries an order key in keys.
func emitsInto(it Item, keys map[string]bool) bool {
	for _, e := range it.Emits {
		if keys[e.OrderKey] {
			return true
		}
	}
	return false
}

// keysDueAt is when the core next owes the queue something for ordering per
// key: a release of keys a producer held, or a try of a pass that waits for
// a producer's order-key lock (zero for none).
func (c *Core) keysDueAt() time.Time {
	var next time.Time
	if len(c.keys.owed) > 0 {
		next = c.keys.owedAt
	}
	// Only the pauses still to run: an item whose pause is over is sent in
	// this step, or waits behind an earlier item of its keys (owedNow) whose
	// pause is still to run; a time already past would set the timer to
	// now for good, and nothing would wake the core again (seed 1507117).
	for _, it := range c.owed {
		if after, ok := c.keyWaits.after[it.ID]; ok && after.After(c.now) {
			next = earliest(next, after)
		}
	}
	return next
}

// emitKeys is the distinct order keys of its emits, quoted, for a log line.
func emitKeys(it Item) string {
	var keys []string
	for _, e := range it.Emits {
		if e.OrderKey != "" {
			keys = append(keys, conf.Quote(clip(e.OrderKey, 100)))
		}
	}
	slices.Sort(keys)
	return strings.Join(slices.Compact(keys), " or ")
}

// queuedTry takes out of the owed items, when one is due that waited
// keyQueueAfter refusals and no try that queues was sent within
// KeyWaitMax, that item and every owed item whose emits carry one of its
// order keys (in owed order: a key's children keep the order of the
// passes), for a Resolve of their own that queues for their locks
// (Resolve.QueueKeys). None of them claims.
func (c *Core) queuedTry() (Resolve, bool) {
	w := &c.keyWaits
	if !w.queuedAt.IsZero() && c.now.Before(w.queuedAt.Add(KeyWaitMax)) {
		return Resolve{}, false
	}
	keys := map[string]bool{}
	for _, it := range c.owed {
		if after, ok := w.after[it.ID]; ok && !c.now.Before(after) && w.tries[it.ID] >= keyQueueAfter {
			for _, e := range it.Emits {
				if e.OrderKey != "" {
					keys[e.OrderKey] = true
				}
			}
			break
		}
	}
	if len(keys) == 0 {
		return Resolve{}, false
	}
	var items, rest []Item
	for _, it := range c.owed {
		if emitsInto(it, keys) {
			items = append(items, it)
		} else {
			rest = append(rest, it)
		}
	}
	c.owed, w.queuedAt = rest, c.now
	c.claimMoves(items, true, true)
	return Resolve{Op: c.nextOpID(), Items: items, Traces: c.tracePasses, QueueKeys: true}, true
}

// sendQueuedTry sends queuedTry's Resolve, if one is due, as a transaction
// of its own, and reports whether it did.
func (c *Core) sendQueuedTry() bool {
	r, ok := c.queuedTry()
	if ok {
		c.emit(r)
		c.txns = append(c.txns, &txnOut{cmds: []Command{r}})
	}
	return ok
}

// releaseAfterQueuedTry owes, after a Resolve with QueueKeys (which goes
// alone, without the Release its moves would have had in their
// transaction: releaseFor), a release of the key of each keyed message it
// wrote, at once. A message whose move left it its key's head only finds
// it so; one whose pass ended its turn hands its key on.
func (c *Core) releaseAfterQueuedTry(cmd Resolve, outcomes []Outcome) {
	if !cmd.QueueKeys {
		return
	}
	var keys []string
	for i, it := range cmd.Items {
		if it.Key != "" && !outcomes[i].KeyBusy {
			keys = append(keys, it.Key)
		}
	}
	c.oweRelease(keys, c.now)
}
