package fakequeue_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/queuetest"
	"github.com/pepsi-pipeline/pepsi/sim/fakequeue"
	"github.com/pepsi-pipeline/pepsi/store"
)

// TestQueueConformance runs the suite store passes against PostgreSQL, so
// the simulator's queue cannot drift from the real one.
func TestQueueConformance(t *testing.T) {
	queuetest.Run(t, func(*testing.T) queuetest.Harness { return newHarness() })
}

// TestQueueConformanceWithIDsPastAMillion runs the suite again on a fake
// queue whose identity handed out a million ids before (Queue.StartAfter, as
// the simulator's scenarios draw): every statement finds its rows by id
// wherever the ids start.
func TestQueueConformanceWithIDsPastAMillion(t *testing.T) {
	queuetest.Run(t, func(*testing.T) queuetest.Harness {
		h := newHarness()
		h.StartAfter(1_000_000)
		return h
	})
}

// newHarness is a fresh fake queue with a clock that ticks a second at each
// reading, so that rows changed one after another have different
// updated_at, as on a server.
func newHarness() harness {
	q := fakequeue.New()
	now := time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)
	q.Clock = func() time.Time { now = now.Add(time.Second); return now }
	return harness{q}
}

// harness adapts a fake queue to the suite: it plays the ingress side, a stage
// program and a PostgreSQL crash the way the suite asks.
type harness struct{ *fakequeue.Queue }

func (h harness) Insert(_ *testing.T, stage string, n int) []int64 { return h.Queue.Insert(stage, n) }

func (h harness) InsertMessage(_ *testing.T, stage, state string, payload []byte) int64 {
	return h.Queue.InsertMessage(stage, state, payload)
}

func (h harness) BeginInsert(_ *testing.T, stage string) (int64, func()) {
	id := h.Reserve()
	return id, func() { h.Commit(id, stage) }
}

func (h harness) Stage(t *testing.T, id int64, from, to string, status core.RowStatus, timeout time.Time) {
	t.Helper()
	if !h.StageWrite(id, from, to, status, timeout) {
		t.Fatalf("stage write of row %d: it is not running at %s", id, from)
	}
}

func (h harness) Row(_ *testing.T, id int64) (stage string, status core.RowStatus, timeout time.Time, dispatchError string, ok bool) {
	r, ok := h.Get(id)
	return r.Stage, r.Status, r.Timeout, r.DispatchError, ok
}

func (h harness) State(t *testing.T, id int64) map[string]any {
	t.Helper()
	r, _ := h.Get(id)
	state := map[string]any{}
	if r.State != "" {
		if err := json.Unmarshal([]byte(r.State), &state); err != nil {
			t.Fatalf("state of row %d: %v", id, err)
		}
	}
	if r.DispatchError != "" {
		state["dispatch_error"] = r.DispatchError
	}
	return state
}

func (h harness) ClearEpoch(*testing.T) { h.Queue.ClearEpoch() }

func (h harness) RefuseStateKey(_ *testing.T, key string) { h.Queue.RefuseStateKey(key) }

// TestHooksReportNotificationsAndWhoChangedEachRow: the simulator learns of every
// NOTIFY and of every row change with its writer, including a crash's undo.
func TestHooksReportNotificationsAndWhoChangedEachRow(t *testing.T) {
	q := fakequeue.New()
	notified := 0
	var changes []string
	q.Notify = func() { notified++ }
	q.Observe = func(c fakequeue.Change) {
		changes = append(changes, string(c.By)+" "+c.Before.Stage+":"+string(c.Before.Status)+"->"+c.After.Stage+":"+string(c.After.Status))
	}
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ids := q.Insert("a", 2)
	q.Exec(t.Context(), []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 2}}}})
	q.StageWrite(ids[0], "a", "a", "paused", at)
	q.StageWrite(ids[1], "a", "b", "running", time.Time{})
	q.Crash() // loses both stage writes
	q.StageWrite(ids[0], "a", "a", "paused", at)
	q.Exec(t.Context(), []core.Command{core.KeepHistory{Op: 2, From: at, Now: at, Through: at}, core.Wake{Op: 3, Now: at}})
	want := []string{
		"claim a:pending->a:running", "claim a:pending->a:running",
		"stage a:running->a:paused", "stage a:running->b:running",
		"crash b:running->a:running", "crash a:paused->a:running",
		"stage a:running->a:paused", "wake a:paused->a:pending",
	}
	if len(changes) != len(want) {
		t.Fatalf("changes = %q, want %q", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Errorf("change %d = %q, want %q", i, changes[i], want[i])
		}
	}
	if notified != 2 || q.Notified != 2 {
		t.Errorf("notifications = %d (counter %d), want 2: the insert and the wake", notified, q.Notified)
	}
}

// TestQueueOrderKeys runs the conformance tests of ordering per key on the
// fake.
func TestQueueOrderKeys(t *testing.T) {
	queuetest.RunOrderKeys(t, func(*testing.T) queuetest.KeyedHarness { return newHarness() })
}

func (h harness) InsertKeyed(t *testing.T, stage, key string) int64 {
	id, commit := h.BeginInsertKeyed(t, stage, key)
	commit()
	return id
}

func (h harness) BeginInsertKeyed(t *testing.T, stage, key string) (int64, func()) {
	t.Helper()
	id, ok := h.ReserveKeyed(key)
	if !ok {
		t.Fatalf("insert a row of key %q: a producer holds the key's lock", key)
	}
	return id, func() { h.Commit(id, stage) }
}

// TestASynchronousInsertOfAKeyAProducerHoldsChangesNothing: PostgreSQL's
// Enqueue or InsertIngress of a row whose order key a producer in flight
// holds would wait for that producer; the fake cannot wait, so it refuses
// the whole statement, inserting nothing, and inserts once the producer
// committed.
func TestASynchronousInsertOfAKeyAProducerHoldsChangesNothing(t *testing.T) {
	h := newHarness()
	_, commit := h.BeginInsertKeyed(t, "a", "k")
	p := store.EnqueueParams{Stage: "a", Payloads: make([][]byte, 2), States: make([]string, 2), OrderKeys: []string{"", "k"}}
	if _, err := h.Enqueue(t.Context(), p); !errors.Is(err, fakequeue.ErrKeyLocked) {
		t.Fatalf("Enqueue of a locked key: %v; want ErrKeyLocked", err)
	}
	rows := []store.IngressRow{{Stage: "a"}, {Stage: "a", OrderKey: "k"}}
	if _, err := h.InsertIngress(t.Context(), rows); !errors.Is(err, fakequeue.ErrKeyLocked) {
		t.Fatalf("InsertIngress of a locked key: %v; want ErrKeyLocked", err)
	}
	if n := len(h.Rows()); n != 0 {
		t.Fatalf("%d rows after the refused inserts; want none", n)
	}
	commit()
	if r, err := h.Enqueue(t.Context(), p); err != nil || r.Count != 2 {
		t.Fatalf("Enqueue once the producer committed = %+v, %v; want 2 rows", r, err)
	}
}

// TestAReleaseWithNoPartitionForTodayRecordsNoWake: pepsi.order_release
// (schema 31) records a head whose wait ran out while it was blocked as
// woken only into a partition that exists, and otherwise releases the key
// all the same, writing no history row. The fake must do as PostgreSQL
// does, not panic for a row with no partition to go to.
func TestAReleaseWithNoPartitionForTodayRecordsNoWake(t *testing.T) {
	q := fakequeue.New()
	now := time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)
	q.Clock = func() time.Time { return now }
	head, _ := q.ReserveKeyed("k")
	q.Commit(head, "a")
	scheduled, _ := q.ReserveKeyed("k")
	q.CommitMessage(scheduled, "a", nil, now.Add(time.Minute))
	if evs := q.Exec(t.Context(), []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 10}}}}); len(evs[0].(core.Claimed).Rows) != 1 {
		t.Fatalf("claim: %v; want the key's head", evs)
	}
	if !q.StageWrite(head, "a", "a", core.StatusDone, time.Time{}) {
		t.Fatal("the head's stage could not finish it")
	}
	now = now.Add(48 * time.Hour) // its time came, on a day no upkeep made
	ev := q.Exec(t.Context(), []core.Command{core.Release{Op: 2, Keys: []string{"k"}}})[0].(core.Released)
	if len(ev.Heads) != 1 || ev.Heads[0].ID != scheduled || ev.Heads[0].Status != core.StatusPending {
		t.Fatalf("release = %+v; want row %d the head, pending", ev, scheduled)
	}
	if rows, _ := q.History(t.Context(), scheduled); len(rows) != 0 {
		t.Errorf("history of row %d = %+v; want none (no partition for the day)", scheduled, rows)
	}
}
