// Package dispatch is the pepsi-dispatch daemon: the thin shell around the pure
// core. It holds the single-dispatcher lock, listens for ingress notifications,
// runs worker processes (shell/worker) and queue transactions (store),
// turns everything that happens into core events, feeds them to core.Step in
// batches, and executes the commands that come back.
//
// It must never decide anything itself: when to claim, spawn, kill, requeue or
// flush is the core's business. The shell only executes, reports and retries what
// is known to be safe to retry (store's 40001/40P01 helper, and re-probing the
// database after a failed transaction so the core can be told DatabaseUp).
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/pgnet"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Exit codes of pepsi-dispatch, documented in pepsi-dispatch(1).
const (
	ExitOK            = 0 // shut down cleanly
	ExitUnwritten     = 1 // shut down, but some results could not be written (the next start resets them)
	ExitUsage         = 2 // bad flags or configuration
	ExitLockHeld      = 3 // another dispatcher holds the lock
	ExitFatal         = 4 // could not run: the database or the workers' environment is unusable
	eventBufferMax    = 4096
	drainMax          = 8192 // events folded into one Step at most
	probeMin          = 100 * time.Millisecond
	probeMax          = 5 * time.Second
	txnTimeoutDefault = 60 * time.Second // Options.TxnTimeout
	// schemaCheckTimeout bounds one start-up schema check (connecting included).
	schemaCheckTimeout = 10 * time.Second
)

// Options configure one daemon.
type Options struct {
	// Config is the parsed pepsi.conf (its Dispatch.ConfigFile is passed to workers).
	Config *conf.Config
	// Database is the libpq URL or key=value string ("" = PG* environment).
	Database string
	// Standby waits for the lock instead of refusing to run.
	Standby bool
	// Log receives every operator-facing line.
	Log *slog.Logger
	// Signals delivers SIGINT/SIGTERM. Nil: Run catches them itself, and
	// SIGHUP, which it logs and ignores (WarnHangups), while it runs.
	// pepsi-dispatch gives its own, caught from its start to its exit;
	// tests inject theirs.
	Signals <-chan os.Signal
	// TxnTimeout is how long one queue transaction may take before it counts as
	// failed (default 60 s), so a connection that died silently, or a lock someone
	// holds on the queue, cannot stall every write until TCP gives up.
	TxnTimeout time.Duration
	// Snapshots, if not nil, carries requests for the core's live state
	// (-metrics-addr): the loop answers each between steps.
	Snapshots <-chan chan<- core.Snapshot
	// WorkerEnv is the stage programs' base environment (default: the
	// dispatcher's own). Tests use it to give workers a database address.
	WorkerEnv []string
	// Traces, if not nil, is handed every pass the core reports (core.Pass,
	// which the core then sends: Core.TracePasses), from the loop: it must
	// not wait (internal/tracing's exporter queues it, or drops it and
	// counts). Nil: traces are off, and the core reports no pass.
	Traces PassTracer
}

// PassTracer takes the passes the core reports, for traces.
type PassTracer interface {
	Pass(core.Pass)
}

// Run runs the dispatcher until it has shut down after a signal (or ctx ends,
// which counts as a signal), and returns the process exit code.
func Run(ctx context.Context, o Options) (int, error) {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	pgcfg, err := pgx.ParseConfig(o.Database)
	if err != nil {
		return ExitUsage, fmt.Errorf("database connection string: %w", err)
	}
	named := pgcfg.RuntimeParams["application_name"] != ""
	if !named {
		pgcfg.RuntimeParams["application_name"] = store.AppName()
	}
	if err := store.CheckAppName(pgcfg.RuntimeParams["application_name"]); err != nil {
		return ExitUsage, fmt.Errorf("database connection string: %w", err)
	}
	if named {
		warnOwnAppName(log, pgcfg.RuntimeParams["application_name"])
	}
	// Every connection (the lock's, the listener's, the pool's) gives up on a
	// silent network in bounded time, and the server keeps a silent session
	// (and the lock) until well after this dispatcher has noticed.
	pgnet.BoundSilence(pgcfg)
	signals := o.Signals
	if signals == nil {
		ch := make(chan os.Signal, 2)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(ch)
		signals = ch
		if !signal.Ignored(syscall.SIGHUP) {
			// (Started under nohup, it and its workers keep ignoring it.)
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			defer WarnHangups(log, hup)()
		}
	}
	// carry: statistics a session that lost the lock counted but could not be sure
	// it wrote; the next session's core adds what the database does not show.
	var carry []core.Flush
	restarted := false
	for {
		lock, code, err := acquire(ctx, pgcfg, o.Standby, restarted, log, signals)
		if lock == nil {
			if restarted && code == ExitOK {
				// Stopped between sessions: the lost session's rows are still
				// running (and its statistics unwritten) until the next start.
				// Said here: nothing else in the log explains the exit status.
				code = ExitUnwritten
				log.Warn("stopped while retaking the dispatcher lock it lost: the rows its last session held stay running, and its statistics unwritten, until the next start resets them")
			}
			return code, err
		}
		s := &session{o: o, pgcfg: pgcfg, lock: lock, log: log, signals: signals, carry: carry, restarted: restarted}
		r := s.run(ctx)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lockReleaseWait)
		_ = lock.Release(rctx) // closing its session, as the bound ends it, releases the lock too
		cancel()
		if !r.again {
			return r.code, r.err
		}
		if r.stopping {
			log.Error("lost the dispatcher lock while shutting down: workers were killed, the next start resets their rows", "err", r.err)
			return ExitUnwritten, r.err
		}
		log.Error("restarting the dispatcher session after losing the lock: workers were killed, their rows will be reset", "err", r.err)
		carry = r.carry
		restarted = true
	}
}

// warnOwnAppName says what an application_name of the operator's own (the
// connection string's, or PGAPPNAME's) costs: the start-up ends an earlier
// dispatcher's sessions, whose last transaction may still wait for a lock,
// by their name "pepsi-dispatch HOST PID" (store.EndEarlierDispatchers);
// under a name of its own it cannot tell them from anyone else's, a
// pepsi-queue's or its own, and ends none.
func warnOwnAppName(log *slog.Logger, name string) {
	log.Warn("the database connection sets its own application_name: an earlier dispatcher's sessions, named so too, "+
		"are not told apart from others and are not ended before the start-up reset (docs/durability.md); leave application_name out",
		"application_name", name)
}

// lockReleaseWait bounds how long giving the lock up may take: over a
// silent network the unlock would wait for the connection's own bound.
const lockReleaseWait = 5 * time.Second

// lockRetryMax caps the pause between attempts to take the lock while the
// database cannot be reached. It is short: an attempt against a server that is
// down is refused at once and costs nothing, and every pause is time the
// pipeline stands still after the server is back (a silent network makes each
// attempt wait for its connect timeout instead).
const lockRetryMax = 250 * time.Millisecond

// staleEndsMax bounds how often one acquire asks again after finding the lock
// held by a session that has just gone or by a stale session of this process
// (which it ends), before it counts the lock as held.
const staleEndsMax = 3

// acquire takes the dispatcher lock: at once, or waiting as a standby. Connection
// failures are retried with backoff (the database may be starting); a lock held by
// someone else is final unless standby.
//
// A holder that has gone by the time it is looked up (HeldError with no pid)
// was a session that was ending: acquire asks again, a few times, rather than
// refuse to run. After a lost lock (restarted), the holder may be this very
// process: its old lock session, cut off by a silent network, which the server
// has not ended yet (it waits minutes, or pgnet.BoundSilence's bound).
// acquire ends that session (pg_terminate_backend) and asks again, instead of
// refusing to run or waiting for the server to notice.
func acquire(ctx context.Context, cfg *pgx.ConnConfig, standby, restarted bool, log *slog.Logger, signals <-chan os.Signal) (*store.Lock, int, error) {
	ctx, watch := watchSignals(ctx, signals)
	defer watch.stop()
	backoff := probeMin
	waiting := newDBWait(log, cfg)
	staleEnds := 0
	// ask: a standby that restarts asks once first, to see who holds the lock.
	ask := restarted
	for {
		var lock *store.Lock
		var err error
		if standby && !ask {
			log.Info("standby: waiting for the dispatcher lock")
			lock, err = store.WaitLock(ctx, cfg, log)
		} else {
			lock, err = store.TryLock(ctx, cfg, log)
		}
		if err == nil {
			log.Info("holding the dispatcher lock", "key", fmt.Sprintf("%#x", store.LockKey))
			if watch.stop() {
				// The signal came as the lock was taken: it was for this
				// start, which ends here, before any session.
				log.Info("signal received while taking the dispatcher lock; giving it up")
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lockReleaseWait)
				rerr := lock.Release(rctx)
				cancel()
				if rerr != nil {
					log.Warn("giving up the dispatcher lock", "err", rerr)
				}
				return nil, ExitOK, nil
			}
			return lock, 0, nil
		}
		var held *store.HeldError
		if !errors.As(err, &held) {
			if ctx.Err() != nil {
				return nil, ExitOK, nil
			}
			waiting.failed(err)
			if !pause(ctx, backoff) {
				return nil, ExitOK, nil
			}
			backoff = min(2*backoff, lockRetryMax)
			continue
		}
		switch {
		case held.BackendPID == 0 && staleEnds < staleEndsMax:
			// The holder was gone by the time it was looked up: a session that
			// was ending (often this process's own, after a reset). Ask again.
			staleEnds++
			log.Info("the dispatcher lock's holder has just gone; asking again")
			if !pause(ctx, probeMin) {
				return nil, ExitOK, nil
			}
		case restarted && staleEnds < staleEndsMax &&
			held.ApplicationName == store.AppName() && cfg.RuntimeParams["application_name"] == store.AppName():
			staleEnds++
			log.Warn("the dispatcher lock is held by this process's own earlier session, cut off; ending it", "backend_pid", held.BackendPID)
			if eerr := store.EndSession(ctx, cfg, held.Backend(), held.ApplicationName); eerr != nil {
				log.Warn("could not end the stale session", "backend_pid", held.BackendPID, "err", eerr)
			}
		case standby:
			ask = false // someone else holds it: wait for it as a standby
		default:
			return nil, ExitLockHeld, fmt.Errorf("%w; one dispatcher runs per database (-standby waits to take over)", err)
		}
	}
}

// signalWatch ends a context at the first signal, which it takes, while
// acquire waits for the lock. Every signal is either taken by the watch, and
// reported by stop, or left in the channel for the session: one that comes as
// the lock is taken must not be lost (the dispatcher would run on, deaf to it).
type signalWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	took   bool // written before done is closed
}

// watchSignals returns a context that ends with ctx or at the first signal.
func watchSignals(ctx context.Context, signals <-chan os.Signal) (context.Context, *signalWatch) {
	ctx, cancel := context.WithCancel(ctx)
	w := &signalWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		select {
		case <-signals:
			w.took = true
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, w
}

// stop ends the watch, once it has let go of the channel, and reports whether
// it took a signal. It may be called more than once.
func (w *signalWatch) stop() bool {
	w.cancel()
	<-w.done
	return w.took
}

// pause waits d, or until ctx is done; it reports whether ctx is still live.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}

// probe waits wait, then pings the database with capped backoff until it
// answers, then reports up, unless the lock is known lost by then: the session
// is over, and a retry should not go out before the loop has heard of it.
func probe(ctx context.Context, q *store.Queue, lock *store.Lock, log *slog.Logger, up chan<- struct{}, wait time.Duration) {
	if !pause(ctx, wait) {
		return
	}
	backoff := probeMin
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := q.Ping(pctx)
		cancel()
		if err == nil {
			if lock.Err() == nil {
				signalOnce(up)
			}
			return
		}
		log.Debug("database probe failed", "err", err, "next", backoff)
		if !pause(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, probeMax)
	}
}

// oldSchemaError reports a database whose PEPSI schema is missing or older than
// the one this binary was built for.
type oldSchemaError struct{ have, want int }

func (e *oldSchemaError) Error() string {
	if e.have == 0 {
		return fmt.Sprintf("the database has no PEPSI schema (want version %d): run pepsi-queue migrate", e.want)
	}
	return fmt.Sprintf("the database has PEPSI schema version %d, this pepsi-dispatch needs %d: run pepsi-queue migrate", e.have, e.want)
}

// checkSchema makes sure the schema is there before the core starts: without it
// every queue transaction fails at once, and a dispatcher that waited for the
// database to come back would wait forever.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	defer c.Release()
	v, err := store.Version(ctx, c.Conn())
	if err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	if want := store.Latest(); v < want {
		return &oldSchemaError{have: v, want: want}
	}
	return nil
}

// transient reports whether err, from checkSchema, is a connection that could
// not be made or broke, rather than an answer of the server about its schema.
func transient(err error) bool {
	var old *oldSchemaError
	if errors.As(err, &old) {
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true // refused: too many connections, starting up, shutting down
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true // the connection broke or timed out
	}
	if len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "08", "53", "57": // connection exception, insufficient resources, operator intervention
		return true
	}
	return false
}

func signalOnce(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// level maps a core Log line's level onto the logger's.
func level(l core.Level) slog.Level {
	switch l {
	case core.LevelError:
		return slog.LevelError
	case core.LevelWarn:
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

// WarnHangups logs a warning for each SIGHUP that hup delivers, until the
// returned stop is called: the process that catches SIGHUP into hup keeps
// running on it. By default the signal would kill it at once, with no
// shutdown, no requeue and no statistics flushed, as a closed terminal or a
// service manager's habitual reload (kill -HUP) sends it. It has nothing to
// reload: its configuration is read at start. (Workers get the default
// disposition back at exec.) Run, catching its own signals, calls it;
// pepsi-dispatch catches SIGHUP from its start to its exit and calls it
// itself.
func WarnHangups(log *slog.Logger, hup <-chan os.Signal) (stop func()) {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				log.Warn("SIGHUP ignored: pepsi-dispatch reads its configuration only at start; to change it, stop it (SIGTERM) and start it again")
			case <-done:
				return
			}
		}
	}()
	return func() { close(done) }
}
