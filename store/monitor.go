package store

import (
	"context"
	"fmt"
)

// The statements of pepsi-httpd (the monitor). They only read.

// ReasonMax bounds the bytes of a failure reason the monitor reads.
const ReasonMax = 300

// FailuresMax is how many recent failures the monitor reads.
const FailuresMax = 20

// MonitorQueries are the statements a read runs, by name, each bounded by a partial
// index of pepsi.queue or by a small table. The EXPLAIN test checks that none
// of them scans the queue sequentially.
var MonitorQueries = map[string]string{
	// The pending index (stage, ingress_id) answers the count; the head of each
	// stage's queue is one more index probe.
	"pending": `SELECT p.stage, p.n, coalesce(extract(epoch FROM now() - h.updated_at), 0)::float8
FROM (SELECT stage, count(*) AS n FROM pepsi.queue WHERE status = 'pending' GROUP BY stage) p
CROSS JOIN LATERAL (SELECT q.updated_at FROM pepsi.queue q
	WHERE q.status = 'pending' AND q.stage = p.stage ORDER BY q.ingress_id LIMIT 1) h`,
	// Running rows are at most the stages' capacity (PARALLELISM × QUEUE_LIMIT).
	"running": `SELECT stage, count(*) FROM pepsi.queue WHERE status = 'running' GROUP BY stage`,
	// Paused rows are few (the queue_paused index holds only them); attempts
	// is read from their heap rows.
	"paused": `SELECT stage, count(*), count(*) FILTER (WHERE timeout <= now()), count(*) FILTER (WHERE attempts > 0)
FROM pepsi.queue WHERE status = 'paused' GROUP BY stage`,
	// The queue_failed index (schema version 2) holds only these rows.
	"failed": `SELECT stage, status, count(*) FROM pepsi.queue
WHERE status IN ('failed', 'timeout') GROUP BY stage, status`,
	"failures": `SELECT ingress_id, stage, status, updated_at,
	CASE WHEN state ? 'dispatch_error' THEN 'dispatcher' WHEN state ? 'error' THEN 'stage' ELSE '' END,
	left(coalesce(state->>'dispatch_error', state->>'error', ''), ` + fmt.Sprint(ReasonMax) + `)
FROM pepsi.queue WHERE status IN ('failed', 'timeout') ORDER BY updated_at DESC LIMIT ` + fmt.Sprint(FailuresMax),
	"stage_stats": `SELECT stage, processed, failed, timeouts, crashes, processing_us, retries, rate_held_us, updated_at
FROM pepsi.stage_stats ORDER BY stage`,
	"dispatch_stats": `SELECT stage_passes, messages_left, updated_at FROM pepsi.dispatch_stats`,
	"table": `SELECT coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
	coalesce(greatest(s.last_vacuum, s.last_autovacuum), 'epoch'::timestamptz),
	coalesce((SELECT extract(epoch FROM clock_timestamp() - min(a.xact_start)) FROM pg_stat_activity a
	          WHERE a.backend_xmin IS NOT NULL AND a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid()), 0)::float8
	FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = 'pepsi.queue'::regclass`,
	// pg_locks shows the lock to every role. classid and objid are the two
	// halves of LockKey.
	"lock": fmt.Sprintf(`SELECT now(), EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
	AND classid = %d AND objid = %d AND objsubid = 1 AND granted
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`,
		LockKey>>32, LockKey&0xffffffff),
}

// MonitorGrantsSQL is all pepsi-httpd needs, given to a role named pepsi_monitor:
// every column of the queue but payload, and the two statistics tables. The
// database then guarantees that pepsi-httpd shows no payload and writes nothing.
const MonitorGrantsSQL = `GRANT USAGE ON SCHEMA pepsi TO pepsi_monitor;
GRANT SELECT (ingress_id, stage, status, timeout, state, attempts, created_at, updated_at) ON pepsi.queue TO pepsi_monitor;
GRANT SELECT ON pepsi.stage_stats, pepsi.dispatch_stats TO pepsi_monitor;`

// failedIndexSQL says whether the queue_failed index of schema version 2
// exists; to_regclass needs no privilege.
const failedIndexSQL = `SELECT to_regclass('pepsi.queue_failed') IS NOT NULL`

// FailedIndexExists says whether the queue_failed index of schema version 2
// exists: without it, counting failed messages would scan the queue.
func (s *PG) FailedIndexExists(ctx context.Context) (bool, error) {
	var indexed bool
	if err := s.db.QueryRow(ctx, failedIndexSQL).Scan(&indexed); err != nil {
		return false, fmt.Errorf("look for index pepsi.queue_failed: %w", err)
	}
	return indexed, nil
}
