package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

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
