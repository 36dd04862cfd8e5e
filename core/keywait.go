// A pass whose emits wait for a producer: the item is held back, not the
// pipeline (docs/protocol.md, "Emitting messages").

package core

import (
	"slices"
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// keyWaits are the owed items whose last resolve found an order key of
// their emits locked by a producer's open transaction (Outcome.KeyBusy).
// Inserting such a child waits for that producer's commit; the dispatcher's
// transactions are serial, so waiting in the statement would hold every
// stage and every key behind one producer. So the store writes nothing of
// such an item, and the core sends it again LookEvery later, in the next
// transaction from then, until the lock is free. Its row stays running,
// the core's, meanwhile; its worker went on to its next messages.
type keyWaits struct {
	// after: owed items not to be sent before this instant.
	after map[int64]time.Time
	// since: when each item's emits first found their key locked, for the
	// log line said once per wait.
	since map[int64]time.Time
	// shutdownSaid: a shutdown's wait for them was logged.
	shutdownSaid bool
}

// keyBusy owes item it again, LookEvery from now, its first send's
// uncertainty kept (unsure: the item was sent again after a lost reply,
// and this send wrote nothing either). During a shutdown it is not owed
// again: the producer may hold its transaction open for as long as it
// likes, and the shutdown would wait for it (finish waits for every owed
// item). Its pass is given up instead, as a pass whose worker was stopped
// unanswered is: the item is owed as a Requeue, which makes its row pending
// at its stage (nothing of the pass was written, no child), and the next
// start-up runs the pass again, emits and all.
func (c *Core) keyBusy(it Item, unsure bool) {
	if unsure {
		c.unsure[it.ID] = true
	}
	if c.shutdown > 0 {
		delete(c.keyWaits.since, it.ID)
		delete(c.keyWaits.after, it.ID)
		c.logf(LevelWarn, "message %d: stage %s emitted a child with order key %s, whose lock a producer's open transaction holds; shutting down, its pass is requeued (run again at the next start)",
			it.ID, it.Stage, emitKeys(it))
		c.owe(Item{ID: it.ID, Stage: it.Stage, Verdict: Requeue, Key: it.Key,
			History: it.History, HandedAt: it.HandedAt, At: it.At, PID: it.PID, Attempts: it.Attempts, Event: HistoryRequeued})
		return
	}
	if _, waiting := c.keyWaits.since[it.ID]; !waiting {
		c.keyWaits.since[it.ID] = c.now
		c.logf(LevelWarn, "message %d: stage %s emitted a child with order key %s, whose lock a producer's open transaction holds; its pass is written once that transaction ends (other messages go on)",
			it.ID, it.Stage, emitKeys(it))
	}
	c.keyWaits.after[it.ID] = c.now.Add(LookEvery)
	c.owe(it)
}

// keyWaitEnded forgets a wait of item id once a resolve wrote or settled it.
func (c *Core) keyWaitEnded(id int64) {
	if since, ok := c.keyWaits.since[id]; ok {
		delete(c.keyWaits.since, id)
		if d := c.now.Sub(since); d >= time.Second {
			c.logf(LevelInfo, "message %d: its pass is written after waiting %s for a producer's order-key lock", id, d.Round(time.Millisecond))
		}
	}
}

// owedNow splits the owed items into those that may be sent now and those
// that wait for a producer's order-key lock (keyWaits), each in owed order.
func (c *Core) owedNow() (now, waiting []Item) {
	if len(c.keyWaits.after) == 0 {
		return c.owed, nil
	}
	for _, it := range c.owed {
		if after, ok := c.keyWaits.after[it.ID]; ok && c.now.Before(after) {
			waiting = append(waiting, it)
			continue
		}
		delete(c.keyWaits.after, it.ID)
		now = append(now, it)
	}
	return now, waiting
}

// keyWaitNext is when the first waiting item may be sent again (zero for
// none).
func (c *Core) keyWaitNext() time.Time {
	var next time.Time
	for _, after := range c.keyWaits.after {
		next = earliest(next, after)
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

// sayShutdownWaitsForKeys logs, once, that a shutdown waits for passes
// whose children wait for producers' order-key locks: it lasts as long as
// those producers' transactions, which the dispatcher cannot end.
func (c *Core) sayShutdownWaitsForKeys() {
	if len(c.keyWaits.since) == 0 || c.keyWaits.shutdownSaid {
		return
	}
	c.keyWaits.shutdownSaid = true
	c.logf(LevelWarn, "shutting down: waiting for %d passes whose emitted children wait for a producer's open transaction (their order keys' locks); signal again to exit now (the next start-up runs those messages again)",
		len(c.keyWaits.since))
}
