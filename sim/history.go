package sim

// The checker's part of pepsi.history: the rules that hold each pass's item
// to what the world saw, and the fake queue's history to one row per pass.

import (
	"fmt"

	"github.com/pepsi-pipeline/pepsi/core"
)

var ruleHistoryItem = &rule{name: "history-item", when: atCommand, check: (*world).historyItem,
	doc: "A resolve item carries its pass's history exactly when its stage's HISTORY is on, with the event the world saw: the verdict's " +
		"(requeued, failed, timeout, retry, answered, moved, done or paused), crashed for the head of a worker that crashed, broke the protocol " +
		"or failed to start too often; its answer read at or before now, and handed out at or before that. The event is derived here from " +
		"the ledger's expectation (historyEventOf), not by the core's function."}

var ruleHistoryOnce = &rule{name: "history-once", when: atEnd, check: (*world).historyOnce,
	doc: "The fake queue's history, kept as PostgreSQL keeps it (a row only in a transaction that committed, none for one that failed " +
		"before or was rolled back), records each pass at most once (no two rows of one message, stage and answer instant: an item sent again " +
		"after a lost reply records nothing its first send recorded), and none for a stage with HISTORY = off. " +
		"(A row that finds no day's partition is a panic of the fake, so rule world-consistent.)"}

// historyEventOf is the history event of a pass the world expects resolved
// as ex.
func historyEventOf(ex *expect) string {
	switch ex.verdict {
	case core.Requeue:
		return core.HistoryRequeued
	case core.Fail:
		if ex.crash {
			return core.HistoryCrashed
		}
		return core.HistoryFailed
	case core.TimeOut:
		return core.HistoryTimeout
	case core.Retry:
		return core.HistoryRetry
	case core.Answered:
		return core.HistoryAnswered
	case core.Move:
		switch ex.move.To {
		case core.TargetDone:
			return core.HistoryDone
		case core.TargetPaused:
			return core.HistoryPaused
		}
		return core.HistoryMoved
	}
	return fmt.Sprintf("(no event for verdict %s)", ex.verdict)
}

// historyOn reports whether stage keeps history (HISTORY on).
func (w *world) historyOn(stage string) bool {
	st, ok := w.cfg.Stage(stage)
	return ok && !st.HistoryOff
}

func (w *world) historyItem(r *rule, x crossing) {
	w.expected(x.cmd, func(it core.Item, ex *expect) {
		on := w.historyOn(ex.stage)
		switch {
		case it.History != on:
			w.broke(r, "resolve item %s: history %v, want %v (stage %s HISTORY on: %v)", it, it.History, on, ex.stage, on)
		case !on:
		case it.Event != historyEventOf(ex):
			w.broke(r, "resolve item %s: history event %q, want %q (%s)", it, it.Event, historyEventOf(ex), ex.why)
		case it.At.IsZero() || it.At.After(w.now) || (!it.HandedAt.IsZero() && it.HandedAt.After(it.At)):
			w.broke(r, "resolve item %s: handed at %s, answered at %s; want both at or before now %s, in that order",
				it, formatSim(it.HandedAt), formatSim(it.At), formatSim(w.now))
		}
	})
}

// isPassEvent reports whether event is a pass's outcome (not woken, reset
// or retried).
func isPassEvent(event string) bool {
	return event != core.HistoryWoken && event != core.HistoryReset && event != core.HistoryRetried
}

func (w *world) historyOnce(r *rule, _ crossing) {
	type pass struct {
		id    int64
		stage string
		at    string
	}
	seen := map[pass]bool{}
	for _, h := range w.q.HistoryRows() {
		if !isPassEvent(h.Event) {
			continue
		}
		if !w.historyOn(h.Stage) {
			w.broke(r, "message %d has a history row %s at stage %s, whose HISTORY is off", h.ID, h.Event, h.Stage)
			return
		}
		p := pass{h.ID, h.Stage, formatSim(h.At)}
		if seen[p] {
			w.broke(r, "message %d's pass at stage %s answered at %s is recorded twice (%s)", h.ID, h.Stage, p.at, h.Event)
			return
		}
		seen[p] = true
	}
}
