package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pepsi-pipeline/pepsi/core"
)

// The statements of the operator's tools (pepsi-queue, the demo): what they
// check and loop over is queueadmin's; each statement is one method here.

// enqueueSQL inserts one batch of messages at stage $1 (payloads $2, states $3,
// empty for none, order keys $4, empty for none; the array may be shorter)
// in their order, their order keys locked first (orderKeysLocked), and
// returns how many and their first and last id.
const enqueueSQL = `WITH input AS (
	SELECT * FROM unnest($2::bytea[], $3::text[], $4::text[], $5::text[], $6::timestamptz[]) WITH ORDINALITY AS u(payload, state, order_key, traceparent, not_before, n)
), ins AS (
	INSERT INTO pepsi.queue (stage, payload, state, order_key, traceparent, status, timeout)
	SELECT $1, payload, coalesce(nullif(state, '')::jsonb, '{}'), nullif(order_key, ''), nullif(traceparent, ''),
		` + scheduledStatus + ` FROM input
	WHERE ` + orderKeysLocked + `
	ORDER BY n
	RETURNING ingress_id, status, timeout)
SELECT count(*), coalesce(min(ingress_id), 0), coalesce(max(ingress_id), 0), count(*) FILTER (WHERE timeout IS NOT NULL),
	coalesce(bool_or(` + scheduledNotify + `), false) FROM ins`

// countSQL counts the rows per stage and status, with the oldest update of each
// (in microseconds ago): for pending rows, the oldest wait since a row was
// last ready (ready_at; updated_at for rows made before schema version 13).
const countSQL = `SELECT stage, status, count(*),
	coalesce(extract(epoch FROM now() - min(CASE WHEN status = 'pending' THEN coalesce(ready_at, updated_at) ELSE updated_at END)) * 1e6, 0)::bigint
FROM pepsi.queue GROUP BY stage, status`

// stageStatsSQL reads pepsi.stage_stats, the dispatcher's counts per stage.
const stageStatsSQL = `SELECT stage, processed, failed, timeouts, crashes, processing_us,
	guard_misses, retries, rate_held_us, emitted, emits_dropped, updated_at
FROM pepsi.stage_stats ORDER BY stage`

// dispatchStatsSQL reads pepsi.dispatch_stats, the dispatcher's own row.
const dispatchStatsSQL = `SELECT stage_passes, messages_left, updated_at, flush_seq FROM pepsi.dispatch_stats`

// keyHeadColumns, selected from pepsi.queue q joined by keyHeadJoin, are q's
// order key and, when q is blocked, what it waits behind: its key's head, the
// oldest of the key's messages that is not blocked (one probe of
// queue_order_live), or, when every such message has finished but an older
// blocked one is there still (a dispatcher died before it released the key,
// or found the key's lock taken), that older message, which gets the key
// first (one probe of queue_order_blocked); all NULL when there is neither
// (see keyHeadScan).
const (
	keyHeadColumns = `coalesce(q.order_key, ''), h.ingress_id, h.stage, h.status, CASE WHEN isfinite(h.timeout) THEN h.timeout END, h.attempts`
	keyHeadJoin    = `LEFT JOIN LATERAL (SELECT y.* FROM (
	(SELECT x.ingress_id, x.stage, x.status, x.timeout, x.attempts, 0 AS rank FROM pepsi.queue x
	 WHERE q.status = 'blocked' AND x.order_key = q.order_key AND x.status IN ('pending', 'running', 'paused')
	 ORDER BY x.ingress_id LIMIT 1)
	UNION ALL
	(SELECT x.ingress_id, x.stage, x.status, x.timeout, x.attempts, 1 FROM pepsi.queue x
	 WHERE q.status = 'blocked' AND x.order_key = q.order_key AND x.status = 'blocked' AND x.ingress_id < q.ingress_id
	 ORDER BY x.ingress_id LIMIT 1)) y ORDER BY y.rank LIMIT 1) h ON true`
)

// keyHeadScan scans keyHeadColumns.
type keyHeadScan struct {
	orderKey string
	id       *int64
	stage    *string
	status   *core.RowStatus
	timeout  *time.Time
	attempts *int
}

// dest are the scan's destinations, in keyHeadColumns' order.
func (k *keyHeadScan) dest() []any {
	return []any{&k.orderKey, &k.id, &k.stage, &k.status, &k.timeout, &k.attempts}
}

// head is the head scanned, nil for none.
func (k *keyHeadScan) head() *KeyHead {
	if k.id == nil {
		return nil
	}
	return &KeyHead{ID: *k.id, Stage: *k.stage, Status: *k.status, Timeout: k.timeout, Attempts: *k.attempts}
}

// showSQL reads one message, by ingress_id, with its order key's head
// (keyHeadColumns), its parent (parent_id, 0 for none) and how many children
// it has (the messages whose parent it is: the queue_parent index). A
// timeout no time.Time holds ('infinity', '-infinity': a stage may pause a
// row for good) comes as text.
const showSQL = `SELECT q.stage, q.status, CASE WHEN isfinite(q.timeout) THEN q.timeout END,
	CASE WHEN NOT isfinite(q.timeout) THEN q.timeout::text ELSE '' END, q.state, q.payload, q.created_at, q.updated_at,
	q.attempts, coalesce(q.dedup_key, ''), coalesce(q.traceparent, ''), coalesce(q.parent_id, 0),
	(SELECT count(*) FROM pepsi.queue c WHERE c.parent_id = q.ingress_id), ` + keyHeadColumns + `
FROM pepsi.queue q ` + keyHeadJoin + `
WHERE q.ingress_id = $1`

// retrySQL makes pending again the rows selectWhere selects ($1 to $5; none
// when $3 names no status), moving them to stage $7 (empty: where they are)
// and keeping their dispatch_error in dispatch_error_history, and returns
// how many and the order keys among them (see releaseKeys).
// In SET, stage, status and state are the row's values before the update.
const retrySQL = `WITH moved AS (
	UPDATE pepsi.queue SET
		status = 'pending',
		stage = coalesce(nullif($7, ''), stage),
		timeout = NULL,
		attempts = 0,
		updated_at = now(),
		ready_at = now(),
		state = (state - 'dispatch_error') || jsonb_build_object('dispatch_error_history',
			CASE WHEN jsonb_typeof(state->'dispatch_error_history') = 'array'
				THEN state->'dispatch_error_history' ELSE '[]'::jsonb END
			|| jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
				'error', state->'dispatch_error', 'status', status, 'stage', stage, 'retried_at', now()))))
	WHERE cardinality($3::text[]) > 0 AND ` + selectWhere + `
	RETURNING ingress_id, stage, order_key, state->'dispatch_error_history'->-1 AS was),
recorded AS (
	INSERT INTO pepsi.history (ingress_id, stage, event, detail, at)
	SELECT ingress_id, stage, 'retried', concat_ws(': ', (was->>'status') || ' at ' || (was->>'stage'), was->>'error'), ` + operatorEventAt + `
	FROM moved)
SELECT count(*), coalesce(array_agg(DISTINCT order_key) FILTER (WHERE order_key IS NOT NULL), '{}'),
	coalesce(array_agg(ingress_id) FILTER (WHERE order_key IS NOT NULL), '{}') FROM moved`

// operatorEventAt is the time of the history event an operator's retry or
// discard writes for a row: when the statement changed it (clock_timestamp(),
// read once the rows are changed), not when its transaction began (now()).
// The statement may have waited for the row, held by a dispatcher's pass or
// wake or by another operator's discard, and changes it as that one left it:
// stamped at its transaction's start, its event went before the event of the
// writer it waited for (history printed "retried: failed at s1: discarded" above
// the discard it retried, and a retried message's timeline ended in failed).
// Kept within now()'s day (UTC), whose partition withToday made: a statement
// that waited past midnight would find no partition for the next day when no
// dispatcher made it.
const operatorEventAt = `least(clock_timestamp(), date_trunc('day', now(), 'UTC') + interval '1 day' - interval '1 microsecond')`

// blockedOfSQL counts the rows of $1 that wait blocked behind their key.
const blockedOfSQL = `SELECT count(*) FROM pepsi.queue WHERE ingress_id = ANY($1::bigint[]) AND status = 'blocked'`

// historyTodaySQL makes today's partition of pepsi.history (UTC), for a tool
// that writes history rows (schema 16's pepsi.history_day): the dispatcher
// makes days ahead, but it may not have run for days.
const historyTodaySQL = `SELECT pepsi.history_day((now() AT TIME ZONE 'UTC')::date, true)`

// withToday runs historyTodaySQL and then sql, a statement that writes
// history rows at now(), and scans sql's one row into dest: both in one
// transaction of their own (a savepoint in the caller's), whose now() is
// the same for both. Run one after the other, the first could make the
// partition of a day that ended before the second began: at midnight
// (UTC), with no dispatcher making the days ahead, the write was refused
// (no partition of relation "history" found for row). Not as one pipelined
// batch: its Sync commits sql's implicit transaction in the server even
// after the client gave up on it, so a retry stopped by Ctrl-C while it
// waited for a row lock committed once the lock was free
// (TestAnInterruptedRetryChangesNothing failed so, under load). Here
// nothing commits until the client says COMMIT.
func (s *PG) withToday(ctx context.Context, sql string, args []any, dest ...any) error {
	db, err := s.beginner()
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, historyTodaySQL); err != nil {
			return fmt.Errorf("make today's history partition: %w", err)
		}
		return tx.QueryRow(ctx, sql, args...).Scan(dest...)
	})
}

// beginner is s's connection as one that begins transactions (a pool, a
// connection, or a transaction, whose Begin is a savepoint), for the
// statements that need one of their own.
func (s *PG) beginner() (interface {
	Begin(context.Context) (pgx.Tx, error)
}, error) {
	db, ok := s.db.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return nil, errors.New("the store's connection cannot begin a transaction")
	}
	return db, nil
}

// notifySQL wakes the dispatcher, at commit, for rows made pending.
const notifySQL = `SELECT pg_notify('ingress', '')`

// cutoffSQL is the server's now() less $1 seconds: one purge's cutoff.
const cutoffSQL = `SELECT now() - make_interval(secs => $1)`

// purgeSQL deletes up to $4 rows after ingress_id $1 whose status is one of $2
// and last update before $3, in ingress_id order, and says how many it found,
// the last id it found and how many it deleted (a row that changed meanwhile
// is found but not deleted).
const purgeSQL = `WITH victims AS (
	SELECT ingress_id FROM pepsi.queue
	WHERE ingress_id > $1 AND status = ANY($2) AND updated_at < $3
	ORDER BY ingress_id LIMIT $4),
gone AS (
	DELETE FROM pepsi.queue q USING victims v
	WHERE q.ingress_id = v.ingress_id AND q.status = ANY($2) AND q.updated_at < $3
	RETURNING 1)
SELECT (SELECT count(*) FROM victims), (SELECT coalesce(max(ingress_id), 0) FROM victims), (SELECT count(*) FROM gone)`

// EnqueueParams is one batch of new messages at one stage.
type EnqueueParams struct {
	Stage string
	// Payloads are the messages' contents, in order.
	Payloads [][]byte
	// States are their initial states as JSON objects ("" for {}), one per
	// payload.
	States []string
	// OrderKeys are their order keys ("" for none), one per payload, or nil
	// when none has one.
	OrderKeys []string
	// TraceParents are their W3C traceparents ("" for none: the claim of
	// their first pass gives them one), one per payload, or nil when none
	// has one. The column's check (schema 21) refuses one that is not
	// 00-<32 hex>-<16 hex>-<2 hex>.
	TraceParents []string
	// NotBefore schedules them: each is inserted paused until its time (zero
	// for none: pending), one per payload, or nil when none is scheduled
	// (IngressRow.NotBefore).
	NotBefore []time.Time
}

// EnqueueResult describes the rows one Enqueue inserted.
type EnqueueResult struct {
	// Count is how many rows were inserted.
	Count int64
	// First and Last are the smallest and largest ingress_id inserted. They are
	// contiguous (Last-First+1 == Count) unless another writer inserted at
	// once, or rows had order keys (the insert trigger draws a keyed row's id
	// anew under its key's lock, skipping the one drawn before).
	First, Last int64
	// Scheduled is how many of them wait for their NotBefore: paused until
	// then, or blocked behind their order key and paused until then once
	// they are its head.
	Scheduled int64
}

// Enqueue inserts p's messages at p.Stage, in order, in one statement:
// pending, paused until their NotBefore, or blocked behind their order key
// (the insert trigger notifies the dispatcher once).
func (s *PG) Enqueue(ctx context.Context, p EnqueueParams) (EnqueueResult, error) {
	var r EnqueueResult
	var notBefore []pgtype.Timestamptz
	if p.NotBefore != nil {
		notBefore = make([]pgtype.Timestamptz, len(p.Payloads))
		for i, t := range p.NotBefore {
			notBefore[i] = orNull(t)
		}
	}
	err := s.db.QueryRow(ctx, enqueueSQL, p.Stage, p.Payloads, p.States, p.OrderKeys, p.TraceParents, notBefore).Scan(&r.Count, &r.First, &r.Last, &r.Scheduled, new(bool))
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("enqueue: %w", err)
	}
	return r, nil
}

// Depth is how many rows of one stage have one status.
type Depth struct {
	Stage  string
	Status core.RowStatus
	Count  int64
	// OldestWait, for pending rows only, is how long the longest-waiting one has
	// been ready (since it was made, moved, woken or retried; a claim given
	// back does not count).
	OldestWait time.Duration
}

// CountRows counts the rows per stage and status, in no order. It scans the
// whole queue.
func (s *PG) CountRows(ctx context.Context) ([]Depth, error) {
	return collect(ctx, s.db, "count rows", func(r pgx.CollectableRow) (Depth, error) {
		var d Depth
		var waitUS int64
		err := r.Scan(&d.Stage, &d.Status, &d.Count, &waitUS)
		if d.Status == core.StatusPending {
			d.OldestWait = time.Duration(max(waitUS, 0)) * time.Microsecond
		}
		return d, err
	}, countSQL)
}

// StageStats is one row of pepsi.stage_stats (see docs/pepsi-dispatch.1.md, "Statistics"): the
// totals the dispatcher's flushes added up, and when the last one touched it.
type StageStats struct {
	core.StageDelta
	UpdatedAt time.Time
}

// ReadStageStats reads pepsi.stage_stats, by stage.
func (s *PG) ReadStageStats(ctx context.Context) ([]StageStats, error) {
	return collect(ctx, s.db, "read stage_stats", func(r pgx.CollectableRow) (StageStats, error) {
		var st StageStats
		err := r.Scan(&st.Stage, &st.Processed, &st.Failed, &st.Timeouts, &st.Crashes, &st.ProcessingUS,
			&st.GuardMisses, &st.Retries, &st.RateHeldUS, &st.Emitted, &st.EmitsDropped, &st.UpdatedAt)
		return st, err
	}, stageStatsSQL)
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

// ReadDispatchStats reads pepsi.dispatch_stats (the zero DispatchStats when
// it has no row).
func (s *PG) ReadDispatchStats(ctx context.Context) (DispatchStats, error) {
	var d DispatchStats
	err := s.db.QueryRow(ctx, dispatchStatsSQL).Scan(&d.StagePasses, &d.MessagesLeft, &d.UpdatedAt, &d.FlushSeq)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return DispatchStats{}, fmt.Errorf("read dispatch_stats: %w", err)
	}
	return d, nil
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
	// Attempts is the attempts column: the retries (75 answers) at the
	// current stage.
	Attempts int
	// DedupKey is the producer's idempotency key, "" if none.
	DedupKey string
	// OrderKey is the message's order key, "" if none.
	OrderKey string
	// TraceParent is the message's W3C traceparent, "" if none yet (its
	// first pass gives it one).
	TraceParent string
	// Head, for a blocked message, is the message of its order key it waits
	// behind: the oldest one that is not blocked. Nil when the message is
	// not blocked, or when none is (its older messages finished, and the
	// dispatcher has yet to hand it the key).
	Head *KeyHead
	// ParentID is, for a message a stage emitted, the id of the message
	// whose pass emitted it; 0 for none.
	ParentID int64
	// Children counts the messages this one's passes emitted that are in
	// the queue.
	Children int64
}

// KeyHead is the message an order key's blocked messages wait behind.
type KeyHead struct {
	ID     int64
	Stage  string
	Status core.RowStatus
	// Timeout is when a paused head is due again (nil when it has none, or
	// none a time.Time holds).
	Timeout *time.Time
	// Attempts is its retries at its stage: a paused head with attempts
	// waits for a retry (a 75 answer).
	Attempts int
}

// existsSQL says whether a row has ingress_id $1 (its primary key: one
// probe), reading nothing of it.
const existsSQL = `SELECT EXISTS (SELECT FROM pepsi.queue WHERE ingress_id = $1)`

// Exists says whether the queue has a row with ingress_id id. Unlike Show it
// reads neither payload nor state: an action that changed nothing asks it to
// tell a message that is not in a state for the action from none at all.
func (s *PG) Exists(ctx context.Context, id int64) (bool, error) {
	var ok bool
	if err := s.db.QueryRow(ctx, existsSQL, id).Scan(&ok); err != nil {
		return false, fmt.Errorf("look message %d up: %w", id, err)
	}
	return ok, nil
}

// Show reads the row with ingress_id id, or returns ErrNotFound.
func (s *PG) Show(ctx context.Context, id int64) (*Message, error) {
	m := &Message{ID: id}
	var k keyHeadScan
	err := s.db.QueryRow(ctx, showSQL, id).
		Scan(append([]any{&m.Stage, &m.Status, &m.Timeout, &m.TimeoutText, (*[]byte)(&m.State), &m.Payload, &m.CreatedAt, &m.UpdatedAt,
			&m.Attempts, &m.DedupKey, &m.TraceParent, &m.ParentID, &m.Children}, k.dest()...)...)
	m.OrderKey, m.Head = k.orderKey, k.head()
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("show message %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("show message %d: %w", id, err)
	}
	return m, nil
}

// RetryParams selects the finished-but-unsuccessful rows Retry makes pending
// again. Zero fields select everything: ID 0 any id, Stage "" any stage.
type RetryParams struct {
	ID    int64
	Stage string
	// Statuses are the statuses selected (failed, timeout, or both).
	Statuses []core.RowStatus
	// To, if set, is the stage the rows go to; otherwise they keep theirs.
	To string
	// Reason, if set, selects the rows whose state.dispatch_error contains
	// it, ignoring case.
	Reason string
}

// selection is what p selects, as list, its count and discard select: a dry
// run of a retry counts exactly the rows the retry would move.
func (p RetryParams) selection() Selection {
	return Selection{ID: p.ID, Stage: p.Stage, Statuses: p.Statuses, Reason: p.Reason}
}

// CountRetry counts the rows Retry would move with p, and changes nothing.
func (s *PG) CountRetry(ctx context.Context, p RetryParams) (int64, error) {
	if len(p.Statuses) == 0 {
		return 0, nil
	}
	return s.CountSelected(ctx, p.selection())
}

// Retry makes the selected rows pending again (at their stage or at p.To),
// moving state.dispatch_error into the array state.dispatch_error_history (one
// entry per retry: error, status, stage, retried_at), with attempts back at
// 0, and returns how many it moved. Each gets a history row, retried, whose
// detail is what it was (status, stage, error). When it moved any, it
// notifies ingress, then puts their order keys in order (releaseKeys).
//
// Call it outside a transaction, as pepsi-queue does: each statement then
// commits on its own, the change before the release waits for the keys'
// locks. In one transaction, a producer holding a key's lock that waits for
// a row the retry changed (its dedup_key's) and the release waiting for that
// lock would deadlock, and the whole retry would be undone (docs/protocol.md,
// "The queue row and its writers").
func (s *PG) Retry(ctx context.Context, p RetryParams) (int64, error) {
	r, err := s.RetryBlocked(ctx, p)
	return r.Retried, err
}

// Retried says what a retry did: how many messages it made pending again,
// and how many of those wait blocked once the keys were put in order: behind
// an older unfinished message of their order key, or behind a younger one a
// worker holds (a retried message older than it waits for its pass to end). BlockedErr, when not
// nil, is why that count could not be read: the retry itself committed.
type Retried struct {
	Retried    int64
	Blocked    int64
	BlockedErr error
}

// RetryBlocked is Retry, and also counts the retried messages that wait
// blocked after it (read once the keys are in order: a dispatcher may
// already have claimed some, which then count as pending again).
func (s *PG) RetryBlocked(ctx context.Context, p RetryParams) (Retried, error) {
	var r Retried
	var keys []string
	var keyed []int64
	if err := s.withToday(ctx, retrySQL, append(p.selection().args(), p.To), &r.Retried, &keys, &keyed); err != nil {
		return r, fmt.Errorf("retry: %w", err)
	}
	if r.Retried == 0 {
		return r, nil
	}
	if err := s.NotifyIngress(ctx); err != nil {
		return r, fmt.Errorf("retry: %w", err)
	}
	if err := s.releaseKeys(ctx, keys); err != nil {
		// The retry itself has committed: say so, and how the keys come
		// right again, rather than that nothing happened.
		return r, fmt.Errorf("retry: %d messages retried, but putting their order keys in order failed (the dispatcher's claims still take each key's oldest message first, and its next start-up puts the keys in order): %w", r.Retried, err)
	}
	if len(keyed) > 0 {
		if err := s.db.QueryRow(ctx, blockedOfSQL, keyed).Scan(&r.Blocked); err != nil {
			// Not the retry's error: it committed, with its keys in order.
			r.Blocked, r.BlockedErr = 0, fmt.Errorf("counting the retried messages blocked behind their order key: %w", err)
		}
	}
	return r, nil
}

// operatorReleaseSQL hands each key of $1 to its oldest unfinished message
// (pepsi.order_release, schema 12), waiting for the keys' locks: an operator's
// tool may wait for a producer, the dispatcher never does. It takes the locks
// first in the producers' order (orderKeysLocked): pepsi.order_release takes
// them in the order of the keys' text, and a producer holding one of two keys
// it inserts would otherwise wait for the other while this waited for the
// first. When a key is handed to a message (blocked -> pending, or paused
// for a scheduled one), it notifies ingress at commit, as every tool that
// makes rows pending does: a resting dispatcher would otherwise find the
// message only at its heartbeat.
const operatorReleaseSQL = `WITH input AS (SELECT unnest($1::text[]) AS order_key),
released AS (SELECT * FROM pepsi.order_release($1::text[], true) WHERE ` + orderKeysLocked + `)
SELECT count(*), CASE WHEN bool_or(NOT busy) THEN (SELECT true FROM pg_notify('ingress', '')) ELSE false END FROM released`

// releaseKeys puts the order keys of rows an operator's retry or discard
// changed in order again: a retried message older than its key's head is the
// key's oldest again, and a discarded head hands its key on
// (docs/protocol.md, "Ordering per key"). After the change has committed:
// called in the change's transaction, it could deadlock with a producer
// (Retry says how).
func (s *PG) releaseKeys(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	var n int64
	var notified bool
	if err := s.db.QueryRow(ctx, operatorReleaseSQL, keys).Scan(&n, &notified); err != nil {
		return fmt.Errorf("release order keys: %w", err)
	}
	return nil
}

// NotifyIngress wakes the dispatcher at commit, for rows made pending by a
// statement without the insert trigger.
func (s *PG) NotifyIngress(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, notifySQL); err != nil {
		return fmt.Errorf("notify %s: %w", IngressChannel, err)
	}
	return nil
}

// PurgeCutoff is the server's now() less olderThan: one purge's cutoff, on the
// server's clock.
func (s *PG) PurgeCutoff(ctx context.Context, olderThan time.Duration) (time.Time, error) {
	var cutoff time.Time
	if err := s.db.QueryRow(ctx, cutoffSQL, olderThan.Seconds()).Scan(&cutoff); err != nil {
		return time.Time{}, fmt.Errorf("purge cutoff: %w", err)
	}
	return cutoff, nil
}

// PurgeParams is one batch of a purge.
type PurgeParams struct {
	// After is the ingress_id the batch starts after.
	After int64
	// Statuses are the statuses deleted.
	Statuses []core.RowStatus
	// Before is the cutoff: rows last updated before it are deleted.
	Before time.Time
	// Limit bounds the rows the batch finds.
	Limit int
}

// PurgeResult is what one batch of a purge found and did.
type PurgeResult struct {
	// Found is how many rows it found, Last the largest id among them.
	Found, Last int64
	// Deleted is how many it deleted (a row that changed meanwhile is found
	// but not deleted).
	Deleted int64
}

// PurgeBatch deletes up to p.Limit rows after p.After whose status is one of
// p.Statuses and last update before p.Before, in ingress_id order.
func (s *PG) PurgeBatch(ctx context.Context, p PurgeParams) (PurgeResult, error) {
	var r PurgeResult
	if err := s.db.QueryRow(ctx, purgeSQL, p.After, texts(p.Statuses), p.Before, p.Limit).Scan(&r.Found, &r.Last, &r.Deleted); err != nil {
		return PurgeResult{}, fmt.Errorf("purge: %w", err)
	}
	return r, nil
}

// texts is statuses as the text the status column holds, for a statement's
// text[] parameter.
func texts(statuses []core.RowStatus) []string {
	out := make([]string, len(statuses))
	for i, s := range statuses {
		out[i] = string(s)
	}
	return out
}

// keysWaitingSQL counts the order keys that have blocked messages, and those
// messages, and sorts the keys by what their head (the oldest of the key's
// messages that is not blocked, one probe of queue_order_live each) is
// doing. It reads the blocked messages once: through queue_order_blocked,
// its cost growing with the backlogs, where the statistics say few messages
// are blocked; by one pass over the queue, finished messages included, where
// they say most are (as after an analyze of a few keys' backlogs: measured,
// 12,000 rows read for 20 keys' 3,980 blocked messages beside 8,000 others).
// Once per request, never per key.
const keysWaitingSQL = `SELECT count(*), coalesce(sum(k.n), 0)::bigint,
	count(*) FILTER (WHERE h.status = 'pending'),
	count(*) FILTER (WHERE h.status = 'running'),
	count(*) FILTER (WHERE h.status = 'paused' AND h.attempts = 0),
	count(*) FILTER (WHERE h.status = 'paused' AND h.attempts > 0),
	count(*) FILTER (WHERE h.status IS NULL)
FROM (SELECT order_key, count(*) AS n FROM pepsi.queue WHERE status = 'blocked' GROUP BY order_key) k
LEFT JOIN LATERAL (SELECT x.status, x.attempts FROM pepsi.queue x
	WHERE x.order_key = k.order_key AND x.status IN ('pending', 'running', 'paused')
	ORDER BY x.ingress_id LIMIT 1) h ON true`

// KeysWaiting counts the messages that wait, blocked, behind their order
// key's head, and their keys by what the head is doing.
type KeysWaiting struct {
	// Keys is how many order keys have blocked messages; Messages how many
	// those are.
	Keys, Messages int64
	// Of Keys, those whose head is pending (waiting for a worker), running
	// (a worker holds it), paused by its stage (attempts 0), paused for a
	// retry (a 75 answer, attempts > 0), or none: every older message of the
	// key finished, and the dispatcher's release that hands the key to the
	// oldest blocked one is still to come (many of those for long means no
	// dispatcher runs).
	HeadPending, HeadRunning, HeadPaused, HeadRetrying, HeadNone int64
}

// CountKeysWaiting counts the messages waiting behind their order key and
// their keys (pepsi-queue stats, pepsi-httpd).
func (s *PG) CountKeysWaiting(ctx context.Context) (KeysWaiting, error) {
	var w KeysWaiting
	if err := s.db.QueryRow(ctx, keysWaitingSQL).Scan(&w.Keys, &w.Messages,
		&w.HeadPending, &w.HeadRunning, &w.HeadPaused, &w.HeadRetrying, &w.HeadNone); err != nil {
		return KeysWaiting{}, fmt.Errorf("count keys waiting: %w", err)
	}
	return w, nil
}
