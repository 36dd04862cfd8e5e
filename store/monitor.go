package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
)

// The statements of pepsi-httpd (the monitor). They only read; the
// statistics tables are read with ReadStageStats and ReadDispatchStats.

// ReasonMax bounds the characters of a failure reason the monitor reads.
const ReasonMax = 300

// FailuresMax is how many recent failures the monitor reads.
const FailuresMax = 20

// The statements pepsi-httpd reads with, each bounded by a partial index of
// pepsi.queue or by a small table (the EXPLAIN test checks that none of
// them scans the queue sequentially, through MonitorQueries).
const (
	// The pending index (stage, ingress_id) finds the rows; their age is the
	// longest wait among them since each was last ready (ready_at, schema
	// version 13; updated_at for older rows), as pepsi-queue stats counts it:
	// a claim given back does not make a row young again, and a row made
	// pending with a lower id than older ones (a retry, a reset, a message
	// handed its order key) does not hide how long the others have waited.
	monitorPendingSQL = `SELECT stage, count(*), coalesce(extract(epoch FROM now() - min(coalesce(ready_at, updated_at))), 0)::float8
FROM pepsi.queue WHERE status = 'pending' GROUP BY stage`
	// Running rows are at most the stages' capacity (PARALLELISM × QUEUE_LIMIT).
	monitorRunningSQL = `SELECT stage, count(*) FROM pepsi.queue WHERE status = 'running' GROUP BY stage`
	// Paused rows are few (the queue_paused index holds only them); attempts
	// is read from their heap rows.
	monitorPausedSQL = `SELECT stage, count(*), count(*) FILTER (WHERE timeout <= now()), count(*) FILTER (WHERE attempts > 0)
FROM pepsi.queue WHERE status = 'paused' GROUP BY stage`
	// The queue_order_blocked index (schema version 12) holds only these rows.
	monitorBlockedSQL = `SELECT stage, count(*) FROM pepsi.queue WHERE status = 'blocked' GROUP BY stage`
	// The queue_failed index (schema version 2) holds only these rows.
	monitorFailedSQL = `SELECT stage, status, count(*) FROM pepsi.queue
WHERE status IN ('failed', 'timeout') GROUP BY stage, status`
	// The statistics collector's view of the table, and the oldest
	// transaction that holds back what vacuum may remove.
	monitorTableSQL = `SELECT coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0),
	coalesce(greatest(s.last_vacuum, s.last_autovacuum), 'epoch'::timestamptz),
	coalesce((SELECT extract(epoch FROM clock_timestamp() - min(a.xact_start)) FROM pg_stat_activity a
	          WHERE a.backend_xmin IS NOT NULL AND a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid()), 0)::float8
	FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = 'pepsi.queue'::regclass`
)

// monitorFailuresSQL reads the latest failures. left() counts characters: a
// reason is never cut inside one.
var monitorFailuresSQL = `SELECT ingress_id, stage, status, updated_at,
	CASE WHEN state ? 'dispatch_error' THEN 'dispatcher' WHEN state ? 'error' THEN 'stage' ELSE '' END,
	left(coalesce(state->>'dispatch_error', state->>'error', ''), ` + fmt.Sprint(ReasonMax) + `)
FROM pepsi.queue WHERE status IN ('failed', 'timeout') ORDER BY updated_at DESC LIMIT ` + fmt.Sprint(FailuresMax)

// monitorLockSQL reads the server's clock and whether a session holds the
// dispatcher's lock. pg_locks shows the lock to every role. classid and objid
// are the two halves of LockKey.
var monitorLockSQL = fmt.Sprintf(`SELECT now(), EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
	AND classid = %d AND objid = %d AND objsubid = 1 AND granted
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`,
	LockKey>>32, LockKey&0xffffffff)

// MonitorQueries are the statements of the Monitor methods, by name, for the
// EXPLAIN test.
var MonitorQueries = map[string]string{
	"pending": monitorPendingSQL,
	"running": monitorRunningSQL,
	"paused":  monitorPausedSQL,
	"blocked": monitorBlockedSQL,
	"failed":  monitorFailedSQL,
	// pepsi-httpd counts the keys waiting with CountKeysWaiting.
	"keys_waiting": keysWaitingSQL,
	"failures":     monitorFailuresSQL,
	"table":        monitorTableSQL,
	"lock":         monitorLockSQL,
	"health":       healthSQL,
}

// StageDepth is what the monitor reads of one stage's rows in one status.
type StageDepth struct {
	Stage  string
	Status core.RowStatus
	Count  int64
	// OldestWait, for pending rows only, is how long the stage's
	// longest-waiting pending row has waited since it was last ready (a
	// claim given back does not count), as CountRows reads it.
	OldestWait time.Duration
	// Due and RetryWaiting, for paused rows only, count those whose timeout
	// has passed and those waiting out a retry (attempts > 0).
	Due, RetryWaiting int64
}

// MonitorPending reads each stage's pending rows and the wait of its head.
func (s *PG) MonitorPending(ctx context.Context) ([]StageDepth, error) {
	return collect(ctx, s.db, "read pending", func(r pgx.CollectableRow) (StageDepth, error) {
		d := StageDepth{Status: core.StatusPending}
		var age float64
		err := r.Scan(&d.Stage, &d.Count, &age)
		d.OldestWait = time.Duration(max(age, 0) * float64(time.Second))
		return d, err
	}, monitorPendingSQL)
}

// MonitorRunning reads each stage's running rows.
func (s *PG) MonitorRunning(ctx context.Context) ([]StageDepth, error) {
	return collect(ctx, s.db, "read running", func(r pgx.CollectableRow) (StageDepth, error) {
		d := StageDepth{Status: core.StatusRunning}
		return d, r.Scan(&d.Stage, &d.Count)
	}, monitorRunningSQL)
}

// MonitorPaused reads each stage's paused rows, those due and those waiting
// out a retry.
func (s *PG) MonitorPaused(ctx context.Context) ([]StageDepth, error) {
	return collect(ctx, s.db, "read paused", func(r pgx.CollectableRow) (StageDepth, error) {
		d := StageDepth{Status: core.StatusPaused}
		return d, r.Scan(&d.Stage, &d.Count, &d.Due, &d.RetryWaiting)
	}, monitorPausedSQL)
}

// MonitorBlocked reads each stage's blocked rows: messages waiting behind
// an older message of their order key.
func (s *PG) MonitorBlocked(ctx context.Context) ([]StageDepth, error) {
	return collect(ctx, s.db, "read blocked", func(r pgx.CollectableRow) (StageDepth, error) {
		d := StageDepth{Status: core.StatusBlocked}
		return d, r.Scan(&d.Stage, &d.Count)
	}, monitorBlockedSQL)
}

// MonitorFailed reads each stage's failed and timed-out rows.
func (s *PG) MonitorFailed(ctx context.Context) ([]StageDepth, error) {
	return collect(ctx, s.db, "read failed", func(r pgx.CollectableRow) (StageDepth, error) {
		var d StageDepth
		return d, r.Scan(&d.Stage, &d.Status, &d.Count)
	}, monitorFailedSQL)
}

// Failure is one message that left the pipeline failed or timed out, as the
// monitor reads it: never its payload.
type Failure struct {
	ID        int64
	Stage     string
	Status    core.RowStatus
	UpdatedAt time.Time
	// By is "dispatcher" (state.dispatch_error), "stage" (state.error) or "".
	By string
	// Reason is the reason given, cut to ReasonMax characters.
	Reason string
}

// MonitorFailures reads the latest FailuresMax failed or timed-out rows,
// newest first.
func (s *PG) MonitorFailures(ctx context.Context) ([]Failure, error) {
	return collect(ctx, s.db, "read failures", func(r pgx.CollectableRow) (Failure, error) {
		var f Failure
		return f, r.Scan(&f.ID, &f.Stage, &f.Status, &f.UpdatedAt, &f.By, &f.Reason)
	}, monitorFailuresSQL)
}

// TableHealth is pepsi.queue's health as the statistics collector sees it.
type TableHealth struct {
	// DeadTuples and LiveTuples are the collector's estimates of the table's
	// dead and live row versions.
	DeadTuples, LiveTuples int64
	// LastVacuum is the end of the last vacuum of the table, by anyone; zero
	// if none since the statistics were reset.
	LastVacuum time.Time
	// Horizon is how long the oldest transaction holding back the xmin
	// horizon has been open (0 if none is visible to this role).
	Horizon time.Duration
}

// MonitorTable reads pepsi.queue's health.
func (s *PG) MonitorTable(ctx context.Context) (TableHealth, error) {
	var t TableHealth
	var horizon float64
	if err := s.db.QueryRow(ctx, monitorTableSQL).Scan(&t.DeadTuples, &t.LiveTuples, &t.LastVacuum, &horizon); err != nil {
		return TableHealth{}, fmt.Errorf("read table health: %w", err)
	}
	if t.LastVacuum.Unix() == 0 {
		t.LastVacuum = time.Time{}
	}
	t.Horizon = time.Duration(horizon * float64(time.Second))
	return t, nil
}

// MonitorLock reads the server's clock and whether a session holds the
// dispatcher's lock.
func (s *PG) MonitorLock(ctx context.Context) (at time.Time, locked bool, err error) {
	if err := s.db.QueryRow(ctx, monitorLockSQL).Scan(&at, &locked); err != nil {
		return time.Time{}, false, fmt.Errorf("read the dispatcher lock: %w", err)
	}
	return at, locked, nil
}

// MonitorGrantsSQL is all pepsi-httpd needs, given to a role named pepsi_monitor:
// every column of the queue but payload, the statistics and health tables,
// the history, and a payload's size (pepsi.payload_size, not the payload). The
// database then guarantees that pepsi-httpd shows no payload and writes nothing.
const MonitorGrantsSQL = `GRANT USAGE ON SCHEMA pepsi TO pepsi_monitor;
GRANT SELECT (ingress_id, stage, status, timeout, state, attempts, created_at, updated_at, ready_at, order_key, parent_id) ON pepsi.queue TO pepsi_monitor;
GRANT SELECT ON pepsi.stage_stats, pepsi.dispatch_stats, pepsi.stage_health, pepsi.history TO pepsi_monitor;
GRANT EXECUTE ON FUNCTION pepsi.payload_size(bigint) TO pepsi_monitor;`

// FailedIndexExists says whether the queue_failed index of schema version 2
// exists: without it, counting failed messages would scan the queue.
func (s *PG) FailedIndexExists(ctx context.Context) (bool, error) {
	return s.relationExists(ctx, "pepsi.queue_failed")
}

// relationExistsSQL says whether the table or index $1 exists; to_regclass
// needs no privilege.
const relationExistsSQL = `SELECT to_regclass($1) IS NOT NULL`

// relationExists says whether the table or index name exists, for a program
// that must not read what a schema older than it lacks.
func (s *PG) relationExists(ctx context.Context, name string) (bool, error) {
	var ok bool
	if err := s.db.QueryRow(ctx, relationExistsSQL, name).Scan(&ok); err != nil {
		return false, fmt.Errorf("look for %s: %w", name, err)
	}
	return ok, nil
}
