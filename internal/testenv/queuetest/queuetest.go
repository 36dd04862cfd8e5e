// Package queuetest is the one conformance suite every store.Executor must pass:
// the PostgreSQL queue (store) and the simulator's fake (sim) alike, so
// the simulator cannot drift from the real queue. It states behaviour only (what
// a command does to rows and what it answers), never how; it must never assume
// SQL, timing or anything an implementation does not promise in core.Command's
// doc comments.
package queuetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Harness is a queue under test plus the few things the suite must do to it that
// the dispatcher never does: add rows, play a stage program, read rows back and
// simulate a database crash. Every method fails the test on error.
type Harness interface {
	store.Executor
	// Insert adds pending rows at stage and returns their ids in order.
	Insert(t *testing.T, stage string, n int) []int64
	// InsertMessage adds one pending row at stage with state (a JSON object)
	// and payload (nil for NULL) and returns its id.
	InsertMessage(t *testing.T, stage, state string, payload []byte) int64
	// BeginInsert starts a producer transaction that inserts one pending row at
	// stage and stays open: the row has its id but appears only when commit is
	// called. The test calls commit exactly once.
	BeginInsert(t *testing.T, stage string) (id int64, commit func())
	// Stage changes a row the way a stage program does (only if running at from):
	// advance to another stage, or set status done/failed/paused (with timeout).
	Stage(t *testing.T, id int64, from string, to string, status core.RowStatus, timeout time.Time)
	// Row reads a row back.
	Row(t *testing.T, id int64) (stage string, status core.RowStatus, timeout time.Time, dispatchError string, ok bool)
	// State reads a row's state (state.dispatch_error included).
	State(t *testing.T, id int64) map[string]any
	// ClearEpoch empties the crash sentinel, as a PostgreSQL crash would.
	ClearEpoch(t *testing.T)
	// RefuseStateKey makes the queue refuse, for the data itself, every new
	// row version whose state has key at its top level, as an operator's
	// own CHECK (NOT state ? key) added NOT VALID does: rows that have it
	// already stay, but cannot be written again.
	RefuseStateKey(t *testing.T, key string)
}

// base is the instant the suite's paused rows are timed from. It has whole
// microseconds, the precision PostgreSQL keeps.
var base = time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)

// conformanceTest is one test of the suite, named as its subtest.
type conformanceTest = testCase[Harness]

// testCase is one conformance test on a harness of type H.
type testCase[H any] struct {
	name string
	fn   func(t *testing.T, h H)
}

// Run runs every conformance test, each on a fresh harness from open. open is
// called from within the subtest, so it may use t.Cleanup and t.Fatal. Subtests
// run in parallel: harnesses must not share state.
func Run(t *testing.T, open func(t *testing.T) Harness) {
	tests := []conformanceTest{
		{"ExecOfNoCommandsAnswersNothing", testExecEmpty},
		{"ExecAnswersEachCommandInOrderWithItsOp", testExecOrder},
		{"CommandsOfOneExecSeeEachOthersEffects", testExecSeesOwnEffects},

		{"ClaimTakesPendingRowsInIngressOrderUpToTheCap", testClaimOrder},
		{"ClaimCapsEachStageSeparately", testClaimPerStageCaps},
		{"ClaimOfSeveralStagesAnswersRowsInIngressOrder", testClaimSeveralStages},
		{"ClaimTakesOnlyPendingRows", testClaimOnlyPending},
		{"ClaimWithZeroCapOrUnknownStageTakesNothing", testClaimNothing},
		{"EpochIsStableAcrossClaimsAndReplacedAfterACrash", testEpoch},
		{"ClaimLooksOnlyAboveEachStagesFloor", testClaimFloor},
		{"ClaimReportsIngressSettledUpToTheNewestRow", testClaimSettled},
		{"ClaimReportsNothingSettledWhileAProducerIsMidTransaction", testClaimUnsettled},
		{"ClaimThatKnowsTheNewestRowSettledReportsItWhileAProducerIsMidTransaction", testClaimKnownSettled},
		{"ClaimReadsStateAndPayloadForMessageStagesOnly", testClaimMessage},
		{"ClaimReadsAttempts", testClaimAttempts},
		{"ClaimSaysWhichStagesHaveMoreThanItsCap", testClaimMore},
		{"ClaimReportsTheSizeOfAPayloadOverLineMaxWithoutReadingIt", testClaimMessageOversize},

		{"ResolveRequeuesARowItsStageAdvanced", testResolveAdvanced},
		{"ResolveFailsARowStillRunningAtItsStage", testResolveFailed},
		{"ResolveTimesOutARowStillRunningAtItsStage", testResolveTimeout},
		{"ResolveRequeuesARowStillRunningAtItsStage", testResolveRequeue},
		{"ResolveLeavesRowsThatAreNotRunningAloneAndReportsThem", testResolveLeavesOthers},
		{"ResolveWithAHeldEpochFailsTheRow", testResolveEpochHeld},
		{"ResolveWithALostEpochRequeuesTheRow", testResolveEpochLost},
		{"ResolveReportsAMissingRowAsGone", testResolveMissing},
		{"ResolveAnswersInItemOrder", testResolveOrder},
		{"ResolveWritesAnAnsweredAdvanceStraightToPendingAtTheNextStage", testMoveAdvance},
		{"ResolveWritesAnAnsweredDone", testMoveDone},
		{"ResolveWritesAnAnsweredPauseUntilItsTimeout", testMovePause},
		{"ResolveMergesAnAnsweredStatePatchAtTheTopLevel", testMovePatch},
		{"ResolveOfAnAnsweredTransitionWritesNothingOnAGuardMiss", testMoveGuardMiss},
		{"ResolveMixesAnsweredTransitionsWithBareAnswers", testMoveMixed},
		{"AMoveThatClaimsWritesTheRowRunningAtItsTarget", testMoveClaim},
		{"AMoveThatClaimsReadsTheMessageAfterItsPatch", testMoveClaimMessage},
		{"ResolveRetryPausesTheRowAtItsStageAndCountsTheAttempt", testRetry},
		{"AttemptsAreZeroAgainAfterEveryMoveToAnotherStage", testRetryResetOnMove},
		{"AStageThatAdvancesItsRowItselfLeavesNoAttemptsForTheResetToKeep", testRetryResetOnStageMove},
		{"ResolveRetryLeavesARowThatIsNotRunningAtItsStageAlone", testRetryGuard},

		{"WakeMakesDuePausedRowsPendingAndReportsTheNextTimeout", testWake},
		{"WokenRowsAreClaimedAgainAtTheirStage", testWakeThenClaim},
		{"WakeLeavesKeptRowsPausedAndOutOfNext", testWakeKeep},
		{"ARowPausedWithNoDueTimeIsNeverWokenNorNext", testWakeNoDueTime},

		{"ResetOrphansMakesRunningRowsPendingExceptKeptOnes", testResetOrphansKeep},
		{"ResetOrphansWithNothingKeptResetsEveryRunningRow", testResetOrphansAll},

		{"FlushAddsDeltasOncePerSeq", testFlush},
		{"FlushesOfTwoLivesWithTheSameSeqAreEachAppliedOnce", testFlushLives},
		{"FlushStopsProcessingTimeAtItsLargest", testFlushSaturates},
	}
	runAll(t, slices.Concat(tests, pressureTests, emitTests, statementTests, operatorTests, stageTests, ingressTests, monitorTests, healthTests, historyTests, traceTests, scheduledTests, refusedTests), open)
}

// runAll runs each test in parallel on a fresh harness from open.
func runAll[H any](t *testing.T, tests []testCase[H], open func(t *testing.T) H) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// ---- Exec as a whole ----

func testExecEmpty(t *testing.T, h Harness) {
	if got := h.Exec(t.Context(), nil); len(got) != 0 {
		t.Fatalf("Exec(no commands) = %v, want no events", got)
	}
}

func testExecOrder(t *testing.T, h Harness) {
	cmds := []core.Command{
		core.ResetOrphans{Op: 11},
		core.Wake{Op: 12, Now: base},
		core.Claim{Op: 13, Caps: []core.Cap{{Stage: "a", N: 1}}},
		core.Resolve{Op: 14},
		core.Flush{Op: 15, Seq: 1},
	}
	evs := h.Exec(t.Context(), cmds)
	if len(evs) != len(cmds) {
		t.Fatalf("Exec of %d commands answered %d events: %v", len(cmds), len(evs), evs)
	}
	checks := []func(core.Event) (int64, string, bool){
		func(e core.Event) (int64, string, bool) { r, ok := e.(core.OrphansReset); return r.Op, r.Err, ok },
		func(e core.Event) (int64, string, bool) { r, ok := e.(core.Woken); return r.Op, r.Err, ok },
		func(e core.Event) (int64, string, bool) { r, ok := e.(core.Claimed); return r.Op, r.Err, ok },
		func(e core.Event) (int64, string, bool) { r, ok := e.(core.Resolved); return r.Op, r.Err, ok },
		func(e core.Event) (int64, string, bool) { r, ok := e.(core.Flushed); return r.Op, r.Err, ok },
	}
	for i, check := range checks {
		op, err, ok := check(evs[i])
		want := int64(11 + i)
		if !ok || op != want || err != "" {
			t.Errorf("event %d = %v (%T); want the result of %v with op=%d and no error", i, evs[i], evs[i], cmds[i], want)
		}
	}
}

func testExecSeesOwnEffects(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	// The resolve requeues ids[0]; the claim after it, in the same transaction,
	// must see it pending again and take it (it comes before ids[1]).
	evs := h.Exec(t.Context(), []core.Command{
		core.Resolve{Op: 1, Items: []core.Item{{ID: ids[0], Stage: "a", Verdict: core.Requeue}}},
		core.Claim{Op: 2, Caps: []core.Cap{{Stage: "a", N: 1}}},
	})
	if len(evs) != 2 {
		t.Fatalf("Exec answered %d events, want 2: %v", len(evs), evs)
	}
	res, ok := evs[0].(core.Resolved)
	if !ok || res.Err != "" || len(res.Outcomes) != 1 || res.Outcomes[0].Status != core.StatusPending {
		t.Fatalf("resolve answered %v, want %d@a:pending", evs[0], ids[0])
	}
	cl, ok := evs[1].(core.Claimed)
	if !ok || cl.Err != "" {
		t.Fatalf("claim answered %v, want rows", evs[1])
	}
	if want := []core.Row{{ID: ids[0], Stage: "a"}}; !slices.Equal(cl.Rows, want) {
		t.Fatalf("claim after a requeue in the same Exec took %v, want %v (the requeued row)", cl.Rows, want)
	}
	wantRow(t, h, ids[0], "a", core.StatusRunning)
	wantRow(t, h, ids[1], "a", core.StatusPending)
}

// ---- Claim ----

func testClaimOrder(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 5)
	got := claimRows(t, h, core.Cap{Stage: "a", N: 3})
	if want := rowsAt("a", ids[:3]...); !slices.Equal(got, want) {
		t.Fatalf("claim a:3 took %v, want %v (the first three in ingress order)", got, want)
	}
	for _, id := range ids[:3] {
		wantRow(t, h, id, "a", core.StatusRunning)
	}
	for _, id := range ids[3:] {
		wantRow(t, h, id, "a", core.StatusPending)
	}
	got = claimRows(t, h, core.Cap{Stage: "a", N: 3})
	if want := rowsAt("a", ids[3:]...); !slices.Equal(got, want) {
		t.Fatalf("second claim a:3 took %v, want %v (the two left)", got, want)
	}
}

func testClaimFloor(t *testing.T, h Harness) {
	a := h.Insert(t, "a", 6)
	b := h.Insert(t, "b", 2)
	got := claimRows(t, h, core.Cap{Stage: "a", N: 2, After: a[2]}, core.Cap{Stage: "b", N: 5, After: b[1]})
	if want := rowsAt("a", a[3:5]...); !slices.Equal(got, want) {
		t.Fatalf("claim a:2 above %d, b:5 above %d took %v, want %v (the first two of a above its floor, none of b)", a[2], b[1], got, want)
	}
	for _, id := range a[:3] {
		wantRow(t, h, id, "a", core.StatusPending)
	}
	got = claimRows(t, h, core.Cap{Stage: "a", N: 9})
	if want := rowsAt("a", a[0], a[1], a[2], a[5]); !slices.Equal(got, want) {
		t.Fatalf("claim a:9 from the start took %v, want %v", got, want)
	}
}

func testClaimSettled(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	c := claim(t, h, core.Cap{Stage: "a", N: 1})
	if c.Settled != ids[2] {
		t.Fatalf("claim with no producer mid-transaction reported settled=%d, want %d (the newest row)", c.Settled, ids[2])
	}
}

func testClaimUnsettled(t *testing.T, h Harness) {
	early, commit := h.BeginInsert(t, "a")
	late := h.Insert(t, "a", 1)[0]
	if late <= early {
		t.Fatalf("a row inserted after an open producer's got id %d, not above its %d", late, early)
	}
	c := claim(t, h, core.Cap{Stage: "a", N: 5})
	if c.Settled != 0 || !slices.Equal(c.Rows, rowsAt("a", late)) {
		t.Fatalf("claim while a producer holds id %d took %v, settled=%d; want only row %d, settled=0 (a lower id may still commit)",
			early, c.Rows, c.Settled, late)
	}
	commit()
	c = claim(t, h, core.Cap{Stage: "a", N: 5})
	if c.Settled != late || !slices.Equal(c.Rows, rowsAt("a", early)) {
		t.Fatalf("claim after the producer committed took %v, settled=%d; want row %d, settled=%d", c.Rows, c.Settled, early, late)
	}
}

// testClaimKnownSettled: a claim told that ingress has settled up to an id
// (core.Claim.Settled) reports the newest row it sees while a producer is
// mid-transaction, if that row is at or below the id (the producer's row
// will come above it); one told less reports nothing settled, as before.
func testClaimKnownSettled(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	_, commit := h.BeginInsert(t, "a")
	defer commit()
	for _, c := range []struct {
		known, want int64
	}{
		{ids[2], ids[2]},
		{ids[2] + 100, ids[2]},
		{ids[1], 0},
		{0, 0},
	} {
		got := exec(t, h, core.Claim{Op: 42, Caps: []core.Cap{{Stage: "a", N: 1}}, Settled: c.known},
			func(e core.Claimed) (int64, string) { return e.Op, e.Err })
		if got.Settled != c.want {
			t.Errorf("claim that knew ingress settled up to %d, newest row %d, a producer mid-transaction: settled=%d, want %d",
				c.known, ids[2], got.Settled, c.want)
		}
	}
}

func testClaimMessage(t *testing.T, h Harness) {
	text := h.InsertMessage(t, "m", `{"b": [1, 2], "a": "x"}`, []byte("héllo"))
	binary := h.InsertMessage(t, "m", `{}`, []byte{0xff, 0, 'a'})
	null := h.InsertMessage(t, "m", `{}`, nil)
	empty := h.InsertMessage(t, "m", `{}`, []byte{})
	other := h.InsertMessage(t, "i", `{"a": 1}`, []byte("not read"))
	got := claimRows(t, h, core.Cap{Stage: "m", N: 10, LineMax: 1024}, core.Cap{Stage: "i", N: 10})
	if len(got) != 5 {
		t.Fatalf("claim took %v, want 5 rows", got)
	}
	want := map[int64]string{
		text:   `{state={"a":"x","b":[1,2]} payload=6:"héllo"}`,
		binary: `{state={} payload=3:"\xff\x00a"}`,
		null:   `{state={} payload=-1:""}`,
		empty:  `{state={} payload=0:""}`,
		other:  `<nil>`,
	}
	for _, r := range got {
		if r.Attempts != 0 {
			t.Errorf("row %d: attempts %d, want 0", r.ID, r.Attempts)
		}
		if g := messageText(t, r.Message); g != want[r.ID] {
			t.Errorf("row %d at %s: message %s, want %s", r.ID, r.Stage, g, want[r.ID])
		}
	}
}

// messageText is a message with its state compacted (both queues may print
// jsonb their own way; the keys of a jsonb object come in a fixed order).
func messageText(t *testing.T, m *core.Message) string {
	t.Helper()
	if m == nil {
		return "<nil>"
	}
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(m.State)); err != nil {
		t.Fatalf("state %q is not JSON: %v", m.State, err)
	}
	var obj map[string]any
	if err := json.Unmarshal(b.Bytes(), &obj); err != nil {
		t.Fatalf("state %q is not a JSON object: %v", m.State, err)
	}
	sorted, _ := json.Marshal(obj)
	return fmt.Sprintf("{state=%s payload=%d:%q}", sorted, m.PayloadSize, m.Payload)
}

// testClaimMore: a claim that took its whole cap names the stage in More when
// another pending row was there (held rows aside), and only then.
func testClaimMore(t *testing.T, h Harness) {
	a := h.Insert(t, "a", 3)
	h.Insert(t, "b", 2)
	h.Insert(t, "c", 1)
	got := claim(t, h, core.Cap{Stage: "a", N: 2}, core.Cap{Stage: "b", N: 2}, core.Cap{Stage: "c", N: 2})
	if len(got.Rows) != 5 || !slices.Equal(got.More, []string{"a"}) {
		t.Fatalf("claim = %v, more %v; want 5 rows, and more at a only (b's cap taken exactly, c's not)", got.Rows, got.More)
	}
	resolve(t, h, core.Item{ID: a[0], Stage: "a", Verdict: core.Requeue})
	got = claim(t, h, core.Cap{Stage: "a", N: 1})
	if len(got.Rows) != 1 || got.Rows[0].ID != a[0] || !slices.Equal(got.More, []string{"a"}) {
		t.Fatalf("claim = %v, more %v; want row %d, and more at a (row %d)", got.Rows, got.More, a[0], a[2])
	}
	h.Insert(t, "d", 1)
	if got = claim(t, h, core.Cap{Stage: "a", N: 1}, core.Cap{Stage: "d", N: 1}); len(got.Rows) != 2 || len(got.More) != 0 {
		t.Fatalf("claim = %v, more %v; want rows %d and d's, nothing more", got.Rows, got.More, a[2])
	}
	h.Insert(t, "e", 2)
	first := claimRows(t, h, core.Cap{Stage: "e", N: 1})
	resolve(t, h, core.Item{ID: first[0].ID, Stage: "e", Verdict: core.Requeue})
	got = exec(t, h, core.Claim{Op: 42, Caps: []core.Cap{{Stage: "e", N: 1}}, Exclude: []int64{first[0].ID}},
		func(e core.Claimed) (int64, string) { return e.Op, e.Err })
	if len(got.Rows) != 1 || len(got.More) != 0 {
		t.Fatalf("claim excluding row %d = %v, more %v; want the other row and nothing more (a held row is not more)", first[0].ID, got.Rows, got.More)
	}
}

func testClaimAttempts(t *testing.T, h Harness) {
	id := h.Insert(t, "a", 1)[0]
	got := claimRows(t, h, core.Cap{Stage: "a", N: 1})
	if len(got) != 1 || got[0].ID != id || got[0].Attempts != 0 || got[0].Message != nil {
		t.Fatalf("claim took %+v, want row %d with attempts 0 and no message (INPUT = id)", got, id)
	}
}

func testClaimMessageOversize(t *testing.T, h Harness) {
	big := h.InsertMessage(t, "m", `{}`, bytes.Repeat([]byte("x"), 2000))
	fits := h.InsertMessage(t, "m", `{}`, bytes.Repeat([]byte("y"), 1024))
	got := claimRows(t, h, core.Cap{Stage: "m", N: 10, LineMax: 1024})
	if len(got) != 2 || got[0].ID != big || got[1].ID != fits {
		t.Fatalf("claim took %v, want rows %d and %d", got, big, fits)
	}
	if m := got[0].Message; m == nil || m.PayloadSize != 2000 || m.Payload != nil {
		t.Errorf("payload over LineMax: message %+v, want size 2000 and the payload not read", m)
	}
	if m := got[1].Message; m == nil || m.PayloadSize != 1024 || len(m.Payload) != 1024 {
		t.Errorf("payload of LineMax bytes: message %+v, want it read", m)
	}
}

func testClaimPerStageCaps(t *testing.T, h Harness) {
	a := h.Insert(t, "a", 4)
	b := h.Insert(t, "b", 4)
	got := claimRows(t, h, core.Cap{Stage: "a", N: 1}, core.Cap{Stage: "b", N: 3})
	want := append(rowsAt("a", a[0]), rowsAt("b", b[:3]...)...)
	if !slices.Equal(got, want) {
		t.Fatalf("claim a:1 b:3 took %v, want %v", got, want)
	}
}

func testClaimSeveralStages(t *testing.T, h Harness) {
	var want []core.Row
	for range 3 {
		want = append(want, rowsAt("a", h.Insert(t, "a", 1)...)...)
		want = append(want, rowsAt("b", h.Insert(t, "b", 1)...)...)
	}
	// Caps name b first; the answer is still in ingress order.
	got := claimRows(t, h, core.Cap{Stage: "b", N: 10}, core.Cap{Stage: "a", N: 10})
	if !slices.Equal(got, want) {
		t.Fatalf("claim b:10 a:10 took %v, want %v (every row, in ingress order)", got, want)
	}
}

func testClaimOnlyPending(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 4)
	claimRows(t, h, core.Cap{Stage: "a", N: 4})
	h.Stage(t, ids[0], "a", "a", core.StatusDone, time.Time{})
	h.Stage(t, ids[1], "a", "a", core.StatusPaused, base.Add(time.Hour))
	h.Stage(t, ids[2], "a", "a", core.StatusFailed, time.Time{})
	// ids[3] stays running.
	more := h.Insert(t, "a", 2)
	got := claimRows(t, h, core.Cap{Stage: "a", N: 10})
	if want := rowsAt("a", more...); !slices.Equal(got, want) {
		t.Fatalf("claim a:10 took %v, want only the pending rows %v", got, want)
	}
	for i, status := range []core.RowStatus{core.StatusDone, core.StatusPaused, core.StatusFailed, core.StatusRunning} {
		wantRow(t, h, ids[i], "a", status)
	}
}

func testClaimNothing(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	for _, caps := range [][]core.Cap{
		{{Stage: "a", N: 0}},
		{{Stage: "nosuch", N: 5}},
		{{Stage: "a", N: 0}, {Stage: "nosuch", N: 5}},
		nil,
	} {
		cl := claim(t, h, caps...)
		if len(cl.Rows) != 0 {
			t.Errorf("claim %v took %v, want nothing", caps, cl.Rows)
		}
		if cl.Epoch == "" {
			t.Errorf("claim %v answered no epoch; want the crash sentinel's token even when it takes nothing", caps)
		}
	}
	for _, id := range ids {
		wantRow(t, h, id, "a", core.StatusPending)
	}
}

func testEpoch(t *testing.T, h Harness) {
	h.Insert(t, "a", 2)
	first := claim(t, h, core.Cap{Stage: "a", N: 1})
	second := claim(t, h, core.Cap{Stage: "a", N: 1})
	if first.Epoch == "" || second.Epoch != first.Epoch {
		t.Fatalf("epochs of two claims = %q, %q; want the same non-empty token", first.Epoch, second.Epoch)
	}
	h.ClearEpoch(t)
	third := claim(t, h)
	if third.Epoch == "" || third.Epoch == first.Epoch {
		t.Fatalf("epoch after a crash = %q; want a new non-empty token (old %q)", third.Epoch, first.Epoch)
	}
	if fourth := claim(t, h); fourth.Epoch != third.Epoch {
		t.Fatalf("epoch of the claim after = %q; want the new token %q kept", fourth.Epoch, third.Epoch)
	}
}

// ---- Resolve ----

func testResolveAdvanced(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	claimRows(t, h, core.Cap{Stage: "a", N: 3})
	for _, id := range ids {
		h.Stage(t, id, "a", "b", core.StatusRunning, time.Time{})
	}
	// Whatever the item asks for, a row its stage advanced is requeued, without
	// a reason.
	got := resolve(t, h,
		core.Item{ID: ids[0], Stage: "a", Verdict: core.Requeue},
		core.Item{ID: ids[1], Stage: "a", Verdict: core.Fail, Reason: "crashed"},
		core.Item{ID: ids[2], Stage: "a", Verdict: core.TimeOut, Reason: "too slow"},
	)
	want := []core.Outcome{
		{ID: ids[0], Stage: "b", Status: core.StatusPending},
		{ID: ids[1], Stage: "b", Status: core.StatusPending},
		{ID: ids[2], Stage: "b", Status: core.StatusPending},
	}
	wantOutcomes(t, got, want)
	for _, id := range ids {
		wantRowError(t, h, id, "b", core.StatusPending, "")
	}
}

func testResolveFailed(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	got := resolve(t, h, core.Item{ID: ids[0], Stage: "a", Verdict: core.Fail, Reason: "exit 3: bad input"})
	wantOutcomes(t, got, []core.Outcome{{ID: ids[0], Stage: "a", Status: core.StatusFailed, Error: "exit 3: bad input", Matched: true}})
	wantRowError(t, h, ids[0], "a", core.StatusFailed, "exit 3: bad input")
}

func testResolveTimeout(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	got := resolve(t, h, core.Item{ID: ids[0], Stage: "a", Verdict: core.TimeOut, Reason: "MAX_RUNTIME 300s exceeded"})
	wantOutcomes(t, got, []core.Outcome{{ID: ids[0], Stage: "a", Status: core.StatusTimeout, Error: "MAX_RUNTIME 300s exceeded", Matched: true}})
	wantRowError(t, h, ids[0], "a", core.StatusTimeout, "MAX_RUNTIME 300s exceeded")
}

func testResolveRequeue(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	got := resolve(t, h, core.Item{ID: ids[0], Stage: "a", Verdict: core.Requeue})
	wantOutcomes(t, got, []core.Outcome{{ID: ids[0], Stage: "a", Status: core.StatusPending, Matched: true}})
	wantRowError(t, h, ids[0], "a", core.StatusPending, "")
}

func testResolveLeavesOthers(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 5)
	claimRows(t, h, core.Cap{Stage: "a", N: 4})
	until := base.Add(90 * time.Minute)
	h.Stage(t, ids[0], "a", "a", core.StatusDone, time.Time{})
	h.Stage(t, ids[1], "a", "a", core.StatusPaused, until)
	h.Stage(t, ids[2], "a", "a", core.StatusFailed, time.Time{})
	resolve(t, h, core.Item{ID: ids[3], Stage: "a", Verdict: core.Fail, Reason: "first reason"})
	// ids[4] was never claimed: pending.
	var items []core.Item
	for _, id := range ids {
		items = append(items, core.Item{ID: id, Stage: "a", Verdict: core.TimeOut, Reason: "second reason"})
	}
	got := resolve(t, h, items...)
	want := []core.Outcome{
		{ID: ids[0], Stage: "a", Status: core.StatusDone},
		{ID: ids[1], Stage: "a", Status: core.StatusPaused, Timeout: until},
		{ID: ids[2], Stage: "a", Status: core.StatusFailed},
		{ID: ids[3], Stage: "a", Status: core.StatusFailed, Error: "first reason"},
		{ID: ids[4], Stage: "a", Status: core.StatusPending},
	}
	wantOutcomes(t, got, want)
	wantRowError(t, h, ids[0], "a", core.StatusDone, "")
	wantRowError(t, h, ids[1], "a", core.StatusPaused, "")
	wantRowError(t, h, ids[2], "a", core.StatusFailed, "")
	wantRowError(t, h, ids[3], "a", core.StatusFailed, "first reason")
	wantRowError(t, h, ids[4], "a", core.StatusPending, "")
	if _, _, timeout, _, _ := h.Row(t, ids[1]); !timeout.Equal(until) {
		t.Errorf("paused row %d has timeout %v after resolve, want %v kept", ids[1], timeout, until)
	}
}

func testResolveEpochHeld(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	cl := claim(t, h, core.Cap{Stage: "a", N: 1})
	got := resolve(t, h, core.Item{ID: ids[0], Stage: "a", Verdict: core.Answered, Reason: "stage answered 0 but left the row running", Epoch: cl.Epoch})
	wantOutcomes(t, got, []core.Outcome{{ID: ids[0], Stage: "a", Status: core.StatusFailed, Error: "stage answered 0 but left the row running", Matched: true}})
}

func testResolveEpochLost(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	cl := claim(t, h, core.Cap{Stage: "a", N: 2})
	h.ClearEpoch(t)
	const reason = "stage answered 0 but left the row running"
	got := resolve(t, h,
		core.Item{ID: ids[0], Stage: "a", Verdict: core.Answered, Reason: reason, Epoch: cl.Epoch},
		// A token the sentinel never held counts as lost too.
		core.Item{ID: ids[1], Stage: "a", Verdict: core.Answered, Reason: reason, Epoch: cl.Epoch + "-other"},
	)
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "a", Status: core.StatusPending, Matched: true},
		{ID: ids[1], Stage: "a", Status: core.StatusPending, Matched: true},
	})
	wantRowError(t, h, ids[0], "a", core.StatusPending, "")
	wantRowError(t, h, ids[1], "a", core.StatusPending, "")
}

func testResolveMissing(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	missing := ids[0] + 1000
	got := resolve(t, h, core.Item{ID: missing, Stage: "a", Verdict: core.Fail, Reason: "x"})
	wantOutcomes(t, got, []core.Outcome{{ID: missing}})
	if _, _, _, _, ok := h.Row(t, missing); ok {
		t.Fatalf("resolve of missing row %d created it", missing)
	}
}

func testResolveOrder(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 4)
	claimRows(t, h, core.Cap{Stage: "a", N: 4})
	h.Stage(t, ids[1], "a", "b", core.StatusRunning, time.Time{})
	h.Stage(t, ids[2], "a", "a", core.StatusDone, time.Time{})
	missing := ids[3] + 1000
	got := resolve(t, h,
		core.Item{ID: ids[3], Stage: "a", Verdict: core.Fail, Reason: "r3"},
		core.Item{ID: missing, Stage: "a", Verdict: core.Fail, Reason: "rm"},
		core.Item{ID: ids[2], Stage: "a", Verdict: core.Fail, Reason: "r2"},
		core.Item{ID: ids[0], Stage: "a", Verdict: core.Requeue},
		core.Item{ID: ids[1], Stage: "a", Verdict: core.TimeOut, Reason: "r1"},
	)
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[3], Stage: "a", Status: core.StatusFailed, Error: "r3", Matched: true},
		{ID: missing},
		{ID: ids[2], Stage: "a", Status: core.StatusDone},
		{ID: ids[0], Stage: "a", Status: core.StatusPending, Matched: true},
		{ID: ids[1], Stage: "b", Status: core.StatusPending},
	})
}

// ---- Retries ----

func retryItem(id int64, stage string, until time.Time, reason string) core.Item {
	return core.Item{ID: id, Stage: stage, Verdict: core.Retry, Until: until, Reason: reason}
}

// retryOnce claims row id at stage (wanting attempts as its count), retries it
// until until with reason, and wakes it.
func retryOnce(t *testing.T, h Harness, id int64, stage string, attempts int, until time.Time, reason string) {
	t.Helper()
	if rows := claimRows(t, h, core.Cap{Stage: stage, N: 1}); len(rows) != 1 || rows[0] != (core.Row{ID: id, Stage: stage, Attempts: attempts}) {
		t.Fatalf("claim at %s = %v, want row %d with attempts %d", stage, rows, id, attempts)
	}
	got := resolve(t, h, retryItem(id, stage, until, reason))
	wantOutcomes(t, got, []core.Outcome{{ID: id, Stage: stage, Status: core.StatusPaused, Timeout: until, Error: reason, Matched: true}})
	if w := wakeAt(t, h, until.Add(-time.Microsecond)); w.Count != 0 || !w.Next.Equal(until) {
		t.Fatalf("wake before the retry is due = %v, want nothing woken and next %v", w, until)
	}
	if w := wakeAt(t, h, until); w.Count != 1 {
		t.Fatalf("wake when the retry is due = %v, want the row woken", w)
	}
}

func testRetry(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	retryOnce(t, h, ids[0], "a", 0, base.Add(time.Second), "service down")
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	until := base.Add(3 * time.Second)
	resolve(t, h, retryItem(ids[0], "a", until, "still down"))
	// The latest reason is in state.dispatch_error while the row waits, and
	// gone once it is pending again.
	if s := h.State(t, ids[0]); s["dispatch_error"] != "still down" {
		t.Errorf("state of a waiting retry = %v, want dispatch_error \"still down\"", s)
	}
	wakeAt(t, h, until)
	if s := h.State(t, ids[0]); s["dispatch_error"] != nil {
		t.Errorf("state of a woken retry = %v, want no dispatch_error", s)
	}
	if rows := claimRows(t, h, core.Cap{Stage: "a", N: 1}); len(rows) != 1 || rows[0].Attempts != 2 {
		t.Fatalf("claim after two retries = %v, want attempts 2", rows)
	}
}

func testRetryResetOnMove(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	resolve(t, h, retryItem(ids[0], "a", base, "later"), retryItem(ids[1], "a", base, "later"))
	wakeAt(t, h, base)
	if rows := claimRows(t, h, core.Cap{Stage: "a", N: 2}); len(rows) != 2 || rows[0].Attempts != 1 || rows[1].Attempts != 1 {
		t.Fatalf("claim after a retry = %v, want both with attempts 1", rows)
	}
	// One answers its advance, the other writes it itself and answers 0.
	h.Stage(t, ids[1], "a", "b", core.StatusRunning, time.Time{})
	resolve(t, h, move(ids[0], "a", "b"), core.Item{ID: ids[1], Stage: "a", Verdict: core.Answered, Reason: "stuck"})
	if rows := claimRows(t, h, core.Cap{Stage: "b", N: 2}); !slices.Equal(rows, rowsAt("b", ids...)) {
		t.Fatalf("claim at b after the moves = %v, want %v with attempts 0", rows, rowsAt("b", ids...))
	}
	// A pause the stage answers, or a move back to the same stage, is no move
	// to another stage: the count stays.
	ids = h.Insert(t, "c", 1)
	retryOnce(t, h, ids[0], "c", 0, base, "later")
	claimRows(t, h, core.Cap{Stage: "c", N: 1})
	resolve(t, h, move(ids[0], "c", "c"))
	if rows := claimRows(t, h, core.Cap{Stage: "c", N: 1}); len(rows) != 1 || rows[0].Attempts != 1 {
		t.Fatalf("claim after a move to the same stage = %v, want attempts 1", rows)
	}
}

// testRetryResetOnStageMove: a stage writes its advance itself and the
// dispatcher dies before it hears of it; the start-up reset makes the row
// pending at the next stage, where its count must start from 0, not from the
// retries it had at the stage before.
func testRetryResetOnStageMove(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	retryOnce(t, h, ids[0], "a", 0, base, "later")
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	h.Stage(t, ids[0], "a", "b", core.StatusRunning, time.Time{})
	if got := resetOrphans(t, h); got.Count != 1 {
		t.Fatalf("reset orphans = count %d, want 1", got.Count)
	}
	if rows := claimRows(t, h, core.Cap{Stage: "b", N: 1}); !slices.Equal(rows, rowsAt("b", ids...)) {
		t.Fatalf("claim at b after the stage's own advance and a reset = %v, want %v (attempts 0)", rows, rowsAt("b", ids...))
	}
}

func testRetryGuard(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	h.Stage(t, ids[0], "a", "a", core.StatusDone, time.Time{})
	h.Stage(t, ids[1], "a", "b", core.StatusRunning, time.Time{})
	got := resolve(t, h, retryItem(ids[0], "a", base, "x"), retryItem(ids[1], "a", base, "x"))
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "a", Status: core.StatusDone},
		{ID: ids[1], Stage: "b", Status: core.StatusPending},
	})
	if rows := claimRows(t, h, core.Cap{Stage: "b", N: 1}); len(rows) != 1 || rows[0].Attempts != 0 {
		t.Fatalf("claim at b = %v, want attempts 0", rows)
	}
}

// ---- Answered transitions (Move) ----

func move(id int64, stage, to string) core.Item {
	return core.Item{ID: id, Stage: stage, Verdict: core.Move, To: to}
}

func testMoveAdvance(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	got := resolve(t, h, move(ids[0], "a", "b"), move(ids[1], "a", "a"))
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "b", Status: core.StatusPending, Matched: true},
		{ID: ids[1], Stage: "a", Status: core.StatusPending, Matched: true},
	})
	wantRowError(t, h, ids[0], "b", core.StatusPending, "")
	// Pending at the next stage: its claim takes it, in one step from running.
	if rows := claimRows(t, h, core.Cap{Stage: "b", N: 5}); len(rows) != 1 || rows[0] != (core.Row{ID: ids[0], Stage: "b"}) {
		t.Fatalf("claim at b after the move = %v, want row %d", rows, ids[0])
	}
}

func testMoveDone(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	got := resolve(t, h, move(ids[0], "a", core.TargetDone))
	wantOutcomes(t, got, []core.Outcome{{ID: ids[0], Stage: "a", Status: core.StatusDone, Matched: true}})
	wantRowError(t, h, ids[0], "a", core.StatusDone, "")
}

func testMovePause(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	until := base.Add(90 * time.Second)
	it := move(ids[0], "a", core.TargetPaused)
	it.Until = until
	got := resolve(t, h, it)
	wantOutcomes(t, got, []core.Outcome{{ID: ids[0], Stage: "a", Status: core.StatusPaused, Timeout: until, Matched: true}})
	if w := wakeAt(t, h, until.Add(-time.Microsecond)); w.Count != 0 || !w.Next.Equal(until) {
		t.Fatalf("wake before the answered timeout = %v, want nothing woken and next %v", w, until)
	}
	if w := wakeAt(t, h, until); w.Count != 1 {
		t.Fatalf("wake at the answered timeout = %v, want the row woken", w)
	}
	wantRowError(t, h, ids[0], "a", core.StatusPending, "")
}

func testMovePatch(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	first := move(ids[0], "a", "b")
	first.Patch = `{"keep":1,"over":"x","nested":{"deep":[1,2]}}`
	resolve(t, h, first)
	claimRows(t, h, core.Cap{Stage: "b", N: 1})
	second := move(ids[0], "b", core.TargetDone)
	second.Patch = `{"over":{"now":"an object"},"text":"é ☃ \u00e9 \ud83d\ude00 \"q\"","n":-1.5e3}`
	resolve(t, h, second)
	got := h.State(t, ids[0])
	want := map[string]any{
		"keep": float64(1), "over": map[string]any{"now": "an object"}, "nested": map[string]any{"deep": []any{float64(1), float64(2)}},
		"text": "é ☃ é 😀 \"q\"", "n": float64(-1500),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("state after two patches = %v, want %v (top-level keys replaced, others kept)", got, want)
	}
}

func testMoveGuardMiss(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	claimRows(t, h, core.Cap{Stage: "a", N: 3})
	// The stage wrote its own transition and answered one too: nothing is
	// written over it, and a row it advanced is requeued where it is.
	h.Stage(t, ids[0], "a", "c", core.StatusRunning, time.Time{})
	h.Stage(t, ids[1], "a", "a", core.StatusDone, time.Time{})
	patched := move(ids[0], "a", "b")
	patched.Patch = `{"lost":true}`
	got := resolve(t, h, patched, move(ids[1], "a", "b"), move(ids[2], "z", "b"))
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "c", Status: core.StatusPending},
		{ID: ids[1], Stage: "a", Status: core.StatusDone},
		{ID: ids[2], Stage: "a", Status: core.StatusPending},
	})
	if st := h.State(t, ids[0]); st["lost"] != nil {
		t.Errorf("a guard miss merged its patch: state %v", st)
	}
}

func testMoveMixed(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	cl := claim(t, h, core.Cap{Stage: "a", N: 3})
	h.Stage(t, ids[1], "a", "b", core.StatusRunning, time.Time{}) // a stage that writes its own
	got := resolve(t, h,
		move(ids[0], "a", "b"),
		core.Item{ID: ids[1], Stage: "a", Verdict: core.Answered, Reason: "stuck", Epoch: cl.Epoch},
		core.Item{ID: ids[2], Stage: "a", Verdict: core.Answered, Reason: "stuck", Epoch: cl.Epoch},
	)
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "b", Status: core.StatusPending, Matched: true},
		{ID: ids[1], Stage: "b", Status: core.StatusPending},
		{ID: ids[2], Stage: "a", Status: core.StatusFailed, Error: "stuck", Matched: true},
	})
}

// testMoveClaim: a move with Claim that matches writes its row running at the
// target (one row version), reports it running, Matched, with its attempts; a
// claim does not take it and a reset that does not keep it makes it pending. A
// claiming move whose guard misses writes nothing, as any move.
func testMoveClaim(t *testing.T, h Harness) {
	retried := h.Insert(t, "a", 1)[0]
	retryOnce(t, h, retried, "a", 0, base, "later") // attempts 1 at a
	wakeAt(t, h, base)
	ids := append(h.Insert(t, "a", 3), retried)
	claimRows(t, h, core.Cap{Stage: "a", N: 4})
	h.Stage(t, ids[2], "a", "c", core.StatusRunning, time.Time{})
	claiming := func(it core.Item) core.Item { it.Claim = true; return it }
	got := resolve(t, h, claiming(move(ids[0], "a", "b")), move(ids[1], "a", "b"),
		claiming(move(ids[2], "a", "b")), claiming(move(ids[3], "a", "a")))
	wantOutcomes(t, got, []core.Outcome{
		{ID: ids[0], Stage: "b", Status: core.StatusRunning, Matched: true},
		{ID: ids[1], Stage: "b", Status: core.StatusPending, Matched: true},
		{ID: ids[2], Stage: "c", Status: core.StatusPending},
		{ID: ids[3], Stage: "a", Status: core.StatusRunning, Matched: true, Attempts: 1}, // the same stage: attempts stay
	})
	wantRowError(t, h, ids[0], "b", core.StatusRunning, "")
	if rows := claimRows(t, h, core.Cap{Stage: "b", N: 5}); !slices.Equal(rows, rowsAt("b", ids[1])) {
		t.Fatalf("claim at b after the moves = %v, want only row %d (row %d is running already)", rows, ids[1], ids[0])
	}
	if r := resetOrphans(t, h, ids[1], ids[3]); r.Count != 1 {
		t.Fatalf("reset keeping %d, %d = count %d, want 1 (row %d, which no one holds)", ids[1], ids[3], r.Count, ids[0])
	}
	wantRowError(t, h, ids[0], "b", core.StatusPending, "")
}

// testMoveClaimMessage: a claiming move with LineMax reads the row as a claim
// for an INPUT = message stage does, after the patch it merged: its state and
// payload, or only the size of a payload over LineMax.
func testMoveClaimMessage(t *testing.T, h Harness) {
	small := h.InsertMessage(t, "a", `{"a": "x"}`, []byte("héllo"))
	big := h.InsertMessage(t, "a", `{}`, bytes.Repeat([]byte("x"), 2000))
	plain := h.InsertMessage(t, "a", `{}`, []byte("p"))
	claimRows(t, h, core.Cap{Stage: "a", N: 3})
	first := move(small, "a", "m")
	first.Claim, first.LineMax, first.Patch = true, 1024, `{"n":2}`
	second := move(big, "a", "m")
	second.Claim, second.LineMax = true, 1024
	third := move(plain, "a", "i")
	third.Claim = true // to a stage whose INPUT is id: no message read
	got := resolve(t, h, first, second, third)
	if len(got) != 3 {
		t.Fatalf("outcomes %v, want 3", got)
	}
	if g, want := messageText(t, got[0].Message), `{state={"a":"x","n":2} payload=6:"héllo"}`; g != want {
		t.Errorf("row %d: message %s, want %s (the state after the patch)", small, g, want)
	}
	if m := got[1].Message; m == nil || m.PayloadSize != 2000 || m.Payload != nil {
		t.Errorf("row %d: message %+v, want its size 2000 and no payload", big, m)
	}
	if got[2].Message != nil || got[2].Status != core.StatusRunning {
		t.Errorf("row %d: outcome %v, want running at i and no message", plain, got[2])
	}
}

// ---- Wake ----

func testWake(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	claimRows(t, h, core.Cap{Stage: "a", N: 3})
	h.Stage(t, ids[0], "a", "a", core.StatusPaused, base)
	h.Stage(t, ids[1], "a", "a", core.StatusPaused, base.Add(time.Hour))
	h.Stage(t, ids[2], "a", "a", core.StatusPaused, base.Add(2*time.Hour))

	steps := []struct {
		now     time.Time
		count   int
		next    time.Time
		pending []int64
	}{
		{base.Add(-time.Second), 0, base, nil},                            // nothing due yet
		{base, 1, base.Add(time.Hour), ids[:1]},                           // a timeout equal to now is due
		{base.Add(90 * time.Minute), 1, base.Add(2 * time.Hour), ids[:2]}, // only what is due
		{base.Add(3 * time.Hour), 1, time.Time{}, ids},                    // the last one; nothing left paused
		{base.Add(4 * time.Hour), 0, time.Time{}, ids},                    // nothing at all
	}
	for i, st := range steps {
		w := wakeAt(t, h, st.now)
		if w.Count != st.count || !w.Next.Equal(st.next) {
			t.Fatalf("step %d: wake at %v = count %d next %v; want count %d next %v",
				i, st.now, w.Count, w.Next, st.count, st.next)
		}
		for _, id := range ids {
			want := core.StatusPaused
			if slices.Contains(st.pending, id) {
				want = core.StatusPending
			}
			wantRow(t, h, id, "a", want)
		}
	}
}

func testWakeThenClaim(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 1)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	h.Stage(t, ids[0], "a", "b", core.StatusPaused, base)
	wakeAt(t, h, base)
	got := claimRows(t, h, core.Cap{Stage: "a", N: 5}, core.Cap{Stage: "b", N: 5})
	if want := rowsAt("b", ids[0]); !slices.Equal(got, want) {
		t.Fatalf("claim after wake took %v, want %v (pending again at the stage that paused it)", got, want)
	}
}

func testWakeKeep(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	claimRows(t, h, core.Cap{Stage: "a", N: 3})
	h.Stage(t, ids[0], "a", "a", core.StatusPaused, base)                   // due, but still held by a worker
	h.Stage(t, ids[1], "a", "a", core.StatusPaused, base)                   // due
	h.Stage(t, ids[2], "a", "a", core.StatusPaused, base.Add(-time.Minute)) // due, held
	w := exec(t, h, core.Wake{Op: 42, Now: base, Keep: []int64{ids[0], ids[2]}},
		func(e core.Woken) (int64, string) { return e.Op, e.Err })
	if w.Count != 1 || !w.Next.IsZero() {
		t.Fatalf("wake keeping %d and %d = count %d next %v; want 1 woken and no next (kept rows do not count)", ids[0], ids[2], w.Count, w.Next)
	}
	wantRow(t, h, ids[0], "a", core.StatusPaused)
	wantRow(t, h, ids[1], "a", core.StatusPending)
	wantRow(t, h, ids[2], "a", core.StatusPaused)
}

// A stage may pause a row with no due time (a NULL timeout): such a row is
// never woken (it waits for an operator) and is no wake's next; a resolve
// reports it paused with no Timeout.
func testWakeNoDueTime(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	h.Stage(t, ids[0], "a", "a", core.StatusPaused, time.Time{})
	h.Stage(t, ids[1], "a", "a", core.StatusPaused, base.Add(time.Hour))
	if w := wakeAt(t, h, base); w.Count != 0 || !w.Next.Equal(base.Add(time.Hour)) {
		t.Fatalf("wake at %v = count %d next %v; want none woken and next %v (the row with no due time is neither)", base, w.Count, w.Next, base.Add(time.Hour))
	}
	if w := wakeAt(t, h, base.Add(2*time.Hour)); w.Count != 1 || !w.Next.IsZero() {
		t.Fatalf("wake two hours on = count %d next %v; want row %d woken and no next", w.Count, w.Next, ids[1])
	}
	wantRow(t, h, ids[0], "a", core.StatusPaused)
	o := resolve(t, h, core.Item{ID: ids[0], Stage: "a", Verdict: core.Answered, Reason: "r"})[0]
	if o.Status != core.StatusPaused || !o.Timeout.IsZero() {
		t.Fatalf("resolve of the row paused with no due time: %+v; want it paused, with no Timeout", o)
	}
}

// ---- ResetOrphans ----

func testResetOrphansKeep(t *testing.T, h Harness) {
	a := h.Insert(t, "a", 5)
	b := h.Insert(t, "b", 2)
	claimRows(t, h, core.Cap{Stage: "a", N: 5}, core.Cap{Stage: "b", N: 2})
	h.Stage(t, a[3], "a", "a", core.StatusDone, time.Time{})
	h.Stage(t, a[4], "a", "a", core.StatusPaused, base)
	h.Stage(t, b[1], "b", "c", core.StatusRunning, time.Time{}) // advanced, still running
	got := resetOrphans(t, h, a[0], b[1])
	if got.Count != 3 {
		t.Errorf("reset orphans keeping %d and %d reset %d rows, want 3 (%d, %d, %d)", a[0], b[1], got.Count, a[1], a[2], b[0])
	}
	wantRow(t, h, a[0], "a", core.StatusRunning)
	wantRow(t, h, a[1], "a", core.StatusPending)
	wantRow(t, h, a[2], "a", core.StatusPending)
	wantRow(t, h, a[3], "a", core.StatusDone)
	wantRow(t, h, a[4], "a", core.StatusPaused)
	wantRow(t, h, b[0], "b", core.StatusPending)
	wantRow(t, h, b[1], "c", core.StatusRunning)
}

func testResetOrphansAll(t *testing.T, h Harness) {
	ids := h.Insert(t, "a", 3)
	claimRows(t, h, core.Cap{Stage: "a", N: 2})
	h.Stage(t, ids[1], "a", "b", core.StatusRunning, time.Time{})
	got := resetOrphans(t, h)
	if got.Count != 2 {
		t.Errorf("reset orphans = count %d; want 2", got.Count)
	}
	wantRow(t, h, ids[0], "a", core.StatusPending)
	wantRow(t, h, ids[1], "b", core.StatusPending)
	wantRow(t, h, ids[2], "a", core.StatusPending)
}

// ---- Flush ----

func testFlush(t *testing.T, h Harness) {
	first := core.Flush{Life: 5, Seq: 1, StagePasses: 10, MessagesLeft: 3, Stages: []core.StageDelta{
		{Stage: "a", Processed: 5, Failed: 1, Timeouts: 2, Crashes: 3, ProcessingUS: 1000},
		{Stage: "b", Processed: 4, ProcessingUS: 400},
	}}
	flush(t, h, first)
	wantStamped(t, h)
	wantStats(t, h, "after seq 1", map[string]core.StageDelta{
		"a": {Stage: "a", Processed: 5, Failed: 1, Timeouts: 2, Crashes: 3, ProcessingUS: 1000},
		"b": {Stage: "b", Processed: 4, ProcessingUS: 400},
	}, 10, 3, 1)

	flush(t, h, first) // its reply was lost; the core sends it again
	wantStats(t, h, "after seq 1 replayed", map[string]core.StageDelta{
		"a": {Stage: "a", Processed: 5, Failed: 1, Timeouts: 2, Crashes: 3, ProcessingUS: 1000},
		"b": {Stage: "b", Processed: 4, ProcessingUS: 400},
	}, 10, 3, 1)

	flush(t, h, core.Flush{Life: 5, Seq: 2, StagePasses: 1, MessagesLeft: 1, Stages: []core.StageDelta{
		{Stage: "a", Processed: 1, ProcessingUS: 50, Retries: 2},
		{Stage: "c", Crashes: 1, GuardMisses: 4, RateHeldUS: 7000, Emitted: 3},
		{Stage: "c", Retries: 1, RateHeldUS: 500, Emitted: 2, EmitsDropped: 6},
	}})
	want := map[string]core.StageDelta{
		"a": {Stage: "a", Processed: 6, Failed: 1, Timeouts: 2, Crashes: 3, ProcessingUS: 1050, Retries: 2},
		"b": {Stage: "b", Processed: 4, ProcessingUS: 400},
		"c": {Stage: "c", Crashes: 1, GuardMisses: 4, Retries: 1, RateHeldUS: 7500, Emitted: 5, EmitsDropped: 6},
	}
	wantStats(t, h, "after seq 2", want, 11, 4, 2)

	flush(t, h, first) // an older seq is never applied again
	wantStats(t, h, "after seq 1 sent after seq 2", want, 11, 4, 2)
}

// testFlushSaturates: processing_us, which adds up the fused microseconds
// stages report themselves, stops at an int64's largest value instead of
// failing the flush (which the core would send again and again) or
// wrapping below zero: across flushes, and within one that sums two deltas
// of a stage.
func testFlushSaturates(t *testing.T, h Harness) {
	near := int64(math.MaxInt64 - 10)
	flush(t, h, core.Flush{Life: 6, Seq: 1, StagePasses: 1, Stages: []core.StageDelta{{Stage: "a", Processed: 1, ProcessingUS: near}}})
	flush(t, h, core.Flush{Life: 6, Seq: 2, StagePasses: 2, Stages: []core.StageDelta{
		{Stage: "a", Processed: 1, ProcessingUS: 100},
		{Stage: "b", Processed: 1, ProcessingUS: near},
		{Stage: "b", Processed: 1, ProcessingUS: near},
	}})
	wantStats(t, h, "after two flushes past the largest", map[string]core.StageDelta{
		"a": {Stage: "a", Processed: 2, ProcessingUS: math.MaxInt64},
		"b": {Stage: "b", Processed: 2, ProcessingUS: math.MaxInt64},
	}, 3, 0, 2)
}

// testFlushLives: an earlier dispatcher's flush whose reply was lost may commit
// after the next dispatcher started numbering its own flushes; both are applied,
// each once, whatever their order.
func testFlushLives(t *testing.T, h Harness) {
	newer := core.Flush{Life: -9, Seq: 1, StagePasses: 1, Stages: []core.StageDelta{{Stage: "a", GuardMisses: 1}}}
	older := core.Flush{Life: 4, Seq: 1, StagePasses: 2, Stages: []core.StageDelta{{Stage: "a", GuardMisses: 2}}}
	flush(t, h, newer)
	flush(t, h, older) // the late commit of the earlier life, same seq
	want := map[string]core.StageDelta{"a": {Stage: "a", GuardMisses: 3}}
	wantStats(t, h, "after life -9 seq 1, then life 4 seq 1", want, 3, 0, 2)

	flush(t, h, newer) // each sent again after a lost reply
	flush(t, h, older)
	wantStats(t, h, "after both sent again", want, 3, 0, 2)

	flush(t, h, core.Flush{Life: -9, Seq: 2, StagePasses: 4})
	wantStats(t, h, "after life -9 seq 2", want, 7, 0, 3)
}

// ---- helpers: they run commands and fail on errors; assertions stay in tests ----

// exec runs one command and returns its result event, failing the test if the
// queue answered with an error or a different Op.
// The transaction first makes the history's days of the rows cmd may write,
// as the core's upkeep does (core.KeepHistory), so that every row finds its
// partition.
func exec[E core.Event](t *testing.T, h Harness, cmd core.Command, op func(E) (int64, string)) E {
	t.Helper()
	cmds := []core.Command{cmd}
	if keep, ok := upkeepFor(cmd); ok {
		cmds = []core.Command{keep, cmd}
	}
	evs := h.Exec(t.Context(), cmds)
	if len(evs) != len(cmds) {
		t.Fatalf("Exec(%v) answered %d events, want %d: %v", cmds, len(evs), len(cmds), evs)
	}
	if err := core.QueueErr(evs[0]); err != "" {
		t.Fatalf("Exec(%v) failed: %s", cmds, err)
	}
	ev, ok := evs[len(evs)-1].(E)
	if !ok {
		t.Fatalf("Exec(%v) answered %v (%T), want a %T", cmd, evs[len(evs)-1], evs[len(evs)-1], ev)
	}
	gotOp, err := op(ev)
	if err != "" {
		t.Fatalf("Exec(%v) failed: %s", cmd, err)
	}
	if gotOp != 42 {
		t.Fatalf("Exec(%v) answered op=%d, want op=42", cmd, gotOp)
	}
	return ev
}

// upkeepFor is the history's upkeep a transaction of cmd needs first: the
// days of the rows it may write (a wake's and a reset's at Now, a resolve's at
// its items' At).
func upkeepFor(cmd core.Command) (core.KeepHistory, bool) {
	var times []time.Time
	switch c := cmd.(type) {
	case core.Wake:
		times = append(times, c.Now)
	case core.ResetOrphans:
		times = append(times, c.Now)
	case core.Resolve:
		for _, it := range c.Items {
			if it.History && !it.At.IsZero() {
				times = append(times, it.At)
			}
		}
	}
	if len(times) == 0 {
		return core.KeepHistory{}, false
	}
	from, to := slices.MinFunc(times, time.Time.Compare), slices.MaxFunc(times, time.Time.Compare)
	return core.KeepHistory{Op: 41, From: from, Now: to, Through: to}, true
}

func claim(t *testing.T, h Harness, caps ...core.Cap) core.Claimed {
	t.Helper()
	return exec(t, h, core.Claim{Op: 42, Caps: caps}, func(e core.Claimed) (int64, string) { return e.Op, e.Err })
}

func claimRows(t *testing.T, h Harness, caps ...core.Cap) []core.Row {
	t.Helper()
	return claim(t, h, caps...).Rows
}

func resolve(t *testing.T, h Harness, items ...core.Item) []core.Outcome {
	t.Helper()
	return exec(t, h, core.Resolve{Op: 42, Items: items}, func(e core.Resolved) (int64, string) { return e.Op, e.Err }).Outcomes
}

func wakeAt(t *testing.T, h Harness, now time.Time) core.Woken {
	t.Helper()
	return exec(t, h, core.Wake{Op: 42, Now: now}, func(e core.Woken) (int64, string) { return e.Op, e.Err })
}

func resetOrphans(t *testing.T, h Harness, keep ...int64) core.OrphansReset {
	t.Helper()
	return exec(t, h, core.ResetOrphans{Op: 42, Keep: keep, Now: base}, func(e core.OrphansReset) (int64, string) { return e.Op, e.Err })
}

func flush(t *testing.T, h Harness, f core.Flush) {
	t.Helper()
	f.Op = 42
	exec(t, h, f, func(e core.Flushed) (int64, string) { return e.Op, e.Err })
}

func rowsAt(stage string, ids ...int64) []core.Row {
	rows := make([]core.Row, len(ids))
	for i, id := range ids {
		rows[i] = core.Row{ID: id, Stage: stage}
	}
	return rows
}

func wantRow(t *testing.T, h Harness, id int64, stage string, status core.RowStatus) {
	t.Helper()
	gotStage, gotStatus, _, _, ok := h.Row(t, id)
	if !ok || gotStage != stage || gotStatus != status {
		t.Errorf("row %d = %s (exists: %v); want %s", id, at(gotStage, gotStatus), ok, at(stage, status))
	}
}

func wantRowError(t *testing.T, h Harness, id int64, stage string, status core.RowStatus, dispatchError string) {
	t.Helper()
	gotStage, gotStatus, _, gotErr, ok := h.Row(t, id)
	if !ok || gotStage != stage || gotStatus != status || gotErr != dispatchError {
		t.Errorf("row %d = %s dispatch_error %q (exists: %v); want %s dispatch_error %q",
			id, at(gotStage, gotStatus), gotErr, ok, at(stage, status), dispatchError)
	}
}

func at(stage string, status core.RowStatus) string { return stage + ":" + string(status) }

func wantOutcomes(t *testing.T, got, want []core.Outcome) {
	t.Helper()
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		g, w := got[i], want[i]
		same = g.ID == w.ID && g.Stage == w.Stage && g.Status == w.Status && g.Timeout.Equal(w.Timeout) && g.Error == w.Error &&
			g.Matched == w.Matched && g.Attempts == w.Attempts && (g.Message == nil) == (w.Message == nil) && g.KeyBusy == w.KeyBusy &&
			slices.EqualFunc(g.Children, w.Children, func(g, w core.Child) bool { return g.ID == w.ID && g.Stage == w.Stage })
	}
	if !same {
		t.Fatalf("outcomes:\n got  %s\n want %s", outcomesText(got), outcomesText(want))
	}
}

func outcomesText(os []core.Outcome) string {
	s := "["
	for i, o := range os {
		if i > 0 {
			s += " "
		}
		s += o.String()
	}
	return s + "]"
}

func wantStats(t *testing.T, h Harness, when string, stages map[string]core.StageDelta, passes, left, seq int64) {
	t.Helper()
	list, err := h.ReadStageStats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	gotStages := map[string]core.StageDelta{}
	for _, st := range list {
		gotStages[st.Stage] = st.StageDelta
	}
	d, err := h.ReadDispatchStats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d.StagePasses != passes || d.MessagesLeft != left || d.FlushSeq != seq {
		t.Errorf("%s: dispatch_stats = passes %d left %d flush_seq %d; want passes %d left %d flush_seq %d",
			when, d.StagePasses, d.MessagesLeft, d.FlushSeq, passes, left, seq)
	}
	if len(gotStages) != len(stages) {
		t.Errorf("%s: stage_stats has %d rows %v, want %d %v", when, len(gotStages), gotStages, len(stages), stages)
	}
	for name, w := range stages {
		if g := gotStages[name]; g != w {
			t.Errorf("%s: stage_stats[%s] = %s, want %s", when, name, deltaText(g), deltaText(w))
		}
	}
}

// wantStamped checks that the statistics rows say when a flush last
// touched them.
func wantStamped(t *testing.T, h Harness) {
	t.Helper()
	stages, err := h.ReadStageStats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range stages {
		if st.UpdatedAt.IsZero() {
			t.Errorf("stage_stats %s: no updated_at", st.Stage)
		}
	}
	if d, err := h.ReadDispatchStats(t.Context()); err != nil || d.UpdatedAt.IsZero() {
		t.Errorf("dispatch_stats = %+v, %v; want an updated_at", d, err)
	}
}

func deltaText(d core.StageDelta) string {
	return fmt.Sprintf("{stage=%q processed=%d failed=%d timeouts=%d crashes=%d us=%d guard-misses=%d retries=%d rate-held-us=%d emitted=%d emits-dropped=%d}",
		d.Stage, d.Processed, d.Failed, d.Timeouts, d.Crashes, d.ProcessingUS, d.GuardMisses, d.Retries, d.RateHeldUS, d.Emitted, d.EmitsDropped)
}
