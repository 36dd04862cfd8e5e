package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/traceparent"
)

// The statements of the stage library (package stage). The library queues
// the row lock behind its BEGIN and the transition before its COMMIT in
// batches of its own (one round trip each, beside transaction control that is
// not a statement on the schema): for those it queues the statement with
// QueueStageLock or QueueStageTransition and reads its answer with
// ReadStageLock or ReadStageTransition, the same code the methods run.

// stageLockSQL locks the row a handler is about to write beside, and reads
// what tells whether it is still the version the handler was given.
const stageLockSQL = `SELECT stage, status, xmin FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`

// stageReadSQL reads the rows of a batch of ids in one statement, without a
// lock: a row running at this stage is moved only by this worker (or by the
// dispatcher when it answers), and every write is guarded.
// It reads the message's traceparent and the claim's updated_at, from which
// StageRead computes the traceparent of the pass the row is in, as the
// dispatcher does from its claim's row (traceparent.Pass, which gives none
// for a traceparent that is not well-formed: the database checks only the
// inserted ones since schema 27), for a row running at the stage that reads
// it.
const stageReadSQL = `SELECT ingress_id, stage, status, state, payload, attempts, coalesce(order_key, ''), xmin,
	coalesce(traceparent, ''), updated_at
FROM pepsi.queue WHERE ingress_id = ANY($1)`

// stageTransitionSQL is every transition the library writes itself. The guard
// makes sure the row is still running at the stage that handled it and, when
// $7 is not null, that it is still the version the handler was given. When it
// moved no row it fails, with division_by_zero (stageTransitionNoRow), which
// nothing else in it can raise: in a handler's transaction that stops the
// COMMIT queued behind it in the same batch (see the stage library's
// commitTx). A move to another stage sets attempts to 0 and ready_at to now()
// (the queue has no trigger for it since schema 27; the dispatcher's requeue
// of the advanced row would set them too, but not if it died first).
const stageTransitionSQL = `WITH moved AS (
	UPDATE pepsi.queue
	SET stage = $2, status = $3, timeout = $4, state = $5, updated_at = now(),
		attempts = CASE WHEN $2 <> stage THEN 0 ELSE attempts END,
		ready_at = CASE WHEN $2 <> stage AND $3 IN ('pending', 'running') THEN now() ELSE ready_at END
	WHERE ingress_id = $1 AND status = 'running' AND stage = $6 AND ($7::xid IS NULL OR xmin = $7::xid)
	RETURNING 1
)
SELECT 1 / count(*) FROM moved`

// stageTransitionNoRow is the SQLSTATE (division_by_zero) of a transition
// that moved no row.
const stageTransitionNoRow = "22012"

// StageRow is a queue row as the stage library reads it.
type StageRow struct {
	ID       int64
	Stage    string
	Status   core.RowStatus
	State    []byte // the state column, a JSON object
	Payload  []byte // nil for NULL
	Attempts int
	// OrderKey is the row's order key, "" for none.
	OrderKey string
	// Version is the row's version (PostgreSQL's xmin): every write of the
	// row changes it, so a transition written without a lock can be guarded
	// by the version its handler was given.
	Version uint32
	// TraceParent is the W3C traceparent of the pass the row is in: the
	// message's trace id, this pass's span id, as the line of an INPUT =
	// message stage carries it; "" for a row with no trace context.
	TraceParent string
}

// StageRead reads the rows of ids, in no order; an id with no row has none.
func (s *PG) StageRead(ctx context.Context, ids []int64) ([]StageRow, error) {
	return collect(ctx, s.db, "read rows", func(r pgx.CollectableRow) (StageRow, error) {
		var x StageRow
		var message string
		var claimedAt time.Time
		err := r.Scan(&x.ID, &x.Stage, &x.Status, &x.State, &x.Payload, &x.Attempts, &x.OrderKey, &x.Version, &message, &claimedAt)
		x.TraceParent = traceparent.Pass(message, x.ID, claimedAt)
		return x, err
	}, stageReadSQL, ids)
}

// StageLocked is what StageLock reads of the row it locks.
type StageLocked struct {
	Stage   string
	Status  core.RowStatus
	Version uint32
}

// QueueStageLock queues StageLock's statement on b, for ReadStageLock.
func QueueStageLock(b *pgx.Batch, id int64) { b.Queue(stageLockSQL, id) }

// ReadStageLock reads the answer of the statement QueueStageLock queued:
// an error wrapping ErrNotFound when the row is gone.
func ReadStageLock(br pgx.BatchResults) (StageLocked, error) {
	var l StageLocked
	err := br.QueryRow().Scan(&l.Stage, &l.Status, &l.Version)
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return StageLocked{}, fmt.Errorf("lock message: %w", err)
	}
	return l, nil
}

// StageLock locks the row of id until the end of the caller's transaction
// and reads its stage, status and version; an error wrapping ErrNotFound when
// it has no row.
func (s *PG) StageLock(ctx context.Context, id int64) (StageLocked, error) {
	b := &pgx.Batch{}
	QueueStageLock(b, id)
	br := s.db.SendBatch(ctx, b)
	l, err := ReadStageLock(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("lock message %d: %w", id, cerr)
	}
	return l, err
}

// StageTransitionParams is one transition the stage library writes itself.
type StageTransitionParams struct {
	ID int64
	// From is the stage the row must still be running at.
	From string
	// Stage, Status, Timeout (nil for none) and State (a JSON object, the
	// whole new state) are what the row becomes.
	Stage   string
	Status  core.RowStatus
	Timeout *time.Time
	State   []byte
	// Version, if not nil, is the row version the write must still find: a
	// write without the row's lock writes only over what its handler read.
	Version *uint32
}

// QueueStageTransition queues StageTransition's statement on b, for
// ReadStageTransition.
func QueueStageTransition(b *pgx.Batch, p StageTransitionParams) {
	b.Queue(stageTransitionSQL, p.ID, p.Stage, p.Status, p.Timeout, p.State, p.From, p.Version)
}

// ReadStageTransition reads the answer of the statement QueueStageTransition
// queued: moved is false when the guard found no row to move (in a
// transaction, which is then aborted).
func ReadStageTransition(br pgx.BatchResults) (moved bool, err error) {
	_, err = br.Exec()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &pgErr) && pgErr.Code == stageTransitionNoRow:
		return false, nil
	}
	return false, fmt.Errorf("write transition: %w", err)
}

// StageTransition writes p's transition if the row is still running at
// p.From (and still at p.Version, if given), and says whether it moved it.
// A move to another stage sets attempts to 0 and ready_at to now
// (stageTransitionSQL).
func (s *PG) StageTransition(ctx context.Context, p StageTransitionParams) (moved bool, err error) {
	b := &pgx.Batch{}
	QueueStageTransition(b, p)
	br := s.db.SendBatch(ctx, b)
	moved, err = ReadStageTransition(br)
	// Close repeats the error of a transition that moved no row.
	if cerr := br.Close(); moved && cerr != nil {
		err = fmt.Errorf("write transition: %w", cerr)
	}
	return moved, err
}
