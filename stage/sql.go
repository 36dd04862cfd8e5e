package stage

// The transaction control of the stage library. Its statements on the queue
// (the reads of a pass, the row lock of a handler's transaction, the
// transition the library writes itself) are package store's.

// commitSQL commits a handler's transaction in the batch that writes its
// transition (see commitTx).
const commitSQL = "COMMIT"

// rollbackSQL ends a transaction the library opened without pgx's Tx (see
// lazyTx.end).
const rollbackSQL = "ROLLBACK"

// rollbackAndChainSQL releases the row a handler's transaction locked but
// opens a new transaction at once (see lazyTx.ensure).
const rollbackAndChainSQL = "ROLLBACK AND CHAIN"
