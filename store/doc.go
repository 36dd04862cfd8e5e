// Package store is the one room that speaks to the pepsi schema: every
// statement on pepsi.queue and its tables, and the schema itself (the embedded,
// versioned migrations and their runner), live here, so a new column or
// statement changes this package and its conformance suite, not five others.
// The names those statements need (IngressChannel, LockKey, GateKey,
// ProducerKey, the monitor's FailuresMax and ReasonMax) live here too, so every
// import arrow points down to it.
//
// The migrations live here rather than in a package of their own because they
// are the other half of the same contract: the statements rely on the columns,
// indexes and triggers they create, and a change to one is reviewed beside the
// other.
//
// For pepsi-dispatch it is also the PostgreSQL side of the daemon: the queue
// executor that turns the core's queue commands into SQL, the LISTEN connection
// that reports new work, the advisory lock that keeps one dispatcher per
// system, and the gate that tells producers whether the dispatcher waits.
// statements.go holds the queue commands' statements (and Inspect's and
// Vacuum's); locksql.go holds the SQL of the connections of their own (the
// lock's, the gate's, the listener's) and of ending other sessions. The one
// exception is the frame of a step's transaction (BEGIN, SET LOCAL
// synchronous_commit, its id, COMMIT, ROLLBACK, and the look-up of a
// transaction in doubt), written where it is sent, in queue.go's run,
// rollback and settle.
//
// It must never decide anything: which rows to claim, fail or requeue is the
// core's choice, made before a command reaches this package, and what an
// operator's tool or a stage may do is decided by its caller. It must never
// retry an error that is not known to be safe to retry (serialization failure
// and deadlock, which roll the whole transaction back).
package store
