package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// lockRow holds row id locked (SELECT … FOR UPDATE) in a transaction on a
// connection of its own, until the returned release (or the test's end).
func lockRow(t *testing.T, url string, id int64) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pgtest.Connect(t, url).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// rowLockWaiters counts the sessions of conn's database that wait for a lock
// (a row lock, in these tests).
func rowLockWaiters(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var n int
	err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// untilWaiting waits until a session of conn's database waits for a lock.
func untilWaiting(t *testing.T, conn *pgx.Conn, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); rowLockWaiters(t, conn) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never waited for the row", what)
		}
	}
}

// rowStatusLater is row id's status 200 ms after the lock on it was let go:
// time enough for a session still waiting for it to take it.
func rowStatusLater(t *testing.T, conn *pgx.Conn, id int64) string {
	t.Helper()
	time.Sleep(200 * time.Millisecond)
	var status string
	if err := conn.QueryRow(context.Background(), `SELECT status FROM pepsi.queue WHERE ingress_id = $1`, id).Scan(&status); err != nil {
		t.Fatal(err)
	}
	return status
}

// A step whose reply is lost while its transaction still runs in the server
// (here: its claim waits for a row another session holds, and the step's
// context ends) must not be able to commit later, after the core has sent the
// next transaction: a claim committing then would carry the exclusion list it
// was sent with and could take a row the dispatcher holds since. So the queue
// ends that session before it reports the failure: by the time Exec returns,
// no session of the queue's waits for the lock, and when the other session
// lets the row go, the claim does not take it.
func TestAStepInDoubtEndsBeforeTheFailureIsReported(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 1)
	release := lockRow(t, h.url, ids[0])
	observer := pgtest.Connect(t, h.url)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan []core.Event, 1)
	go func() { done <- h.Exec(ctx, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 1}}}}) }()
	untilWaiting(t, observer, "the claim")
	cancel()
	evs := <-done
	if errText(evs[0]) == "" {
		t.Fatalf("claim %v; want it to fail: its context ended while it waited for the row", evs)
	}
	if evs[0].(core.Claimed).Aborted {
		t.Fatalf("claim %v; want it in doubt (not Aborted): no answer came", evs)
	}
	if n := rowLockWaiters(t, observer); n != 0 {
		t.Fatalf("after the failed claim was reported, %d sessions still wait for the row; want its session ended", n)
	}
	release()
	if status := rowStatusLater(t, observer, ids[0]); status != "pending" {
		t.Errorf("row %d is %s after the claim in doubt was reported failed; want pending (the claim never commits)", ids[0], status)
	}
}

// When the session of a step in doubt cannot be ended at once (the server
// cannot be reached), no transaction is sent until it is: the next step fails
// as not sent (Aborted, so the core knows it changed nothing), and once the
// network heals, the next step first ends the old session, which then never
// commits.
func TestNoStepIsSentWhileASessionInDoubtLives(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	observer := pgtest.Connect(t, url)
	ctx := context.Background()
	var id int64
	if err := observer.QueryRow(ctx, `INSERT INTO pepsi.queue (stage) VALUES ('a') RETURNING ingress_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	release := lockRow(t, url, id)

	cfg, p := viaProxy(t, url)
	cfg.ConnectTimeout = 300 * time.Millisecond
	cfg.RuntimeParams["application_name"] = "pepsi-dispatch doubt-test"
	pcfg, err := pgxpool.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig = cfg
	pcfg.AfterConnect = store.NoteBackendStart // as the dispatcher's pool
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q := store.New(pool, testLogger(t))
	claim := func(op int64, stage string, timeout time.Duration) core.Claimed {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return q.Exec(c, []core.Command{core.Claim{Op: op, Caps: []core.Cap{{Stage: stage, N: 1}}}})[0].(core.Claimed)
	}

	done := make(chan core.Claimed, 1)
	go func() { done <- claim(1, "a", 30*time.Second) }()
	untilWaiting(t, observer, "the claim")
	// The connection breaks; the server does not notice (its session waits
	// for the lock, not for the client), and no new connection gets through.
	p.Refuse()
	p.ResetAll()
	if ev := <-done; ev.Err == "" || ev.Aborted {
		t.Fatalf("claim whose connection broke: %+v; want failed, in doubt", ev)
	}
	if ev := claim(3, "b", time.Second); ev.Err == "" || !ev.Aborted {
		t.Fatalf("claim while the session in doubt lives: %+v; want failed and Aborted (not sent)", ev)
	}
	// The session in doubt is named by its process id and the start the
	// pool noted as it connected (store.NoteBackendStart): the server's
	// session of that id and start is the one that waits for the row.
	doubt := q.Doubt()
	if len(doubt) != 1 || doubt[0].Start.IsZero() {
		t.Fatalf("sessions in doubt %+v; want one, with its start", doubt)
	}
	var waits bool
	if err := observer.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
		WHERE pid = $1 AND backend_start = $2 AND wait_event_type = 'Lock')`, doubt[0].PID, doubt[0].Start).Scan(&waits); err != nil || !waits {
		t.Fatalf("no session %d started at %s waits for the row (%v); want the one in doubt", doubt[0].PID, doubt[0].Start, err)
	}
	if n := rowLockWaiters(t, observer); n != 1 {
		t.Fatalf("%d sessions wait for the row while the server cannot be reached; want the one in doubt", n)
	}
	p.Heal()
	if ev := claim(5, "b", 10*time.Second); ev.Err != "" {
		t.Fatalf("claim once the network healed: %+v; want it to run", ev)
	}
	if n := rowLockWaiters(t, observer); n != 0 {
		t.Fatalf("%d sessions wait for the row after a step ran once healed; want the one in doubt ended first", n)
	}
	release()
	if status := rowStatusLater(t, observer, id); status != "pending" {
		t.Errorf("row %d is %s; want pending (the claim in doubt never commits)", id, status)
	}
}

// backendPIDs lists the server processes of conn's database other than
// conn's own.
func backendPIDs(t *testing.T, conn *pgx.Conn) []int32 {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid`)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// A step that fails on a connection that is still open (here: the claim's
// row cannot be read into the event, a client-side error after the server
// answered the whole transaction) leaves nothing running in the server, so
// the queue ends no session for it: the session it would end is its own
// pool's, alive and idle. The failure is still reported in doubt (the
// transaction may have committed), and the next step runs at once.
func TestAStepThatFailsOnAnOpenConnectionEndsNoSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 1)
	// attempts past what the claim reads it into (an int32): the row's scan
	// fails.
	h.exec(t, `ALTER TABLE pepsi.queue ALTER COLUMN attempts TYPE bigint`)
	h.exec(t, `UPDATE pepsi.queue SET attempts = 5000000000 WHERE ingress_id = $1`, ids[0])
	observer := pgtest.Connect(t, h.url)
	if ev := h.Exec(context.Background(), []core.Command{core.Flush{Op: 1, Life: 1, Seq: 1, StagePasses: 1}})[0]; errText(ev) != "" {
		t.Fatalf("a first step to open the pool's connection: %v", ev)
	}
	before := backendPIDs(t, observer)

	ev := h.Exec(context.Background(), []core.Command{core.Claim{Op: 2, Caps: []core.Cap{{Stage: "a", N: 1}}}})[0].(core.Claimed)
	if ev.Err == "" || ev.Aborted {
		t.Fatalf("claim of a row it cannot read: %+v; want failed, in doubt (not Aborted)", ev)
	}
	if after := backendPIDs(t, observer); !slices.Equal(before, after) {
		t.Errorf("server processes %v before the failed step, %v after; want none ended (the failed session is open and idle)", before, after)
	}
	if ev := h.Exec(context.Background(), []core.Command{core.Flush{Op: 3, Life: 1, Seq: 2, StagePasses: 1}})[0]; errText(ev) != "" {
		t.Errorf("the step after: %v; want it to run", ev)
	}
}

// sessionStart is when the server began conn's session.
func sessionStart(t *testing.T, conn *pgx.Conn) time.Time {
	t.Helper()
	var start time.Time
	if err := conn.QueryRow(context.Background(), `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	return start
}

// A session in doubt is ended, and waited for, by its process id and its
// start, which the dispatcher's pool notes as it connects
// (store.NoteBackendStart): the server gives a process id to another session
// once the first has gone, and such a later session, of this dispatcher's
// pool (the same application_name) or of another client, is neither ended
// nor waited for. Here two sessions in doubt name the process ids of two
// live sessions, with an earlier start (as the ids' first sessions had), and
// a third names a live session of the pool's application_name exactly: the
// next step ends the third, and only it, and runs at once. (Matched by
// process id and application_name alone, the step ended the first and
// waited 5 s for the second, then failed unsent.)
func TestADoubtEndsItsOwnSessionNotALaterOneWithItsProcessID(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "pepsi-dispatch reuse-test"
	pcfg, err := pgxpool.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig = cfg
	pcfg.AfterConnect = store.NoteBackendStart
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q := store.New(pool, testLogger(t))
	ofPool := func() *pgx.Conn {
		conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		return conn
	}
	same, other, doubtful := ofPool(), pgtest.Connect(t, url), ofPool()
	for _, c := range []*pgx.Conn{same, other} {
		q.AddDoubt(store.Backend{PID: int32(c.PgConn().PID()), Start: sessionStart(t, c).Add(-time.Second)})
	}
	q.AddDoubt(store.Backend{PID: int32(doubtful.PgConn().PID()), Start: sessionStart(t, doubtful)})

	began := time.Now()
	ev := q.Exec(ctx, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 1}}}})[0].(core.Claimed)
	if ev.Err != "" {
		t.Fatalf("step after the sessions in doubt: %+v (after %s); want it to run", ev, time.Since(began))
	}
	for name, c := range map[string]*pgx.Conn{"this pool's": same, "another client's": other} {
		if err := c.Ping(ctx); err != nil {
			t.Errorf("%s later session with a process id in doubt was ended: %v", name, err)
		}
	}
	observer := pgtest.Connect(t, url)
	var alive bool
	if err := observer.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, int32(doubtful.PgConn().PID())).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	if alive {
		t.Errorf("the session in doubt (process %d, its own start) lives on after the step; want it ended first", doubtful.PgConn().PID())
	}
}
