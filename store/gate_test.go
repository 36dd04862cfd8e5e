package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// holdGate takes the gate exclusively on a connection of its own, as a waiting
// dispatcher does: from then on every insert notifies ingress.
func holdGate(t *testing.T, url string) {
	t.Helper()
	c := pgtest.Connect(t, url)
	if _, err := c.Exec(t.Context(), "SELECT pg_advisory_lock($1)", store.GateKey); err != nil {
		t.Fatalf("take the gate: %v", err)
	}
}

// runGate runs a gate on cfg until the test ends, and returns it with the
// events it reports.
func runGate(t *testing.T, cfg *pgx.ConnConfig) (*store.Gate, <-chan core.Event) {
	t.Helper()
	gate := store.NewGate()
	events := make(chan core.Event, 4)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); gate.Run(ctx, cfg, nil, func(ev core.Event) { events <- ev }) }()
	t.Cleanup(func() { cancel(); <-done })
	return gate, events
}

// notified reports whether conn (LISTENing on ingress) gets a notification
// within wait.
func notified(t *testing.T, conn *pgx.Conn, wait time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	_, err := conn.WaitForNotification(ctx)
	return err == nil
}

func TestAnInsertNotifiesOnlyWhileTheDispatcherHoldsTheGate(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	listener := pgtest.Listen(t, url)
	writer := pgtest.Connect(t, url)
	insert := func() {
		if _, err := writer.Exec(t.Context(), "INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
			t.Fatal(err)
		}
	}
	insert()
	if notified(t, listener, 300*time.Millisecond) {
		t.Errorf("an insert while no dispatcher waits notified ingress; want no NOTIFY (the busy dispatcher looks again anyway)")
	}
	holdGate(t, url)
	insert()
	if !notified(t, listener, 5*time.Second) {
		t.Errorf("an insert while the dispatcher holds the gate did not notify ingress")
	}
	// A transaction at REPEATABLE READ sees the gate as it is, not as it was
	// when its snapshot was taken: the lock is no MVCC state.
	if _, err := writer.Exec(t.Context(), "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1; INSERT INTO pepsi.queue (stage) VALUES ('a'); COMMIT"); err != nil {
		t.Fatal(err)
	}
	if !notified(t, listener, 5*time.Second) {
		t.Errorf("a REPEATABLE READ insert while the dispatcher holds the gate did not notify ingress")
	}
}

// A scheduled message's insert notifies ingress even while no dispatcher
// waits: a busy dispatcher learns of paused rows only from its own writes and
// wakes, so without the notification the message could wait for the
// heartbeat past its time. Unscheduled and already-due inserts stay silent.
func TestAScheduledInsertNotifiesWhetherTheDispatcherWaitsOrNot(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	listener := pgtest.Listen(t, url)
	q := store.On(pgtest.Connect(t, url))
	insert := func(rows ...store.IngressRow) {
		t.Helper()
		if _, err := q.InsertIngress(t.Context(), rows); err != nil {
			t.Fatal(err)
		}
	}
	insert(store.IngressRow{Stage: "a"}, store.IngressRow{Stage: "a", NotBefore: time.Now().Add(-time.Hour)})
	if notified(t, listener, 300*time.Millisecond) {
		t.Errorf("an insert of messages due at once notified ingress while no dispatcher waits; want no NOTIFY")
	}
	insert(store.IngressRow{Stage: "a"}, store.IngressRow{Stage: "a", NotBefore: time.Now().Add(time.Hour)})
	if !notified(t, listener, 5*time.Second) {
		t.Errorf("an insert with a scheduled message did not notify ingress while no dispatcher waits")
	}
	key := "k1" // the keyed path: its own transaction
	insert(store.IngressRow{Stage: "a", Key: &key, NotBefore: time.Now().Add(time.Hour)})
	if !notified(t, listener, 5*time.Second) {
		t.Errorf("a keyed insert of a scheduled message did not notify ingress while no dispatcher waits")
	}
	if _, err := q.Enqueue(t.Context(), store.EnqueueParams{Stage: "a", Payloads: make([][]byte, 1), States: make([]string, 1),
		NotBefore: []time.Time{time.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if !notified(t, listener, 5*time.Second) {
		t.Errorf("an enqueue of a scheduled message did not notify ingress while no dispatcher waits")
	}
}

// The handshake: taking the gate waits for every producer that found it free
// (and so will not notify) to commit; a producer that comes while the request
// waits cannot take the gate shared, and notifies.
func TestRestWaitsForProducersThatDidNotNotifyAndLaterOnesNotify(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	listener := pgtest.Listen(t, url)
	slow := pgtest.Connect(t, url)
	quick := pgtest.Connect(t, url)
	if _, err := slow.Exec(t.Context(), "BEGIN; INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	gate, events := runGate(t, cfg)
	gate.Do(core.Rest{})
	select {
	case ev := <-events:
		t.Fatalf("the gate answered %v while a producer that found it free is still open; want it to wait", ev)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := quick.Exec(t.Context(), "INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	if !notified(t, listener, 5*time.Second) {
		t.Errorf("a producer that came while the dispatcher asked for the gate did not notify")
	}
	if _, err := slow.Exec(t.Context(), "COMMIT"); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		if ev != (core.Resting{}) {
			t.Fatalf("gate answered %v, want resting", ev)
		}
	case <-time.After(waitFor):
		t.Fatalf("the gate did not answer within %v of the last producer's commit", waitFor)
	}
	// Busy releases it: inserts stop notifying.
	gate.Do(core.Busy{})
	deadline := time.Now().Add(waitFor)
	for {
		var free bool
		if err := quick.QueryRow(t.Context(), "SELECT pg_try_advisory_lock_shared($1)", store.GateKey).Scan(&free); err != nil {
			t.Fatal(err)
		}
		if free {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gate is still held %v after Busy", waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A discard that hands an order key to its next message notifies ingress,
// as every tool that makes rows pending does, whether a dispatcher waits or
// not.
func TestADiscardThatHandsAKeyOnNotifies(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	q := store.On(pgtest.Connect(t, url))
	ids, err := q.InsertIngress(t.Context(), []store.IngressRow{{Stage: "a", OrderKey: "k"}, {Stage: "a", OrderKey: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	listener := pgtest.Listen(t, url)
	if n, err := q.Discard(t.Context(), store.DiscardParams{Selection: store.Selection{ID: ids[0]}, DispatchError: "discarded"}); err != nil || n != 1 {
		t.Fatalf("Discard of the key's head = %d, %v; want 1", n, err)
	}
	if !notified(t, listener, 5*time.Second) {
		t.Errorf("a discard that made message %d its key's head (pending) did not notify ingress", ids[1])
	}
}

// A resolve is no producer unless it emits: while the dispatcher rests (the
// gate held), a resolve without emits must not NOTIFY, for a NOTIFY takes
// PostgreSQL's notification lock at COMMIT, which every notifying commit of
// the cluster shares and holds across its WAL flush: the resting dispatcher's
// every hop would queue behind the producers' commits and they behind it, and
// it would wake itself for nothing (the race of docs/performance.md, "A
// producer racing the rest"). A resolve that emits inserts rows pending, as
// any producer, and notifies. Notifications arrive in commit order, so a
// marker notified after the resolve's commit must be the first one heard.
func TestAResolveNotifiesOnlyIfItEmits(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 2)
	if evs := h.Exec(t.Context(), []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 2}}}}); len(evs) != 1 || len(evs[0].(core.Claimed).Rows) != 2 {
		t.Fatalf("claim answered %v, want both rows", evs)
	}
	holdGate(t, h.url)
	listener := pgtest.Listen(t, h.url)
	marker := pgtest.Connect(t, h.url)
	firstHeard := func(items ...core.Item) string {
		t.Helper()
		evs := h.Exec(t.Context(), []core.Command{core.Resolve{Op: 2, Items: items}})
		if len(evs) != 1 || core.QueueErr(evs[0]) != "" {
			t.Fatalf("resolve answered %v", evs)
		}
		if _, err := marker.Exec(t.Context(), "SELECT pg_notify($1, 'marker')", store.IngressChannel); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("no notification, not even the marker: %v", err)
		}
		if n.Payload == "" {
			// The resolve's: the marker follows it.
			if _, err := listener.WaitForNotification(ctx); err != nil {
				t.Fatalf("no marker after the resolve's notification: %v", err)
			}
		}
		return n.Payload
	}
	if got := firstHeard(core.Item{ID: ids[0], Stage: "a", Verdict: core.Move, To: "b"}); got != "marker" {
		t.Errorf("a resolve without emits notified ingress while the dispatcher held the gate; want no NOTIFY")
	}
	emitting := core.Item{ID: ids[1], Stage: "a", Verdict: core.Move, To: "b", Emits: []core.Emit{{Stage: "c", Payload: []byte("child")}}}
	if got := firstHeard(emitting); got != "" {
		t.Errorf("a resolve whose move emits a child did not notify ingress while the dispatcher held the gate")
	}
}

// Proves: a role's or database's idle_session_timeout does not end the gate's
// session, which idles while the dispatcher rests: the server ending it every
// few seconds would make the dispatcher lose the gate (RestLost), look for
// work everywhere and ask for the gate again, over and over, each producer
// meanwhile not notifying. Here the setting comes with the connection.
func TestAnIdleSessionTimeoutDoesNotEndTheGatesSession(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	cfg := connConfig(t, url)
	cfg.RuntimeParams["idle_session_timeout"] = "300"
	gate, events := runGate(t, cfg)
	gate.Do(core.Rest{})
	select {
	case ev := <-events:
		if ev != (core.Resting{}) {
			t.Fatalf("gate answered %v, want resting", ev)
		}
	case <-time.After(waitFor):
		t.Fatalf("the gate did not answer within %v", waitFor)
	}
	select {
	case ev := <-events:
		t.Fatalf("the gate's session, idle for a while, reported %v; want the gate kept", ev)
	case <-time.After(1500 * time.Millisecond):
	}
	var free bool
	if err := pgtest.Connect(t, url).QueryRow(t.Context(), "SELECT pg_try_advisory_lock_shared($1)", store.GateKey).Scan(&free); err != nil {
		t.Fatal(err)
	}
	if free {
		t.Errorf("the gate is free after its session idled; want it held")
	}
}
