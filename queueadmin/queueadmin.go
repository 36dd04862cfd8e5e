// Package queueadmin is what the operator's tools (pepsi-queue, the demo) do to
// the queue: putting messages in, reading counts and statistics, showing one
// row, sending failed messages round again, and purging finished ones. It checks
// what the operator asked for and runs the statements of package store (one
// method each), so the tools themselves only parse flags and print; it holds no
// SQL itself.
//
// It must never touch a row that is pending, running or paused except to insert
// it (those belong to the dispatcher and the stages), never write the statistics
// tables (the dispatcher is their only writer), and never leave rows pending
// without a NOTIFY on the ingress channel.
package queueadmin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
	"github.com/pepsi-pipeline/pepsi/internal/pgaddr"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Connect opens one connection to url (a libpq URL or key=value string; empty
// means the PG* environment). Its error names the server, so an operator sees
// which host could not be reached.
func Connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeoutDefault
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "pepsi-queue"
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", pgaddr.Where(&cfg.Config), err)
	}
	// enqueue decides a keyed message's status, and retry and discard
	// release keys, at READ COMMITTED (schema 36), and what it reports
	// committed is durable, whatever the database's or the role's defaults.
	if err := store.ProducerSession(ctx, conn); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("connect to %s: %w", pgaddr.Where(&cfg.Config), err)
	}
	return conn, nil
}

// cancelGrace is how long a cancelled statement's connection waits for the
// server's answer to the cancel request before it gives the read up.
//
// A cancelled context (pepsi-queue's on Ctrl-C or SIGTERM, a page action's
// on a dropped request) sends the server a cancel request and waits for the
// statement to end, rather than pgx's default of closing the connection at
// once: a backend does not notice that its client has gone while its
// statement runs, and the default sends its cancel request from a goroutine
// that a tool exiting at once never lets run. A retry or discard of a
// million rows, stopped by the operator, then ran on and committed after
// the tool had said it was cancelled.
const cancelGrace = 5 * time.Second

// connectTimeoutDefault applies when the URL sets no connect_timeout, so an
// unreachable server is reported in seconds rather than after the OS gives up.
const connectTimeoutDefault = 10 * time.Second

// NewMessage is one message to enqueue.
type NewMessage struct {
	// Payload is the message content, stored as is.
	Payload []byte
	// State is the initial state, a JSON object; nil means {}.
	State json.RawMessage
	// OrderKey is the message's order key, "" for none.
	OrderKey string
	// TraceParent is the message's W3C traceparent, "" for none (the
	// dispatcher gives it one at its first pass).
	TraceParent string
	// NotBefore, when not zero, schedules the message: it is inserted paused
	// until then and first claimed at that time (pending at once when that is
	// not ahead of the server's clock).
	NotBefore time.Time
}

// Range describes the rows one Enqueue inserted.
type Range = store.EnqueueResult

// EnqueueBatchMax bounds the messages of one Enqueue call (one statement, so one
// NOTIFY); callers with more split them.
const EnqueueBatchMax = 10000

// Enqueue inserts msgs as pending rows at stage, in order, in one statement (the
// insert trigger notifies the dispatcher once); a message whose order key
// has an unfinished message waits blocked behind it, and a scheduled one
// (NotBefore) paused until its time.
func Enqueue(ctx context.Context, conn *pgx.Conn, stage string, msgs []NewMessage) (Range, error) {
	if stage == "" {
		return Range{}, errors.New("enqueue: no stage given")
	}
	if len(msgs) > EnqueueBatchMax {
		return Range{}, fmt.Errorf("enqueue: %d messages in one batch, at most %d", len(msgs), EnqueueBatchMax)
	}
	if len(msgs) == 0 {
		return Range{}, nil
	}
	payloads := make([][]byte, len(msgs))
	states := make([]string, len(msgs))
	var orderKeys, traces []string // nil while no message has one
	var notBefore []time.Time
	for i, m := range msgs {
		payloads[i] = m.Payload
		if !m.NotBefore.IsZero() {
			if notBefore == nil {
				notBefore = make([]time.Time, len(msgs))
			}
			notBefore[i] = m.NotBefore
		}
		if m.TraceParent != "" {
			if err := msgjson.CheckTraceParent(m.TraceParent); err != nil {
				return Range{}, fmt.Errorf("enqueue: message %d: %w", i+1, err)
			}
			if traces == nil {
				traces = make([]string, len(msgs))
			}
			traces[i] = m.TraceParent
		}
		if m.OrderKey != "" {
			if orderKeys == nil {
				orderKeys = make([]string, len(msgs))
			}
			orderKeys[i] = m.OrderKey
		}
		if m.State != nil {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(m.State, &obj); err != nil || obj == nil {
				return Range{}, fmt.Errorf("enqueue: message %d: state %.60q is not a JSON object", i+1, m.State)
			}
			states[i] = string(m.State)
		}
	}
	return store.On(conn).Enqueue(ctx, store.EnqueueParams{Stage: stage, Payloads: payloads, States: states, OrderKeys: orderKeys, TraceParents: traces, NotBefore: notBefore})
}

// Depth is how many rows of one stage have one status.
type Depth = store.Depth

// StageStats is one row of pepsi.stage_stats.
type StageStats = store.StageStats

// DispatchStats is the row of pepsi.dispatch_stats.
type DispatchStats = store.DispatchStats

// Stats is a snapshot of the queue and the dispatcher's statistics.
type Stats struct {
	// Depth has one entry per stage and status present, sorted by stage, then by
	// status in pipeline order (pending, running, paused, done, failed, timeout).
	Depth    []Depth
	Stages   []StageStats
	Dispatch DispatchStats
	// Health is what the dispatcher recorded of its stages' workers.
	Health Health
	// Keys counts the messages waiting behind their order key, and their
	// keys by what the head does.
	Keys store.KeysWaiting
}

// Health is pepsi.stage_health, and whether a dispatcher holds the lock.
type Health = store.Health

// StageHealth is one row of pepsi.stage_health.
type StageHealth = store.StageHealth

// ReadStats reads counts per stage and status, the oldest pending wait per stage,
// the messages waiting behind their order key, both statistics tables and the
// stages' health, in one snapshot. It scans the whole queue.
func ReadStats(ctx context.Context, conn *pgx.Conn) (*Stats, error) {
	s := &Stats{}
	err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		q := store.On(tx)
		var err error
		if s.Depth, err = q.CountRows(ctx); err != nil {
			return err
		}
		slices.SortFunc(s.Depth, func(a, b Depth) int {
			if c := strings.Compare(a.Stage, b.Stage); c != 0 {
				return c
			}
			order := core.RowStatuses()
			return slices.Index(order, a.Status) - slices.Index(order, b.Status)
		})
		if s.Stages, err = q.ReadStageStats(ctx); err != nil {
			return err
		}
		if s.Keys, err = q.CountKeysWaiting(ctx); err != nil {
			return err
		}
		if s.Dispatch, err = q.ReadDispatchStats(ctx); err != nil {
			return err
		}
		s.Health, err = q.ReadHealth(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	return s, nil
}

// Count returns how many rows have status (summed over stages).
func (s *Stats) Count(status core.RowStatus) int64 {
	var n int64
	for _, d := range s.Depth {
		if d.Status == status {
			n += d.Count
		}
	}
	return n
}

// ErrNotFound is returned for a message id with no row.
var ErrNotFound = store.ErrNotFound

// Message is one queue row as an operator sees it.
type Message = store.Message

// Show reads the row with ingress_id id, or returns ErrNotFound.
func Show(ctx context.Context, conn *pgx.Conn, id int64) (*Message, error) {
	return store.On(conn).Show(ctx, id)
}

// HistoryRow is one event of a message's history (pepsi.history).
type HistoryRow = store.HistoryRow

// History reads message id's history, oldest first.
func History(ctx context.Context, conn *pgx.Conn, id int64) ([]HistoryRow, error) {
	return store.On(conn).History(ctx, id)
}

// RetryFilter selects the finished-but-unsuccessful messages Retry sends round
// again. Zero fields select everything: ID 0 any id, Stage "" any stage.
type RetryFilter struct {
	// ID selects one message.
	ID int64
	// Stage selects messages whose row is at this stage.
	Stage string
	// Statuses selects by status: "failed", "timeout" or both; empty means both.
	// Other statuses are refused: pending, running and paused rows belong to the
	// dispatcher, and done ones succeeded.
	Statuses []core.RowStatus
	// To, if set, is the stage the messages go to; otherwise they keep theirs.
	To string
	// Reason selects messages whose state.dispatch_error contains this text,
	// ignoring case.
	Reason string
}

// Retry makes the selected failed or timed-out messages pending again (at their
// stage or at f.To), moving state.dispatch_error into the array
// state.dispatch_error_history (one entry per retry: error, status, stage,
// retried_at), with attempts back at 0 (a message that used up its retries gets
// them all again), and notifies the dispatcher. It returns how many it moved.
func Retry(ctx context.Context, conn *pgx.Conn, f RetryFilter) (int64, error) {
	r, err := retry(ctx, conn, f, false)
	return r.Retried, err
}

// RetryBlocked is Retry, and also says how many of the retried messages wait
// blocked behind an older unfinished message of their order key.
func RetryBlocked(ctx context.Context, conn *pgx.Conn, f RetryFilter) (store.Retried, error) {
	return retry(ctx, conn, f, false)
}

// RetryCount returns how many messages Retry would send round again with f,
// and changes nothing (pepsi-queue retry -n).
func RetryCount(ctx context.Context, conn *pgx.Conn, f RetryFilter) (int64, error) {
	r, err := retry(ctx, conn, f, true)
	return r.Retried, err
}

func retry(ctx context.Context, conn *pgx.Conn, f RetryFilter, dryRun bool) (store.Retried, error) {
	statuses := f.Statuses
	if len(statuses) == 0 {
		statuses = []core.RowStatus{core.StatusFailed, core.StatusTimeout}
	}
	for _, s := range statuses {
		if s != core.StatusFailed && s != core.StatusTimeout {
			return store.Retried{}, fmt.Errorf("retry: status %q cannot be retried (want failed or timeout)", s)
		}
	}
	if dryRun {
		n, err := store.On(conn).CountRetry(ctx, store.RetryParams{ID: f.ID, Stage: f.Stage, Statuses: statuses, Reason: f.Reason})
		if err != nil {
			return store.Retried{}, fmt.Errorf("retry: %w", err)
		}
		return store.Retried{Retried: n}, nil
	}
	// Outside a transaction: the change commits, with its notification,
	// before its keys are released (store.PG.Retry says why).
	// RetryBlocked's errors say "retry: " already.
	return store.On(conn).RetryBlocked(ctx, store.RetryParams{ID: f.ID, Stage: f.Stage, Statuses: statuses, To: f.To, Reason: f.Reason})
}

// Finished lists the statuses a message leaves the pipeline with
// (core.RowStatus.Final): the only ones Purge deletes.
func Finished() []core.RowStatus {
	return slices.DeleteFunc(core.RowStatuses(), func(s core.RowStatus) bool { return !s.Final() })
}

// Purge deletes rows whose status is one of statuses (empty: all of Finished)
// and that have not changed for olderThan, batch rows per transaction so a large
// purge never holds many locks or one long transaction. It walks the table in
// ingress_id order, each batch starting after the last, so the whole purge reads
// the table once. progress, if not nil, is called after each batch with the
// running total. It returns how many rows it deleted.
func Purge(ctx context.Context, conn *pgx.Conn, olderThan time.Duration, batch int, statuses []core.RowStatus, progress func(deleted int64)) (int64, error) {
	if batch <= 0 || batch > 1_000_000 {
		return 0, fmt.Errorf("purge: batch size %d out of range 1..1000000", batch)
	}
	statuses, err := purged(olderThan, statuses)
	if err != nil {
		return 0, err
	}
	// One cutoff for the whole purge, on the server's clock.
	q := store.On(conn)
	cutoff, err := q.PurgeCutoff(ctx, olderThan)
	if err != nil {
		return 0, fmt.Errorf("purge: %w", err)
	}
	var total, after int64
	for {
		r, err := q.PurgeBatch(ctx, store.PurgeParams{After: after, Statuses: statuses, Before: cutoff, Limit: batch})
		if err != nil {
			if total == 0 {
				return 0, err // store's "purge: " already
			}
			// The batches before have committed: say they stay deleted.
			return total, fmt.Errorf("purge stopped after %d messages deleted (they stay deleted): %w", total, err)
		}
		total += r.Deleted
		if r.Found > 0 && progress != nil {
			progress(total)
		}
		if r.Found < int64(batch) {
			return total, nil
		}
		after = r.Last
	}
}

// PurgeCount counts the messages Purge would delete with olderThan and
// statuses (empty: all of Finished), and deletes nothing: pepsi-queue purge
// -n.
func PurgeCount(ctx context.Context, conn *pgx.Conn, olderThan time.Duration, statuses []core.RowStatus) (int64, error) {
	statuses, err := purged(olderThan, statuses)
	if err != nil {
		return 0, err
	}
	n, err := store.On(conn).CountSelected(ctx, Selection{Statuses: statuses, OlderThan: olderThan})
	if err != nil {
		return 0, fmt.Errorf("purge: %w", err)
	}
	return n, nil
}

// purged checks what Purge and PurgeCount select: a positive age, and
// finished statuses (empty: all of Finished), which it returns.
func purged(olderThan time.Duration, statuses []core.RowStatus) ([]core.RowStatus, error) {
	if olderThan <= 0 {
		return nil, fmt.Errorf("purge: the age must be positive, got %v", olderThan)
	}
	if len(statuses) == 0 {
		return Finished(), nil
	}
	for _, s := range statuses {
		if !s.Final() {
			return nil, fmt.Errorf("purge: status %q is not finished (want done, failed or timeout)", s)
		}
	}
	return statuses, nil
}

// Selection picks messages for List and Discard; zero fields select
// everything (see store.Selection).
type Selection = store.Selection

// Listed is one message of a listing.
type Listed = store.Listed

// listPage is how many messages List reads per statement: a listing of a
// million failed messages streams, it is not held whole.
const listPage = 1000

// List calls each with the selected messages in ingress_id order, at most
// limit of them (0: all), reading them a page at a time. It stops at the
// first error each returns.
func List(ctx context.Context, conn *pgx.Conn, sel Selection, limit int, each func(Listed) error) error {
	q := store.On(conn)
	after, seen := int64(0), 0
	for limit == 0 || seen < limit {
		n := listPage
		if limit > 0 {
			n = min(n, limit-seen)
		}
		page, err := q.List(ctx, store.ListParams{Selection: sel, After: after, Limit: n})
		if err != nil {
			return err
		}
		for _, m := range page {
			if err := each(m); err != nil {
				return err
			}
		}
		seen += len(page)
		if len(page) < n {
			return nil
		}
		after = page[len(page)-1].ID
	}
	return nil
}

// Count counts the selected messages.
func Count(ctx context.Context, conn *pgx.Conn, sel Selection) (int64, error) {
	return store.On(conn).CountSelected(ctx, sel)
}

// Discardable lists the statuses Discard ends: a message waiting for the
// dispatcher, or behind an older message of its order key. A running one
// belongs to a worker, and a finished one has already left the pipeline.
func Discardable() []core.RowStatus {
	return []core.RowStatus{core.StatusPending, core.StatusPaused, core.StatusBlocked}
}

// DiscardedError is the dispatch_error Discard writes: it names the operator's
// action, and the operator's note when one is given.
func DiscardedError(note string) string {
	if note == "" {
		return "discarded by an operator (pepsi-queue discard)"
	}
	return "discarded by an operator (pepsi-queue discard): " + note
}

// Discard ends the selected pending, paused or blocked messages failed, their
// state.dispatch_error saying an operator discarded them (with note, if
// any), and returns how many. sel.Statuses must be pending and/or paused
// (empty: both). A message a worker holds is running, so it is never
// touched, and one the dispatcher claims at the same moment is either
// discarded before the claim (which then skips it) or claimed first (and the
// discard skips it): each row is re-checked as it is written. With dryRun it
// changes nothing and returns how many it would have ended.
func Discard(ctx context.Context, conn *pgx.Conn, sel Selection, note string, dryRun bool) (int64, error) {
	return discard(ctx, conn, sel, DiscardedError(note), dryRun)
}

// discard is Discard with the dispatch_error it writes.
func discard(ctx context.Context, conn *pgx.Conn, sel Selection, dispatchError string, dryRun bool) (int64, error) {
	if len(sel.Statuses) == 0 {
		sel.Statuses = Discardable()
	}
	for _, s := range sel.Statuses {
		if !slices.Contains(Discardable(), s) {
			return 0, fmt.Errorf("discard: status %q cannot be discarded (want pending, paused or blocked: a running message belongs to a worker, a finished one has left)", s)
		}
	}
	q := store.On(conn)
	if dryRun {
		return q.CountSelected(ctx, sel)
	}
	return q.Discard(ctx, store.DiscardParams{Selection: sel, DispatchError: dispatchError})
}

// PageActions are the actions pepsi-httpd's page offers on one message
// (ACTIONS = on): Retry and Discard above, each on a connection of its own
// to Database, so the page's writes are the guarded ones pepsi-queue makes.
type PageActions struct {
	// Database is a libpq URL or key=value string; empty means the PG*
	// environment.
	Database string
}

// PageDiscardedError is the dispatch_error of a message discarded on
// pepsi-httpd's page: it names the page, as DiscardedError names
// pepsi-queue.
const PageDiscardedError = "discarded by an operator (on pepsi-httpd's page)"

// Retry retries message id if it failed or timed out (with dryRun, counts
// whether it would), and, when stage or status is not empty, only if it is
// still at that stage, in that status (what the page showed); an error
// wrapping ErrNotFound when there is no message id.
func (p PageActions) Retry(ctx context.Context, id int64, stage string, status core.RowStatus, dryRun bool) (int64, error) {
	return p.with(ctx, id, func(conn *pgx.Conn) (int64, error) {
		statuses, ok := seen(status, core.StatusFailed, core.StatusTimeout)
		if !ok {
			return 0, nil // a status no retry applies to: nothing to retry
		}
		r, err := retry(ctx, conn, RetryFilter{ID: id, Stage: stage, Statuses: statuses}, dryRun)
		return r.Retried, err
	})
}

// Discard ends message id failed if it waits (pending, paused or blocked),
// its reason naming the page (with dryRun, counts whether it would), and,
// when stage or status is not empty, only if it is still at that stage, in
// that status; an error wrapping ErrNotFound when there is no message id.
func (p PageActions) Discard(ctx context.Context, id int64, stage string, status core.RowStatus, dryRun bool) (int64, error) {
	return p.with(ctx, id, func(conn *pgx.Conn) (int64, error) {
		statuses, ok := seen(status, Discardable()...)
		if !ok {
			return 0, nil // a status no discard applies to: nothing to discard
		}
		return discard(ctx, conn, Selection{ID: id, Stage: stage, Statuses: statuses}, PageDiscardedError, dryRun)
	})
}

// seen is the statuses an action selects when the page saw status (none:
// the action's own), and false when status is one the action does not
// apply to (of those in applies).
func seen(status core.RowStatus, applies ...core.RowStatus) ([]core.RowStatus, bool) {
	if status == "" {
		return nil, true
	}
	return []core.RowStatus{status}, slices.Contains(applies, status)
}

// with runs f, an action on message id, on a new connection to p.Database.
// When f changed (or would change) nothing, it looks id up: a count of 0
// alone would tell the operator that the message is not in a state for the
// action when there is no such message (a mistyped id, or one purged), so
// that is an error wrapping ErrNotFound.
func (p PageActions) with(ctx context.Context, id int64, f func(*pgx.Conn) (int64, error)) (int64, error) {
	conn, err := Connect(ctx, p.Database)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n, err := f(conn)
	if err != nil || n > 0 {
		return n, err
	}
	ok, err := store.On(conn).Exists(ctx, id)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("message %d: %w", id, ErrNotFound)
	}
	return 0, nil
}
