// Package queueadmin holds the SQL of the operator's tools (pepsi-queue, the
// demo): putting messages in, reading counts and statistics, showing one row,
// sending failed messages round again, and purging finished ones. All of it is
// here, in one reviewed place, so the tools themselves only parse flags and print.
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
	"github.com/pepsi-pipeline/pepsi/core"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL at %s:%d (database %q, user %q): %w", cfg.Host, cfg.Port, cfg.Database, cfg.User, err)
	}
	return conn, nil
}

// connectTimeoutDefault applies when the URL sets no connect_timeout, so an
// unreachable server is reported in seconds rather than after the OS gives up.
const connectTimeoutDefault = 10 * time.Second

// NewMessage is one message to enqueue.
type NewMessage struct {
	// Payload is the message content, stored as is.
	Payload []byte
	// State is the initial state, a JSON object; nil means {}.
	State json.RawMessage
}

// Range describes the rows one Enqueue inserted.
type Range struct {
	// Count is how many rows were inserted.
	Count int64
	// First and Last are the smallest and largest ingress_id inserted. They are
	// contiguous (Last-First+1 == Count) unless another writer inserted at once.
	First, Last int64
}

// EnqueueBatchMax bounds the messages of one Enqueue call (one statement, so one
// NOTIFY); callers with more split them.
const EnqueueBatchMax = 10000

// Enqueue inserts msgs as pending rows at stage, in order, in one statement (the
// insert trigger notifies the dispatcher once).
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
	for i, m := range msgs {
		payloads[i] = m.Payload
		if m.State != nil {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(m.State, &obj); err != nil || obj == nil {
				return Range{}, fmt.Errorf("enqueue: message %d: state %.60q is not a JSON object", i+1, m.State)
			}
			states[i] = string(m.State)
		}
	}
	var r Range
	err := conn.QueryRow(ctx, enqueueSQL, stage, payloads, states).Scan(&r.Count, &r.First, &r.Last)
	if err != nil {
		return Range{}, fmt.Errorf("enqueue: %w", err)
	}
	return r, nil
}

// Depth is how many rows of one stage have one status.
type Depth struct {
	Stage  string
	Status core.RowStatus
	Count  int64
	// OldestWait, for pending rows only, is how long the longest-waiting one has
	// been pending (since its last change).
	OldestWait time.Duration
}

// StageStats is one row of pepsi.stage_stats (see docs/pepsi-dispatch.1.md, "Statistics"): the
// totals the dispatcher's flushes added up, and when the last one touched it.
type StageStats struct {
	core.StageDelta
	UpdatedAt time.Time
}

// DispatchStats is the row of pepsi.dispatch_stats.
type DispatchStats struct {
	StagePasses  int64
	MessagesLeft int64
	UpdatedAt    time.Time
	// FlushSeq is the sequence number of the last flush applied: 0 means no
	// dispatcher has ever flushed, and UpdatedAt is only when the row was made.
	FlushSeq int64
}

// Stats is a snapshot of the queue and the dispatcher's statistics.
type Stats struct {
	// Depth has one entry per stage and status present, sorted by stage, then by
	// status in pipeline order (pending, running, paused, done, failed, timeout).
	Depth    []Depth
	Stages   []StageStats
	Dispatch DispatchStats
}

// ReadStats reads counts per stage and status, the oldest pending wait per stage,
// and both statistics tables, in one snapshot. It scans the whole queue.
func ReadStats(ctx context.Context, conn *pgx.Conn) (*Stats, error) {
	s := &Stats{}
	err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, countSQL)
		if err != nil {
			return fmt.Errorf("count rows: %w", err)
		}
		for rows.Next() {
			var d Depth
			var waitUS int64
			if err := rows.Scan(&d.Stage, &d.Status, &d.Count, &waitUS); err != nil {
				return fmt.Errorf("count rows: %w", err)
			}
			if d.Status == core.StatusPending {
				d.OldestWait = time.Duration(max(waitUS, 0)) * time.Microsecond
			}
			s.Depth = append(s.Depth, d)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("count rows: %w", err)
		}
		slices.SortFunc(s.Depth, func(a, b Depth) int {
			if c := strings.Compare(a.Stage, b.Stage); c != 0 {
				return c
			}
			order := core.RowStatuses()
			return slices.Index(order, a.Status) - slices.Index(order, b.Status)
		})
		rows, err = tx.Query(ctx, stageStatsSQL)
		if err != nil {
			return fmt.Errorf("read stage_stats: %w", err)
		}
		s.Stages, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StageStats, error) {
			var st StageStats
			err := r.Scan(&st.Stage, &st.Processed, &st.Failed, &st.Timeouts, &st.Crashes, &st.ProcessingUS, &st.UpdatedAt)
			return st, err
		})
		if err != nil {
			return fmt.Errorf("read stage_stats: %w", err)
		}
		err = tx.QueryRow(ctx, dispatchStatsSQL).
			Scan(&s.Dispatch.StagePasses, &s.Dispatch.MessagesLeft, &s.Dispatch.UpdatedAt, &s.Dispatch.FlushSeq)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read dispatch_stats: %w", err)
		}
		return nil
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
var ErrNotFound = errors.New("no such message")

// Message is one queue row as an operator sees it.
type Message struct {
	ID     int64
	Stage  string
	Status string
	// Timeout is when a paused row is due again (nil when not set, or not a
	// time: see TimeoutText).
	Timeout *time.Time
	// TimeoutText is a timeout that is no time: "infinity" (never due) or
	// "-infinity" (due at once); "" otherwise.
	TimeoutText string
	State       json.RawMessage
	Payload     []byte
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// Show reads the row with ingress_id id, or returns ErrNotFound.
func Show(ctx context.Context, conn *pgx.Conn, id int64) (*Message, error) {
	m := &Message{ID: id}
	var state []byte
	err := conn.QueryRow(ctx, showSQL, id).
		Scan(&m.Stage, &m.Status, &m.Timeout, &m.TimeoutText, &state, &m.Payload, &m.CreatedAt, &m.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("show message %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("show message %d: %w", id, err)
	}
	m.State = state
	return m, nil
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
}

// Retry makes the selected failed or timed-out messages pending again (at their
// stage or at f.To), moving state.dispatch_error into the array
// state.dispatch_error_history (one entry per retry: error, status, stage,
// retried_at), with attempts back at 0 (a message that used up its retries gets
// them all again), and notifies the dispatcher. It returns how many it moved.
func Retry(ctx context.Context, conn *pgx.Conn, f RetryFilter) (int64, error) {
	statuses := f.Statuses
	if len(statuses) == 0 {
		statuses = []core.RowStatus{core.StatusFailed, core.StatusTimeout}
	}
	for _, s := range statuses {
		if s != core.StatusFailed && s != core.StatusTimeout {
			return 0, fmt.Errorf("retry: status %q cannot be retried (want failed or timeout)", s)
		}
	}
	var n int64
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, retrySQL, f.ID, f.Stage, texts(statuses), f.To).Scan(&n)
		if err != nil {
			return err
		}
		if n > 0 {
			// Delivered at commit, with the rows.
			_, err = tx.Exec(ctx, notifySQL)
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("retry: %w", err)
	}
	return n, nil
}

// Finished lists the statuses a message leaves the pipeline with
// (core.RowStatus.Final): the only ones Purge deletes.
func Finished() []core.RowStatus {
	return slices.DeleteFunc(core.RowStatuses(), func(s core.RowStatus) bool { return !s.Final() })
}

// texts is statuses as the text the status column holds, for a statement's
// parameter.
func texts(statuses []core.RowStatus) []string {
	out := make([]string, len(statuses))
	for i, s := range statuses {
		out[i] = string(s)
	}
	return out
}

// Purge deletes rows whose status is one of statuses (empty: all of Finished)
// and that have not changed for olderThan, batch rows per transaction so a large
// purge never holds many locks or one long transaction. It walks the table in
// ingress_id order, each batch starting after the last, so the whole purge reads
// the table once. progress, if not nil, is called after each batch with the
// running total. It returns how many rows it deleted.
func Purge(ctx context.Context, conn *pgx.Conn, olderThan time.Duration, batch int, statuses []core.RowStatus, progress func(deleted int64)) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("purge: the age must be positive, got %v", olderThan)
	}
	if batch <= 0 || batch > 1_000_000 {
		return 0, fmt.Errorf("purge: batch size %d out of range 1..1000000", batch)
	}
	if len(statuses) == 0 {
		statuses = Finished()
	}
	for _, s := range statuses {
		if !s.Final() {
			return 0, fmt.Errorf("purge: status %q is not finished (want done, failed or timeout)", s)
		}
	}
	// One cutoff for the whole purge, on the server's clock.
	var cutoff time.Time
	if err := conn.QueryRow(ctx, cutoffSQL, olderThan.Seconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("purge: %w", err)
	}
	var total, after int64
	for {
		var found, last, deleted int64
		err := conn.QueryRow(ctx, purgeSQL, after, texts(statuses), cutoff, batch).Scan(&found, &last, &deleted)
		if err != nil {
			return total, fmt.Errorf("purge: after %d rows: %w", total, err)
		}
		total += deleted
		if found > 0 && progress != nil {
			progress(total)
		}
		if found < int64(batch) {
			return total, nil
		}
		after = last
	}
}
