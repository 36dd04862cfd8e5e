package ingress_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/ingress"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// TestKeyedBatchesInOppositeOrdersDoNotDeadlock makes two batches insert the
// same keys in opposite orders, each in a transaction of its own, with their
// inserts interleaved by a third producer's uncommitted key:
//
//	batch A, keys x k0 y: inserts x, then waits for the producer's k0
//	batch B, keys y x:    inserts y, then waits for A's x
//	the producer commits: A goes on to y and waits for B, B waits for A
//
// Without the key locks that is a deadlock: the server ends one of the two
// after deadlock_timeout (1 s) and the batch is tried again. With them, B
// waits for A's locks before it inserts anything, and each batch commits at
// its first try. With 300 more keys in A (more than a transaction locks one
// by one), A takes the gate exclusively, and B waits at the gate.
func TestKeyedBatchesInOppositeOrdersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	for _, more := range []int{0, 300} {
		t.Run(fmt.Sprintf("%d more keys", more), func(t *testing.T) {
			t.Parallel()
			opposite(t, more)
		})
	}
}

func opposite(t *testing.T, more int) {
	f := start(t, "", func(o *ingress.Options) { o.Limits.Messages = 1000 })
	ctx := context.Background()
	producer := pgtest.Connect(t, f.url)
	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var k0 int64
	if err := tx.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, payload, dedup_key) VALUES ('a', 'producer', 'k0') RETURNING ingress_id`).Scan(&k0); err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		var n int
		if err := f.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	bodyA := "{\"payload\": \"A x\", \"key\": \"x\"}\n{\"payload\": \"A k0\", \"key\": \"k0\"}\n{\"payload\": \"A y\", \"key\": \"y\"}\n"
	for i := range more {
		bodyA += fmt.Sprintf("{\"payload\": \"A %d\", \"key\": \"more-%d\"}\n", i, i)
	}
	gotA, gotB := make(chan answer, 1), make(chan answer, 1)
	go func() { gotA <- f.post("application/x-ndjson", "?stage=a", bodyA) }()
	waitFor(t, "batch A to wait for the producer's k0", func() bool { return waiting() == 1 })
	go func() {
		gotB <- f.post("application/x-ndjson", "?stage=a", "{\"payload\": \"B y\", \"key\": \"y\"}\n{\"payload\": \"B x\", \"key\": \"x\"}\n")
	}()
	waitFor(t, "batch B to wait", func() bool { return waiting() == 2 })
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := <-gotA, <-gotB
	if a.code != 202 || b.code != 202 || len(a.ids) != 3+more || len(b.ids) != 2 {
		t.Fatalf("answers A %d with %d ids, B %+v; want 202 with %d and 2 ids", a.code, len(a.ids), b, 3+more)
	}
	if a.ids[1] != k0 || a.ids[0] != b.ids[1] || a.ids[2] != b.ids[0] {
		t.Errorf("ids A %v (x k0 y), B %v (y x), the producer's k0 %d; want one id per key", a.ids[:3], b.ids, k0)
	}
	if !(a.ids[0] < a.ids[2]) {
		t.Errorf("ids A %v: want them ascending in the order given (x before y)", a.ids[:3])
	}
	if tries := f.metric("pepsi_ingress_commit_seconds_count"); tries != 2 {
		t.Errorf("%v tries of a transaction; want 2, one per batch (more: a deadlock ended one)", tries)
	}
	if n := f.count(); n != 3+more {
		t.Errorf("%d rows; want %d", n, 3+more)
	}
}

// TestABatchClosesWhenIdleUnlessAnotherCommits sets a batch wait far longer
// than the test's patience and a short idle time. A lone request commits
// after the idle time (its batch is held at a key another producer has not
// yet committed); requests that arrive one by one while that batch is in
// flight wait for it and share one batch, although each gap between them is
// longer than the idle time.
func TestABatchClosesWhenIdleUnlessAnotherCommits(t *testing.T) {
	t.Parallel()
	batchesWhileAnotherCommits(t, time.Millisecond)
}

// TestABatchCommitsAtOnceUnlessAnotherCommits: the same with the default idle
// time, none: the lone request commits at once, with nothing in flight, and
// the three that arrive while it is held share one batch, which commits when
// it ends (not after the minute of the batch wait).
func TestABatchCommitsAtOnceUnlessAnotherCommits(t *testing.T) {
	t.Parallel()
	if ingress.BatchIdleDefault != 0 {
		t.Fatalf("BatchIdleDefault %s; this test is of the default, no idle time", ingress.BatchIdleDefault)
	}
	batchesWhileAnotherCommits(t, ingress.BatchIdleDefault)
}

// batchesWhileAnotherCommits runs the scenario of the two tests above with a
// batch wait of a minute and the idle time idle.
func batchesWhileAnotherCommits(t *testing.T, idle time.Duration) {
	f := start(t, "", func(o *ingress.Options) {
		o.BatchWait, o.BatchIdle, o.Committers = time.Minute, idle, 2
	})
	ctx := context.Background()
	producer := pgtest.Connect(t, f.url)
	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload, dedup_key) VALUES ('a', 'producer', 'k0')`); err != nil {
		t.Fatal(err)
	}
	answers := make(chan answer, 4)
	go func() { answers <- f.post("application/json", "?stage=a", `{"payload": "held", "key": "k0"}`) }()
	waitFor(t, "the lone request's batch to commit (and wait for the producer's k0)", func() bool {
		var n int
		f.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
		return n == 1
	})
	for i := range 3 {
		go func() { answers <- f.post("application/json", "?stage=a", fmt.Sprintf(`{"payload": "m%d"}`, i)) }()
		time.Sleep(20 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if a := <-answers; a.code != 202 || len(a.ids) != 1 {
			t.Errorf("answer %+v; want 202 with one id", a)
		}
	}
	if n, sum := f.metric("pepsi_ingress_batch_requests_count"), f.metric("pepsi_ingress_batch_requests_sum"); n != 2 || sum != 4 {
		t.Errorf("%v transactions for %v requests; want 2 for 4: the lone one, then the three that arrived while it committed", n, sum)
	}
}

// TestARoleWithInsertAndSelectIsEnough serves as a role with only the grants
// docs/pepsi-ingress.8.md names (INSERT and SELECT on pepsi.queue): messages
// with and without keys, a key repeated, a batch with more keys than are
// locked one by one.
func TestARoleWithInsertAndSelectIsEnough(t *testing.T) {
	t.Parallel()
	db := pgtest.NewMigrated(t)
	owner := pgtest.Connect(t, db)
	role, roleURL := pgtest.LoginRole(t, owner, db, "pepsi_ingress", "GRANT USAGE ON SCHEMA pepsi TO ROLE; GRANT INSERT, SELECT ON pepsi.queue TO ROLE")
	f := start(t, roleURL, func(o *ingress.Options) { o.Limits.Messages = 1000 })
	var many strings.Builder
	for i := range 300 {
		fmt.Fprintf(&many, "{\"payload\": \"m%d\", \"key\": \"many-%d\"}\n", i, i)
	}
	for _, body := range []string{"{\"payload\": \"no key\"}\n", "{\"payload\": \"k\", \"key\": \"k\"}\n", "{\"payload\": \"k again\", \"key\": \"k\"}\n", many.String()} {
		if a := f.post("application/x-ndjson", "?stage=a", body); a.code != 202 {
			t.Errorf("as %s: %+v; want 202", role, a)
		}
	}
	if n := f.count(); n != 302 {
		t.Errorf("%d rows; want 302", n)
	}
}
