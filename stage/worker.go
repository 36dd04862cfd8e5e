package stage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// Bounds of the retry loops (STYLE.md: every retry loop has a stated limit).
const (
	// reconnectDelayMin and reconnectDelayMax bound the pause between attempts to
	// reconnect after the connection was lost; the delay doubles in between. The
	// loop itself has no count limit: an id must not be answered before it ran, and
	// the dispatcher's MAX_RUNTIME watchdog is the bound on how long it may take.
	reconnectDelayMin = 100 * time.Millisecond
	reconnectDelayMax = 5 * time.Second
	// transientAttemptsMax is how many times one id is run again after a
	// serialization failure or deadlock before it is answered as failed.
	transientAttemptsMax = 5
	// connectTimeoutDefault applies when the database URL sets no connect_timeout,
	// so an unreachable server is reported instead of hanging on the OS timeout.
	// It is shorter than the dispatcher's start window: a worker that gives up
	// within the window counts as a program that cannot start (its ids are
	// requeued), one that gives up later as a crash (its head message fails).
	connectTimeoutDefault = core.StartWindow * 3 / 4
	// reasonMax bounds a reason on a status line (the dispatcher reads lines of at
	// most 64 KiB and stores the reason in the row).
	reasonMax = 1000
)

// worker is the state of one stage program: its one connection and its handlers.
type worker struct {
	stage    string
	handlers map[string]Handler
	fused    map[string]bool
	cfg      *pgx.ConnConfig
	conn     *pgx.Conn // nil while disconnected
	ahead    *row      // the next id's row, read in the previous pass's last round trip
	log      *slog.Logger
}

func newWorker(o Options, log *slog.Logger) (*worker, error) {
	names := strings.Join(sortedNames(o.Handlers), ", ")
	if o.Stage == "" {
		return nil, badConfig("PEPSI_STAGE is not set: pepsi-dispatch sets it to the stage a worker serves (this program serves: %s)", names)
	}
	if o.Handlers[o.Stage] == nil {
		return nil, badConfig("PEPSI_STAGE=%q has no handler in this program (it serves: %s)", o.Stage, names)
	}
	fused := map[string]bool{}
	for _, f := range o.Fused {
		if o.Handlers[f] == nil {
			return nil, badConfig("fused stage %q has no handler in this program (it serves: %s)", f, names)
		}
		// The dispatcher reads the name on the status line ("0 NAME:MICROS"),
		// and takes a line with a name it cannot read for a protocol error.
		if !conf.ValidStageName(f) {
			return nil, badConfig("fused stage %q: a stage name has only letters, digits, '_' and '-', at most 63 of them", f)
		}
		fused[f] = true
	}
	if o.In == nil || o.Out == nil {
		return nil, badConfig("stage options need both In and Out")
	}
	cfg, err := pgx.ParseConfig(o.DB)
	if err != nil {
		return nil, badConfig("database: %w", err)
	}
	// See the package comment: the dispatcher's synchronous commit that follows
	// every answer is the durability point.
	cfg.RuntimeParams["synchronous_commit"] = "off"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "pepsi-stage " + o.Stage
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeoutDefault
	}
	return &worker{stage: o.Stage, handlers: o.Handlers, fused: fused, cfg: cfg, log: log}, nil
}

// where names the server for error messages (never the password).
func (w *worker) where() string {
	return fmt.Sprintf("%s:%d (database %q, user %q)", w.cfg.Host, w.cfg.Port, w.cfg.Database, w.cfg.User)
}

func (w *worker) connect(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, w.cfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL at %s: %w", w.where(), err)
	}
	w.conn = conn
	return nil
}

func (w *worker) close() {
	if w.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = w.conn.Close(ctx) // closing a broken connection has nothing left to report
		w.conn = nil
	}
}

// closeBroken closes a connection left in no known state (a failed rollback; a
// handler may have left rows open on it). It stays w.conn, closed: the next
// statement on it reports a lost connection, and the message runs again on a
// new one.
func (w *worker) closeBroken(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = w.conn.Close(cctx)
}

// handle runs id to completion and returns its status line. next, if not 0, is
// the id that follows it, already read: its row is fetched in the round trip that
// commits id. handle returns an error only when ctx ends: a lost connection is
// re-established and the id run again (the transition is guarded, so a run after
// an unknown commit outcome finds the row moved and answers 0); a row changed
// under the pass is run again; a statement that fails is answered "1 …".
func (w *worker) handle(ctx context.Context, id, next int64) (string, error) {
	delay := reconnectDelayMin
	transient, losses := 0, 0
	for {
		if w.conn == nil {
			if err := w.connect(ctx); err != nil {
				if ctx.Err() != nil {
					return "", ctx.Err()
				}
				w.log.Error("reconnect failed; trying again", "stage", w.stage, "id", id, "retry_in", delay, "err", err)
				if err := sleep(ctx, delay); err != nil {
					return "", err
				}
				delay = min(2*delay, reconnectDelayMax)
				continue
			}
			w.log.Info("reconnected; running the message again", "stage", w.stage, "id", id)
		}
		answer, err := w.pass(ctx, id, next)
		if err == nil {
			return answer, nil
		}
		w.ahead = nil
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		switch {
		case isConnectionLoss(err, w.conn):
			w.log.Error("database connection lost; the message will run again on a new connection", "stage", w.stage, "id", id, "err", err)
			w.close()
			// The first reconnect is immediate (usually only this connection was
			// cut); if the same message loses connections again, back off.
			if losses++; losses > 1 {
				if err := sleep(ctx, delay); err != nil {
					return "", err
				}
				delay = min(2*delay, reconnectDelayMax)
			}
		case (isTransient(err) || errors.Is(err, errRowChanged)) && transient < transientAttemptsMax:
			transient++
		default:
			w.log.Error("message failed in the database", "stage", w.stage, "id", id, "err", err)
			return failure("database: " + err.Error()), nil
		}
	}
}

// errConnectionLost reports that the connection died while a handler ran.
var errConnectionLost = errors.New("database connection lost while the handler ran")

// row is a queue row as a pass reads it.
type row struct {
	id             int64
	stage, status  string
	state, payload []byte
	// version is the row version's xmin: the transition of a pass that held no
	// lock writes only over the version its handler was given.
	version uint32
}

// readSQL reads the row a pass starts from, without a lock: the row is running
// at this stage, so only this worker moves it, and the transition is guarded.
const readSQL = `SELECT ingress_id, stage, status, state, payload, xmin FROM pepsi.queue WHERE ingress_id = $1`

func scanRow(r pgx.Row) (row, error) {
	var x row
	err := r.Scan(&x.id, &x.stage, &x.status, &x.state, &x.payload, &x.version)
	return x, err
}

// transitionSQL performs every transition. The guard makes sure the row is still
// running at the stage that handled it and, when $7 is not null, that it is still
// the version the handler was given. When it moved no row it fails, with
// division_by_zero, which nothing else in it can raise: in a handler's
// transaction that stops the COMMIT queued behind it in the same batch (see
// commitTx), and in a batch's implicit transaction it rolls the batch back.
const transitionSQL = `WITH moved AS (
	UPDATE pepsi.queue
	SET stage = $2, status = $3, timeout = $4, state = $5, updated_at = now()
	WHERE ingress_id = $1 AND status = 'running' AND stage = $6 AND ($7::xid IS NULL OR xmin = $7::xid)
	RETURNING 1
)
SELECT 1 / count(*) FROM moved`

// transitionNoRow is the SQLSTATE (division_by_zero) of a transition that moved
// no row.
const transitionNoRow = "22012"

// pass runs one id in one transaction. Its error is a database error; every
// other outcome is a status line.
//
// A trivial stage is bound by round trips, each of which costs a context switch
// on both sides, so a pass whose handler does not use Message.Tx costs one: its
// row came with the previous pass's commit (or is read on its own), and its
// transition goes in one batch with the read of the next id's row (see commit).
// The handler works without a row lock; the transition writes only over the row
// version it was given, and otherwise the pass runs again. A handler that uses
// Message.Tx gets the transaction and the lock at its first statement (see
// lazyTx), and its statements commit with the transition.
func (w *worker) pass(ctx context.Context, id, next int64) (string, error) {
	r, err := w.read(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		w.log.Warn("message does not exist; answering 0 without running it", "stage", w.stage, "id", id)
		return "0", nil
	}
	if err != nil {
		return "", fmt.Errorf("read message %d: %w", id, err)
	}
	if r.status != "running" || r.stage != w.stage {
		// Someone else moved it, or an earlier run of ours committed before the
		// connection broke: the dispatcher will see the row as it is.
		w.log.Warn("message is not running at this stage; answering 0 without running it",
			"stage", w.stage, "id", id, "row_stage", r.stage, "row_status", r.status)
		return "0", nil
	}
	tx := &lazyTx{w: w, row: &r}
	defer tx.end(ctx)
	m := &Message{ID: id, Stage: w.stage, Payload: r.payload, Tx: tx}
	if m.State, err = decodeState(r.state); err != nil {
		return failure(fmt.Sprintf("state of message %d: %v", id, err)), nil
	}

	res := w.call(ctx, w.stage, m)
	by := w.stage // the stage whose handler produced res
	chain := []string{w.stage}
	var report []string
	for res.kind == kindAdvance && w.fused[res.next] {
		if slices.Contains(chain, res.next) {
			return failure(fmt.Sprintf("fused stages loop: %s -> %s", strings.Join(chain, " -> "), res.next)), nil
		}
		by = res.next
		chain = append(chain, by)
		m.Stage = by
		start := time.Now()
		res = w.call(ctx, by, m)
		report = append(report, fmt.Sprintf("%s:%d", by, time.Since(start).Microseconds()))
	}
	if w.conn.IsClosed() {
		return "", errConnectionLost
	}
	if tx.changed() {
		return "", errRowChanged // whatever the handler decided, it decided on an old row
	}
	prefix := ""
	if by != w.stage {
		prefix = by + ": "
	}

	// A fused stage that finishes or pauses the message leaves it at the stage the
	// pass started at: that is a stage the dispatcher knows, so a woken or retried
	// message is claimed again (and runs the whole pass again).
	newStage, newStatus := w.stage, ""
	var timeout *time.Time
	switch res.kind {
	case kindAdvance:
		if res.next == "" {
			return failure(prefix + "advanced to an empty stage name"), nil
		}
		if res.next == w.stage {
			return failure(fmt.Sprintf("%sadvanced to its own stage %q, which would run it again forever", prefix, w.stage)), nil
		}
		newStage, newStatus = res.next, "running"
	case kindDone:
		newStatus = "done"
	case kindFailed:
		newStatus = "failed"
		if m.State == nil {
			m.State = map[string]any{}
		}
		m.State["error"] = prefix + res.reason
	case kindPause:
		newStatus = "paused"
		timeout = &res.until
	case kindError:
		return failure(prefix + res.reason), nil
	default:
		return failure(prefix + "handler returned no Result (use stage.Advance, Done, Failed, Pause or Error)"), nil
	}
	newState := []byte("{}")
	if m.State != nil {
		if newState, err = json.Marshal(m.State); err != nil {
			return failure(fmt.Sprintf("%sstate cannot be written as JSON: %v", prefix, err)), nil
		}
	}
	if tx.err != nil {
		// The handler's transaction could not begin (its statements failed) and
		// the connection is still inside it: report that rather than commit a
		// transition without them.
		return "", tx.err
	}
	moved, err := w.commit(ctx, tx, newStage, newStatus, timeout, newState, next)
	if err != nil {
		return "", err
	}
	if !moved {
		if !tx.begun() {
			// No lock was held: the row changed since it was read (an operator, or
			// a previous dispatcher's reset). Run again on the row as it is now.
			return "", errRowChanged
		}
		// The row is locked by this transaction, so only the handler's own
		// statements on m.Tx can have moved it: a stage bug, undone by rollback.
		return failure(fmt.Sprintf("%sthe handler moved message %d itself; return a Result instead of writing pepsi.queue", prefix, id)), nil
	}
	if len(report) == 0 {
		return "0", nil
	}
	return "0 " + strings.Join(report, " "), nil
}

// read returns the row of id: the one fetched ahead by the previous pass if it is
// that id's, else read now.
func (w *worker) read(ctx context.Context, id int64) (row, error) {
	if a := w.ahead; a != nil {
		w.ahead = nil
		if a.id == id {
			return *a, nil
		}
	}
	return scanRow(w.conn.QueryRow(ctx, readSQL, id))
}

// commit writes the transition and commits it, in one round trip with the read
// of the next id's row (kept in w.ahead) when next is not 0. moved is false when
// the transition found no row to move; a transaction the handler opened is then
// left open (aborted), for tx.end to roll back.
//
// Without a transaction of the handler's, the batch is the read ahead and the
// transition, which PostgreSQL runs as one implicit transaction committed at the
// batch's end: no BEGIN or COMMIT to execute, and a failed read ahead means no
// transition rather than a lost one.
func (w *worker) commit(ctx context.Context, tx *lazyTx, newStage, newStatus string, timeout *time.Time, newState []byte, next int64) (moved bool, err error) {
	if tx.begun() {
		return w.commitTx(ctx, tx.row, newStage, newStatus, timeout, newState, next)
	}
	r := tx.row
	b := &pgx.Batch{}
	if next != 0 {
		b.Queue(readSQL, next)
	}
	b.Queue(transitionSQL, r.id, newStage, newStatus, timeout, newState, w.stage, &r.version)
	br := w.conn.SendBatch(ctx, b)
	var ahead *row
	if next != 0 {
		a, err := scanRow(br.QueryRow())
		switch {
		case err == nil:
			ahead = &a
		case errors.Is(err, pgx.ErrNoRows):
			// The next id has no row; its own pass will say so.
		default:
			_ = br.Close() // repeats err
			if isConnectionLoss(err, w.conn) {
				return false, fmt.Errorf("read message %d ahead: %w", next, err)
			}
			// The batch stopped at the read: the transition did not run. Send
			// it on its own.
			return w.commit(ctx, tx, newStage, newStatus, timeout, newState, 0)
		}
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close() // repeats err; the implicit transaction is rolled back
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == transitionNoRow {
			return false, nil
		}
		return false, fmt.Errorf("write transition of message %d: %w", r.id, err)
	}
	// The batch's end commits the implicit transaction.
	if err := br.Close(); err != nil {
		return false, fmt.Errorf("commit message %d: %w", r.id, err)
	}
	w.ahead = ahead
	return true, nil
}

// commitTx writes the transition in the transaction the handler opened, commits
// it and then reads the next id's row, in one round trip.
func (w *worker) commitTx(ctx context.Context, r *row, newStage, newStatus string, timeout *time.Time, newState []byte, next int64) (moved bool, err error) {
	b := &pgx.Batch{}
	// The row is locked: no version guard (the handler may have changed the row
	// in place; only moving it is a bug).
	b.Queue(transitionSQL, r.id, newStage, newStatus, timeout, newState, w.stage, nil)
	b.Queue("COMMIT")
	if next != 0 {
		b.Queue(readSQL, next)
	}
	br := w.conn.SendBatch(ctx, b)
	// Close repeats the first error, already returned below, or reports one in
	// the read ahead, which only costs the next pass a read of its own.
	defer br.Close() //nolint:errcheck // see above
	if _, err := br.Exec(); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == transitionNoRow {
			return false, nil
		}
		return false, fmt.Errorf("write transition of message %d: %w", r.id, err)
	}
	tag, err := br.Exec()
	if err != nil {
		return false, fmt.Errorf("commit message %d: %w", r.id, err)
	}
	// A COMMIT of a transaction that had failed answers ROLLBACK without an error.
	if tag.String() != "COMMIT" {
		return false, fmt.Errorf("commit message %d: %w", r.id, pgx.ErrTxCommitRollback)
	}
	if next != 0 {
		if a, err := scanRow(br.QueryRow()); err == nil {
			w.ahead = &a
		}
	}
	return true, nil
}

// call runs one handler, turning a panic into an Error result.
func (w *worker) call(ctx context.Context, stage string, m *Message) (res Result) {
	defer func() {
		if r := recover(); r != nil {
			w.log.Error("handler panicked", "stage", stage, "id", m.ID, "panic", fmt.Sprint(r), "at", panicSite())
			res = Error(fmt.Sprintf("panic: %v", r))
		}
	}()
	return w.handlers[stage](ctx, m)
}

// panicSite names the function and line that panicked: the first frame after
// runtime.gopanic that is not in the runtime itself.
func panicSite() string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	panicking := false
	for {
		f, more := frames.Next()
		if panicking && !strings.HasPrefix(f.Function, "runtime.") {
			return fmt.Sprintf("%s (%s:%d)", f.Function, f.File, f.Line)
		}
		if f.Function == "runtime.gopanic" {
			panicking = true
		}
		if !more {
			return "unknown"
		}
	}
}

// decodeState reads the row's state, keeping numbers exact (json.Number).
func decodeState(raw []byte) (map[string]any, error) {
	state := map[string]any{}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&state); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if state == nil { // the JSON value null
		state = map[string]any{}
	}
	return state, nil
}

// failure is the status line of a message this pass could not handle.
func failure(reason string) string {
	reason = strings.Join(strings.Fields(reason), " ")
	if reason == "" {
		reason = "no reason given"
	}
	if len(reason) > reasonMax {
		reason = strings.ToValidUTF8(reason[:reasonMax], "") + "…"
	}
	return "1 " + reason
}

// sleep waits d or until ctx ends.
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
