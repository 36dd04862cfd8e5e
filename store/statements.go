package store

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/traceparent"
)

// statement is one queue command as SQL: what it adds to the step's batch, how
// its results become the command's result event, and that event when the
// transaction failed. Each command is one statement (a Claim three, four
// with limits to check; a Release two), so a step of
// any size is still one round trip.
type statement struct {
	name   string
	queue  func(b *pgx.Batch)
	read   func(br pgx.BatchResults) (core.Event, error)
	failed func(err string) core.Event
}

// statementFor translates one queue command. It panics on any other command:
// handing the queue a spawn or a timer is a bug in the caller.
func statementFor(c core.Command) statement {
	switch c := c.(type) {
	case core.ResetOrphans:
		return resetOrphans(c)
	case core.Claim:
		return claim(c)
	case core.Resolve:
		return resolve(c)
	case core.Wake:
		return wake(c)
	case core.Release:
		return release(c)
	case core.Flush:
		return flush(c)
	case core.KeepHistory:
		return keepHistory(c)
	}
	panic(fmt.Sprintf("store: %T (%v) is not a queue command", c, c))
}

// resetOrphansSQL makes every running row pending except the kept ones (the
// queue_running partial index finds them), answers how many and their order
// keys (core.OrphansReset.Keys), records a reset in pepsi.history for each
// at $2 (core.ResetOrphans.Now), and forgets the flush marks of
// dispatcher lives not heard of for 30 days (see flushSQL).
//
// A row its stage advanced itself just before the dispatcher that held it
// died carries the attempts of the stage before: they count as 0 wherever
// attempts_stage (the stage of the retry that added the last one, schema 27)
// is another stage. It keeps its ready_at, the one of the stage before (what
// made it ready at its new stage was lost with that dispatcher).
const resetOrphansSQL = `
WITH reset AS (
	UPDATE pepsi.queue SET status = 'pending', updated_at = now(),
		attempts = CASE WHEN attempts_stage <> stage THEN 0 ELSE attempts END
	WHERE status = 'running' AND ingress_id <> ALL ($1::bigint[])
	RETURNING ingress_id, stage, attempts, order_key
), recorded AS (
	INSERT INTO pepsi.history (ingress_id, stage, event, at, attempts)
	SELECT ingress_id, stage, 'reset', $2, attempts FROM reset
), forgotten AS (
	DELETE FROM pepsi.stats_flushes WHERE updated_at < now() - interval '30 days'
)
SELECT count(*), coalesce(array_agg(DISTINCT order_key ORDER BY order_key) FILTER (WHERE order_key IS NOT NULL), '{}') FROM reset`

func resetOrphans(c core.ResetOrphans) statement {
	// A nil slice is sent as NULL, and "<> ALL (NULL)" matches nothing.
	keep := c.Keep
	if keep == nil {
		keep = []int64{}
	}
	return statement{
		name: "reset orphans",
		queue: func(b *pgx.Batch) {
			b.Queue(resetOrphansSQL, keep, c.Now)
			if c.ReleaseKeys {
				b.Queue(releaseAllSQL)
				b.Queue(lastIDSQL)
			}
		},
		read: func(br pgx.BatchResults) (core.Event, error) {
			ev := core.OrphansReset{Op: c.Op}
			var n int64
			if err := br.QueryRow().Scan(&n, &ev.Keys); err != nil {
				return nil, err
			}
			ev.Count = int(n)
			if len(ev.Keys) == 0 {
				ev.Keys = nil
			}
			if c.ReleaseKeys {
				heads, busy, err := readRelease(br)
				if err != nil {
					return nil, fmt.Errorf("release every key: %w", err)
				}
				ev.Heads, ev.Busy = heads, busy
				if err := br.QueryRow().Scan(&ev.Seq); err != nil {
					return nil, fmt.Errorf("last ingress_id: %w", err)
				}
			}
			return ev, nil
		},
		failed: func(err string) core.Event { return core.OrphansReset{Op: c.Op, Err: err} },
	}
}

// releaseLockSQL tries the locks of the keys of a Release ($1, and $2 but
// for the rows $3 a move claimed, which releaseSQL skips) before releaseSQL
// runs, in a statement of its own: releaseSQL's snapshot is then taken with
// them held, so it sees every producer of those keys that held the lock
// before, and none can insert a row of them until the transaction ends. A key
// whose lock a producer holds is left to pepsi.order_release, which reports
// it busy. A key whose move claimed is not locked: nothing is released for
// it, and a lock held to the transaction's end would only keep its producers
// waiting.
const releaseLockSQL = `SELECT bool_and(pg_try_advisory_xact_lock(1885696107, x.b))
FROM (SELECT DISTINCT pepsi.order_bucket(u.k) AS b FROM (
	SELECT k.k FROM unnest($1::text[]) AS k(k)
	UNION ALL
	SELECT b.k FROM unnest($2::text[], $3::bigint[]) AS b(k, id)
	WHERE NOT EXISTS (SELECT 1 FROM pepsi.queue r WHERE r.ingress_id = b.id AND (r.status = 'running') IS TRUE OFFSET 0)
) u(k)) x`

// releaseSQL hands keys to their oldest unfinished messages, never waiting
// for a producer's lock (pepsi.order_release, schema 12; core.Release): each
// key of $1 that has an unfinished message (a key whose last message just
// finished has none, and needs nothing), and each key $2[i] that has an
// unfinished message older than $3[i] (core.Release.Behind: a move that does
// not claim, a pause, a retry), unless row $3[i] is running (its key is held,
// nothing can be handed on; the "IS TRUE" spelling keeps the planner on the
// primary key, as in resolveSQL); and every key
// whose lock a producer holds, which pepsi.order_release reports busy. So the
// keys that need nothing cost two index probes each (one per partial index
// of schema 12, each stopping at the key's first entry), not a release. With
// releaseAll, also every key that has blocked messages (core.Release.All).
//
// Three spellings keep that cost whatever the planner believes:
//   - every EXISTS ends in OFFSET 0. Without it PostgreSQL may turn an EXISTS
//     correlated by equality alone into a hashed subplan, which reads the
//     whole index once per statement; a plan made while the statistics said
//     no message was blocked (a fresh queue) then read every entry of a
//     backlog that came later, in every transaction that finished a keyed
//     message (200,000 blocked rows: 3,000 buffers and 49 ms a release).
//     OFFSET 0 keeps each EXISTS a probe per key
//     (TestReleaseCostsItsKeysNotABacklog).
//   - a key of $1 is matched as a range and its rows ordered as the
//     order-key indexes are, LIMIT 1 (kept by the OFFSET 0: PostgreSQL drops
//     an EXISTS's ORDER BY and LIMIT otherwise), as schema 30's insert
//     trigger probes its key: a plan that read the table would have to
//     read all of it to order it (only one made while the queue was a few
//     pages does, until a vacuum or an analyze of the queue makes it
//     again). Spelled "order_key = k", the probe for a
//     blocked message was answered by reading the table in order wherever
//     the statistics said the queue held few keys and most of its messages
//     were blocked (a few keys' backlogs, analyzed): the whole queue for
//     each key whose last message had finished
//     (TestReleaseProbesItsKeysWhateverTheStatistics).
//   - a Behind key's row is looked up first, in a CASE, which PostgreSQL
//     evaluates in order: a row that is running then costs one primary-key
//     look-up, not its lock and two probes before it. (The core no longer
//     sends a Behind for a move that claims, which this made one look-up a
//     keyed hop: see core.Release.) A Behind's probes ask for the key's
//     entries below its row as claimSQL's do, by a row comparison.
const releaseSQL = `SELECT order_key, busy, ingress_id, stage, status, timeout FROM pepsi.order_release(ARRAY(
	SELECT u.k FROM unnest($1::text[]) AS u(k)
	WHERE NOT pg_try_advisory_xact_lock(1885696107, pepsi.order_bucket(u.k))
	   OR EXISTS (SELECT 1 FROM pepsi.queue o WHERE o.order_key >= u.k AND o.order_key <= u.k AND o.status IN ('pending', 'running', 'paused')
	              ORDER BY o.order_key, o.ingress_id LIMIT 1 OFFSET 0)
	   OR EXISTS (SELECT 1 FROM pepsi.queue o WHERE o.order_key >= u.k AND o.order_key <= u.k AND o.status = 'blocked'
	              ORDER BY o.order_key, o.ingress_id LIMIT 1 OFFSET 0)
	UNION ALL
	SELECT b.k FROM unnest($2::text[], $3::bigint[]) AS b(k, id)
	WHERE CASE WHEN EXISTS (SELECT 1 FROM pepsi.queue r WHERE r.ingress_id = b.id AND (r.status = 'running') IS TRUE OFFSET 0)
	           THEN false
	           ELSE NOT pg_try_advisory_xact_lock(1885696107, pepsi.order_bucket(b.k))
	                OR EXISTS (SELECT 1 FROM pepsi.queue o WHERE o.order_key >= b.k AND (o.order_key, o.ingress_id) < (b.k, b.id)
	                           AND o.status IN ('pending', 'running', 'paused') ORDER BY o.order_key DESC, o.ingress_id DESC LIMIT 1 OFFSET 0)
	                OR EXISTS (SELECT 1 FROM pepsi.queue o WHERE o.order_key >= b.k AND (o.order_key, o.ingress_id) < (b.k, b.id)
	                           AND o.status = 'blocked' ORDER BY o.order_key DESC, o.ingress_id DESC LIMIT 1 OFFSET 0) END`

// releaseAll ends releaseSQL for a Release with All.
const releaseAll = `
	UNION ALL
	SELECT pepsi.order_blocked_keys()`

// releaseAllSQL releases every key that has blocked messages: the start-up
// reset's (core.ResetOrphans.ReleaseKeys). pepsi.order_blocked_keys finds them
// with one index probe per key, not one per blocked message.
const releaseAllSQL = `SELECT order_key, busy, ingress_id, stage, status, timeout
FROM pepsi.order_release(ARRAY(SELECT pepsi.order_blocked_keys()), false)`

// lastIDSQL is the highest ingress_id the identity has handed out
// (core.OrphansReset.Seq), if a producer holds an order key's lock (class
// 1885696107, "pepk", schema 12): one in flight may be inserting a row the
// start-up release could not see. Else 0: no release is owed later.
const lastIDSQL = `SELECT CASE WHEN EXISTS (
	SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885696107 AND objsubid = 2
	  AND pid <> pg_backend_pid() AND granted
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
) THEN coalesce(pg_sequence_last_value(pg_get_serial_sequence('pepsi.queue', 'ingress_id')::regclass), 0) ELSE 0 END`

// releaseStatement is releaseSQL, ended, with releaseAll when all.
func releaseStatement(all bool) string {
	sql := releaseSQL
	if all {
		sql += releaseAll
	}
	return sql + "\n), false)"
}

func release(c core.Release) statement {
	sql := releaseStatement(c.All)
	keys, ids := make([]string, len(c.Behind)), make([]int64, len(c.Behind))
	for i, k := range c.Behind {
		keys[i], ids[i] = k.Key, k.ID
	}
	return statement{
		name: "release",
		queue: func(b *pgx.Batch) {
			b.Queue(releaseLockSQL, c.Keys, keys, ids)
			b.Queue(sql, c.Keys, keys, ids)
		},
		read: func(br pgx.BatchResults) (core.Event, error) {
			if _, err := br.Exec(); err != nil {
				return nil, fmt.Errorf("lock the keys: %w", err)
			}
			heads, busy, err := readRelease(br)
			if err != nil {
				return nil, err
			}
			return core.Released{Op: c.Op, Heads: heads, Busy: busy}, nil
		},
		failed: func(err string) core.Event { return core.Released{Op: c.Op, Err: err} },
	}
}

// readRelease reads pepsi.order_release's answer: the keys' heads and the
// keys it found busy.
func readRelease(br pgx.BatchResults) (heads []core.Head, busy []string, err error) {
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var isBusy bool
		var id *int64
		var stage, status *string
		var timeout pgtype.Timestamptz
		if err := rows.Scan(&key, &isBusy, &id, &stage, &status, &timeout); err != nil {
			return nil, nil, err
		}
		if isBusy {
			busy = append(busy, key)
			continue
		}
		h := core.Head{Key: key, ID: *id, Stage: *stage, Status: core.RowStatus(*status)}
		if timeout.Valid && timeout.InfinityModifier == pgtype.Finite {
			h.Timeout = timeout.Time
		}
		heads = append(heads, h)
	}
	return heads, busy, rows.Err()
}

// claimSQL moves pending rows to running: per stage, the first $2[i] pending rows
// of stage $1[i] in ingress_id order. Each LATERAL subquery walks the partial
// queue_pending index (stage, ingress_id) and stops at its LIMIT, so a claim costs
// the rows it takes, not the backlog. The dispatcher is the only pending→running
// writer, so no row lock is needed to keep two claims apart. A cap below zero
// counts as zero. Each stage's walk starts above $3[i], its floor (core.Cap.After):
// the index range below it holds only the dead entries of rows claimed before,
// which a walk from the start of the range would step over one by one.
//
// Two spellings keep the planner on that path whatever its statistics (checked
// by TestClaimPlanWalksPendingIndex, with and without statistics, custom and
// generic plans):
//   - the stage is matched as "stage >= c.stage AND stage <= c.stage" and ordered
//     by (stage, ingress_id). With "stage = c.stage" the planner treats the stage
//     as constant, sees that the primary key also yields ingress_id order, and with
//     an evenly spread backlog prefers walking the primary key and filtering on
//     stage; for a stage whose rows sit behind a large backlog of another stage
//     that walks the whole backlog. Only queue_pending yields (stage, ingress_id)
//     order, so it is the one cheap plan. For the deterministic collations text
//     columns use, the range is exactly equality.
//   - the UPDATE's guard is "(status = 'pending') IS TRUE". It re-checks, under
//     READ COMMITTED, a picked row another tool changed meanwhile; written as a
//     plain "status = 'pending'" it lets a planner without statistics AND a bitmap
//     of the whole queue_pending index (the backlog) with the primary key lookup.
//
// $4 lists the rows the dispatcher holds (core.Claim.Exclude): never taken, even
// when something made them pending while a worker still has them. It is spelled
// "NOT IN (SELECT unnest($4))" so that the planner hashes the list once per
// claim (a hashed SubPlan): written "<> ALL ($4)", a generic plan compares
// every candidate row with every held id, which cost a 384-row claim with 384
// held ids 0.57 ms against 0.08 ms hashed (pgbench, generic plans). The ids
// are never NULL, so NOT IN means what it says.
//
// $7 lists the order keys of the rows the dispatcher holds
// (core.Claim.ExcludeKeys): a row of such a key is never taken, so at most one
// message of a key is held at once. Normally no other row of such a key is
// pending anyway (the key's younger messages are blocked, off this index); an
// operator's retry of an older one can make one so, and it then waits here,
// pending, for the held one's release. Hashed once per claim, as $4 is.
// Nor is a keyed row taken while an older message of its key is unfinished
// (two probes, one per partial index of schema 12, each stopping at the
// key's first entry): the claim itself keeps a key's messages oldest first,
// whatever a release that found the key busy has not yet put in order. Each
// probe asks for the key's entries below the row as a row comparison,
// "(order_key, ingress_id) < (k, id)" with "order_key >= k", in the index's
// order backward from the row, LIMIT 1, as resolveSQL's keyed moves and
// releaseSQL's Behind ask it (the OFFSET 0 keeps the ORDER BY and LIMIT,
// which PostgreSQL drops from a plain EXISTS): the scan starts below the
// row and ends at the key's first entry (forward from the key's first
// entry, PostgreSQL 15 does not end it at the row: it read the key's whole
// backlog above the head, TestProbesForAnOlderMessageStopAtTheMessage), and
// no plan can take the primary key's range below it instead. Spelled
// "order_key = k AND ingress_id < id", a generic plan made where the
// statistics said the queue held few keys, most of their messages blocked,
// walked the primary key below each candidate, every older row of the queue
// (TestProbesForAnOlderMessageStayOnTheKeyWhateverTheStatistics).
//
// Each stage's walk reads one row past its cap: when that row is there, the
// stage has more pending rows than the claim took (core.Claimed.More), and the
// statement answers a row with a NULL ingress_id naming the stage after the
// rows it claimed. So a claim that took exactly its cap says whether it
// emptied the stage, which a move that claims needs to know (core/moveclaim.go).
//
// For the stages in $5 (INPUT = message; core.Cap.LineMax) it also returns each
// row's state as JSON text and its payload with its length, but not a payload
// longer than $6 bytes (its length only: the core fails such a message, and the
// dispatcher never holds it). The CASEs make every other stage's row cost what
// it did: its payload is not even detoasted (octet_length of a toasted value
// reads its header).
//
// attempts (docs/protocol.md, "Retries"): a row whose attempts were counted at
// another stage (attempts_stage, schema 27: a stage advanced it itself, and
// the dispatcher that could have set them to 0 died first) is claimed with
// attempts 0, so the retry limit counts from the stage it is claimed for.
//
// Traces (docs/protocol.md, "Traces"; schemas 17 and 22): the UPDATE gives a
// row without a traceparent a fresh one (pepsi.fresh_traceparent, its trace
// id hashed from the row's id and $9, a random seed per statement), in the
// write the claim makes anyway, so a message's first pass starts its trace at
// no cost of a row version, and every later pass finds it. For the stages in
// $5, whose lines carry the pass's traceparent, and, with $8
// (core.Claim.Traces), for every stage, it returns the message's traceparent
// and the claim's updated_at, from which readTrace makes the pass's
// (pepsi.pass_traceparent's value, computed off this backend).
//
// Back-pressure (core.Claim.Limits and Holds) is claimLimitsSQL's, which
// is claimSQL with $10 to $14 more; claimSQL is the claim of a dispatcher
// none of whose stages has a MAX_PENDING (nearly all). Its parts cost every
// claim their setup whether a stage is held or not: about 50 µs of the
// backend's time per transaction, a tenth of the fixed part of the defaults'
// transactions (docs/performance.md, "A transaction's fixed cost, again").
const claimSQL = `
WITH capped AS (
	SELECT c.stage, c.after, greatest(c.n, 0) AS n
	FROM unnest($1::text[], $2::int[], $3::bigint[]) AS c(stage, n, after)
` + claimPickSQL

// claimLimitsSQL is claimSQL with back-pressure (core.Claim.Holds): a stage
// of $13 whose stage of $14 (at the same index) has more pending rows than
// its limit ($10, $11 above $12: the claim's Limits) as the transaction
// stands before this claim takes nothing, unless it is over its own limit;
// its cap counts as 0 (its walk still peeks one row, for More). The counts
// are overSQL's.
const claimLimitsSQL = `
WITH over AS (
	SELECT l.stage
	FROM unnest($10::text[], $11::bigint[], $12::bigint[]) AS l(stage, max, after)
	WHERE (SELECT count(*) FROM (
		SELECT 1 FROM pepsi.queue q
		WHERE q.status = 'pending' AND q.stage >= l.stage AND q.stage <= l.stage AND q.ingress_id > l.after
		ORDER BY q.stage, q.ingress_id
		LIMIT l.max + 1) s) > l.max
), capped AS (
	SELECT c.stage, c.after,
		CASE WHEN c.stage NOT IN (SELECT stage FROM over) AND EXISTS (
			SELECT 1 FROM unnest($13::text[], $14::text[]) AS h(stage, by)
			WHERE h.stage = c.stage AND h.by IN (SELECT stage FROM over))
		THEN 0 ELSE greatest(c.n, 0) END AS n
	FROM unnest($1::text[], $2::int[], $3::bigint[]) AS c(stage, n, after)
` + claimPickSQL

// claimPickSQL is the rest of claimSQL and claimLimitsSQL after "capped":
// the walks, the UPDATE and the answer.
const claimPickSQL = `), picked AS (
	SELECT c.stage, c.n, p.ingress_id
	FROM capped c
	CROSS JOIN LATERAL (
		SELECT q.ingress_id FROM pepsi.queue q
		WHERE q.status = 'pending' AND q.stage >= c.stage AND q.stage <= c.stage AND q.ingress_id > c.after
		  AND q.ingress_id NOT IN (SELECT unnest($4::bigint[]))
		  AND (q.order_key IS NULL OR (q.order_key NOT IN (SELECT unnest($7::text[]))
		       AND NOT EXISTS (SELECT 1 FROM pepsi.queue o WHERE o.order_key >= q.order_key AND (o.order_key, o.ingress_id) < (q.order_key, q.ingress_id)
		                       AND o.status IN ('pending', 'running', 'paused') ORDER BY o.order_key DESC, o.ingress_id DESC LIMIT 1 OFFSET 0)
		       AND NOT EXISTS (SELECT 1 FROM pepsi.queue o WHERE o.order_key >= q.order_key AND (o.order_key, o.ingress_id) < (q.order_key, q.ingress_id)
		                       AND o.status = 'blocked' ORDER BY o.order_key DESC, o.ingress_id DESC LIMIT 1 OFFSET 0)))
		ORDER BY q.stage, q.ingress_id
		LIMIT c.n + 1
	) p
), found AS (
	SELECT stage, count(*) > max(n) AS more, max(ingress_id) AS peeked FROM picked GROUP BY stage
), claimed AS (
	UPDATE pepsi.queue u SET status = 'running', updated_at = now(),
		attempts = CASE WHEN u.attempts_stage <> u.stage THEN 0 ELSE u.attempts END,
		traceparent = coalesce(u.traceparent, pepsi.fresh_traceparent(u.ingress_id, $9::bigint, now()))
	WHERE u.ingress_id = ANY (ARRAY(SELECT p.ingress_id FROM picked p JOIN found f ON f.stage = p.stage
	                                WHERE NOT (f.more AND p.ingress_id = f.peeked)))
	  AND (u.status = 'pending') IS TRUE
	RETURNING u.ingress_id, u.stage, u.attempts, u.order_key,
		CASE WHEN u.stage = ANY ($5::text[]) THEN u.state::text END AS state,
		CASE WHEN u.stage = ANY ($5::text[]) THEN coalesce(octet_length(u.payload), -1) END AS payload_size,
		CASE WHEN u.stage = ANY ($5::text[]) AND octet_length(u.payload) <= $6::int THEN u.payload END AS payload,
		CASE WHEN u.stage = ANY ($5::text[]) THEN u.parent_id END AS parent_id,
		CASE WHEN $8::bool THEN u.traceparent END AS trace,
		CASE WHEN $8::bool OR u.stage = ANY ($5::text[]) THEN u.traceparent END AS pass_of, u.updated_at AS claimed_at
)
SELECT ingress_id, stage, attempts, order_key, state, payload_size, payload, parent_id, trace, pass_of, claimed_at FROM claimed
UNION ALL
SELECT NULL, stage, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM found WHERE more
ORDER BY 1 NULLS LAST, 2`

// overSQL names the stages $1 that have more than $2 rows pending above
// $3 (core.Claim.Limits, core.Claimed.Over), in the order given. It runs
// after claimLimitsSQL in the same transaction, so it counts what that
// claim left pending. Each count walks the pending index (queue_pending)
// above the stage's floor and stops after $2 + 1 entries: a claim pays for a
// limit of N at most N + 1 index entries, whatever the backlog (spelled as
// the claim's walk is, for the same plan).
const overSQL = `
SELECT l.stage
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS l(stage, max, after, i)
CROSS JOIN LATERAL (
	SELECT count(*) AS n FROM (
		SELECT 1 FROM pepsi.queue q
		WHERE q.status = 'pending' AND q.stage >= l.stage AND q.stage <= l.stage AND q.ingress_id > l.after
		ORDER BY q.stage, q.ingress_id
		LIMIT l.max + 1
	) s
) c
WHERE c.n > l.max
ORDER BY l.i`

// ProducerKey is the advisory lock every producer transaction holds shared from
// its first insert into pepsi.queue to its end ("pepsprod"; schema 6's trigger
// takes it before the insert takes any id). The SQL of the trigger spells the
// same number: keep them equal.
const ProducerKey int64 = 0x7065707370726f64

// settledSQL reports how far ingress has settled (core.Claimed.Settled): the
// highest ingress_id the statement's snapshot sees, if no producer held
// ProducerKey when pg_locks was read, which is after the snapshot was taken; else
// 0. A producer that held a lower id then had taken the lock before that id and
// still held it, so none did: every row up to that id is committed or gone, and
// the claim that follows, with a later snapshot, sees all of them. $1 and $2 are
// the key's high and low halves, as pg_locks shows an advisory lock on a bigint.
// The dispatcher's own transaction holds the lock too once its resolve has
// inserted emitted messages (resolveSQL's "children"): those rows are its own,
// which its claim sees, not a producer's that may commit later, so its own
// backend does not count. Counted, a step that emits would report nothing
// settled, and the claim floors would stop rising for as long as stages emit
// (every claim walking the index entries of all the rows claimed since). IS
// DISTINCT FROM: a prepared transaction's lock has no pid, and counts.
//
// When the highest id is at or below $3 (core.Claim.Settled: what the core
// knows has settled), pg_locks is not read: that id is settled whatever
// producers are doing, and the CASE, evaluated in order, never runs the
// EXISTS (an InitPlan, run only when first needed). pg_lock_status copies
// every entry of the server's lock tables, which are sized by
// max_connections: about 40 µs of the backend's time per transaction here
// (docs/performance.md, "A transaction's fixed cost, again").
const settledSQL = `
SELECT CASE WHEN n.id <= $3::bigint THEN n.id
            WHEN EXISTS (
	SELECT 1 FROM pg_locks
	WHERE locktype = 'advisory' AND classid = $1::oid AND objid = $2::oid AND objsubid = 1
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND pid IS DISTINCT FROM pg_backend_pid()
) THEN 0 ELSE n.id END
FROM (SELECT coalesce(max(ingress_id), 0) AS id FROM pepsi.queue) n`

// epochSQL makes sure the crash sentinel holds a token and returns it. A plain
// SELECT in the same statement cannot see the row the INSERT adds, hence the
// UNION. Only the dispatcher (one per system) writes the table.
const epochSQL = `
WITH added AS (
	INSERT INTO pepsi.dispatch_epoch (token)
	SELECT gen_random_uuid()::text
	WHERE NOT EXISTS (SELECT 1 FROM pepsi.dispatch_epoch)
	RETURNING token
)
SELECT token FROM added
UNION ALL
(SELECT token FROM pepsi.dispatch_epoch ORDER BY token LIMIT 1)
LIMIT 1`

func claim(c core.Claim) statement {
	return statement{
		name: "claim",
		queue: func(b *pgx.Batch) {
			b.Queue(epochSQL)
			b.Queue(settledSQL, uint32(uint64(ProducerKey)>>32), uint32(uint64(ProducerKey)&0xffffffff), c.Settled)
			if len(c.Limits) == 0 && len(c.Holds) == 0 {
				b.Queue(claimSQL, claimArgs(c)...)
				return
			}
			limits := limitArgs(c)
			b.Queue(claimLimitsSQL, append(claimArgs(c), limits...)...)
			if len(c.Limits) > 0 {
				b.Queue(overSQL, limits[:3]...)
			}
		},
		read: func(br pgx.BatchResults) (core.Event, error) {
			ev := core.Claimed{Op: c.Op}
			if err := br.QueryRow().Scan(&ev.Epoch); err != nil {
				return nil, fmt.Errorf("crash sentinel: %w", err)
			}
			if err := br.QueryRow().Scan(&ev.Settled); err != nil {
				return nil, fmt.Errorf("settled ingress: %w", err)
			}
			rows, err := br.Query()
			if err != nil {
				return nil, err
			}
			all, err := pgx.CollectRows(rows, claimedRow)
			if err != nil {
				return nil, err
			}
			for _, r := range all {
				if r.ID == 0 {
					ev.More = append(ev.More, r.Stage)
				} else {
					ev.Rows = append(ev.Rows, r)
				}
			}
			if len(c.Limits) > 0 {
				over, err := br.Query()
				if err != nil {
					return nil, fmt.Errorf("check MAX_PENDING: %w", err)
				}
				if ev.Over, err = pgx.CollectRows(over, pgx.RowTo[string]); err != nil {
					return nil, fmt.Errorf("check MAX_PENDING: %w", err)
				}
			}
			return ev, nil
		},
		failed: func(err string) core.Event { return core.Claimed{Op: c.Op, Err: err} },
	}
}

// claimArgs are claimSQL's arguments for c, $1 to $9 (claimLimitsSQL's
// first nine).
func claimArgs(c core.Claim) []any {
	stages := make([]string, len(c.Caps))
	caps := make([]int32, len(c.Caps))
	after := make([]int64, len(c.Caps))
	messageStages := []string{} // never NULL: "= ANY (NULL)" is NULL, not false
	lineMax := 0
	for i, cp := range c.Caps {
		stages[i] = cp.Stage
		caps[i] = int32(min(max(cp.N, 0), 1<<30))
		after[i] = max(cp.After, 0)
		if cp.LineMax > 0 {
			messageStages = append(messageStages, cp.Stage)
			lineMax = max(lineMax, cp.LineMax)
		}
	}
	exclude := c.Exclude
	if exclude == nil {
		exclude = []int64{} // NULL would make "<> ALL" match nothing
	}
	excludeKeys := c.ExcludeKeys
	if excludeKeys == nil {
		excludeKeys = []string{} // NULL would make "NOT IN" match nothing
	}
	return []any{stages, caps, after, exclude, messageStages, int32(min(lineMax, 1<<30)), excludeKeys, c.Traces, traceSeed()}
}

// limitArgs are claimLimitsSQL's $10 to $14 for c: the Limits' stages,
// maxima and floors (overSQL's three arguments), then the Holds' stages and
// the stages they are held by. A maximum of -1 (core.Limit) counts a stage
// over with nothing pending: its walk takes no entry (LIMIT 0).
func limitArgs(c core.Claim) []any {
	limitStages, limitMax, limitAfter := make([]string, len(c.Limits)), make([]int64, len(c.Limits)), make([]int64, len(c.Limits))
	for i, l := range c.Limits {
		limitStages[i], limitMax[i], limitAfter[i] = l.Stage, max(l.Max, -1), max(l.After, 0)
	}
	holdStages, holdBy := make([]string, len(c.Holds)), make([]string, len(c.Holds))
	for i, h := range c.Holds {
		holdStages[i], holdBy[i] = h.Stage, h.By
	}
	return []any{limitStages, limitMax, limitAfter, holdStages, holdBy}
}

// claimedRow reads one row of claimSQL's (or claimLimitsSQL's) answer: a
// claimed row, or (ID 0) a stage that has more pending rows than the claim
// took.
func claimedRow(r pgx.CollectableRow) (core.Row, error) {
	var row core.Row
	var id *int64
	var attempts *int32
	var key, state, trace, passOf *string
	var size *int32
	var payload []byte
	var parent *int64
	var claimedAt *time.Time
	if err := r.Scan(&id, &row.Stage, &attempts, &key, &state, &size, &payload, &parent, &trace, &passOf, &claimedAt); err != nil {
		return row, err
	}
	if id == nil {
		return row, nil // the stage has more pending rows: row.ID 0
	}
	row.ID = *id
	if attempts != nil {
		row.Attempts = int(*attempts)
	}
	if key != nil {
		row.Key = *key
	}
	if state != nil && size != nil {
		row.Message = &core.Message{State: *state, Payload: payload, PayloadSize: int(*size)}
		if parent != nil {
			row.Message.ParentID = *parent
		}
	}
	row.Trace = readTrace(row.ID, trace, passOf, claimedAt)
	return row, nil
}

// readTrace is the trace context a claim of row id read: the message's
// traceparent (trace, read when the core asked for traces) and the pass's,
// made here from passOf, the message's traceparent read for it, and the
// claim's updated_at (traceparent.Pass: the span id pepsi.pass_span would
// give, computed off the backend whose time bounds hops/s; schema 22).
func readTrace(id int64, trace, passOf *string, claimedAt *time.Time) core.Trace {
	var t core.Trace
	if trace != nil && traceparent.Wellformed(*trace) {
		t.Message = *trace // one an UPDATE wrote is not checked by the database (schema 27)
	}
	if passOf != nil && claimedAt != nil {
		t.Pass = traceparent.Pass(*passOf, id, *claimedAt)
	}
	return t
}

// traceSeed is the random seed of one statement's fresh trace ids
// (pepsi.fresh_traceparent, schema 22): with it a trace id is two 64-bit
// hashes of the message's id, so the backend draws no randomness per row.
func traceSeed() int64 {
	return int64(rand.Uint64())
}

// resolveSQL applies the Items of a Resolve in one statement (see core.Item and
// core.Verdict). Every item is guarded: only a row still running at the item's
// stage takes the item's verdict; a row running at another stage was advanced by
// that stage and is requeued there; any other row is left alone. The verdicts:
//   - requeue: pending;
//   - fail, timeout: failed or timeout, the reason in state.dispatch_error;
//   - answered (a bare 0 that left the row running): failed with the reason,
//     unless the item's epoch is one the crash sentinel no longer holds (a
//     crash may have lost the stage's commit), then pending;
//   - move (a transition the stage answered): straight to what the row becomes
//     next, one row version: pending at the target stage, done, or paused with
//     the item's timeout; the patch, if any, merged into state (state || patch);
//     with the item's claim ($9, core.Item.Claim) running at the target stage
//     instead of pending (a move that claims: the dispatcher holds it for that
//     stage from here, and the hop costs one row version, not two), but a
//     keyed row only if no older message of its key is unfinished (the two
//     probes the claim makes: an operator may have retried one, which must go
//     first; the release after the resolve then puts this one behind it);
//   - retry (an answer 75 with retries left): paused with the item's timeout,
//     attempts + 1, the reason in state.dispatch_error.
//
// attempts counts retries at the current stage: it is 0 again whenever the
// statement moves the row to another stage (an answered advance, or the
// requeue of a row its stage advanced), and a retry writes the stage it
// counts at into attempts_stage (schema 27), which the claim and the orphan
// reset read for a row a stage advanced itself before a dispatcher died.
//
// Each item with history on ($11, core.Item.History) records its pass in
// pepsi.history in the same statement, only as it happened: a row the UPDATE
// wrote, or one no longer running (the stage wrote its own transition), gets
// one row, the item's event ($12), except that an item whose guard did not
// hold is a guard-miss (a move, and a failure, timeout, retry or requeue of a
// row its stage had moved on or finished: the history says what the row
// became, never a verdict the row did not take) and a bare 0 that left the
// row running is failed; a row
// still running after the statement (a late commit raced it) gets none (its
// item is resolved again). An item sent again after a lost reply ($17)
// records nothing if its pass is there already (same id, stage and at).
//
// It returns one row per item, in item order, with the row as it is after the
// statement, and whether the guard matched; for a move that claimed, also its
// trace context as claimSQL reads it ($18, core.Resolve.Traces; a row
// without a traceparent gets one here, as a claim gives it, with $19 its seed), its
// attempts and, when the item's line_max ($10, core.Item.LineMax) is set, its
// state (after the patch: RETURNING shows the new version) and payload, read
// as claimSQL reads them for an INPUT = message stage. The UPDATE's effects are invisible to
// a plain read of pepsi.queue in the same statement, so updated rows are reported
// from RETURNING and the others from the table; the guard is read from "o", the
// same row joined as the statement's snapshot saw it (RETURNING shows only the
// new version). The look-up of a row the UPDATE skipped is a LATERAL subquery
// whose "u.ingress_id IS NULL" becomes a one-time filter (OFFSET 0 keeps the
// planner from flattening it into a join that looks every item's row up a
// third time only to drop it): the step's transactions run on one backend at
// a time by default (SESSIONS = 1), and every look-up saved is hops/s
// (docs/performance.md). Every
// worker that held these rows has answered or exited
// (core.Resolve's precondition), but a commit of a stage's may still be on its
// way: the UPDATE then waits for it and re-checks its WHERE on the committed
// row. The WHERE names the status and stage the decision was made on, so a row
// the commit moved is skipped, not overwritten with a verdict decided on what
// it was; it is reported as the snapshot saw it, running, and the core resolves
// it again (TestResolveOfARowALateCommitMovesWritesNothing forces it).
//
// The rows are looked up by id through the primary key, whatever the planner's
// estimates: the running guard is spelled "(status = 'running') IS TRUE", which
// does not imply the queue_running index's predicate, so the planner cannot read
// that index whole. Spelled plainly, a planner that believes few rows are
// running (statistics taken on a fresh backlog) hashes the whole queue_running
// index, whose dead entries grow by one per claim until a vacuum: a resolve
// would cost the queue's history, not its items (checked by
// TestResolvePlanCostsItsItems, which saw 40,000 buffers per resolve of 128).
//
// A move's emits (core.Item.Emits, $20 to $26: per child its item's ordinal,
// stage, payload, state, key, order key and claim) are inserted pending at
// their stages with parent_id the item's id by the "children" INSERT of the
// same statement, only for an item whose UPDATE matched its guard: they exist
// exactly when the transition does. A child whose emit claims (core.Emit.Claim)
// is inserted running instead, if it has neither key nor order key and the
// pass has a trace context to give it (always, but for a row claimed before
// schema 17), and reported after the items (resolveReportChildrenSQL): the
// core holds it as a claimed row. A child whose key is in the queue already
// inserts nothing (ON CONFLICT DO NOTHING); a keyed child goes through the
// order-key trigger as any producer's row, its key's lock taken first by
// the statement, which never waits for it (resolveKeyedHeadSQL: a move
// whose children's keys a producer holds is written later), and the release
// that follows the resolve sorts its key out. Children are inserted in the order the stage emitted
// them, so their ingress_ids follow that order. A child's traceparent is the
// emitting pass's, so it is a child of that pass's span: computed from the
// parent row as the statement's snapshot saw it ("decided"'s seen_*), since
// the UPDATE changes its updated_at, from which pepsi.pass_span hashes the
// pass (and a move that claims its stage too).
//
// A move to another stage sets ready_at (the row is ready anew there, pending
// or claimed), and so does the requeue of a row its stage advanced itself:
// that row becomes ready at its new stage now, pending there (schema 27; the
// queue has no trigger that would set it at the stage's own update). Every
// other outcome of a resolve keeps ready_at: a requeue of a row at its own
// stage (the age of the oldest pending message keeps growing while a stage
// cannot run it), a pass to done, paused or failed.
//
// "decided" is MATERIALIZED so that each item's decision is made once. Inlined
// into the UPDATE, its to_status was computed again for every use of it in the
// UPDATE's SET and RETURNING (eleven): for a keyed move that claims, each
// computation probed both order-key indexes, 21 probes of each per keyed
// message where one was meant (counted with auto_explain: 63,888 for 3,000
// keyed messages through three stages).
//
// A stage owns state; if it stored something other than a JSON object there, the
// reason or patch cannot be set inside it, and failing the whole step over it
// would stop the dispatcher, so such a state is wrapped as {"state": <old>, …}.
const resolveItemSQL = `
WITH item AS (
	SELECT t.id, t.stage, t.verdict, t.reason, t.target, t.until, t.patch, t.claim, t.line_max, t.ord,
	       t.epoch = '' OR EXISTS (SELECT 1 FROM pepsi.dispatch_epoch e WHERE e.token = t.epoch) AS epoch_ok,
	       t.hist, t.event, t.handed_at, t.at, t.pid, t.attempts, t.again
	FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::text[],
	            $9::bool[], $10::int[], $11::bool[], $12::text[], $13::timestamptz[], $14::timestamptz[], $15::int[], $16::int[], $17::bool[])
	     WITH ORDINALITY AS t(id, stage, verdict, reason, epoch, target, until, patch, claim, line_max,
	                          hist, event, handed_at, at, pid, attempts, again, ord)
`

// resolveDecidedStartSQL is resolveHeadSQL's "decided" up to the expression
// of its key_busy.
const resolveDecidedStartSQL = `), decided AS MATERIALIZED (
	SELECT item.*, o.stage AS seen_stage, o.stage = item.stage AS matched, o.traceparent AS seen_trace, o.updated_at AS seen_at,
	       CASE
	           WHEN o.stage <> item.stage THEN 'pending'
	           WHEN item.verdict = 'move' THEN
	               CASE item.target WHEN 'done' THEN 'done' WHEN 'paused' THEN 'paused'
	                   ELSE CASE WHEN NOT item.claim THEN 'pending'
	                             WHEN o.order_key IS NULL THEN 'running'
	                             WHEN EXISTS (SELECT 1 FROM pepsi.queue x WHERE x.order_key >= o.order_key AND (x.order_key, x.ingress_id) < (o.order_key, o.ingress_id)
	                                          AND x.status IN ('pending', 'running', 'paused') ORDER BY x.order_key DESC, x.ingress_id DESC LIMIT 1 OFFSET 0)
	                               OR EXISTS (SELECT 1 FROM pepsi.queue x WHERE x.order_key >= o.order_key AND (x.order_key, x.ingress_id) < (o.order_key, o.ingress_id)
	                                          AND x.status = 'blocked' ORDER BY x.order_key DESC, x.ingress_id DESC LIMIT 1 OFFSET 0) THEN 'pending'
	                             ELSE 'running' END END
	           WHEN item.verdict = 'fail' THEN 'failed'
	           WHEN item.verdict = 'timeout' THEN 'timeout'
	           WHEN item.verdict = 'answered' THEN CASE WHEN item.epoch_ok THEN 'failed' ELSE 'pending' END
	           WHEN item.verdict = 'requeue' THEN 'pending'
	           WHEN item.verdict = 'retry' THEN 'paused'
	           ELSE item.verdict -- no such verdict: the status CHECK fails the step
	       END AS to_status,
	       `

// resolveHeadEndSQL is resolveHeadSQL after the expression of decided's
// key_busy.
const resolveHeadEndSQL = ` AS key_busy
	FROM item JOIN pepsi.queue o ON o.ingress_id = item.id AND (o.status = 'running') IS TRUE
), updated AS (
	UPDATE pepsi.queue q SET
		stage = CASE WHEN d.matched AND d.verdict = 'move' AND d.target NOT IN ('done', 'paused') THEN d.target ELSE q.stage END,
		status = d.to_status,
		timeout = CASE WHEN d.matched AND d.to_status = 'paused' THEN d.until ELSE q.timeout END,
		state = CASE
			WHEN NOT d.matched THEN q.state
			WHEN d.verdict = 'move' AND d.patch <> '' THEN
				CASE WHEN jsonb_typeof(q.state) = 'object' THEN q.state ELSE jsonb_build_object('state', q.state) END || d.patch::jsonb
			WHEN d.to_status IN ('failed', 'timeout') OR d.verdict = 'retry' THEN
				CASE WHEN jsonb_typeof(q.state) = 'object' THEN jsonb_set(q.state, '{dispatch_error}', to_jsonb(d.reason))
				     ELSE jsonb_build_object('dispatch_error', d.reason, 'state', q.state) END
			ELSE q.state
		END,
		attempts = CASE
			WHEN NOT d.matched THEN 0
			WHEN d.verdict = 'retry' THEN q.attempts + 1
			WHEN d.verdict = 'move' AND d.target NOT IN ('done', 'paused') AND d.target <> q.stage THEN 0
			ELSE q.attempts
		END,
		traceparent = CASE WHEN d.matched AND d.to_status = 'running' AND q.traceparent IS NULL
			THEN pepsi.fresh_traceparent(q.ingress_id, $19::bigint, now()) ELSE q.traceparent END,
		attempts_stage = CASE WHEN d.matched AND d.verdict = 'retry' THEN q.stage ELSE q.attempts_stage END,
		ready_at = CASE WHEN NOT d.matched OR (d.verdict = 'move' AND d.target NOT IN ('done', 'paused') AND d.target <> q.stage)
			THEN now() ELSE q.ready_at END,
		updated_at = now()
	FROM decided d
	WHERE q.ingress_id = d.id AND (q.status = 'running') IS TRUE AND q.stage = d.seen_stage AND NOT d.key_busy
	RETURNING q.ingress_id, q.stage, q.status, q.timeout, q.state ->> 'dispatch_error' AS error, d.matched,
		d.matched AND d.to_status = 'running' AS claimed, q.attempts, d.ord, d.matched AND d.verdict = 'move' AS moved,
		CASE WHEN d.matched AND d.to_status = 'running' AND d.line_max > 0 THEN q.state::text END AS msg_state,
		CASE WHEN d.matched AND d.to_status = 'running' AND d.line_max > 0 THEN coalesce(octet_length(q.payload), -1) END AS payload_size,
		CASE WHEN d.matched AND d.to_status = 'running' AND d.line_max > 0 AND octet_length(q.payload) <= d.line_max THEN q.payload END AS payload,
		CASE WHEN d.matched AND d.to_status = 'running' AND d.line_max > 0 THEN q.parent_id END AS msg_parent,
		CASE WHEN d.matched AND d.to_status = 'running' AND $18::bool THEN q.traceparent END AS trace,
		CASE WHEN d.matched AND d.to_status = 'running' AND (d.line_max > 0 OR $18::bool) THEN q.traceparent END AS pass_of,
		q.updated_at AS claimed_at,
		d.seen_stage, d.seen_trace, d.seen_at
)`

// resolveHeadSQL is the head of a resolve whose children carry neither a
// key nor an order key: no item waits for a producer's lock (key_busy).
const resolveHeadSQL = resolveItemSQL + resolveDecidedStartSQL + `false` + resolveHeadEndSQL

// resolveKeyedHeadSQL is the head of a resolve some of whose children carry
// a key or an order key. A move whose children's order keys fall in a
// bucket whose lock another session holds (a producer's transaction that
// inserted a row of that bucket and has not ended) is key_busy: nothing of
// it is written, and it is reported running at its stage
// (core.Outcome.KeyBusy). The insert of such a child would wait for that
// producer, and the dispatcher's transactions, which are serial, with it:
// every stage and every key behind one producer's transaction. Each
// bucket's lock is tried (pg_try_advisory_xact_lock, which never waits)
// once per item in "key_locks", which "decided" reads before the UPDATE and
// the children's INSERT, and kept to the transaction's end where it was
// free, as the children's insert trigger would take it (holding it
// already, the trigger does not wait). (Tried in a subquery of each item's
// decision, the locks would read every child of the resolve for each item:
// a model of the two spellings in psql, 64 items of 1,000 children each,
// took 0.56 s and 0.06 s.) key_locks is one row, the array of the items
// (ords) some of whose buckets were busy, which "decided" reads as an
// InitPlan, once, and "result" likewise the ids of the items decided
// key_busy: looked up in a correlated subquery per item, each read every
// item's row, n² rows a resolve (2,000 items: 0.15-0.4 s where 0.07-0.1
// is the statement's own; TestAKeyedResolveReadsItsDecisionsOncePerItemNotOncePerPair).
// Only a move
// whose guard holds is held back: the others write no child, and the locks
// tried for them are only held to the end of a short transaction. (A
// child's dedup key still waits for a producer's uncommitted row of the
// same key, which is not known before the INSERT.)
const resolveKeyedHeadSQL = resolveItemSQL + `), key_locks AS MATERIALIZED (
	SELECT array_agg(k.ord) FILTER (WHERE NOT k.free) AS busy
	FROM (SELECT l.ord, bool_and(pg_try_advisory_xact_lock(1885696107, l.b)) AS free
	      FROM (SELECT DISTINCT e.ord, pepsi.order_bucket(e.k) AS b FROM unnest($20::bigint[], $25::text[]) AS e(ord, k)
	            WHERE e.k <> '' ORDER BY 1, 2) l
	      GROUP BY l.ord) k
` + resolveDecidedStartSQL + `item.verdict = 'move' AND o.stage = item.stage
	           AND coalesce(item.ord = ANY((SELECT l.busy FROM key_locks l)::bigint[]), false)` + resolveHeadEndSQL

// resolveChildrenSQL is resolveSQL's part that inserts a move's emits:
// resolveChildrenInsertSQL, then, as some child carries a key or an order
// key, the dedup key's ON CONFLICT. (The order-key buckets' locks of the
// moves whose children are inserted were taken by resolveKeyedHeadSQL.)
const resolveChildrenSQL = resolveChildrenInsertSQL + `
	ORDER BY c.n
	ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
	RETURNING ingress_id, parent_id, stage, status, traceparent, updated_at
)`

// resolveChildrenQueuedSQL is resolveChildrenSQL for a Resolve with
// QueueKeys (core.Resolve): the children's order-key buckets' locks are
// queued for, in sorted order as pepsi-ingress takes them (so the two
// cannot deadlock over buckets), under the transaction's short lock wait
// (queuedLockWaitSQL), not tried: PostgreSQL hands a released lock to its
// next waiter, so a try could never get one that producers hold one after
// another without a gap.
const resolveChildrenQueuedSQL = resolveChildrenInsertSQL + `
	WHERE (SELECT count(pg_advisory_xact_lock(1885696107, b))
	       FROM (SELECT DISTINCT pepsi.order_bucket(k.order_key) AS b FROM child k
	             WHERE k.order_key <> '' ORDER BY b) s) >= 0
	ORDER BY c.n
	ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
	RETURNING ingress_id, parent_id, stage, status, traceparent, updated_at
)`

// queuedLockWaitSQL bounds the lock waits of a Resolve with QueueKeys: it
// is its transaction's only command, and the pipeline waits with it, so a
// producer that holds a lock longer costs one such wait and the items'
// KeyBusy (Queue.Exec), not the dispatcher's whole lock wait.
const queuedLockWaitSQL = `SET LOCAL lock_timeout = '100ms'`

// resolveQueuedSQL and resolveQueuedAgainSQL are the resolves of a Resolve
// with QueueKeys, the second for one that sends an item again.
const (
	resolveQueuedSQL      = resolveHeadSQL + resolveChildrenQueuedSQL + resolveTailSQL + resolveReportChildrenSQL
	resolveQueuedAgainSQL = resolveHeadSQL + resolveChildrenQueuedSQL + resolveTailAgainSQL + resolveReportChildrenSQL
)

// resolveChildrenKeylessSQL is resolveChildrenSQL for children of which none
// carries a key or an order key (a split's rows, nearly always): no bucket
// to lock and no conflict to arbitrate. ON CONFLICT makes every row a
// speculative insertion (a lock taken and released, and one more WAL record
// to confirm the row), about 1 µs a row here (50,000 rows: 5.2–5.7 µs each
// without, 6.0–7.0 with), on the backend whose time bounds the pipeline.
const resolveChildrenKeylessSQL = resolveChildrenInsertSQL + `
	ORDER BY c.n
	RETURNING ingress_id, parent_id, stage, status, traceparent, updated_at
)`

// resolveChildrenInsertSQL is the INSERT of a move's emits, up to its
// WHERE.
const resolveChildrenInsertSQL = `, child AS (
	SELECT * FROM unnest($20::bigint[], $21::text[], $22::bytea[], $23::text[], $24::text[], $25::text[], $26::bool[])
	     WITH ORDINALITY AS c(ord, stage, payload, state, key, order_key, claim, n)
), children AS (
	INSERT INTO pepsi.queue (stage, status, payload, state, dedup_key, order_key, parent_id, traceparent)
	SELECT c.stage, CASE WHEN c.claim AND c.key = '' AND c.order_key = '' AND u.seen_trace IS NOT NULL THEN 'running' ELSE 'pending' END,
	       c.payload, coalesce(nullif(c.state, '')::jsonb, '{}'), nullif(c.key, ''), nullif(c.order_key, ''), u.ingress_id,
	       pepsi.pass_traceparent(u.seen_trace, u.ingress_id, u.seen_stage, u.seen_at)
	FROM child c JOIN updated u ON u.ord = c.ord AND u.moved`

// resolveTailSQL is resolveSQL's part after the children: what it reports
// and the history it records (without resolveAgainCheckSQL).
const resolveTailSQL = resolveResultSQL + resolvePassesSQL + resolveRecordedSQL

// resolveTailAgainSQL is resolveTailSQL for a resolve that sends some item
// again (core.Item.Again: its first send's reply was lost, so the first send
// may have recorded its pass): such an item records its pass only where
// pepsi.history has no row of it yet (resolveAgainCheckSQL). Only such a resolve
// carries the check: its subplan reads every partition of pepsi.history
// (one a day that HISTORY_KEEP keeps, and the days made ahead), and the
// executor sets up a scan of each at every run of the statement, whether
// or not an item is sent again. At eleven partitions that cost the
// smallest transactions about a tenth of their backend time
// (docs/performance.md, "A transaction's fixed cost").
const resolveTailAgainSQL = resolveResultSQL + resolvePassesSQL + resolveAgainCheckSQL + resolveRecordedSQL

// resolveResultSQL is resolveTailSQL's "result": each item's outcome.
const resolveResultSQL = `, result AS (
	SELECT item.*,
	       coalesce(u.stage, q.stage, '') AS now_stage,
	       coalesce(u.status, q.status, '') AS now_status,
	       CASE WHEN u.ingress_id IS NOT NULL THEN u.timeout ELSE q.timeout END AS now_timeout,
	       coalesce(CASE WHEN u.ingress_id IS NOT NULL THEN u.error ELSE q.error END, '') AS now_error,
	       coalesce(u.matched, false) AS now_matched,
	       u.ingress_id IS NOT NULL AS wrote,
	       CASE WHEN u.claimed THEN u.attempts ELSE 0 END AS now_attempts,
	       u.msg_state, u.payload_size, u.payload, u.msg_parent, u.trace, u.pass_of, u.claimed_at,
	       coalesce(q.key_busy, false) AS key_busy
	FROM item
	LEFT JOIN updated u ON u.ingress_id = item.id
	LEFT JOIN LATERAL (
		SELECT q.stage, q.status, q.timeout, q.state ->> 'dispatch_error' AS error,
		       q.ingress_id = ANY((SELECT array_agg(d.id) FROM decided d WHERE d.key_busy)::bigint[]) AS key_busy
		FROM pepsi.queue q WHERE q.ingress_id = item.id AND u.ingress_id IS NULL
		OFFSET 0
	) q ON true`

// resolvePassesSQL is resolveTailSQL's "passes": the items whose pass
// pepsi.history records, and its event.
const resolvePassesSQL = `
), passes AS (
	SELECT r.id, r.stage, r.handed_at, r.at, r.pid, r.attempts, r.target, r.reason, r.now_stage, r.now_status,
	       CASE
	           WHEN r.verdict <> 'answered' AND NOT (r.wrote AND r.now_matched) THEN 'guard-miss'
	           WHEN r.verdict = 'answered' AND r.wrote AND r.now_matched AND r.now_status = 'failed' THEN 'failed'
	           ELSE r.event
	       END AS event
	FROM result r
	WHERE r.hist AND (r.wrote OR r.now_status NOT IN ('', 'running'))`

// resolveAgainCheckSQL keeps out of "passes" the pass of an item sent again
// that pepsi.history has already (see resolveTailAgainSQL).
const resolveAgainCheckSQL = `
	  AND (NOT r.again OR NOT EXISTS (SELECT 1 FROM pepsi.history h
	                                  WHERE h.ingress_id = r.id AND h.at = r.at AND h.stage = r.stage))`

// resolveRecordedSQL is resolveTailSQL's "recorded": the passes' history.
const resolveRecordedSQL = `
), recorded AS (
	INSERT INTO pepsi.history (ingress_id, stage, event, detail, handed_at, at, worker_pid, attempts)
	SELECT p.id, p.stage, p.event,
	       CASE
	           WHEN p.event = 'moved' THEN p.target
	           WHEN p.event IN ('retry', 'failed', 'timeout', 'crashed') THEN p.reason
	           WHEN p.event IN ('answered', 'guard-miss') THEN p.now_status || ' at ' || p.now_stage
	           ELSE ''
	       END,
	       p.handed_at, p.at, p.pid, p.attempts
	FROM passes p
)
`

// resolveReportColumns are what resolveSQL reports of an item (resolvedRow
// reads them, then child_of).
const resolveReportColumns = `id, now_stage, now_status, now_timeout, now_error, now_matched, now_attempts, msg_state, payload_size, payload, msg_parent, trace, pass_of, claimed_at, key_busy`

// resolveReportSQL ends a resolve whose items emit nothing: an outcome per
// item, in item order (child_of is NULL: a row of an item).
const resolveReportSQL = `
SELECT ` + resolveReportColumns + `, NULL::bigint AS child_of
FROM result
ORDER BY ord`

// resolveReportChildrenSQL ends a resolve whose items emit: an outcome per
// item, in item order, then a row per child it inserted running (an emit
// that claims, core.Emit.Claim), in insertion order, read as a claim reads a
// row of an INPUT = id stage, child_of its parent's id
// (core.Outcome.Children).
const resolveReportChildrenSQL = `
SELECT ` + resolveReportColumns + `, child_of
FROM (
	SELECT ` + resolveReportColumns + `, NULL::bigint AS child_of, ord AS sort
	FROM result
	UNION ALL
	SELECT c.ingress_id, c.stage, c.status, NULL::timestamptz, '', true, 0, NULL::text, NULL::int, NULL::bytea, NULL::bigint,
		CASE WHEN $18::bool THEN c.traceparent END, CASE WHEN $18::bool THEN c.traceparent END, c.updated_at, false,
		c.parent_id, c.ingress_id
	FROM children c WHERE c.status = 'running'
) s
ORDER BY child_of IS NOT NULL, sort`

// resolveSQL is the resolve of items of which some emit (see above);
// resolveNoEmitsSQL the same without the children's INSERT, for a resolve
// whose items emit nothing (nearly all), and so without its $20 to $25. An
// INSERT fires the queue's statement triggers even when it inserts no row:
// the resolve would take ProducerKey (a claim after it in the same
// transaction would see a producer mid-transaction and report nothing
// settled) and, while the dispatcher rests, NOTIFY. A notifying COMMIT takes
// PostgreSQL's notification lock, which every notifying commit of the
// cluster shares and holds across its WAL flush: each hop of the resting
// dispatcher would queue behind producers' commits, theirs behind it, and it
// would wake itself for nothing (docs/performance.md, "A producer racing
// the rest").
//
// Each has its twin for a resolve that sends some item again
// (resolveTailAgainSQL).
const (
	resolveSQL             = resolveKeyedHeadSQL + resolveChildrenSQL + resolveTailSQL + resolveReportChildrenSQL
	resolveKeylessEmitsSQL = resolveHeadSQL + resolveChildrenKeylessSQL + resolveTailSQL + resolveReportChildrenSQL
	resolveNoEmitsSQL      = resolveHeadSQL + resolveTailSQL + resolveReportSQL

	resolveAgainSQL             = resolveKeyedHeadSQL + resolveChildrenSQL + resolveTailAgainSQL + resolveReportChildrenSQL
	resolveKeylessEmitsAgainSQL = resolveHeadSQL + resolveChildrenKeylessSQL + resolveTailAgainSQL + resolveReportChildrenSQL
	resolveNoEmitsAgainSQL      = resolveHeadSQL + resolveTailAgainSQL + resolveReportSQL
)

// nonEmpty reports whether s is not "".
func nonEmpty(s string) bool { return s != "" }

// emitArgs are the children of items' moves as resolveSQL's $20 to $26: per
// child its item's ordinal (from 1), stage, payload, state, key, order key
// and whether it claims.
func emitArgs(items []core.Item) (ords []int64, stages []string, payloads [][]byte, states, keys, orderKeys []string, claims []bool) {
	for i, it := range items {
		for _, e := range it.Emits {
			ords = append(ords, int64(i+1)) // WITH ORDINALITY counts from 1
			stages, payloads, states = append(stages, e.Stage), append(payloads, e.Payload), append(states, e.State)
			keys, orderKeys, claims = append(keys, e.Key), append(orderKeys, e.OrderKey), append(claims, e.Claim)
		}
	}
	return ords, stages, payloads, states, keys, orderKeys, claims
}

// resolveEmitsSQL is the resolve statement of items of which some emit:
// queueing for their children's order-key locks (core.Resolve.QueueKeys),
// some child carrying a key or an order key, an item sent again.
func resolveEmitsSQL(queueKeys, keyed, again bool) string {
	switch {
	case queueKeys && again:
		return resolveQueuedAgainSQL
	case queueKeys:
		return resolveQueuedSQL
	case keyed && again:
		return resolveAgainSQL
	case keyed:
		return resolveSQL
	case again:
		return resolveKeylessEmitsAgainSQL
	}
	return resolveKeylessEmitsSQL
}

func resolve(c core.Resolve) statement {
	n := len(c.Items)
	ids, stages, verdicts, reasons, epochs := make([]int64, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	targets, untils, patches := make([]string, n), make([]*time.Time, n), make([]string, n)
	claims, lineMaxes := make([]bool, n), make([]int32, n)
	hists, events, handed, ats := make([]bool, n), make([]string, n), make([]*time.Time, n), make([]*time.Time, n)
	pids, attempts, agains := make([]*int32, n), make([]int32, n), make([]bool, n)
	cOrd, cStage, cPayload, cState, cKey, cOrderKey, cClaim := emitArgs(c.Items)
	for i, it := range c.Items {
		ids[i], stages[i], verdicts[i], reasons[i], epochs[i] = it.ID, it.Stage, string(it.Verdict), it.Reason, it.Epoch
		targets[i], patches[i] = it.To, it.Patch
		claims[i], lineMaxes[i] = it.Claim, int32(min(max(it.LineMax, 0), 1<<30))
		if !it.Until.IsZero() {
			untils[i] = &c.Items[i].Until
		}
		// An item with no At (never owed through the core) records nothing:
		// its row would have no day to go to.
		hists[i] = it.History && !it.At.IsZero()
		events[i], attempts[i], agains[i] = it.Event, int32(it.Attempts), it.Again
		if !it.HandedAt.IsZero() {
			handed[i] = &c.Items[i].HandedAt
		}
		if !it.At.IsZero() {
			ats[i] = &c.Items[i].At
		}
		if it.PID != 0 {
			pid := int32(it.PID)
			pids[i] = &pid
		}
	}
	return statement{
		name: "resolve",
		queue: func(b *pgx.Batch) {
			if c.QueueKeys {
				b.Queue(queuedLockWaitSQL)
			}
			again := slices.Contains(agains, true)
			if len(cOrd) == 0 {
				sql := resolveNoEmitsSQL
				if again {
					sql = resolveNoEmitsAgainSQL
				}
				b.Queue(sql, ids, stages, verdicts, reasons, epochs, targets, untils, patches, claims, lineMaxes,
					hists, events, handed, ats, pids, attempts, agains, c.Traces, traceSeed())
				return
			}
			sql := resolveEmitsSQL(c.QueueKeys, slices.ContainsFunc(cKey, nonEmpty) || slices.ContainsFunc(cOrderKey, nonEmpty), again)
			b.Queue(sql, ids, stages, verdicts, reasons, epochs, targets, untils, patches, claims, lineMaxes,
				hists, events, handed, ats, pids, attempts, agains, c.Traces, traceSeed(), cOrd, cStage, cPayload, cState, cKey, cOrderKey, cClaim)
		},
		read: func(br pgx.BatchResults) (core.Event, error) {
			if c.QueueKeys {
				if _, err := br.Exec(); err != nil {
					return nil, fmt.Errorf("set the lock wait: %w", err)
				}
			}
			rows, err := br.Query()
			if err != nil {
				return nil, err
			}
			read, err := pgx.CollectRows(rows, resolvedRow)
			if err != nil {
				return nil, err
			}
			outcomes, err := resolvedOutcomes(read, n)
			if err != nil {
				return nil, err
			}
			return core.Resolved{Op: c.Op, Outcomes: outcomes}, nil
		},
		failed: func(err string) core.Event { return core.Resolved{Op: c.Op, Err: err} },
	}
}

// resolvedOutcomes sorts resolveSQL's rows into the outcomes of its n
// items, in item order, each with the children its move inserted running
// (the rows with a childOf, after the items').
func resolvedOutcomes(read []resolved, n int) ([]core.Outcome, error) {
	if len(read) < n {
		return nil, fmt.Errorf("%d outcomes for %d items", len(read), n)
	}
	outcomes := make([]core.Outcome, n)
	at := make(map[int64]int, n)
	for i, r := range read[:n] {
		if r.childOf != 0 {
			return nil, fmt.Errorf("%d outcomes for %d items: row %d is a child of %d", i, n, r.ID, r.childOf)
		}
		outcomes[i], at[r.ID] = r.Outcome, i
	}
	for _, r := range read[n:] {
		i, ok := at[r.childOf]
		if !ok {
			return nil, fmt.Errorf("%d rows for %d items: row %d is neither an item's outcome nor a child of an item (child of %d)", len(read), n, r.ID, r.childOf)
		}
		outcomes[i].Children = append(outcomes[i].Children, core.Child{ID: r.ID, Stage: r.Stage, Trace: r.Trace})
	}
	return outcomes, nil
}

// resolved is one row of resolveSQL's answer: an item's outcome, or, with
// childOf, a child its parent's move inserted running.
type resolved struct {
	core.Outcome
	childOf int64
}

// resolvedRow reads one row of resolveSQL's answer.
func resolvedRow(r pgx.CollectableRow) (resolved, error) {
	var o core.Outcome
	var timeout pgtype.Timestamptz
	var state, trace, passOf *string
	var size *int32
	var payload []byte
	var parent, childOf *int64
	var claimedAt *time.Time
	if err := r.Scan(&o.ID, &o.Stage, &o.Status, &timeout, &o.Error, &o.Matched, &o.Attempts, &state, &size, &payload, &parent, &trace, &passOf, &claimedAt, &o.KeyBusy, &childOf); err != nil {
		return resolved{}, err
	}
	o.Trace = readTrace(o.ID, trace, passOf, claimedAt)
	if state != nil && size != nil {
		o.Message = &core.Message{State: *state, Payload: payload, PayloadSize: int(*size)}
		if parent != nil {
			o.Message.ParentID = *parent
		}
	}
	// The timeout column keeps its last value after a wake; it means
	// something only while the row is paused.
	if o.Status == "paused" {
		o.Timeout = dueAt(timeout)
	}
	out := resolved{Outcome: o}
	if childOf != nil {
		out.childOf = *childOf
	}
	return out, nil
}

// wakeSQL makes due paused rows pending (the queue_paused partial index finds
// them), except the kept ones ($2: ids handed to workers and not yet answered),
// reports how many and the earliest timeout of the rows still paused and not
// kept, and notifies ingress when it woke any, as every tool that makes rows
// pending does. The NOTIFY is delivered at COMMIT. Rows the UPDATE wakes are
// invisible to the min() below as updated rows, but were paused with timeout <= $1
// in the statement's snapshot, which the "timeout > $1" excludes. A row that
// waited out a retry (attempts > 0) loses state.dispatch_error, the retry's
// reason, in the same write: it held while the row waited, and a message that
// later succeeds, or fails for another reason, must not show it. Each woken
// row gets a history row, woken, at $1. It wakes at most $3 (core.WakeMax)
// rows, those due first; when it found that many due it reports $1 as the
// earliest timeout, so the core wakes again in its next transaction. It sets
// ready_at: the woken rows are ready anew (as a resolve's move sets it,
// resolveHeadSQL).
const wakeSQL = `
WITH due AS (
	SELECT ingress_id FROM pepsi.queue
	WHERE status = 'paused' AND timeout <= $1 AND ingress_id <> ALL ($2::bigint[])
	ORDER BY timeout LIMIT $3
), woken AS (
	UPDATE pepsi.queue q SET status = 'pending', updated_at = now(), ready_at = now(),
		state = CASE WHEN q.attempts > 0 AND jsonb_typeof(q.state) = 'object' THEN q.state - 'dispatch_error' ELSE q.state END
	FROM due
	WHERE q.ingress_id = due.ingress_id AND q.status = 'paused' AND q.timeout <= $1
	RETURNING q.ingress_id, q.stage, q.attempts
), recorded AS (
	INSERT INTO pepsi.history (ingress_id, stage, event, at, attempts)
	SELECT ingress_id, stage, 'woken', $1, attempts FROM woken
), n AS (
	SELECT count(*) AS n FROM woken
)
SELECT n.n,
       CASE WHEN (SELECT count(*) FROM due) >= $3 THEN $1::timestamptz
       ELSE (SELECT min(timeout) FROM pepsi.queue
             WHERE status = 'paused' AND timeout > $1 AND ingress_id <> ALL ($2::bigint[])) END,
       CASE WHEN n.n > 0 THEN (SELECT true FROM pg_notify('ingress', '')) ELSE false END
FROM n`

// dueAt is when a paused row whose timeout column holds ts is due, as the
// core takes it (core.Outcome.Timeout, core.Woken.Next): zero, never, for
// NULL and for 'infinity' (a stage may pause a row for good; no time.Time
// holds it, and a scan into one would fail every step that reads the row,
// stopping the dispatcher); long ago, due at once, for '-infinity'.
func dueAt(ts pgtype.Timestamptz) time.Time {
	switch {
	case !ts.Valid || ts.InfinityModifier == pgtype.Infinity:
		return time.Time{}
	case ts.InfinityModifier == pgtype.NegativeInfinity:
		return time.Unix(0, 0).UTC()
	}
	return ts.Time
}

func wake(c core.Wake) statement {
	return statement{
		name: "wake",
		queue: func(b *pgx.Batch) {
			keep := c.Keep
			if keep == nil {
				keep = []int64{} // NULL would make "<> ALL" match nothing
			}
			b.Queue(wakeSQL, c.Now, keep, core.WakeMax)
		},
		read: func(br pgx.BatchResults) (core.Event, error) {
			var n int64
			var next pgtype.Timestamptz
			var notified bool
			if err := br.QueryRow().Scan(&n, &next, &notified); err != nil {
				return nil, err
			}
			return core.Woken{Op: c.Op, Count: int(n), Next: dueAt(next)}, nil
		},
		failed: func(err string) core.Event { return core.Woken{Op: c.Op, Err: err} },
	}
}

// flushSQL adds one flush's deltas, once: the mark of its life ($13) in
// stats_flushes takes it only if the mark is below its seq ($3), dispatch_stats
// only if the mark did, and stage_stats only if dispatch_stats did, so a flush
// sent again after its reply was lost changes nothing, whichever other lives
// flushed meanwhile. The upsert of the single dispatch_stats row recreates it
// if an operator deleted it. Deltas of the same stage are summed first, since
// ON CONFLICT cannot touch a row twice. processing_us stops at bigint's
// largest value instead of failing the flush: a stage reports the micros of
// its fused stages itself, and a flush the database refused would be sent
// again and again (core.FusedMicrosMax bounds each one).
const flushSQL = `
WITH marked AS (
	INSERT INTO pepsi.stats_flushes AS f (life, seq, updated_at)
	VALUES ($13, $3, now())
	ON CONFLICT (life) DO UPDATE SET seq = EXCLUDED.seq, updated_at = EXCLUDED.updated_at
	WHERE f.seq < EXCLUDED.seq
	RETURNING 1
), applied AS (
	INSERT INTO pepsi.dispatch_stats AS d (one, stage_passes, messages_left, flush_seq, updated_at)
	SELECT true, $1, $2, 1, now() WHERE EXISTS (SELECT 1 FROM marked)
	ON CONFLICT (one) DO UPDATE SET
		stage_passes = d.stage_passes + EXCLUDED.stage_passes,
		messages_left = d.messages_left + EXCLUDED.messages_left,
		flush_seq = d.flush_seq + 1,
		updated_at = EXCLUDED.updated_at
	RETURNING 1
)
INSERT INTO pepsi.stage_stats AS s (stage, processed, failed, timeouts, crashes, processing_us, guard_misses, retries, rate_held_us,
	emitted, emits_dropped, updated_at)
SELECT x.stage, sum(x.processed), sum(x.failed), sum(x.timeouts), sum(x.crashes), least(sum(x.processing_us), 9223372036854775807), sum(x.guard_misses),
       sum(x.retries), sum(x.rate_held_us), sum(x.emitted), sum(x.emits_dropped), now()
FROM unnest($4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[],
            $14::bigint[], $15::bigint[])
     AS x(stage, processed, failed, timeouts, crashes, processing_us, guard_misses, retries, rate_held_us, emitted, emits_dropped)
WHERE EXISTS (SELECT 1 FROM applied)
GROUP BY x.stage
ON CONFLICT (stage) DO UPDATE SET
	processed = s.processed + EXCLUDED.processed,
	failed = s.failed + EXCLUDED.failed,
	timeouts = s.timeouts + EXCLUDED.timeouts,
	crashes = s.crashes + EXCLUDED.crashes,
	processing_us = least(s.processing_us::numeric + EXCLUDED.processing_us, 9223372036854775807),
	guard_misses = s.guard_misses + EXCLUDED.guard_misses,
	retries = s.retries + EXCLUDED.retries,
	rate_held_us = s.rate_held_us + EXCLUDED.rate_held_us,
	emitted = s.emitted + EXCLUDED.emitted,
	emits_dropped = s.emits_dropped + EXCLUDED.emits_dropped,
	updated_at = EXCLUDED.updated_at`

func flush(c core.Flush) statement {
	n := len(c.Stages)
	stages := make([]string, n)
	processed, failed, timeouts, crashes, us, misses := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	retries, held, emitted, dropped := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, d := range c.Stages {
		stages[i] = d.Stage
		processed[i], failed[i], timeouts[i], crashes[i], us[i], misses[i] = d.Processed, d.Failed, d.Timeouts, d.Crashes, d.ProcessingUS, d.GuardMisses
		retries[i], held[i], emitted[i], dropped[i] = d.Retries, d.RateHeldUS, d.Emitted, d.EmitsDropped
	}
	return statement{
		name: "flush",
		queue: func(b *pgx.Batch) {
			b.Queue(flushSQL, c.StagePasses, c.MessagesLeft, c.Seq, stages, processed, failed, timeouts, crashes, us, misses, retries, held, c.Life,
				emitted, dropped)
		},
		read: func(br pgx.BatchResults) (core.Event, error) {
			if _, err := br.Exec(); err != nil {
				return nil, err
			}
			return core.Flushed{Op: c.Op}, nil
		},
		failed: func(err string) core.Event { return core.Flushed{Op: c.Op, Err: err} },
	}
}

// inspectSQL reads pepsi.queue's health for core.Inspect (statistics, and the
// table's size, for which pg_relation_size takes the lock any read of it
// takes): its dead and live row versions (the statistics collector's
// estimate), whether a vacuum of it runs now, whether autovacuum covers it (on
// for the server and not turned off for the table), and the oldest transaction
// or prepared transaction holding back the xmin horizon, with its age in
// seconds; its size in pages now, and in pages and rows when its statistics
// were last taken (pg_class.relpages and reltuples, which a vacuum or an
// analyze sets; reltuples is -1 before either); and whether the
// session's role may not vacuum or analyze it, which PostgreSQL would skip
// with a mere warning (a superuser has every role's privileges; the
// database's owner may too; PostgreSQL 17 adds MAINTAIN, a privilege name
// earlier servers reject, hence the CASE). Another role's
// sessions may hide their details without pg_read_all_stats; what is hidden
// counts as absent.
const inspectSQL = `
SELECT coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
       EXISTS (SELECT 1 FROM pg_stat_progress_vacuum v WHERE v.relid = c.oid),
       current_setting('autovacuum') = 'on'
           AND coalesce((SELECT lower(o.option_value) FROM pg_options_to_table(c.reloptions) o
                         WHERE o.option_name = 'autovacuum_enabled'), 'on') NOT IN ('off', 'false', 'no', '0'),
       greatest(coalesce(extract(epoch FROM clock_timestamp() - h.since), 0), 0)::float8,
       coalesce(h.who, ''),
       pg_relation_size(c.oid) / current_setting('block_size')::int8, c.relpages::int8, greatest(c.reltuples, 0)::int8,
       NOT (pg_has_role(c.relowner, 'USAGE')
            OR pg_has_role((SELECT d.datdba FROM pg_database d WHERE d.datname = current_database()), 'USAGE')
            OR CASE WHEN current_setting('server_version_num')::int >= 170000 THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END)
FROM pg_class c
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
LEFT JOIN LATERAL (
	SELECT x.since, x.who FROM (
		SELECT a.xact_start AS since,
		       format('pid %s (%s, %s)', a.pid, coalesce(nullif(a.application_name, ''), 'no application name'), a.state) AS who
		FROM pg_stat_activity a
		WHERE a.backend_xmin IS NOT NULL AND a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid()
		UNION ALL
		SELECT p.prepared, format('prepared transaction %L', p.gid) FROM pg_prepared_xacts p
	) x ORDER BY x.since LIMIT 1
) h ON true
WHERE c.oid = 'pepsi.queue'::regclass`

// analyzeSQL takes the queue's statistics for a core.Vacuum of kind
// core.AnalyzeOnly, and vacuumAnalyzeSQL vacuums it and takes them for
// core.VacuumAnalyze; SKIP_LOCKED as vacuumSQL.
const (
	analyzeSQL       = `ANALYZE (SKIP_LOCKED) pepsi.queue`
	vacuumAnalyzeSQL = `VACUUM (ANALYZE, SKIP_LOCKED) pepsi.queue`
)

// vacuumSQL vacuums the queue for core.Vacuum. SKIP_LOCKED: if another vacuum
// (autovacuum's, a DBA's) holds the table, this one does nothing rather than
// wait behind it.
const vacuumSQL = `VACUUM (SKIP_LOCKED) pepsi.queue`

// unrunSQL counts, for core.Inspect, the pending messages of stages the
// dispatcher does not run ($1: the stages it runs). It walks the queue_pending
// index from one distinct stage to the next (a loose index scan: a few index
// probes per stage, whatever the backlog) and counts at most unrunCountMax rows
// of each.
const unrunSQL = `
WITH RECURSIVE s(stage) AS (
	(SELECT q.stage FROM pepsi.queue q WHERE q.status = 'pending' ORDER BY q.stage LIMIT 1)
	UNION ALL
	SELECT (SELECT q.stage FROM pepsi.queue q WHERE q.status = 'pending' AND q.stage > s.stage ORDER BY q.stage LIMIT 1)
	FROM s WHERE s.stage IS NOT NULL
)
SELECT s.stage, (SELECT count(*) FROM (SELECT 1 FROM pepsi.queue q
                 WHERE q.status = 'pending' AND q.stage = s.stage LIMIT $2) x)
FROM s WHERE s.stage IS NOT NULL AND s.stage <> ALL ($1::text[])
ORDER BY s.stage`

// unrunCountMax bounds how many pending messages of one stage nobody runs are
// counted.
const unrunCountMax = 100000

// keepHistorySQL is the history's upkeep (core.KeepHistory; schema 16's
// pepsi.history_keep).
const keepHistorySQL = `SELECT pepsi.history_keep($1, $2, $3, $4)`

func keepHistory(c core.KeepHistory) statement {
	return statement{
		name:  "keep history",
		queue: func(b *pgx.Batch) { b.Queue(keepHistorySQL, c.From, c.Now, c.Through, c.DropBefore) },
		read: func(br pgx.BatchResults) (core.Event, error) {
			ev := core.HistoryKept{Op: c.Op}
			if err := br.QueryRow().Scan(&ev.Through); err != nil {
				return nil, err
			}
			return ev, nil
		},
		failed: func(err string) core.Event { return core.HistoryKept{Op: c.Op, Err: err} },
	}
}
