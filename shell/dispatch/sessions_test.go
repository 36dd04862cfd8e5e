package dispatch_test

import (
	"context"
	"testing"
	"time"
)

// With SESSIONS = 2 the dispatcher sends resolves beside its step's
// transaction, each on a session of its own (docs/scaling.md, "Sessions
// beside the first"). Every message still passes each stage once: each is
// handled once per stage, its history records one pass per stage, and the
// statistics count every pass; and the dispatcher did send transactions beside
// others (the summary it logs at the end counts them).
func TestTwoSessionsPassEveryMessageOnceEachStage(t *testing.T) {
	t.Parallel()
	const n = 300
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 30\nSESSIONS = 2\n"+stages(2, 8, "a", "b", "c"))
	e.insertN("a", "a=answer:0 >b;b=answer:0 >c;c=answer:0 >done", n/2)
	e.insertN("a", "a=advance:b;b=answer:0 >c;c=done", n/2) // stages that write their own transitions too
	d := e.start()
	e.waitCounts(60*time.Second, map[string]int{"done": n})
	e.waitStatsOf(n)
	d.stopClean()

	handled := map[int64]map[string]int{}
	for _, r := range e.records("handle") {
		if handled[r.ID] == nil {
			handled[r.ID] = map[string]int{}
		}
		handled[r.ID][r.Stage]++
	}
	if len(handled) != n {
		t.Fatalf("%d messages handled; want %d", len(handled), n)
	}
	for id, by := range handled {
		if by["a"] != 1 || by["b"] != 1 || by["c"] != 1 {
			t.Fatalf("message %d handled %v; want once at each of a, b and c", id, by)
		}
	}
	var passes, messages int64
	if err := e.db.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT ingress_id) FROM pepsi.history WHERE event IN ('moved', 'done', 'answered')`).Scan(&passes, &messages); err != nil {
		t.Fatal(err)
	}
	if passes != 3*n || messages != n {
		t.Errorf("pepsi.history holds %d passes of %d messages; want %d of %d (one per stage each)", passes, messages, 3*n, n)
	}
	for name, st := range e.stageStats() {
		if st.Processed != n || st.Failed != 0 {
			t.Errorf("stage_stats %s = %+v; want %d processed, none failed", name, st, n)
		}
	}
	sums := d.logs.lines("queue transactions")
	if len(sums) != 1 {
		t.Fatalf("%d summaries of the queue transactions logged; want 1 at the end", len(sums))
	}
	if beside, _ := sums[0]["beside"].(float64); beside < 1 {
		t.Errorf("queue transactions %v; want some sent beside another (SESSIONS = 2)", sums[0])
	}
}
