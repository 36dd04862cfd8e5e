package dispatch_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestAPassWhoseChildsKeyProducersKeepLockedIsNotStarved: two producers of
// order key k take turns in back-to-back transactions, each holding k's
// bucket lock for 30 ms, so that the lock is always held by one of them
// while the other queues for it (PostgreSQL hands a released lock straight
// to its next waiter). A pass that emits a child of key k must still get
// its turn at the lock, as any producer of k does, and be written while
// they go on.
func TestAPassWhoseChildsKeyProducersKeepLockedIsNotStarved(t *testing.T) {
	t.Parallel()
	e := newEnv(t, emitConf)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	turns := 0
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				tx, err := e.db.Begin(context.Background())
				if err != nil {
					return
				}
				_, err = tx.Exec(context.Background(), `SELECT pg_advisory_xact_lock(1885696107, pepsi.order_bucket('k'))`)
				if err == nil {
					time.Sleep(30 * time.Millisecond)
					mu.Lock()
					turns++
					mu.Unlock()
				}
				tx.Commit(context.Background()) //nolint:errcheck
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(200 * time.Millisecond)
	parent := e.insert("split", "split=emit:collect:1:k+answer:0 >done")[0]
	d := e.start()
	defer d.stopClean()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if e.scalar(`SELECT count(*) FROM pepsi.queue WHERE parent_id = $1`, parent) == 1 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	n := turns
	mu.Unlock()
	t.Errorf("after 5 s the pass's child of key k is not inserted, while the producers of k took %d turns at its lock: %s", n,
		fmt.Sprint(d.logs.lines("whose lock a producer's open transaction holds")))
}
