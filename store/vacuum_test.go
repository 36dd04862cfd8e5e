package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Inspect reads the queue's health, and Vacuum removes its dead rows, on the
// real server as it is (autovacuum off here).
func TestInspectSeesDeadRowsAndTheHorizonAndVacuumRemovesThem(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	ids := h.Insert(t, "a", 50)
	for range 3 {
		h.exec(t, `UPDATE pepsi.queue SET updated_at = now() WHERE ingress_id = ANY($1)`, ids)
	}
	h.exec(t, `SELECT pg_stat_force_next_flush()`)
	var in core.Inspected
	waitUntil(t, 20*time.Second, "dead rows in the statistics", func() bool {
		in = h.Inspect(ctx, core.Inspect{Op: 7})
		return in.Err == "" && in.Dead >= 100
	})
	if in.Op != 7 || in.Vacuuming {
		t.Errorf("inspected %v; want op 7, no vacuum running", in)
	}
	var server string
	if err := h.pool.QueryRow(ctx, `SELECT current_setting('autovacuum')`).Scan(&server); err != nil {
		t.Fatal(err)
	}
	if want := server == "on"; in.Autovacuum != want {
		t.Errorf("inspected autovacuum %v with the server's autovacuum %s", in.Autovacuum, server)
	}
	h.exec(t, `ALTER TABLE pepsi.queue SET (autovacuum_enabled = off)`)
	if in := h.Inspect(ctx, core.Inspect{Op: 8}); in.Autovacuum {
		t.Errorf("autovacuum_enabled = off for the table, but inspected %v", in)
	}

	// An old transaction holds back the horizon: it is named.
	old, err := h.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Rollback(context.Background()) //nolint:errcheck // test cleanup
	var pid int
	if err := old.QueryRow(ctx, `SELECT pg_backend_pid() FROM (SELECT txid_current()) x`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	in = h.Inspect(ctx, core.Inspect{Op: 9})
	if in.HorizonAge < 50*time.Millisecond || !strings.Contains(in.Horizon, "pid ") {
		t.Errorf("inspected horizon %s %q with a transaction open; want its age and pid", in.HorizonAge, in.Horizon)
	}
	if err := old.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	if v := h.Vacuum(ctx, core.Vacuum{Op: 3}); v.Op != 3 || v.Err != "" {
		t.Fatalf("vacuumed %v", v)
	}
	waitUntil(t, 20*time.Second, "no dead rows after the vacuum", func() bool {
		in = h.Inspect(ctx, core.Inspect{Op: 10})
		return in.Err == "" && in.Dead == 0
	})
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestInspectCountsPendingMessagesOfStagesNobodyRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.Insert(t, "a", 3)
	h.Insert(t, "ghost", 2)
	h.Insert(t, "orphan", 1)
	in := h.Inspect(t.Context(), core.Inspect{Op: 1, Run: []string{"a", "b"}})
	want := []core.StageCount{{Stage: "ghost", N: 2}, {Stage: "orphan", N: 1}}
	if in.Err != "" || fmt.Sprint(in.Unrun) != fmt.Sprint(want) {
		t.Fatalf("inspected %v; want stages nobody runs %v", in, want)
	}
}

// A role that does not own pepsi.queue (nor the database, nor is a superuser)
// may neither vacuum nor analyze it, and PostgreSQL skips either with a mere
// warning, no error: the inspection must say so (NotOwner), or the core would
// send a vacuum that does nothing every few seconds and believe it done.
func TestInspectSaysWhenTheRoleMayNotVacuumTheQueue(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	if in := h.Inspect(ctx, core.Inspect{Op: 1}); in.Err != "" || in.NotOwner {
		t.Fatalf("inspected %v as the queue's owner; want NotOwner false", in)
	}
	role := fmt.Sprintf("pepsi_not_owner_%d", time.Now().UnixNano()%1e9)
	h.exec(t, "CREATE ROLE "+role+" LOGIN; GRANT USAGE ON SCHEMA pepsi TO "+role+"; GRANT SELECT ON pepsi.queue TO "+role)
	t.Cleanup(func() {
		h.pool.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role) //nolint:errcheck // best effort: roles outlive databases
	})
	cfg, err := pgx.ParseConfig(h.url)
	if err != nil {
		t.Fatal(err)
	}
	other := store.New(newPool(t, strings.Replace(h.url, "//"+cfg.User+"@", "//"+role+"@", 1), &tripCounter{}), testLogger(t))
	in := other.Inspect(ctx, core.Inspect{Op: 2})
	if in.Err != "" || !in.NotOwner {
		t.Errorf("inspected %v as role %s; want NotOwner", in, role)
	}
	analyses := func() (n int64) {
		h.exec(t, "SELECT pg_stat_clear_snapshot()")
		if err := h.pool.QueryRow(ctx, "SELECT coalesce(analyze_count, 0) FROM pg_stat_user_tables WHERE relid = 'pepsi.queue'::regclass").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := analyses()
	if v := other.Vacuum(ctx, core.Vacuum{Op: 3, Kind: core.AnalyzeOnly}); v.Err != "" || analyses() != before {
		t.Errorf("as role %s the analyze answered %v and the queue was analyzed %d times; want no error and none: what the inspection's NotOwner stands for", role, v, analyses()-before)
	}
}
