package dispatch_test

import (
	"context"
	"os"
	"path/filepath"
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

// TestAStageThatCannotStartIsNotFedPastItsMaxPending: a stage whose program
// exits at every start claims messages for each new try and gives them back
// when the try fails. Those messages are waiting for the stage all along, so
// they count against its MAX_PENDING: were they not, each try would free the
// feeder for one more claim, and the broken stage's queue would grow without
// bound (one message per cooldown round here) while it cannot run.
func TestAStageThatCannotStartIsNotFedPastItsMaxPending(t *testing.T) {
	t.Parallel()
	const limit, feederHolds = 2, 1
	e := newEnv(t, `[pepsi-dispatch]
POLL_INTERVAL = 30
[stage-feed]
PROGRAM = @BIN@/teststage
PARALLELISM = 1
QUEUE_LIMIT = 1
[stage-broken]
PROGRAM = @DIR@/broken
PARALLELISM = 2
QUEUE_LIMIT = 2
MAX_PENDING = 2
`)
	if err := os.WriteFile(filepath.Join(e.dir, "broken"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.insertN("feed", "feed=answer:0 >broken", 40)
	d := e.start()
	var most int64
	// Cooldowns of 1, 2, 4 and 8 s: four rounds of tries, each of which
	// would free the feeder once.
	for end := time.Now().Add(16 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		most = max(most, e.scalar(`SELECT count(*) FROM pepsi.queue WHERE stage = 'broken' AND status = 'pending'`))
	}
	d.stopClean()
	if n := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE stage = 'feed' AND status = 'pending'`); n == 0 {
		t.Errorf("no message waits at feed: it was not held")
	}
	t.Logf("broken's pending count: at most %d (MAX_PENDING %d, the feeder holds at most %d)", most, limit, feederHolds)
	if most > limit+feederHolds {
		t.Errorf("broken had %d messages pending, more than MAX_PENDING %d + the %d its feeder may hold", most, limit, feederHolds)
	}
	if len(d.logs.lines("claims held for the stages that feed it (feed)")) == 0 {
		t.Errorf("the dispatcher never held feed: the test did not reach the hold (broken had at most %d pending)", most)
	}
}
