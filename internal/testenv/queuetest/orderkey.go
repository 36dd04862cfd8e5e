// The conformance tests of ordering per key (core.Release, the keyed claim,
// the producer's insert and the operator's retry).

package queuetest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
)

// KeyedHarness is a Harness that can also insert rows with an order key.
type KeyedHarness interface {
	Harness
	// InsertKeyed adds one row at stage with order key key, in a producer
	// transaction of its own, and returns its id.
	InsertKeyed(t *testing.T, stage, key string) int64
	// BeginInsertKeyed is BeginInsert for a row with an order key: the
	// producer holds the key's lock until commit. The test never begins a
	// second one of the same key while one is open (it would wait).
	BeginInsertKeyed(t *testing.T, stage, key string) (id int64, commit func())
}

// RunOrderKeys runs the conformance tests of ordering per key, each on a fresh
// harness from open.
func RunOrderKeys(t *testing.T, open func(t *testing.T) KeyedHarness) {
	tests := []testCase[KeyedHarness]{
		{"AKeyedRowBehindAnUnfinishedOneOfItsKeyIsInsertedBlocked", testKeyInsertBlocked},
		{"ClaimTakesAKeysHeadAndNeverItsBlockedRows", testKeyClaimHead},
		{"ClaimNeverTakesARowOfAnExcludedKey", testKeyClaimExcluded},
		{"ClaimReadsTheOrderKey", testKeyClaimReadsKey},
		{"ReleaseAfterTheHeadFinishedHandsTheKeyToTheNext", testKeyReleaseNext},
		{"ReleaseOfAKeyAProducerHoldsIsBusy", testKeyReleaseBusy},
		{"AReleaseOfSeveralKeysHandsEachOnAsAReleaseOfItAlone", testKeyReleaseSeveral},
		{"AnOperatorsRetryOfAnOlderMessageMakesItTheKeysHead", testKeyRetryOlder},
		{"AnOlderMessageRetriedWhileAYoungerIsHeldWaitsForItsPass", testKeyRetryWhileHeld},
		{"AReleaseThatEndsARetrysWaitClearsItsReason", testKeyReleaseEndsRetry},
		{"AMessagePausedForGoodStaysPausedThroughABlockAndARelease", testKeyPausedForGood},
		{"AKeyedMoveClaimsOnlyWhenNoOlderMessageOfItsKeyIsUnfinished", testKeyMoveClaim},
		{"ReleaseBehindReleasesAKeyOnlyWhenAnOlderMessageOfItIsUnfinished", testKeyReleaseBehind},
		{"ReleaseReportsAHeadThatWasPendingAlready", testKeyReleaseReportsPendingHead},
		{"TheStartUpResetReleasesEveryKeyWithBlockedRows", testKeyResetReleases},
		{"TheStartUpResetSaysHowFarIdsWentWhileAKeyedProducerIsInFlight", testKeyResetSeq},
		{"ReleaseAllReleasesEveryKeyWithBlockedRows", testKeyReleaseAll},
		{"EnqueueInsertsAKeyedRowBehindAnUnfinishedOneBlocked", testKeyEnqueue},
		{"InsertIngressInsertsAKeyedRowBehindAnUnfinishedOneBlocked", testKeyInsertIngress},
		{"ShowAndThePageSayWhatABlockedMessageWaitsBehind", testKeyShowHead},
		{"StageReadReadsTheOrderKey", testKeyStageRead},
		{"ListCountAndDiscardSelectByOrderKey", testKeySelect},
		{"CountKeysWaitingSortsTheKeysByWhatTheirHeadDoes", testKeyCountWaiting},
		{"MonitorBlockedCountsEachStagesBlockedRows", testKeyMonitorBlocked},
		{"AnEmittedOrderKeyWaitsBehindItsKeysUnfinishedMessage", testKeyEmitted},
		{"AMoveWhoseChildsOrderKeyAProducerHoldsWritesNothingOfIt", testKeyEmittedBusy},
		{"AResolveThatQueuesForAKeyAProducerHoldsAnswersKeyBusyAndWritesNothing", testKeyEmittedQueued},
		{"AMoveWhoseChildsOrderKeyAProducerHoldsIsNotRefusedForItsState", testKeyEmittedBusyRefusedState},
		{"AScheduledKeyedMessageWaitsBlockedBehindItsKeyThenPausedUntilItsTime", testKeyScheduled},
	}
	runAll(t, tests, open)
}

func release(t *testing.T, h Harness, keys ...string) core.Released {
	t.Helper()
	return exec(t, h, core.Release{Op: 42, Keys: keys}, func(e core.Released) (int64, string) { return e.Op, e.Err })
}

func testKeyInsertBlocked(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	b := h.InsertKeyed(t, "a", "k")
	other := h.InsertKeyed(t, "a", "other")
	plain := h.Insert(t, "a", 1)[0]
	if !(a < b && b < other && other < plain) {
		t.Fatalf("ids %d, %d, %d, %d: want them in insert order", a, b, other, plain)
	}
	wantRow(t, h, a, "a", core.StatusPending)
	wantRow(t, h, b, "a", core.StatusBlocked)
	wantRow(t, h, other, "a", core.StatusPending)
	wantRow(t, h, plain, "a", core.StatusPending)
}

func testKeyClaimHead(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	h.InsertKeyed(t, "a", "k")
	h.InsertKeyed(t, "a", "k")
	plain := h.Insert(t, "a", 1)[0]
	c := claim(t, h, core.Cap{Stage: "a", N: 10})
	if got := ids(c.Rows); !slices.Equal(got, []int64{a, plain}) {
		t.Fatalf("claim a:10 took %v, want [%d %d] (the key's head and the row without a key)", got, a, plain)
	}
	if len(c.More) != 0 {
		t.Fatalf("claim found more rows at %v: blocked rows are not pending", c.More)
	}
}

func testKeyClaimExcluded(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	b := h.InsertKeyed(t, "a", "j")
	c := exec(t, h, core.Claim{Op: 42, Caps: []core.Cap{{Stage: "a", N: 10}}, ExcludeKeys: []string{"k"}},
		func(e core.Claimed) (int64, string) { return e.Op, e.Err })
	if got := ids(c.Rows); !slices.Equal(got, []int64{b}) {
		t.Fatalf("claim excluding key k took %v, want [%d] (not %d, whose key is held)", got, b, a)
	}
	wantRow(t, h, a, "a", core.StatusPending)
}

func testKeyClaimReadsKey(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	plain := h.Insert(t, "a", 1)[0]
	got := claimRows(t, h, core.Cap{Stage: "a", N: 10})
	want := []core.Row{{ID: a, Stage: "a", Key: "k"}, {ID: plain, Stage: "a"}}
	if !slices.EqualFunc(got, want, func(x, y core.Row) bool { return x.ID == y.ID && x.Stage == y.Stage && x.Key == y.Key }) {
		t.Fatalf("claim took %v, want %v with their keys", got, want)
	}
}

func testKeyReleaseNext(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	b := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	resolve(t, h, core.Item{ID: a, Stage: "a", Verdict: core.Move, To: core.TargetDone})
	r := release(t, h, "k", "nothing")
	if len(r.Busy) != 0 || len(r.Heads) != 1 || r.Heads[0] != (core.Head{Key: "k", ID: b, Stage: "a", Status: core.StatusPending}) {
		t.Fatalf("release [k nothing] = %v, want row %d the head of k, pending at a (and nothing for a key without rows)", r, b)
	}
	if got := ids(claimRows(t, h, core.Cap{Stage: "a", N: 10})); !slices.Equal(got, []int64{b}) {
		t.Fatalf("claim after the release took %v, want [%d]", got, b)
	}
	// A release while the head is held hands nothing on.
	if r := release(t, h, "k"); len(r.Heads) != 0 || len(r.Busy) != 0 {
		t.Fatalf("release of a key whose head is held = %v, want nothing", r)
	}
}

func testKeyReleaseBusy(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	b, commit := h.BeginInsertKeyed(t, "a", "k")
	h.Stage(t, a, "a", "a", core.StatusDone, base)
	if r := release(t, h, "k"); !slices.Equal(r.Busy, []string{"k"}) || len(r.Heads) != 0 {
		t.Fatalf("release of a key a producer holds = %v, want it busy", r)
	}
	commit()
	// The producer's row was inserted behind the unfinished head: blocked,
	// until the release that is not busy.
	wantRow(t, h, b, "a", core.StatusBlocked)
	if r := release(t, h, "k"); len(r.Busy) != 0 || len(r.Heads) != 1 || r.Heads[0].ID != b {
		t.Fatalf("release once the producer committed = %v, want row %d the head", r, b)
	}
	wantRow(t, h, b, "a", core.StatusPending)
}

// severalKeys are the rows of testKeyReleaseSeveral: per key, its older
// (o) and younger (y) messages.
type severalKeys struct {
	oY, yY, oZ, yZ, oH, yH, oP, yP, n1, n2, p1, p2, l1, l2, b1, bq int64
}

// setUpSeveralKeys puts keys in every state a release tells apart: "yield"
// and "yield2" (an older message retried while the younger ran, the younger
// since moved on: the older goes first), "pwait" (the same, the younger since
// paused by a retry: it waits blocked, its time kept), "held" (the younger
// still runs), "next" (its head done, its next blocked), "pending" (its head
// requeued, pending already), "later" (its head paused by a retry) and
// "busy" (its head still running, a blocked message behind it: the test has
// its stage finish it while a producer of the key is in flight).
func setUpSeveralKeys(t *testing.T, h KeyedHarness) severalKeys {
	t.Helper()
	var r severalKeys
	r.oY, r.oZ, r.oH, r.oP = failHead(t, h, "yield"), failHead(t, h, "yield2"), failHead(t, h, "held"), failHead(t, h, "pwait")
	r.yY, r.yZ, r.yH, r.yP = h.InsertKeyed(t, "a", "yield"), h.InsertKeyed(t, "a", "yield2"), h.InsertKeyed(t, "a", "held"), h.InsertKeyed(t, "a", "pwait")
	r.n1, r.n2 = h.InsertKeyed(t, "a", "next"), h.InsertKeyed(t, "a", "next")
	r.p1, r.p2 = h.InsertKeyed(t, "a", "pending"), h.InsertKeyed(t, "a", "pending")
	r.l1, r.l2 = h.InsertKeyed(t, "a", "later"), h.InsertKeyed(t, "a", "later")
	r.b1, r.bq = h.InsertKeyed(t, "a", "busy"), h.InsertKeyed(t, "a", "busy")
	heads := []int64{r.yY, r.yZ, r.yH, r.yP, r.n1, r.p1, r.l1, r.b1}
	if got := ids(claimRows(t, h, core.Cap{Stage: "a", N: 10})); !slices.Equal(got, heads) {
		t.Fatalf("claim took %v, want each key's head %v", got, heads)
	}
	for _, old := range []int64{r.oY, r.oZ, r.oH, r.oP} { // each waits blocked behind the younger one that runs
		if n, err := h.Retry(t.Context(), store.RetryParams{ID: old, Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
			t.Fatalf("retry of row %d = %d, %v; want 1", old, n, err)
		}
	}
	resolve(t, h, move(r.yY, "a", "b"), move(r.yZ, "a", "b"), // pending at b, to be put behind the older
		retryItem(r.yP, "a", notBeforeAhead, "soon"),
		core.Item{ID: r.n1, Stage: "a", Verdict: core.Move, To: core.TargetDone},
		core.Item{ID: r.p1, Stage: "a", Verdict: core.Requeue},
		retryItem(r.l1, "a", base, "later"))
	return r
}

// testKeyReleaseSeveral releases, in one Release, keys in every state a
// release tells apart (setUpSeveralKeys), and checks that each is handed on
// as a release of it alone would be: pepsi.order_release decides all its
// keys in one statement (schema 29), so no key's rows may be taken for
// another's.
func testKeyReleaseSeveral(t *testing.T, h KeyedHarness) {
	r := setUpSeveralKeys(t, h)
	b2, commit := h.BeginInsertKeyed(t, "a", "busy")
	h.Stage(t, r.b1, "a", "a", core.StatusDone, base)
	got := release(t, h, "none", "next", "yield", "yield2", "pwait", "held", "pending", "later", "busy")
	commit()
	if !slices.Equal(got.Busy, []string{"busy"}) {
		t.Errorf("release's busy keys = %v, want [busy]", got.Busy)
	}
	wantHeads(t, got.Heads, []core.Head{
		{Key: "later", ID: r.l1, Stage: "a", Status: core.StatusPaused, Timeout: base},
		{Key: "next", ID: r.n2, Stage: "a", Status: core.StatusPending},
		{Key: "pending", ID: r.p1, Stage: "a", Status: core.StatusPending},
		{Key: "pwait", ID: r.oP, Stage: "a", Status: core.StatusPending},
		{Key: "yield", ID: r.oY, Stage: "a", Status: core.StatusPending},
		{Key: "yield2", ID: r.oZ, Stage: "a", Status: core.StatusPending},
	})
	for _, w := range []struct {
		id     int64
		stage  string
		status core.RowStatus
	}{
		{r.oY, "a", core.StatusPending}, {r.yY, "b", core.StatusBlocked}, {r.oZ, "a", core.StatusPending}, {r.yZ, "b", core.StatusBlocked},
		{r.oP, "a", core.StatusPending}, {r.yP, "a", core.StatusBlocked}, {r.yH, "a", core.StatusRunning}, {r.oH, "a", core.StatusBlocked},
		{r.n2, "a", core.StatusPending}, {r.p1, "a", core.StatusPending}, {r.p2, "a", core.StatusBlocked},
		{r.l1, "a", core.StatusPaused}, {r.l2, "a", core.StatusBlocked},
		{r.bq, "a", core.StatusBlocked}, {b2, "a", core.StatusBlocked}, // until a release that is not busy
	} {
		wantRow(t, h, w.id, w.stage, w.status)
	}
	// pwait's younger message, blocked behind the older one, keeps the time
	// its retry waits for: once the older one is done, it is paused again.
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	resolve(t, h, core.Item{ID: r.oP, Stage: "a", Verdict: core.Move, To: core.TargetDone})
	wantHeads(t, release(t, h, "pwait").Heads, []core.Head{{Key: "pwait", ID: r.yP, Stage: "a", Status: core.StatusPaused, Timeout: notBeforeAhead}})
}

// wantHeads checks a release's heads, in any order, against want, sorted
// by key.
func wantHeads(t *testing.T, got, want []core.Head) {
	t.Helper()
	got = slices.Clone(got)
	slices.SortFunc(got, func(x, y core.Head) int { return strings.Compare(x.Key, y.Key) })
	if len(got) != len(want) {
		t.Fatalf("release's heads = %+v, want %+v", got, want)
	}
	for i := range want {
		if g := got[i]; g.Key != want[i].Key || g.ID != want[i].ID || g.Stage != want[i].Stage || g.Status != want[i].Status || !g.Timeout.Equal(want[i].Timeout) {
			t.Errorf("release's head %d = %+v, want %+v", i, g, want[i])
		}
	}
}

// failHead inserts a keyed row, claims it and fails it, releases its key,
// and returns its id: the key's oldest message, finished, for an operator to
// retry.
func failHead(t *testing.T, h KeyedHarness, key string) int64 {
	t.Helper()
	id := h.InsertKeyed(t, "a", key)
	claimRows(t, h, core.Cap{Stage: "a", N: 1})
	resolve(t, h, core.Item{ID: id, Stage: "a", Verdict: core.Fail, Reason: "no"})
	release(t, h, key)
	return id
}

func testKeyRetryOlder(t *testing.T, h KeyedHarness) {
	old := failHead(t, h, "k")
	young := h.InsertKeyed(t, "a", "k")
	wantRow(t, h, young, "a", core.StatusPending)
	if n, err := h.Retry(t.Context(), store.RetryParams{ID: old, Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("retry of row %d = %d, %v; want 1", old, n, err)
	}
	wantRow(t, h, old, "a", core.StatusPending)
	wantRow(t, h, young, "a", core.StatusBlocked)
	if got := ids(claimRows(t, h, core.Cap{Stage: "a", N: 10})); !slices.Equal(got, []int64{old}) {
		t.Fatalf("claim after the retry took %v, want [%d] (the key's oldest)", got, old)
	}
}

func testKeyRetryWhileHeld(t *testing.T, h KeyedHarness) {
	old := failHead(t, h, "k")
	young := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	if n, err := h.Retry(t.Context(), store.RetryParams{ID: old, Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("retry of row %d = %d, %v; want 1", old, n, err)
	}
	wantRow(t, h, old, "a", core.StatusBlocked) // a worker holds the younger one
	// A release while the younger one runs hands the key to nobody: the
	// older one waits blocked until the younger one's pass is resolved.
	if r := release(t, h, "k"); len(r.Heads) > 0 || len(r.Busy) > 0 {
		t.Fatalf("release while the younger row %d runs = %v, want nothing", young, r)
	}
	wantRow(t, h, old, "a", core.StatusBlocked)
	wantRow(t, h, young, "a", core.StatusRunning)
	resolve(t, h, move(young, "a", "b"))
	r := release(t, h, "k")
	if len(r.Heads) != 1 || r.Heads[0] != (core.Head{Key: "k", ID: old, Stage: "a", Status: core.StatusPending}) {
		t.Fatalf("release after the younger one's pass = %v, want row %d the head", r, old)
	}
	wantRow(t, h, young, "b", core.StatusBlocked)
	got := ids(claimRows(t, h, core.Cap{Stage: "a", N: 10}, core.Cap{Stage: "b", N: 10}))
	if !slices.Equal(got, []int64{old}) {
		t.Fatalf("claim took %v, want [%d] (the key's oldest, not the younger one it overtook)", got, old)
	}
}

// testKeyReleaseEndsRetry: a message waiting out a 75 retry is put behind
// an older message of its key that an operator retried; once that one is
// done, the release that makes it pending again ends its retry's wait, as the
// wake does, and so takes the retry's reason out of state.dispatch_error: a
// message that later succeeds, or fails for another reason, must not show it.
func testKeyReleaseEndsRetry(t *testing.T, h KeyedHarness) {
	old := failHead(t, h, "k")
	young := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	resolve(t, h, retryItem(young, "a", notBeforeBehind, "busy"))
	wantRowError(t, h, young, "a", core.StatusPaused, "busy")
	if n, err := h.Retry(t.Context(), store.RetryParams{ID: old, Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("retry of row %d = %d, %v; want 1", old, n, err)
	}
	wantRowError(t, h, young, "a", core.StatusBlocked, "busy") // behind the key's oldest again
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	resolve(t, h, core.Item{ID: old, Stage: "a", Verdict: core.Move, To: core.TargetDone})
	r := release(t, h, "k")
	if len(r.Heads) != 1 || r.Heads[0].ID != young || r.Heads[0].Status != core.StatusPending {
		t.Fatalf("release once the retried older row is done = %+v; want row %d the head, pending (its retry was due)", r, young)
	}
	wantRowError(t, h, young, "a", core.StatusPending, "")
	// Its retry's wait ended here, not in a wake: the release records it woken.
	if rows := history(t, h, young); len(rows) == 0 || rows[len(rows)-1].Event != core.HistoryWoken || rows[len(rows)-1].Stage != "a" {
		t.Errorf("history of row %d = %q; want it to end woken@a", young, historyText(rows))
	}
}

// testKeyPausedForGood: a message paused with no time (a stage's own
// transition: it is never due, and stays paused until someone sets its
// timeout) is put behind an older message of its key that an operator
// retried; once that one is done, the release hands the key back to it
// paused, never due, not pending: blocking must not forget the pause.
func testKeyPausedForGood(t *testing.T, h KeyedHarness) {
	old := failHead(t, h, "k")
	young := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	h.Stage(t, young, "a", "a", core.StatusPaused, time.Time{})
	if n, err := h.Retry(t.Context(), store.RetryParams{ID: old, Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("retry of row %d = %d, %v; want 1", old, n, err)
	}
	wantRow(t, h, young, "a", core.StatusBlocked) // behind the key's oldest again
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	resolve(t, h, core.Item{ID: old, Stage: "a", Verdict: core.Move, To: core.TargetDone})
	r := release(t, h, "k")
	if len(r.Heads) != 1 || r.Heads[0].ID != young || r.Heads[0].Status != core.StatusPaused || !r.Heads[0].Timeout.IsZero() {
		t.Fatalf("release once the retried older row is done = %+v; want row %d the head, paused and never due", r, young)
	}
	wantPausedUntil(t, h, young, "a", time.Time{})
	if w := wakeAt(t, h, notBeforeAhead.Add(24*time.Hour)); w.Count != 0 {
		t.Errorf("a wake a day later = %+v; want nothing woken: the pause has no end", w)
	}
}

func testKeyMoveClaim(t *testing.T, h KeyedHarness) {
	old := failHead(t, h, "k")
	young := h.InsertKeyed(t, "a", "k")
	other := h.InsertKeyed(t, "a", "j")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	if n, err := h.Retry(t.Context(), store.RetryParams{ID: old, Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("retry of row %d = %d, %v; want 1", old, n, err)
	}
	claiming := func(id int64) core.Item {
		it := move(id, "a", "b")
		it.Claim = true
		return it
	}
	out := resolve(t, h, claiming(young), claiming(other))
	if o := out[0]; o.Status != core.StatusPending || o.Stage != "b" || !o.Matched {
		t.Fatalf("the move that claims of row %d, behind the retried older row %d of its key, = %+v; want pending at b, matched", young, old, o)
	}
	if o := out[1]; o.Status != core.StatusRunning || o.Stage != "b" || !o.Matched {
		t.Fatalf("the move that claims of row %d, the oldest of its key, = %+v; want running at b, matched", other, o)
	}
}

func testKeyReleaseBehind(t *testing.T, h KeyedHarness) {
	old := failHead(t, h, "k")
	young := h.InsertKeyed(t, "a", "k")
	head := h.InsertKeyed(t, "a", "j")
	next := h.InsertKeyed(t, "a", "j")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	if n, err := h.Retry(t.Context(), store.RetryParams{ID: old, Statuses: []core.RowStatus{core.StatusFailed}}); err != nil || n != 1 {
		t.Fatalf("retry of row %d = %d, %v; want 1", old, n, err)
	}
	resolve(t, h, move(young, "a", "b"), move(head, "a", "b"))
	r := exec(t, h, core.Release{Op: 42, Behind: []core.KeyAt{{Key: "k", ID: young}, {Key: "j", ID: head}}},
		func(e core.Released) (int64, string) { return e.Op, e.Err })
	if len(r.Busy) != 0 || len(r.Heads) != 1 || r.Heads[0] != (core.Head{Key: "k", ID: old, Stage: "a", Status: core.StatusPending}) {
		t.Fatalf("release behind k@%d and j@%d = %v, want only k released, its retried row %d the head", young, head, r, old)
	}
	wantRow(t, h, young, "b", core.StatusBlocked)
	wantRow(t, h, head, "b", core.StatusPending) // the oldest of j: nothing older, no release
	wantRow(t, h, next, "a", core.StatusBlocked)
}

func testKeyReleaseReportsPendingHead(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	b := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	resolve(t, h, core.Item{ID: a, Stage: "a", Verdict: core.Requeue})
	r := release(t, h, "k")
	if len(r.Busy) != 0 || len(r.Heads) != 1 || r.Heads[0] != (core.Head{Key: "k", ID: a, Stage: "a", Status: core.StatusPending}) {
		t.Fatalf("release of k, its head %d pending already = %v; want the head reported (its claim may have stepped over it)", a, r)
	}
	wantRow(t, h, b, "a", core.StatusBlocked)
}

func testKeyResetReleases(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	b := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	// The stage finished the head itself, and no release followed (the
	// dispatcher died first).
	h.Stage(t, a, "a", "a", core.StatusDone, base)
	r := exec(t, h, core.ResetOrphans{Op: 42, ReleaseKeys: true}, func(e core.OrphansReset) (int64, string) { return e.Op, e.Err })
	if len(r.Heads) != 1 || r.Heads[0] != (core.Head{Key: "k", ID: b, Stage: "a", Status: core.StatusPending}) {
		t.Fatalf("start-up reset = %v, want row %d the head of k", r, b)
	}
}

func testKeyResetSeq(t *testing.T, h KeyedHarness) {
	startUp := func() core.OrphansReset {
		return exec(t, h, core.ResetOrphans{Op: 42, ReleaseKeys: true}, func(e core.OrphansReset) (int64, string) { return e.Op, e.Err })
	}
	h.InsertKeyed(t, "a", "k")
	if r := startUp(); r.Seq != 0 {
		t.Fatalf("start-up reset with no producer in flight = %v, want seq 0 (nothing owed later)", r)
	}
	id, commit := h.BeginInsertKeyed(t, "a", "k")
	r := startUp()
	commit()
	if r.Seq < id {
		t.Fatalf("start-up reset while a producer of row %d is in flight = %v, want seq >= %d", id, r, id)
	}
}

func testKeyReleaseAll(t *testing.T, h KeyedHarness) {
	a := h.InsertKeyed(t, "a", "k")
	b := h.InsertKeyed(t, "a", "k")
	claimRows(t, h, core.Cap{Stage: "a", N: 10})
	h.Stage(t, a, "a", "a", core.StatusDone, base)
	r := exec(t, h, core.Release{Op: 42, All: true}, func(e core.Released) (int64, string) { return e.Op, e.Err })
	if len(r.Heads) != 1 || r.Heads[0].ID != b {
		t.Fatalf("release of every key = %v, want row %d the head of k", r, b)
	}
}

// ids lists the ids of rows.
func ids(rows []core.Row) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}
