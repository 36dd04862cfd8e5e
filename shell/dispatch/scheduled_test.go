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
	e.insertN("a", "a=sleep:5+answer:0 >done", 2000) // several seconds of work for four workers
	// Busy: claiming the stream, with the gate free (so the insert trigger
	// does not notify; only the scheduled insert's own notification tells).
	waitFor(t, 30*time.Second, "the dispatcher busy with the stream, the gate free", func() (bool, string) {
		n := e.scalar("SELECT count(*) FROM pepsi.queue WHERE status = 'done'")
		gate := e.scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND (classid::bigint << 32 | objid::bigint) = $1", store.GateKey)
		return n >= 100 && gate == 0, fmt.Sprintf("%d done, gate asked for or held %d times", n, gate)
	})
	busy, busyAt := schedule(3 * time.Second)
	e.waitCounts(30*time.Second, map[string]int{"done": 2001})
	idle, idleAt := schedule(3 * time.Second)
	e.waitCounts(30*time.Second, map[string]int{"done": 2002})
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
