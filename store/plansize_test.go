package store_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// plannedStatement is one of the dispatcher's statements, its PREPARE (empty
// for the resolves, which prepareResolves prepares) and EXECUTE's arguments.
type plannedStatement struct{ name, prepare, args string }

// A dispatcher's session makes each generic plan at the statement's first
// run and keeps it until a vacuum or an analyze of the queue. One started on
// an empty queue (never analyzed, as on a new install, or analyzed while
// drained) made plans that read the queue whole once a backlog came: the
// claim read 230,000 buffers beside 100,000 messages, against 1,400 for the
// plan made for them. The store's inspection reports that the queue outgrew
// the size its statistics were taken at (core.OutgrewPlans), and the analyze
// the core then sends (a Vacuum of kind AnalyzeOnly) makes every session's plans
// again: each statement, planned on the empty queue, then run after the
// analyze beside the backlog, reads no more than twice the buffers (and 50
// more) of the same statement planned in a new session, and never scans the
// queue sequentially.
func TestAnAnalyzeMakesPlansMadeOnAnEmptyQueueAgain(t *testing.T) {
	t.Parallel()
	const backlog, items = 100_000, 100
	statements := dispatcherStatements(backlog, items)
	prepares := prepareResolves()
	for _, s := range statements {
		if s.prepare != "" {
			prepares = append(prepares, s.prepare)
		}
	}
	for _, analyzed := range []bool{false, true} {
		t.Run(fmt.Sprintf("analyzed=%v", analyzed), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx := t.Context()
			early := dispatcherConn(t, h.url)
			// (Any change to the table's definition, or its statistics,
			// makes the plans again: this one comes first.)
			execAll(t, early, "ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)")
			if analyzed {
				execAll(t, early, "ANALYZE pepsi.queue")
			}
			execAll(t, early, prepares...)
			for _, s := range statements { // the plans, made on the empty queue
				explain(t, early, "force_generic_plan", s.name, s.args)
			}
			execAll(t, early,
				fmt.Sprintf("INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, %d)", backlog),
				fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'k' || g FROM generate_series(1, %d) g", items),
				fmt.Sprintf("UPDATE pepsi.queue SET status = 'paused', timeout = now() - interval '1 minute', stage = 'c' WHERE ingress_id > %d AND ingress_id <= %d", backlog-2*items, backlog-items),
				fmt.Sprintf("UPDATE pepsi.queue SET status = 'running' WHERE ingress_id > %d AND ingress_id <= %d", backlog-items, backlog),
			)
			in := h.Inspect(ctx, core.Inspect{Op: 1})
			if in.Err != "" || !core.OutgrewPlans(in) {
				t.Fatalf("inspected %v beside a backlog of %d planned empty; want pages the plans outgrew", in, backlog)
			}
			claim := explain(t, early, "force_generic_plan", "claim", statements[0].args)
			t.Logf("before the analyze the claim read %g buffers", claim.SharedHit+claim.SharedRead)
			if v := h.Vacuum(ctx, core.Vacuum{Op: 2, Kind: core.AnalyzeOnly}); v.Err != "" {
				t.Fatal(v.Err)
			}
			var analyses int64
			if err := early.QueryRow(ctx, "SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'pepsi.queue'::regclass").Scan(&analyses); err != nil || analyses < 1 {
				t.Errorf("pepsi.queue analyzed %d times (%v); want the store's analyze counted", analyses, err)
			}
			if in := h.Inspect(ctx, core.Inspect{Op: 3}); in.Err != "" || core.OutgrewPlans(in) || in.PlannedPages < in.Pages/2 || in.PlannedRows < in.Live/2 {
				t.Errorf("inspected %v after the analyze; want its pages planned for", in)
			}
			late := dispatcherConn(t, h.url)
			execAll(t, late, prepares...)
			for _, s := range statements {
				plan := explain(t, early, "force_generic_plan", s.name, s.args)
				want := explain(t, late, "force_generic_plan", s.name, s.args)
				scans := 0
				plan.walk(nil, func(n, _ *planNode) {
					if n.RelationName == "queue" && strings.Contains(n.NodeType, "Seq Scan") {
						scans++
					}
				})
				read, readWant := plan.SharedHit+plan.SharedRead, want.SharedHit+want.SharedRead
				if scans > 0 || read > 2*readWant+50 {
					t.Errorf("%s, planned on the empty queue, read %g buffers in %d sequential scans of the queue beside a backlog of %d after the analyze; planned after it, %g:\n%s",
						s.name, read, scans, backlog, readWant, plan)
				}
			}
		})
	}
}

// dispatcherStatements are the step's statements, the claims first, with
// arguments for a queue of backlog messages pending at stage a, the items
// below them paused at c with their timeouts due, and the last items running
// (a move of each to b that claims it, for the resolves).
func dispatcherStatements(backlog, items int) []plannedStatement {
	statements := []plannedStatement{
		{"claim", prepareClaim, "'{a}', '{100}', '{0}', '{}', '{}', 0, '{}', false, 7"},
		{"claim_limits", prepareClaimLimits, "'{a}', '{100}', '{0}', '{}', '{}', 0, '{}', false, 7, '{b}', '{1000}', '{0}', '{a}', '{b}'"},
		{"over", "PREPARE over(text[], bigint[], bigint[]) AS " + store.OverSQL, "'{a}', '{1000}', '{0}'"},
		{"settled", "PREPARE settled(oid, oid, bigint) AS " + store.SettledSQL, "1, 2, 0"},
		{"wake", "PREPARE wake(timestamptz, bigint[], int) AS " + store.WakeSQL, "now(), '{}', 100"},
		{"release", "PREPARE release(text[], text[], bigint[]) AS " + store.ReleaseSQL, "'{k1,k2}', '{k3}', '{1}'"},
	}
	for _, r := range resolveStatements {
		statements = append(statements, plannedStatement{r.name, "", r.args(backlog-items+1, items)})
	}
	return statements
}

// dispatcherConn connects to url as the dispatcher's pool does, with
// store.SessionParams.
func dispatcherConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	return pgtest.ConnectWith(t, url, store.SessionParams())
}

// An analyze taken while a long load is uncommitted counts the load's pages
// (pg_relation_size does) but not its rows: the statistics then say the
// queue is large and empty, and plans made from them read it whole. Once the
// load commits, the inspection's live rows are more than twice the rows the
// statistics hold, and core.OutgrewPlans calls for another analyze.
func TestAnAnalyzeTakenDuringALoadIsCalledForAgainOnceItCommits(t *testing.T) {
	t.Parallel()
	const load = 100_000
	h := newHarness(t)
	ctx := t.Context()
	producer := pgtest.Connect(t, h.url)
	execAll(t, producer, "ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)", "BEGIN",
		fmt.Sprintf("INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, %d)", load))
	if in := h.Inspect(ctx, core.Inspect{Op: 1}); in.Err != "" || !core.OutgrewPlans(in) {
		t.Fatalf("inspected %v during the load; want its pages outgrowing the statistics", in)
	}
	if v := h.Vacuum(ctx, core.Vacuum{Op: 2, Kind: core.AnalyzeOnly}); v.Err != "" {
		t.Fatal(v.Err)
	}
	if in := h.Inspect(ctx, core.Inspect{Op: 3}); in.Err != "" || core.OutgrewPlans(in) || in.PlannedRows > load/10 {
		t.Fatalf("inspected %v after the analyze during the load; want its pages planned for and (nearly) no rows", in)
	}
	execAll(t, producer, "COMMIT", "SELECT pg_stat_force_next_flush()")
	var in core.Inspected
	waitUntil(t, 20*time.Second, "the load's rows in the statistics", func() bool {
		in = h.Inspect(ctx, core.Inspect{Op: 4})
		return in.Err == "" && in.Live >= load
	})
	if !core.OutgrewPlans(in) {
		t.Errorf("inspected %v once the load committed; want its live rows outgrowing the statistics", in)
	}
}
