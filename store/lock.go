package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// LockKey is the PostgreSQL advisory lock a dispatcher holds, in session mode on
// a connection of its own, for its whole life: one dispatcher per database. It
// is the ASCII bytes of "pepsdisp"; pg_locks shows it as locktype advisory,
// classid 1885696115, objid 1684632432, objsubid 1, in the queue's database
// (advisory locks are per database, so dispatchers of different databases on one
// server do not exclude each other). Operators may look for it:
//
//	SELECT pid FROM pg_locks WHERE locktype = 'advisory'
//	  AND classid = 1885696115 AND objid = 1684632432 AND objsubid = 1
//	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database());
const LockKey int64 = 0x7065707364697370

// A standby waits for the lock in a blocking pg_advisory_lock on its own
// connection, which PostgreSQL grants the moment the holder's session ends
// (takeover costs one round trip, not a poll period). Every lockStandbyRecheck
// the wait is cancelled (a cancel request; the connection stays) and the holder
// looked up again, so the log names a new holder, and a standby whose own
// connection went silent finds out: if the server does not answer the cancel,
// the connection is dropped lockStandbyCancelGrace later and made again after
// lockStandbyRetry.
const (
	lockStandbyRecheck     = 30 * time.Second
	lockStandbyCancelGrace = 5 * time.Second
	lockStandbyRetry       = 250 * time.Millisecond
)

// lockTiming is how the lock's connection is watched (see healthTiming): every
// 10 s the lock is checked with a query that must answer within 5 s, so that a
// dispatcher cut off from its database by a silent partition learns within about
// 15 s that it can no longer count on the lock.
var lockTiming = healthTiming{idleCheck: 10 * time.Second, checkTimeout: 5 * time.Second, connectTimeout: 10 * time.Second}

// AppName is the application_name a dispatcher connects with, "pepsi-dispatch
// HOST PID", so that pg_stat_activity, and the error a second dispatcher
// reports, say which process holds the lock.
func AppName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return appName(host, os.Getpid())
}

// AppNameMax is the longest application_name PostgreSQL keeps
// (NAMEDATALEN - 1 bytes): it cuts a longer one, and the dispatcher, which
// finds its own sessions and an earlier dispatcher's by the name
// (pg_stat_activity), would no longer find them by the name it gave.
const AppNameMax = 63

// appName is AppName for host and pid, the host cut so that the whole fits
// in AppNameMax bytes (a cloud host's name alone may be longer).
func appName(host string, pid int) string {
	const prefix = "pepsi-dispatch "
	suffix := fmt.Sprintf(" %d", pid)
	if room := AppNameMax - len(prefix) - len(suffix); len(host) > room {
		host = host[:room]
	}
	return prefix + host + suffix
}

// CheckAppName refuses an application_name PostgreSQL would not keep as it
// is (longer than AppNameMax bytes, or not printable ASCII, which it
// rewrites): the dispatcher could not find its sessions by it.
func CheckAppName(name string) error {
	if len(name) > AppNameMax {
		return fmt.Errorf("application_name %q is %d bytes; PostgreSQL keeps at most %d, and the dispatcher finds its sessions by it", name, len(name), AppNameMax)
	}
	for _, r := range name {
		if r < ' ' || r > '~' {
			return fmt.Errorf("application_name %q holds %q; PostgreSQL rewrites all but printable ASCII, and the dispatcher finds its sessions by it", name, r)
		}
	}
	return nil
}

// HeldError is TryLock's answer when another session holds the dispatcher lock:
// who it is, as pg_stat_activity shows it. Fields are empty where PostgreSQL
// would not say (another role without pg_read_all_stats) or the holder left
// between the two queries.
type HeldError struct {
	// BackendPID is the server process of the holder's session: what
	// pg_stat_activity and pg_terminate_backend call its pid.
	BackendPID      int32
	ApplicationName string
	ClientAddr      string // "local" for a Unix-socket connection
	BackendStart    time.Time
}

// Backend names the holder's server session, for EndSession.
func (e *HeldError) Backend() Backend {
	return Backend{PID: e.BackendPID, Start: e.BackendStart}
}

// Dispatcher returns the host and operating-system pid of the dispatcher
// holding the lock, read from its application_name (AppName), or ok false when
// that was set to something else.
func (e *HeldError) Dispatcher() (host string, pid int, ok bool) {
	f := strings.Fields(e.ApplicationName)
	if len(f) != 3 || f[0] != "pepsi-dispatch" {
		return "", 0, false
	}
	pid, err := strconv.Atoi(f[2])
	if err != nil || pid <= 0 {
		return "", 0, false
	}
	return f[1], pid, true
}

func (e *HeldError) Error() string {
	if e.BackendPID == 0 {
		return "another pepsi-dispatch holds the dispatcher lock (it could not be identified; it may just have exited)"
	}
	start := "unknown"
	if !e.BackendStart.IsZero() {
		start = e.BackendStart.UTC().Format(time.RFC3339)
	}
	who := "a process that could not be identified (its application_name is not pepsi-dispatch's)"
	if host, pid, ok := e.Dispatcher(); ok {
		who = fmt.Sprintf("pid %d on %s", pid, host)
	}
	return fmt.Sprintf("another pepsi-dispatch holds the dispatcher lock: %s (PostgreSQL backend pid %d), application_name %s, client %s, connected since %s",
		who, e.BackendPID, conf.Quote(e.ApplicationName), orUnknown(e.ClientAddr), start)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// Lock is the held dispatcher lock. While it is held, no other dispatcher can
// run against the database. If its connection dies the lock is gone (PostgreSQL
// releases session locks with the session) and another dispatcher may start:
// Lost is closed, and the daemon must stop writing.
type Lock struct {
	conn *pgx.Conn
	log  *slog.Logger

	timing  healthTiming
	lost    chan struct{}
	lostErr error // set before lost is closed

	stopWatch context.CancelFunc
	watching  chan struct{} // closed when the watch goroutine has returned
	release   sync.Once
}

// TryLock connects with config (setting application_name to AppName() unless
// config sets one) and takes the dispatcher lock, or fails at once with a
// *HeldError naming the holder.
func TryLock(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger) (*Lock, error) {
	return tryLockTimed(ctx, config, log, lockTiming)
}

func tryLockTimed(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger, timing healthTiming) (*Lock, error) {
	conn, err := lockConn(ctx, config, timing.connectTimeout)
	if err != nil {
		return nil, err
	}
	got, held, err := tryLock(ctx, conn)
	if err != nil || !got {
		closeQuietly(conn)
		if err == nil {
			err = held
		}
		return nil, err
	}
	return newLock(conn, log, timing), nil
}

// WaitLock is TryLock for a standby: it waits for the lock, blocked in
// pg_advisory_lock on a connection of its own, until it gets it or ctx is done,
// reconnecting (every lockStandbyRetry) if that connection fails meanwhile. It
// logs who holds the lock when it starts waiting and when a recheck (every
// lockStandbyRecheck) finds the holder changed. Cancelling ctx cancels the
// blocked statement and closes the connection, so no lock is left behind.
func WaitLock(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger) (*Lock, error) {
	return waitLockTimed(ctx, config, log, lockStandbyRecheck)
}

func waitLockTimed(ctx context.Context, config *pgx.ConnConfig, log *slog.Logger, recheck time.Duration) (*Lock, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	config = config.Copy()
	var handler *waitHandler // the connection's (made again with it)
	config.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		handler = newWaitHandler(ctx, c)
		return handler
	}
	var conn *pgx.Conn
	var holder int32 = -1
	warned := false
	for {
		var err error
		if conn == nil {
			conn, err = lockConn(ctx, config, lockTiming.connectTimeout)
		}
		if err == nil {
			var got bool
			got, err = waitLockOnce(ctx, conn, log, recheck, &holder)
			if err == nil && got {
				handler.held.Store(true)
				log.Info("standby: took the dispatcher lock")
				return newLock(conn, log, lockTiming), nil
			}
			if err == nil {
				warned = false
				continue // a recheck: wait again at once
			}
			if ctx.Err() != nil {
				abandonWait(conn)
			}
			closeQuietly(conn) // a lock granted in doubt goes with the session
			conn = nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !warned {
			log.Warn("standby: cannot wait for the dispatcher lock; retrying", "err", err, "retry", lockStandbyRetry)
			warned = true
		}
		if err := sleep(ctx, lockStandbyRetry); err != nil {
			return nil, err
		}
	}
}

// waitHandler is what a cancelled context does to a standby's lock connection.
// At a recheck (the wait's own timeout) it sends a cancel request and keeps the
// connection (the default would close it), falling back to ending the read if
// the server does not answer within lockStandbyCancelGrace. Otherwise it ends
// the read at once, as the default does for every other connection, because
// the cancel request's way costs time for nothing:
//   - when the standby stops waiting (stop, WaitLock's ctx, is done), the
//     connection is closed anyway, and pgconn's cancel request sleeps 100 ms
//     after it is sent (abandonWait sends one without the sleep);
//   - once the lock is held (held), nothing runs in the server to cancel: the
//     Lock's watch waits for a notification the server never answers, so a
//     cancel request would leave that read, and with it Release and the idle
//     check, waiting out the whole grace.
type waitHandler struct {
	stop     context.Context
	held     atomic.Bool
	recheck  pgconn.CancelRequestContextWatcherHandler
	atOnce   pgconn.DeadlineContextWatcherHandler
	canceled ctxwatch.Handler // the one HandleCancel used, for HandleUnwatchAfterCancel
}

func newWaitHandler(stop context.Context, c *pgconn.PgConn) *waitHandler {
	return &waitHandler{
		stop:    stop,
		recheck: pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: lockStandbyCancelGrace},
		atOnce:  pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()},
	}
}

// HandleCancel and HandleUnwatchAfterCancel come in pairs, in that order, from
// one context watch (never concurrently), and held changes only between
// statements: the pair always goes to the same handler.
func (h *waitHandler) HandleCancel(ctx context.Context) {
	h.canceled = &h.recheck
	if h.held.Load() || h.stop.Err() != nil {
		h.canceled = &h.atOnce
	}
	h.canceled.HandleCancel(ctx)
}

func (h *waitHandler) HandleUnwatchAfterCancel() { h.canceled.HandleUnwatchAfterCancel() }

// abandonWait asks the server to cancel what conn's session runs (its wait for
// the lock) before the connection is closed: a backend blocked in a lock wait
// does not notice its client has gone, and would otherwise be granted the lock,
// and hold it until it finds out, ahead of another standby.
func abandonWait(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), lockTiming.checkTimeout)
	defer cancel()
	_ = conn.PgConn().CancelRequest(ctx) // best effort: the session ends when it next writes anyway
}

// waitLockOnce asks for the lock without waiting (naming the holder, logged if
// it changed), then waits for it for at most recheck. It answers false, nil
// when the wait ran out (or PostgreSQL's own lock_timeout ended it) and conn is
// fit to wait again; any error means conn must be closed.
func waitLockOnce(ctx context.Context, conn *pgx.Conn, log *slog.Logger, recheck time.Duration, holder *int32) (bool, error) {
	got, held, err := tryLock(ctx, conn)
	var pgErr *pgconn.PgError
	if err != nil && ctx.Err() == nil && !conn.IsClosed() && errors.As(err, &pgErr) && pgErr.Code == "57014" {
		// The cancel request of the last recheck is asynchronous: on a busy
		// server it can land on this statement instead. The connection is fine.
		return false, nil
	}
	if err != nil || got {
		return got, err
	}
	// A holder that cannot be named after one was (BackendPID 0) most likely
	// just let go: the wait below will tell, and the operator has nothing new
	// to read. A holder never named is logged as it is.
	if held.BackendPID != *holder && (held.BackendPID != 0 || *holder <= 0) {
		*holder = held.BackendPID
		log.Info("standby: waiting for the dispatcher lock", "holder", held.Error())
	}
	wctx, cancel := context.WithTimeout(ctx, recheck)
	defer cancel()
	_, err = conn.Exec(wctx, advisoryLockSQL, LockKey)
	if err == nil {
		return true, nil
	}
	if ctx.Err() == nil && !conn.IsClosed() && errors.As(err, &pgErr) &&
		(pgErr.Code == "57014" || pgErr.Code == "55P03") { // query_canceled, lock_not_available
		return false, nil
	}
	return false, fmt.Errorf("dispatcher lock: wait: %w", err)
}

// EndSession ends the server session s (pg_terminate_backend) if its
// application_name is still appName (and its start s.Start, where known),
// and waits (at most lockTiming's check timeout) until it is gone, so that a
// lock it held is free. The dispatcher uses it on its own earlier lock
// session, cut off by a network fault, which the server has not ended yet.
func EndSession(ctx context.Context, config *pgx.ConnConfig, s Backend, appName string) error {
	conn, err := lockConn(ctx, config, lockTiming.connectTimeout)
	if err != nil {
		return err
	}
	defer closeQuietly(conn)
	ctx, cancel := context.WithTimeout(ctx, lockTiming.checkTimeout)
	defer cancel()
	if _, err := endSessions(ctx, conn, []Backend{s}, appName); err != nil {
		return fmt.Errorf("end session %d: %w", s.PID, err)
	}
	return nil
}

// Backend names one server session: its process id and, where known, when
// it began (pg_stat_activity's backend_start). The server gives a process id
// to another session once the first has gone; with its start, a Backend
// names only the first.
type Backend struct {
	PID   int32
	Start time.Time // zero: not known
}

// backendArgs are the arrays that endSessionsSQL and anyAliveSQL take: the
// process ids and their starts (NULL where not known).
func backendArgs(bs []Backend) (pids []int32, starts []*time.Time) {
	for _, b := range bs {
		pids = append(pids, b.PID)
		var start *time.Time
		if !b.Start.IsZero() {
			start = &b.Start
		}
		starts = append(starts, start)
	}
	return pids, starts
}

// endSessions ends the sessions bs whose application_name is still appName,
// and waits (bounded by ctx) until they are gone: a session ends
// asynchronously after pg_terminate_backend. It answers how many of them it
// signalled (none: each had gone, or its process id names another session
// now).
func endSessions(ctx context.Context, db rowQuerier, bs []Backend, appName string) (signalled int64, err error) {
	pids, starts := backendArgs(bs)
	if err := db.QueryRow(ctx, endSessionsSQL, pids, starts, appName).Scan(&signalled); err != nil {
		return 0, fmt.Errorf("signal: %w", err)
	}
	if err := waitGone(ctx, db, bs, &appName); err != nil {
		return signalled, fmt.Errorf("wait for them to end: %w", err)
	}
	return signalled, nil
}

// lockConn connects (within timeout) with application_name set.
func lockConn(ctx context.Context, config *pgx.ConnConfig, timeout time.Duration) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	config = config.Copy()
	if config.RuntimeParams == nil {
		config.RuntimeParams = map[string]string{}
	}
	if config.RuntimeParams["application_name"] == "" {
		config.RuntimeParams["application_name"] = AppName()
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return nil, fmt.Errorf("dispatcher lock: connect: %w", err)
	}
	if err := keepWhileIdle(ctx, conn); err != nil {
		closeQuietly(conn)
		return nil, fmt.Errorf("dispatcher lock: %w", err)
	}
	return conn, nil
}

// keepWhileIdle turns off idle_session_timeout for conn's session. The lock's
// session idles by design (a check after 10 s of quiet), and a role's or
// database's idle_session_timeout below that ended it, and the lock with it,
// every few seconds: each time the dispatcher killed its workers and their
// messages ran again. PostgreSQL 13 has no such setting (SQLSTATE 42704):
// nothing to turn off.
func keepWhileIdle(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, "SET idle_session_timeout = 0")
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, &pgErr) && pgErr.Code == "42704" {
		return nil
	}
	return fmt.Errorf("turn off idle_session_timeout: %w", err)
}

// tryLock asks once. When the lock is held elsewhere it says by whom.
func tryLock(ctx context.Context, conn *pgx.Conn) (got bool, held *HeldError, err error) {
	if err := conn.QueryRow(ctx, tryAdvisoryLockSQL, LockKey).Scan(&got); err != nil {
		return false, nil, fmt.Errorf("dispatcher lock: %w", err)
	}
	if got {
		return true, nil, nil
	}
	held = &HeldError{}
	var start *time.Time
	err = conn.QueryRow(ctx, holderSQL, LockKey).Scan(&held.BackendPID, &held.ApplicationName, &held.ClientAddr, &start)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, held, nil
	}
	if err != nil {
		return false, nil, fmt.Errorf("dispatcher lock: find holder: %w", err)
	}
	if start != nil {
		held.BackendStart = *start
	}
	return false, held, nil
}

func newLock(conn *pgx.Conn, log *slog.Logger, timing healthTiming) *Lock {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lock{conn: conn, log: log, timing: timing, lost: make(chan struct{}), stopWatch: cancel, watching: make(chan struct{})}
	go l.watch(ctx)
	return l
}

// Lost is closed when the lock's connection has died, and with it the lock.
// Release does not close it.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err says why the lock was lost; nil while it is held.
func (l *Lock) Err() error {
	select {
	case <-l.lost:
		return l.lostErr
	default:
		return nil
	}
}

// watch blocks on the lock's connection, which receives nothing unless it fails
// (a terminated backend sends an error at once), and checks it with a query
// when it has been quiet for timing.idleCheck.
func (l *Lock) watch(ctx context.Context) {
	defer close(l.watching)
	for {
		wctx, cancel := context.WithTimeout(ctx, l.timing.idleCheck)
		_, err := l.conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return // released
		}
		if err == nil {
			continue // nothing LISTENs on this connection; ignore strays
		}
		if wctx.Err() != nil && !l.conn.IsClosed() {
			if err = l.check(ctx); err == nil {
				continue
			}
			if ctx.Err() != nil {
				return
			}
		}
		l.lostErr = fmt.Errorf("dispatcher lock lost: %w", err)
		l.log.Error("the dispatcher lock's connection died; another dispatcher may now start", "err", err)
		close(l.lost)
		return
	}
}

// check asks PostgreSQL whether this session still holds the lock.
func (l *Lock) check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.timing.checkTimeout)
	defer cancel()
	var held bool
	err := l.conn.QueryRow(ctx, holdingSQL, LockKey).Scan(&held)
	if err != nil {
		return err
	}
	if !held {
		return errors.New("this session no longer holds it")
	}
	return nil
}

// Release gives the lock up and closes its connection. It is safe to call more
// than once, and after the lock was lost.
func (l *Lock) Release(ctx context.Context) error {
	var err error
	l.release.Do(func() {
		l.stopWatch()
		<-l.watching
		if l.Err() == nil && !l.conn.IsClosed() {
			if _, uerr := l.conn.Exec(ctx, advisoryUnlockSQL, LockKey); uerr != nil {
				// Closing the session below releases the lock anyway.
				err = fmt.Errorf("dispatcher lock: unlock: %w", uerr)
			}
		}
		if cerr := l.conn.Close(ctx); cerr != nil && err == nil {
			err = fmt.Errorf("dispatcher lock: close: %w", cerr)
		}
	})
	return err
}

// endEarlierWait bounds how long EndEarlierDispatchers waits for the sessions it
// ended to go.
const endEarlierWait = 10 * time.Second

// EndEarlierDispatchers ends (pg_terminate_backend) every session of the
// queue's database that belongs to another pepsi-dispatch process (its
// application_name starts "pepsi-dispatch " and is not self, nor self's
// sessions such as its gate), and waits until they are gone. Call it holding the
// dispatcher lock, before the start-up reset: a dispatcher killed with SIGKILL
// leaves its last pipelined transaction running in the server, and that
// transaction may be waiting for a row lock; if it ran on after the new
// dispatcher's reset and claim, its resolve would write rows the new dispatcher
// holds. It returns how many sessions it ended; a session it may not end (a
// role without the right to signal it) is an error.
func EndEarlierDispatchers(ctx context.Context, pool *pgxpool.Pool, self string) (int, error) {
	rows, err := pool.Query(ctx, endEarlierDispatchersSQL, self)
	if err != nil {
		return 0, fmt.Errorf("end earlier dispatchers' sessions: %w", err)
	}
	ended, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Backend, error) {
		var b Backend
		var start *time.Time
		var ok bool
		err := r.Scan(&b.PID, &start, &ok)
		if start != nil {
			b.Start = *start
		}
		return b, err
	})
	if err != nil {
		return 0, fmt.Errorf("end earlier dispatchers' sessions: %w", err)
	}
	if len(ended) == 0 {
		return 0, nil
	}
	wctx, cancel := context.WithTimeout(ctx, endEarlierWait)
	defer cancel()
	if err := waitGone(wctx, pool, ended, nil); err != nil {
		return len(ended), fmt.Errorf("wait for earlier dispatchers' sessions %v to end: %w", pidsOf(ended), err)
	}
	return len(ended), nil
}

// pidsOf lists the process ids of bs, for a log line or an error.
func pidsOf(bs []Backend) []int32 {
	pids, _ := backendArgs(bs)
	return pids
}

// rowQuerier is what waitGone needs of a connection or a pool.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// waitGone polls until none of the sessions bs is there any more (a session
// ends asynchronously after pg_terminate_backend), or ctx ends. A session is
// matched as endSessionsSQL matches it (its start where known; its
// application_name, if appName is not nil), so a process id the server has
// given to another session since does not keep it waiting.
func waitGone(ctx context.Context, db rowQuerier, bs []Backend, appName *string) error {
	pids, starts := backendArgs(bs)
	for {
		var alive bool
		if err := db.QueryRow(ctx, anyAliveSQL, pids, starts, appName).Scan(&alive); err != nil {
			return err
		}
		if !alive {
			return nil
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}
