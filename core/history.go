// History: what the core records of each pass in pepsi.history (the event of
// each Item, with when its line was handed out, when its answer was read, the
// worker's pid and the message's attempts) and the upkeep of the table's
// daily partitions (KeepHistory).

package core

import (
	"fmt"
	"time"
)

// The events of pepsi.history (docs/operations.md, "History"). A pass's
// outcome is one of the first ten; woken, reset and retried are transitions
// without a pass, and so is the failed an operator's discard records
// (pepsi-queue discard: no worker, no handed_at).
const (
	HistoryMoved     = "moved"    // detail: the target stage
	HistoryDone      = "done"     // the stage answered 0 >done
	HistoryPaused    = "paused"   // the stage answered 0 >paused:SECONDS
	HistoryRetry     = "retry"    // detail: the reason of its 75 answer
	HistoryFailed    = "failed"   // detail: the reason
	HistoryTimeout   = "timeout"  // detail: the reason
	HistoryCrashed   = "crashed"  // its worker died or broke the protocol; detail: the reason
	HistoryRequeued  = "requeued" // it waited behind a crash, a kill or a shutdown
	HistoryGuardMiss = "guard-miss"
	HistoryAnswered  = "answered" // a bare 0; detail: what the row had become
	HistoryWoken     = "woken"
	HistoryReset     = "reset"
	HistoryRetried   = "retried" // by an operator (pepsi-queue retry)
)

// History partitions: the table is partitioned by day (UTC) on its at column.
const (
	// HistoryAhead is how far past now the partitions are made: a row the
	// dispatcher writes always finds its day made, even if the next upkeep
	// comes late.
	HistoryAhead = 3 * 24 * time.Hour
	// HistoryMargin: once now is this close to the end of the days made, the
	// next transaction makes more before it writes any row.
	HistoryMargin = 24 * time.Hour
	// HistoryUpkeepEvery is how often the core sends KeepHistory anyway, to
	// drop the partitions HistoryKeep no longer keeps.
	HistoryUpkeepEvery = time.Hour
)

// KeepHistory makes pepsi.history's daily partitions (UTC days) cover From to
// Through, and drops every partition wholly before DropBefore. It is sent
// first in a transaction, before any command that writes history rows, at
// start-up, every HistoryUpkeepEvery, and whenever the days made end within
// HistoryMargin of now or the transaction may write a row older than the
// days made: so no row the core writes ever lands nowhere, even after the
// dispatcher was down for days. Making a day up to Now may wait for locks;
// making the days after Now and dropping old ones never waits (a partition
// whose lock is held is left for the next upkeep). Answered by HistoryKept.
type KeepHistory struct {
	Op         int64
	From       time.Time
	Now        time.Time
	Through    time.Time
	DropBefore time.Time
}

// HistoryKept is the result of a KeepHistory: the days made, contiguous, end
// at Through (exclusive), at least the end of Now's day.
type HistoryKept struct {
	Op      int64
	Through time.Time
	Err     string
}

func (KeepHistory) isCommand()         {}
func (c KeepHistory) queueOp() int64   { return c.Op }
func (HistoryKept) isEvent()           {}
func (e HistoryKept) queueErr() string { return e.Err }
func (c KeepHistory) String() string {
	return fmt.Sprintf("keep-history op=%d from=%s now=%s through=%s drop-before=%s",
		c.Op, formatTime(c.From), formatTime(c.Now), formatTime(c.Through), formatTime(c.DropBefore))
}
func (e HistoryKept) String() string {
	if e.Err != "" {
		return fmt.Sprintf("history-kept op=%d err=%q", e.Op, e.Err)
	}
	return fmt.Sprintf("history-kept op=%d through=%s", e.Op, formatTime(e.Through))
}

// pass is what the core knows of a held message's pass, for its history row:
// when its line was handed out (zero while not yet), the worker's pid, and
// the row's attempts as claimed.
type pass struct {
	handedAt time.Time
	pid      int
	attempts int
}

// history is the core's side of pepsi.history.
type history struct {
	// passes: the held messages' passes, by id, from their claim until their
	// item is owed.
	passes map[int64]pass
	// through: the end of the days made (HistoryKept.Through); zero before
	// the first upkeep. from: the From of the last upkeep sent. next: when
	// the next upkeep is due anyway.
	through, from, next time.Time
}

// hold is a message the core now holds, claimed (or moved and claimed) in
// the claim of crash-sentinel epoch with the attempts and trace context that
// claim read, and its line (INPUT = message; "" for none or not yet built):
// its pass begins (holdPass), and its trace is kept while the core reports
// passes (TracePasses).
func (c *Core) hold(id int64, epoch string, attempts int, t Trace, line string) msg {
	c.holdPass(id, attempts)
	m := msg{id: id, epoch: epoch, attempts: attempts, line: line}
	if c.tracePasses {
		m.trace, m.claimed = t, c.now
	}
	return m
}

// holdPass notes a message the core now holds (claimed, or moved and
// claimed), with the attempts its claim read.
func (c *Core) holdPass(id int64, attempts int) {
	c.hist.passes[id] = pass{attempts: attempts}
}

// handPass notes that a held message's line was handed to worker w now.
func (c *Core) handPass(id int64, w *worker) {
	p := c.hist.passes[id]
	p.handedAt, p.pid = c.now, w.pid
	c.hist.passes[id] = p
}

// recordPass fills in an item's history the first time it is owed: its
// event, when its answer was read (now), and what the core knows of its pass.
// An item owed again keeps what it had.
func (c *Core) recordPass(it *Item) {
	if !it.At.IsZero() {
		return
	}
	it.At = c.now
	if st := c.byName[it.Stage]; st != nil {
		it.History = !st.cfg.HistoryOff
	}
	if p, ok := c.hist.passes[it.ID]; ok {
		it.HandedAt, it.PID, it.Attempts = p.handedAt, p.pid, p.attempts
		delete(c.hist.passes, it.ID)
	}
	if it.Event == "" {
		it.Event = verdictEvent(*it)
	}
}

// verdictEvent is the history event of an item's verdict when its guard
// holds (the statement makes an item that misses its guard a guard-miss,
// and a bare 0 that left the row running a failure).
func verdictEvent(it Item) string {
	switch it.Verdict {
	case Requeue:
		return HistoryRequeued
	case Fail:
		return HistoryFailed
	case TimeOut:
		return HistoryTimeout
	case Retry:
		return HistoryRetry
	case Answered:
		return HistoryAnswered
	case Move:
		switch it.To {
		case TargetDone:
			return HistoryDone
		case TargetPaused:
			return HistoryPaused
		}
		return HistoryMoved
	}
	panic(fmt.Sprintf("core: item %v has no verdict", it))
}

// historyKeep is HISTORY_KEEP, its default when unset.
func (c *Core) historyKeep() time.Duration {
	if c.cfg.HistoryKeep > 0 {
		return c.cfg.HistoryKeep
	}
	return 24 * 7 * time.Hour
}

// keepHistory returns the upkeep the next transaction must begin with, if
// any: items is what it resolves.
func (c *Core) keepHistory(items []Item) (KeepHistory, bool) {
	if !c.historyDue(items) {
		return KeepHistory{}, false
	}
	from := earliestAt(c.now, items)
	drop := c.now.Add(-c.historyKeep())
	if from.Before(drop) {
		drop = from
	}
	c.hist.from = from
	c.hist.next = c.now.Add(HistoryUpkeepEvery)
	return KeepHistory{Op: c.nextOpID(), From: from, Now: c.now, Through: c.now.Add(HistoryAhead), DropBefore: drop}, true
}

// historyDue reports whether a transaction that resolves items must begin
// with the history's upkeep.
func (c *Core) historyDue(items []Item) bool {
	return c.hist.through.IsZero() || !c.now.Before(c.hist.next) ||
		!c.now.Add(HistoryMargin).Before(c.hist.through) || earliestAt(c.now, items).Before(c.hist.from)
}

// earliestAt is the earliest of now and the items' instants.
func earliestAt(now time.Time, items []Item) time.Time {
	from := now
	for _, it := range items {
		if !it.At.IsZero() && it.At.Before(from) {
			from = it.At
		}
	}
	return from
}

// historyKept takes an upkeep's result. A failed one leaves the days made as
// the core knew them, and is due again at once.
func (c *Core) historyKept(e HistoryKept) {
	c.result(e.Op, e.Err)
	if e.Err != "" {
		c.hist.next = time.Time{}
		c.hist.from = time.Time{}
		return
	}
	c.hist.through = e.Through
}
