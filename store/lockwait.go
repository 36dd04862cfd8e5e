package store

import (
	"context"
	"fmt"
	"time"
)

// LockWaitUnder is the lock wait (BoundLockWaits) of the sessions whose
// transactions may take timeout: five sixths of it (50 s of the
// dispatcher's default 60 s), so that the server ends a wait with its error
// (55P03) while the transaction still has time to read it, rather than the
// timeout ending the transaction in doubt. pepsi-dispatch and pepsi-ingress
// both bound their sessions so.
func LockWaitUnder(timeout time.Duration) time.Duration {
	return timeout * 5 / 6
}

// lockWaitWarnAfter is how long a queue transaction runs before the queue
// looks whether its session waits for a lock another session holds.
const lockWaitWarnAfter = 5 * time.Second

// blockersSQL names the sessions that hold a lock session $1 waits for:
// process id, application_name, client, user, state, how long their
// transaction has been open and the start of their latest query. A role
// without pg_read_all_stats sees only the first two and the user of
// another role's session: the others are then empty (the query is
// PostgreSQL's "<insufficient privilege>").
const blockersSQL = `
SELECT b.pid, coalesce(b.application_name, ''),
	CASE WHEN b.client_port = -1 THEN 'local socket' ELSE coalesce(host(b.client_addr), '') END,
	coalesce(b.usename::text, ''), coalesce(b.state, ''),
	coalesce(date_trunc('second', now() - b.xact_start)::text, ''), left(coalesce(b.query, ''), 200)
FROM unnest(pg_blocking_pids($1)) AS p(pid)
JOIN pg_stat_activity b ON b.pid = p.pid
ORDER BY b.xact_start NULLS LAST`

// blocker is one session blockersSQL names.
type blocker struct {
	pid                            int32
	app, client, user, st, xactAge string
	query                          string
}

// watchLockWait warns, once, if sess is still running the step's
// transaction after q.lockWaitAfter and waits for a lock another session
// holds (a row an operator's or a tool's open transaction locked). The
// dispatcher's transactions are serial, so the whole pipeline waits with
// it, and nothing else says why: the wait only ends when the session's
// lock_timeout does (BoundLockWaits: 50 s of the default transaction
// timeout), with an error that names no one. The returned stop ends the
// watch.
func (q *Queue) watchLockWait(sess Backend) (stop func()) {
	if sess.PID == 0 {
		return func() {}
	}
	t := time.AfterFunc(q.lockWaitAfter, func() { q.warnBlocked(sess, q.lockWaitAfter) })
	return func() { t.Stop() }
}

// warnBlocked logs the sessions that hold the locks sess waits for, if any.
// A failure to look is only logged at debug: the look is a courtesy.
func (q *Queue) warnBlocked(sess Backend, waited time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	bs, err := q.blockers(ctx, sess.PID)
	if err != nil {
		q.log.Debug("queue transaction runs long: cannot look for the sessions it waits for", "pid", sess.PID, "err", err)
		return
	}
	if len(bs) == 0 {
		return
	}
	b := bs[0]
	q.log.Warn("queue transaction waits for a lock another session holds; the pipeline waits until that session ends its transaction (or until its lock wait runs out, 50 s by default, and pepsi-dispatch tries again)",
		"waited", waited, "pid", sess.PID, "holders", len(bs), "holder_pid", b.pid,
		"holder_application_name", b.app, "holder_client", b.client, "holder_user", b.user,
		"holder_state", b.st, "holder_xact_age", b.xactAge,
		"holder_query", b.query)
}

// blockers answers blockersSQL for pid on a connection of the pool.
func (q *Queue) blockers(ctx context.Context, pid int32) ([]blocker, error) {
	rows, err := q.pool.Query(ctx, blockersSQL, pid)
	if err != nil {
		return nil, fmt.Errorf("look up the sessions %d waits for: %w", pid, err)
	}
	defer rows.Close()
	var bs []blocker
	for rows.Next() {
		var b blocker
		if err := rows.Scan(&b.pid, &b.app, &b.client, &b.user, &b.st, &b.xactAge, &b.query); err != nil {
			return nil, fmt.Errorf("look up the sessions %d waits for: %w", pid, err)
		}
		bs = append(bs, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up the sessions %d waits for: %w", pid, err)
	}
	return bs, nil
}
