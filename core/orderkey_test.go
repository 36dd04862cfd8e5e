package core_test

import (
	"slices"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// insertKeyed commits one producer transaction per key, in order, each
// inserting a row of that key at stage, and returns their ids.
func (w *world) insertKeyed(stage string, keys ...string) []int64 {
	w.t.Helper()
	var ids []int64
	for _, k := range keys {
		id, ok := w.q.ReserveKeyed(k)
		if !ok {
			w.t.Fatalf("key %q is locked by a producer", k)
		}
		w.q.Commit(id, stage)
		ids = append(ids, id)
	}
	return ids
}

// handed lists every id the commands hand to workers, in order.
func handed(cmds []core.Command) []int64 {
	var ids []int64
	for _, x := range of[core.Write](cmds) {
		ids = append(ids, x.IDs...)
	}
	return ids
}

// Proves: messages of one order key are handed one at a time, oldest first,
// however much room the stage has (its QUEUE_LIMIT window included); a
// message without a key, or of another key, is not held back; the key's next
// message is handed once the one before is done, by the release that the
// resolve of its pass carries in the same transaction.
func TestMessagesOfOneKeyAreHandedOneAtATimeOldestFirst(t *testing.T) {
	w := newWorld(t, threeStages)
	k := w.insertKeyed("a", "k", "k", "k")
	other := w.insertKeyed("a", "j")[0]
	plain := w.q.Insert("a", 1)[0]
	cmds := w.step(core.Start{})
	if got, want := handed(cmds), []int64{k[0], other, plain}; !slices.Equal(sorted(got), sorted(want)) {
		t.Fatalf("handed %v at start, want %v (the key's oldest, the other key's, the keyless one)", got, want)
	}
	w.wantRow(k[1], "a", core.StatusBlocked)
	for i := range 2 {
		cmds = w.doneThrough(k[i])
		rel := one[core.Release](t, cmds)
		if !slices.Contains(rel.Keys, "k") {
			t.Fatalf("the resolve of message %d's pass carries no release of its key: %v", k[i], cmds)
		}
		// The next message of the key becomes its head and is handed in the
		// step that follows the release.
		if got := handed(append(cmds, w.step()...)); !slices.Equal(got, []int64{k[i+1]}) {
			t.Fatalf("after message %d was done, handed %v, want [%d] (the key's next)", k[i], got, k[i+1])
		}
	}
}

// Proves: a pause (a 75 retry) of a key's head holds the key: its next message
// stays blocked until the head, woken and passed again, is done.
func TestARetryOfAKeysHeadHoldsTheKey(t *testing.T) {
	w := newWorld(t, `
[stage-a]
PROGRAM = a
PARALLELISM = 2
QUEUE_LIMIT = 3
RETRY_LIMIT = 2
RETRY_DELAY = 1s
`)
	k := w.insertKeyed("a", "k", "k")
	w.step(core.Start{})
	w.answer(workerHolding(t, w, k[0]), "", "", "75 busy")
	w.wantRow(k[0], "a", core.StatusPaused)
	w.wantRow(k[1], "a", core.StatusBlocked)
	cmds := w.tick(3 * time.Second)
	if got := handed(cmds); !slices.Equal(got, []int64{k[0]}) {
		t.Fatalf("after the retry's delay handed %v, want only the head %d again", got, k[0])
	}
	w.wantRow(k[1], "a", core.StatusBlocked)
}

// busyKeyDone starts a core over one message of key "k" at stage a, lets a
// producer of the key begin an insert (late, in flight), and runs the
// message through to done: the release that follows finds the key's lock
// held.
func busyKeyDone(t *testing.T) (w *world, late int64, cmds []core.Command) {
	t.Helper()
	w = newWorld(t, threeStages)
	k := w.insertKeyed("a", "k")
	w.step(core.Start{})
	late, ok := w.q.ReserveKeyed("k") // a producer of the key, in flight
	if !ok {
		t.Fatal("key k is locked")
	}
	return w, late, w.doneThrough(k[0])
}

// Proves: a release that finds its key's lock held by a producer in flight
// (which may be inserting a row of that key the release cannot see) is made
// again LookEvery later, not at the heartbeat, and then hands the key on.
func TestABusyReleaseIsMadeAgainAfterALook(t *testing.T) {
	w, late, cmds := busyKeyDone(t)
	if r := one[core.Release](t, cmds); !slices.Contains(r.Keys, "k") {
		t.Fatalf("no release of k after its head was done: %v", cmds)
	}
	w.q.Commit(late, "a") // blocked: it was inserted behind the unfinished head
	w.wantRow(late, "a", core.StatusBlocked)
	cmds = w.tick(w.now.Sub(epoch) + core.LookEvery)
	if r := one[core.Release](t, cmds); !slices.Equal(r.Keys, []string{"k"}) {
		t.Fatalf("the busy key was not released again after LookEvery: %v", cmds)
	}
	if got := handed(append(cmds, w.step()...)); !slices.Equal(got, []int64{late}) {
		t.Fatalf("handed %v after the second release, want [%d]", got, late)
	}
}

// Proves: a busy core whose transactions claim at only some stages (here a
// key's release, made again after LookEvery) looks at every stage with room
// with the next one it sends once LookEvery has passed since it last did: a
// row committed meanwhile without a notification (the core counted as busy)
// is claimed by that transaction, not left for a rest that a run of such
// transactions would put off (rule no-wait-for-heartbeat: a release retried
// on 40001 and a rated stage's claim once kept such a row 363 ms).
func TestABusyCoreLooksWithTheTransactionsItSends(t *testing.T) {
	w, late, _ := busyKeyDone(t)
	w.q.Commit(late, "a")
	quiet := w.q.Insert("b", 1) // committed without NOTIFY
	cmds := w.tick(w.now.Sub(epoch) + core.LookEvery)
	rel, claim := one[core.Release](t, cmds), of[core.Claim](cmds)[0]
	if !slices.Equal(rel.Keys, []string{"k"}) || !slices.ContainsFunc(claim.Caps, func(c core.Cap) bool { return c.Stage == "b" }) {
		t.Fatalf("the transaction after LookEvery does not look at stage b: %v", cmds)
	}
	if got := handed(append(cmds, w.step()...)); !slices.Contains(got, quiet[0]) {
		t.Fatalf("handed %v, want the quiet row %d among them", got, quiet[0])
	}
}

// Proves: a keyed message that moves on keeps its key without a release: its
// move claims at the next stage like any other (one write, no claim of its
// own), its transaction carries no release (the move's resolve claims only
// where no older message of the key is unfinished: asking again, as
// Release.Behind, cost every keyed hop a look-up of its row), and the key goes
// to its next message once the message is done, by the release the resolve
// of that pass carries.
func TestAKeyedMoveClaimsAndKeepsItsKey(t *testing.T) {
	w := newWorld(t, threeStages)
	k := w.insertKeyed("a", "k", "k")
	w.step(core.Start{})
	cmds := w.answer(workerHolding(t, w, k[0]), "", "", "0 >b")
	res := one[core.Resolve](t, cmds)
	if len(res.Items) != 1 || !res.Items[0].Claim {
		t.Fatalf("the keyed move to b does not claim: %v", res)
	}
	none[core.Release](t, cmds, "a keyed move that claims carries no release: its resolve asks whether an older message of its key is unfinished")
	w.wantRow(k[0], "b", core.StatusRunning)
	w.wantRow(k[1], "a", core.StatusBlocked)
	if got := handed(append(cmds, w.step()...)); !slices.Equal(got, []int64{k[0]}) {
		t.Fatalf("after the move handed %v, want [%d] at b (the key's next waits)", got, k[0])
	}
	cmds = w.doneThrough(k[0])
	if rel := one[core.Release](t, cmds); !slices.Equal(rel.Keys, []string{"k"}) {
		t.Fatalf("the done message's release is %v, want key k released", rel)
	}
	if got := handed(append(cmds, w.step()...)); !slices.Equal(got, []int64{k[1]}) {
		t.Fatalf("after message %d was done, handed %v, want [%d]", k[0], got, k[1])
	}
}

// Proves: an operator's retry of an older message of a key while a worker
// holds a younger one makes the older one the key's next: the younger one's
// move does not claim (the statement finds the older one unfinished and
// leaves it pending), its outcome owes the key a release, and the next
// transaction's release hands the key to the older one, which is handed
// before the younger one goes on. (Without the owed release the older one
// would wait blocked, and the younger one pending behind it, for good.)
func TestAKeyedMoveYieldsToAnOlderMessageAnOperatorRetried(t *testing.T) {
	w := newWorld(t, threeStages)
	k := w.insertKeyed("a", "k", "k")
	w.step(core.Start{})
	w.answer(workerHolding(t, w, k[0]), "", "", "1 boom")
	w.wantRow(k[0], "a", core.StatusFailed)
	w.step()
	w.wantRow(k[1], "a", core.StatusRunning)
	if n, err := w.q.Retry(t.Context(), store.RetryParams{ID: k[0], Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("operator's retry of %d: %d rows, %v", k[0], n, err)
	}
	w.wantRow(k[0], "a", core.StatusBlocked) // behind the held younger one
	cmds := w.answer(workerHolding(t, w, k[1]), "", "", "0 >b")
	res := one[core.Resolve](t, cmds)
	if !res.Items[0].Claim {
		t.Fatalf("the younger message's move does not try to claim: %v", res)
	}
	rel := one[core.Release](t, cmds)
	if !slices.Equal(rel.Keys, []string{"k"}) || len(rel.Behind) > 0 || rel.Op < res.Op+2 {
		t.Fatalf("the release is %v, want key k released by the transaction after the move's (op %d and its claim): its outcome found an older message unfinished", rel, res.Op)
	}
	w.wantRow(k[1], "b", core.StatusBlocked)
	if got := handed(append(cmds, w.step()...)); !slices.Equal(got, []int64{k[0]}) {
		t.Fatalf("handed %v, want the retried older message [%d] first", got, k[0])
	}
}

// doneThrough makes the worker that holds id answer "0 >done" for each
// message of its pipeline up to id, and returns the commands of the last.
func (w *world) doneThrough(id int64) []core.Command {
	w.t.Helper()
	wid := workerHolding(w.t, w, id)
	for {
		head := w.head(wid)
		cmds := w.answer(wid, "", "", "0 >done")
		if head == id {
			return cmds
		}
	}
}

// workerHolding is the worker whose pipeline holds id.
func workerHolding(t *testing.T, w *world, id int64) core.WorkerID {
	t.Helper()
	for wid, ids := range w.held {
		if slices.Contains(ids, id) {
			return wid
		}
	}
	t.Fatalf("no worker holds message %d", id)
	return 0
}

func sorted(ids []int64) []int64 {
	s := slices.Clone(ids)
	slices.Sort(s)
	return s
}

// Proves: a key owed a release now is released by the next transaction even
// when a release in the same transaction found another key busy, owed again
// only LookEvery later. Here a keyed move finds an older message of its key
// unfinished (an operator retried it; keyOutcome owes the key now) while the
// release beside it finds a producer of another key in flight: owing the
// busy key must not put off the key owed now, whose older message would
// otherwise wait up to LookEvery for nothing.
func TestAKeyOwedNowIsNotPutOffByABusyKeyOwedLater(t *testing.T) {
	w := newWorld(t, threeStages)
	j := w.insertKeyed("a", "j", "j")
	k := w.insertKeyed("a", "k")[0]
	w.step(core.Start{})
	if wid := workerHolding(t, w, j[0]); w.head(wid) != j[0] {
		t.Fatalf("message %d is not its worker's head: %v", j[0], w.held[wid])
	}
	w.answer(workerHolding(t, w, j[0]), "", "", "1 boom")
	w.step()
	w.wantRow(j[1], "a", core.StatusRunning)
	if n, err := w.q.Retry(t.Context(), store.RetryParams{ID: j[0], Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("operator's retry of %d: %d rows, %v", j[0], n, err)
	}
	if _, ok := w.q.ReserveKeyed("k"); !ok { // a producer of k, in flight
		t.Fatal("key k is locked")
	}
	// k's message done and j's younger one moved, answered in one step: one
	// transaction resolves both, and releases k.
	var evs []core.Event
	for _, a := range []struct {
		id   int64
		line string
	}{{k, "0 >done"}, {j[1], "0 >b"}} {
		wid := workerHolding(t, w, a.id)
		if w.head(wid) != a.id {
			t.Fatalf("message %d is not its worker's head: %v", a.id, w.held[wid])
		}
		w.held[wid] = w.held[wid][1:]
		evs = append(evs, core.Answer{Worker: wid, Line: a.line})
	}
	cmds := w.step(evs...)
	var keys []string
	for _, r := range of[core.Release](cmds) {
		keys = append(keys, r.Keys...)
	}
	if !slices.Contains(keys, "j") {
		t.Fatalf("key j, owed a release by its move's outcome, was not released at once (releases of %v): %v", keys, cmds)
	}
	if got := handed(append(cmds, w.step()...)); !slices.Contains(got, j[0]) {
		t.Fatalf("handed %v, want the retried older message %d of j", got, j[0])
	}
}
