package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
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
// send a vacuum that does nothing every few seconds and believe it done. The
// queue's owner (here a superuser) and the database's owner may.
func TestInspectSaysWhenTheRoleMayNotVacuumTheQueue(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	if in := h.Inspect(ctx, core.Inspect{Op: 1}); in.Err != "" || in.NotOwner {
		t.Fatalf("inspected %v as the queue's owner; want NotOwner false", in)
	}
	owner := pgtest.Connect(t, h.url)
	inspectAs := func(roleURL string) (*store.Queue, core.Inspected) {
		q := store.New(newPool(t, roleURL, &tripCounter{}), testLogger(t))
		return q, q.Inspect(ctx, core.Inspect{Op: 2})
	}
	role, roleURL := pgtest.LoginRole(t, owner, h.url, "pepsi_not_owner", "GRANT USAGE ON SCHEMA pepsi TO ROLE; GRANT SELECT ON pepsi.queue TO ROLE")
	other, in := inspectAs(roleURL)
	if in.Err != "" || !in.NotOwner {
		t.Errorf("inspected %v as role %s; want NotOwner", in, role)
	}
	_, before := maintained(t, h)
	if v := other.Vacuum(ctx, core.Vacuum{Op: 3, Kind: core.AnalyzeOnly}); v.Err != "" {
		t.Errorf("as role %s the analyze answered %v; want no error (PostgreSQL only warns)", role, v)
	}
	if _, after := maintained(t, h); after != before {
		t.Errorf("as role %s the queue was analyzed %d times; want none: what the inspection's NotOwner stands for", role, after-before)
	}
	// The database's owner may, though it owns no table.
	var database string
	if err := owner.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		t.Fatal(err)
	}
	db := pgx.Identifier{database}.Sanitize()
	dbOwner, dbOwnerURL := pgtest.LoginRole(t, owner, h.url, "pepsi_db_owner", "GRANT USAGE ON SCHEMA pepsi TO ROLE; GRANT SELECT ON pepsi.queue TO ROLE; ALTER DATABASE "+db+" OWNER TO ROLE")
	t.Cleanup(func() {
		owner.Exec(context.Background(), "ALTER DATABASE "+db+" OWNER TO CURRENT_USER") //nolint:errcheck // before the role is dropped, which a database it owns would stop
	})
	if _, in := inspectAs(dbOwnerURL); in.Err != "" || in.NotOwner {
		t.Errorf("inspected %v as role %s, the database's owner; want NotOwner false", in, dbOwner)
	}
}

// Each kind of core.Vacuum runs what it names: VACUUM, VACUUM (ANALYZE) or
// ANALYZE, as the queue's statistics count them.
func TestEachKindOfVacuumRunsWhatItNames(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	h.Insert(t, "a", 10)
	for i, c := range []struct {
		kind              core.Maintenance
		vacuums, analyses int64
	}{{core.VacuumOnly, 1, 0}, {core.VacuumAnalyze, 1, 1}, {core.AnalyzeOnly, 0, 1}} {
		v0, a0 := maintained(t, h)
		if v := h.Vacuum(ctx, core.Vacuum{Op: int64(i + 1), Kind: c.kind}); v.Err != "" {
			t.Fatalf("%v: %s", core.Vacuum{Op: int64(i + 1), Kind: c.kind}, v.Err)
		}
		if v1, a1 := maintained(t, h); v1-v0 != c.vacuums || a1-a0 != c.analyses {
			t.Errorf("%v: %d vacuums and %d analyses of pepsi.queue; want %d and %d", core.Vacuum{Op: int64(i + 1), Kind: c.kind}, v1-v0, a1-a0, c.vacuums, c.analyses)
		}
	}
}

// maintained is how many times pepsi.queue has been vacuumed and analyzed, as
// the statistics count them (by anyone but autovacuum).
func maintained(t *testing.T, h *harness) (vacuums, analyses int64) {
	t.Helper()
	h.exec(t, "SELECT pg_stat_clear_snapshot()")
	if err := h.pool.QueryRow(t.Context(), `SELECT coalesce(vacuum_count, 0), coalesce(analyze_count, 0)
		FROM pg_stat_user_tables WHERE relid = 'pepsi.queue'::regclass`).Scan(&vacuums, &analyses); err != nil {
		t.Fatal(err)
	}
	return vacuums, analyses
}
