package stage

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pepsi-pipeline/pepsi/store"
)

// errHandlerEndsTx is what Commit and Rollback of Message.Tx return: the library
// ends the transaction, with the transition.
var errHandlerEndsTx = errors.New("stage: a handler must not commit or roll back Message.Tx; return a Result instead")

// errRowChanged reports that the row changed between the read a pass started
// from and its transition (or the lock a handler's first statement took), so the
// pass must run again on the row as it is now.
var errRowChanged = errors.New("the message's row changed while its handler ran")

// lazyTx is Message.Tx: a transaction that begins when the handler first uses
// it. Most handlers never do, and their pass then needs no transaction at all:
// the dispatcher writes the transition they answer (see worker.pass). Its
// first use begins the
// transaction and locks the row in one round trip, checking that the row is
// still the version the handler was given; if it is not, the statement fails
// with errRowChanged and the pass runs again. From then on every call goes to
// the real pgx transaction, savepoints (Begin) and large objects included.
type lazyTx struct {
	w   *worker
	row *row
	tx  pgx.Tx // the real transaction, once begun
	err error  // why it could not begin; returned by every later call
}

// begun reports whether the handler opened the transaction.
func (t *lazyTx) begun() bool { return t.tx != nil }

// changed reports whether the row was found changed when the transaction began.
func (t *lazyTx) changed() bool { return errors.Is(t.err, errRowChanged) }

// ensure begins the transaction and locks the row, once.
func (t *lazyTx) ensure(ctx context.Context) error {
	if t.tx != nil || t.err != nil {
		return t.err
	}
	conn := t.w.conn
	if conn == nil || conn.IsClosed() {
		t.err = errConnectionLost
		return t.err
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	store.QueueStageLock(b, t.row.ID)
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	var locked store.StageLocked
	_, err := br.Exec()
	if err == nil {
		locked, err = store.ReadStageLock(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err == nil && (locked.Stage != t.row.Stage || locked.Status != t.row.Status || locked.Version != t.row.Version):
		err = errRowChanged
	case errors.Is(err, store.ErrNotFound):
		err = errRowChanged
	case err != nil:
		err = fmt.Errorf("message %d: %w", t.row.ID, err)
	}
	if err != nil {
		// Release the row, but stay inside a transaction (a new one, until
		// tx.end rolls it back): a handler that goes on with statements on
		// Conn() then runs them there, not in transactions of their own that
		// would commit in a pass that does not.
		if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			if _, rerr := conn.Exec(context.WithoutCancel(ctx), rollbackAndChainSQL); rerr != nil {
				t.w.closeBroken(ctx) // as a failed rollback of pgx's does
			}
		}
		t.err = err
		return err
	}
	t.tx = tx
	return nil
}

// end rolls back whatever the pass left open: the handler's transaction when
// the pass answered without committing it, a transition that failed, or the
// transaction ensure left open when it could not lock the row.
func (t *lazyTx) end(ctx context.Context) {
	conn := t.w.conn
	if conn == nil || conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	// A failed rollback ends with the connection: the next pass reconnects.
	if t.tx != nil {
		_ = t.tx.Rollback(context.WithoutCancel(ctx))
		return
	}
	if _, err := conn.Exec(context.WithoutCancel(ctx), rollbackSQL); err != nil {
		t.w.closeBroken(ctx) // as a failed rollback of pgx's does
	}
}

// Begin starts a savepoint inside the message's transaction.
func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

// Commit refuses: the library commits, with the transition.
func (t *lazyTx) Commit(context.Context) error { return errHandlerEndsTx }

// Rollback refuses: return Error to have the handler's statements undone.
func (t *lazyTx) Rollback(context.Context) error { return errHandlerEndsTx }

// CopyFrom runs COPY FROM in the message's transaction.
func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ensure(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// SendBatch sends b in the message's transaction.
func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ensure(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

// LargeObjects returns the large objects of the message's transaction. It has no
// context and no error of its own: if the transaction cannot begin, the returned
// value's methods report that the transaction is closed.
func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	if err := t.ensure(context.Background()); err != nil {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		return pgx.FailedBatchResults(b, err).Tx().LargeObjects()
	}
	return t.tx.LargeObjects()
}

// Prepare prepares a statement on the message's connection.
func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Exec runs sql in the message's transaction.
func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.ensure(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, args...)
}

// Query runs sql in the message's transaction.
func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ensure(ctx); err != nil {
		return errRows{err}, err
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow runs sql in the message's transaction.
func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ensure(ctx); err != nil {
		return errRows{err}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// Conn returns the stage's connection, inside the message's transaction (begun
// now if it was not), as pgx's own transactions do.
func (t *lazyTx) Conn() *pgx.Conn {
	_ = t.ensure(context.Background()) // a failure is the next statement's to report
	return t.w.conn
}

// errRows is the result of a query that could not be sent: no rows, and err.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return pgtype.NewMap() }
