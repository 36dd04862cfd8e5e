package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
)

// narrowLockSQL takes the lock every write of the queue and its history
// takes anyway, which no producer's conflicts with.
const narrowLockSQL = "LOCK TABLE pepsi.queue, pepsi.history IN ROW EXCLUSIVE MODE"

// errNotNarrowed says runNarrowed found nothing to narrow: the refusal was
// not a resolve's item's (another statement's, or every item's failure was
// refused too), so the step's transaction fails as it did.
var errNotNarrowed = errors.New("the refusal is not one message's outcome")

// runNarrowed runs the step's commands again after the database refused
// their transaction for the data itself (Refused): the same commands in one
// transaction, but each statement on its own and every Resolve under a
// savepoint, so that a refused resolve is tried again in halves, down to the
// items refused alone (resolveNarrowed). Deferred constraints are checked at
// each statement, so a refusal the first transaction met only at its COMMIT
// is narrowed too.
// An item the database refuses alone gets core.RefusedFallback written
// instead (its failure, with the server's error as its reason), reported by
// its Outcome's Refused; every other write of the step stands. If a
// statement other than a resolve is refused, or an item's failure is
// refused too, it returns errNotNarrowed (wrapping the refusal) and nothing
// of it commits: then nothing in the database tells one message apart, and
// the transaction is held as before (docs/operations.md, "A write the
// database refuses").
//
// It runs only after a refusal, which the server answered: the first
// transaction certainly rolled back. A failure of its own before the COMMIT
// is sent is certainly rolled back too (its statements go one at a time);
// if it broke the connection, the server session, which may still be
// running a statement and holding row locks, is ended before the next
// transaction is sent, as a session in doubt is (endDoubt). A failure at the
// COMMIT is settled as run's is (xid, sess).
func (q *Queue) runNarrowed(ctx context.Context, cmds []core.Command) (events []core.Event, xid string, sess Backend, err error) {
	conn, err := q.acquire(ctx)
	if err != nil {
		return nil, "", Backend{}, err
	}
	defer conn.Release()
	c := conn.Conn()
	defer func() {
		if err != nil {
			rollback(c)
		}
		if err == nil || !c.IsClosed() {
			sess = Backend{}
			return
		}
		q.pool.Reset()
		sess = backendOf(c.PgConn())
		if rb := (*rolledBack)(nil); errors.As(err, &rb) {
			// Nothing of it can commit, but its session may live on in the
			// server, holding locks: ended before anything is sent again.
			q.addDoubt(sess)
		}
	}()
	// Until the COMMIT is sent, whatever fails leaves nothing that can
	// commit: the statements go one at a time, so none of it is in doubt.
	// The tables' lock is taken outside every savepoint and held to the
	// end (a statement's own lock goes with its savepoint's rollback): a
	// constraint dropped or added meanwhile (DDL waits for it) cannot make
	// an item refused, then its failure taken, in one transaction. A
	// deferred constraint of the operator's is checked at each statement
	// instead of at the COMMIT, under the statement's savepoint, so that
	// its refusal is narrowed as an immediate one's is (docs/operations.md,
	// "A write the database refuses").
	for _, s := range []string{"BEGIN ISOLATION LEVEL READ COMMITTED", "SET LOCAL synchronous_commit = on", "SET CONSTRAINTS ALL IMMEDIATE", narrowLockSQL} {
		if _, err := c.Exec(ctx, s); err != nil {
			return nil, "", sess, &rolledBack{fmt.Errorf("queue transaction: %s: %w", s, err)}
		}
	}
	events = make([]core.Event, len(cmds))
	for i, cmd := range cmds {
		var ev core.Event
		if r, ok := cmd.(core.Resolve); ok {
			ev, err = q.resolveNarrowed(ctx, c, r)
		} else {
			ev, err = runAlone(ctx, c, statementFor(cmd))
			if Refused(err) {
				err = fmt.Errorf("%w: %w", errNotNarrowed, err)
			}
		}
		if err != nil {
			return nil, "", sess, &rolledBack{fmt.Errorf("queue transaction: %w", err)}
		}
		events[i] = ev
	}
	b := &pgx.Batch{}
	b.Queue(xactIDSQL)
	b.Queue("COMMIT")
	br := c.SendBatch(ctx, b)
	xid, err = readCommit(br)
	if cerr := br.Close(); cerr != nil {
		if err == nil {
			// The server acknowledged the COMMIT: the results stand (as run's).
			q.log.Debug("queue transaction: the connection failed after the COMMIT", "err", cerr)
		} else {
			err = fmt.Errorf("%w (closing: %w)", err, cerr)
		}
	}
	if err != nil {
		return nil, xid, sess, err
	}
	return events, xid, sess, nil
}

// resolveNarrowed applies r inside the open transaction of c: whole, under a
// savepoint, and if the database refuses it, its items in halves, each under
// a savepoint of its own, down to the items refused alone, each of which gets
// its core.RefusedFallback written in its place. Halving keeps the
// savepoints few (about two per level for each refused item, not one per
// item): past 64 subtransactions in one transaction, every snapshot on the
// server must consult pg_subtrans until it ends. The Resolved it returns has
// one Outcome per item of r, in order, as resolve's has.
func (q *Queue) resolveNarrowed(ctx context.Context, c *pgx.Conn, r core.Resolve) (core.Event, error) {
	outcomes, err := q.narrowItems(ctx, c, r, r.Items)
	if err != nil {
		return nil, err
	}
	return core.Resolved{Op: r.Op, Outcomes: outcomes}, nil
}

// narrowItems resolves items (a run of r's) under a savepoint, halving them
// while the database refuses them (resolveNarrowed).
func (q *Queue) narrowItems(ctx context.Context, c *pgx.Conn, r core.Resolve, items []core.Item) ([]core.Outcome, error) {
	if len(items) == 0 {
		return nil, nil
	}
	part := core.Resolve{Op: r.Op, Items: items, Traces: r.Traces}
	ev, err := underSavepoint(ctx, c, statementFor(part))
	switch {
	case err == nil:
		return ev.(core.Resolved).Outcomes, nil
	case !Refused(err):
		return nil, err
	case len(items) > 1:
		half := len(items) / 2
		first, err := q.narrowItems(ctx, c, r, items[:half])
		if err != nil {
			return nil, err
		}
		rest, err := q.narrowItems(ctx, c, r, items[half:])
		if err != nil {
			return nil, err
		}
		return append(first, rest...), nil
	}
	it := items[0]
	refusal := refusalText(err)
	// (The dispatcher logs the message's failure, this refusal its reason.)
	q.log.Debug("queue transaction: the database refused one message's outcome; writing its failure instead", "id", it.ID, "stage", it.Stage, "err", err)
	part.Items = []core.Item{core.RefusedFallback(it, refusal)}
	ev, ferr := underSavepoint(ctx, c, statementFor(part))
	if ferr != nil {
		if Refused(ferr) {
			ferr = fmt.Errorf("%w: message %d's failure too: %w", errNotNarrowed, it.ID, ferr)
		}
		return nil, ferr
	}
	o := ev.(core.Resolved).Outcomes[0]
	o.Refused = refusal
	return []core.Outcome{o}, nil
}

// refusalText is what an operator needs of a refusal: the server's message,
// its detail and the constraint it names, with its SQLSTATE.
func refusalText(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err.Error()
	}
	s := pgErr.Message
	if pgErr.ConstraintName != "" {
		s += " [constraint " + pgErr.ConstraintName + "]"
	}
	return s + " (SQLSTATE " + pgErr.Code + ")"
}

// underSavepoint runs s in the open transaction of c, undoing it alone if it
// fails, so the transaction goes on. The savepoint is released either way
// (ROLLBACK TO keeps it, and one left open would nest everything after it,
// each write taking one more subtransaction id).
func underSavepoint(ctx context.Context, c *pgx.Conn, s statement) (core.Event, error) {
	if _, err := c.Exec(ctx, "SAVEPOINT narrow"); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	ev, err := runAlone(ctx, c, s)
	if err != nil {
		if _, rerr := c.Exec(ctx, "ROLLBACK TO SAVEPOINT narrow; RELEASE SAVEPOINT narrow"); rerr != nil {
			return nil, fmt.Errorf("%w (and rolling back to its savepoint: %w)", err, rerr)
		}
		return nil, err
	}
	if _, err := c.Exec(ctx, "RELEASE SAVEPOINT narrow"); err != nil {
		return nil, fmt.Errorf("release savepoint: %w", err)
	}
	return ev, nil
}

// runAlone sends s in a batch of its own on c and reads its result.
func runAlone(ctx context.Context, c *pgx.Conn, s statement) (core.Event, error) {
	b := &pgx.Batch{}
	s.queue(b)
	br := c.SendBatch(ctx, b)
	ev, err := s.read(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.name, err)
	}
	return ev, nil
}
