package queueadmin

// The SQL of pepsi-queue, every statement in this one file (the dispatcher's
// is shell/pgqueue's).

// enqueueSQL inserts one batch of messages at stage $1 (payloads $2, states $3,
// empty for none) in their order and returns how many and their first and last id.
const enqueueSQL = `WITH ins AS (
	INSERT INTO pepsi.queue (stage, payload, state)
	SELECT $1, u.p, coalesce(nullif(u.s, '')::jsonb, '{}')
	FROM unnest($2::bytea[], $3::text[]) WITH ORDINALITY AS u(p, s, n)
	ORDER BY u.n
	RETURNING ingress_id)
SELECT count(*), coalesce(min(ingress_id), 0), coalesce(max(ingress_id), 0) FROM ins`

// countSQL counts the rows per stage and status, with the oldest update of each
// (in microseconds ago): for pending rows, the oldest wait.
const countSQL = `SELECT stage, status, count(*),
	coalesce(extract(epoch FROM now() - min(updated_at)) * 1e6, 0)::bigint
FROM pepsi.queue GROUP BY stage, status`

// stageStatsSQL reads pepsi.stage_stats, the dispatcher's counts per stage.
const stageStatsSQL = `SELECT stage, processed, failed, timeouts, crashes, processing_us, updated_at
FROM pepsi.stage_stats ORDER BY stage`

// dispatchStatsSQL reads pepsi.dispatch_stats, the dispatcher's own row.
const dispatchStatsSQL = `SELECT stage_passes, messages_left, updated_at, flush_seq FROM pepsi.dispatch_stats`

// showSQL reads one message, by ingress_id. A timeout no time.Time holds
// ('infinity', '-infinity': a stage may pause a row for good) comes as text.
const showSQL = `SELECT stage, status, CASE WHEN isfinite(timeout) THEN timeout END,
	CASE WHEN NOT isfinite(timeout) THEN timeout::text ELSE '' END, state, payload, created_at, updated_at
FROM pepsi.queue WHERE ingress_id = $1`

// retrySQL makes pending again the rows whose status is one of $3, with
// ingress_id $1 (0: any) at stage $2 (empty: any), moving them to stage $4 (empty:
// where they are) and keeping their dispatch_error in dispatch_error_history.
// In SET, stage, status and state are the row's values before the update.
const retrySQL = `WITH moved AS (
	UPDATE pepsi.queue SET
		status = 'pending',
		stage = coalesce(nullif($4, ''), stage),
		timeout = NULL,
		attempts = 0,
		updated_at = now(),
		state = (state - 'dispatch_error') || jsonb_build_object('dispatch_error_history',
			CASE WHEN jsonb_typeof(state->'dispatch_error_history') = 'array'
				THEN state->'dispatch_error_history' ELSE '[]'::jsonb END
			|| jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
				'error', state->'dispatch_error', 'status', status, 'stage', stage, 'retried_at', now()))))
	WHERE status = ANY($3) AND ($1::bigint = 0 OR ingress_id = $1) AND ($2 = '' OR stage = $2)
	RETURNING 1)
SELECT count(*) FROM moved`

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
