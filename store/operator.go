package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
)

// The statements of the operator's daily work on messages (pepsi-queue list
// and discard): which messages a filter selects, and ending pending, paused
// or blocked ones by hand.

// selectWhere is the filter list, its count and discard share, so that a dry
// run (discard -n) counts exactly the rows the discard would change: $1 one
// ingress_id (0: any), $2 the stage (empty: any), $3 the statuses (empty: any),
// $4 a text state.dispatch_error must contain, ignoring case (empty: any), $5
// seconds since the last change the row must be older than (0: any), $6 the
// order key (empty: any).
const selectWhere = `($1::bigint = 0 OR ingress_id = $1)
	AND ($2 = '' OR stage = $2)
	AND (cardinality($3::text[]) = 0 OR status = ANY($3::text[]))
	AND ($4 = '' OR strpos(lower(state ->> 'dispatch_error'), lower($4)) > 0)
	AND ($5::float8 = 0 OR updated_at < now() - make_interval(secs => $5::float8))
	AND ($6 = '' OR order_key = $6)`

// listSQL reads the selected rows after ingress_id $7, in ingress_id order, at
// most $8 of them: one page of pepsi-queue list.
const listSQL = `SELECT ingress_id, stage, status, coalesce(state ->> 'dispatch_error', ''), attempts,
	coalesce(dedup_key, ''), coalesce(order_key, ''), created_at, updated_at
FROM pepsi.queue WHERE ` + selectWhere + ` AND ingress_id > $7
ORDER BY ingress_id LIMIT $8`

// walkTheIDsSQL makes the planner read a page after the first in ingress_id
// order through the primary key, whatever the statistics say, for the rest
// of its transaction (SET LOCAL): a sort is then never needed and a bitmap
// scan never chosen. A queue grown far past its last ANALYZE (autovacuum off)
// made the planner expect a few hundred rows after a page's $7 where a
// million were, and plan each page as a bitmap scan of all of them and a
// sort: 0.5 to 3 s a page, a listing of 1.5 million rows quadratic. Walking
// the key, a page reads up to its last row and stops, and the pages of one
// listing read the key once between them.
const walkTheIDsSQL = `SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// listWalkSQL is listSQL for the pages after the first, run after
// walkTheIDsSQL. Its text differs from listSQL's so that the statement a
// connection prepares and caches for it is only ever planned under those
// settings: a cached generic plan is kept when a setting changes, so one
// made for first pages, with the sort allowed, could serve the later pages
// too.
const listWalkSQL = `/* walking the ids */ ` + listSQL

// countSelectedSQL counts the selected rows.
const countSelectedSQL = `SELECT count(*) FROM pepsi.queue WHERE ` + selectWhere

// discardIDsSQL lists the selected rows' ids, in ingress_id order: what a
// discard then changes, discardBatch at a time.
const discardIDsSQL = `SELECT ingress_id FROM pepsi.queue WHERE ` + selectWhere + ` ORDER BY ingress_id`

// discardSQL ends the rows of ids $8 that are still selected failed, with
// state.dispatch_error $7, and says how many and the order keys among them
// (see releaseKeys). The caller passes only pending, paused and blocked in
// $3: the guard is re-checked on each row as it is updated (READ
// COMMITTED), so a row the dispatcher claimed meanwhile (running, held by a
// worker) is left alone. Each discarded row's history gets a failed event
// in the same statement, a transition without a pass (no handed_at, no
// worker), whose detail is the dispatch_error it was given, at the time of
// the change (operatorEventAt): the history never says less than the queue.
const discardSQL = `WITH gone AS (
	UPDATE pepsi.queue SET status = 'failed', timeout = NULL, updated_at = now(),
		state = CASE WHEN jsonb_typeof(state) = 'object' THEN jsonb_set(state, '{dispatch_error}', to_jsonb($7::text))
		             ELSE jsonb_build_object('dispatch_error', $7::text, 'state', state) END
	WHERE ingress_id = ANY ($8::bigint[]) AND ` + selectWhere + `
	RETURNING ingress_id, stage, order_key, attempts),
recorded AS (
	INSERT INTO pepsi.history (ingress_id, stage, event, detail, at, attempts)
	SELECT ingress_id, stage, 'failed', $7::text, ` + operatorEventAt + `, attempts FROM gone)
SELECT count(*), coalesce(array_agg(DISTINCT order_key) FILTER (WHERE order_key IS NOT NULL), '{}') FROM gone`

// discardBatch is how many rows one transaction of a discard changes. A
// dispatcher's claim or answer that writes a row the discard is changing
// waits for the discard's transaction, and its claim of the stage being
// discarded reaches for exactly those rows: a discard of 290,000 pending
// rows in one transaction stopped every stage of a running dispatcher for
// the 8 s it took; in batches of 100 it kept about three quarters of its
// pace (docs/performance.md, "A discard beside a dispatcher").
const discardBatch = 100

// Selection picks messages for pepsi-queue's list and discard. Zero fields
// select everything.
type Selection struct {
	// ID selects one message.
	ID int64
	// Stage selects messages whose row is at this stage.
	Stage string
	// Statuses selects by status; empty means any.
	Statuses []core.RowStatus
	// Reason selects messages whose state.dispatch_error contains this text,
	// ignoring case.
	Reason string
	// OlderThan selects messages whose row has not changed for this long
	// (updated_at, by the server's clock).
	OlderThan time.Duration
	// OrderKey selects the messages of one order key.
	OrderKey string
}

// args are the statement arguments of s, $1 to $6 of selectWhere.
func (s Selection) args() []any {
	return []any{s.ID, s.Stage, texts(s.Statuses), s.Reason, s.OlderThan.Seconds(), s.OrderKey}
}

// ListParams is one page of a listing.
type ListParams struct {
	Selection
	// After: only messages with a larger ingress_id (the last one of the
	// previous page; 0 for the first).
	After int64
	// Limit is the most messages of the page.
	Limit int
}

// Listed is one message of a listing.
type Listed struct {
	ID            int64
	Stage         string
	Status        core.RowStatus
	DispatchError string // state.dispatch_error, "" if none
	Attempts      int
	DedupKey      string // "" if none
	OrderKey      string // "" if none
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// List reads one page of the selected messages, in ingress_id order.
//
// A first page (After 0) is planned as the statistics say: a narrow
// selection (an order key, a rare reason) is found through an index or one
// scan and sorted, in a fraction of the time walking the whole key would
// take (an order key on 1.75 million rows stored out of id order: 0.2 s,
// against 3 to 5 s walking), and a sort of the whole selection happens at
// most once a listing. The pages after it walk the key (walkTheIDsSQL),
// each in a transaction of its own that is rolled back, never committed:
// the page only reads, and a rollback also undoes the settings in a
// caller's transaction, where a released savepoint would leave them.
func (s *PG) List(ctx context.Context, p ListParams) ([]Listed, error) {
	args := append(p.Selection.args(), p.After, p.Limit)
	if p.After == 0 {
		return collect(ctx, s.db, "list", scanListed, listSQL, args...)
	}
	db, err := s.beginner()
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("list: begin: %w", err)
	}
	page, err := walkPage(ctx, tx, args)
	if rbErr := tx.Rollback(ctx); rbErr != nil && err == nil {
		return nil, fmt.Errorf("list: end the page's transaction: %w", rbErr)
	}
	return page, err
}

// walkPage reads one page after the first on tx, walking the ids.
func walkPage(ctx context.Context, tx pgx.Tx, args []any) ([]Listed, error) {
	if _, err := tx.Exec(ctx, walkTheIDsSQL); err != nil {
		return nil, fmt.Errorf("list: walk the ids: %w", err)
	}
	return collect(ctx, tx, "list", scanListed, listWalkSQL, args...)
}

// scanListed scans one row of listSQL.
func scanListed(r pgx.CollectableRow) (Listed, error) {
	var m Listed
	err := r.Scan(&m.ID, &m.Stage, &m.Status, &m.DispatchError, &m.Attempts, &m.DedupKey, &m.OrderKey, &m.CreatedAt, &m.UpdatedAt)
	return m, err
}

// CountSelected counts the selected messages (pepsi-queue list -count, and
// what a dry run of discard would end).
func (s *PG) CountSelected(ctx context.Context, sel Selection) (int64, error) {
	var n int64
	if err := s.db.QueryRow(ctx, countSelectedSQL, sel.args()...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count: %w", err)
	}
	return n, nil
}

// DiscardParams selects the messages to discard and says why.
type DiscardParams struct {
	// Selection picks them; its Statuses must be pending and/or paused only
	// (the caller checks): a running message belongs to a worker.
	Selection
	// DispatchError is written to their state.dispatch_error.
	DispatchError string
}

// Discard ends the selected pending, paused or blocked messages failed, with
// p.DispatchError as their dispatch_error and a failed event in their
// history, and returns how many. It reads the selection's ids once, then
// changes them discardBatch at a time, each batch its own transaction (when
// called outside one), so that a running dispatcher's writes never wait
// for more than a batch; a row that no longer matches by then (claimed,
// say) is left alone. Then it puts the discarded messages' order keys in
// order (releaseKeys), after the batches have committed, as Retry does.
// Stopped midway (ctx), the committed batches stay discarded, their keys
// are put in order all the same, and the error says how many.
func (s *PG) Discard(ctx context.Context, p DiscardParams) (int64, error) {
	args := p.Selection.args()
	ids, err := collect(ctx, s.db, "discard: select", pgx.RowTo[int64], discardIDsSQL, args...)
	if err != nil {
		return 0, err
	}
	var total int64
	var keys []string
	for len(ids) > 0 && err == nil {
		if err = ctx.Err(); err != nil {
			break // stopped between batches: say so, not that a batch failed
		}
		batch := ids[:min(discardBatch, len(ids))]
		ids = ids[len(batch):]
		var n int64
		var k []string
		if n, k, err = s.discardOne(ctx, append(args, p.DispatchError), batch); err == nil {
			total += n
			keys = append(keys, k...)
		}
	}
	// What committed is discarded: its keys are handed on even if a later
	// batch failed, with a context of their own if ctx was what ended it.
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	relErr := s.releaseKeys(relCtx, keys)
	switch {
	case err != nil && total > 0 && relErr != nil:
		// Both: the keys not handed on leave their next messages blocked.
		return total, fmt.Errorf("discard: stopped after %d messages discarded (they stay failed): %w; and handing their order keys on failed (the dispatcher's next start-up hands them on): %w", total, err, relErr)
	case err != nil && total > 0:
		return total, fmt.Errorf("discard: stopped after %d messages discarded (they stay failed): %w", total, err)
	case err != nil:
		return 0, fmt.Errorf("discard: %w", err)
	case relErr != nil:
		// The discard itself has committed: say so, and how the keys come
		// right again, rather than that nothing happened.
		return total, fmt.Errorf("discard: %d messages discarded, but handing their order keys on failed (the dispatcher's next start-up hands them on): %w", total, relErr)
	}
	return total, nil
}

// discardTries bounds the tries of one discard batch that PostgreSQL rolled
// back as a deadlock's victim (or for a serialization failure).
const discardTries = 5

// discardOne ends one batch of Discard's ids in a transaction of its own
// (discardSQL, args being $1 to $7), and runs it again when PostgreSQL rolled
// it back as a deadlock's victim (Retryable): a running dispatcher's
// transaction locks queue rows in an order of its own (the rows it resolves
// and the keys it releases, then those its claim takes), so a batch that has
// locked one of them and waits for another of them can deadlock with it.
// Rolled back whole, the batch wrote nothing, and runs again as it was, each
// row checked again. Before, the discard stopped there with "deadlock
// detected", having discarded none of the batch.
func (s *PG) discardOne(ctx context.Context, args []any, batch []int64) (int64, []string, error) {
	for try := 1; ; try++ {
		var n int64
		var keys []string
		err := s.withToday(ctx, discardSQL, append(args[:len(args):len(args)], batch), &n, &keys)
		if err == nil || !Retryable(err) || try == discardTries || ctx.Err() != nil {
			return n, keys, err
		}
	}
}
