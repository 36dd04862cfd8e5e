package stage

// The SQL of the stage library, every statement in this one file: the reads
// of a pass, the row lock of a handler's transaction, the transition the
// library writes itself, and the transaction control around them.

// lockSQL locks the row a handler is about to write beside, and reads what tells
// whether it is still the version the handler was given.
const lockSQL = `SELECT stage, status, xmin FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`

// readSQL reads the rows of a batch of ids in one statement, without a lock: a
// row running at this stage is moved only by this worker (or by the dispatcher
// when it answers), and every write is guarded.
const readSQL = `SELECT ingress_id, stage, status, state, payload, attempts, xmin FROM pepsi.queue WHERE ingress_id = ANY($1)`

// readOneSQL reads the row of one id, for a pass that runs again.
const readOneSQL = `SELECT ingress_id, stage, status, state, payload, attempts, xmin FROM pepsi.queue WHERE ingress_id = $1`

// transitionSQL is every transition the library writes itself. The guard makes
// sure the row is still running at the stage that handled it and, when $7 is not
// null, that it is still the version the handler was given. When it moved no
// row it fails, with division_by_zero, which nothing else in it can raise: in a
// handler's transaction that stops the COMMIT queued behind it in the same batch
// (see commitTx).
const transitionSQL = `WITH moved AS (
	UPDATE pepsi.queue
	SET stage = $2, status = $3, timeout = $4, state = $5, updated_at = now()
	WHERE ingress_id = $1 AND status = 'running' AND stage = $6 AND ($7::xid IS NULL OR xmin = $7::xid)
	RETURNING 1
)
SELECT 1 / count(*) FROM moved`

// transitionNoRow is the SQLSTATE (division_by_zero) of a transition that moved
// no row.
const transitionNoRow = "22012"

// commitSQL commits a handler's transaction in the batch that writes its
// transition (see commitTx).
const commitSQL = "COMMIT"

// rollbackSQL ends a transaction the library opened without pgx's Tx (see
// lazyTx.end).
const rollbackSQL = "ROLLBACK"

// rollbackAndChainSQL releases the row a handler's transaction locked but
// opens a new transaction at once (see lazyTx.ensure).
const rollbackAndChainSQL = "ROLLBACK AND CHAIN"
