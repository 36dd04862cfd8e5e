// Package pgtest gives each integration test a database of its own on a real
// PostgreSQL, with the PEPSI schema applied, and drops it when the test ends. The
// server comes from PEPSI_TEST_DATABASE_URL (an admin URL, e.g.
// postgres://postgres@127.0.0.1:5432/postgres) or, where a Docker engine is
// reachable, from a container started with dockertest. With neither the test
// fails: a missing server is never a skip. Only test code imports this package.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"

	// Its init clears the caller's PG* and PEPSI_* variables: every test
	// with a database reaches only the server it was given.
	_ "github.com/pepsi-pipeline/pepsi/internal/testenv/hermetic"
	"github.com/pepsi-pipeline/pepsi/store"
)

// EnvURL names the environment variable holding the admin URL of the test server.
const EnvURL = "PEPSI_TEST_DATABASE_URL"

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
)

// AdminURL returns the URL of a database on the test server that may create and
// drop databases, starting a container the first time if it must.
func AdminURL(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() { serverURL, serverErr = findServer() })
	if serverErr != nil {
		t.Fatalf("no PostgreSQL for integration tests: %v", serverErr)
	}
	return serverURL
}

func findServer() (string, error) {
	if u := os.Getenv(EnvURL); u != "" {
		return u, nil
	}
	pool, err := dockertest.NewPool("")
	if err == nil {
		err = pool.Client.Ping()
	}
	if err != nil {
		return "", fmt.Errorf("%s is not set and no Docker engine is reachable (%v); set it to an admin URL such as postgres://postgres@127.0.0.1:5432/postgres", EnvURL, err)
	}
	res, err := pool.Run("postgres", "15", []string{"POSTGRES_HOST_AUTH_METHOD=trust"})
	if err != nil {
		return "", fmt.Errorf("start postgres container: %w", err)
	}
	_ = res.Expire(1800) // the container removes itself if the test binary dies
	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable", res.GetPort("5432/tcp"))
	pool.MaxWait = 60 * time.Second
	err = pool.Retry(func() error {
		c, err := pgx.Connect(context.Background(), u)
		if err != nil {
			return err
		}
		return c.Close(context.Background())
	})
	if err != nil {
		return "", fmt.Errorf("postgres container did not come up: %w", err)
	}
	return u, nil
}

// NewDatabase creates an empty database for this test and returns its URL; the
// database is dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	admin := AdminURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "pepsi_test_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to test server %s: %v", redact(admin), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop test database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("parse %s: %v", EnvURL, err)
	}
	u.Path = "/" + name
	return u.String()
}

// NewDatabaseName is NewDatabase for a program that drops and creates its
// database afresh by name (the demo, the bench): it returns the name.
func NewDatabaseName(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// NewMigrated is NewDatabase with the PEPSI schema applied.
func NewMigrated(t testing.TB) string {
	t.Helper()
	u := NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := store.Migrate(ctx, conn); err != nil {
		t.Fatalf("migrate test database: %v", err)
	}
	return u
}

// NewMigratedConn is NewMigrated and a connection to the database (see
// Connect): where most tests start.
func NewMigratedConn(t testing.TB) (url string, conn *pgx.Conn) {
	t.Helper()
	url = NewMigrated(t)
	return url, Connect(t, url)
}

// Connect opens a connection to url that is closed when the test ends.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	return ConnectWith(t, url, nil)
}

// ConnectWith is Connect with the run-time parameters params set at connect,
// as a pool's sessions set them (store.SessionParams: the dispatcher's).
func ConnectWith(t testing.TB, url string, params map[string]string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse %s: %v", redact(url), err)
	}
	maps.Copy(cfg.RuntimeParams, params)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Listen opens a connection of its own to url, closed when the test ends,
// that listens on the channel inserts notify (store.IngressChannel).
func Listen(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	conn := Connect(t, url)
	if _, err := conn.Exec(context.Background(), "LISTEN "+store.IngressChannel); err != nil {
		t.Fatalf("listen: %v", err)
	}
	return conn
}

// HoldGate takes the gate (store.GateKey) exclusively on a connection of its
// own for the rest of the test, as a dispatcher waiting for work does: from then
// on every insert into pepsi.queue notifies ingress (schema 4).
func HoldGate(t testing.TB, url string) {
	t.Helper()
	c := Connect(t, url)
	if _, err := c.Exec(context.Background(), "SELECT pg_advisory_lock($1)", store.GateKey); err != nil {
		t.Fatalf("take the gate: %v", err)
	}
}

// MonitorRole makes sure the server has the role pepsi_monitor, which the
// schema's migrations grant to when it exists (pepsi-httpd(8)), and leaves
// it there: it is the server's, not a database's, and while one test drops
// it another test's migration, in its own database, may be granting to it.
// Tests that make it at once both succeed.
func MonitorRole(t testing.TB, conn *pgx.Conn) {
	t.Helper()
	_, err := conn.Exec(t.Context(), `DO $$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pepsi_monitor') THEN
		CREATE ROLE pepsi_monitor;
	END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
	NULL; -- another test made it meanwhile
END $$`)
	if err != nil {
		t.Fatalf("make the role pepsi_monitor: %v", err)
	}
}

// LoginRole makes a login role of a name from prefix, runs grants (SQL in
// which ROLE stands for the role's name) on conn, a session of the database
// url names, and returns the role's name and url with the role for its user.
// The role is dropped, with what it owns and its privileges in this database,
// when the test ends: a role is the server's and outlives the database.
func LoginRole(t testing.TB, conn *pgx.Conn, url, prefix, grants string) (role, roleURL string) {
	t.Helper()
	role = fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano()%1e9)
	if _, err := conn.Exec(t.Context(), "CREATE ROLE "+role+" LOGIN; "+strings.ReplaceAll(grants, "ROLE", role)); err != nil {
		t.Fatalf("create the role %s: %v", role, err)
	}
	t.Cleanup(func() {
		conn.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role) //nolint:errcheck // best effort: its database may be gone first
	})
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return role, strings.Replace(url, "//"+cfg.User+"@", "//"+role+"@", 1)
}

// Seed returns the seed of a randomized test, from PEPSI_TEST_SEED if set,
// and logs it with the command that replays it (pkg is the test's package,
// as go test names it: ./store/).
func Seed(t testing.TB, pkg string) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PEPSI_TEST_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("PEPSI_TEST_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (replay: PEPSI_TEST_SEED=%d go test -run '^%s$' %s)", seed, seed, t.Name(), pkg)
	return seed
}

// WaitForStatement waits, for up to 10 s, until another session of conn's
// database runs a statement like pattern (a LIKE pattern), when running is
// true, or until none does, when it is false: a test that stops a tool
// mid-statement learns from the server whether that statement still runs.
func WaitForStatement(t testing.TB, conn *pgx.Conn, pattern string, running bool) {
	t.Helper()
	waitForActivity(t, conn, "state = 'active'", pattern, running)
}

// WaitForLockWait waits, for up to 10 s, until another session of conn's
// database running a statement like pattern waits for a lock (a row
// another session holds).
func WaitForLockWait(t testing.TB, conn *pgx.Conn, pattern string) {
	t.Helper()
	waitForActivity(t, conn, "wait_event_type = 'Lock'", pattern, true)
}

// waitForActivity polls pg_stat_activity until whether another session
// running a statement like pattern matches cond is want.
func waitForActivity(t testing.TB, conn *pgx.Conn, cond, pattern string, want bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var found bool
		if err := conn.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
			AND `+cond+` AND query LIKE $1 AND pid <> pg_backend_pid())`, pattern).Scan(&found); err != nil {
			t.Fatal(err)
		}
		if found == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, a session running %q with %s: %v; want %v", pattern, cond, found, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
