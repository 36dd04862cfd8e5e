package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// WriteHealth replaces the rows by the stages it is given; a stage keeps its
// since while its state stays and gets a new one when it changes; until is
// NULL unless given; ReadHealth says whether a dispatcher holds the lock.
func TestStageHealthIsReplacedAndKeepsSinceWhileTheStateStays(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	until := time.Now().Add(4 * time.Second).Truncate(time.Microsecond)
	write := func(hs ...core.StageHealth) {
		t.Helper()
		if err := h.WriteHealth(ctx, hs); err != nil {
			t.Fatal(err)
		}
	}
	read := func() map[string]store.StageHealth {
		t.Helper()
		got, err := h.ReadHealth(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got.Current || got.Now.IsZero() {
			t.Errorf("ReadHealth: current %v now %v, want no dispatcher and the server's clock", got.Current, got.Now)
		}
		m := map[string]store.StageHealth{}
		for _, st := range got.Stages {
			m[st.Stage] = st
		}
		return m
	}
	write(core.StageHealth{Stage: "a", State: core.HealthOK}, core.StageHealth{Stage: "gone", State: core.HealthOK})
	write(core.StageHealth{Stage: "a", State: core.HealthCannotStart, Reason: "program \"x\" cannot start", Until: until},
		core.StageHealth{Stage: "b", State: core.HealthOK})
	first := read()
	if len(first) != 2 || first["gone"].Stage != "" {
		t.Fatalf("rows %v, want a and b only (the stages last written)", first)
	}
	a := first["a"]
	if a.State != core.HealthCannotStart || a.Reason != "program \"x\" cannot start" || !a.Until.Equal(until) {
		t.Errorf("a = %+v, want cannot_start with its reason until %v", a, until)
	}
	if b := first["b"]; b.State != core.HealthOK || !b.Until.IsZero() {
		t.Errorf("b = %+v, want ok with no until", b)
	}
	write(core.StageHealth{Stage: "a", State: core.HealthCannotStart, Reason: "again", Until: until.Add(time.Second)},
		core.StageHealth{Stage: "b", State: core.HealthCrashing, Reason: "3 workers crashed"})
	second := read()
	if !second["a"].Since.Equal(a.Since) || second["a"].Reason != "again" || !second["a"].UpdatedAt.After(a.UpdatedAt) {
		t.Errorf("a rewritten in the same state: %+v, want since kept (%v), reason and updated_at new", second["a"], a.Since)
	}
	if !second["b"].Since.After(first["b"].Since) {
		t.Errorf("b changed state: since %v, want later than %v", second["b"].Since, first["b"].Since)
	}
}

// A row's ready_at is kept by a claim and by the requeue that gives the claim
// back, so the oldest pending wait (CountRows) keeps growing; a move to
// another stage, a wake and a retry make the row ready anew.
func TestReadyAtSurvivesRequeuesAndIsSetByMovesWakesAndRetries(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	ids := h.Insert(t, "a", 2)
	h.exec(t, `UPDATE pepsi.queue SET ready_at = now() - interval '1 hour', updated_at = now() - interval '1 hour'`)
	readyAge := func(id int64) time.Duration {
		t.Helper()
		var us int64
		if err := h.pool.QueryRow(ctx, `SELECT (extract(epoch FROM now() - ready_at) * 1e6)::bigint FROM pepsi.queue WHERE ingress_id = $1`, id).Scan(&us); err != nil {
			t.Fatal(err)
		}
		return time.Duration(us) * time.Microsecond
	}
	evs := mustExec(t, h, []core.Command{core.Claim{Op: 1, Caps: []core.Cap{{Stage: "a", N: 2}}}})
	if got := claimedIDs(evs[0]); len(got) != 2 {
		t.Fatalf("claimed %v, want both rows", got)
	}
	mustExec(t, h, []core.Command{core.Resolve{Op: 2, Items: []core.Item{
		{ID: ids[0], Stage: "a", Verdict: core.Requeue},
		{ID: ids[1], Stage: "a", Verdict: core.Move, To: "b"},
	}}})
	if age := readyAge(ids[0]); age < 59*time.Minute {
		t.Errorf("claimed and requeued row: ready %v ago, want the hour it has waited", age)
	}
	if age := readyAge(ids[1]); age > time.Minute {
		t.Errorf("row moved to b: ready %v ago, want now", age)
	}
	depth, err := h.CountRows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range depth {
		if d.Stage == "a" && d.Status == core.StatusPending && d.OldestWait < 59*time.Minute {
			t.Errorf("oldest pending wait at a: %v, want the hour the requeued row has waited", d.OldestWait)
		}
	}
	h.exec(t, `UPDATE pepsi.queue SET status = 'paused', timeout = now(), ready_at = now() - interval '1 hour' WHERE ingress_id = $1`, ids[0])
	mustExec(t, h, []core.Command{core.Wake{Op: 3, Now: time.Now().Add(time.Second)}})
	if age := readyAge(ids[0]); age > time.Minute {
		t.Errorf("woken row: ready %v ago, want now", age)
	}
	h.exec(t, `UPDATE pepsi.queue SET status = 'failed', ready_at = now() - interval '1 hour' WHERE ingress_id = $1`, ids[0])
	if _, err := h.Retry(ctx, store.RetryParams{ID: ids[0], Statuses: []core.RowStatus{core.StatusFailed}}); err != nil {
		t.Fatal(err)
	}
	if age := readyAge(ids[0]); age > time.Minute {
		t.Errorf("retried row: ready %v ago, want now", age)
	}
}

// A reason that quotes what the configuration named in another encoding (a
// program path in Latin-1) is recorded with U+FFFD for its bad bytes, and the
// other stages' health with it: refused whole, the write would keep every
// stage's health from being recorded while the dispatcher runs.
func TestAHealthReasonPostgreSQLCannotStoreIsRecordedReplaced(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := context.Background()
	err := h.WriteHealth(ctx, []core.StageHealth{
		{Stage: "good", State: core.HealthOK},
		{Stage: "bad", State: core.HealthCannotStart, Reason: "program '/opt/st\xe4ges/bad.sh' not found \x00"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.ReadHealth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]store.StageHealth{}
	for _, st := range got.Stages {
		m[st.Stage] = st
	}
	if m["good"].State != core.HealthOK || m["bad"].Reason != "program '/opt/st\uFFFDges/bad.sh' not found \uFFFD" {
		t.Errorf("recorded %+v; want good ok and bad's reason with U+FFFD for its bad bytes", m)
	}
}
