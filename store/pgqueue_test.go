package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// step is the dispatcher's usual transaction: resolve what came back, claim more.
func step(op int64, resolve []int64, stages []string, capEach int) []core.Command {
	items := make([]core.Item, len(resolve))
	for i, id := range resolve {
		items[i] = core.Item{ID: id, Stage: "s0", Verdict: core.Requeue}
	}
	caps := make([]core.Cap, len(stages))
	for i, s := range stages {
		caps[i] = core.Cap{Stage: s, N: capEach}
	}
	return []core.Command{core.Resolve{Op: op, Items: items}, core.Claim{Op: op + 1, Caps: caps}}
}

// mustExec runs cmds and fails the test if any result carries an error.
func mustExec(t testing.TB, h *harness, cmds []core.Command) []core.Event {
	t.Helper()
	evs := h.Exec(context.Background(), cmds)
	for _, ev := range evs {
		if msg := errText(ev); msg != "" {
			t.Fatalf("Exec(%v): %v", cmds, ev)
		}
	}
	return evs
}

// result is a queue result event's Op and error text.
func result(ev core.Event) (op int64, err string) {
	switch e := ev.(type) {
	case core.OrphansReset:
		return e.Op, e.Err
	case core.Resolved:
		return e.Op, e.Err
	case core.Woken:
		return e.Op, e.Err
	case core.Claimed:
		return e.Op, e.Err
	case core.Flushed:
		return e.Op, e.Err
	case core.HistoryKept:
		return e.Op, e.Err
	case core.Released:
		return e.Op, e.Err
	}
	panic(fmt.Sprintf("not a queue result: %T", ev))
}

func errText(ev core.Event) string {
	_, err := result(ev)
	return err
}

func opOf(ev core.Event) int64 {
	op, _ := result(ev)
	return op
}

func claimedIDs(ev core.Event) []int64 {
	var ids []int64
	for _, r := range ev.(core.Claimed).Rows {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestStepIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, s := range []string{"s0", "s1", "s2"} {
		h.Insert(t, s, 100)
	}
	stages := []string{"s0", "s1", "s2"}
	// The first step on a connection also prepares its statements (one more
	// round trip); pgx caches them per connection.
	prev := claimedIDs(mustExec(t, h, step(1, nil, stages, 16))[1])
	prev = claimedIDs(mustExec(t, h, step(3, prev, stages, 16))[1])
	before := h.trips.Load()
	evs := mustExec(t, h, step(5, prev, stages, 16))
	if got := h.trips.Load() - before; got != 1 {
		t.Fatalf("one step (resolve %d items, claim 3 stages) took %d round trips, want 1", len(prev), got)
	}
	if n := len(evs[1].(core.Claimed).Rows); n != 48 {
		t.Fatalf("the measured step claimed %d rows, want 48", n)
	}
}

// planNode is the part of EXPLAIN (FORMAT JSON) output the plan tests read.
type planNode struct {
	NodeType        string     `json:"Node Type"`
	RelationName    string     `json:"Relation Name"`
	IndexName       string     `json:"Index Name"`
	FunctionName    string     `json:"Function Name"`
	ActualRows      float64    `json:"Actual Rows"`
	ActualLoops     float64    `json:"Actual Loops"`
	RemovedByFilter float64    `json:"Rows Removed by Filter"`
	IndexCond       string     `json:"Index Cond"`
	SharedHit       float64    `json:"Shared Hit Blocks"`
	SharedRead      float64    `json:"Shared Read Blocks"`
	Plans           []planNode `json:"Plans"`
}

// walk calls fn for every node with its parent (nil for the root).
func (n *planNode) walk(parent *planNode, fn func(n, parent *planNode)) {
	fn(n, parent)
	for i := range n.Plans {
		n.Plans[i].walk(n, fn)
	}
}

func (n *planNode) String() string {
	var b strings.Builder
	var rec func(n *planNode, depth int)
	rec = func(n *planNode, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), n.NodeType)
		if n.IndexName != "" {
			fmt.Fprintf(&b, " using %s", n.IndexName)
		}
		if n.RelationName != "" {
			fmt.Fprintf(&b, " on %s", n.RelationName)
		}
		fmt.Fprintf(&b, " (rows=%g loops=%g removed=%g)\n", n.ActualRows, n.ActualLoops, n.RemovedByFilter)
		for i := range n.Plans {
			rec(&n.Plans[i], depth+1)
		}
	}
	rec(n, 0)
	return b.String()
}

// explain runs EXPLAIN ANALYZE of prepared statement name with args (SQL
// literals) under planCacheMode, in a transaction it rolls back, and returns the
// plan.
func explain(t *testing.T, conn *pgx.Conn, planCacheMode, name, args string) *planNode {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the rollback is the point: EXPLAIN ANALYZE really claims
	if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+planCacheMode); err != nil {
		t.Fatal(err)
	}
	var out []byte
	q := fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE %s(%s)", name, args)
	if err := tx.QueryRow(ctx, q, pgx.QueryExecModeSimpleProtocol).Scan(&out); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	var plans []struct{ Plan planNode }
	if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
		t.Fatalf("parse EXPLAIN output (%v): %s", err, out)
	}
	return &plans[0].Plan
}

// execAll runs the statements on conn in order, failing the test at the
// first that fails.
func execAll(t *testing.T, conn *pgx.Conn, sqls ...string) {
	t.Helper()
	for _, sql := range sqls {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%.60s: %v", sql, err)
		}
	}
}

// TestClaimPlanWalksPendingIndex checks that a claim on a large backlog costs the
// rows it takes: each stage's subquery is an index scan of queue_pending under a
// Limit that stops at the cap, with no sequential scan of the queue and no sort of
// the backlog, both before the table has statistics (a fresh bulk load) and after,
// with the custom and the generic plans PostgreSQL may use for a prepared
// statement.
func TestClaimPlanWalksPendingIndex(t *testing.T) {
	t.Parallel()
	const backlog, capEach = 200_000, 16
	stages := []string{"s0", "s1", "s2"}
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	ctx := t.Context()
	// Autovacuum must not gather statistics behind the test's back.
	execAll(t, conn,
		"ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)",
		// One row in 50 has an order key (100 keys): the keyed filter must
		// not move the plan off the index either.
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 's' || (i %% 3), CASE WHEN i %% 50 = 0 THEN 'k' || (i %% 100) END FROM generate_series(1, %d) i", backlog),
		prepareClaim,
		prepareClaimLimits,
	)
	// Earlier claims leave dead entries at the head of queue_pending, as in a
	// running system.
	for i := range 10 {
		mustExec(t, h, step(int64(2*i), nil, stages, capEach))
	}
	for _, stats := range []string{"without statistics", "analyzed"} {
		if stats == "analyzed" {
			if _, err := conn.Exec(ctx, "ANALYZE pepsi.queue"); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			for _, after := range []string{"{0,0,0}", "{0,1000,100000}"} {
				// Excluded: rows the dispatcher holds, some of them pending.
				args := fmt.Sprintf("'{%s}', '{%d,%d,%d}', '%s', '{1,2,3,500000}', '{s1}', 4096, '{k1,k2}', true, 7", strings.Join(stages, ","), capEach, capEach, capEach, after)
				// The claim with back-pressure's parts, none of its stages
				// limited, walks the index as the claim without them.
				for _, statement := range []struct{ name, args string }{{"claim", args}, {"claim_limits", args + ", '{}', '{}', '{}', '{}', '{}'"}} {
					plan := explain(t, conn, mode, statement.name, statement.args)
					where := fmt.Sprintf("%s, %s, %s, floors %s:\n%s", statement.name, stats, mode, after, plan)
					checkClaimPlan(t, plan, len(stages), capEach, where)
				}
			}
		}
	}
}

// TestClaimFloorSkipsDeadEntries checks that a stage's floor (core.Cap.After)
// positions the walk of queue_pending rather than filtering it: after claims
// have taken most of a stage's backlog, a claim from the start of the stage's
// range reads every index page of their dead entries, and one from the floor
// reads a few pages, whatever the backlog.
func TestClaimFloorSkipsDeadEntries(t *testing.T) {
	t.Parallel()
	const backlog, taken = 100_000, 90_000
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		"ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)",
		fmt.Sprintf("INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, %d)", backlog),
		fmt.Sprintf("UPDATE pepsi.queue SET status = 'running' WHERE ingress_id <= %d", taken),
		prepareClaim,
	)
	pages := func(after int64) float64 {
		var blocks float64
		plan := explain(t, conn, "force_custom_plan", "claim", fmt.Sprintf("'{a}', '{16}', '{%d}', '{}', '{}', 0, '{}', true, 7", after))
		plan.walk(nil, func(n, _ *planNode) {
			if n.IndexName == "queue_pending" {
				blocks = n.SharedHit + n.SharedRead
			}
		})
		return blocks
	}
	pages(0) // the first walk over the dead entries marks them dead in the index
	from, above := pages(0), pages(taken)
	// 90,000 entries of 24 bytes fill over 250 index pages.
	t.Logf("index pages read: %g from the start, %g above the floor", from, above)
	if from < 200 || above > 10 {
		t.Errorf("a claim from the start of the range read %g index pages, one above the floor %g; want over 200 and at most 10", from, above)
	}
}

// TestClaimLimitsCostTheirMax checks that a claim's back-pressure counts
// (core.Claim.Limits) walk queue_pending and stop one past each limit, before
// and after the claim, whatever the backlog: a limit of 100 behind 100,000
// pending rows reads 101 index entries each time.
func TestClaimLimitsCostTheirMax(t *testing.T) {
	t.Parallel()
	const backlog, limit = 100_000, 100
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		"ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)",
		fmt.Sprintf("INSERT INTO pepsi.queue (stage) SELECT CASE WHEN i %% 2 = 0 THEN 'f' ELSE 'x' END FROM generate_series(1, %d) i", backlog),
		"ANALYZE pepsi.queue",
		prepareClaimLimits,
		"PREPARE over(text[], bigint[], bigint[]) AS "+store.OverSQL,
	)
	for _, c := range []struct{ name, args string }{
		{"claim_limits", fmt.Sprintf("'{f}', '{16}', '{0}', '{}', '{}', 0, '{}', false, 7, '{x}', '{%d}', '{0}', '{f}', '{x}'", limit)},
		{"over", fmt.Sprintf("'{x}', '{%d}', '{0}'", limit)},
	} {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			plan := explain(t, conn, mode, c.name, c.args)
			counted := false
			plan.walk(nil, func(n, _ *planNode) {
				if n.RelationName == "queue" && strings.Contains(n.NodeType, "Seq Scan") {
					t.Errorf("%s, %s: a %s on queue", c.name, mode, n.NodeType)
				}
				if n.IndexName == "queue_pending" && n.ActualLoops == 1 && n.ActualRows == limit+1 {
					counted = true
				}
			})
			if !counted {
				t.Errorf("%s, %s: no walk of queue_pending that stops at %d rows:\n%v", c.name, mode, limit+1, plan)
			}
		}
	}
}

// TestTheSettledCheckReadsNoLockTableBelowWhatTheCoreKnows checks that the
// claim's check of how far ingress has settled reads pg_locks (every entry
// of the server's lock tables) only when the queue has a row above what the
// core knows has settled (core.Claim.Settled): a queue draining a backlog,
// no producer adding rows, never pays for it.
func TestTheSettledCheckReadsNoLockTableBelowWhatTheCoreKnows(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		"INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, 3)",
		"PREPARE settled(oid, oid, bigint) AS "+store.SettledSQL,
	)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		for _, c := range []struct {
			known int64
			reads float64
		}{{3, 0}, {1000, 0}, {2, 1}, {0, 1}} {
			plan := explain(t, conn, mode, "settled", fmt.Sprintf("1, 2, %d", c.known))
			reads := -1.0
			plan.walk(nil, func(n, _ *planNode) {
				if n.FunctionName == "pg_lock_status" {
					reads = n.ActualLoops
				}
			})
			if reads != c.reads {
				t.Errorf("%s, newest row 3, known settled up to %d: pg_lock_status read %g times, want %g:\n%s", mode, c.known, reads, c.reads, plan)
			}
		}
	}
}

// checkClaimPlan: each stage's walk of queue_pending reads its cap and one row
// more (whether the stage has more than the claim took: core.Claimed.More),
// and the claim answers, beside its rows, one row per stage that had more
// (every stage, with this backlog).
func checkClaimPlan(t *testing.T, plan *planNode, nStages, capEach int, where string) {
	t.Helper()
	if plan.ActualRows != float64(nStages*(capEach+1)) {
		t.Errorf("claim returned %g rows, want %d claimed and %d stages with more; %s", plan.ActualRows, nStages*capEach, nStages, where)
	}
	pendingScans := 0
	plan.walk(nil, func(n, parent *planNode) {
		if n.RelationName == "queue" && strings.Contains(n.NodeType, "Seq Scan") {
			t.Errorf("plan has a %s on queue; %s", n.NodeType, where)
		}
		if n.NodeType == "Sort" && n.ActualRows > float64(nStages*(capEach+1)) {
			t.Errorf("plan sorts %g rows, more than the %d claimed and the stages with more; %s", n.ActualRows, nStages*capEach, where)
		}
		if n.IndexName != "queue_pending" || n.ActualLoops == 0 {
			return // (the count of the limits, with none, never runs)
		}
		pendingScans++
		parentType := "nothing"
		if parent != nil {
			parentType = parent.NodeType
		}
		if !strings.HasPrefix(n.NodeType, "Index") || parent == nil || parent.NodeType != "Limit" {
			t.Errorf("queue_pending is read by %s under %s, want an index scan under a Limit; %s", n.NodeType, parentType, where)
		}
		if n.ActualLoops != float64(nStages) || n.ActualRows > float64(capEach+1) || n.RemovedByFilter > float64(capEach) {
			t.Errorf("queue_pending scan: %g loops of %g rows, %g removed by filter; want %d loops of at most %d rows (the cap and one more), no more than %d removed; %s",
				n.ActualLoops, n.ActualRows, n.RemovedByFilter, nStages, capEach+1, capEach, where)
		}
	})
	if pendingScans != 1 {
		t.Errorf("plan reads queue_pending %d times, want once (per stage, under a Limit); %s", pendingScans, where)
	}
}

// resolveParams are the types of resolveSQL's parameters without the emits'
// ($1 to $19), for PREPARE.
// prepareClaim prepares claimSQL as "claim", for the tests that EXPLAIN it;
// prepareClaimLimits claimLimitsSQL as "claim_limits".
const (
	prepareClaim       = "PREPARE claim(text[], int[], bigint[], bigint[], text[], int, text[], bool, bigint) AS " + store.ClaimSQL
	prepareClaimLimits = "PREPARE claim_limits(text[], int[], bigint[], bigint[], text[], int, text[], bool, bigint, text[], bigint[], bigint[], text[], text[]) AS " + store.ClaimLimitsSQL
)

const resolveParams = "bigint[], text[], text[], text[], text[], text[], timestamptz[], text[], bool[], int[], " +
	"bool[], text[], timestamptz[], timestamptz[], int[], int[], bool[], bool, bigint"

// moveClaimArgs are resolveSQL's arguments without the emits for n items, ids
// first to first+n-1, each a move from stage a to b that claims its row there,
// as EXECUTE's argument list.
func moveClaimArgs(first, n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(first + i)
	}
	each := func(v string) string { return "'{" + strings.TrimSuffix(strings.Repeat(v+",", n), ",") + "}'" }
	return strings.Join([]string{"'{" + strings.Join(ids, ",") + "}'", each("a"), each("move"), each(`""`), each(`""`), each("b"), each("NULL"), each(`""`), each("true"), each("0"),
		each("false"), each(`""`), each("NULL"), each("NULL"), each("NULL"), each("0"), each("false"), "true", "7"}, ", ")
}

// resolveStatements are the resolve's six statement texts (with the emits'
// INSERT, keyed or not, and without it; each with its twin for a resolve
// that sends an item again), as the tests that EXPLAIN them prepare them
// (prepareResolves).
var resolveStatements = []resolveStatement{
	{"resolve", store.ResolveSQL, true, false},
	{"resolve_keyless", store.ResolveKeylessEmitsSQL, true, false},
	{"resolve_no_emits", store.ResolveNoEmitsSQL, false, false},
	{"resolve_again", store.ResolveAgainSQL, true, true},
	{"resolve_keyless_again", store.ResolveKeylessEmitsAgainSQL, true, true},
	{"resolve_no_emits_again", store.ResolveNoEmitsAgainSQL, false, true},
}

// resolveStatement is one of resolveStatements.
type resolveStatement struct {
	name, sql    string
	emits, again bool
}

// args are moveClaimArgs for n items from first, and no emits where the
// statement takes them.
func (r resolveStatement) args(first, n int) string {
	a := moveClaimArgs(first, n)
	if r.emits {
		a += ", '{}', '{}', '{}', '{}', '{}', '{}', '{}'"
	}
	return a
}

// prepareResolves is a PREPARE of each of resolveStatements.
func prepareResolves() []string {
	var sqls []string
	for _, r := range resolveStatements {
		params := resolveParams
		if r.emits {
			params += ", bigint[], text[], bytea[], text[], text[], text[], bool[]"
		}
		sqls = append(sqls, "PREPARE "+r.name+"("+params+") AS "+r.sql)
	}
	return sqls
}

// TestResolvePlanCostsItsItems checks that a resolve looks its items' rows up by
// id, whatever the planner believes: statistics taken on a fresh backlog say no
// row is running, and the queue_running index holds a dead entry for every
// claim since the last vacuum. Every read of the queue must have an index
// condition (no whole-index or sequential scan), and the statement's buffers
// must stay near the items' own, far below the dead entries' pages.
func TestResolvePlanCostsItsItems(t *testing.T) {
	t.Parallel()
	const backlog, churned, items = 100_000, 80_000, 128
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	sqls := []string{
		"ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)",
		fmt.Sprintf("INSERT INTO pepsi.queue (stage) SELECT 'a' FROM generate_series(1, %d)", backlog),
		"VACUUM ANALYZE pepsi.queue",
	}
	for range 3 { // three claims and requeues of most rows
		sqls = append(sqls,
			fmt.Sprintf("UPDATE pepsi.queue SET status = 'running' WHERE ingress_id <= %d", churned),
			fmt.Sprintf("UPDATE pepsi.queue SET status = 'pending' WHERE ingress_id <= %d", churned))
	}
	// The six statements: with the emits' INSERT, keyed or not (given
	// none), and without it; each with its twin for items sent again.
	sqls = append(sqls, fmt.Sprintf("UPDATE pepsi.queue SET status = 'running' WHERE ingress_id > %d AND ingress_id <= %d", churned, churned+items))
	execAll(t, conn, append(sqls, prepareResolves()...)...)
	var runs []struct{ stmt, mode, args string }
	for _, r := range resolveStatements {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			runs = append(runs, struct{ stmt, mode, args string }{r.name, mode, r.args(churned+1, items)})
		}
	}
	for _, run := range runs {
		// Each EXPLAIN ANALYZE runs in a transaction it rolls back, so every
		// run finds the items running.
		mode := run.stmt + ", " + run.mode
		plan := explain(t, conn, run.mode, run.stmt, run.args)
		blocks, lookups := 0.0, 0.0
		plan.walk(nil, func(n, _ *planNode) {
			if n.RelationName == "queue" && strings.Contains(n.NodeType, "Seq Scan") {
				t.Errorf("resolve plan has a %s on queue; %s:\n%s", n.NodeType, mode, plan)
			}
			if strings.HasPrefix(n.IndexName, "queue_") && n.IndexCond == "" {
				t.Errorf("resolve plan reads all of %s (%s, no index condition); %s:\n%s", n.IndexName, n.NodeType, mode, plan)
			}
			if n.RelationName == "queue" && strings.Contains(n.NodeType, "Index") {
				lookups += n.ActualLoops
			}
		})
		// Each item's row is looked up twice: as the statement's snapshot saw
		// it (the decision) and to update it. A row it updated is reported
		// from RETURNING, not looked up a third time (the single serial
		// transaction's backend is what limits the dispatcher's hops/s:
		// docs/performance.md).
		if lookups > 2*items {
			t.Errorf("resolve of %d items, all updated, looked rows up %g times; want at most %d; %s:\n%s", items, lookups, 2*items, mode, plan)
		}
		blocks = plan.SharedHit + plan.SharedRead
		// Three dead queue_running entries per churned row fill over 700 pages.
		if blocks > 10000 {
			t.Errorf("resolve of %d items read %g buffers; want at most 10000; %s:\n%s", items, blocks, mode, plan)
		}
		t.Logf("%s: resolve of %d items read %g buffers", mode, items, blocks)
	}
}

// A resolve reads pepsi.history only when it sends an item again: the check
// that keeps a re-sent pass from being recorded twice is a subplan over
// every partition of the history, which the executor sets up at every run
// of a statement that carries it, items sent again or not (docs/performance.md,
// "A transaction's fixed cost"). With eleven days kept, the plain statements
// hold no scan of a partition, and their twins for items sent again one of
// each (the conformance suite's AnItemSentAgainRecordsItsPassOnlyOnce checks
// that the twin is the one sent).
func TestAResolveReadsTheHistoryOnlyWhenItSendsAnItemAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn, append([]string{
		"SELECT pepsi.history_day(current_date - g, true) FROM generate_series(1, 7) g",
		"INSERT INTO pepsi.queue (stage, status) SELECT 'a', 'running' FROM generate_series(1, 4)",
	}, prepareResolves()...)...)
	var partitions int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pepsi.history'::regclass").Scan(&partitions); err != nil {
		t.Fatal(err)
	}
	if partitions < 11 {
		t.Fatalf("pepsi.history has %d partitions, want at least 11 (seven days back, today, three ahead)", partitions)
	}
	for _, r := range resolveStatements {
		want := 0 // scans of a history partition, at the least
		if r.again {
			want = partitions
		}
		plan := explain(t, conn, "force_generic_plan", r.name, r.args(1, 4))
		scans := 0
		plan.walk(nil, func(n, _ *planNode) {
			if strings.HasPrefix(n.RelationName, "history_") && strings.Contains(n.NodeType, "Scan") {
				scans++
			}
		})
		if (want == 0) != (scans == 0) || scans < want {
			t.Errorf("%s: %d scans of history partitions in its plan, want %d:\n%s", r.name, scans, want, plan)
		}
	}
}

// TestResolveAndWakeSetReadyAtAndFireNoTrigger checks that a resolve's moves
// to another stage and a wake make their rows ready anew themselves, and that
// no trigger fires for any row they write: since schema 27 the queue has none
// on UPDATE, and any row trigger cost each row version a lock and its WHEN
// clause's evaluation (docs/performance.md, "Schema 27"). Each statement is
// EXPLAIN ANALYZEd (which lists every trigger that fired, with its calls) in
// a transaction that reads ready_at back, then rolls back.
func TestResolveAndWakeSetReadyAtAndFireNoTrigger(t *testing.T) {
	t.Parallel()
	const items = 4
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn, append([]string{
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, status, ready_at) SELECT 'a', 'running', now() - interval '1 hour' FROM generate_series(1, %d)", items),
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, status, timeout, ready_at) SELECT 'c', 'paused', now() - interval '1 minute', now() - interval '1 hour' FROM generate_series(1, %d)", items),
		"PREPARE wake(timestamptz, bigint[], int) AS " + store.WakeSQL,
	}, prepareResolves()...)...)
	ctx := t.Context()
	rowTriggers := map[string]bool{}
	rows, err := conn.Query(ctx, `SELECT tgname FROM pg_trigger WHERE tgrelid = 'pepsi.queue'::regclass AND NOT tgisinternal AND tgtype & 1 = 1`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || !slices.Contains(names, "queue_traceparent_insert") {
		t.Fatalf("row triggers of pepsi.queue: %v, %v; want queue_traceparent_insert among them", names, err)
	}
	for _, n := range names {
		rowTriggers[n] = true
	}
	check := func(name, args, stage string) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // EXPLAIN ANALYZE really writes the rows: each statement starts from the same queue
		for trigger, calls := range firedTriggers(t, tx, fmt.Sprintf("EXECUTE %s(%s)", name, args)) {
			// (A statement that inserts emits fires the queue's two statement
			// triggers on INSERT, once, whether or not it inserts a row.)
			if rowTriggers[trigger] {
				t.Errorf("%s: row trigger %s fired %d times; want none", name, trigger, calls)
			}
		}
		var now, ready int
		if err := tx.QueryRow(ctx, "SELECT count(*) FILTER (WHERE ready_at = now()), count(*) FROM pepsi.queue WHERE stage = $1 AND status IN ('pending', 'running')", stage).Scan(&now, &ready); err != nil {
			t.Fatal(err)
		}
		if ready != items || now != items {
			t.Errorf("%s: %d rows ready at %s, %d of them since now; want all %d, all since now", name, ready, stage, now, items)
		}
	}
	for _, r := range resolveStatements {
		check(r.name, r.args(1, items), "b")
	}
	check("wake", "now(), '{}', 100", "c")
}

// firedTriggers EXPLAIN ANALYZEs statement in tx and returns the triggers
// that fired, with their calls. It fails t unless EXPLAIN's list of triggers
// is there to read: an insert with a traceparent, first, must show schema
// 23's check of it firing.
func firedTriggers(t *testing.T, tx pgx.Tx, statement string) map[string]int {
	t.Helper()
	read := func(statement string) map[string]int {
		var out []byte
		if err := tx.QueryRow(t.Context(), "EXPLAIN (ANALYZE, FORMAT JSON) "+statement).Scan(&out); err != nil {
			t.Fatalf("%s: %v", statement, err)
		}
		var plans []struct {
			Triggers []struct {
				Name  string `json:"Trigger Name"`
				Calls int    `json:"Calls"`
			}
		}
		if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
			t.Fatalf("%s: EXPLAIN's JSON %s: %v", statement, out, err)
		}
		fired := map[string]int{}
		for _, tr := range plans[0].Triggers {
			if tr.Calls > 0 {
				fired[tr.Name] += tr.Calls
			}
		}
		return fired
	}
	if got := read("INSERT INTO pepsi.queue (stage, status, traceparent) VALUES ('premise', 'done', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')"); got["queue_traceparent_insert"] != 1 {
		t.Fatalf("an insert with a traceparent fired %v; want queue_traceparent_insert once (EXPLAIN's trigger list is not read)", got)
	}
	return read(statement)
}

// TestAResolveKeepsReadyAtWhereItsRowIsNotReadyAnew checks the other side of
// TestResolveAndWakeSetReadyAtAndFireNoTrigger: a resolve sets ready_at only
// for a move to another stage, as schema 13's trigger did, and keeps it for a pass to
// done, a failure, a retry's pause and a move to the stage the row is at.
func TestAResolveKeepsReadyAtWhereItsRowIsNotReadyAnew(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	ids := h.Insert(t, "a", 4)
	if got := claimedIDs(mustExec(t, h, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 4}}}})[0]); len(got) != 4 {
		t.Fatalf("claimed %v, want the 4 rows", got)
	}
	h.exec(t, `UPDATE pepsi.queue SET ready_at = now() - interval '1 hour'`)
	items := []core.Item{
		{ID: ids[0], Stage: "a", Verdict: core.Move, To: core.TargetDone},
		{ID: ids[1], Stage: "a", Verdict: core.Fail, Reason: "broken"},
		{ID: ids[2], Stage: "a", Verdict: core.Retry, Reason: "later", Until: time.Now().Add(time.Hour)},
		{ID: ids[3], Stage: "a", Verdict: core.Move, To: "a"},
	}
	mustExec(t, h, []core.Command{core.Resolve{Op: 2, Items: items}})
	for _, it := range items {
		var status string
		var us int64
		if err := h.pool.QueryRow(ctx, `SELECT status, (extract(epoch FROM now() - ready_at) * 1e6)::bigint FROM pepsi.queue WHERE ingress_id = $1`, it.ID).Scan(&status, &us); err != nil {
			t.Fatal(err)
		}
		if age := time.Duration(us) * time.Microsecond; age < 59*time.Minute {
			t.Errorf("%s (%s to %q, now %s): ready %v ago; want the hour it had, kept", it.Verdict, it.Stage, it.To, status, age)
		}
	}
}

// TestKeyedMoveProbesItsKeyOnce checks that a resolve decides each keyed move
// that claims once: it asks each order-key index once per item whether an
// older message of the item's key is unfinished. The decision was once made
// anew for every use of it in the UPDATE's SET and RETURNING, eleven probes of
// each index per item, which made ordering per key cost more than the rest of
// the hop.
func TestKeyedMoveProbesItsKeyOnce(t *testing.T) {
	t.Parallel()
	const items = 128
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'k' || g FROM generate_series(1, %d) g", items),
		"UPDATE pepsi.queue SET status = 'running'",
		"VACUUM ANALYZE pepsi.queue",
		"PREPARE resolve_no_emits("+resolveParams+") AS "+store.ResolveNoEmitsSQL,
	)
	args := moveClaimArgs(1, items)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		plan := explain(t, conn, mode, "resolve_no_emits", args)
		probes := map[string]float64{}
		plan.walk(nil, func(n, _ *planNode) {
			if strings.HasPrefix(n.IndexName, "queue_order_") {
				probes[n.IndexName] += n.ActualLoops
			}
		})
		for _, index := range []string{"queue_order_live", "queue_order_blocked"} {
			if probes[index] == 0 || probes[index] > items {
				t.Errorf("resolve of %d keyed moves that claim probed %s %g times; want 1 to %d (once per item); %s:\n%s", items, index, probes[index], items, mode, plan)
			}
		}
	}
}

// TestResetAndWakePlansUsePartialIndexes checks that the start-up reset and the
// wake find their rows through the queue_running and queue_paused partial indexes,
// not by scanning a large backlog of pending rows.
func TestResetAndWakePlansUsePartialIndexes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	ctx := t.Context()
	execAll(t, conn,
		"ALTER TABLE pepsi.queue SET (autovacuum_enabled = false)",
		"INSERT INTO pepsi.queue (stage) SELECT 's' || (i % 3) FROM generate_series(1, 200000) i",
		"UPDATE pepsi.queue SET status = 'running' WHERE ingress_id % 4000 = 0",
		"UPDATE pepsi.queue SET status = 'paused', timeout = '2030-01-01'::timestamptz + (ingress_id % 7) * interval '1 hour' WHERE ingress_id % 2000 = 1",
		"SELECT pepsi.history_day('2030-01-01', true)", // the day of the rows the reset and the wake record
		"PREPARE reset(bigint[], timestamptz) AS "+store.ResetOrphansSQL,
		"PREPARE wake(timestamptz, bigint[], int) AS "+store.WakeSQL,
	)
	for _, stats := range []string{"without statistics", "analyzed"} {
		if stats == "analyzed" {
			if _, err := conn.Exec(ctx, "ANALYZE pepsi.queue"); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			for _, c := range []struct{ name, args, index string }{
				{"reset", "'{4000,8000}', '2030-01-01 03:30Z'", "queue_running"},
				{"wake", "'2030-01-01 03:30Z', '{2001,4001}', 2000", "queue_paused"},
			} {
				plan := explain(t, conn, mode, c.name, c.args)
				used := false
				plan.walk(nil, func(n, _ *planNode) {
					if n.RelationName == "queue" && strings.Contains(n.NodeType, "Seq Scan") {
						t.Errorf("%s plan has a %s on queue; %s, %s:\n%s", c.name, n.NodeType, stats, mode, plan)
					}
					used = used || n.IndexName == c.index
				})
				if !used {
					t.Errorf("%s plan does not use %s; %s, %s:\n%s", c.name, c.index, stats, mode, plan)
				}
			}
		}
	}
}

func TestFailedTransactionFailsEveryResult(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 3)
	// A constraint that refuses every outcome of the first row, its failure
	// too: the resolve fails the statement after the claim has taken its
	// rows, and the store cannot narrow it down (runNarrowed).
	h.exec(t, fmt.Sprintf(`ALTER TABLE pepsi.queue ADD CONSTRAINT test_refuses CHECK (status IN ('pending', 'running') OR ingress_id <> %d) NOT VALID`, ids[0]))
	cmds := func() []core.Command {
		return []core.Command{
			core.ResetOrphans{Op: 1},
			core.Claim{Op: 2, Caps: []core.Cap{{Stage: "a", N: 2}}},
			core.Resolve{Op: 3, Items: []core.Item{{ID: ids[0], Stage: "a", Verdict: core.Move, To: core.TargetDone}}},
			core.Wake{Op: 4, Now: time.Now()},
			core.Flush{Op: 5, Seq: 1, StagePasses: 1},
		}
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"a statement fails", context.Background(), "23514"}, // check_violation
		{"the context is cancelled", cancelled, "context canceled"},
	} {
		evs := h.Exec(c.ctx, cmds())
		if len(evs) != 5 {
			t.Fatalf("%s: Exec answered %d events, want 5", c.name, len(evs))
		}
		for i, ev := range evs {
			if opOf(ev) != int64(i+1) || !strings.Contains(errText(ev), c.want) {
				t.Errorf("%s: result %d = %v; want op=%d with an error mentioning %q", c.name, i, ev, i+1, c.want)
			}
		}
		// Nothing of the transaction is left: the claim was rolled back.
		for _, id := range ids {
			if _, status, _, _, _ := h.Row(t, id); status != "pending" {
				t.Errorf("%s: row %d is %s, want pending (the failed claim rolled back)", c.name, id, status)
			}
		}
	}
	// The connection the failed batch used is usable again.
	evs := mustExec(t, h, []core.Command{core.Claim{Op: 6, Caps: []core.Cap{{Stage: "a", N: 1}}}})
	if got := claimedIDs(evs[0]); len(got) != 1 || got[0] != ids[0] {
		t.Fatalf("claim after the failures took %v, want [%d]", got, ids[0])
	}

	h.pool.Close()
	evs = h.Exec(context.Background(), cmds())
	for i, ev := range evs {
		if opOf(ev) != int64(i+1) || errText(ev) == "" {
			t.Errorf("closed pool: result %d = %v; want op=%d with an error", i, ev, i+1)
		}
	}
}

// TestRetriesSerializationFailuresAndDeadlocks injects failures with a trigger
// that raises a chosen SQLSTATE on the first N wakes (a sequence counts attempts,
// since it is not rolled back with them). The step also flushes statistics, to
// show an attempt that failed left nothing behind.
func TestRetriesSerializationFailuresAndDeadlocks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code         string
		failures     int
		wantAttempts int64
		wantOK       bool
	}{
		{"40001", 1, 2, true},   // serialization_failure: retried
		{"40P01", 2, 3, true},   // deadlock_detected: retried
		{"40001", 99, 5, false}, // gives up after 5 attempts
		{"P0001", 1, 1, false},  // raise_exception: not retried
		{"40003", 1, 1, false},  // statement_completion_unknown: not retried
	} {
		t.Run(fmt.Sprintf("%s×%d", c.code, c.failures), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			h.exec(t, "CREATE SEQUENCE test_attempts")
			h.exec(t, fmt.Sprintf(`CREATE FUNCTION test_fail() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					IF nextval('test_attempts') <= %d THEN
						RAISE EXCEPTION 'injected failure' USING ERRCODE = '%s';
					END IF;
					RETURN NULL;
				END $$`, c.failures, c.code))
			h.exec(t, "CREATE TRIGGER test_fail BEFORE UPDATE ON pepsi.queue FOR EACH STATEMENT EXECUTE FUNCTION test_fail()")

			evs := h.Exec(t.Context(), []core.Command{
				core.Flush{Op: 1, Seq: 1, StagePasses: 1},
				core.Wake{Op: 2, Now: time.Now()},
			})
			var attempts int64
			if err := h.pool.QueryRow(t.Context(), "SELECT last_value FROM test_attempts").Scan(&attempts); err != nil {
				t.Fatal(err)
			}
			if attempts != c.wantAttempts {
				t.Errorf("ran the transaction %d times, want %d", attempts, c.wantAttempts)
			}
			for _, ev := range evs {
				msg := errText(ev)
				if (msg == "") != c.wantOK || (!c.wantOK && !strings.Contains(msg, c.code)) {
					t.Errorf("result %v; want success %v (else an error naming %s)", ev, c.wantOK, c.code)
				}
				if gaveUp := strings.Contains(msg, "gave up after 5 attempts"); gaveUp != (c.wantAttempts == 5) {
					t.Errorf("result %v; want it to say it gave up after 5 attempts only when it did", ev)
				}
			}
			d, err := h.ReadDispatchStats(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int64{true: 1, false: 0}[c.wantOK]; d.StagePasses != want {
				t.Errorf("stage_passes = %d after the step, want %d (applied once, or not at all)", d.StagePasses, want)
			}
		})
	}
}

func TestRetryableOnlyForSerializationFailureAndDeadlock(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{fmt.Errorf("claim: %w", &pgconn.PgError{Code: "40001"}), true},
		{&pgconn.PgError{Code: "40003"}, false},
		{&pgconn.PgError{Code: "23505"}, false},
		{errors.New("ERROR: could not serialize access (SQLSTATE 40001)"), false},
		{context.Canceled, false},
		{nil, false},
	} {
		if got := store.Retryable(c.err); got != c.want {
			t.Errorf("Retryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestRefusedOnlyForTheDataItself: a data exception, a constraint or a
// program limit fails the same way at every try; a lost connection, a
// serialization failure or a shutdown do not.
func TestRefusedOnlyForTheDataItself(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "22021"}, true},
		{fmt.Errorf("resolve: %w", &pgconn.PgError{Code: "22003"}), true},
		{&pgconn.PgError{Code: "23514"}, true},
		{&pgconn.PgError{Code: "54001"}, true},
		{&pgconn.PgError{Code: "40001"}, false},
		{&pgconn.PgError{Code: "57P01"}, false},
		{&pgconn.PgError{Code: "08006"}, false},
		{errors.New("ERROR: value overflows numeric format (SQLSTATE 22003)"), false},
		{nil, false},
	} {
		if got := store.Refused(c.err); got != c.want {
			t.Errorf("Refused(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestWakeNotifiesIngressOnlyWhenItWokeRows: any tool that makes rows pending
// notifies ingress; a wake that found nothing due does not.
func TestWakeNotifiesIngressOnlyWhenItWokeRows(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	listener := pgtest.Listen(t, h.url)
	other := pgtest.Connect(t, h.url)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	holdGate(t, h.url) // a dispatcher waits: inserts notify
	ids := h.Insert(t, "a", 1)
	if n, err := listener.WaitForNotification(ctx); err != nil || n.Payload != "" {
		t.Fatalf("insert notification = %v, %v; want one with an empty payload", n, err)
	}
	mustExec(t, h, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 1}}}})
	h.Stage(t, ids[0], "a", "a", "paused", time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))

	mustExec(t, h, []core.Command{core.Wake{Op: 2, Now: time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC)}})
	if _, err := other.Exec(ctx, "SELECT pg_notify('ingress', 'marker')"); err != nil {
		t.Fatal(err)
	}
	if n, err := listener.WaitForNotification(ctx); err != nil || n.Payload != "marker" {
		t.Fatalf("after a wake that woke nothing, first notification = %v, %v; want the marker (no notify from the wake)", n, err)
	}

	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	evs := mustExec(t, h, []core.Command{core.KeepHistory{Op: 4, From: at, Now: at, Through: at}, core.Wake{Op: 3, Now: at}})
	if w := evs[1].(core.Woken); w.Count != 1 {
		t.Fatalf("wake = %v, want count 1", w)
	}
	if n, err := listener.WaitForNotification(ctx); err != nil || n.Payload != "" || n.Channel != "ingress" {
		t.Fatalf("after a wake that woke a row, notification = %v, %v; want one on ingress", n, err)
	}
}

// TestStateThatIsNotAnObjectIsWrapped: a stage may store any JSON in state; a
// failure reason must still be recorded, and must not fail the whole step.
func TestStateThatIsNotAnObjectIsWrapped(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 1)
	h.exec(t, `UPDATE pepsi.queue SET state = '[1, 2]' WHERE ingress_id = $1`, ids[0])
	mustExec(t, h, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 1}}}})
	evs := mustExec(t, h, []core.Command{core.Resolve{Op: 2, Items: []core.Item{{ID: ids[0], Stage: "a", Verdict: core.Fail, Reason: "boom"}}}})
	if o := evs[0].(core.Resolved).Outcomes[0]; o.Status != "failed" || o.Error != "boom" {
		t.Fatalf("outcome = %v, want failed with error boom", o)
	}
	var state string
	if err := h.pool.QueryRow(t.Context(), "SELECT state::text FROM pepsi.queue WHERE ingress_id = $1", ids[0]).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if want := `{"state": [1, 2], "dispatch_error": "boom"}`; state != want {
		t.Fatalf("state = %s, want %s", state, want)
	}
}

// BenchmarkStep measures the dispatcher's usual step, resolving 48 items and
// claiming 3 stages × 16, on a queue with a backlog. The resolve requeues the rows
// the previous step claimed, so the backlog stays the same size.
func BenchmarkStep(b *testing.B) {
	h := newHarness(b)
	stages := []string{"s0", "s1", "s2"}
	if _, err := h.pool.Exec(b.Context(),
		"INSERT INTO pepsi.queue (stage) SELECT 's' || (i % 3) FROM generate_series(1, 30000) i"); err != nil {
		b.Fatal(err)
	}
	if _, err := h.pool.Exec(b.Context(), "VACUUM ANALYZE pepsi.queue"); err != nil {
		b.Fatal(err)
	}
	var prev []int64
	op := int64(0)
	run := func() {
		// Every item names stage s0; for rows of s1 and s2 that reads as "the stage
		// advanced it", which requeues them just the same.
		evs := mustExec(b, h, step(op, prev, stages, 16))
		op += 2
		prev = claimedIDs(evs[1])
		if len(prev) != 48 {
			b.Fatalf("step claimed %d rows, want 48", len(prev))
		}
	}
	run() // prepares the statements on the connection
	before, n := h.trips.Load(), 0
	for b.Loop() {
		run()
		n++
	}
	b.ReportMetric(float64(h.trips.Load()-before)/float64(n), "round-trips/op")
}

// The reset forgets the flush marks of dispatcher lives not heard of for 30
// days, and keeps younger ones: a life still running may yet send a flush
// again, and must find its mark.
func TestResetForgetsFlushMarksOfLivesGoneFor30Days(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.exec(t, `INSERT INTO pepsi.stats_flushes (life, seq, updated_at) VALUES
		(1, 7, now() - interval '31 days'), (2, 9, now() - interval '29 days'), (3, 4, now())`)
	mustExec(t, h, []core.Command{core.ResetOrphans{Op: 1}})
	rows, err := h.pool.Query(t.Context(), `SELECT life FROM pepsi.stats_flushes ORDER BY life`)
	if err != nil {
		t.Fatal(err)
	}
	lives, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(lives) != "[2 3]" {
		t.Errorf("lives with flush marks after the reset: %v; want [2 3] (life 1, last heard of 31 days ago, forgotten)", lives)
	}
}

// A stage may pause a row until 'infinity' (for good: an operator retries it)
// or '-infinity' (due at once), timestamps no time.Time holds. Reading such a
// row must not fail the step, or the dispatcher would fail every step that
// wakes or resolves it and stop: the wake passes over 'infinity' (never due,
// no next) and wakes '-infinity', and a resolve reports the row paused with
// no due time.
func TestARowPausedUntilInfinityDoesNotFailTheStep(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 3)
	h.exec(t, `UPDATE pepsi.queue SET status = 'running' WHERE ingress_id = ANY ($1)`, ids)
	h.exec(t, `UPDATE pepsi.queue SET status = 'paused', timeout = 'infinity' WHERE ingress_id = $1`, ids[0])
	h.exec(t, `UPDATE pepsi.queue SET status = 'paused', timeout = '-infinity' WHERE ingress_id = $1`, ids[1])
	now := time.Now()
	ctx := context.Background()

	o := h.Exec(ctx, []core.Command{core.Resolve{Op: 1, Items: []core.Item{
		{ID: ids[0], Stage: "a", Verdict: core.Answered, Reason: "r"},
		{ID: ids[1], Stage: "a", Verdict: core.Answered, Reason: "r"},
	}}})[0].(core.Resolved)
	if o.Err != "" || o.Outcomes[0].Status != core.StatusPaused || !o.Outcomes[0].Timeout.IsZero() {
		t.Fatalf("resolve of a row paused until infinity: %+v; want it paused, with no due time", o)
	}
	if due := o.Outcomes[1].Timeout; o.Outcomes[1].Status != core.StatusPaused || due.IsZero() || !due.Before(now) {
		t.Fatalf("resolve of a row paused until -infinity: %+v; want it paused, due already", o.Outcomes[1])
	}
	w := h.Exec(ctx, []core.Command{core.Wake{Op: 2, Now: now}})[0].(core.Woken)
	if w.Err != "" || w.Count != 1 || !w.Next.IsZero() {
		t.Fatalf("wake: %+v; want the row paused until -infinity woken, and no next (infinity is never due)", w)
	}
	for i, want := range []string{"paused", "pending"} {
		var status string
		if err := h.pool.QueryRow(ctx, `SELECT status FROM pepsi.queue WHERE ingress_id = $1`, ids[i]).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status != want {
			t.Errorf("row %d, paused until %s, is %s after the wake; want %s", ids[i], []string{"infinity", "-infinity"}[i], status, want)
		}
	}
}
