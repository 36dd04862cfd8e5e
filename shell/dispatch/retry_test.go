package dispatch_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Retries and rates from outside: the real dispatcher, PostgreSQL and stage
// processes (teststage), timed by what the stages record.

// passTimes returns when the stage program began each pass of message id, in order.
func (e *env) passTimes(id int64) []time.Time {
	var out []time.Time
	for _, r := range e.records("handle") {
		if r.ID == id {
			out = append(out, r.At)
		}
	}
	return out
}

// A stage that answers 75 twice, then "0 >done": the message waits RETRY_DELAY,
// then twice that (plus at most 10 % jitter) between its passes, and ends done
// with attempts 2 (its retries at this stage) and no reason left behind.
func TestTemporaryFailuresAreRetriedWithDoublingDelays(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
STATS_INTERVAL = 1h
[stage-a]
PROGRAM = @BIN@/teststage
RETRY_LIMIT = 3
RETRY_DELAY = 500ms
RETRY_DELAY_MAX = 10s
`)
	ids := e.insert("a", "a=count+answer:75 service down|count+answer:75 still down|answer:0 >done")
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"done": 1})
	d.stopClean()
	passes := e.passTimes(ids[0])
	if len(passes) != 3 {
		t.Fatalf("%d passes, want 3", len(passes))
	}
	// A pass's answer comes after it began, so each gap is at least the delay;
	// at most the delay plus the jitter plus the round trip through the
	// dispatcher and a worker (1 s here, far above it unloaded).
	for i, delay := range []time.Duration{500 * time.Millisecond, time.Second} {
		gap := passes[i+1].Sub(passes[i])
		if gap < delay || gap > delay+delay/10+time.Second {
			t.Errorf("pass %d came %s after pass %d; want %s to %s plus the round trip", i+2, gap, i+1, delay, delay+delay/10)
		}
	}
	r := e.row(ids[0])
	if attempts := e.scalar("SELECT attempts FROM pepsi.queue WHERE ingress_id = $1", ids[0]); r.Status != "done" || attempts != 2 {
		t.Errorf("row %s with attempts %d, want done with 2", r, attempts)
	}
	if n := e.scalar("SELECT count(*) FROM pepsi.queue WHERE state ? 'dispatch_error'"); n != 0 {
		t.Errorf("a retried message that succeeded still shows a dispatch_error")
	}
}

// A stage that always answers 75 fails its message after exactly RETRY_LIMIT
// retries, with the reason; the retries are counted in stage_stats.
func TestAMessageThatAlwaysAnswers75FailsAfterRetryLimitRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = @BIN@/teststage
RETRY_LIMIT = 3
RETRY_DELAY = 100ms
RETRY_DELAY_MAX = 150ms
`)
	ids := e.insert("a", "a=count+answer:75 relay busy")
	d := e.start()
	e.waitCounts(20*time.Second, map[string]int{"failed": 1})
	waitFor(t, 10*time.Second, "the idle flush", func() (bool, string) {
		n := e.scalar("SELECT coalesce(sum(retries), 0) FROM pepsi.stage_stats WHERE stage = 'a'")
		return n == 3, fmt.Sprintf("stage_stats.retries = %d", n)
	})
	d.stopClean()
	if n := len(e.passTimes(ids[0])); n != 4 {
		t.Errorf("%d passes, want 4: the first and RETRY_LIMIT 3 retries", n)
	}
	e.expectRow(ids[0], "failed", "a", "relay busy")
	if attempts := e.scalar("SELECT attempts FROM pepsi.queue WHERE ingress_id = $1", ids[0]); attempts != 3 {
		t.Errorf("attempts = %d, want RETRY_LIMIT 3", attempts)
	}
	if st := e.stageStats()["a"]; st.Failed != 1 {
		t.Errorf("stage_stats.failed = %d, want 1", st.Failed)
	}
}

// A stage with RATE = 50 handed 2,000 messages at once: the claims, timed by
// PostgreSQL (the claim's transaction time, the updated_at it writes, noted by
// a trigger of this test's own database), never exceed RATE × T + max(1, RATE)
// in any window, and the whole takes about 40 s: a bucket of 49 at once, then
// 1,951 at 50 a second, 39 s.
func TestRateBoundsTheClaimsOfAStageInEveryWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = @BIN@/teststage
PARALLELISM = 4
QUEUE_LIMIT = 16
RATE = 50
`)
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, `
CREATE TABLE claims (id bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION note_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO claims (id) VALUES (NEW.ingress_id); RETURN NULL; END $$;
CREATE TRIGGER note_claim AFTER UPDATE OF status ON pepsi.queue FOR EACH ROW
	WHEN (OLD.status = 'pending' AND NEW.status = 'running') EXECUTE FUNCTION note_claim();`); err != nil {
		t.Fatal(err)
	}
	const n, rate = 2000, 50.0
	e.insertN("a", "", n)
	d := e.start()
	e.waitCounts(90*time.Second, map[string]int{"done": n})
	d.stopClean()

	rows, err := e.db.Query(ctx, "SELECT at FROM claims ORDER BY at")
	if err != nil {
		t.Fatal(err)
	}
	var at []time.Time
	for rows.Next() {
		var t0 time.Time
		if err := rows.Scan(&t0); err != nil {
			t.Fatal(err)
		}
		at = append(at, t0)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(at) != n {
		t.Fatalf("%d claims recorded, want %d (each message claimed once)", len(at), n)
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	var worst strings.Builder
	for i := range at {
		for j := i; j < len(at); j++ {
			if limit := rate*at[j].Sub(at[i]).Seconds() + max(1, rate); float64(j-i+1) > limit {
				fmt.Fprintf(&worst, "%d claims in %s (from claim %d), bound %.1f; ", j-i+1, at[j].Sub(at[i]), i, limit)
				break
			}
		}
		if worst.Len() > 500 {
			break
		}
	}
	if worst.Len() > 0 {
		t.Errorf("RATE 50 exceeded: %s", worst.String())
	}
	took := at[n-1].Sub(at[0])
	if took < 36*time.Second || took > 44*time.Second {
		t.Errorf("2,000 claims at RATE 50 took %s, want within 10%% of 40 s", took)
	}
	t.Logf("2,000 claims at RATE 50 took %s", took)
}
