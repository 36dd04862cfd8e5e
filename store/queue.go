package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core"
)

// attemptsMax bounds how often one step's transaction is run when PostgreSQL
// reports a serialization failure or a deadlock.
const attemptsMax = 5

// retryBackoffMin is the pause before the second attempt; it doubles for each
// later one (10, 20, 40, 80 ms: at most 150 ms in all).
const retryBackoffMin = 10 * time.Millisecond

// rollbackTimeout bounds the ROLLBACK sent after a failed step, which runs even
// when the step's context was cancelled so the connection can go back to the pool.
const rollbackTimeout = 5 * time.Second

// SessionParams are the run-time parameters of the sessions Queue's
// transactions run on, which the dispatcher's pool sets at connect:
//   - synchronous_commit on: the step's commit is the durability point of
//     every hop (docs/durability.md), which no server or role default may
//     make asynchronous.
//   - plan_cache_mode force_generic_plan: the statements are prepared once and
//     run thousands of times a second; left to itself PostgreSQL plans the
//     claim and the resolve anew at every run (their custom plans look
//     cheaper than the generic one), about 0.7 ms of planning per claim.
//     Their generic plans are the ones this package's plan tests check. A
//     session keeps each until a vacuum or an analyze of the queue, which is
//     why the core has a queue analyzed once it outgrows the size its plans
//     were made for (core.OutgrewPlans).
func SessionParams() map[string]string {
	return map[string]string{
		"synchronous_commit": "on",
		"plan_cache_mode":    "force_generic_plan",
	}
}

// boundLockWaitsSQL sets the session's lock_timeout to $1 unless the role,
// the database or the connection string already set a shorter one.
const boundLockWaitsSQL = `SELECT set_config('lock_timeout', $1, false)
WHERE current_setting('lock_timeout')::interval = interval '0'
   OR current_setting('lock_timeout')::interval > $1::interval`

// BoundLockWaits returns a connect step for the sessions Queue's
// transactions run on: their statements wait at most wait for a lock
// (lock_timeout), which the dispatcher sets a little under its transaction
// timeout. A step whose statement waits for a row another session holds
// (an operator's open transaction, a tool's SELECT ... FOR UPDATE) then
// ends with the server's ERROR (55P03) before its COMMIT: it certainly did
// not commit, and the core sends its work again as it was. Ended by the
// transaction timeout instead, its reply is lost with no answer, and the
// transaction is in doubt: the core resets rows and a stage may run a
// message again (docs/durability.md). A shorter lock_timeout of the role's
// is kept.
func BoundLockWaits(wait time.Duration) func(context.Context, *pgx.Conn) error {
	ms := fmt.Sprintf("%dms", max(wait.Milliseconds(), 1))
	return func(ctx context.Context, conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, boundLockWaitsSQL, ms); err != nil {
			return fmt.Errorf("bound the session's lock waits: %w", err)
		}
		return nil
	}
}

// Queue executes the dispatcher's queue commands against PostgreSQL. It
// implements Executor. Exec may run beside itself, each call a transaction on
// a session of its own from the pool, as many as the core has outstanding
// (SESSIONS): the core sends beside each other only transactions that touch
// no row in common (docs/scaling.md). The rule for a transaction in doubt
// holds for all of them: its session is ended before any transaction is sent
// after its failure is known. Inspect and Vacuum may run beside it.
type Queue struct {
	// PG runs the statements of Executor other than Exec on the pool, each in
	// a transaction of its own.
	*PG

	pool *pgxpool.Pool
	log  *slog.Logger

	// fenced is set by Fence: nothing more is sent.
	fenced atomic.Bool

	// mu guards doubt.
	mu sync.Mutex
	// doubt lists the server sessions whose transactions may still be
	// running: their replies were lost and the sessions could not be ended
	// yet (endDoubt). No transaction is sent until they are gone.
	doubt []Backend

	// lockWaitAfter: see watchLockWait (lockWaitWarnAfter; shorter in tests).
	lockWaitAfter time.Duration
}

// New returns a Queue that runs its transactions on connections from pool and logs
// retries to log.
func New(pool *pgxpool.Pool, log *slog.Logger) *Queue {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Queue{PG: On(pool), pool: pool, log: log, lockWaitAfter: lockWaitWarnAfter}
}

// Fence stops q from sending any transaction from now on (a retry, a
// narrowed rerun, a new Exec): its dispatcher lost its lock, and another may
// hold it and reset and claim the rows again, so a transaction of this one
// begun after that could write over a pass of the next holder's. A
// transaction already sent ends as it would.
func (q *Queue) Fence() { q.fenced.Store(true) }

// errFenced is the error of a transaction not sent after Fence.
var errFenced = errors.New("not sent: the dispatcher lost its lock")

// Ping reports whether the database answers, so the daemon can tell an outage is
// over before it lets the core retry the writes it owes.
func (q *Queue) Ping(ctx context.Context) error {
	if err := q.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping queue database: %w", err)
	}
	return nil
}

// Exec runs cmds in order in one READ COMMITTED transaction with
// synchronous_commit on, sent as one pipelined batch (BEGIN, the statements,
// the transaction's id, COMMIT), and returns one result event per command in
// the same order, each with its command's Op. The COMMIT is the durability point
// of the pipeline: a claimed id reaches a worker only after it. If the
// transaction fails, every result carries the error text, and core.Claimed and
// core.Resolved say Aborted when it certainly did not commit (rolledBack,
// settle). A serialization failure or deadlock reruns the whole transaction, up
// to attemptsMax times. A transaction the database refuses for the data
// itself (Refused) is run again narrowed (runNarrowed): a message whose
// outcome is refused gets its failure written instead, and the rest commits.
//
// Exec panics if cmds holds a command that is not a queue command (see
// core.IsQueue): that is a bug in the caller, not a database failure.
func (q *Queue) Exec(ctx context.Context, cmds []core.Command) []core.Event {
	if len(cmds) == 0 {
		return nil
	}
	stmts := make([]statement, len(cmds))
	for i, c := range cmds {
		stmts[i] = statementFor(c)
	}
	var err error
	for attempt := 1; ; attempt++ {
		var events []core.Event
		var xid string
		var sess Backend
		events, xid, sess, err = q.run(ctx, stmts)
		if err == nil {
			return events
		}
		err = q.settle(ctx, sess, xid, err)
		if !Retryable(err) {
			break
		}
		if attempt == attemptsMax {
			err = fmt.Errorf("gave up after %d attempts: %w", attempt, err)
			break
		}
		backoff := retryBackoffMin << (attempt - 1)
		q.log.Warn("queue transaction failed, retrying", "attempt", attempt, "backoff", backoff, "err", err)
		if werr := sleep(ctx, backoff); werr != nil {
			err = fmt.Errorf("%w (retry abandoned: %w)", err, werr)
			break
		}
	}
	var rb *rolledBack
	aborted := errors.As(err, &rb)
	if r, ok := queuedAlone(cmds); ok && aborted && lockNotAvailable(err) {
		// Its short lock wait ran out (queuedLockWaitSQL): nothing of it
		// was written, and every item waits for its keys again.
		return []core.Event{keyBusyAll(r)}
	}
	if aborted && Refused(err) && slices.ContainsFunc(cmds, isResolve) {
		// Perhaps one message's outcome: the same commands again, narrowed
		// down to it (runNarrowed), the rest written.
		events, xid, sess, nerr := q.runNarrowed(ctx, cmds)
		if nerr == nil {
			return events
		}
		if !errors.Is(nerr, errNotNarrowed) {
			// Failed for a reason of its own: that is the step's outcome,
			// settled as any attempt's (it may be in doubt).
			err = q.settle(ctx, sess, xid, nerr)
			aborted = errors.As(err, &rb)
		} else {
			q.log.Debug("queue transaction: the refusal could not be narrowed to one message", "err", nerr)
		}
	}
	if Refused(err) {
		err = fmt.Errorf("%w; the database refused the data itself, so every try fails the same way until what refuses it is removed (docs/operations.md, \"A write the database refuses\")", err)
	}
	events := make([]core.Event, len(stmts))
	for i, s := range stmts {
		events[i] = markAborted(s.failed(err.Error()), aborted)
	}
	return events
}

// queuedAlone returns the transaction's Resolve when it is one with
// QueueKeys, which goes alone (core.Resolve).
func queuedAlone(cmds []core.Command) (core.Resolve, bool) {
	if len(cmds) != 1 {
		return core.Resolve{}, false
	}
	r, ok := cmds[0].(core.Resolve)
	return r, ok && r.QueueKeys
}

// keyBusyAll answers every item of r KeyBusy: its row still running at its
// stage, nothing of it written.
func keyBusyAll(r core.Resolve) core.Resolved {
	out := make([]core.Outcome, len(r.Items))
	for i, it := range r.Items {
		out[i] = core.Outcome{ID: it.ID, Stage: it.Stage, Status: core.StatusRunning, KeyBusy: true}
	}
	return core.Resolved{Op: r.Op, Outcomes: out}
}

// lockNotAvailable says whether err is a lock wait that ran out
// (lock_not_available, 55P03).
func lockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// isResolve reports whether c is a Resolve.
func isResolve(c core.Command) bool {
	_, ok := c.(core.Resolve)
	return ok
}

// rolledBack wraps the error of a transaction that certainly did not commit:
// it never reached the server (no connection), or the server answered an error
// to a statement before the COMMIT (BEGIN included), or answered the COMMIT
// with an ERROR or ROLLBACK. An ERROR aborts the transaction, so the COMMIT
// rolls back; a FATAL ends the session there, before the COMMIT runs. A FATAL
// answering the COMMIT itself, or a connection that broke or timed out
// without an answer, leaves the transaction in doubt: it may have committed.
type rolledBack struct{ err error }

func (e *rolledBack) Error() string { return e.err.Error() }
func (e *rolledBack) Unwrap() error { return e.err }

// abortedIfAnswered wraps err in rolledBack if the server answered it (a
// *pgconn.PgError) to a statement before the COMMIT.
func abortedIfAnswered(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return &rolledBack{err}
	}
	return err
}

// markAborted sets the Aborted flag of the result events that carry one
// (core.Claimed, core.Resolved: the core then knows no claim took rows and no
// item was applied).
func markAborted(ev core.Event, aborted bool) core.Event {
	switch e := ev.(type) {
	case core.Claimed:
		e.Aborted = aborted
		return e
	case core.Resolved:
		e.Aborted = aborted
		return e
	}
	return ev
}

// doubtWait bounds how long settle waits for a transaction in doubt to end.
const doubtWait = time.Second

// settle resolves the doubt a failed attempt left, where it can: err, from
// run, either already says the transaction did not commit (rolledBack), or
// the reply was lost. Then the attempt's session, sess (PID 0 when none runs
// on in the server), is ended first
// (endDoubt): the transaction may still be running in the server (waiting for
// a row lock, or sent whole in the batch while the connection broke), and it
// must end, committed or not, before the core hears of the failure and
// before the next transaction begins. Otherwise it could commit after
// transactions the core sent later: a claim, with the exclusion list it was
// sent with, could take a row the dispatcher claimed since, gave a worker and
// an operator retried meanwhile, and hand one message to two passes. With
// the transaction's id xid known, the server is then asked what became of it
// (pg_xact_status, on a connection of the pool: the failed one is gone),
// waiting up to doubtWait while a session not yet ended still finishes it; an
// answer "aborted" makes err a rolledBack. Anything else ("committed", an
// unknown or too old id, no answer) leaves err as it was: in doubt, for the
// core to handle as such.
func (q *Queue) settle(ctx context.Context, sess Backend, xid string, err error) error {
	var rb *rolledBack
	if errors.As(err, &rb) {
		return err
	}
	q.addDoubt(sess)
	if derr := q.endDoubt(ctx); derr != nil {
		// Not yet: the next attempt, or the next step, ends it before it sends
		// anything (run).
		q.log.Warn("queue transaction in doubt: cannot end its session yet; no transaction is sent until it is gone", "pid", sess.PID, "err", derr)
	}
	if xid == "" {
		return err
	}
	if xid == readOnly {
		return &rolledBack{err}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), doubtWait)
	defer cancel()
	for {
		var status *string
		if qerr := q.pool.QueryRow(ctx, xactStatusSQL, xid).Scan(&status); qerr != nil {
			q.log.Debug("queue transaction in doubt: cannot look it up", "xid", xid, "err", qerr)
			return err
		}
		switch {
		case status == nil:
			return err
		case *status == "aborted":
			q.log.Debug("queue transaction in doubt: the server says it aborted", "xid", xid)
			return &rolledBack{err}
		case *status != "in progress":
			return err
		}
		if sleep(ctx, 5*time.Millisecond) != nil {
			return err
		}
	}
}

// addDoubt notes sess (none when its PID is 0) as a session to end before
// anything is sent again (endDoubt): its transaction may still run in the
// server.
func (q *Queue) addDoubt(sess Backend) {
	if sess.PID == 0 {
		return
	}
	q.mu.Lock()
	q.doubt = append(q.doubt, sess)
	q.mu.Unlock()
}

// doubtEndWait bounds how long endDoubt waits to reach the server, end the
// session and see it gone; past it the session is ended before the next send.
const doubtEndWait = 5 * time.Second

// endDoubt ends the sessions whose transactions are in doubt, if there are
// any, and waits until the server has let them go, so that their
// transactions have ended, committed or not (a session ended while it waits
// for a lock rolls back; one ended during its COMMIT finishes the commit
// first). A session is matched by its process id, the pool's
// application_name and its start (noted at connect by NoteBackendStart, when
// the pool has it as its AfterConnect), so a process id the server has given
// to another session since, another client's or one of this pool's, is
// neither ended nor waited for.
func (q *Queue) endDoubt(ctx context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.doubt) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), doubtEndWait)
	defer cancel()
	appName := q.pool.Config().ConnConfig.RuntimeParams["application_name"]
	signalled, err := endSessions(ctx, q.pool, q.doubt, appName)
	if err != nil {
		return fmt.Errorf("end sessions %v, whose transactions are in doubt: %w", pidsOf(q.doubt), err)
	}
	q.log.Debug("queue transactions in doubt: their sessions have ended", "pids", pidsOf(q.doubt), "signalled", signalled)
	q.doubt = nil
	return nil
}

// backendStartSQL answers when the server began this session.
const backendStartSQL = `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`

// backendStartKey is where NoteBackendStart keeps a connection's start in
// its pgconn.PgConn's CustomData.
const backendStartKey = "pepsi.backend_start"

// NoteBackendStart is an AfterConnect for the pool a Queue runs on: it notes
// when the server began the connection's session (backend_start), so that a
// session whose transaction is left in doubt is ended, and waited for, by its
// process id and its start, never a later session the server gave that id.
func NoteBackendStart(ctx context.Context, conn *pgx.Conn) error {
	var start *time.Time
	if err := conn.QueryRow(ctx, backendStartSQL).Scan(&start); err != nil {
		return fmt.Errorf("note the session's start: %w", err)
	}
	if start != nil {
		conn.PgConn().CustomData()[backendStartKey] = *start
	}
	return nil
}

// backendOf names the server session of c: its process id, and its start
// where NoteBackendStart noted it.
func backendOf(c *pgconn.PgConn) Backend {
	b := Backend{PID: int32(c.PID())}
	if start, ok := c.CustomData()[backendStartKey].(time.Time); ok {
		b.Start = start
	}
	return b
}

// xactIDSQL, the last statement before the COMMIT, answers the transaction's
// id, or NULL if it wrote nothing (it does not assign one: a claim that finds
// nothing stays a read-only transaction, whose commit flushes no WAL).
// xactStatusSQL answers what became of transaction $1 ("committed",
// "aborted", "in progress", or NULL when too old to say).
const (
	xactIDSQL     = `SELECT pg_current_xact_id_if_assigned()::text`
	xactStatusSQL = `SELECT pg_xact_status($1::xid8)`
)

// readOnly is run's xid for a transaction that wrote nothing.
const readOnly = "read-only"

// run sends one attempt of the step's transaction and reads its results. xid
// is the transaction's id once the server has answered it.
func (q *Queue) run(ctx context.Context, stmts []statement) (events []core.Event, xid string, sess Backend, err error) {
	conn, err := q.acquire(ctx)
	if err != nil {
		return nil, "", Backend{}, err
	}
	defer conn.Release()
	defer func() {
		if err != nil {
			rollback(conn.Conn())
		}
		if err == nil || !conn.Conn().IsClosed() {
			// Nothing of the transaction runs on in the server: the session
			// answered all of it (PID 0: settle has no session to end).
			sess = Backend{}
			return
		}
		// Our side of the session is gone. Whatever ended it (an
		// administrator ending the dispatcher's sessions, a server restart, a
		// network reset) most likely ended the pool's idle sessions too: drop
		// them, so the retry connects afresh instead of failing on each in
		// turn. The server's side may live on, its transaction with it.
		q.pool.Reset()
		if sess = backendOf(conn.Conn().PgConn()); sess.PID == 0 {
			q.log.Warn("queue transaction in doubt: the server named no process for the session (a connection pooler between?), so it cannot be ended; it may commit after later transactions")
		}
	}()

	defer q.watchLockWait(backendOf(conn.Conn().PgConn()))()
	br := conn.SendBatch(ctx, txnBatch(stmts))
	committed := false
	defer func() {
		cerr := br.Close()
		switch {
		case cerr == nil || err != nil:
		case committed:
			// The server acknowledged the COMMIT: the transaction is durable
			// and its results stand, whatever became of the session after it
			// (ended by an administrator, say); the pool drops a closed one.
			q.log.Debug("queue transaction: the connection failed after the COMMIT", "err", cerr)
		default:
			err = fmt.Errorf("queue transaction: %w", cerr)
		}
	}()
	for _, what := range []string{"begin", "set synchronous_commit"} {
		if _, err := br.Exec(); err != nil {
			return nil, "", sess, abortedIfAnswered(fmt.Errorf("queue transaction: %s: %w", what, err))
		}
	}
	events = make([]core.Event, len(stmts))
	for i, s := range stmts {
		ev, err := s.read(br)
		if err != nil {
			return nil, "", sess, abortedIfAnswered(fmt.Errorf("queue transaction: %s: %w", s.name, err))
		}
		events[i] = ev
	}
	if xid, err = readCommit(br); err != nil {
		return nil, xid, sess, err
	}
	committed = true
	return events, xid, sess, nil
}

// acquire takes the connection a queue transaction runs on, once the
// sessions in doubt are ended (endDoubt), unless the queue is fenced (Fence),
// before or while it waited for one. Its error is a rolledBack: nothing was
// sent.
func (q *Queue) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	if q.fenced.Load() {
		return nil, &rolledBack{fmt.Errorf("queue transaction: %w", errFenced)}
	}
	if err := q.endDoubt(ctx); err != nil {
		return nil, &rolledBack{fmt.Errorf("queue transaction: not sent: %w", err)}
	}
	conn, err := q.pool.Acquire(ctx)
	if err != nil {
		return nil, &rolledBack{fmt.Errorf("queue transaction: acquire connection: %w", err)}
	}
	if q.fenced.Load() {
		conn.Release()
		return nil, &rolledBack{fmt.Errorf("queue transaction: %w", errFenced)}
	}
	return conn, nil
}

// txnBatch is the batch of one queue transaction: the statements, between a
// BEGIN that turns synchronous commit on and a COMMIT, and the transaction's id
// read before the COMMIT.
func txnBatch(stmts []statement) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	// The COMMIT below is what makes a claim safe to hand to a worker, whatever
	// the server's or the role's default.
	b.Queue("SET LOCAL synchronous_commit = on")
	for _, s := range stmts {
		s.queue(b)
	}
	b.Queue(xactIDSQL)
	b.Queue("COMMIT")
	return b
}

// readCommit reads the end of a queue transaction's batch: its transaction id
// (readOnly when it wrote nothing) and the answer to its COMMIT. An error that
// is a *rolledBack says the transaction certainly did not commit.
func readCommit(br pgx.BatchResults) (xid string, err error) {
	var id *string
	if err := br.QueryRow().Scan(&id); err != nil {
		return "", abortedIfAnswered(fmt.Errorf("queue transaction: transaction id: %w", err))
	}
	if id == nil {
		// Nothing was written: committed or not, the transaction changed
		// nothing, which is what a failure of the COMMIT is told as.
		xid = readOnly
	} else {
		xid = *id
	}
	tag, err := br.Exec()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Severity == "ERROR" {
		// Answered, and the session lives on: the COMMIT rolled back.
		return xid, &rolledBack{fmt.Errorf("queue transaction: commit: %w", err)}
	}
	if err != nil {
		return xid, fmt.Errorf("queue transaction: commit: %w", err)
	}
	// A COMMIT of a transaction that had failed answers ROLLBACK without an error.
	if tag.String() != "COMMIT" {
		return xid, &rolledBack{fmt.Errorf("queue transaction: commit answered %s", tag.String())}
	}
	return xid, nil
}

// rollback ends a transaction a failed batch left open (PostgreSQL keeps an
// explicit transaction open, aborted, past the batch's Sync) so the connection can
// be reused. If it cannot, the pool discards the connection on release.
func rollback(conn *pgx.Conn) {
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	_, _ = conn.Exec(ctx, "ROLLBACK") // on failure the pool closes the connection: nothing to report
}

// Retryable reports whether err means PostgreSQL rolled the transaction back
// because of a serialization failure (SQLSTATE 40001) or a deadlock (40P01), so
// running the same transaction again is safe. Every other error is not retried.
func Retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "40001", "40P01":
		return true
	}
	return false
}

// Refused says whether err is the server refusing the data a statement
// wrote (SQLSTATE class 22, data exception; 23, integrity constraint
// violation; 54, program limit exceeded), not a failure of the connection or
// the server: the same statement fails the same way again.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

// Unavailable says whether err is the database not answering rather than
// refusing what was asked: no answer from the server at all (it cannot be
// reached, the connection broke, a deadline passed), or the server's own
// SQLSTATE saying so (class 08, connection exception; 53, insufficient
// resources such as too many connections; 57P01 to 57P03, shutting down,
// crashed, or starting; 57P05, the session ended idle; 25006, read-only:
// a standby, or a failover under way). The same request may succeed once it
// answers again.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		var connectErr *pgconn.ConnectError
		var netErr net.Error
		return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.Timeout(err) ||
			errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
			errors.Is(err, context.DeadlineExceeded)
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "08"), strings.HasPrefix(pgErr.Code, "53"):
		return true
	case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", pgErr.Code == "57P05":
		return true
	case ReadOnly(err):
		return true
	}
	return false
}

// ReadOnly says whether err is the server refusing a write because it takes
// none (25006, read_only_sql_transaction: a standby, a failover under way,
// default_transaction_read_only): refused before it was done, so nothing of
// it was written.
func ReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
}

// Canceled says whether err is the server cancelling a statement (57014,
// query_canceled: a statement_timeout, or a cancel request): the
// transaction did not commit.
func Canceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

// sleep waits d or until ctx is done, whichever is first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Inspect answers a core.Inspect: the queue table's health (inspectSQL).
func (q *Queue) Inspect(ctx context.Context, c core.Inspect) core.Inspected {
	ev := core.Inspected{Op: c.Op}
	var age float64
	err := q.pool.QueryRow(ctx, inspectSQL).Scan(&ev.Dead, &ev.Live, &ev.Vacuuming, &ev.Autovacuum, &age, &ev.Horizon, &ev.Pages, &ev.PlannedPages, &ev.PlannedRows, &ev.NotOwner)
	if err != nil {
		ev.Err = fmt.Sprintf("inspect pepsi.queue: %v", err)
		return ev
	}
	ev.HorizonAge = time.Duration(age * float64(time.Second))
	run := c.Run
	if run == nil {
		run = []string{} // NULL would make "<> ALL" match nothing
	}
	rows, _ := q.pool.Query(ctx, unrunSQL, run, unrunCountMax)
	ev.Unrun, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (core.StageCount, error) {
		var sc core.StageCount
		err := r.Scan(&sc.Stage, &sc.N)
		return sc, err
	})
	if err != nil {
		return core.Inspected{Op: c.Op, Err: fmt.Sprintf("inspect pepsi.queue: stages nobody runs: %v", err)}
	}
	return ev
}

// Vacuum answers a core.Vacuum: VACUUM, VACUUM (ANALYZE) or ANALYZE of
// pepsi.queue (c.Kind) on a connection of the pool, outside any transaction.
// It may take a while; ctx ends it.
func (q *Queue) Vacuum(ctx context.Context, c core.Vacuum) core.Vacuumed {
	began := time.Now()
	sql, what, done := vacuumSQL, "vacuum", "vacuumed"
	switch c.Kind {
	case core.VacuumAnalyze:
		sql, what, done = vacuumAnalyzeSQL, "vacuum and analyze", "vacuumed and analyzed"
	case core.AnalyzeOnly:
		sql, what, done = analyzeSQL, "analyze", "analyzed"
	}
	if _, err := q.pool.Exec(ctx, sql); err != nil {
		return core.Vacuumed{Op: c.Op, Err: fmt.Sprintf("%s pepsi.queue: %v", what, err)}
	}
	q.log.Debug(done+" pepsi.queue", "took", time.Since(began).Round(time.Millisecond))
	return core.Vacuumed{Op: c.Op}
}
