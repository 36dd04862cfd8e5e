package dispatch_test

import (
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
	// Past the lock's first health check (10 s of quiet), which a cancelled
	// check must not stall either.
	sigterm(t, standby)

	plain := startBinary(t, "restarted dispatcher", e.conf, e.url)
	plain.awaitLog(20*time.Second, "holding the dispatcher lock")
	e.insert("a", "a=done")
	e.waitCounts(20*time.Second, map[string]int{"done": 3})
	sigterm(t, plain)
}
