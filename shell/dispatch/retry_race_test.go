package dispatch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// TestRetriesWhileAWorkerHoldsTheMessageNeverMakeTwoHolders is the operator's
// race, from outside: a stage writes failed itself, commits, and answers its
// bare 0 a few hundred milliseconds later, while pepsi-queue retry (its
// function) runs every 20 ms and makes the row pending in between. No message
// may be handed to a second worker while the first still holds it, no stale
// answer may fail the new pass as a stage bug, and every message ends done on
// its second pass, as the stage decides.
func TestRetriesWhileAWorkerHoldsTheMessageNeverMakeTwoHolders(t *testing.T) {
	t.Parallel()
	const n = 40
	e := newEnv(t, "[pepsi-dispatch]\nSTOP_GRACE = 1\n"+stages(4, 2, "a"))
	ids := e.insert("a", repeat("a=failed+sleep:300|done", n)...)
	d := e.start()

	ctx, cancel := context.WithCancel(context.Background())
	retried := make(chan int64, 1)
	go func() {
		var total int64
		defer func() { retried <- total }()
		conn, err := pgx.Connect(ctx, e.url)
		if err != nil {
			t.Errorf("operator: %v", err)
			return
		}
		defer conn.Close(context.Background())
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			k, err := queueadmin.Retry(ctx, conn, queueadmin.RetryFilter{})
			if err != nil && ctx.Err() == nil {
				t.Errorf("pepsi-queue retry: %v", err)
				return
			}
			total += k
		}
	}()
	e.waitCounts(60*time.Second, map[string]int{"done": n})
	cancel()
	total := <-retried
	d.stopClean()
	if total < n/2 {
		t.Errorf("the operator retried %d messages; the race needs most of the %d retried while held", total, n)
	}

	for _, id := range ids {
		var dispatchError string
		var errors int64
		err := e.db.QueryRow(context.Background(), `SELECT coalesce(state->>'dispatch_error', ''),
			(SELECT count(*) FROM jsonb_array_elements(coalesce(state->'dispatch_error_history', '[]')) h WHERE h ? 'error')
			FROM pepsi.queue WHERE ingress_id = $1`, id).Scan(&dispatchError, &errors)
		if err != nil {
			t.Fatal(err)
		}
		if dispatchError != "" || errors > 0 {
			t.Errorf("message %d: dispatch_error %q, %d retried dispatcher verdicts: a stale answer judged a newer pass", id, dispatchError, errors)
		}
	}

	// The record file is in write order (O_APPEND): for each message, every
	// handling must be answered before the next one starts.
	holder := map[int64]int{} // id → pid handling it now
	passes := map[int64]int{}
	var overlaps []string
	for _, r := range e.records("") {
		switch r.Ev {
		case "handle":
			if pid, held := holder[r.ID]; held {
				overlaps = append(overlaps, fmt.Sprintf("message %d handed to pid %d while pid %d held it", r.ID, r.PID, pid))
			}
			holder[r.ID] = r.PID
			passes[r.ID]++
		case "answer":
			delete(holder, r.ID)
		}
	}
	if len(overlaps) > 0 {
		t.Errorf("%d overlapping holders:\n%s", len(overlaps), strings.Join(overlaps, "\n"))
	}
	for _, id := range ids {
		if passes[id] != 2 {
			t.Errorf("message %d ran %d times; want 2 (failed by its stage, retried, done)", id, passes[id])
		}
	}
}
