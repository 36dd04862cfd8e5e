package store_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/internal/traceparent"
)

// Proves: the span id the dispatcher computes for a pass
// (traceparent.PassSpanID) is the one the database computes from the row
// (pepsi.pass_span, schema 22), for ids and instants across their ranges,
// so a stage reading its row and the dispatcher exporting the pass agree.
// Seeded: the seed is printed and replays the values.
func TestPassSpanIsTheDatabasesHash(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(uint64(seed), 0))
	conn := pgtest.Connect(t, pgtest.NewMigrated(t))
	ids := []int64{0, 1, -1, 1 << 31, 1<<32 - 1, 1 << 32, 1<<63 - 1, -1 << 63}
	ats := []time.Time{time.Unix(0, 0), time.Unix(-1, 500000000), time.Date(2026, 12, 2, 19, 0, 0, 123456000, time.UTC),
		time.Date(2262, 1, 1, 0, 0, 0, 999999000, time.UTC), time.Date(1900, 1, 1, 0, 0, 0, 1000, time.UTC)}
	for range 500 {
		ids = append(ids, int64(r.Uint64()>>r.IntN(64)))
		ats = append(ats, time.UnixMicro(r.Int64N(10_000_000_000_000_000)-5_000_000_000_000_000))
	}
	for i, id := range ids {
		at := ats[i%len(ats)]
		var want string
		if err := conn.QueryRow(t.Context(), "SELECT pepsi.pass_span('x', $1, 'y', $2)", id, at).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got := traceparent.PassSpanID(id, at); got != want {
			t.Fatalf("PassSpanID(%d, %s) = %s; pepsi.pass_span gives %s (seed %d)", id, at.Format(time.RFC3339Nano), got, want, seed)
		}
	}
}

// Proves: what a claim and a move that claims report as a pass's
// traceparent is pepsi.pass_traceparent of the row they left, the value an
// INPUT = id stage reads; and every message without a traceparent gets a
// fresh one of its own (a trace id per message, the parent span its first
// pass's), however many one statement claims.
func TestClaimedPassTracesAreTheRowsAndFreshTracesDistinct(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ids := h.Insert(t, "a", 50)
	evs := mustExec(t, h, []core.Command{core.Claim{Op: 1, Traces: true, Caps: []core.Cap{{Stage: "a", N: 50}}}})
	claimed := evs[0].(core.Claimed)
	if len(claimed.Rows) != len(ids) {
		t.Fatalf("claimed %d rows; want %d", len(claimed.Rows), len(ids))
	}
	traces := map[string]int64{}
	check := func(id int64, tr core.Trace) {
		t.Helper()
		var want, msg string
		if err := h.pool.QueryRow(t.Context(), `SELECT pepsi.pass_traceparent(traceparent, ingress_id, stage, updated_at), traceparent
			FROM pepsi.queue WHERE ingress_id = $1`, id).Scan(&want, &msg); err != nil {
			t.Fatal(err)
		}
		if tr.Pass != want || tr.Message != msg {
			t.Fatalf("message %d: pass %q, message %q; the row says %q and %q", id, tr.Pass, tr.Message, want, msg)
		}
	}
	for _, row := range claimed.Rows {
		check(row.ID, row.Trace)
		if row.Trace.Pass != row.Trace.Message {
			t.Errorf("message %d's fresh traceparent %s: want its first pass's span as its parent, pass %s", row.ID, row.Trace.Message, row.Trace.Pass)
		}
		if other, ok := traces[row.Trace.Message[3:35]]; ok {
			t.Fatalf("messages %d and %d share the fresh trace id %s", other, row.ID, row.Trace.Message[3:35])
		}
		traces[row.Trace.Message[3:35]] = row.ID
	}
	items := make([]core.Item, len(ids))
	for i, id := range ids {
		items[i] = core.Item{ID: id, Stage: "a", Verdict: core.Move, To: "b", Claim: true}
	}
	evs = mustExec(t, h, []core.Command{core.Resolve{Op: 2, Traces: true, Items: items}})
	for _, o := range evs[0].(core.Resolved).Outcomes {
		check(o.ID, o.Trace)
		if o.Trace.Pass == "" || o.Trace.Pass == o.Trace.Message || o.Trace.Message[:36] != o.Trace.Pass[:36] {
			t.Fatalf("message %d moved and claimed at b: pass %q, message %q; want the message's trace with a span of the pass's own",
				o.ID, o.Trace.Pass, o.Trace.Message)
		}
	}
}
