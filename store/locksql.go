package store

// The SQL of the connections of their own: the dispatcher lock's (lock.go), the
// gate's (gate.go) and the listener's (listen.go), and of ending other sessions
// (lock.go). The queue commands' SQL is in statements.go. The advisory lock
// statements take their key (LockKey, GateKey) as $1.

// tryAdvisoryLockSQL takes the session lock $1 if it is free, answering whether
// it did.
const tryAdvisoryLockSQL = `SELECT pg_try_advisory_lock($1)`

// advisoryLockSQL waits for the session lock $1 (the standby's wait for the
// dispatcher lock, the gate's Rest).
const advisoryLockSQL = `SELECT pg_advisory_lock($1)`

// advisoryUnlockSQL gives up the session lock $1.
const advisoryUnlockSQL = `SELECT pg_advisory_unlock($1)`

// holderSQL names the session holding the advisory lock $1 in this database.
const holderSQL = `
SELECT a.pid, coalesce(a.application_name, ''),
       coalesce(host(a.client_addr), CASE WHEN a.client_port = -1 THEN 'local' ELSE '' END),
       a.backend_start
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid AND l.objsubid = 1
LIMIT 1`

// holdingSQL answers whether this session holds the advisory lock $1 (the
// lock's health check).
const holdingSQL = `
SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid()
  AND locktype = 'advisory' AND granted
  AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1)`

// listenSQL makes the listener's session hear the ingress channel.
const listenSQL = `LISTEN ` + IngressChannel

// endSessionsSQL ends the sessions $1 (process ids) whose application_name
// is still $3 and, where $2 names it (not NULL), whose backend_start is still
// $2: a process id the server has given to another session since, of any
// client, is left alone. It answers how many it signalled.
const endSessionsSQL = `
SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a
JOIN unnest($1::int[], $2::timestamptz[]) AS s(pid, start) ON a.pid = s.pid
WHERE a.application_name = $3 AND (s.start IS NULL OR a.backend_start = s.start)`

// endEarlierDispatchersSQL ends every session of this database whose
// application_name says it is another pepsi-dispatch process's than $1 (not $1
// itself, nor $1's other sessions such as "$1 gate"), answering their pids.
const endEarlierDispatchersSQL = `
SELECT pid, backend_start, pg_terminate_backend(pid)
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND application_name LIKE 'pepsi-dispatch %' AND application_name <> $1 AND application_name NOT LIKE $1 || ' %'`

// anyAliveSQL answers whether any of the sessions $1 (process ids), matched
// as endSessionsSQL matches them ($2 their backend_start or NULL; $3 their
// application_name, or NULL for any), is still there.
const anyAliveSQL = `SELECT EXISTS (SELECT 1 FROM pg_stat_activity a
JOIN unnest($1::int[], $2::timestamptz[]) AS s(pid, start) ON a.pid = s.pid
WHERE ($3::text IS NULL OR a.application_name = $3) AND (s.start IS NULL OR a.backend_start = s.start))`
