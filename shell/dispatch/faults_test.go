package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/netfault"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/writelog"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Network faults between the real pepsi-dispatch (the binary) and PostgreSQL,
// made by a netfault proxy: resets, a silent black hole, latency, refused
// connections, and the standby race. Every queue write is logged by a trigger,
// so the tests can check who wrote which message and when.

// testSeed returns a seed for a randomized test (pgtest.Seed).
func testSeed(t *testing.T) uint64 { return pgtest.Seed(t, "./shell/dispatch/") }

// startProxy starts a netfault proxy in front of the server of dbURL.
func startProxy(t *testing.T, dbURL string) *netfault.Proxy {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netfault.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// rewriteURL returns dbURL with its host:port replaced (if hostport is not
// empty) and the given query parameters set.
func rewriteURL(t *testing.T, dbURL, hostport string, params ...string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if hostport != "" {
		u.Host = hostport
	}
	q := u.Query()
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// installWriteLog installs the write log (internal/testenv/writelog) in e's database.
func (e *env) installWriteLog() {
	e.t.Helper()
	if err := writelog.Install(context.Background(), e.db); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) queueWrites() []writelog.Write {
	e.t.Helper()
	ws, err := writelog.Read(context.Background(), e.db, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return ws
}

// binDaemon is pepsi-dispatch run as a process.
type binDaemon struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	logs *logBuffer
	done chan struct{}
	err  error
}

// startBinary runs pepsi-dispatch -c conf -database database, logging JSON;
// the end of the test kills it if it still runs.
func startBinary(t *testing.T, name, conf, database string, extra ...string) *binDaemon {
	t.Helper()
	args := append([]string{"-c", conf, "-database", database, "-log-format", "json"}, extra...)
	cmd, _ := command(context.Background(), args...)
	d := &binDaemon{t: t, name: name, cmd: cmd, logs: &logBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.logs, d.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(d.done)
		d.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(exitWait):
				_ = cmd.Process.Kill()
				<-d.done
			}
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, d.logs.String())
		}
	})
	return d
}

// appName is the application_name the binary's own sessions carry.
func (d *binDaemon) appName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return fmt.Sprintf("pepsi-dispatch %s %d", host, d.cmd.Process.Pid)
}

// awaitLog waits until the daemon has logged a line containing msg, and returns
// the first such line's time.
func (d *binDaemon) awaitLog(timeout time.Duration, msg string) time.Time {
	d.t.Helper()
	var at time.Time
	waitFor(d.t, timeout, fmt.Sprintf("%s to log %q", d.name, msg), func() (bool, string) {
		ls := d.logs.lines(msg)
		if len(ls) == 0 {
			return false, "not yet"
		}
		at = ls[0].time()
		return true, ""
	})
	return at
}

// exited waits for the process to end and returns its exit code.
func (d *binDaemon) exited(timeout time.Duration) int {
	d.t.Helper()
	select {
	case <-d.done:
		return exitCode(d.t, d.err)
	case <-time.After(timeout):
		d.t.Fatalf("%s did not exit within %v", d.name, timeout)
		return -1
	}
}

// setWorkerDatabase points the configuration's [pepsi] DATABASE, which the
// stage programs use, at dbURL; the test's own pool stays on the direct URL.
func (e *env) setWorkerDatabase(dbURL string) {
	e.t.Helper()
	b, err := os.ReadFile(e.conf)
	if err != nil {
		e.t.Fatal(err)
	}
	text := strings.Replace(string(b), "DATABASE = "+e.url+"\n", "DATABASE = "+dbURL+"\n", 1)
	if err := os.WriteFile(e.conf, []byte(text), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// awaitDone waits until at least n messages are done.
func (e *env) awaitDone(timeout time.Duration, n int) {
	e.t.Helper()
	waitFor(e.t, timeout, fmt.Sprintf("%d messages done", n), func() (bool, string) {
		got, last := e.done()
		return got >= n, last
	})
}

const slowTwoHops = "a=sleep:20+advance:b;b=sleep:20+done"

// The dispatcher, its listener and pool, and every worker reach PostgreSQL
// through a proxy that breaks in a seeded order: all connections reset,
// latency, refused connections, a black hole long enough for the lock check to
// notice. Each phase feeds new messages and breaks the network while they run.
// Afterwards every message is done, none is left running, and no worker wrote
// a message its dispatcher did not hold.
func TestNetworkFaultsLoseNothingAndAreNoticedInBoundedTime(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 2\n"+stagesOf("libstage", 2, 8, "a", "b"))
	e.installWriteLog()
	p := startProxy(t, e.url)
	e.setWorkerDatabase(rewriteURL(t, e.url, p.Addr(), "application_name", "worker-A"))
	d := startBinary(t, "dispatcher", e.conf, rewriteURL(t, e.url, p.Addr()))
	d.awaitLog(20*time.Second, "holding the dispatcher lock")

	faults := []string{"reset", "latency", "refuse", "blackhole"}
	rng.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	const perPhase = 150
	for i, fault := range faults {
		e.insertN("a", slowTwoHops, perPhase)
		e.awaitDone(60*time.Second, i*perPhase+perPhase/5)
		restarts := len(d.logs.lines("restarting the dispatcher session"))
		start := time.Now()
		switch fault {
		case "reset":
			p.ResetAll()
			waitFor(t, 10*time.Second, "the dispatcher to notice the reset", func() (bool, string) {
				return len(d.logs.lines("restarting the dispatcher session")) > restarts, "not yet"
			})
		case "latency":
			p.SetLatency(time.Duration(20+rng.IntN(80)) * time.Millisecond)
			time.Sleep(2 * time.Second)
		case "refuse":
			p.Refuse()
			p.ResetAll()
			waitFor(t, 10*time.Second, "the dispatcher to notice the reset", func() (bool, string) {
				return len(d.logs.lines("restarting the dispatcher session")) > restarts, "not yet"
			})
			time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
		case "blackhole":
			lost := len(d.logs.lines("the dispatcher lock's connection died"))
			p.BlackHole()
			// The lock is checked after 10 s of quiet, and the check must answer
			// within 5 s: the dispatcher knows within about 15 s.
			waitFor(t, 30*time.Second, "the dispatcher to notice the black hole", func() (bool, string) {
				return len(d.logs.lines("the dispatcher lock's connection died")) > lost, "not yet"
			})
		}
		noticed := time.Since(start)
		p.Heal()
		healed := time.Now()
		e.awaitDone(60*time.Second, i*perPhase+perPhase/2)
		t.Logf("%s: noticed or endured for %v; work resumed %v after healing", fault,
			noticed.Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	}
	e.waitCounts(120*time.Second, map[string]int{"done": len(faults) * perPhase})
	if bad := writelog.CheckOwnership(e.queueWrites(), map[string]string{"worker-A": d.appName()}); len(bad) > 0 {
		t.Errorf("%d messages written by a worker whose dispatcher did not hold them:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.exited(exitWait); code != 0 {
		t.Errorf("dispatcher exited %d after SIGTERM; want 0", code)
	}
}

// The standby race. Dispatcher A and its workers reach PostgreSQL through a
// proxy; standby B waits for the lock on a direct connection. The proxy goes
// silent. A's lock check notices within about 15 s and A kills its workers;
// then the server ends A's sessions (what its keepalive does, at the earliest
// 40 s after A went silent: store.BoundSilence), which releases the lock,
// and B takes over, resetting and rerunning what A held. The network heals a
// seeded moment later and A, finding B holding the lock, exits 3. At no time
// was a message written, by a worker or by a dispatcher for its worker, on
// behalf of a dispatcher that did not hold it, and every message ends done.
func TestStandbyTakesOverFromABlackHoledDispatcherAndNoMessageIsWrittenByBoth(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(testSeed(t), 0))
	text := "[pepsi-dispatch]\nPOLL_INTERVAL = 2\n" + stagesOf("libstage", 2, 8, "a", "b")
	e := newEnv(t, text)
	e.installWriteLog()
	p := startProxy(t, e.url)
	e.setWorkerDatabase(rewriteURL(t, e.url, p.Addr(), "application_name", "worker-A"))
	eb := newEnvAt(t, e.url, text)
	eb.setWorkerDatabase(rewriteURL(t, e.url, "", "application_name", "worker-B"))

	const n = 600
	e.insertN("a", slowTwoHops, n)
	a := startBinary(t, "dispatcher A", e.conf, rewriteURL(t, e.url, p.Addr()))
	a.awaitLog(20*time.Second, "holding the dispatcher lock")
	b := startBinary(t, "standby B", eb.conf, e.url, "-standby")
	b.awaitLog(20*time.Second, "standby: waiting for the dispatcher lock")
	e.awaitDone(60*time.Second, n/10)

	p.BlackHole()
	cut := time.Now()
	noticed := a.awaitLog(30*time.Second, "the dispatcher lock's connection died")
	p.DropServerSides() // the server gives up on A: its lock is free
	dropped := time.Now()
	took := b.awaitLog(20*time.Second, "holding the dispatcher lock")
	time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
	p.Heal()
	t.Logf("A noticed the black hole after %v; B took the lock %v after the server dropped A",
		noticed.Sub(cut).Round(time.Millisecond), took.Sub(dropped).Round(time.Millisecond))

	if code := a.exited(60 * time.Second); code != 3 {
		t.Errorf("A exited %d once the network healed; want 3 (another dispatcher holds the lock)", code)
	}
	e.waitCounts(120*time.Second, map[string]int{"done": n})
	workers := map[string]string{"worker-A": a.appName(), "worker-B": b.appName()}
	writes := e.queueWrites()
	if bad := writelog.CheckOwnership(writes, workers); len(bad) > 0 {
		t.Errorf("%d messages written by a worker whose dispatcher did not hold them:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	byB := 0 // transitions written by B's workers, or by B for them
	for _, w := range writes {
		if (w.App == "worker-B" || w.App == b.appName()) && w.OldStatus == "running" &&
			(w.NewStatus != "pending" || w.OldStage != w.NewStage) {
			byB++
		}
	}
	if byB == 0 {
		t.Errorf("B's pipeline moved no message: the takeover was not exercised")
	}
}

// After losing its lock, a dispatcher may find the lock held by its own
// earlier session, cut off by the network and not yet ended by the server (it
// waits 40 s: store.BoundSilence). Here a stand-in session with the
// dispatcher's application_name queues for the lock before the dispatcher's
// lock backend is ended, so it holds the lock when the dispatcher asks again.
// The dispatcher ends it and carries on, instead of exiting 3 ("another
// dispatcher is running") because of itself.
func TestARestartedDispatcherEndsItsOwnStaleLockSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	c := e.conn()
	d := e.start()
	e.insert("a", "a=done")
	e.waitCounts(15*time.Second, map[string]int{"done": 1})

	cfg, err := pgx.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = store.AppName()
	stale, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close(context.Background())
	var stalePID int32
	if err := stale.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&stalePID); err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() {
		_, err := stale.Exec(context.Background(), "SELECT pg_advisory_lock($1)", store.LockKey)
		granted <- err
	}()
	waitFor(t, 10*time.Second, "the stand-in session to wait for the lock", func() (bool, string) {
		n := e.scalar(`SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted`, stalePID)
		return n == 1, fmt.Sprintf("%d waiting", n)
	})
	if n := e.terminate(c, lockBackend); n != 1 {
		t.Fatalf("ended %d lock backends; want 1", n)
	}
	// The stand-in gets the lock; the dispatcher may end it before its
	// answer is read (57P01), which is what is being proved below.
	if err := <-granted; err != nil && !isAdminShutdown(err) {
		t.Fatalf("the stand-in session did not get the lock: %v", err)
	}
	waitFor(t, 20*time.Second, "the dispatcher to end the stale session and hold the lock again", func() (bool, string) {
		return len(d.logs.lines("own earlier session")) >= 1 && len(d.logs.lines("holding the dispatcher lock")) == 2, "not yet"
	})
	e.insert("a", "a=done")
	e.waitCounts(15*time.Second, map[string]int{"done": 2})
	d.stopClean()
}

// isAdminShutdown reports whether err is a session ended by
// pg_terminate_backend (SQLSTATE 57P01).
func isAdminShutdown(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57P01"
}
