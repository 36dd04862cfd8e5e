package dispatch_test

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Back-pressure checked from outside (docs/protocol.md, "Back-pressure
// between stages"): the real dispatcher on PostgreSQL, a fast stage feeding a
// slow one with a MAX_PENDING, and the slow stage's pending count sampled
// from another connection for the whole run.

// pressureConf: split answers "0 >slow" at once, with up to
// PARALLELISM × QUEUE_LIMIT = 16 messages in hand; slow takes 5 ms a message,
// four at a time, and has a MAX_PENDING of 100.
const pressureConf = `[pepsi-dispatch]
POLL_INTERVAL = 30
[stage-split]
PROGRAM = @BIN@/teststage
PARALLELISM = 2
QUEUE_LIMIT = 8
[stage-slow]
PROGRAM = @BIN@/teststage
PARALLELISM = 4
QUEUE_LIMIT = 1
MAX_PENDING = 100
`

// TestASlowStagesPendingCountStaysWithinItsMaxPending feeds 2,000 messages
// through a fast stage into a slow one with MAX_PENDING 100: sampled all
// along, the slow stage's pending count never goes past 100 plus the 16 its
// feeder can hold (what it held when the limit was crossed), the feeder was
// held (the dispatcher logged it), and every message finishes.
func TestASlowStagesPendingCountStaysWithinItsMaxPending(t *testing.T) {
	t.Parallel()
	const n, limit, feederHolds = 2000, 100, 2 * 8
	e := newEnv(t, pressureConf)
	e.insertN("split", "split=answer:0 >slow;slow=sleep:5+answer:0 >done", n)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var most, samples int
	var sampleErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			var pending int
			err := e.db.QueryRow(ctx, `SELECT count(*) FROM pepsi.queue WHERE stage = 'slow' AND status = 'pending'`).Scan(&pending)
			if err != nil {
				if ctx.Err() == nil {
					sampleErr = err
				}
				return
			}
			most, samples = max(most, pending), samples+1
			time.Sleep(2 * time.Millisecond)
		}
	}()
	d := e.start()
	e.waitCounts(5*time.Minute, map[string]int{"done": n})
	stop()
	wg.Wait()
	d.stopClean()
	if sampleErr != nil {
		t.Fatalf("sampling the pending count: %v", sampleErr)
	}
	t.Logf("slow's pending count: at most %d in %d samples (MAX_PENDING %d, the feeder holds at most %d)", most, samples, limit, feederHolds)
	if most > limit+feederHolds {
		t.Errorf("slow had %d messages pending, more than MAX_PENDING %d + the %d its feeder may hold", most, limit, feederHolds)
	}
	if len(d.logs.lines("claims held for the stages that feed it (split)")) == 0 {
		t.Errorf("the dispatcher never held split: slow never went over its MAX_PENDING (at most %d pending seen)", most)
	}
}
