package store

// The schema: PEPSI's versioned SQL migrations, embedded in every binary,
// and applying them. Applying is idempotent: each migration runs once, in its own
// transaction, under an advisory lock so two tools starting at once do not race.
// Applying never touches queue rows.

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrateLockKey is the advisory lock taken while migrating ("pepsimig").
const migrateLockKey = 0x706570736d6967

// Migration is one embedded schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrations, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %q: name must start with a number and '_'", name)
		}
		text, err := migrations.ReadFile("migrations/" + name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Latest is the version the embedded migrations bring a database to.
func Latest() int {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Migrate brings the database behind conn to the latest version and returns the
// versions it applied (none when it was already current).
func Migrate(ctx context.Context, conn *pgx.Conn) ([]int, error) {
	return MigrateTo(ctx, conn, Latest())
}

// MigrateTo brings the database behind conn up to version (not beyond), for
// tests of upgrades and of programs that meet an older schema, and returns the
// versions it applied.
func MigrateTo(ctx context.Context, conn *pgx.Conn, version int) ([]int, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrateLockKey)); err != nil {
		return nil, fmt.Errorf("migrate: take lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrateLockKey)) //nolint:errcheck // released with the session anyway
	if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS pepsi;
		CREATE TABLE IF NOT EXISTS pepsi.schema_migrations (
		version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("migrate: create version table: %w", err)
	}
	current, err := Version(ctx, conn)
	if err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range ms {
		if m.Version <= current || m.Version > version {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO pepsi.schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migrate: apply %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// Version returns the schema version of the database behind conn (0: none).
func Version(ctx context.Context, conn *pgx.Conn) (int, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('pepsi.schema_migrations') IS NOT NULL").Scan(&exists); err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM pepsi.schema_migrations").Scan(&v); err != nil {
		return 0, fmt.Errorf("schema version: %w", err)
	}
	return v, nil
}
