package store

// The statements of the stage library (package stage), exported as text: the
// library queues the row lock behind its BEGIN and the transition before its
// COMMIT in batches of its own (one round trip each), beside transaction
// control that is not a statement on the schema.

// StageLockSQL locks the row a handler is about to write beside, and reads what tells
// whether it is still the version the handler was given.
const StageLockSQL = `SELECT stage, status, xmin FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`

// StageReadSQL reads the rows of a batch of ids in one statement, without a lock: a
// row running at this stage is moved only by this worker (or by the dispatcher
// when it answers), and every write is guarded.
const StageReadSQL = `SELECT ingress_id, stage, status, state, payload, attempts, xmin FROM pepsi.queue WHERE ingress_id = ANY($1)`

// StageReadOneSQL reads the row of one id, for a pass that runs again.
const StageReadOneSQL = `SELECT ingress_id, stage, status, state, payload, attempts, xmin FROM pepsi.queue WHERE ingress_id = $1`

// StageTransitionSQL is every transition the library writes itself. The guard makes
// sure the row is still running at the stage that handled it and, when $7 is not
// null, that it is still the version the handler was given. When it moved no
// row it fails, with division_by_zero, which nothing else in it can raise: in a
// handler's transaction that stops the COMMIT queued behind it in the same batch
// (see the stage library's commitTx).
const StageTransitionSQL = `WITH moved AS (
	UPDATE pepsi.queue
	SET stage = $2, status = $3, timeout = $4, state = $5, updated_at = now()
	WHERE ingress_id = $1 AND status = 'running' AND stage = $6 AND ($7::xid IS NULL OR xmin = $7::xid)
	RETURNING 1
)
SELECT 1 / count(*) FROM moved`

// StageTransitionNoRow is the SQLSTATE (division_by_zero) of a transition that moved
// no row.
const StageTransitionNoRow = "22012"
