package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// atSchema26 makes a database of its own at schema 26, the one before the
// first migration since that locks pepsi.queue exclusively (27), and
// returns its URL and a session on it.
func atSchema26(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	conn := pgtest.Connect(t, url)
	if _, err := store.MigrateTo(context.Background(), conn, 26); err != nil {
		t.Fatalf("migrate to 26: %v", err)
	}
	return url, conn
}

// holdARow begins a transaction on a session of url that locks one queue
// row, as a stage's pass does for its whole run, and returns the session:
// schema 27 needs an exclusive lock on pepsi.queue, which waits for it.
func holdARow(t *testing.T, url string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	holder := pgtest.Connect(t, url)
	if _, err := holder.Exec(ctx, "INSERT INTO pepsi.queue (stage) VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck // may have ended
	if _, err := tx.Exec(ctx, "SELECT ingress_id FROM pepsi.queue ORDER BY ingress_id LIMIT 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// A migration that needs pepsi.queue exclusively, started while a pass holds
// a row, must not hold off producers for as long as the pass runs: its lock
// request would queue every insert behind it (a 20 s pass stalled producers
// 21 s on a schema 26 database). It gives way, tries again, and lands once
// the pass ends.
func TestMigrateGivesWayToALongTransaction(t *testing.T) {
	t.Parallel()
	url, conn := atSchema26(t)
	ctx := context.Background()
	pass := holdARow(t, url)
	done := make(chan error, 1)
	go func() {
		_, err := store.MigrateTo(ctx, conn, store.Latest())
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // the migration waits for its lock
	producer := pgtest.Connect(t, url)
	insert, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := producer.Exec(insert, "INSERT INTO pepsi.queue (stage) VALUES ('b')"); err != nil {
		t.Fatalf("a producer's insert while the migration waited: %v after %v (want it through within the migration's lock wait)", err, time.Since(start))
	}
	if err := pass.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("migrate after the pass ended: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("migrate did not finish 20 s after the pass ended")
	}
	check := pgtest.Connect(t, url)
	if v, err := store.Version(ctx, check); err != nil || v != store.Latest() {
		t.Fatalf("Version = %d, %v; want %d", v, err, store.Latest())
	}
}

// A migration whose lock stays held through every try fails, saying so,
// and leaves the database at the version before it.
func TestMigrateThatNeverGetsItsLockLeavesTheVersionBefore(t *testing.T) {
	t.Parallel()
	url, conn := atSchema26(t)
	ctx := context.Background()
	holdARow(t, url)
	applied, err := store.MigrateWith(ctx, conn, store.Latest(), store.MigrateOptions{LockWait: 100 * time.Millisecond, Tries: 2})
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("MigrateWith = %v, %v; want a lock_not_available error", applied, err)
	}
	if len(applied) != 0 {
		t.Fatalf("applied %v, want nothing", applied)
	}
	if v, err := store.Version(ctx, conn); err != nil || v != 26 {
		t.Fatalf("Version = %d, %v; want 26", v, err)
	}
	var half bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = 'pepsi.queue'::regclass AND attname = 'attempts_stage')`).Scan(&half); err != nil || half {
		t.Fatalf("attempts_stage there: %v, %v; want schema 27 rolled back whole", half, err)
	}
}

// A role that may read the schema but not change it, run against a database
// that has one, fails on the first migration it has no rights for, naming
// it, and finds nothing to do on a current one: before, both failed at once
// with "create version table: permission denied for database", since CREATE
// ... IF NOT EXISTS checks the right to create before it looks.
func TestMigrateByARoleThatMayNotCreateNamesWhatItLacks(t *testing.T) {
	t.Parallel()
	url, conn := atSchema26(t)
	ctx := context.Background()
	_, roleURL := pgtest.LoginRole(t, conn, url, "migrator", `GRANT USAGE ON SCHEMA pepsi TO ROLE;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pepsi TO ROLE`)
	role := pgtest.Connect(t, roleURL)
	_, err := store.Migrate(ctx, role)
	if err == nil || !strings.Contains(err.Error(), "0027_") || !strings.Contains(err.Error(), "must be owner") {
		t.Fatalf("migrate by a role that owns nothing: %v; want schema 27's error, that it must own the queue", err)
	}
	if _, err := store.Migrate(ctx, conn); err != nil {
		t.Fatalf("migrate by the owner: %v", err)
	}
	if applied, err := store.Migrate(ctx, role); err != nil || len(applied) != 0 {
		t.Fatalf("migrate of a current database by a role that owns nothing = %v, %v; want nothing to do", applied, err)
	}
}

// Passes that overlap (each holds a row 400 ms, a new one every 200 ms)
// leave pepsi.queue no free moment: a migration whose every try waited the
// same 50 ms would never get its lock. Each try waits twice as long as the
// one before, and the try whose wait outlasts the passes open when it began
// gets it (those begun after queue behind it), so the migration lands.
func TestMigrateGetsItsLockBetweenOverlappingPasses(t *testing.T) {
	t.Parallel()
	url, conn := atSchema26(t)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var passes sync.WaitGroup
	for i := range 2 {
		pass := pgtest.Connect(t, url)
		passes.Go(func() {
			time.Sleep(time.Duration(i) * 200 * time.Millisecond)
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Errors end the loop: the test fails by the migration's
				// answer, and the pass's session is the test's.
				tx, err := pass.Begin(ctx)
				if err != nil {
					return
				}
				if _, err := tx.Exec(ctx, "SELECT ingress_id FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE", i+1); err != nil {
					tx.Rollback(ctx) //nolint:errcheck // the session is the test's
					return
				}
				time.Sleep(400 * time.Millisecond)
				if err := tx.Commit(ctx); err != nil {
					return
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // both passes are running
	_, err := store.MigrateWith(ctx, conn, store.Latest(), store.MigrateOptions{LockWait: 50 * time.Millisecond, Tries: 8})
	close(stop)
	passes.Wait()
	if err != nil {
		t.Fatalf("migrate between overlapping passes: %v", err)
	}
	if v, err := store.Version(ctx, conn); err != nil || v != store.Latest() {
		t.Fatalf("Version = %d, %v; want %d", v, err, store.Latest())
	}
}
