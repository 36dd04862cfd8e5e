package dispatch_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
)

// Tests of the daemon's own loop: how it turns what happens (the listener, the
// lock, signals, queue transactions) into core events, and in which order.

// conn returns a connection of e's pool held for the whole test, for statements
// that must still run while the database refuses new connections.
func (e *env) conn() *pgxpool.Conn {
	e.t.Helper()
	c, err := e.db.Acquire(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(c.Release)
	return c
}

// terminate ends the dispatcher's backends that match where (a condition on
// pg_stat_activity a and pg_locks l, outer-joined on an advisory lock) and returns
// how many it ended.
func (e *env) terminate(c *pgxpool.Conn, where string) int {
	e.t.Helper()
	var n int
	err := c.QueryRow(context.Background(), `
		SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a
		LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
		WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
		  AND a.application_name LIKE 'pepsi-dispatch %' AND (`+where+`)`).Scan(&n)
	if err != nil {
		e.t.Fatalf("terminate backends where %s: %v", where, err)
	}
	return n
}

// allowConnections returns a function that makes e's database accept new
// connections or refuse them (sessions already open go on); it accepts them again
// when the test ends.
func (e *env) allowConnections() func(bool) {
	e.t.Helper()
	ctx := context.Background()
	var db string
	if err := e.db.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		e.t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, pgtest.AdminURL(e.t)) // a database may not refuse its own sessions
	if err != nil {
		e.t.Fatal(err)
	}
	allow := func(on bool) {
		if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %q WITH ALLOW_CONNECTIONS %t`, db, on)); err != nil {
			e.t.Error(err)
		}
	}
	e.t.Cleanup(func() {
		allow(true)
		admin.Close(context.Background())
	})
	return allow
}

// Backends of the dispatcher, as terminate selects them.
const (
	lockBackend     = `l.pid IS NOT NULL AND a.application_name NOT LIKE '% gate'`
	listenerBackend = `a.query = 'LISTEN ingress'`
)

// The listener reconnects after an outage of its own (here its backend alone was
// ended; no queue write failed). Notifications sent meanwhile went nowhere, so the
// rows they announced must be claimed when it is back, not at the next heartbeat.
func TestRowsInsertedWhileTheListenerWasAwayAreClaimedWhenItIsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 1h\n"+stages(1, 4, "a"))
	c := e.conn()
	ctx := context.Background()
	allow := e.allowConnections()
	d := e.start()
	e.insert("a", "a=done")
	e.waitCounts(10*time.Second, map[string]int{"done": 1})

	// Keep the listener from reconnecting at once, then cut it.
	allow(false)
	if n := e.terminate(c, listenerBackend); n != 1 {
		t.Fatalf("ended %d listener backends; want 1", n)
	}
	waitFor(t, 10*time.Second, "the listener to notice", func() (bool, string) {
		return len(d.logs.lines("ingress listener lost the database")) > 0, "not yet"
	})
	// Its NOTIFY reaches no one.
	if _, err := c.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload) VALUES ('a', 'a=done')`); err != nil {
		t.Fatal(err)
	}
	allow(true)
	waitFor(t, 15*time.Second, "the listener to be back", func() (bool, string) {
		return len(d.logs.lines("ingress listener is back")) > 0, "not yet"
	})
	e.waitCounts(5*time.Second, map[string]int{"done": 2})
	d.stopClean()
}

// A signal asks the dispatcher to stop. If the lock is lost while it is stopping,
// it must not start a new session and run on as if no one had asked.
func TestShutdownIsNotForgottenWhenTheLockIsLostWhileStopping(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nSTOP_GRACE = 30s\n"+stages(1, 4, "a"))
	c := e.conn()
	e.insert("a", "a=sleep:4000+done")
	d := e.start()
	waitFor(t, 10*time.Second, "the worker to be running the message", func() (bool, string) {
		n := len(e.records("handle"))
		return n == 1, fmt.Sprintf("%d messages being handled", n)
	})
	d.signals <- syscall.SIGTERM
	waitFor(t, 5*time.Second, "the shutdown to begin", func() (bool, string) {
		return len(d.logs.lines("shutting down")) > 0, "not yet"
	})
	if n := e.terminate(c, lockBackend); n != 1 {
		t.Fatalf("ended %d lock backends; want 1", n)
	}
	code, err := d.wait(15 * time.Second)
	if code != dispatch.ExitUnwritten {
		t.Errorf("after SIGTERM and a lost lock: exit %d, err %v; want exit %d (its worker was killed, the next start resets the row)",
			code, err, dispatch.ExitUnwritten)
	}
	if n := len(d.logs.lines("holding the dispatcher lock")); n != 1 {
		t.Errorf("took the lock %d times; want once (no new session after the signal)", n)
	}
}

// A signal that stops the dispatcher while it waits to retake a lost lock ends a
// run whose last session left rows running: that is not a clean exit.
func TestSignalWhileRetakingALostLockExitsOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	c := e.conn()
	allow := e.allowConnections()
	ids := e.insert("a", "a=hang")
	d := e.start()
	waitFor(t, 10*time.Second, "the worker to hold the message", func() (bool, string) {
		n := len(e.records("handle"))
		return n == 1, fmt.Sprintf("%d messages being handled", n)
	})
	allow(false)
	if n := e.terminate(c, lockBackend); n != 1 {
		t.Fatalf("ended %d lock backends; want 1", n)
	}
	waitFor(t, 10*time.Second, "the dispatcher to try to retake the lock", func() (bool, string) {
		return len(d.logs.lines("cannot reach the database to take the dispatcher lock")) > 0, "not yet"
	})
	code, err := d.stop()
	if code != dispatch.ExitUnwritten {
		t.Errorf("stopped while retaking the lock: exit %d, err %v; want exit %d (the lost session's row is left for the next start)",
			code, err, dispatch.ExitUnwritten)
	}
	// The exit status is explained (it was once only "pepsi-dispatch
	// stopped exit=1", with no line saying why, not even the signal's).
	if len(d.logs.lines("stopped while retaking the dispatcher lock")) != 1 {
		t.Errorf("no line says why it exits 1; log:\n%s", d.logs.String())
	}
	e.expectRow(ids[0], "running", "a", "")
}

// blockingHandler is a slog.Handler that writes to next and, for a record whose
// message contains block, first tells reached and then waits for release: a way
// to hold the dispatcher's loop at a chosen point (the loop logs the core's Log
// commands itself).
type blockingHandler struct {
	slog.Handler
	block   string
	reached chan<- struct{}
	release <-chan struct{}
}

func (h blockingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.block) {
		select {
		case h.reached <- struct{}{}:
		default:
		}
		<-h.release
	}
	return h.Handler.Handle(ctx, r)
}

func (h blockingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h blockingHandler) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// startBlocking is start with a log that holds the loop at every record whose
// message contains block until the test sends on release; reached gets a value
// when it is held.
func (e *env) startBlocking(block string) (d *daemon, reached <-chan struct{}, release chan<- struct{}) {
	r := make(chan struct{}, 1)
	rel := make(chan struct{})
	d = &daemon{t: e.t, name: "dispatcher", signals: make(chan os.Signal, 2), done: make(chan struct{}), logs: &logBuffer{}}
	h := blockingHandler{Handler: slog.NewJSONHandler(d.logs, &slog.HandlerOptions{Level: slog.LevelDebug}), block: block, reached: r, release: rel}
	go func() {
		defer close(d.done)
		d.code, d.err = dispatch.Run(context.Background(), dispatch.Options{
			Config: e.cfg, Database: e.url, Log: slog.New(h), Signals: d.signals,
		})
	}()
	e.t.Cleanup(func() {
		close(rel)
		select {
		case <-d.done:
		default:
			d.signals <- syscall.SIGTERM
			d.signals <- syscall.SIGTERM
			select {
			case <-d.done:
			case <-time.After(30 * time.Second):
				e.t.Errorf("dispatcher did not exit within 30s of two signals at the end of the test")
			}
		}
		if e.t.Failed() {
			e.t.Logf("dispatcher log:\n%s", d.logs.String())
		}
	})
	return d, r, rel
}

// A queue transaction fails, and the database answers the probe that follows
// before the loop has taken the failure (here the loop is held logging a crash).
// DatabaseUp must reach the core after the failure, or the core waits for the
// database forever: the probe reported once, and nothing else will.
//
// Whether the loop then takes the probe's report or the failure first is the
// select's coin; each round gives the wrong order an even chance, so the rounds
// together find it with near certainty.
func TestDatabaseUpReachesTheCoreAfterTheFailureItAnswers(t *testing.T) {
	t.Parallel()
	const rounds = 6
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 1h\nWORKER_IDLE_TIMEOUT = 1h\n"+stages(1, 2, "a"))
	ctx := context.Background()
	c := e.conn()
	d, reached, release := e.startBlocking("crashed (signal killed); failed message")
	for round := 1; round <= rounds; round++ {
		// A worker that has answered (so its death is a crash, not a failed
		// start), now holding a message it will never answer.
		ids := e.insert("a", "a=done", "a=hang")
		waitFor(t, 10*time.Second, "the worker to hold the hanging message", func() (bool, string) {
			r := e.row(ids[0])
			n := len(e.handledBy()[ids[1]])
			return r.Status == "done" && n == 1, fmt.Sprintf("first %s, second handled %d times", r, n)
		})
		starts := e.records("start")
		pid := starts[len(starts)-1].PID

		// The next queue transaction waits on a lock...
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE pepsi.queue IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.Exec(ctx, `NOTIFY ingress`); err != nil {
			t.Fatal(err)
		}
		var txPID int
		waitFor(t, 10*time.Second, "a queue transaction to wait for the lock", func() (bool, string) {
			err := e.db.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND application_name LIKE 'pepsi-dispatch %'`).Scan(&txPID)
			return err == nil, fmt.Sprint(err)
		})
		// ...while the worker crashes and the loop is held logging it...
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case <-reached:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the loop never logged the crash", round)
		}
		// ...the transaction fails, and the database is there for the probe.
		if _, err := e.db.Exec(ctx, `SELECT pg_cancel_backend($1)`, txPID); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // a probe started with the failure has answered by now
		release <- struct{}{}

		waitFor(t, 10*time.Second, fmt.Sprintf("round %d: the crashed worker's message to be failed", round), func() (bool, string) {
			r := e.row(ids[1])
			return r.Status == "failed", r.String()
		})
	}
	d.stopClean()
}

// writeScript writes an executable shell script into e's directory.
func (e *env) writeScript(name, text string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+text), 0o755); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// After losing the lock the loop reads no more events, but what the killed
// workers' pipes still deliver must not block the pool: the new session must
// start at once, not after the pool's 30 s close timeout. Here the output comes
// from a process the worker left outside its group (out of reach of the kill),
// which writes more lines than the event buffer holds after the session ended.
func TestOutputArrivingAfterTheLockIsLostDoesNotHoldUpTheNextSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[stage-a]\nPROGRAM = @DIR@/leaky\n")
	e.writeScript("leaky", "setsid sh -c 'sleep 1; yes 0 | head -n 30000' &\necho started >> \"$(dirname \"$3\")/leaky.started\"\nexec sleep 600\n")
	c := e.conn()
	e.insert("a", "a=done")
	d := e.start()
	waitFor(t, 10*time.Second, "the worker to start", func() (bool, string) {
		_, err := os.Stat(filepath.Join(e.dir, "leaky.started"))
		return err == nil, fmt.Sprint(err)
	})
	if n := e.terminate(c, lockBackend); n != 1 {
		t.Fatalf("ended %d lock backends; want 1", n)
	}
	lost := time.Now()
	waitFor(t, 20*time.Second, "the next session to take the lock", func() (bool, string) {
		return len(d.logs.lines("holding the dispatcher lock")) == 2, "not yet"
	})
	if took := time.Since(lost); took > 10*time.Second {
		t.Errorf("the next session took the lock %v after the last was lost; want at once", took.Round(time.Second))
	}
	if n := len(d.logs.lines("workers did not all exit")); n != 0 {
		t.Errorf("closing the lost session's workers timed out %d times; want none", n)
	}
}

// limitedRole creates a login role that may use the queue and open at most limit
// connections at once, and returns e's URL for it and a function that changes the
// limit (-1: none). The role is dropped when the test ends.
func (e *env) limitedRole(limit int) (string, func(int)) {
	e.t.Helper()
	ctx := context.Background()
	role := fmt.Sprintf("pepsi_limited_%d", time.Now().UnixNano())
	for _, q := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN CONNECTION LIMIT %d`, role, limit),
		`GRANT USAGE ON SCHEMA pepsi TO ` + role,
		`GRANT ALL ON ALL TABLES IN SCHEMA pepsi TO ` + role,
		`GRANT ALL ON ALL SEQUENCES IN SCHEMA pepsi TO ` + role,
	} {
		if _, err := e.db.Exec(ctx, q); err != nil {
			e.t.Fatalf("%s: %v", q, err)
		}
	}
	e.t.Cleanup(func() {
		for _, q := range []string{
			`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '` + role + `'`,
			`DROP OWNED BY ` + role,
			`DROP ROLE ` + role,
		} {
			if _, err := e.db.Exec(ctx, q); err != nil {
				e.t.Errorf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String(), func(n int) {
		if _, err := e.db.Exec(ctx, fmt.Sprintf(`ALTER ROLE %s CONNECTION LIMIT %d`, role, n)); err != nil {
			e.t.Error(err)
		}
	}
}

// The server refuses a connection for a while (too many connections: killed
// workers' backends still ending, another client's burst) just after the lock was
// taken. That is an outage to wait out, not a database the dispatcher cannot use.
func TestAConnectionRefusedWhileCheckingTheSchemaIsWaitedOutNotFatal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	// One connection: the lock's. The pool's first one is refused.
	u, limit := e.limitedRole(1)
	e.url = u // the dispatcher's; workers use pepsi.conf's
	d := e.start()
	waitFor(t, 10*time.Second, "the dispatcher to take the lock", func() (bool, string) {
		return len(d.logs.lines("holding the dispatcher lock")) > 0, "not yet"
	})
	time.Sleep(time.Second)
	select {
	case <-d.done:
		t.Fatalf("the dispatcher exited %d (%v) when a connection was refused; want it to wait for the database", d.code, d.err)
	default:
	}
	if n := len(d.logs.lines("holding the dispatcher lock")); n > 2 {
		t.Errorf("took the lock %d times in a second; want a retry that backs off", n)
	}
	limit(-1)
	e.insert("a", "a=done")
	e.waitCounts(15*time.Second, map[string]int{"done": 1})
	d.stopClean()
}

// A queue transaction waits on a row lock when the lock is lost. Ending the
// session closes its connection; were the server to go on waiting, it would, once
// the row is free, run the rest of the batch it already has, COMMIT included, and
// a claim committed after the next session's start-up reset would leave a row
// running that no one holds. (What ends it today is the cancel request pgx sends,
// asynchronously, when it closes a connection whose context ended; see the review
// notes on a cancel request that cannot reach the server.)
func TestATransactionInFlightWhenTheLockIsLostEndsBeforeTheNextSessionStarts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 1h\n"+stages(1, 4, "a"))
	ctx := context.Background()
	c := e.conn()
	ids := e.insert("a", "a=done")
	// The first session's claim will wait for this row.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`, ids[0]); err != nil {
		t.Fatal(err)
	}
	waiting := func(since time.Time) int {
		var n int
		err := e.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND application_name LIKE 'pepsi-dispatch %' AND backend_start > $1`, since).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	d := e.start()
	waitFor(t, 10*time.Second, "the first session's claim to wait for the row", func() (bool, string) {
		return waiting(time.Time{}) == 1, "not yet"
	})
	var now time.Time
	if err := e.db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if n := e.terminate(c, lockBackend); n != 1 {
		t.Fatalf("ended %d lock backends; want 1", n)
	}
	waitFor(t, 10*time.Second, "the next session's claim to wait for the row", func() (bool, string) {
		return waiting(now) == 1, "not yet"
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitCounts(10*time.Second, map[string]int{"done": 1})
	d.stopClean()
}

// A signal that comes as the dispatcher takes its lock is for this start: the
// wait for the lock took it, and the lock was taken all the same. The
// dispatcher exits, rather than run on deaf to it until a second signal. (The
// log holds acquire right after the lock is taken, while the signal is sent
// and taken.)
func TestASignalAsTheLockIsTakenStopsTheDispatcher(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 2, "a"))
	d, reached, release := e.startBlocking("holding the dispatcher lock")
	select {
	case <-reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the dispatcher did not take its lock within 20s")
	}
	d.signals <- syscall.SIGTERM
	waitFor(t, 10*time.Second, "the wait for the lock to take the signal", func() (bool, string) {
		return len(d.signals) == 0, "still in the channel"
	})
	release <- struct{}{}
	if code, err := d.wait(exitWait); code != dispatch.ExitOK || err != nil {
		t.Errorf("signalled as it took the lock: exit %d, err %v; want exit 0, no error", code, err)
	}
	if n := len(d.logs.lines("signal received while taking the dispatcher lock")); n != 1 {
		t.Errorf("%d log lines about the signal that came with the lock; want 1", n)
	}
}
