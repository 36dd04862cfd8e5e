package dispatch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Bursts through the stage library (libstage), with and without faults of the
// database underneath. The library reruns a message whose connection broke, so
// every message must end done however often the connections are cut.

// threeHops is a message's script through three stages.
const threeHops = "a=advance:b;b=advance:c;c=done"

// done counts finished messages, for waits; an error counts as none.
func (e *env) done() (int, string) {
	c, err := e.counts()
	if err != nil {
		return 0, err.Error()
	}
	return c["done"], fmtCounts(c)
}

func TestBurstOfTenThousandMessagesThroughThreeStagesEndsDoneWithAgreeingStatistics(t *testing.T) {
	t.Parallel()
	const n = 10000
	e := newEnv(t, "[pepsi-dispatch]\nSTATS_INTERVAL = 60\n"+stagesOf("libstage", 3, 16, "a", "b", "c"))
	e.insertN("a", threeHops, n)
	start := time.Now()
	d := e.start()
	e.waitCounts(100*time.Second, map[string]int{"done": n})
	took := time.Since(start)
	t.Logf("%d messages through 3 stages in %v: %.0f stage passes/s", n, took.Round(time.Millisecond), 3*n/took.Seconds())
	waitFor(t, 5*time.Second, "the statistics of the burst", func() (bool, string) {
		passes, left, _ := e.dispatchStats()
		return left == n, fmt.Sprintf("stage_passes %d, messages_left %d", passes, left)
	})
	d.stopClean()
	if passes, left, _ := e.dispatchStats(); passes != 3*n || left != n {
		t.Errorf("dispatch_stats: stage_passes %d, messages_left %d; want %d and %d", passes, left, 3*n, n)
	}
	st := e.stageStats()
	for _, s := range []string{"a", "b", "c"} {
		if got := st[s]; got.Processed != n || got.Failed != 0 || got.Crashes != 0 || got.Timeouts != 0 {
			t.Errorf("stage_stats %s = %+v; want processed %d and nothing else", s, got, n)
		}
	}
	if len(st) != 3 {
		t.Errorf("stage_stats has %d rows (%v); want 3", len(st), st)
	}
}

func TestMessagesSurviveCutDatabaseConnections(t *testing.T) {
	t.Parallel()
	const n = 3000
	e := newEnv(t, stagesOf("libstage", 2, 16, "a", "b", "c"))
	e.insertN("a", threeHops, n)
	d := e.start()
	for _, at := range []int{300, 1500} {
		waitFor(t, 60*time.Second, fmt.Sprintf("%d messages done", at), func() (bool, string) {
			got, last := e.done()
			return got >= at, last
		})
		// Every backend of the test database but this one: the dispatcher's pool,
		// listener and lock, and every worker's.
		var cut int64
		err := e.db.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&cut)
		if err != nil {
			t.Fatalf("cut connections: %v", err)
		}
		t.Logf("cut %d connections after %d messages", cut, at)
	}
	e.waitCounts(120*time.Second, map[string]int{"done": n})
	d.stopClean()
	if n := len(d.logs.lines("restarting the dispatcher session after losing the lock")); n == 0 {
		t.Errorf("the dispatcher never noticed it lost its lock connection; the test did not cut it")
	}
}

func TestMessagesSurviveAPostgreSQLRestart(t *testing.T) {
	t.Parallel()
	const n = 2000
	pg := startPrivatePostgres(t)
	e := newEnvAt(t, pg.migrated(t), stagesOf("libstage", 2, 16, "a", "b", "c"))
	d := e.start()
	for i, mode := range []string{"immediate", "fast"} {
		e.insertN("a", threeHops, n)
		total := (i + 1) * n
		waitFor(t, 60*time.Second, "the burst to be under way", func() (bool, string) {
			got, last := e.done()
			return got >= total-n+n/4, last
		})
		before, last := e.done()
		if before >= total {
			t.Fatalf("the burst ended before the restart (%s); the test would prove nothing", last)
		}
		pg.restart(t, mode)
		t.Logf("restarted PostgreSQL (-m %s) with the queue at %s", mode, last)
		e.waitCounts(120*time.Second, map[string]int{"done": total})
	}
	d.stopClean()
	if n := len(d.logs.lines("restarting the dispatcher session after losing the lock")); n < 2 {
		t.Errorf("the dispatcher restarted its session %d times; want once per PostgreSQL restart (2)", n)
	}
}

func TestAQueueTransactionStuckPastItsTimeoutFailsAndIsRetried(t *testing.T) {
	t.Parallel()
	const n = 50
	e := newEnv(t, stagesOf("libstage", 1, 16, "a", "b", "c"))
	e.txnTimeout = time.Second
	e.insertN("a", threeHops, n)
	// Someone holds the queue for 4 s: the dispatcher's first transaction waits
	// behind the lock. It must give up after its timeout, not wait it out.
	behindALockedQueue(t, e, n)
}

// behindALockedQueue runs e's dispatcher while another session holds
// pepsi.queue exclusively: from before it starts until 3 s after its first
// queue write failed (more tries fail meanwhile), then until its n messages
// are done, and returns it stopped.
func behindALockedQueue(t *testing.T, e *env, n int) *daemon {
	t.Helper()
	ctx := context.Background()
	locker, err := e.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locker.Exec(ctx, "LOCK TABLE pepsi.queue IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	d := e.start()
	// Runs before the daemon's own cleanup, which could not stop it otherwise.
	t.Cleanup(func() { _ = locker.Rollback(context.Background()) })
	waitFor(t, 20*time.Second, "a queue write to fail", func() (bool, string) {
		return len(d.logs.lines("queue write failed")) > 0, "no \"queue write failed\" line in the log"
	})
	time.Sleep(3 * time.Second)
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitCounts(60*time.Second, map[string]int{"done": n})
	d.stopClean()
	return d
}

// TestAQueueTransactionWaitingForALockEndsWithAnErrorNotADoubt: a step
// whose statement waits for a lock another session holds past the
// transaction's timeout is ended by the server's lock_timeout, set a little
// under it (store.BoundLockWaits): an ERROR before the COMMIT, so the core
// knows nothing committed and sends its work again as it was. Ended by the
// transaction's timeout instead, its reply was lost without an answer: a
// transaction in doubt, whose price is rows reset and passes run again.
func TestAQueueTransactionWaitingForALockEndsWithAnErrorNotADoubt(t *testing.T) {
	t.Parallel()
	const n = 20
	e := newEnv(t, stagesOf("libstage", 1, 16, "a", "b"))
	e.txnTimeout = 2 * time.Second
	e.insertN("a", "a=advance:b;b=done", n)
	d := behindALockedQueue(t, e, n) // held past the transaction's timeout
	for _, line := range d.logs.lines("queue write failed") {
		if msg := line.msg(); !strings.Contains(msg, "55P03") || strings.Contains(msg, "deadline exceeded") {
			t.Errorf("a failed write: %s; want the server's lock timeout (SQLSTATE 55P03), not the transaction's own timeout", msg)
		}
	}
	if lines := d.logs.lines("in doubt"); len(lines) > 0 {
		t.Errorf("a transaction was left in doubt: %v", lines)
	}
}
