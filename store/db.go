package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what a statement runs on: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
// The caller chooses the transaction; a method of PG runs its one statement
// in whatever it is given.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// PG runs the statements of the operator's tools, pepsi-ingress, pepsi-httpd
// and the stage library on a DB, one method per statement.
type PG struct {
	db DB
}

// On returns the statements run on db.
func On(db DB) *PG { return &PG{db: db} }

// collect runs sql with args on db and scans each row of its answer with
// scan; what names the statement in its errors.
func collect[T any](ctx context.Context, db DB, what string, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// collectMap runs sql with args on db, whose answer is rows of a text and a
// bigint, and returns them as a map; what names the statement in its errors.
func collectMap(ctx context.Context, db DB, what, sql string, args ...any) (map[string]int64, error) {
	res, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out := map[string]int64{}
	var k string
	var v int64
	if _, err := pgx.ForEachRow(res, []any{&k, &v}, func() error {
		out[k] = v
		return nil
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}
