package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/shell/worker"
	"github.com/pepsi-pipeline/pepsi/store"
)

// session is one core's life while the dispatcher lock is held: the schema
// check, the ingress listener, the workers, the gate, and the loop that steps
// the core and carries out its commands. Run fills in the fields above ctx and
// calls run; every method but offLoop runs on run's goroutine (the loop's), so
// the fields need no lock.
type session struct {
	o       Options
	pgcfg   *pgx.ConnConfig
	lock    *store.Lock
	log     *slog.Logger
	signals <-chan os.Signal
	// carry is what the previous session could not be sure it wrote, for this
	// core's Start; once the core has run, what this one could not.
	carry []core.Flush
	// restarted: an earlier session lost the lock, and its rows are running
	// until this one's start-up reset, so stopping before that is not clean.
	restarted bool

	// ctx is the session's own: it does not end with the caller's (the shutdown
	// that asks for still needs the database), and its end at run's return ends
	// everything the session started.
	ctx    context.Context
	cancel context.CancelFunc
	// shutdown is the caller's ctx.Done(): its end asks for a shutdown, like a
	// signal. The loop sets it to nil once taken, so that it asks only once.
	shutdown <-chan struct{}
	stopping bool // a signal or shutdown was taken

	pool    *pgxpool.Pool
	queue   *store.Queue
	workers *worker.Pool
	gate    *store.Gate
	core    *core.Core
	timer   *time.Timer

	// events carries what work done off the loop reports (offLoop). ended is
	// closed when the loop has returned: no one reads events any more, and a
	// worker goroutine must not block on them (Close waits for those goroutines).
	events chan core.Event
	ended  chan struct{}
	// results carries the outcomes of the queue transactions in flight (the
	// core has at most SESSIONS outstanding).
	results chan txnResult
	// notified: ingress notifications coalesce, one pending "there is work" is
	// enough. dbUp: a probe reached the database after a failed transaction.
	// relisten: the listener is back after an outage of its own; the
	// notifications sent meanwhile were lost, so it means Ingress as well as
	// DatabaseUp.
	notified, dbUp, relisten chan struct{}
	// failures counts queue transactions that failed in a row (tookResult).
	failures int
	// txns sums up the queue transactions, logged when the session ends;
	// resultAt is when the loop took the result of the last one, until the
	// step that took it has run (runTxn counts the turnaround from it).
	txns     txnStats
	resultAt time.Time
	// inFlight counts the queue transactions sent whose results the loop
	// has not taken yet.
	inFlight int
	// health is the core's verdict on its stages last handed to the health
	// writer (recordHealth), and healthOut the writer's mailbox: it holds the
	// latest verdict not yet taken, never an older one.
	health    []core.StageHealth
	healthOut chan []core.StageHealth
}

// txnStats sums up a session's queue transactions: how long they took, how
// many items (rows resolved and claimed) they carried, and how long the loop
// took from a transaction's result to the next transaction when the step
// that took the result sent one (its turnaround), and how many were sent
// while others were out (beside: SESSIONS above 1). With one session they run
// one at a time, so with work waiting, their time and the turnaround are the
// whole cycle, and a transaction's time per item bounds hops/s
// (docs/performance.md).
type txnStats struct {
	count, items, turns, beside int
	took, turnaround            time.Duration
}

// attrs are the log attributes of s.
func (s txnStats) attrs() []any {
	per := func(d time.Duration, n int) string {
		if n == 0 {
			return "0s"
		}
		return (d / time.Duration(n)).Round(time.Microsecond).String()
	}
	items := 0.0
	if s.count > 0 {
		items = float64(s.items) / float64(s.count)
	}
	return []any{"count", s.count, "mean", per(s.took, s.count), "items", s.items, "items_mean", fmt.Sprintf("%.1f", items),
		"turnaround_mean", per(s.turnaround, s.turns), "beside", s.beside}
}

// sessionResult is how a session ended.
type sessionResult struct {
	code int
	err  error
	// again: the lock was lost, and a new session should start (unless stopping).
	again bool
	// carry is what the next session's Start must be given (session.carry).
	carry []core.Flush
	// stopping: a signal or ctx asked for a shutdown. A session that loses the
	// lock after that is not followed by another.
	stopping bool
}

// txnResult is the outcome of one queue transaction run off the main loop.
type txnResult struct {
	events []core.Event
	failed bool
	took   time.Duration
}

// run runs the session until its core exits, a shutdown is asked for before
// the core has started, or the lock is lost (again).
func (s *session) run(ctx context.Context) sessionResult {
	s.shutdown = ctx.Done()
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer s.cancel()
	s.events = make(chan core.Event, eventBufferMax)
	s.ended = make(chan struct{})
	s.results = make(chan txnResult, max(1, s.o.Config.Dispatch.Sessions))
	s.notified, s.dbUp, s.relisten = make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)

	if err := s.openPool(); err != nil {
		return s.end(ExitFatal, false, err)
	}
	defer s.closePool()
	if r, ok := s.awaitSchema(); !ok {
		return r
	}
	s.endEarlierDispatchers()
	s.queue = store.New(s.pool, s.log)
	s.workers = worker.NewPool(worker.Options{
		ConfigFile: s.o.Config.Dispatch.ConfigFile,
		Env:        workerEnv(s.o.WorkerEnv, s.o.Database),
		Log:        s.log,
		Events:     s.offLoop,
	})
	defer s.stopWorkers()
	if r, ok := s.startListener(); !ok {
		return r
	}
	// The gate (core.Rest, core.Busy) on its own connection: its answers are
	// events like a worker's.
	s.gate = store.NewGate()
	go s.gate.Run(s.ctx, s.pgcfg, s.log, s.offLoop)
	s.healthOut = make(chan []core.StageHealth, 1)
	go writeHealth(s.ctx, s.queue, s.log, s.healthOut)
	return s.loop()
}

// end is the session's result, with what it carries on.
func (s *session) end(code int, again bool, err error) sessionResult {
	return sessionResult{code: code, err: err, again: again, carry: s.carry, stopping: s.stopping}
}

// openPool makes the pool the queue transactions run on.
func (s *session) openPool() error {
	poolCfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return err
	}
	poolCfg.ConnConfig = s.pgcfg.Copy()
	maps.Copy(poolCfg.ConnConfig.RuntimeParams, store.SessionParams())
	// A session per outstanding transaction, and room for the health
	// writer's, the inspections' and the vacuums' beside them.
	poolCfg.MaxConns = int32(max(1, s.o.Config.Dispatch.Sessions) + 3)
	// A session whose transaction is left in doubt is ended by its process
	// id and its start (docs/durability.md); a lock wait ends before the
	// transaction's timeout, so that it is an error, not a doubt
	// (store.BoundLockWaits).
	bound := store.BoundLockWaits(store.LockWaitUnder(s.txnTimeout()))
	poolCfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if err := store.NoteBackendStart(ctx, conn); err != nil {
			return err
		}
		return bound(ctx, conn)
	}
	s.pool, err = pgxpool.NewWithConfig(s.ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	return nil
}

// closePool cancels the session's context first: pool.Close waits for a
// transaction in flight, which must not outlive the session (its outcome is in
// Unflushed / the next start-up reset).
func (s *session) closePool() {
	s.cancel()
	s.pool.Close()
}

// awaitSchema checks the schema before the core starts. A schema that is
// missing or old, or a server that answers the check with an error, is fatal:
// retrying cannot fix it. A connection that could not be made or broke (too
// many connections, a server starting or stopping) is an outage: it is retried
// with backoff while the lock is held. ok says the schema is fit.
func (s *session) awaitSchema() (r sessionResult, ok bool) {
	for backoff, logged := probeMin, false; ; backoff = min(2*backoff, probeMax) {
		ctx, cancel := context.WithTimeout(s.ctx, schemaCheckTimeout)
		err := checkSchema(ctx, s.pool)
		cancel()
		if err == nil {
			return sessionResult{}, true
		}
		if !transient(err) {
			return s.end(ExitFatal, false, err), false
		}
		if !logged {
			s.log.Warn("cannot check the database schema; retrying", "err", err)
			logged = true
		}
		if r, ok := waitBeforeStart(s, time.After(backoff)); !ok {
			return r, false
		}
	}
}

// endEarlierDispatchers makes sure no session of an earlier dispatcher writes
// after the start-up reset (store.EndEarlierDispatchers). Failing to end one
// is logged, not fatal: a role that may not signal another's sessions still
// runs, as before.
func (s *session) endEarlierDispatchers() {
	ctx, cancel := context.WithTimeout(s.ctx, schemaCheckTimeout)
	defer cancel()
	if n, err := store.EndEarlierDispatchers(ctx, s.pool, s.pgcfg.RuntimeParams["application_name"]); err != nil {
		s.log.Warn("cannot end an earlier dispatcher's sessions before the start-up reset", "err", err)
	} else if n > 0 {
		s.log.Info("ended sessions of an earlier dispatcher before the start-up reset", "sessions", n)
	}
}

// startListener starts the ingress listener and waits until it listens: the
// core starts only after that, so no insert made after its first claim can go
// unnoticed. ok says it listens.
func (s *session) startListener() (r sessionResult, ok bool) {
	listening := make(chan struct{})
	go func() {
		first := true
		_ = store.Listen(s.ctx, s.pgcfg, s.log, func(n store.Notice) {
			switch n {
			case store.Listening:
				if first {
					first = false
					close(listening)
				}
			case store.Notified:
				signalOnce(s.notified)
			case store.Up:
				signalOnce(s.relisten)
			}
		})
	}()
	return waitBeforeStart(s, listening)
}

// waitBeforeStart waits for ready while the core has not run yet. A lost lock
// ends the session for another to start; a signal or the caller's ctx ends the
// run, cleanly unless an earlier session lost the lock and left rows running.
// ok says ready came first.
func waitBeforeStart[T any](s *session, ready <-chan T) (r sessionResult, ok bool) {
	select {
	case <-ready:
		return sessionResult{}, true
	case <-s.lock.Lost():
		return s.end(ExitFatal, true, s.lock.Err()), false
	case <-s.signals:
	case <-s.shutdown:
	}
	s.stopping = true
	if s.restarted {
		return s.end(ExitUnwritten, false, nil), false
	}
	return s.end(ExitOK, false, nil), false
}

// stopWorkers stops the workers once the loop has returned.
func (s *session) stopWorkers() {
	close(s.ended)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.workers.Close(ctx); err != nil {
		s.log.Error("workers did not all exit", "err", err)
	}
}

// offLoop hands the loop an event from work done off it (a worker's output, an
// inspection of the queue, a vacuum, the gate's answers), or drops it once the
// loop has returned.
func (s *session) offLoop(ev core.Event) {
	select {
	case s.events <- ev:
	case <-s.ended:
	}
}

// loop steps the core with everything that happened since its last step and
// carries out the commands it answers, until the core exits or the lock is lost.
func (s *session) loop() sessionResult {
	s.core = core.New(s.o.Config)
	if s.o.Traces != nil {
		s.core.TracePasses()
	}
	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	// The seed of the core's jitter (retry delays) is random: nothing needs to
	// replay a real dispatcher's delays, only the simulator's. So is the life
	// that names this core's statistics flushes: 63 random bits make two lives
	// that share a number as likely as never.
	pending := []core.Event{core.Start{Carry: s.carry, Seed: rand.Uint64(), Life: rand.Int64(), Unrunnable: s.unrunnable()}}
	for {
		cmds := s.core.Step(time.Now(), pending...)
		s.recordHealth()
		var exit *core.Exit
		pending, exit = s.execute(cmds, pending[:0])
		s.resultAt = time.Time{} // a later transaction was not this result's turn
		if exit != nil {
			s.log.Info("queue transactions", s.txns.attrs()...)
			return s.end(exit.Code, false, nil)
		}
		if len(pending) > 0 {
			continue // spawn results go straight back in
		}
		// Wait for anything, then take everything else that is already there.
		var held bool
		if pending, held = s.collect(pending, true); !held {
			s.workers.KillAll()
			s.carry = s.lostCarry()
			return s.end(ExitFatal, true, fmt.Errorf("lost the dispatcher lock: %w", s.lock.Err()))
		}
		pending, _ = s.collect(pending, false)
	}
}

// unrunnable checks every stage's program as a spawn would find it, before
// any message needs a worker (core.Start.Unrunnable).
func (s *session) unrunnable() []core.ProgramChecked {
	var out []core.ProgramChecked
	for _, st := range s.o.Config.Stages {
		if c := s.checkProgram(st.Name); c.Err != "" {
			out = append(out, c)
		}
	}
	return out
}

// checkProgram answers core.CheckProgram for stage.
func (s *session) checkProgram(stage string) core.ProgramChecked {
	st, ok := s.o.Config.Stage(stage)
	if !ok {
		panic(fmt.Sprintf("dispatch: core checked the program of unknown stage %q", stage))
	}
	if err := s.workers.Check(st.Program); err != nil {
		return core.ProgramChecked{Stage: stage, Err: err.Error()}
	}
	return core.ProgramChecked{Stage: stage}
}

// lostGrace bounds how long a session that lost the lock waits for the
// results of its queue transactions in flight before it ends them (lostCarry).
const lostGrace = 2 * time.Second

// lostCarry is what the next session's core must be given once the lock is
// lost: this core's Unflushed, after it has taken in the results of every
// queue transaction it had in flight. Their statistics (children emitted,
// messages that left, verdicts and retries written) are counted only from
// those results, so a transaction that committed as the loss was noticed,
// its result waiting in results or on its way, would otherwise count in no
// life. Each is given lostGrace to answer: ending it at once (the session's
// context) mostly ends it after its COMMIT reached the server, sent with its
// statements in one round trip, and leaves it in doubt, its figures lost.
// One that has not answered by then is ended (its rows are the next start-up
// reset's), as is every one at the latest when the session ends: none
// outlives the session. What the core answers the results with is not
// carried out: its workers are killed and another dispatcher may hold the
// lock (and ends this one's sessions before its own start-up reset).
func (s *session) lostCarry() []core.Flush {
	// Those in flight may end; none may begin (a retry, a narrowed rerun):
	// the next holder may be resetting these rows already.
	s.queue.Fence()
	var evs []core.Event
	grace := time.NewTimer(lostGrace)
	defer grace.Stop()
	for s.inFlight > 0 {
		select {
		case r := <-s.results:
			s.inFlight--
			evs = append(evs, r.events...)
		case <-grace.C:
			s.cancel()
		}
	}
	if len(evs) > 0 {
		s.core.Step(time.Now(), evs...)
	}
	return s.core.Unflushed()
}

// execute carries out one step's commands in order, appending to pending the
// events that come back at once (a spawn's), and runs the step's queue commands
// as one transaction off the loop. At an Exit it stops there, and returns it:
// nothing after it is carried out, the transaction included.
func (s *session) execute(cmds []core.Command, pending []core.Event) ([]core.Event, *core.Exit) {
	var txn []core.Command
	for _, cmd := range cmds {
		switch x := cmd.(type) {
		case core.Spawn:
			st, ok := s.o.Config.Stage(x.Stage)
			if !ok {
				panic(fmt.Sprintf("dispatch: core spawned unknown stage %q", x.Stage))
			}
			if st.Input == conf.InputMessage {
				// Room for QUEUE_LIMIT lines of LINE_MAX bytes, the most the
				// core hands a worker that has not answered.
				stdinMax := st.QueueLimit * (s.o.Config.Dispatch.LineMax + 1)
				pending = append(pending, s.workers.SpawnFilter(x.Worker, x.Stage, st.Program, stdinMax))
			} else {
				pending = append(pending, s.workers.Spawn(x.Worker, x.Stage, st.Program))
			}
		case core.CheckProgram:
			pending = append(pending, s.checkProgram(x.Stage))
		case core.Write:
			if x.Lines != nil {
				s.workers.WriteLines(x.Worker, x.Lines)
			} else {
				s.workers.Write(x.Worker, x.IDs)
			}
		case core.Stop:
			s.workers.Stop(x.Worker)
		case core.Kill:
			s.workers.Kill(x.Worker)
		case core.SetTimer:
			s.timer.Stop()
			if !x.At.IsZero() {
				s.timer.Reset(max(0, time.Until(x.At)))
			}
		case core.Inspect:
			go func() { s.offLoop(s.queue.Inspect(s.ctx, x)) }()
		case core.Vacuum:
			go func() { s.offLoop(s.queue.Vacuum(s.ctx, x)) }()
		case core.Rest, core.Busy:
			s.log.Debug("gate", "command", cmd.String())
			s.gate.Do(cmd)
		case core.Pass:
			s.o.Traces.Pass(x)
		case core.Log:
			s.log.Log(s.ctx, level(x.Level), x.Msg)
		case core.Exit:
			return pending, &x
		default:
			if !core.IsQueue(cmd) {
				panic(fmt.Sprintf("dispatch: unknown command %T", cmd))
			}
			txn = append(txn, cmd)
		}
	}
	if len(txn) > 0 {
		s.runTxn(txn)
	}
	return pending, nil
}

// collect appends to pending what has happened, and reports false if the lock
// was lost. With block it waits for one thing to happen (answering requests for
// snapshots meanwhile: they are no events, the core does not step). Without,
// it takes at once everything already there (up to drainMax), but only from
// the sources whose news must reach the same Step: so that one Step sees every
// answer and exit that has arrived (capacities are current before the claim).
func (s *session) collect(pending []core.Event, block bool) ([]core.Event, bool) {
	// A nil channel is never ready: the timer, signals, snapshot requests and
	// the lock are heard only while waiting.
	var tick <-chan time.Time
	var snapshots <-chan chan<- core.Snapshot
	var signals <-chan os.Signal
	var shutdown, lost <-chan struct{}
	if block {
		tick, snapshots, signals, shutdown, lost = s.timer.C, s.o.Snapshots, s.signals, s.shutdown, s.lock.Lost()
	}
	for len(pending) < drainMax {
		if !block && s.quiet() {
			break
		}
		select {
		case ev := <-s.events:
			pending = append(pending, ev)
		case r := <-s.results:
			pending = append(pending, r.events...)
			s.tookResult(r)
		case <-s.notified:
			pending = append(pending, core.Ingress{})
		case <-s.dbUp:
			pending = append(pending, core.DatabaseUp{})
		case <-s.relisten:
			pending = append(pending, core.Ingress{}, core.DatabaseUp{})
		case <-tick:
			pending = append(pending, core.Tick{})
		case reply := <-snapshots:
			reply <- s.core.Snapshot() // buffered by the asker
			continue
		case sig := <-signals:
			s.log.Info("signal received", "signal", sig.String())
			s.stopping = true
			pending = append(pending, core.Shutdown{})
		case <-shutdown:
			s.shutdown = nil
			s.stopping = true
			pending = append(pending, core.Shutdown{})
		case <-lost:
			return pending, false
		}
		if block {
			break
		}
	}
	return pending, true
}

// quiet reports whether none of the sources collect drains holds anything.
// They are all buffered and only the loop receives from them, so what len
// counts is there to take: the drain's select cannot block. (A select with a
// default case would say the same, but collect's select serves the wait too.)
func (s *session) quiet() bool {
	return len(s.events) == 0 && len(s.results) == 0 &&
		len(s.notified) == 0 && len(s.dbUp) == 0 && len(s.relisten) == 0
}

// runTxn runs one step's queue commands as one transaction off the loop; the
// result comes back on s.results. A transaction past the timeout fails, and the
// core re-sends what it owed once a probe reaches the database.
func (s *session) runTxn(cmds []core.Command) {
	timeout := s.txnTimeout()
	for _, cmd := range cmds {
		if r, ok := cmd.(core.Resolve); ok {
			s.txns.items += len(r.Items)
		}
	}
	if !s.resultAt.IsZero() {
		s.txns.turns++
		s.txns.turnaround += time.Since(s.resultAt)
	}
	if s.inFlight > 0 {
		s.txns.beside++
	}
	s.inFlight++
	go func() {
		began := time.Now()
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		evs := s.queue.Exec(ctx, cmds)
		cancel()
		failed := slices.ContainsFunc(evs, func(ev core.Event) bool { return core.QueueErr(ev) != "" })
		s.results <- txnResult{events: evs, failed: failed, took: time.Since(began)}
	}()
}

// tookResult counts a transaction in the session's sums and, if it failed,
// its failure once the loop has taken it, and probes the database after it. The first failure in a row is probed at once:
// most often one session was lost (ended by an administrator, a failover, a
// network reset) while the server is fine, and every moment before the retry
// is a moment the pipeline stands still (docs/durability.md, "A lost
// session"). A failure the database answers at once (a missing table, a
// read-only server) would otherwise be retried as fast as the ping after it
// succeeds; each one after the first doubles the pause before the retry, from
// probeMin up to probeMax.
//
// The probe starts only once the loop has taken the failure into pending, so
// its DatabaseUp reaches the core after the failure. Started with the failure
// (off the loop), it could answer while the failure still waited in results;
// the loop could then take DatabaseUp first, the core would ignore it (not yet
// down) and then wait for the database forever.
func (s *session) tookResult(r txnResult) {
	s.inFlight--
	s.resultAt = time.Now()
	s.txns.count++
	s.txns.took += r.took
	for _, ev := range r.events {
		if c, ok := ev.(core.Claimed); ok {
			s.txns.items += len(c.Rows)
		}
	}
	if !r.failed {
		s.failures = 0
		return
	}
	s.failures++
	var wait time.Duration
	if s.failures > 1 {
		wait = min(probeMin<<min(s.failures-2, 16), probeMax)
	}
	go probe(s.ctx, s.queue, s.lock, s.log, s.dbUp, wait)
}

// workerEnv is the stage programs' environment: base (nil: the
// dispatcher's own) with PEPSI_DATABASE set to the database the dispatcher
// uses, when it names one. Its workers read the configuration file it read,
// whose [pepsi] DATABASE a -database flag or a PEPSI_DATABASE of the
// dispatcher's overrode: without it they would work on another database
// than the one whose messages they are handed. With no database named (the
// libpq PG* environment), they inherit that environment.
func workerEnv(base []string, database string) []string {
	if base == nil {
		base = os.Environ()
	}
	if database == "" {
		return base
	}
	env := make([]string, 0, len(base)+1)
	for _, kv := range base {
		if !strings.HasPrefix(kv, "PEPSI_DATABASE=") {
			env = append(env, kv)
		}
	}
	return append(env, "PEPSI_DATABASE="+database)
}

// txnTimeout is how long one queue transaction may take (Options.TxnTimeout).
func (s *session) txnTimeout() time.Duration {
	if s.o.TxnTimeout > 0 {
		return s.o.TxnTimeout
	}
	return txnTimeoutDefault
}
