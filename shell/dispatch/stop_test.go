package dispatch_test

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// stopBound is how long a dispatcher whose workers are gone may take to exit
// after SIGTERM in these tests. The requirement is 100 ms (measured by
// BenchmarkStopAfterSIGTERM); the bound is generous so a loaded machine does
// not fail it, and still catches a stop that waits seconds for nothing.
const stopBound = 2 * time.Second

// sigterm stops d with SIGTERM and asserts it exits 0 within stopBound.
func sigterm(t *testing.T, d *binDaemon) time.Duration {
	t.Helper()
	sent := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := d.exited(stopBound)
	took := time.Since(sent)
	if code != 0 {
		t.Errorf("%s: exit %d after SIGTERM; want 0", d.name, code)
	}
	t.Logf("%s exited %v after SIGTERM", d.name, took.Round(time.Millisecond))
	return took
}

// A dispatcher stops promptly on SIGTERM however it got the lock: at once
// (plain), still waiting as a standby, or as a standby that took over from a
// dispatcher killed with SIGKILL (its lock connection is the one it waited on).
func TestBinaryStopsPromptlyOnSIGTERMHoweverItGotTheLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 2, "a"))
	first := startBinary(t, "dispatcher", e.conf, e.url)
	first.awaitLog(20*time.Second, "holding the dispatcher lock")
	e.insert("a", "a=done")
	e.waitCounts(20*time.Second, map[string]int{"done": 1})

	waiting := startBinary(t, "waiting standby", e.conf, e.url, "-standby")
	waiting.awaitLog(20*time.Second, "standby: waiting for the dispatcher lock")
	sigterm(t, waiting)

	standby := startBinary(t, "standby", e.conf, e.url, "-standby")
	standby.awaitLog(20*time.Second, "standby: waiting for the dispatcher lock")
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	standby.awaitLog(20*time.Second, "holding the dispatcher lock")
	e.insert("a", "a=done")
	e.waitCounts(20*time.Second, map[string]int{"done": 2})
	sigterm(t, standby)

	plain := startBinary(t, "restarted dispatcher", e.conf, e.url)
	plain.awaitLog(20*time.Second, "holding the dispatcher lock")
	e.insert("a", "a=done")
	e.waitCounts(20*time.Second, map[string]int{"done": 3})
	sigterm(t, plain)
}

// The dispatcher's database sessions but its lock's are ended again and again
// (pg_terminate_backend) while messages flow through two stages that answer
// their transitions (so every transaction carries verdicts). A session ended
// before its transaction's COMMIT ran is known not to have committed: the
// retry resets nothing and doubts no verdict, so every message is run once per
// stage, and nothing is lost.
func TestEndedSessionsCostNoResetAndNoMessageRunsTwice(t *testing.T) {
	t.Parallel()
	const n, kills = 400, 12
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 60\n"+stages(2, 4, "a", "b"))
	d := startBinary(t, "dispatcher", e.conf, e.url)
	d.awaitLog(20*time.Second, "holding the dispatcher lock")
	ctx := context.Background()
	ended := 0
	for i := range kills {
		e.insertN("a", "a=sleep:2+answer:0 >b;b=sleep:2+answer:0 >done", n/kills)
		time.Sleep(time.Duration(50+i*10) * time.Millisecond)
		var k int
		err := e.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid)) FROM pg_stat_activity a
			WHERE (a.application_name = $1 OR a.application_name LIKE $1 || ' %')
			  AND a.pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
			      AND classid = 1885696115 AND objid = 1684632432 AND objsubid = 1)`, d.appName()).Scan(&k)
		if err != nil {
			t.Fatal(err)
		}
		ended += k
	}
	want := kills * (n / kills)
	e.waitCounts(60*time.Second, map[string]int{"done": want})
	sigterm(t, d)
	t.Logf("%d sessions ended over %d kills", ended, kills)
	if ended < kills {
		t.Errorf("only %d sessions ended over %d kills; want the kills to hit", ended, kills)
	}
	twice := 0
	for id, pids := range e.handledBy() {
		if len(pids) != 2 {
			twice++
			if twice <= 3 {
				t.Errorf("message %d run %d times (by pids %v); want once at a and once at b", id, len(pids), pids)
			}
		}
	}
	if twice > 0 {
		t.Errorf("%d messages were not run exactly once per stage", twice)
	}
	if resets := d.logs.lines("running rows this dispatcher does not hold"); len(resets) > 0 {
		t.Errorf("the dispatcher reset rows after its sessions were ended: %v", resets)
	}
}
