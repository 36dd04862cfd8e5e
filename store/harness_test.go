package store_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/queuetest"
	"github.com/pepsi-pipeline/pepsi/store"
)

func TestQueueConformance(t *testing.T) {
	t.Parallel()
	queuetest.Run(t, func(t *testing.T) queuetest.Harness { return newHarness(t) })
}

// harness is a store.Queue on a fresh migrated database, plus direct SQL for
// what the dispatcher never does (insert rows, play a stage, read rows back).
type harness struct {
	*store.Queue
	url   string
	pool  *pgxpool.Pool
	trips *tripCounter
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	url := pgtest.NewMigrated(t)
	trips := &tripCounter{}
	pool := newPool(t, url, trips)
	return &harness{Queue: store.New(pool, testLogger(t)), url: url, pool: pool, trips: trips}
}

// newPool opens a pool whose connections count their round trips into trips.
func newPool(t testing.TB, url string, trips *tripCounter) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, trips: trips}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func (h *harness) exec(t testing.TB, sql string, args ...any) pgconn.CommandTag {
	t.Helper()
	tag, err := h.pool.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag
}

func (h *harness) Insert(t *testing.T, stage string, n int) []int64 {
	t.Helper()
	rows, _ := h.pool.Query(t.Context(),
		"INSERT INTO pepsi.queue (stage) SELECT $1 FROM generate_series(1, $2) RETURNING ingress_id", stage, n)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("insert %d rows at %s: %v", n, stage, err)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

func (h *harness) InsertMessage(t *testing.T, stage, state string, payload []byte) int64 {
	t.Helper()
	var id int64
	err := h.pool.QueryRow(t.Context(), "INSERT INTO pepsi.queue (stage, state, payload) VALUES ($1, $2::jsonb, $3) RETURNING ingress_id",
		stage, state, payload).Scan(&id)
	if err != nil {
		t.Fatalf("insert a message at %s: %v", stage, err)
	}
	return id
}

func (h *harness) BeginInsert(t *testing.T, stage string) (int64, func()) {
	t.Helper()
	return h.beginInsert(t, "INSERT INTO pepsi.queue (stage) VALUES ($1) RETURNING ingress_id", stage)
}

// beginInsert runs an INSERT … RETURNING ingress_id in a producer transaction
// left open, and returns the id and the commit.
func (h *harness) beginInsert(t *testing.T, sql string, args ...any) (int64, func()) {
	t.Helper()
	ctx := t.Context()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatalf("begin producer transaction: %v", err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck // a no-op once committed
	var id int64
	if err := tx.QueryRow(ctx, sql, args...).Scan(&id); err != nil {
		t.Fatalf("insert %v: %v", args, err)
	}
	return id, func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("commit producer transaction: %v", err)
		}
	}
}

func (h *harness) Stage(t *testing.T, id int64, from, to string, status core.RowStatus, timeout time.Time) {
	t.Helper()
	var at *time.Time
	if !timeout.IsZero() {
		at = &timeout
	}
	tag := h.exec(t, `UPDATE pepsi.queue SET stage = $3, status = $4, timeout = $5, updated_at = now()
		WHERE ingress_id = $1 AND status = 'running' AND stage = $2`, id, from, to, status, at)
	if tag.RowsAffected() != 1 {
		t.Fatalf("stage: row %d is not running at %s", id, from)
	}
}

func (h *harness) Row(t *testing.T, id int64) (stage string, status core.RowStatus, timeout time.Time, dispatchError string, ok bool) {
	t.Helper()
	var at *time.Time
	// 'infinity' (a pause for good kept through a block) reads as no time, as NULL does.
	err := h.pool.QueryRow(t.Context(), `SELECT stage, status, CASE WHEN isfinite(timeout) THEN timeout END, coalesce(state->>'dispatch_error', '')
		FROM pepsi.queue WHERE ingress_id = $1`, id).Scan(&stage, &status, &at, &dispatchError)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", time.Time{}, "", false
	}
	if err != nil {
		t.Fatalf("read row %d: %v", id, err)
	}
	if at != nil {
		timeout = *at
	}
	return stage, status, timeout, dispatchError, true
}

func (h *harness) State(t *testing.T, id int64) map[string]any {
	t.Helper()
	var state map[string]any
	if err := h.pool.QueryRow(t.Context(), `SELECT state FROM pepsi.queue WHERE ingress_id = $1`, id).Scan(&state); err != nil {
		t.Fatalf("read state of row %d: %v", id, err)
	}
	return state
}

func (h *harness) ClearEpoch(t *testing.T) {
	t.Helper()
	h.exec(t, "DELETE FROM pepsi.dispatch_epoch")
}

func (h *harness) RefuseStateKey(t *testing.T, key string) {
	t.Helper()
	h.exec(t, "ALTER TABLE pepsi.queue ADD CONSTRAINT test_refuses_state_key CHECK (NOT state ? "+quoteLiteral(key)+") NOT VALID")
}

// quoteLiteral is s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// tripCounter counts network round trips over all connections of a pool: on each
// connection, a write that follows a read (or is the first) starts a new one.
// Consecutive writes are one flight, and so are consecutive reads.
type tripCounter struct{ n atomic.Int64 }

func (c *tripCounter) Load() int64 { return c.n.Load() }

type countingConn struct {
	net.Conn
	trips   *tripCounter
	lastOut atomic.Bool // the last operation on this connection was a write
}

func (c *countingConn) Write(b []byte) (int, error) {
	if !c.lastOut.Swap(true) {
		c.trips.n.Add(1)
	}
	return c.Conn.Write(b)
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.lastOut.Store(false)
	}
	return n, err
}

// TestQueueOrderKeys runs the conformance tests of ordering per key on
// PostgreSQL.
func TestQueueOrderKeys(t *testing.T) {
	t.Parallel()
	queuetest.RunOrderKeys(t, func(t *testing.T) queuetest.KeyedHarness { return newHarness(t) })
}

func (h *harness) InsertKeyed(t *testing.T, stage, key string) int64 {
	t.Helper()
	var id int64
	if err := h.pool.QueryRow(t.Context(), "INSERT INTO pepsi.queue (stage, order_key) VALUES ($1, $2) RETURNING ingress_id", stage, key).Scan(&id); err != nil {
		t.Fatalf("insert a row of key %q at %s: %v", key, stage, err)
	}
	return id
}

func (h *harness) BeginInsertKeyed(t *testing.T, stage, key string) (int64, func()) {
	t.Helper()
	return h.beginInsert(t, "INSERT INTO pepsi.queue (stage, order_key) VALUES ($1, $2) RETURNING ingress_id", stage, key)
}
