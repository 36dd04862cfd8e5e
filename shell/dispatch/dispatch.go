// Package dispatch is the pepsi-dispatch daemon: the thin shell around the pure
// core. It holds the single-dispatcher lock, listens for ingress notifications,
// runs worker processes (shell/worker) and queue transactions (shell/pgqueue),
// turns everything that happens into core events, feeds them to core.Step in
// batches, and executes the commands that come back.
//
// It must never decide anything itself: when to claim, spawn, kill, requeue or
// flush is the core's business. The shell only executes, reports and retries what
// is known to be safe to retry (pgqueue's 40001/40P01 helper, and re-probing the
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
	"github.com/pepsi-pipeline/pepsi/shell/pgqueue"
	"github.com/pepsi-pipeline/pepsi/shell/schema"
	"github.com/pepsi-pipeline/pepsi/shell/worker"
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
	// Signals delivers SIGINT/SIGTERM (default: os/signal). Tests inject their own.
	Signals <-chan os.Signal
	// TxnTimeout is how long one queue transaction may take before it counts as
	// failed (default 60 s), so a connection that died silently, or a lock someone
	// holds on the queue, cannot stall every write until TCP gives up.
	TxnTimeout time.Duration
	// Snapshots, if not nil, carries requests for the core's live state
	// (-metrics-addr): the loop answers each between steps.
	Snapshots <-chan chan<- core.Snapshot
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
	if pgcfg.RuntimeParams["application_name"] == "" {
		pgcfg.RuntimeParams["application_name"] = pgqueue.AppName()
	}
	// Every connection (the lock's, the listener's, the pool's) gives up on a
	// silent network in bounded time, and the server keeps a silent session
	// (and the lock) until well after this dispatcher has noticed.
	pgqueue.BoundSilence(pgcfg)
	signals := o.Signals
	if signals == nil {
		ch := make(chan os.Signal, 2)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(ch)
		signals = ch
	}
	// carry: statistics a session that lost the lock counted but could not be sure
	// it wrote; the next session's core adds what the database does not show.
	var carry []core.Flush
	// stopping: a signal (or ctx) asked for a shutdown. A session that loses the
	// lock after that is not followed by another.
	stopping := false
	restarted := false
	for {
		lock, code, err := acquire(ctx, pgcfg, o.Standby, restarted, log, signals)
		if lock == nil {
			if restarted && code == ExitOK {
				// Stopped between sessions: the lost session's rows are still
				// running (and its statistics unwritten) until the next start.
				code = ExitUnwritten
			}
			return code, err
		}
		code, again, err := session(ctx, o, pgcfg, lock, log, signals, &carry, &stopping, restarted)
		_ = lock.Release(context.WithoutCancel(ctx))
		if !again {
			return code, err
		}
		if stopping {
			log.Error("lost the dispatcher lock while shutting down: workers were killed, the next start resets their rows", "err", err)
			return ExitUnwritten, err
		}
		log.Error("restarting the dispatcher session after losing the lock: workers were killed, their rows will be reset", "err", err)
		restarted = true
	}
}

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
// has not ended yet (it waits minutes, or pgqueue.BoundSilence's bound).
// acquire ends that session (pg_terminate_backend) and asks again, instead of
// refusing to run or waiting for the server to notice.
func acquire(ctx context.Context, cfg *pgx.ConnConfig, standby, restarted bool, log *slog.Logger, signals <-chan os.Signal) (*pgqueue.Lock, int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-signals:
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := probeMin
	waiting := newDBWait(log, cfg)
	staleEnds := 0
	// ask: a standby that restarts asks once first, to see who holds the lock.
	ask := restarted
	for {
		var lock *pgqueue.Lock
		var err error
		if standby && !ask {
			log.Info("standby: waiting for the dispatcher lock")
			lock, err = pgqueue.WaitLock(ctx, cfg, log)
		} else {
			lock, err = pgqueue.TryLock(ctx, cfg, log)
		}
		if err == nil {
			log.Info("holding the dispatcher lock", "key", fmt.Sprintf("%#x", pgqueue.LockKey))
			return lock, 0, nil
		}
		var held *pgqueue.HeldError
		if errors.As(err, &held) && held.PID == 0 && staleEnds < staleEndsMax {
			// The holder was gone by the time it was looked up: a session that
			// was ending (often this process's own, after a reset). Ask again.
			staleEnds++
			log.Info("the dispatcher lock's holder has just gone; asking again")
			select {
			case <-time.After(probeMin):
			case <-ctx.Done():
				return nil, ExitOK, nil
			}
			continue
		}
		if errors.As(err, &held) && restarted && staleEnds < staleEndsMax &&
			held.ApplicationName == pgqueue.AppName() && cfg.RuntimeParams["application_name"] == pgqueue.AppName() {
			staleEnds++
			log.Warn("the dispatcher lock is held by this process's own earlier session, cut off; ending it", "pid", held.PID)
			if eerr := pgqueue.EndSession(ctx, cfg, held.PID, held.ApplicationName); eerr != nil {
				log.Warn("could not end the stale session", "pid", held.PID, "err", eerr)
			}
			continue
		}
		if errors.As(err, &held) && standby {
			ask = false // someone else holds it: wait for it as a standby
			continue
		}
		if errors.As(err, &held) {
			return nil, ExitLockHeld, fmt.Errorf("%w; one dispatcher runs per database (-standby waits to take over)", err)
		}
		if ctx.Err() != nil {
			return nil, ExitOK, nil
		}
		waiting.failed(err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, ExitOK, nil
		}
		backoff = min(2*backoff, lockRetryMax)
	}
}

// txnResult is the outcome of one queue transaction run off the main loop.
type txnResult struct {
	events []core.Event
	failed bool
}

// session runs one core for as long as the lock is held. again reports that the
// lock was lost and a new session should start; then *carry holds the statistics
// the core could not be sure it wrote, for the next session's Start.
//
// *stopping is set once a signal or ctx asks for a shutdown. restarted says an
// earlier session lost the lock: its rows are running until this one's start-up
// reset, so stopping before that is not a clean exit.
func session(ctx context.Context, o Options, pgcfg *pgx.ConnConfig, lock *pgqueue.Lock, log *slog.Logger, signals <-chan os.Signal, carry *[]core.Flush, stopping *bool, restarted bool) (code int, again bool, err error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()

	poolCfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return ExitFatal, false, err
	}
	poolCfg.ConnConfig = pgcfg.Copy()
	// This commit is the durability point of every hop (docs/durability.md): never
	// let a server or role default make it asynchronous.
	poolCfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	poolCfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(sctx, poolCfg)
	if err != nil {
		return ExitFatal, false, fmt.Errorf("database pool: %w", err)
	}
	// Cancel first: pool.Close waits for a transaction in flight, which must not
	// outlive the session (its outcome is in Unflushed / the next start-up reset).
	defer func() {
		cancel()
		pool.Close()
	}()
	// A schema that is missing or old, or a server that answers the check with an
	// error, is fatal: retrying cannot fix it. A connection that could not be made
	// or broke (too many connections, a server starting or stopping) is an outage:
	// it is retried with backoff while the lock is held.
	for backoff, logged := probeMin, false; ; backoff = min(2*backoff, probeMax) {
		cctx, ccancel := context.WithTimeout(sctx, schemaCheckTimeout)
		err := checkSchema(cctx, pool)
		ccancel()
		if err == nil {
			break
		}
		if !transient(err) {
			return ExitFatal, false, err
		}
		if !logged {
			log.Warn("cannot check the database schema; retrying", "err", err)
			logged = true
		}
		select {
		case <-time.After(backoff):
		case <-lock.Lost():
			return ExitFatal, true, lock.Err()
		case <-signals:
			*stopping = true
			return exitBeforeStart(restarted), false, nil
		case <-ctx.Done():
			*stopping = true
			return exitBeforeStart(restarted), false, nil
		}
	}
	// No session of an earlier dispatcher may write after the start-up reset
	// (pgqueue.EndEarlierDispatchers). Failing to end one is logged, not fatal:
	// a role that may not signal another's sessions still runs, as before.
	ectx, ecancel := context.WithTimeout(sctx, schemaCheckTimeout)
	if n, err := pgqueue.EndEarlierDispatchers(ectx, pool, pgcfg.RuntimeParams["application_name"]); err != nil {
		log.Warn("cannot end an earlier dispatcher's sessions before the start-up reset", "err", err)
	} else if n > 0 {
		log.Info("ended sessions of an earlier dispatcher before the start-up reset", "sessions", n)
	}
	ecancel()
	queue := pgqueue.New(pool, log)

	events := make(chan core.Event, eventBufferMax)
	// ended is closed when the loop has returned: no one reads events any more, and
	// a worker goroutine must not block on them (Close waits for those goroutines).
	ended := make(chan struct{})
	// offLoop hands the loop an event from work done off it (a worker's output,
	// an inspection of the queue, a vacuum).
	offLoop := func(ev core.Event) {
		select {
		case events <- ev:
		case <-ended:
		}
	}
	workers := worker.NewPool(worker.Options{
		ConfigFile: o.Config.Dispatch.ConfigFile,
		Log:        log,
		Events:     offLoop,
	})
	defer func() {
		close(ended)
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer wcancel()
		if cerr := workers.Close(wctx); cerr != nil {
			log.Error("workers did not all exit", "err", cerr)
		}
	}()

	// Ingress notifications coalesce: one pending "there is work" is enough.
	notified := make(chan struct{}, 1)
	// dbUp: a probe reached the database after a failed transaction. relisten: the
	// listener is back after an outage of its own; the notifications sent meanwhile
	// were lost, so it means Ingress as well as DatabaseUp.
	dbUp := make(chan struct{}, 1)
	relisten := make(chan struct{}, 1)
	listening := make(chan struct{})
	go func() {
		first := true
		_ = pgqueue.Listen(sctx, pgcfg, log, func(n pgqueue.Notice) {
			switch n {
			case pgqueue.Listening:
				if first {
					first = false
					close(listening)
				}
			case pgqueue.Notified:
				signalOnce(notified)
			case pgqueue.Up:
				signalOnce(relisten)
			}
		})
	}()
	select {
	case <-listening:
	case <-lock.Lost():
		return ExitFatal, true, lock.Err()
	case <-signals:
		*stopping = true
		return exitBeforeStart(restarted), false, nil
	case <-ctx.Done():
		*stopping = true
		return exitBeforeStart(restarted), false, nil
	}

	// The gate (core.Rest, core.Busy) on its own connection: its answers are
	// events like a worker's.
	gate := pgqueue.NewGate()
	go gate.Run(sctx, pgcfg, log, func(ev core.Event) {
		select {
		case events <- ev:
		case <-ended:
		}
	})

	txnTimeout := o.TxnTimeout
	if txnTimeout <= 0 {
		txnTimeout = txnTimeoutDefault
	}
	results := make(chan txnResult, 1)
	runTxn := func(cmds []core.Command) {
		go func() {
			// A transaction past the timeout fails, and the core re-sends what
			// it owed once a probe reaches the database.
			tctx, tcancel := context.WithTimeout(sctx, txnTimeout)
			evs := queue.Exec(tctx, cmds)
			tcancel()
			failed := false
			for _, ev := range evs {
				if core.QueueErr(ev) != "" {
					failed = true
				}
			}
			results <- txnResult{events: evs, failed: failed}
		}()
	}
	// failures counts queue transactions that failed in a row. A failure the
	// database answers at once (a missing table, a read-only server) would
	// otherwise be retried as fast as the ping after it succeeds; each one in a
	// row doubles the pause before the retry, up to probeMax.
	//
	// The probe starts only once the loop has taken the failure into pending, so
	// its DatabaseUp reaches the core after the failure. Started with the failure
	// (off the loop), it could answer while the failure still waited in results;
	// the loop could then take DatabaseUp first, the core would ignore it (not yet
	// down) and then wait for the database forever.
	failures := 0
	tookResult := func(r txnResult) {
		if !r.failed {
			failures = 0
			return
		}
		failures++
		go probe(sctx, queue, log, dbUp, min(probeMin<<min(failures-1, 16), probeMax))
	}

	c := core.New(o.Config)
	pending := []core.Event{core.Start{Carry: *carry}}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	ctxDone := ctx.Done()
	for {
		cmds := c.Step(time.Now(), pending...)
		pending = pending[:0]
		var txn []core.Command
		for _, cmd := range cmds {
			switch x := cmd.(type) {
			case core.Spawn:
				st, ok := o.Config.Stage(x.Stage)
				if !ok {
					panic(fmt.Sprintf("dispatch: core spawned unknown stage %q", x.Stage))
				}
				pending = append(pending, workers.Spawn(x.Worker, x.Stage, st.Program))
			case core.Write:
				workers.Write(x.Worker, x.IDs)
			case core.Stop:
				workers.Stop(x.Worker)
			case core.Kill:
				workers.Kill(x.Worker)
			case core.SetTimer:
				timer.Stop()
				if !x.At.IsZero() {
					timer.Reset(max(0, time.Until(x.At)))
				}
			case core.Inspect:
				go func() { offLoop(queue.Inspect(sctx, x)) }()
			case core.Vacuum:
				go func() { offLoop(queue.Vacuum(sctx, x)) }()
			case core.Rest, core.Busy:
				log.Debug("gate", "command", cmd.String())
				gate.Do(cmd)
			case core.Log:
				log.Log(sctx, level(x.Level), x.Msg)
			case core.Exit:
				return x.Code, false, nil
			default:
				if !core.IsQueue(cmd) {
					panic(fmt.Sprintf("dispatch: unknown command %T", cmd))
				}
				txn = append(txn, cmd)
			}
		}
		if len(txn) > 0 {
			runTxn(txn)
		}
		if len(pending) > 0 {
			continue // spawn results go straight back in
		}
		// Wait for anything, then take everything else that is already there.
	wait:
		select {
		case ev := <-events:
			pending = append(pending, ev)
		case r := <-results:
			pending = append(pending, r.events...)
			tookResult(r)
		case <-notified:
			pending = append(pending, core.Ingress{})
		case <-dbUp:
			pending = append(pending, core.DatabaseUp{})
		case <-relisten:
			pending = append(pending, core.Ingress{}, core.DatabaseUp{})
		case <-timer.C:
			pending = append(pending, core.Tick{})
		case reply := <-o.Snapshots:
			reply <- c.Snapshot() // buffered by the asker
			goto wait             // an answer is no event: the core does not step
		case sig := <-signals:
			log.Info("signal received", "signal", sig.String())
			*stopping = true
			pending = append(pending, core.Shutdown{})
		case <-ctxDone:
			ctxDone = nil
			*stopping = true
			pending = append(pending, core.Shutdown{})
		case <-lock.Lost():
			workers.KillAll()
			*carry = c.Unflushed()
			return ExitFatal, true, fmt.Errorf("lost the dispatcher lock: %w", lock.Err())
		}
		pending = drain(pending, events, results, notified, dbUp, relisten, tookResult)
	}
}

// exitBeforeStart is the exit code of a session asked to stop before its core ran:
// clean, unless an earlier session lost the lock and left rows running.
func exitBeforeStart(restarted bool) int {
	if restarted {
		return ExitUnwritten
	}
	return ExitOK
}

// drain appends, without blocking, whatever events are already waiting, so that
// one Step sees every answer and exit that has arrived (capacities are current
// before the claim).
func drain(pending []core.Event, events <-chan core.Event, results <-chan txnResult, notified, dbUp, relisten <-chan struct{}, tookResult func(txnResult)) []core.Event {
	for len(pending) < drainMax {
		select {
		case ev := <-events:
			pending = append(pending, ev)
		case r := <-results:
			pending = append(pending, r.events...)
			tookResult(r)
		case <-notified:
			pending = append(pending, core.Ingress{})
		case <-dbUp:
			pending = append(pending, core.DatabaseUp{})
		case <-relisten:
			pending = append(pending, core.Ingress{}, core.DatabaseUp{})
		default:
			return pending
		}
	}
	return pending
}

// probe waits pause, then pings the database with capped backoff until it
// answers, then reports up.
func probe(ctx context.Context, q *pgqueue.Queue, log *slog.Logger, up chan<- struct{}, pause time.Duration) {
	select {
	case <-time.After(pause):
	case <-ctx.Done():
		return
	}
	backoff := probeMin
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := q.Ping(pctx)
		cancel()
		if err == nil {
			signalOnce(up)
			return
		}
		log.Debug("database probe failed", "err", err, "next", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
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
	v, err := schema.Version(ctx, c.Conn())
	if err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	if want := schema.Latest(); v < want {
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
