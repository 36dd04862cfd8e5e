package store

// The schema: PEPSI's versioned SQL migrations, embedded in every binary,
// and applying them. Applying is idempotent: each migration runs once, in its own
// transaction, under an advisory lock so two tools starting at once do not race.
// A migration's waits for table locks are bounded (MigrateOptions): a lock
// request that waits queues every later request on its table behind it, so a
// migration that waited for a long transaction on pepsi.queue would hold off
// every producer and the dispatcher for as long as that transaction ran.

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// MigrateOptions bounds how long a migration waits for the locks it needs.
type MigrateOptions struct {
	// LockWait bounds each wait of a migration's statements for a lock
	// (lock_timeout); 0 waits as long as it takes. A migration that needs an
	// exclusive lock on pepsi.queue waits for every transaction already using
	// the table (a stage's pass holds one for its whole run), and every
	// insert and claim that comes after queues behind that wait.
	LockWait time.Duration
	// Tries is how many times a migration whose wait ran out is started
	// again, after a pause as long as LockWait in which the others' queued
	// statements run (at least 1). Each try waits twice as long as the one
	// before, up to lockWaitGrowth times LockWait: transactions that overlap
	// (the passes of several workers) may leave the table no free moment,
	// and a wait that outlasts the ones open when it began gets the lock,
	// those begun after it queuing behind it.
	Tries int
}

// lockWaitGrowth bounds how far a migration's lock wait grows over its tries
// (MigrateOptions.Tries): 32 s from the default 1 s, about the stall a
// migration may then cause.
const lockWaitGrowth = 32

// DefaultMigrateOptions: producers and the dispatcher are held off at most
// about a second at a time, and a migration keeps trying for about a minute.
var DefaultMigrateOptions = MigrateOptions{LockWait: time.Second, Tries: 30}

// Migrate brings the database behind conn to the latest version and returns the
// versions it applied (none when it was already current).
func Migrate(ctx context.Context, conn *pgx.Conn) ([]int, error) {
	return MigrateWith(ctx, conn, Latest(), DefaultMigrateOptions)
}

// MigrateTo brings the database behind conn up to version (not beyond), for
// tests of upgrades and of programs that meet an older schema, and returns the
// versions it applied.
func MigrateTo(ctx context.Context, conn *pgx.Conn, version int) ([]int, error) {
	return MigrateWith(ctx, conn, version, DefaultMigrateOptions)
}

// MigrateWith is MigrateTo with its lock waits bounded as opts says.
func MigrateWith(ctx context.Context, conn *pgx.Conn, version int, opts MigrateOptions) ([]int, error) {
	ms, err := Migrations()
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrateLockKey)); err != nil {
		return nil, fmt.Errorf("migrate: take lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrateLockKey)) //nolint:errcheck // released with the session anyway
	current, err := Version(ctx, conn)
	if err != nil {
		return nil, err
	}
	if current == 0 {
		// Only where there is none: CREATE ... IF NOT EXISTS checks the
		// privilege to create before it looks, so on a current database a
		// role that may not create in it failed here ("permission denied
		// for database") instead of finding nothing to do, or failing on
		// the first migration it lacks the rights for, which names them.
		if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS pepsi;
			CREATE TABLE IF NOT EXISTS pepsi.schema_migrations (
			version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return nil, fmt.Errorf("migrate: create version table: %w", err)
		}
	}
	var applied []int
	for _, m := range ms {
		if m.Version <= current || m.Version > version {
			continue
		}
		if err := applyMigration(ctx, conn, m, opts); err != nil {
			return applied, err
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// applyMigration runs m in a transaction of its own, as many as opts.Tries
// times while a lock it waits for stays held longer than opts.LockWait.
// Each try that gives up rolls back whole, so the database is at the
// version before m until one commits.
func applyMigration(ctx context.Context, conn *pgx.Conn, m Migration, opts MigrateOptions) error {
	tries := max(opts.Tries, 1)
	wait := opts.LockWait
	for try := 1; ; try, wait = try+1, min(wait*2, opts.LockWait*lockWaitGrowth) {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if opts.LockWait > 0 {
				// Local to the transaction: the session's own setting is
				// back once it ends, and a function a migration calls that
				// reads lock_timeout (pepsi.history_day) sees this one.
				ms := strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
				if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", ms); err != nil {
					return fmt.Errorf("bound its lock waits: %w", err)
				}
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO pepsi.schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || opts.LockWait <= 0 {
			if err != nil {
				return fmt.Errorf("migrate: apply %s: %w", m.Name, err)
			}
			return nil
		}
		if try >= tries {
			return fmt.Errorf("migrate: apply %s: a lock it needs was held by another transaction through %d tries, the last waiting %s: "+
				"find it in pg_locks and pg_stat_activity (a long transaction on pepsi.queue or pepsi.history), "+
				"or run migrate again with a longer -lock-wait (0 waits as long as it takes, holding off every writer meanwhile): %w",
				m.Name, tries, wait, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate: apply %s: stopped while waiting to try again: %w", m.Name, ctx.Err())
		case <-time.After(opts.LockWait):
		}
	}
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
