package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// A queue analyzed while small and grown far past it (autovacuum off, as on
// our servers) made the planner expect a few rows after a page's last id
// where there were a million, and plan each page of pepsi-queue list
// -status failed -limit 0 as a bitmap scan of every failed row after it and
// a sort: seconds a page, the listing quadratic. Here 20,000 rows are
// analyzed, then the queue grows to 200,000, one row in 20 failed, stored
// out of id order as a queue's updates and vacuums leave them (in id order
// walking the key is so cheap that the planner takes it anyway). A page
// after the first, as List runs it (its plan as auto_explain sends it to
// the client), walks the primary key: no sort, no bitmap scan, and it reads
// no more rows than it passes on its way to the page's last id.
func TestListPagesAfterTheFirstWalkTheIDsWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	const analyzed, grown, page = 20_000, 200_000, 1000
	url := pgtest.NewMigrated(t)
	conn, plans := explainedConn(t, url)
	fill := `INSERT INTO pepsi.queue (ingress_id, stage, status, state) OVERRIDING SYSTEM VALUE
		SELECT g, 'a', CASE WHEN g %% 20 = 0 THEN 'failed' ELSE 'done' END,
			CASE WHEN g %% 20 = 0 THEN '{"dispatch_error": "exit 1"}'::jsonb ELSE '{}' END
		FROM generate_series(%d, %d) g ORDER BY random()`
	execAll(t, conn,
		"ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)",
		fmt.Sprintf(fill, 1, analyzed),
		"ANALYZE pepsi.queue",
		fmt.Sprintf(fill, analyzed+1, grown),
		"LOAD 'auto_explain'",
		"SET auto_explain.log_min_duration = 0",
		"SET auto_explain.log_analyze = on",
		"SET auto_explain.log_format = json",
		"SET auto_explain.log_level = notice",
	)
	ctx := t.Context()
	q := store.On(conn)
	sel := store.Selection{Statuses: []core.RowStatus{core.StatusFailed}}
	after := int64(analyzed + 10*page) // well past the analyzed ids
	*plans = nil
	got, err := q.List(ctx, store.ListParams{Selection: sel, After: after, Limit: page})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != page || got[0].ID != after+20 || got[page-1].ID != after+20*page {
		t.Fatalf("the page after %d: %d rows, %d to %d; want %d, %d to %d", after, len(got), got[0].ID, got[len(got)-1].ID, page, after+20, after+20*page)
	}
	if len(*plans) != 1 {
		t.Fatalf("%d plans of the queue explained for one page; want 1", len(*plans))
	}
	plan := (*plans)[0]
	walked, wrong := false, []string{}
	plan.walk(nil, func(n, _ *planNode) {
		if strings.Contains(n.NodeType, "Sort") || strings.Contains(n.NodeType, "Bitmap") {
			wrong = append(wrong, n.NodeType)
		}
		if n.IndexName == "queue_pkey" && n.NodeType == "Index Scan" {
			walked = true
			// A failed row in 20: the page's 1,000 are found among the
			// next 20,000 ids, not among the 170,000 after it.
			if read := n.ActualRows + n.RemovedByFilter; read > 20*page {
				t.Errorf("the page after %d read %g rows of the queue; want at most %d:\n%s", after, read, 20*page, plan)
			}
		}
	})
	if len(wrong) > 0 || !walked {
		t.Errorf("the page after %d, on a queue %d times the size it was analyzed at, is planned with %v and walks queue_pkey: %v; want no sort, no bitmap scan, the walk:\n%s",
			after, grown/analyzed, wrong, walked, plan)
	}
}

// A page read in the caller's transaction leaves that transaction's
// settings as they were: the page's transaction (a savepoint there) is
// rolled back, which undoes its SET LOCALs, where a released savepoint
// would have kept them to the caller's commit.
func TestAListedPageLeavesTheCallersSettings(t *testing.T) {
	t.Parallel()
	_, conn := pgtest.NewMigratedConn(t)
	ctx := t.Context()
	execAll(t, conn, "INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, 10)")
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	got, err := store.On(tx).List(ctx, store.ListParams{After: 3, Limit: 4})
	if err != nil || len(got) != 4 || got[0].ID != 4 {
		t.Fatalf("a page after 3 in the caller's transaction: %v, %v; want ids 4 to 7", got, err)
	}
	for _, setting := range []string{"enable_sort", "enable_bitmapscan"} {
		var v string
		if err := tx.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&v); err != nil || v != "on" {
			t.Errorf("%s in the caller's transaction after the page: %q, %v; want on", setting, v, err)
		}
	}
}

// explainedConn connects to url and collects the plans auto_explain sends it
// as notices (once it is loaded and told to), those that read pepsi.queue,
// into the slice it returns.
func explainedConn(t *testing.T, url string) (*pgx.Conn, *[]*planNode) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	plans := new([]*planNode)
	// Notices arrive on the goroutine reading the connection: the test's.
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		i := strings.Index(n.Message, "{")
		if !strings.Contains(n.Message, "plan:") || i < 0 {
			return
		}
		var p struct{ Plan planNode }
		if err := json.Unmarshal([]byte(n.Message[i:]), &p); err != nil {
			t.Errorf("parse auto_explain's plan (%v): %s", err, n.Message)
			return
		}
		reads := false
		p.Plan.walk(nil, func(n, _ *planNode) { reads = reads || n.RelationName == "queue" })
		if reads {
			*plans = append(*plans, &p.Plan)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn, plans
}
