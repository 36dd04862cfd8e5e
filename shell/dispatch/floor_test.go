package dispatch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// The claim floor (docs/durability.md, "Claims look above a floor"): a stage's
// claims look only above the rows earlier claims took. These tests make a row pending below the floor the
// two ways the core cannot see in its own results, while a backlog keeps the
// dispatcher busy (so it neither rests nor waits for a NOTIFY to look again) and
// POLL_INTERVAL is an hour (so the heartbeat cannot rescue the row). The row
// must be claimed while the backlog is still far from drained: claims take the
// lowest ids first, so once a claim looks below the floor the row goes next.

// floorConf is one serial stage, so the backlog drains at a known pace: 1,000
// messages of 5 ms each keep the dispatcher claiming for about 5 s.
const floorConf = "[pepsi-dispatch]\nPOLL_INTERVAL = 1h\n[stage-a]\nPROGRAM = @BIN@/teststage\nPARALLELISM = 1\nQUEUE_LIMIT = 1\n"

const floorBacklog = 1000

// waitDoneWithBacklog waits for row id to be done and fails the test unless most
// of a backlog of n was still pending then: the row was claimed at once, not
// when the dispatcher ran out of newer work.
func (e *env) waitDoneWithBacklog(id int64, why string, n int64) {
	e.t.Helper()
	waitFor(e.t, 60*time.Second, fmt.Sprintf("row %d done", id), func() (bool, string) {
		r := e.row(id)
		return r.Status == "done", r.String()
	})
	if left := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status = 'pending'`); left < n/2 {
		e.t.Errorf("row %d (%s) was done only when %d of the %d backlog messages were left pending; "+
			"want it claimed at once, with most of the backlog still pending", id, why, left, n)
	}
}

func TestARowCommittedAfterNewerRowsWereClaimedIsClaimedWithoutWaitingForTheBacklog(t *testing.T) {
	t.Parallel()
	// Messages that take no time: the dispatcher claims without a pause long
	// enough to rest (core.RestAfter), so it never looks from the start again
	// by itself; only the floor's rule can find the late row.
	const backlog = 30000
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 1h\n[stage-a]\nPROGRAM = @BIN@/teststage\nPARALLELISM = 2\nQUEUE_LIMIT = 16\n")
	d := e.start()
	ctx := context.Background()
	// A first batch makes the dispatcher busy, so the slow producer's insert
	// does not notify: it counts on the dispatcher's next look.
	e.insertN("a", "a=done", 2000)
	waitFor(t, 30*time.Second, "the dispatcher busy with the first batch", func() (bool, string) {
		got, last := e.done()
		return got >= 100, last
	})
	producer, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close(ctx)
	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
	// The slow producer takes its id first and commits last.
	var late int64
	if err := tx.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, payload) VALUES ('a', 'a=done') RETURNING ingress_id`).Scan(&late); err != nil {
		t.Fatal(err)
	}
	e.insertN("a", "a=done", backlog)
	waitFor(t, 30*time.Second, "the dispatcher past the slow producer's id", func() (bool, string) {
		n := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status = 'done' AND ingress_id > $1`, late)
		return n >= 200, fmt.Sprintf("%d rows above %d done", n, late)
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitDoneWithBacklog(late, "committed after 200 rows with higher ids were done", backlog)
	d.stopClean()
}

func TestAMessageRetriedWhileTheDispatcherIsBusyIsClaimedWithoutWaitingForTheBacklog(t *testing.T) {
	t.Parallel()
	e := newEnv(t, floorConf)
	d := e.start()
	ctx := context.Background()
	id := e.insert("a", "a=failed|done")[0]
	waitFor(t, 30*time.Second, "the first message failed", func() (bool, string) {
		r := e.row(id)
		return r.Status == "failed", r.String()
	})
	e.insertN("a", "a=sleep:5+done", floorBacklog)
	waitFor(t, 30*time.Second, "the dispatcher working through the backlog", func() (bool, string) {
		got, last := e.done()
		return got >= 50, last
	})
	conn, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if n, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{ID: id}); err != nil || n != 1 {
		t.Fatalf("retry message %d: %d retried, %v", id, n, err)
	}
	e.waitDoneWithBacklog(id, "retried as pepsi-queue retry does, below the rows the claims had passed", floorBacklog)
	d.stopClean()
}
