package store

import (
	"context"

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
