package store_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// waitFor bounds every wait for something the code under test must do.
const waitFor = 15 * time.Second

// logBuffer collects log lines; safe for the logger's concurrent use.
type logBuffer struct{ lockedbuf.Buffer }

// lines returns the logged lines at level ("WARN", "INFO", …).
func (b *logBuffer) lines(level string) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, "level="+level+" ") {
			out = append(out, l)
		}
	}
	return out
}

func newLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// listenerRun is a running Listen with its notices and its dial count.
type listenerRun struct {
	notices chan store.Notice
	dials   *atomic.Int64
	done    chan error
	cancel  context.CancelFunc
	logs    *logBuffer
}

// startListener runs Listen on a config marked with appName, so the test can
// find (and terminate) its backend.
func startListener(t *testing.T, url, appName string) *listenerRun {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = appName
	r := &listenerRun{notices: make(chan store.Notice, 100), dials: &atomic.Int64{}, done: make(chan error, 1)}
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		r.dials.Add(1)
		return dial(ctx, network, addr)
	}
	log, logs := newLogger()
	r.logs = logs
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.done <- store.Listen(ctx, cfg, log, func(n store.Notice) { r.notices <- n })
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// expect waits for the next notice and fails unless it is want.
func (r *listenerRun) expect(t *testing.T, want store.Notice, why string) {
	t.Helper()
	select {
	case got := <-r.notices:
		if got != want {
			t.Fatalf("%s: listener reported %v, want %v", why, got, want)
		}
	case <-time.After(waitFor):
		t.Fatalf("%s: listener reported nothing within %v, want %v", why, waitFor, want)
	}
}

func TestListenReportsIngressNotifications(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	r := startListener(t, url, "pgqueue-test-listener")
	r.expect(t, store.Listening, "start")
	holdGate(t, url) // a dispatcher waits: inserts notify
	writer := pgtest.Connect(t, url)
	if _, err := writer.Exec(t.Context(), "INSERT INTO pepsi.queue (stage) VALUES ('a'), ('b')"); err != nil {
		t.Fatal(err)
	}
	r.expect(t, store.Notified, "after an insert")
	if _, err := writer.Exec(t.Context(), "SELECT pg_notify('other', '')"); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(t.Context(), "SELECT pg_notify('ingress', 'second')"); err != nil {
		t.Fatal(err)
	}
	// The notification on another channel is not reported: the next one is ingress.
	r.expect(t, store.Notified, "after notifications on other and ingress")
	select {
	case n := <-r.notices:
		t.Fatalf("listener reported %v after the ingress notification; want nothing more", n)
	default:
	}
}

// TestListenReconnectsAfterItsBackendIsTerminated: one Down per outage, however
// many reconnects fail, then Up, one warning and one info line, and
// notifications flow again. Cancelling stops it promptly.
func TestListenReconnectsAfterItsBackendIsTerminated(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	holdGate(t, url) // a dispatcher waits: inserts notify
	const app = "pgqueue-test-reconnect"
	r := startListener(t, url, app)
	r.expect(t, store.Listening, "start")
	admin := pgtest.Connect(t, pgtest.AdminURL(t))
	ctx := t.Context()
	var db string
	if err := pgtest.Connect(t, url).QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}

	// An outage long enough for several reconnects to fail: the database
	// refuses connections while the listener's backend is terminated.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS false"); err != nil {
		t.Fatal(err)
	}
	var killed int
	err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = $1 AND application_name = $2`, db, app).Scan(&killed)
	if err != nil || killed != 1 {
		t.Fatalf("terminate the listener's backend: %d terminated, %v; want 1", killed, err)
	}
	r.expect(t, store.Down, "after its backend was terminated")
	dialsAtDown := r.dials.Load()
	deadline := time.Now().Add(waitFor)
	for r.dials.Load() < dialsAtDown+3 {
		if time.Now().After(deadline) {
			t.Fatalf("listener dialled %d times during the outage, want at least 3 retries", r.dials.Load()-dialsAtDown)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true"); err != nil {
		t.Fatal(err)
	}
	r.expect(t, store.Up, "after the database accepts connections again")

	if _, err := pgtest.Connect(t, url).Exec(ctx, "INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	r.expect(t, store.Notified, "after an insert once back")

	if warns := r.logs.lines("WARN"); len(warns) != 1 {
		t.Errorf("listener logged %d warnings for one outage, want 1:\n%s", len(warns), strings.Join(warns, "\n"))
	}
	if infos := r.logs.lines("INFO"); len(infos) != 1 || !strings.Contains(infos[0], "outage=") {
		t.Errorf("listener logged %q at info, want one line with the outage's duration", infos)
	}

	r.cancel()
	select {
	case err := <-r.done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Listen returned %v after cancel, want context.Canceled", err)
		}
		r.done <- err // for the cleanup
	case <-time.After(2 * time.Second):
		t.Fatal("Listen did not return within 2s of its context being cancelled")
	}
}

// Proves: a role's or database's idle_session_timeout does not end the
// listener's session, idle by design between notifications (found from
// outside: with it at 3 s on the role, the dispatcher logged "ingress
// listener lost the database" every 3 s while idle, and notifications sent
// meanwhile were lost). Here the setting comes with the connection.
func TestAnIdleSessionTimeoutDoesNotEndTheListenersSession(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	var version int
	if err := pgtest.Connect(t, url).QueryRow(t.Context(), `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 140000 {
		t.Skipf("PostgreSQL %d has no idle_session_timeout", version)
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	r := startListener(t, url+sep+"idle_session_timeout=300", "pgqueue-test-idle-listener")
	r.expect(t, store.Listening, "start")
	select {
	case n := <-r.notices:
		t.Fatalf("listener reported %v while idle; want nothing (its session kept)", n)
	case <-time.After(1500 * time.Millisecond):
	}
}
