package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// TestHistoryPrintsEachPassAndTheOperatorsRetry: history and show print a
// message's timeline (a pass with its stage, wait, duration, worker and
// outcome), and pepsi-queue retry adds a retried row.
func TestHistoryPrintsEachPassAndTheOperatorsRetry(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "x\n", env, "enqueue", "-stage", "parse").expect(t, "enqueue", 0, "id 1", "")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	q := store.New(pool, nil) // the dispatcher's own writes
	now := time.Now().UTC().Truncate(time.Microsecond)
	handed := now.Add(-1500 * time.Millisecond)
	evs := q.Exec(context.Background(), []core.Command{
		core.KeepHistory{Op: 1, From: now, Now: now, Through: now},
		core.Claim{Op: 2, Caps: []core.Cap{{Stage: "parse", N: 1}}},
	})
	evs = append(evs, q.Exec(context.Background(), []core.Command{core.Resolve{Op: 3, Items: []core.Item{{
		ID: 1, Stage: "parse", Verdict: core.Fail, Reason: "exit 3: bad input",
		History: true, Event: core.HistoryFailed, HandedAt: handed, At: now, PID: 4242}}}})...)
	for _, ev := range evs {
		if err := core.QueueErr(ev); err != "" {
			t.Fatalf("%v", ev)
		}
	}
	r := pq(t, "", env, "history", "1")
	r.expect(t, "history", 0, "STAGE", "")
	for _, want := range []string{"parse", "1.5s", "pid 4242", "failed: exit 3: bad input"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("history output lacks %q:\n%s", want, r.stdout)
		}
	}
	pq(t, "", env, "show", "1").expect(t, "show's timeline", 0, "history\nAT", "")
	pq(t, "", env, "retry", "-id", "1").expect(t, "retry", 0, "", "")
	pq(t, "", env, "history", "1").expect(t, "history after retry", 0, "retried: failed at parse: exit 3: bad input", "")
	pq(t, "", env, "history", "-json", "1").expect(t, "history -json", 0, `"event":"failed","detail":"exit 3: bad input"`, "")
	pq(t, "", env, "history", "99").expect(t, "history of nothing", 1, "", "message 99 does not exist and has no history")
	pq(t, "", env, "history", "-json", "99").expect(t, "history -json of nothing", 1, "", "message 99 does not exist and has no history")
}

// TestShowAndHistoryNameAMessagesParentAndCountItsChildren: a message a
// stage's pass emitted names its parent, and the parent counts its children,
// in show and in history.
func TestShowAndHistoryNameAMessagesParentAndCountItsChildren(t *testing.T) {
	t.Parallel()
	url, env := migratedEnv(t)
	pq(t, "x\n", env, "enqueue", "-stage", "parse").expect(t, "enqueue", 0, "id 1", "")
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	q := store.New(pool, nil) // the dispatcher's own writes
	now := time.Now().UTC().Truncate(time.Microsecond)
	evs := q.Exec(context.Background(), []core.Command{
		core.KeepHistory{Op: 1, From: now, Now: now, Through: now},
		core.Claim{Op: 2, Caps: []core.Cap{{Stage: "parse", N: 1}}},
	})
	evs = append(evs, q.Exec(context.Background(), []core.Command{core.Resolve{Op: 3, Items: []core.Item{{
		ID: 1, Stage: "parse", Verdict: core.Move, To: core.TargetDone,
		Emits:   []core.Emit{{Stage: "parse", Payload: []byte("a")}, {Stage: "parse", Payload: []byte("b")}},
		History: true, Event: core.HistoryDone, HandedAt: now, At: now, PID: 4242}}}})...)
	for _, ev := range evs {
		if err := core.QueueErr(ev); err != "" {
			t.Fatalf("%v", ev)
		}
	}
	pq(t, "", env, "show", "1").expect(t, "show of the parent", 0, "2 (messages its passes emitted)", "")
	pq(t, "", env, "history", "1").expect(t, "history of the parent", 0, "2 (messages its passes emitted)", "")
	pq(t, "", env, "show", "2").expect(t, "show of a child", 0, "1 (emitted by its pass; pepsi-queue history 1)", "")
	pq(t, "", env, "show", "3").expect(t, "show of a child", 0, "1 (emitted by its pass; pepsi-queue history 1)", "")
}
