package core_test

import (
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

const retryStage = `
[pepsi-dispatch]
POLL_INTERVAL = 1h
[stage-a]
PROGRAM = a
RETRY_LIMIT = 2
RETRY_DELAY = 10s
RETRY_DELAY_MAX = 15s
[stage-b]
PROGRAM = b
`

// Proves: at a stage with RETRY_LIMIT > 0, "75 REASON" pauses the message at the
// same stage for RETRY_DELAY × 2^attempts (capped at RETRY_DELAY_MAX) plus up to
// 10 % jitter, with the reason in state.dispatch_error and one more attempt; the
// answer that finds attempts = RETRY_LIMIT fails it with its reason.
func TestTemporaryFailureIsRetriedWithBackoffUntilTheLimit(t *testing.T) {
	w := newWorld(t, retryStage)
	w.q.Insert("a", 1)
	w.step(core.Start{Seed: 7})
	wid := core.WorkerID(1)
	answerAt := time.Duration(0)
	for i, base := range []time.Duration{10 * time.Second, 15 * time.Second} {
		cmds := w.answer(wid, "", "", "75 service down")
		it := itemFor(t, cmds, 1)
		if it.Verdict != core.Retry || it.Reason != "service down" {
			t.Fatalf("retry %d: item %s, want a retry with the reason", i, it)
		}
		due := it.Until.Sub(epoch.Add(answerAt))
		if due < base || due >= base+base/10 {
			t.Errorf("retry %d: due after %s, want %s plus less than 10%%", i, due, base)
		}
		w.wantRow(1, "a", core.StatusPaused)
		if r := w.row(1); r.Attempts != i+1 || r.DispatchError != "service down" {
			t.Errorf("retry %d: row attempts %d dispatch_error %q, want %d and the reason", i, r.Attempts, r.DispatchError, i+1)
		}
		w.settle()
		answerAt = it.Until.Sub(epoch)
		cmds = w.tick(answerAt)
		one[core.Wake](t, cmds)
		w.wantRow(1, "a", core.StatusRunning)
		if ws := of[core.Write](cmds); len(ws) == 1 {
			wid = ws[0].Worker
		} else {
			wid = workersOf(cmds)[0]
			w.step()
		}
	}
	cmds := w.answer(wid, "", "", "75 service down")
	if it := itemFor(t, cmds, 1); it.Verdict != core.Fail || it.Reason != "service down" {
		t.Fatalf("third 75 with RETRY_LIMIT 2: item %s, want the message failed with its reason", it)
	}
	w.wantRow(1, "a", core.StatusFailed)
}

// Proves: with RETRY_LIMIT = 0, 75 is an ordinary failure; at a retry stage any
// other non-zero answer fails at once.
func TestSeventyFiveFailsWhereNoRetriesAreConfigured(t *testing.T) {
	w := newWorld(t, retryStage)
	w.q.Insert("b", 1)
	w.q.Insert("a", 1)
	w.step(core.Start{Seed: 1})
	var wa, wb core.WorkerID
	for wid, st := range w.stageOf {
		if st == "a" {
			wa = wid
		} else {
			wb = wid
		}
	}
	if it := itemFor(t, w.answer(wb, "", "", "75 down"), 1); it.Verdict != core.Fail {
		t.Errorf("75 at a stage without RETRY_LIMIT: %s, want fail", it)
	}
	if it := itemFor(t, w.answer(wa, "", "", "1 bad"), 2); it.Verdict != core.Fail {
		t.Errorf("1 at a retry stage: %s, want fail", it)
	}
}

// Proves: the jitter comes from the seed handed in Start: the same seed, the
// same delays; another seed, others.
func TestRetryJitterReplaysFromTheSeed(t *testing.T) {
	until := func(run string, seed uint64) (at time.Time) {
		t.Run(run, func(t *testing.T) {
			w := newWorld(t, retryStage)
			w.q.Insert("a", 1)
			w.step(core.Start{Seed: seed})
			at = itemFor(t, w.answer(1, "", "", "75 down"), 1).Until
		})
		return at
	}
	a, b, c := until("seed42", 42), until("seed42again", 42), until("seed43", 43)
	if !a.Equal(b) {
		t.Errorf("seed 42 gave %s and %s", a, b)
	}
	if a.Equal(c) {
		t.Errorf("seeds 42 and 43 gave the same delay %s", a)
	}
}

func TestRetryDelayDoublesUpToTheCap(t *testing.T) {
	for attempts, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if got := core.RetryDelay(time.Second, 5*time.Second, attempts); got != want {
			t.Errorf("RetryDelay(1s, 5s, %d) = %s, want %s", attempts, got, want)
		}
	}
	if got := core.RetryDelay(time.Second, time.Hour, 1000); got != time.Hour {
		t.Errorf("RetryDelay after 1000 attempts = %s, want the cap", got)
	}
	// Past half an int64 of nanoseconds, doubling would wrap negative.
	if got := core.RetryDelay(2000000*time.Hour, 2562047*time.Hour, 1); got != 2562047*time.Hour {
		t.Errorf("RetryDelay(2000000h, 2562047h, 1) = %s, want the cap", got)
	}
}

// Proves: a row a stage paused with no due time (a NULL timeout, or one the
// shell cannot hold: 'infinity') does not make the core forget when another
// paused row is due: it wakes that row on time, not at the next heartbeat.
func TestARowPausedWithoutADueTimeDoesNotHideAnotherRowsDueTime(t *testing.T) {
	w := newWorld(t, threeStages)
	w.start("a", 2)
	pause := func(id int64, until time.Time) {
		t.Helper()
		for wid, ids := range w.held {
			if len(ids) > 0 && ids[0] == id {
				if !w.q.StageWrite(id, "a", "a", core.StatusPaused, until) {
					t.Fatalf("row %d is not running at a", id)
				}
				w.held[wid] = ids[1:]
				w.step(core.Answer{Worker: wid, Line: "0"})
				return
			}
		}
		t.Fatalf("no worker holds %d at its head: %v", id, w.held)
	}
	pause(1, epoch.Add(10*time.Second))
	pause(2, time.Time{})
	if wakes := of[core.Wake](w.at(10 * time.Second).step(core.Tick{})); len(wakes) == 0 {
		t.Errorf("no wake when row 1 fell due, 10 s in (the heartbeat comes at 30 s):\n%s", list(w.all))
	}
}

// Proves: the dispatcher counts a failure as its own only when its write
// matched its guard. A message an operator's own SQL made pending while it
// waited out its second retry keeps that retry's reason; its stage then
// wrote `failed` itself and answered 75 with the same text, past
// RETRY_LIMIT: the dispatcher's fail is a guard miss, not one of its
// failures, although the row carries the fail's reason (the core once took
// the reason for its own write and counted it: found by the simulator, rule
// flush-not-late). After a lost reply the reason is all the core has, so it
// counts such a row then (docs/pepsi-dispatch.1.md, "Statistics").
func TestAStagesOwnFailureOverAnEarlierRetrysReasonIsNotTheDispatchers(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(map[bool]string{false: "reply", true: "lost-reply"}[lost], func(t *testing.T) {
			w := newWorld(t, retryStage)
			w.q.Insert("a", 1)
			w.step(core.Start{Seed: 7})
			wid := core.WorkerID(1)
			it := itemFor(t, w.answer(wid, "", "", "75 service down"), 1)
			w.settle()
			cmds := w.tick(it.Until.Sub(epoch)) // the wake clears the reason
			if ws := of[core.Write](cmds); len(ws) == 1 {
				wid = ws[0].Worker
			} else {
				wid = workersOf(cmds)[0]
				w.step()
			}
			itemFor(t, w.answer(wid, "", "", "75 service down"), 1)
			w.settle()
			if !w.q.Unpause(1) { // an operator's UPDATE … SET status = 'pending'
				t.Fatal("message 1 is not paused after its second retry")
			}
			w.step(core.Ingress{})
			w.wantRow(1, "a", core.StatusRunning)
			w.step()
			w.loseReplies = lost
			cmds = w.answer(wid, "a", core.StatusFailed, "75 service down")
			if it := itemFor(t, cmds, 1); it.Verdict != core.Fail || it.Reason != "service down" {
				t.Fatalf("third 75 with RETRY_LIMIT 2: item %s, want the message failed with its reason", it)
			}
			w.loseReplies = false
			w.at(w.now.Sub(epoch) + time.Second)
			w.step(core.DatabaseUp{})
			if r := w.row(1); r.Status != core.StatusFailed || r.DispatchError != "service down" {
				t.Fatalf("row %+v, want failed with the retry's reason", r)
			}
			flushAll(w)
			st, _, _, _ := w.q.Stats()
			want := int64(0)
			if lost {
				want = 1
			}
			if st["a"].Failed != want || st["a"].Retries != 2 {
				t.Errorf("stats for a: %+v, want %d failed and 2 retries", st["a"], want)
			}
		})
	}
}
