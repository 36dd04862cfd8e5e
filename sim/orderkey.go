// Ordering per key in the fake world: the rules that hold the core to it
// (docs/protocol.md, "Ordering per key").

package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
)

var ruleKeyHeldOnce = &rule{name: "key-held-once", when: atEvent, check: (*world).keyHeldOnce,
	doc: "At most one message of an order key is held at any moment, at any stage: claimed and not yet handed out, or handed to a worker and unanswered. " +
		"A claim or a move that claims never hands the core a message whose key such a message has. (A message owed a resolve, its worker done with it, " +
		"holds nothing: its resolve, and its key's release, run in the same transaction before the claim.)"}

var ruleKeyOnePerPipeline = &rule{name: "key-one-per-pipeline", when: atCommand, check: (*world).keyOnePerPipeline,
	doc: "Two messages of one order key are never in one worker's pipeline: a Write never hands a worker a message whose key another id of the same Write, " +
		"or an id the worker has not answered yet, has (QUEUE_LIMIT prefetch must not break the order)."}

var ruleKeyOldestFirst = &rule{name: "key-oldest-first", when: atChange, check: (*world).keyOldestFirst,
	doc: "A message of an order key is taken by a worker (claimed, or moved and claimed) only while no older message of its key is unfinished " +
		"(pending, running, paused or blocked): a key's messages pass every stage oldest first, each only after the one before left the pipeline, " +
		"and an operator's retry of an older one makes that one the next."}

var ruleKeyNotStranded = &rule{name: "key-not-stranded", when: atEnd, check: (*world).keyNotStranded,
	doc: "Once every fault has healed, no message waits blocked behind its key unless an older message of its key is unfinished: " +
		"a key is never held by anything but its own oldest message (a release found busy is made again, and the start-up reset releases every key)."}

// keyOf is row id's order key ("" for none).
func (w *world) keyOf(id int64) string {
	r, _ := w.q.Get(id)
	return r.Key
}

func (w *world) keyHeldOnce(r *rule, x crossing) {
	t := x.took
	if t == nil {
		return
	}
	key := w.keyOf(t.id)
	if key == "" {
		return
	}
	for _, id := range w.heldIDs() {
		_, claimed := w.backlog[id]
		_, handed := w.holder[id]
		if id != t.id && (claimed || handed) && w.keyOf(id) == key {
			why, _ := w.heldBy(id)
			w.broke(r, "%s returned message %d of key %q while message %d of that key is %s", t.what, t.id, key, id, why)
			return
		}
	}
}

func (w *world) keyOnePerPipeline(r *rule, x crossing) {
	c, y, alive := w.writeTo(x.cmd)
	if !alive {
		return
	}
	seen := map[string]int64{}
	for _, id := range append(append([]int64{}, y.queue...), c.IDs...) {
		key := w.keyOf(id)
		if key == "" {
			continue
		}
		if other, ok := seen[key]; ok {
			w.broke(r, "%s puts messages %d and %d of key %q in %s's pipeline together", c, other, id, key, c.Worker)
			return
		}
		seen[key] = id
	}
}

func (w *world) keyOldestFirst(r *rule, x crossing) {
	c := x.change
	if c == nil || c.After.Key == "" || c.After.Status != core.StatusRunning ||
		(c.By != fakequeue.ByClaim && c.By != fakequeue.ByResolve) {
		return
	}
	// A claim takes a row pending -> running; a move that claims, running at
	// one stage -> running at the next.
	if c.Before.Status == core.StatusRunning && c.Before.Stage == c.After.Stage {
		return
	}
	for _, o := range w.q.Rows() {
		if o.Key == c.After.Key && o.ID < c.After.ID && !o.Status.Final() {
			w.broke(r, "%s takes message %d of key %q at %s while the older message %d of that key is %s at %s",
				c.By, c.After.ID, c.After.Key, c.After.Stage, o.ID, o.Status, o.Stage)
			return
		}
	}
}

func (w *world) keyNotStranded(r *rule, _ crossing) {
	oldest := map[string]fakequeue.Row{}
	for _, o := range w.q.Rows() {
		if o.Key == "" || o.Status.Final() {
			continue
		}
		if _, ok := oldest[o.Key]; !ok {
			oldest[o.Key] = o
		}
	}
	for _, key := range sortedKeys(oldest) {
		if o := oldest[key]; o.Status == core.StatusBlocked {
			w.broke(r, "message %d, the oldest unfinished of key %q, still waits blocked at %s: nothing released its key", o.ID, key, o.Stage)
			return
		}
	}
}

// olderUnfinished reports whether an older row of r's key is unfinished.
func (w *world) olderUnfinished(r fakequeue.Row) bool {
	for _, o := range w.q.Rows() {
		if o.ID >= r.ID {
			return false
		}
		if o.Key == r.Key && !o.Status.Final() {
			return true
		}
	}
	return false
}

// modelReleased takes a release's result: the stage of each pending head may
// now be claimed.
func (w *world) modelReleased(e core.Released) {
	w.txnResult(e.Op, e.Err)
	w.tellHeads(e.Heads)
	asked := w.releaseAsked[e.Op]
	delete(w.releaseAsked, e.Op)
	if e.Err != "" {
		return
	}
	for _, k := range asked {
		delete(w.keysBusy, k)
	}
	for _, k := range e.Busy {
		w.keysBusy[k] = true
	}
}

// tellHeads tells the stage of each pending head that it has work.
func (w *world) tellHeads(heads []core.Head) {
	for _, h := range heads {
		if h.Status == core.StatusPending {
			w.told[w.stageIndex(h.Stage)] = true
		}
	}
}

// releasedRun is the claimRun of claim c, sent at sent, after the commands
// before it in its transaction, before, and their results res: the heads and
// busy keys of its releases, and the keys of its resolve's moves that were to
// claim and did not (their outcomes owe the keys a release).
func releasedRun(c core.Claim, sent time.Time, before []core.Command, res []core.Event) *claimRun {
	run := &claimRun{claim: c, sent: sent}
	claiming := map[int64]string{}
	for _, cmd := range before {
		if r, ok := cmd.(core.Resolve); ok {
			for _, it := range r.Items {
				if it.Claim && it.Key != "" {
					claiming[it.ID] = it.Key
				}
			}
		}
	}
	for _, ev := range res {
		switch e := ev.(type) {
		case core.Released:
			run.heads, run.busy = append(run.heads, e.Heads...), append(run.busy, e.Busy...)
		case core.OrphansReset:
			run.heads, run.busy = append(run.heads, e.Heads...), append(run.busy, e.Busy...)
		case core.Resolved:
			for _, o := range e.Outcomes {
				if k, ok := claiming[o.ID]; ok && o.Status != core.StatusRunning {
					run.unclaimed = append(run.unclaimed, k)
				}
			}
		}
	}
	return run
}

// keyText describes the unfinished rows of key for a failure message ("" for
// no key).
func (w *world) keyText(key string) string {
	if key == "" {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, " (key %q:", key)
	for _, o := range w.q.Rows() {
		if o.Key == key && !o.Status.Final() {
			fmt.Fprintf(&b, " %d %s at %s;", o.ID, o.Status, o.Stage)
		}
	}
	b.WriteString(")")
	return b.String()
}

// keyRetry plays an operator retrying (pepsi-queue retry, with its keys'
// release) each failed keyed message older than a message of its key that a
// worker holds: the retried one becomes its key's oldest again, behind a pass
// still running, so the key's next must be it (rule key-oldest-first).
func (w *world) keyRetry() {
	if w.dbDown() {
		return
	}
	ids := w.q.RetryAll(func(id int64) bool {
		if _, held := w.heldBy(id); held {
			return true
		}
		key := w.keyOf(id)
		for younger := range w.holder {
			if younger > id && key != "" && w.keyOf(younger) == key {
				return false
			}
		}
		return true
	})
	if len(ids) > 0 {
		w.note("an operator retries failed keyed rows %v, each older than a held message of its key", ids)
	}
	for _, id := range ids {
		w.retried[id] = time.Time{}
		delete(w.verdicts, id)
	}
}
