package stage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/pgaddr"
	"github.com/pepsi-pipeline/pepsi/internal/pgnet"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Bounds of the retry loops and of what goes on a status line (STYLE.md: every
// retry loop and buffer has a stated limit).
const (
	// reconnectDelayMin and reconnectDelayMax bound the pause between attempts to
	// reconnect after the connection was lost; the delay doubles in between. The
	// loop itself has no count limit: an id must not be answered before it ran, and
	// the dispatcher's MAX_RUNTIME watchdog is the bound on how long it may take.
	reconnectDelayMin = 100 * time.Millisecond
	reconnectDelayMax = 5 * time.Second
	// transientAttemptsMax is how many times one id is run again after a
	// serialization failure, a deadlock or a row changed under its pass before it
	// is answered as failed.
	transientAttemptsMax = 5
	// connectTimeoutDefault applies when the database URL sets no connect_timeout,
	// so an unreachable server is reported instead of hanging on the OS timeout.
	// It is shorter than the dispatcher's start window: a worker that gives up
	// within the window counts as a program that cannot start (its ids are
	// requeued), one that gives up later as a crash (its head message fails).
	connectTimeoutDefault = core.StartWindow * 3 / 4
	// reasonMax bounds a reason on a status line (the dispatcher stores it in the
	// row).
	reasonMax = 1000
	// answerMax bounds an answer line that carries a state patch: half the 64 KiB
	// the dispatcher reads of one line. A longer one is not sent; the library
	// writes that transition itself and answers a bare 0 instead.
	answerMax = 32 << 10
)

// worker is the state of one stage program: its one connection and its handlers.
type worker struct {
	stage    string
	handlers map[string]Handler
	fused    map[string]bool
	writeAll bool // Options.WriteTransitions
	cfg      *pgx.ConnConfig
	conn     *pgx.Conn // nil while disconnected
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
		if !conf.ValidStageName(f) || f == core.TargetDone {
			return nil, badConfig("fused stage %q: a stage name has only letters, digits, '_' and '-', at most 63 of them, and is not %q", f, core.TargetDone)
		}
		fused[f] = true
	}
	if o.In == nil || o.Out == nil {
		return nil, badConfig("stage options need both In and Out")
	}
	if o.Input == conf.InputMessage {
		// A filter: no database, so nothing to configure for one.
		return &worker{stage: o.Stage, handlers: o.Handlers, fused: fused, log: log}, nil
	}
	cfg, err := pgx.ParseConfig(o.DB)
	if err != nil {
		return nil, badConfig("database: %w", err)
	}
	// See the package comment: the dispatcher's synchronous commit that follows
	// every answer is the durability point. Only the passes that commit (Failed,
	// Message.Tx, WriteTransitions) are affected; the batch read commits nothing.
	cfg.RuntimeParams["synchronous_commit"] = "off"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "pepsi-stage " + o.Stage
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeoutDefault
	}
	// The dispatcher's bounds on a silent network: a stage must not hang on a
	// dead connection (its head would wait for MAX_RUNTIME), and the server
	// must end a silent stage's session, releasing its row locks.
	pgnet.BoundSilence(cfg)
	return &worker{stage: o.Stage, handlers: o.Handlers, fused: fused, writeAll: o.WriteTransitions, cfg: cfg, log: log}, nil
}

func (w *worker) connect(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, w.cfg)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", pgaddr.Where(&w.cfg.Config), err)
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

// row is a queue row as a pass reads it. Its Version guards a transition the
// library writes without a lock: it writes only over the version its handler
// was given.
type row = store.StageRow

// readBatch reads the rows of ids in one round trip. A missing id has no entry.
func (w *worker) readBatch(ctx context.Context, ids []int64) (map[int64]row, error) {
	if w.conn == nil {
		return nil, errConnectionLost
	}
	rows, err := store.On(w.conn).StageRead(ctx, ids)
	if err != nil {
		return nil, err
	}
	found := make(map[int64]row, len(rows))
	for _, x := range rows {
		found[x.ID] = x
	}
	return found, nil
}

// serve answers every line of one batch of input, in order. The rows of all its
// ids are read in one statement first; a pass that has to run again, or a batch
// whose read failed, reads its row on its own. It returns an error only when ctx
// ends or the output breaks.
func (w *worker) serve(ctx context.Context, lines []string, out *answerWriter) error {
	ids := make([]int64, 0, len(lines))
	for _, line := range lines {
		if id, ok := parseID(line); ok {
			ids = append(ids, id)
		}
	}
	var rows map[int64]row
	if len(ids) > 0 {
		var err error
		if rows, err = w.readBatch(ctx, ids); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Each pass reads its own row then, and reconnects or answers as
			// its error calls for.
			w.log.Warn("reading the rows of a batch failed; reading them one by one", "stage", w.stage, "ids", len(ids), "err", err)
			rows = nil
		}
	}
	for _, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		var answer string
		if id, ok := parseID(line); ok {
			// The answers before this pass are out before it runs
			// (answerWriter).
			if err := out.flush(); err != nil {
				return fmt.Errorf("write answers: %w", err)
			}
			var err error
			if answer, err = w.handle(ctx, id, rows); err != nil {
				return err
			}
		} else {
			answer = failure(fmt.Sprintf("not a message id: %q", line))
			w.log.Error("input line is not a message id", "stage", w.stage, "line", clip(line, 200))
		}
		if err := out.write(answer); err != nil {
			return fmt.Errorf("write answer for %q: %w", line, err)
		}
	}
	return nil
}

// handle runs id to completion and returns its status line. rows, if not nil,
// holds the rows of the batch (a missing id has none); a run after the first
// reads the row again. handle returns an error only when ctx ends: a lost
// connection is re-established and the id run again (every write is guarded, so
// a run after an unknown commit outcome finds the row moved and answers 0); a
// row changed under a pass that writes is run again; a statement that fails is
// answered "1 …".
func (w *worker) handle(ctx context.Context, id int64, rows map[int64]row) (string, error) {
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
		answer, err := w.pass(ctx, id, rows)
		if err == nil {
			return answer, nil
		}
		rows = nil // whatever went wrong, the next run reads the row as it is now
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

// read returns the row of id: from rows when the batch read it (pgx.ErrNoRows
// when the batch found none), else read now.
func (w *worker) read(ctx context.Context, id int64, rows map[int64]row) (row, error) {
	if rows != nil {
		if r, ok := rows[id]; ok {
			return r, nil
		}
		return row{}, pgx.ErrNoRows
	}
	got, err := store.On(w.conn).StageRead(ctx, []int64{id})
	switch {
	case err != nil:
		return row{}, err
	case len(got) == 0:
		return row{}, pgx.ErrNoRows
	}
	return got[0], nil
}

// pass runs one id. Its error is a database error; every other outcome is a
// status line.
//
// Most passes touch no database at all: their row came with the batch read,
// and the transition the handler chose goes on the status line ("0 >enrich
// {...}") for the dispatcher to write. The library writes the transition itself
// only when it cannot go on the line: Failed (there is no target for it), a
// deleted state key, a patch too long for a line, Options.WriteTransitions; and
// when the handler used Message.Tx, whose statements must commit with it (see
// lazyTx). It then answers a bare 0. The messages the handler emitted
// (Message.Emit) go out before an answered transition only; a transition
// the library writes itself cannot carry them (see Message.Emit).
func (w *worker) pass(ctx context.Context, id int64, rows map[int64]row) (string, error) {
	r, run, err := w.runnable(ctx, id, rows)
	if !run {
		return "0", err
	}
	tx := &lazyTx{w: w, row: &r}
	defer tx.end(ctx)
	m := &Message{ID: id, Stage: w.stage, Payload: r.Payload, Attempts: r.Attempts, OrderKey: r.OrderKey, TraceParent: r.TraceParent, Tx: tx}
	var before map[string]json.RawMessage
	if m.State, before, err = decodeState(r.State); err != nil {
		return failure(fmt.Sprintf("state of message %d: %v", id, err)), nil
	}
	res, by, fused, bad := w.chain(ctx, m)
	if tx.changed() {
		return "", errRowChanged // whatever the handler decided, it decided on an old row
	}
	if bad != "" {
		return bad, nil
	}
	prefix := ""
	if by != w.stage {
		prefix = by + ": "
	}
	t, bad := w.decide(res, prefix)
	if bad != "" {
		return bad, nil
	}
	if t.answer == nil { // Failed: the library writes it; a failed pass emits nothing
		return w.write(ctx, &r, tx, t, m.State, fused, prefix)
	}
	if bad := m.emitsBlock(prefix, ""); bad != "" {
		return bad, nil
	}
	why := ""
	switch {
	case w.writeAll:
		why = "this program writes every transition itself (WriteTransitions)"
	case tx.begun():
		why = "the handler used Message.Tx"
	case tx.err == nil:
		line, bad := answerLine(t.answer, fused, before, m.State, prefix)
		if bad != "" {
			return bad, nil
		}
		if line != "" {
			return m.withEmits(line), nil
		}
		why = "the handler deleted a state key or changed more of it than a line carries"
	}
	if bad := m.emitsBlock(prefix, why); bad != "" {
		return bad, nil
	}
	return w.write(ctx, &r, tx, t, m.State, fused, prefix)
}

// runnable reads the row of id and says whether this pass is to run it. A row
// that is gone, or no longer running at this stage, is answered 0 without
// running: someone else moved it, or an earlier run of ours committed before
// the connection broke, and the dispatcher will see the row as it is.
func (w *worker) runnable(ctx context.Context, id int64, rows map[int64]row) (r row, run bool, err error) {
	r, err = w.read(ctx, id, rows)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		w.log.Warn("message does not exist; answering 0 without running it", "stage", w.stage, "id", id)
		return r, false, nil
	case err != nil:
		return r, false, fmt.Errorf("read message %d: %w", id, err)
	case r.Status != core.StatusRunning || r.Stage != w.stage:
		w.log.Warn("message is not running at this stage; answering 0 without running it",
			"stage", w.stage, "id", id, "row_stage", r.Stage, "row_status", r.Status)
		return r, false, nil
	}
	return r, true, nil
}

// transition is what a handler's Result asks for: the transition to answer
// ("0 >TARGET"), and the row the library writes when it cannot be answered.
type transition struct {
	// answer is the transition for the status line, its patch still to be
	// added; nil for Failed, which no answer can say.
	answer *core.Transition
	// stage, status and timeout are the row the library writes itself.
	stage   string
	status  core.RowStatus
	timeout *time.Time
	// reason is Failed's, for state.error.
	reason string
}

// decide turns the handler's Result into its transition, or into a failure
// line when the Result cannot be carried out. prefix names the fused stage
// whose Result it is. A fused stage that finishes or pauses the message leaves
// it at the stage the pass started at: that is a stage the dispatcher knows,
// so a woken or retried message is claimed again (and runs the whole pass
// again).
func (w *worker) decide(res Result, prefix string) (t transition, bad string) {
	switch res.kind {
	case kindAdvance:
		switch {
		case res.next == w.stage:
			return t, failure(fmt.Sprintf("%sadvanced to its own stage %q, which would run it again forever", prefix, w.stage))
		case res.next == core.TargetDone || !conf.ValidStageName(res.next):
			return t, failure(fmt.Sprintf("%sadvanced to %q, which is not a stage name (use stage.Done to finish)", prefix, res.next))
		}
		return transition{answer: &core.Transition{To: res.next}, stage: res.next, status: core.StatusRunning}, ""
	case kindDone:
		return transition{answer: &core.Transition{To: core.TargetDone}, stage: w.stage, status: core.StatusDone}, ""
	case kindPause:
		until := res.until
		if d := time.Until(until); d > core.PauseMax {
			return t, failure(fmt.Sprintf("%spaused until %s, %s away: at most %s (core.PauseMax), as the dispatcher takes a pause",
				prefix, until.UTC().Format(time.RFC3339), d.Round(time.Second), core.PauseMax))
		}
		return transition{answer: &core.Transition{To: core.TargetPaused, PauseFor: time.Until(until)},
			stage: w.stage, status: core.StatusPaused, timeout: &until}, ""
	case kindFailed:
		// state.error is jsonb text: what it cannot hold is replaced, as the
		// dispatcher does with a reason it writes.
		return transition{stage: w.stage, status: core.StatusFailed, reason: core.StorableText(prefix + res.reason)}, ""
	case kindError:
		return t, failure(prefix + res.reason)
	case kindRetry:
		return t, answer(core.RetryCode, prefix+res.reason)
	}
	return t, failure(prefix + "handler returned no Result (use stage.Advance, Done, Failed, Pause, Error or Retry)")
}

// answerLine is the status line that answers move with the handler's state
// changes as its patch, or "" when move must be written instead: state ||
// patch cannot delete a key, and the dispatcher reads lines of a bounded
// length. bad is a failure line when the state cannot be written at all.
func answerLine(move *core.Transition, fused []core.Fused, before map[string]json.RawMessage, state map[string]any, prefix string) (line, bad string) {
	patch, deleted, err := statePatch(before, state)
	if err != nil {
		return "", failure(fmt.Sprintf("%sstate cannot be written as JSON: %v", prefix, err))
	}
	move.Patch = string(patch)
	line = core.Status{Fused: fused, Transition: move}.Line()
	if deleted || len(line) > answerMax {
		return "", ""
	}
	return line, ""
}

// write writes the transition t of row r itself, in the handler's transaction
// when it opened one, and answers 0 with the fused stages' times.
func (w *worker) write(ctx context.Context, r *row, tx *lazyTx, t transition, state map[string]any, fused []core.Fused, prefix string) (string, error) {
	if t.status == core.StatusFailed {
		if state == nil {
			state = map[string]any{}
		}
		state["error"] = t.reason
	}
	newState := []byte("{}")
	if state != nil {
		var err error
		if newState, err = json.Marshal(state); err != nil {
			return failure(fmt.Sprintf("%sstate cannot be written as JSON: %v", prefix, err)), nil
		}
	}
	if tx.err != nil {
		// The handler's transaction could not begin (its statements failed) and
		// the connection is still inside it: report that rather than commit a
		// transition without them.
		return "", tx.err
	}
	if w.conn == nil || w.conn.IsClosed() {
		return "", errConnectionLost
	}
	zero := core.Status{Fused: fused}.Line()
	if tx.begun() {
		moved, err := w.commitTx(ctx, tx.row, t.stage, t.status, t.timeout, newState)
		if err != nil {
			return "", err
		}
		if !moved {
			// The row is locked by this transaction, so only the handler's own
			// statements on m.Tx can have moved it: a stage bug, undone by rollback.
			return failure(fmt.Sprintf("%sthe handler moved message %d itself; return a Result instead of writing pepsi.queue", prefix, r.ID)), nil
		}
		return zero, nil
	}
	moved, err := w.writeTransition(ctx, r, t.stage, t.status, t.timeout, newState)
	if err != nil {
		return "", err
	}
	if !moved {
		// No lock was held: the row changed since it was read (an operator, or
		// a previous dispatcher's reset). Run again on the row as it is now.
		return "", errRowChanged
	}
	return zero, nil
}

// writeTransition writes a transition without a lock, in one statement that is
// its own transaction, over the row version the handler was given only. moved
// is false when that version is gone.
func (w *worker) writeTransition(ctx context.Context, r *row, newStage string, newStatus core.RowStatus, timeout *time.Time, newState []byte) (moved bool, err error) {
	moved, err = store.On(w.conn).StageTransition(ctx, store.StageTransitionParams{
		ID: r.ID, From: w.stage, Stage: newStage, Status: newStatus, Timeout: timeout, State: newState, Version: &r.Version})
	if err != nil {
		return false, fmt.Errorf("message %d: %w", r.ID, err)
	}
	return moved, nil
}

// commitTx writes the transition in the transaction the handler opened and
// commits it, in one round trip. moved is false when the transition found no row
// to move; the transaction is then left open (aborted), for tx.end to roll back.
func (w *worker) commitTx(ctx context.Context, r *row, newStage string, newStatus core.RowStatus, timeout *time.Time, newState []byte) (moved bool, err error) {
	b := &pgx.Batch{}
	// The row is locked: no version guard (the handler may have changed the row
	// in place; only moving it is a bug).
	store.QueueStageTransition(b, store.StageTransitionParams{
		ID: r.ID, From: w.stage, Stage: newStage, Status: newStatus, Timeout: timeout, State: newState})
	b.Queue(commitSQL)
	br := w.conn.SendBatch(ctx, b)
	// Close repeats the first error, already returned below.
	defer br.Close() //nolint:errcheck // see above
	if moved, err := store.ReadStageTransition(br); !moved || err != nil {
		if err != nil {
			err = fmt.Errorf("message %d: %w", r.ID, err)
		}
		return false, err
	}
	tag, err := br.Exec()
	if err != nil {
		return false, fmt.Errorf("commit message %d: %w", r.ID, err)
	}
	// A COMMIT of a transaction that had failed answers ROLLBACK without an error.
	if tag.String() != "COMMIT" {
		return false, fmt.Errorf("commit message %d: %w", r.ID, pgx.ErrTxCommitRollback)
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

// decodeState reads the row's state, keeping numbers exact (json.Number). It
// also returns each top-level value as it was read, so that statePatch can tell
// what the handler changed.
func decodeState(raw []byte) (map[string]any, map[string]json.RawMessage, error) {
	var before map[string]json.RawMessage
	if err := json.Unmarshal(raw, &before); err != nil {
		return nil, nil, fmt.Errorf("not a JSON object: %w", err)
	}
	state := make(map[string]any, len(before))
	for k, v := range before {
		d := json.NewDecoder(bytes.NewReader(v))
		d.UseNumber()
		var x any
		if err := d.Decode(&x); err != nil {
			return nil, nil, fmt.Errorf("state.%s: %w", k, err)
		}
		state[k] = x
	}
	return state, before, nil
}

// statePatch returns the top-level keys of state whose value differs from the
// one read (before) or that are new, as one compact JSON object with sorted
// keys, or nil when there are none. deleted reports a key of before that state
// no longer has, which a patch merged with || cannot express.
func statePatch(before map[string]json.RawMessage, state map[string]any) (patch []byte, deleted bool, err error) {
	for k := range before {
		if _, ok := state[k]; !ok {
			deleted = true
			break
		}
	}
	keys := make([]string, 0, len(state))
	for k := range state {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for _, k := range keys {
		value, err := compactJSON(state[k])
		if err != nil {
			return nil, false, fmt.Errorf("state.%s: %w", k, err)
		}
		if old, ok := before[k]; ok && sameJSON(old, value) {
			continue
		}
		key, err := compactJSON(k)
		if err != nil {
			return nil, false, err
		}
		if b.Len() == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.Write(key)
		b.WriteByte(':')
		b.Write(value)
	}
	if b.Len() == 0 {
		return nil, deleted, nil
	}
	b.WriteByte('}')
	return b.Bytes(), deleted, nil
}

// compactJSON encodes v on one line, without escaping HTML characters. Strings
// have their control characters escaped, so the result never holds a newline.
func compactJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// sameJSON reports whether two JSON values are equal: the same bytes once
// compacted, or the same values decoded (numbers compared as written).
func sameJSON(a, b []byte) bool {
	var ca bytes.Buffer
	if json.Compact(&ca, a) == nil && bytes.Equal(ca.Bytes(), b) {
		return true
	}
	decode := func(raw []byte) (any, bool) {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var x any
		return x, d.Decode(&x) == nil
	}
	x, okA := decode(a)
	y, okB := decode(b)
	return okA && okB && reflect.DeepEqual(x, y)
}

// failure is the status line of a message this pass could not handle.
func failure(reason string) string { return answer(1, reason) }

// answer is the status line of a pass that failed with this code: its reason on
// one line, never empty, and bounded.
func answer(code int, reason string) string {
	reason = strings.Join(strings.Fields(reason), " ")
	if reason == "" {
		reason = "no reason given"
	}
	if len(reason) > reasonMax {
		reason = strings.ToValidUTF8(reason[:reasonMax], "") + "…"
	}
	return core.Status{Code: code, Reason: reason}.Line()
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
