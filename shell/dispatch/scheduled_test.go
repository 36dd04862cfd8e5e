package dispatch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/store"
)

// A scheduled message (not_before, inserted by the queue room's insert, as
// pepsi-ingress inserts it) is handed to its stage at its time: not before,
// and not at the heartbeat (POLL_INTERVAL is an hour here), whether the
// dispatcher is busy when it is inserted (a stream of messages keeps it
// claiming, so the insert trigger alone would not notify) or at rest.
func TestAScheduledMessageRunsAtItsTimeNotBeforeAndNotAtTheHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = @BIN@/teststage
PARALLELISM = 4
`)
	d := e.start()
	ctx := context.Background()
	schedule := func(after time.Duration) (int64, time.Time) {
		t.Helper()
		at := time.Now().Add(after).Truncate(time.Microsecond)
		ids, err := store.On(e.db).InsertIngress(ctx, []store.IngressRow{{Stage: "a", Payload: []byte("a=answer:0 >done"), NotBefore: at}})
		if err != nil {
			t.Fatal(err)
		}
		if r := e.row(ids[0]); r.Status != "paused" {
			t.Fatalf("scheduled message %d is %s, want paused", ids[0], r)
		}
		return ids[0], at
	}
	e.insertN("a", "a=sleep:5+answer:0 >done", 600) // about a second of work for four workers
	waitFor(t, 30*time.Second, "the dispatcher busy with the stream", func() (bool, string) {
		n := e.scalar("SELECT count(*) FROM pepsi.queue WHERE status = 'done'")
		return n >= 100, fmt.Sprintf("%d done", n)
	})
	busy, busyAt := schedule(1500 * time.Millisecond)
	e.waitCounts(30*time.Second, map[string]int{"done": 601})
	idle, idleAt := schedule(time.Second)
	e.waitCounts(30*time.Second, map[string]int{"done": 602})
	d.stopClean()
	for _, m := range []struct {
		name string
		id   int64
		at   time.Time
	}{{"inserted while the dispatcher was busy", busy, busyAt}, {"inserted while it rested", idle, idleAt}} {
		passes := e.passTimes(m.id)
		if len(passes) != 1 {
			t.Fatalf("message %d, %s: %d passes, want 1", m.id, m.name, len(passes))
		}
		if passes[0].Before(m.at) {
			t.Errorf("message %d, %s, scheduled for %s: handed to its stage %s early", m.id, m.name, m.at.Format(time.StampMicro), m.at.Sub(passes[0]))
		}
	}
	if n := e.scalar("SELECT count(*) FROM pepsi.history WHERE event = 'woken'"); n != 2 {
		t.Errorf("%d woken events in the history, want one per scheduled message", n)
	}
}
