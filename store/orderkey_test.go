package store_test

import (
	"context"
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

// TestProducersOfTwoKeysInOppositeOrdersBothCommit forces the interleaving
// that deadlocks producers whose rows take their keys' locks in the order of
// the rows: a transaction holds the locks of keys a and b while two batches
// start, one inserting a then b, the other b then a; then it commits. Were
// each lock taken as its row is inserted, the first batch would hold a and
// wait for b while the second held b and waited for a, and PostgreSQL would
// abort one of them. PEPSI's inserts take the locks in the order of the keys'
// buckets before the first row, so both commit, each with its ids in the
// order given, and of each key's two rows the second is blocked behind the
// first.
func TestProducersOfTwoKeysInOppositeOrdersBothCommit(t *testing.T) {
	t.Parallel()
	produce := map[string]func(ctx context.Context, h *harness, keys []string) ([]int64, error){
		"InsertIngress": func(ctx context.Context, h *harness, keys []string) ([]int64, error) {
			rows := make([]store.IngressRow, len(keys))
			for i, k := range keys {
				rows[i] = store.IngressRow{Stage: "a", OrderKey: k}
			}
			return h.InsertIngress(ctx, rows)
		},
		"InsertIngressWithIdempotencyKeys": func(ctx context.Context, h *harness, keys []string) ([]int64, error) {
			rows := make([]store.IngressRow, len(keys))
			for i, k := range keys {
				dedup := keys[0] + "-" + k
				rows[i] = store.IngressRow{Stage: "a", OrderKey: k, Key: &dedup}
			}
			return h.InsertIngress(ctx, rows)
		},
		"Enqueue": func(ctx context.Context, h *harness, keys []string) ([]int64, error) {
			r, err := h.Enqueue(ctx, store.EnqueueParams{Stage: "a", Payloads: make([][]byte, len(keys)), States: make([]string, len(keys)), OrderKeys: keys})
			return []int64{r.First, r.Last}, err
		},
	}
	for name, insert := range produce {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var distinct bool
			if err := h.pool.QueryRow(ctx, `SELECT pepsi.order_bucket('a') <> pepsi.order_bucket('b')`).Scan(&distinct); err != nil || !distinct {
				t.Fatalf("keys a and b share a bucket (%v): the test needs two locks", err)
			}
			blocker := pgtest.Connect(t, h.url)
			tx, err := blocker.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op once committed
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1885696107, pepsi.order_bucket(k)) FROM unnest('{a,b}'::text[]) k`); err != nil {
				t.Fatal(err)
			}
			type result struct {
				ids []int64
				err error
			}
			first, second := make(chan result, 1), make(chan result, 1)
			go func() { ids, err := insert(ctx, h, []string{"a", "b"}); first <- result{ids, err} }()
			waitForLockWaits(t, h, 1)
			go func() { ids, err := insert(ctx, h, []string{"b", "a"}); second <- result{ids, err} }()
			waitForLockWaits(t, h, 2)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			for _, c := range []chan result{first, second} {
				r := <-c
				if r.err != nil {
					t.Fatalf("a batch failed: %v; want both to commit", r.err)
				}
				if !slices.IsSorted(r.ids) || r.ids[0] == r.ids[1] {
					t.Errorf("a batch answered ids %v; want them in the order given", r.ids)
				}
			}
			var pending, blocked int
			if err := h.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'blocked')
				FROM pepsi.queue`).Scan(&pending, &blocked); err != nil {
				t.Fatal(err)
			}
			if pending != 2 || blocked != 2 {
				t.Errorf("%d pending and %d blocked rows; want each key's first pending and its second blocked", pending, blocked)
			}
		})
	}
}

// waitForLockWaits returns once n sessions of h's database wait for a lock.
func waitForLockWaits(t *testing.T, h *harness, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		err := h.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions wait for a lock after 20 s; want %d", waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestARetryOfTwoKeysAndAProducerOfThemBothCommit forces the same
// interleaving between an operator's retry, whose release takes the locks of
// the keys it touched, and a producer of the same two keys: keys whose text
// sorts one way and whose buckets the other, as pepsi.order_release (in the
// order of the text) and the producers (in the order of the buckets) would
// each take one and wait for the other. The retry takes them in the
// producers' order, so both commit.
func TestARetryOfTwoKeysAndAProducerOfThemBothCommit(t *testing.T) {
	t.Parallel()
	operatorAndProducer(t, func(ctx context.Context, h *harness, _ []string) error {
		_, err := h.Retry(ctx, store.RetryParams{Stage: "a", Statuses: []core.RowStatus{core.StatusFailed}})
		return err
	})
}

// TestAToolsReleaseOfTwoKeysAndAProducerOfThemBothCommit is the same race
// for a tool of an operator's own that calls pepsi.order_release(keys, true)
// after its change, as docs/protocol.md asks: schema 15's release takes the
// keys' locks in bucket order, as producers do (schema 12's took them in the
// keys' text order, and one of the two was aborted: deadlock detected).
func TestAToolsReleaseOfTwoKeysAndAProducerOfThemBothCommit(t *testing.T) {
	t.Parallel()
	operatorAndProducer(t, func(ctx context.Context, h *harness, keys []string) error {
		var n int64
		return h.pool.QueryRow(ctx, `SELECT count(*) FROM pepsi.order_release($1::text[], true)`, keys).Scan(&n)
	})
}

// operatorAndProducer races an operator's act on two keys x < y whose
// buckets are in the other order against a producer inserting both: a
// transaction holds both keys' locks while the operator's act starts, then
// the producer's insert, then it commits; both must commit.
func operatorAndProducer(t *testing.T, operator func(ctx context.Context, h *harness, keys []string) error) {
	t.Helper()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var x, y string
	if err := h.pool.QueryRow(ctx, `SELECT a.k, b.k FROM generate_series(0, 99) i, LATERAL (SELECT 'k' || i AS k) a,
		generate_series(0, 99) j, LATERAL (SELECT 'k' || j AS k) b
		WHERE a.k < b.k AND pepsi.order_bucket(a.k) > pepsi.order_bucket(b.k) LIMIT 1`).Scan(&x, &y); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `INSERT INTO pepsi.queue (stage, status, order_key) VALUES ('a', 'failed', $1), ('a', 'failed', $2)`, x, y); err != nil {
		t.Fatal(err)
	}
	blocker := pgtest.Connect(t, h.url)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op once committed
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1885696107, pepsi.order_bucket(k)) FROM unnest($1::text[]) k`, []string{x, y}); err != nil {
		t.Fatal(err)
	}
	operated, produced := make(chan error, 1), make(chan error, 1)
	go func() { operated <- operator(ctx, h, []string{x, y}) }()
	waitForLockWaits(t, h, 1)
	go func() {
		_, err := h.Enqueue(ctx, store.EnqueueParams{Stage: "a", Payloads: make([][]byte, 2), States: make([]string, 2), OrderKeys: []string{x, y}})
		produced <- err
	}()
	waitForLockWaits(t, h, 2)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-operated; err != nil {
		t.Errorf("the operator's act: %v; want it to commit", err)
	}
	if err := <-produced; err != nil {
		t.Errorf("enqueue: %v; want it to commit", err)
	}
}

// TestSchema14GrantsTheOrderKeyToAnExistingMonitorRole: a pepsi_monitor
// role made with the grants pepsi-httpd(8) gave before version 14 may read
// order_key once the schema is migrated, as pepsi-httpd's count of the keys
// waiting needs. (The role is the server's, not the database's:
// pgtest.MonitorRole makes it when it is missing, and leaves it.)
func TestSchema14GrantsTheOrderKeyToAnExistingMonitorRole(t *testing.T) {
	t.Parallel()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	ctx := t.Context()
	pgtest.MonitorRole(t, conn)
	if _, err := store.MigrateTo(ctx, conn, 13); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `REVOKE SELECT (order_key) ON pepsi.queue FROM pepsi_monitor`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.MigrateTo(ctx, conn, 14); err != nil {
		t.Fatal(err)
	}
	var may bool
	if err := conn.QueryRow(ctx, `SELECT has_column_privilege('pepsi_monitor', 'pepsi.queue', 'order_key', 'SELECT')`).Scan(&may); err != nil || !may {
		t.Errorf("pepsi_monitor may read order_key after schema 14: %v, %v; want true", may, err)
	}
}

// TestReleaseCostsItsKeysNotABacklog checks that the release after a
// transaction's keyed passes costs its keys, not the messages that wait
// behind other keys, whatever the statistics the plan was made from: they
// are taken while no message is blocked (a fresh queue), and then one key's
// backlog of 50,000 arrives, with 20,000 pending keyed messages. Every read
// of an order-key index must be a probe of a key the release names (no
// hashed subplan reading a whole index), and a key whose move claimed its row
// (a Behind entry whose row is running) must cost neither a probe nor a lock.
func TestReleaseCostsItsKeysNotABacklog(t *testing.T) {
	t.Parallel()
	const backlog, claimed = 50000, 100
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	ctx := t.Context()
	execAll(t, conn,
		"INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'k' || g FROM generate_series(1, 1000) g",
		"UPDATE pepsi.queue SET status = 'done'",
		"VACUUM ANALYZE pepsi.queue",
		"PREPARE release(text[], text[], bigint[]) AS "+store.ReleaseSQL,
		"PREPARE release_lock(text[], text[], bigint[]) AS "+store.ReleaseLockSQL,
		// After the statistics: the rows of the moves that claimed, a
		// paused head with its key's backlog behind it, and many keys'
		// pending messages.
		fmt.Sprintf("UPDATE pepsi.queue SET status = 'running', stage = 'b' WHERE order_key IN (SELECT 'k' || g FROM generate_series(1, %d) g)", claimed),
		"INSERT INTO pepsi.queue (stage, order_key, status, timeout) VALUES ('a', 'hot', 'paused', 'infinity')",
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'hot' FROM generate_series(1, %d)", backlog),
		"INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'p' || g FROM generate_series(1, 20000) g",
	)
	var blocked int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pepsi.queue WHERE status = 'blocked'").Scan(&blocked); err != nil || blocked != backlog {
		t.Fatalf("%d blocked messages (%v); want the backlog's %d", blocked, err, backlog)
	}
	// Three finished keys, and the Behind entries of the claimed moves.
	var behindKeys, behindIDs string
	if err := conn.QueryRow(ctx, `SELECT array_agg(order_key ORDER BY ingress_id)::text, array_agg(ingress_id ORDER BY ingress_id)::text
		FROM pepsi.queue WHERE status = 'running'`).Scan(&behindKeys, &behindIDs); err != nil {
		t.Fatal(err)
	}
	args := "'{k901,k902,k903}', '" + behindKeys + "', '" + behindIDs + "'"
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		plan := explain(t, conn, mode, "release", args)
		probes, read, whole := orderKeyReads(plan)
		for _, index := range whole {
			t.Errorf("%s: %s read with no index condition (the whole index); want a probe per key:\n%s", mode, index, plan)
		}
		if probes > 6 || read > 0 {
			t.Errorf("%s: the release of 3 finished keys and %d claimed moves probed the order-key indexes %g times and read %g entries; want at most 6 probes (two per finished key) and none read:\n%s",
				mode, claimed, probes, read, plan)
		}
	}
	// The lock statement locks the finished keys' buckets, not the claimed
	// moves'.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // only the locks it takes matter
	if _, err := tx.Exec(ctx, "EXECUTE release_lock("+args+")"); err != nil {
		t.Fatal(err)
	}
	var locks, want int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885696107 AND pid = pg_backend_pid()`).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT count(DISTINCT pepsi.order_bucket(k)) FROM unnest('{k901,k902,k903}'::text[]) k`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if locks != want {
		t.Errorf("the release's lock statement took %d key locks; want %d, the finished keys' buckets (none for the %d claimed moves)", locks, want, claimed)
	}
}

// TestClaimCostsItsKeysNotABacklog checks that the claim's checks of a keyed
// row (no older message of its key unfinished: one probe of each order-key
// index) stay probes whatever the statistics its plan was made from said:
// made while no message was blocked, then run beside one key's 50,000
// blocked messages and 20,000 pending messages of other keys, a plan that
// hashed those checks would read every entry of both indexes in every claim,
// and one key's backlog would slow everybody's claims (the release's bug of
// 4 December, TestReleaseCostsItsKeysNotABacklog). PostgreSQL hashes a
// subplan correlated by equality alone; the claim's checks also compare
// ingress_id (an older message of the key), which keeps them probes.
func TestClaimCostsItsKeysNotABacklog(t *testing.T) {
	t.Parallel()
	const backlog, capA = 50000, 100
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		"INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'k' || g FROM generate_series(1, 1000) g",
		"UPDATE pepsi.queue SET status = 'done'",
		"VACUUM ANALYZE pepsi.queue",
		prepareClaim,
		// After the statistics: a paused head with its key's backlog behind
		// it, and many keys' pending messages.
		"INSERT INTO pepsi.queue (stage, order_key, status, timeout) VALUES ('a', 'hot', 'paused', 'infinity')",
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'hot' FROM generate_series(1, %d)", backlog),
		"INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'p' || g FROM generate_series(1, 20000) g",
	)
	var blocked int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pepsi.queue WHERE status = 'blocked'").Scan(&blocked); err != nil || blocked != backlog {
		t.Fatalf("%d blocked messages (%v); want the backlog's %d", blocked, err, backlog)
	}
	args := fmt.Sprintf("'{a}', '{%d}', '{0}', '{}', '{}', 0, '{}', false, 7", capA)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		plan := explain(t, conn, mode, "claim", args)
		var claimed float64
		plan.walk(nil, func(n, _ *planNode) {
			if n.NodeType == "ModifyTable" {
				claimed += n.ActualRows
			}
			if n.NodeType == "Seq Scan" && n.RelationName == "queue" {
				t.Errorf("%s: the claim reads pepsi.queue whole (a sequential scan); want index walks and probes:\n%s", mode, plan)
			}
		})
		probes, read, whole := orderKeyReads(plan)
		for _, index := range whole {
			t.Errorf("%s: %s read with no index condition (the whole index); want a probe per candidate:\n%s", mode, index, plan)
		}
		if claimed != capA {
			t.Errorf("%s: the claim took %g rows; want its cap, %d (every pending message is its key's oldest):\n%s", mode, claimed, capA, plan)
		}
		if probes < 2*capA || probes > 2*(capA+1) || read > 0 {
			t.Errorf("%s: a claim of %d keyed messages, each its key's oldest, probed the order-key indexes %g times and read %g entries; want two probes per candidate (%d to %d) and none read:\n%s",
				mode, capA, probes, read, 2*capA, 2*(capA+1), plan)
		}
	}
}

// orderKeyReads sums a plan's reads of the order-key indexes (schema 12):
// how many times they were probed (loops), how many entries the probes
// returned, and which of them were read with no index condition, whole.
func orderKeyReads(plan *planNode) (probes, read float64, whole []string) {
	plan.walk(nil, func(n, _ *planNode) {
		if strings.HasPrefix(n.IndexName, "queue_order_") {
			probes += n.ActualLoops
			read += n.ActualRows * n.ActualLoops
			if n.IndexCond == "" {
				whole = append(whole, n.IndexName)
			}
		}
	})
	return probes, read, whole
}

// The release of a key whose head waits (here: blocked behind a message just
// done) finds the head, and asks whether a message of the key runs
// elsewhere, with probes of the key's entries in the order-key indexes
// (schema 28): it reads no entry of queue_running (every key's running rows)
// and walks no range of the primary key. Before schema 28, with the
// statistics a run starts with, PostgreSQL answered the second question by
// reading every entry of queue_running and filtering by key (here 2,000;
// 156 µs per key released in pepsi-bench's 1,000 keys × 100 messages,
// docs/performance.md), and found a blocked head by walking the primary key
// from the queue's oldest row (here about 3,400 entries, dead ones included).
func TestReleaseAsksForItsKeysRunningMessageNotEveryRunningRow(t *testing.T) {
	t.Parallel()
	const others = 2000 // running rows of other keys
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		// 20 keys of 100 messages each, and key k's two.
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'b', 'r' || (g %% 20) FROM generate_series(1, %d) g", others),
		"INSERT INTO pepsi.queue (stage, order_key) VALUES ('a', 'k'), ('a', 'k')",
		// The statistics of a queue before a run, nothing running yet (as
		// the dispatcher's start-up vacuum leaves them: a generic plan then
		// costs queue_running's entries at none), then the run's rows.
		"ANALYZE pepsi.queue",
		"UPDATE pepsi.queue SET status = 'running' WHERE order_key <> 'k'",
		"UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = (SELECT min(ingress_id) FROM pepsi.queue WHERE order_key = 'k')",
		"SET plan_cache_mode = force_generic_plan", // as the dispatcher's sessions
	)
	read := releaseKCounting(t, conn, "pepsi.queue_running", "pepsi.queue_pkey")
	running, pkey := read[0], read[1]
	if running > 0 {
		t.Errorf("the release of one key read %d entries of queue_running (%d running rows of other keys); want none", running, others)
	}
	// One entry: the head's own, found by its id to make it pending.
	if pkey > 1 {
		t.Errorf("the release of one key read %d entries of the primary key; want 1 (the head's, by its id)", pkey)
	}
}

// A release promotes its keys' heads by their ids, whatever the statistics
// its plan was made with. Schema 29's promotion, spelled "status =
// 'blocked'", matched the predicate of queue_order_blocked: a generic plan
// made while the queue had few blocked rows read that whole index, with the
// heap row of every blocked message, in each release once a backlog had come
// (a review measured 201,063 buffers and 82 ms to release one key beside
// 199,000 blocked messages).
func TestReleasePromotesItsHeadsByIDNotThroughEveryBlockedRow(t *testing.T) {
	t.Parallel()
	const backlog = 4000 // messages of 20 other keys, all but 20 blocked
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		// 1,000 messages of keys of their own, and key k's two.
		"INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'o' || g FROM generate_series(1, 1000) g",
		"INSERT INTO pepsi.queue (stage, order_key) VALUES ('a', 'k'), ('a', 'k')",
		"ANALYZE pepsi.queue",                      // one blocked row of 1,002
		"SET plan_cache_mode = force_generic_plan", // as the dispatcher's sessions
		// The release's plans are made now, with those statistics: k's head
		// is pending, so it is reported and nothing is written.
		"SELECT * FROM pepsi.order_release(ARRAY['k'], false)",
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'r' || (g %% 20) FROM generate_series(1, %d) g", backlog),
		"UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = (SELECT min(ingress_id) FROM pepsi.queue WHERE order_key = 'k')",
	)
	blocked := releaseKCounting(t, conn, "pepsi.queue_order_blocked")[0]
	// One entry: the head's own, found by the head's look-up.
	if blocked > 1 {
		t.Errorf("the release of one key read %d entries of queue_order_blocked (%d blocked rows of other keys); want 1 (its head's)", blocked, backlog-20)
	}
}

// A key one of whose younger messages runs while its head waits pending (a
// state the dispatcher's own writes do not make, but a tool of one's own or
// a stage's write may) is held: a release, here of it beside another key,
// hands it to nobody and puts its waiting head behind the running message,
// while the other key is handed on.
func TestAReleaseHandsAHeldKeyToNobodyBesideAKeyItHandsOn(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	ctx := t.Context()
	execAll(t, conn,
		"INSERT INTO pepsi.queue (stage, order_key) VALUES ('a', 'held'), ('a', 'held'), ('a', 'k'), ('a', 'k')",
		"UPDATE pepsi.queue SET status = 'running', stage = 'b' WHERE ingress_id = (SELECT max(ingress_id) FROM pepsi.queue WHERE order_key = 'held')",
		"UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = (SELECT min(ingress_id) FROM pepsi.queue WHERE order_key = 'k')",
	)
	var head, next int64
	if err := conn.QueryRow(ctx, `SELECT min(ingress_id) FILTER (WHERE order_key = 'held'), max(ingress_id) FILTER (WHERE order_key = 'k') FROM pepsi.queue`).Scan(&head, &next); err != nil {
		t.Fatal(err)
	}
	var got []string
	rows, err := conn.Query(ctx, `SELECT format('%s %s %s %s', order_key, busy, ingress_id, status) FROM pepsi.order_release(ARRAY['held', 'k'], false)`)
	if err == nil {
		got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatalf("release of held and k: %v", err)
	}
	if want := []string{fmt.Sprintf("k f %d pending", next)}; !slices.Equal(got, want) {
		t.Errorf("release of held and k = %q; want only k's next message, %q", got, want)
	}
	var status string
	if err := conn.QueryRow(ctx, `SELECT status FROM pepsi.queue WHERE ingress_id = $1`, head).Scan(&status); err != nil || status != "blocked" {
		t.Errorf("held's waiting head %d is %q, %v; want blocked behind its running message", head, status, err)
	}
}

// releaseKCounting releases key k on conn, checks that the release made the
// key's youngest message its head, pending, and returns the entries of each
// index of indexes the release read.
func releaseKCounting(t *testing.T, conn *pgx.Conn, indexes ...string) []int64 {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // only what it reads matters
	var want int64
	if err := tx.QueryRow(ctx, `SELECT max(ingress_id) FROM pepsi.queue WHERE order_key = 'k'`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	counters := make([]string, len(indexes))
	for i, index := range indexes {
		counters[i] = entriesOf(index)
	}
	var head int64
	var status string
	read := readsOf(t, tx, func() {
		if err := tx.QueryRow(ctx, `SELECT ingress_id, status FROM pepsi.order_release(ARRAY['k'], false)`).Scan(&head, &status); err != nil {
			t.Fatalf("release of key k: %v", err)
		}
	}, counters...)
	if head != want || status != "pending" {
		t.Fatalf("release of key k made %d %s its head; want %d (the key's next message) pending", head, status, want)
	}
	return read
}

// The session's read counters that readsOf takes: the sequential scans of
// pepsi.queue and the rows they read, and (entriesOf) an index's entries.
const (
	seqScans = "pg_stat_get_xact_numscans('pepsi.queue'::regclass)"
	seqRows  = "pg_stat_get_xact_tuples_returned('pepsi.queue'::regclass)"
)

// entriesOf is the counter of the entries the session read from index.
func entriesOf(index string) string {
	return "pg_stat_get_xact_tuples_returned('" + index + "'::regclass)"
}

// readsOf runs do, whose statements run in tx, and returns how much each of
// the session's counters grew meanwhile. The counters hold what the session
// read since it last reported them, the set-up's statements too: do's reads
// are the difference, within one transaction.
func readsOf(t *testing.T, tx pgx.Tx, do func(), counters ...string) []int64 {
	t.Helper()
	read := func() []int64 {
		n := make([]int64, len(counters))
		dest := make([]any, len(n))
		for i := range n {
			dest[i] = &n[i]
		}
		if err := tx.QueryRow(t.Context(), "SELECT "+strings.Join(counters, ", ")).Scan(dest...); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := read()
	do()
	grew := read()
	for i := range grew {
		grew[i] -= before[i]
	}
	return grew
}

// A producer's insert asks whether its key has an unfinished message with
// probes of the key's own entries in the order-key indexes, whatever the
// statistics (schema 30). Where they say the queue holds few keys, most of
// its messages blocked (a few keys with backlogs, analyzed), schema 12's
// probes were answered by reading the table in order, the soonest way to a
// matching row by the statistics: for a key with no unfinished message every
// insert read the whole queue (0.5-1.2 ms an insert at 4,000 rows, growing
// with the queue, against 16 us). And where the plans were made while the
// queue was a page (analyzed empty), reading and sorting it all looked
// cheapest to the probes spelled for the index's order, until the trigger
// ran with enable_sort off.
func TestAKeyedInsertProbesItsKeyWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		setUp []string
	}{
		{"few keys with backlogs", []string{
			"INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'h' || (g % 20) FROM generate_series(1, 4000) g",
			"ANALYZE pepsi.queue", // 20 keys, 3,980 of 4,000 messages blocked
			// The trigger's plans made from the statistics alone, as a
			// producer's session makes them after its first few inserts.
			"SET plan_cache_mode = force_generic_plan",
		}},
		{"analyzed empty", []string{
			"ANALYZE pepsi.queue",
			"SET plan_cache_mode = force_generic_plan",
			// The plans are made at the first insert, with the queue a page;
			// the session keeps them as the queue grows.
			"INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'h' || (g % 20) FROM generate_series(1, 4000) g",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			conn := pgtest.Connect(t, h.url)
			execAll(t, conn, c.setUp...)
			scans, rows := keyedInsertsReading(t, conn)
			if scans > 0 || rows > 0 {
				t.Errorf("four keyed inserts read pepsi.queue in %d sequential scans, %d rows; want none (index probes of each key)", scans, rows)
			}
		})
	}
}

// keyedInsertsReading inserts messages of three new keys and of key h7,
// which has unfinished messages, checks the statuses the trigger gave them,
// and returns the sequential scans of pepsi.queue the inserts made and the
// rows those read.
func keyedInsertsReading(t *testing.T, conn *pgx.Conn) (scans, rows int64) {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // only what it reads matters
	var statuses []string
	read := readsOf(t, tx, func() {
		for _, key := range []string{"new1", "new2", "new3", "h7"} {
			var status string
			if err := tx.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, order_key) VALUES ('a', $1) RETURNING status`, key).Scan(&status); err != nil {
				t.Fatalf("insert of a message of key %s: %v", key, err)
			}
			statuses = append(statuses, status)
		}
	}, seqScans, seqRows)
	if want := []string{"pending", "pending", "pending", "blocked"}; !slices.Equal(statuses, want) {
		t.Errorf("inserted messages of keys new1, new2, new3 and h7 are %v; want %v", statuses, want)
	}
	return read[0], read[1]
}

// The dispatcher's release asks whether each of its keys has an unfinished
// message (or, for a Behind, one older than a message) with probes of the
// key's own entries, whatever the statistics: a key whose last message has
// finished (most keys, most of the time) costs two index probes. Spelled
// "order_key = k", the probe for a blocked message was answered, where the
// statistics said the queue held few keys and most of its messages were
// blocked, by reading the table in order: all of it, for such a key.
func TestReleaseProbesItsKeysWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	ctx := t.Context()
	execAll(t, conn,
		"INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'h' || (g % 20) FROM generate_series(1, 4000) g",
		"ANALYZE pepsi.queue", // 20 keys, 3,980 of 4,000 messages blocked
		"INSERT INTO pepsi.queue (stage, order_key, status) VALUES ('a', 'k', 'done')",
		"SET plan_cache_mode = force_generic_plan", // as the dispatcher's sessions
	)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // only what it reads matters
	var k int64
	if err := tx.QueryRow(ctx, `SELECT ingress_id FROM pepsi.queue WHERE order_key = 'k'`).Scan(&k); err != nil {
		t.Fatal(err)
	}
	// Keys k and gone finished, and whether an older message of k than its
	// finished one is unfinished (a Behind, as for a pass that did not
	// move and claim).
	reads := readsOf(t, tx, func() {
		rows, err := tx.Query(ctx, store.ReleaseSQL, []string{"k", "gone"}, []string{"k"}, []int64{k})
		if err == nil {
			var n int
			for rows.Next() {
				n++
			}
			if err = rows.Err(); err == nil && n > 0 {
				t.Errorf("release of keys with no unfinished message answered %d rows; want none", n)
			}
		}
		if err != nil {
			t.Fatalf("release: %v", err)
		}
	}, seqScans, seqRows, entriesOf("pepsi.queue_pkey"))
	if scans, read := reads[0], reads[1]; scans > 0 || read > 0 {
		t.Errorf("the release of finished keys read pepsi.queue in %d sequential scans, %d rows; want none (index probes of each key)", scans, read)
	}
	// One entry: k's finished row, looked up by its id (is it running?).
	if pkey := reads[2]; pkey > 1 {
		t.Errorf("the release read %d entries of the primary key; want 1 (the Behind's row, by its id), not a walk below it", pkey)
	}
}

// The claim's and a keyed move's questions whether an older message of the
// key is unfinished probe the key's own entries below the message, whatever
// the statistics. Spelled "order_key = k AND ingress_id < id", their generic
// plans walked the primary key below each message, filtering by key, where
// the statistics said the queue held few keys and most of its messages were
// blocked: every row older than the message, finished ones included, for
// each message claimed or moved.
func TestProbesForAnOlderMessageStayOnTheKeyWhateverTheStatistics(t *testing.T) {
	t.Parallel()
	const others, items = 4000, 50
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'h' || (g %% 20) FROM generate_series(1, %d) g", others),
		"ANALYZE pepsi.queue", // 20 keys, all messages but their heads blocked
		prepareClaim,
		"PREPARE resolve_no_emits("+resolveParams+") AS "+store.ResolveNoEmitsSQL,
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'n' || g FROM generate_series(1, %d) g", items),
	)
	claim := explain(t, conn, "force_generic_plan", "claim", "'{a}', '{100}', '{0}', '{}', '{}', 0, '{}', false, 7")
	execAll(t, conn, fmt.Sprintf("UPDATE pepsi.queue SET status = 'running' WHERE ingress_id > %d", others))
	resolve := explain(t, conn, "force_generic_plan", "resolve_no_emits", moveClaimArgs(others+1, items))
	for _, s := range []struct {
		name string
		plan *planNode
	}{{"claim", claim}, {"resolve", resolve}} {
		s.plan.walk(nil, func(n, _ *planNode) {
			if n.IndexName == "queue_pkey" && strings.Contains(n.IndexCond, "<") {
				t.Errorf("the %s walks the primary key below a message (%s); want the key's own entries:\n%s", s.name, n.IndexCond, s.plan)
			}
			if n.NodeType == "Seq Scan" && n.RelationName == "queue" {
				t.Errorf("the %s reads pepsi.queue whole; want the key's own entries:\n%s", s.name, s.plan)
			}
		})
		if probes, _, whole := orderKeyReads(s.plan); probes == 0 || len(whole) > 0 {
			t.Errorf("the %s probed the order-key indexes %g times, %d of them whole; want probes of each key:\n%s", s.name, probes, len(whole), s.plan)
		}
	}
}

// The probes for an older message stop at the message: the claim of a key's
// head, and its keyed move, read a few pages of the key's blocked entries
// whatever backlog waits behind it. Scanned forward from the key's first
// entry, a row comparison's scan does not end at the message on PostgreSQL
// 15 (only its first column bounds the scan): it read the whole backlog
// above the head, every hop of the key (a review measured 3,836 buffers
// beside 1,000,000 blocked messages). Scanned backward from the message, it
// ends at the key's first entry.
func TestProbesForAnOlderMessageStopAtTheMessage(t *testing.T) {
	t.Parallel()
	const backlog = 5000
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, order_key) SELECT 'a', 'hot' FROM generate_series(0, %d) g", backlog),
		"VACUUM ANALYZE pepsi.queue",
		prepareClaim,
		"PREPARE resolve_no_emits("+resolveParams+") AS "+store.ResolveNoEmitsSQL,
	)
	var head int
	if err := conn.QueryRow(t.Context(), "SELECT min(ingress_id) FROM pepsi.queue").Scan(&head); err != nil {
		t.Fatal(err)
	}
	claim := explain(t, conn, "force_generic_plan", "claim", "'{a}', '{10}', '{0}', '{}', '{}', 0, '{}', false, 7")
	execAll(t, conn, fmt.Sprintf("UPDATE pepsi.queue SET status = 'running' WHERE ingress_id = %d", head))
	resolve := explain(t, conn, "force_generic_plan", "resolve_no_emits", moveClaimArgs(head, 1))
	for _, s := range []struct {
		name string
		plan *planNode
	}{{"claim", claim}, {"resolve", resolve}} {
		var probes, buffers float64
		s.plan.walk(nil, func(n, _ *planNode) {
			if n.IndexName == "queue_order_blocked" {
				probes += n.ActualLoops
				buffers += n.SharedHit + n.SharedRead
			}
		})
		if probes != 1 || buffers > 4 {
			t.Errorf("the %s of the head of a key with %d blocked messages probed queue_order_blocked %g times, reading %g buffers; want once, a few buffers:\n%s",
				s.name, backlog, probes, buffers, s.plan)
		}
	}
}

// A tool of the operator's own releases keys under a role of its own
// (docs/protocol.md, "The queue and who writes what"), which may have no
// privilege on pepsi.history: its releases hand keys on all the same, one
// that wakes a head included, whose woken row it then leaves out (schema
// 33; schema 31's release needed INSERT on pepsi.history at every call).
// The owner's release of a head whose pause ran out records it woken.
func TestAReleaseNeedsNoPrivilegeOnTheHistory(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	owner := pgtest.Connect(t, url)
	ctx := t.Context()
	tool := fmt.Sprintf("pepsi_tool_%d", time.Now().UnixNano()%1e9)
	if _, err := owner.Exec(ctx, "CREATE ROLE "+tool+"; GRANT USAGE ON SCHEMA pepsi TO "+tool+
		"; GRANT SELECT, UPDATE ON pepsi.queue TO "+tool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		owner.Exec(context.Background(), "DROP OWNED BY "+tool+"; DROP ROLE "+tool) //nolint:errcheck // best effort: roles outlive databases
	})
	if _, err := owner.Exec(ctx, `SELECT pepsi.history_day((now() AT TIME ZONE 'UTC')::date, true)`); err != nil {
		t.Fatal(err)
	}
	// Per key: a finished head and, behind it, a message whose pause ran out
	// while it waited blocked (the release wakes it), for each of k1 (the
	// tool's) and k2 (the owner's); k3 has nothing to wake.
	for _, k := range []string{"k1", "k2", "k3"} {
		if _, err := owner.Exec(ctx, `INSERT INTO pepsi.queue (stage, status, order_key) VALUES ('a', 'done', $1)`, k); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"k1", "k2"} {
		if _, err := owner.Exec(ctx, `INSERT INTO pepsi.queue (stage, status, order_key, timeout) VALUES ('a', 'blocked', $1, now() - interval '1 minute')`, k); err != nil {
			t.Fatal(err)
		}
	}
	release := func(role, key string) string {
		t.Helper()
		tx, err := owner.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		if role != "" {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
				t.Fatal(err)
			}
		}
		var got string
		if err := tx.QueryRow(ctx, `SELECT coalesce(string_agg(status, ','), '') FROM pepsi.order_release(ARRAY[$1], true)`, key).Scan(&got); err != nil {
			t.Fatalf("release of %s as %q: %v", key, role, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := release(tool, "k3"); got != "" {
		t.Errorf("the tool's release of a key with nothing left = %q; want nothing", got)
	}
	if got := release(tool, "k1"); got != "pending" {
		t.Errorf("the tool's release of k1 = %q; want its next message pending", got)
	}
	if got := release("", "k2"); got != "pending" {
		t.Errorf("the owner's release of k2 = %q; want its next message pending", got)
	}
	var events string
	if err := owner.QueryRow(ctx, `SELECT coalesce(string_agg(q.order_key || ':' || h.event, ',' ORDER BY q.order_key), '')
		FROM pepsi.history h JOIN pepsi.queue q USING (ingress_id)`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != "k2:woken" {
		t.Errorf("history %q; want k2's woken alone (the tool may not write it)", events)
	}
}

// A producer at REPEATABLE READ took its snapshot before the key's head
// finished and was released: its insert's probes see the head unfinished.
// Before schema 36 the message was inserted blocked behind a message that
// had left, and no release came for it (the key stuck for good); now the
// insert is refused with 0A000, naming the isolation level, and inserts
// nothing. At READ COMMITTED the same insert is the key's head, pending,
// and a finished row with a key is inserted at any level, as before.
func TestAKeyedInsertOutsideReadCommittedIsRefused(t *testing.T) {
	t.Parallel()
	url, owner := pgtest.NewMigratedConn(t)
	ctx := t.Context()
	var head int64
	if err := owner.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, status, order_key) VALUES ('a', 'running', 'k') RETURNING ingress_id`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	producer := pgtest.Connect(t, url)
	for _, level := range []string{"REPEATABLE READ", "SERIALIZABLE"} {
		tx, err := producer.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.TxIsoLevel(strings.ToLower(level))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT count(*) FROM pepsi.queue`); err != nil {
			t.Fatal(err)
		}
		// The head finishes and its key is released, after the snapshot.
		if _, err := owner.Exec(ctx, `UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = $1`, head); err != nil {
			t.Fatal(err)
		}
		if _, err := owner.Exec(ctx, `SELECT * FROM pepsi.order_release(ARRAY['k'], true)`); err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO pepsi.queue (stage, order_key) VALUES ('a', 'k')`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "0A000" || !strings.Contains(pgErr.Message, "not at "+level) {
			t.Errorf("%s: keyed insert after the head finished: %v; want 0A000 naming %s", level, err, level)
		}
		tx.Rollback(ctx) //nolint:errcheck // the insert's error ended it
		if _, err := producer.Exec(ctx, `BEGIN ISOLATION LEVEL `+level+`; INSERT INTO pepsi.queue (stage, status, order_key) VALUES ('a', 'done', 'k'); COMMIT`); err != nil {
			t.Errorf("%s: a finished keyed row: %v", level, err)
		}
		if _, err := owner.Exec(ctx, `UPDATE pepsi.queue SET status = 'running' WHERE ingress_id = $1`, head); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := owner.Exec(ctx, `UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = $1`, head); err != nil {
		t.Fatal(err)
	}
	var status string
	if err := producer.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, order_key) VALUES ('a', 'k') RETURNING status`).Scan(&status); err != nil || status != "pending" {
		t.Errorf("keyed insert at READ COMMITTED: %q, %v; want pending", status, err)
	}
}
