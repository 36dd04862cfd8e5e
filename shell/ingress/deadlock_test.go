package ingress_test

import (
	"context"
	"testing"

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
// Inserted in the order given, that is a deadlock: the server ends one of the
// two after deadlock_timeout (1 s) and the batch is tried again. Inserted in
// key order, A waits at k0 before it holds anything, B goes through, and each
// batch commits at its first try.
func TestKeyedBatchesInOppositeOrdersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
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
	gotA, gotB := make(chan answer, 1), make(chan answer, 1)
	go func() {
		gotA <- f.post("application/x-ndjson", "?stage=a", "{\"payload\": \"A x\", \"key\": \"x\"}\n{\"payload\": \"A k0\", \"key\": \"k0\"}\n{\"payload\": \"A y\", \"key\": \"y\"}\n")
	}()
	waitFor(t, "batch A to wait for the producer's k0", func() bool { return waiting() == 1 })
	go func() {
		gotB <- f.post("application/x-ndjson", "?stage=a", "{\"payload\": \"B y\", \"key\": \"y\"}\n{\"payload\": \"B x\", \"key\": \"x\"}\n")
	}()
	// Inserted in key order, B is answered now; in the order given, it waits
	// for A's x.
	var b answer
	waitFor(t, "batch B to be answered or to wait", func() bool {
		select {
		case b = <-gotB:
			return true
		default:
			return waiting() == 2
		}
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-gotA
	if b.code == 0 {
		b = <-gotB
	}
	if a.code != 202 || b.code != 202 || len(a.ids) != 3 || len(b.ids) != 2 {
		t.Fatalf("answers A %+v, B %+v; want 202 with 3 and 2 ids", a, b)
	}
	if a.ids[1] != k0 || a.ids[0] != b.ids[1] || a.ids[2] != b.ids[0] {
		t.Errorf("ids A %v (x k0 y), B %v (y x), the producer's k0 %d; want one id per key", a.ids, b.ids, k0)
	}
	if tries := f.metric("pepsi_ingress_commit_seconds_count"); tries != 2 {
		t.Errorf("%v tries of a transaction; want 2, one per batch (more: a deadlock ended one)", tries)
	}
	if n := f.count(); n != 3 {
		t.Errorf("%d rows; want 3 (x, k0, y)", n)
	}
}
