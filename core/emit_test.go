package core_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// emitStages: a splits into b and c; a may emit at most 2 messages a pass.
const emitStages = `
[pepsi-dispatch]
MAX_RUNTIME = 300
WORKER_IDLE_TIMEOUT = 5
POLL_INTERVAL = 30
STATS_INTERVAL = 60
[stage-a]
PROGRAM = a
PARALLELISM = 1
QUEUE_LIMIT = 4
EMIT_MAX = 2
[stage-b]
PROGRAM = b
PARALLELISM = 1
QUEUE_LIMIT = 4
[stage-c]
PROGRAM = c
PARALLELISM = 1
QUEUE_LIMIT = 4
`

// emit makes worker wid write an emit line for its head message.
func (w *world) emit(wid core.WorkerID, line string) []core.Command {
	w.t.Helper()
	return w.step(core.Answer{Worker: wid, Line: line})
}

// childrenOf lists the rows of the fake queue whose parent is id.
func (w *world) childrenOf(id int64) []string {
	var out []string
	for _, r := range w.q.Rows() {
		if r.ParentID == id {
			out = append(out, r.Stage+":"+string(r.Status)+":"+r.Payload)
		}
	}
	return out
}

// Proves: the emit lines before an answered transition ride its item and are
// inserted with it, parent_id the answered message, in the order emitted; the
// stage's stats count them as emitted; and the worker goes on with its next
// message without them.
func TestEmitsRideTheAnsweredTransitionAndAreInsertedWithIt(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 2)
	w.emit(1, `+{"stage":"c","payload":"row 1"}`)
	w.emit(1, `+{"stage":"b","payload":"row 2","state":{"n":2}}`)
	cmds := answerMove(w, 1, "0 >done")
	it := itemFor(t, cmds, 1)
	if len(it.Emits) != 2 || it.Emits[0].Stage != "c" || string(it.Emits[1].Payload) != "row 2" || it.Emits[1].State != `{"n":2}` {
		t.Fatalf("item %v, want the two emits in order", it)
	}
	if got := w.childrenOf(1); strings.Join(got, " ") != "c:running:row 1 b:running:row 2" {
		t.Errorf("children of 1 = %v, want row 1 at c and row 2 at b, claimed", got)
	}
	if it := itemFor(t, answerMove(w, 1, "0 >done"), 2); len(it.Emits) != 0 {
		t.Errorf("the next message's item %v carries emits of the last pass", it)
	}
	flushAll(w)
	stages, _, _, _ := w.q.Stats()
	if stages["a"].Emitted != 2 || stages["a"].EmitsDropped != 0 {
		t.Errorf("stats of a %+v, want 2 emitted, none dropped", stages["a"])
	}
}

// Proves: emits before a bare 0, a failure, a retry or a guard miss insert
// nothing; they are counted as dropped and logged at most once per stage a
// minute.
func TestEmitsBeforeAnyOtherAnswerOrAGuardMissInsertNothing(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 3)
	var logs []string
	collect := func(cmds []core.Command) {
		for _, l := range of[core.Log](cmds) {
			if strings.Contains(l.Msg, "inserted nothing") {
				logs = append(logs, l.Msg)
			}
		}
	}
	w.emit(1, `+{"stage":"c","payload":"x"}`)
	collect(w.answer(1, "b", core.StatusRunning, "0"))
	w.emit(1, `+{"stage":"c","payload":"y"}`)
	collect(w.answer(1, "", "", "1 boom"))
	// The stage finished the row itself and answered a transition too.
	w.emit(1, `+{"stage":"c","payload":"z"}`)
	w.emit(1, `+{"stage":"b","payload":"z2"}`)
	collect(w.answer(1, "a", core.StatusDone, "0 >b"))
	for id := int64(1); id <= 3; id++ {
		if got := w.childrenOf(id); len(got) != 0 {
			t.Errorf("children of %d = %v, want none", id, got)
		}
	}
	if len(logs) != 1 {
		t.Errorf("logged %d times within a minute, want once: %q", len(logs), logs)
	}
	flushAll(w)
	stages, _, _, _ := w.q.Stats()
	if stages["a"].EmitsDropped != 4 || stages["a"].Emitted != 0 {
		t.Errorf("stats of a %+v, want 4 dropped, none emitted", stages["a"])
	}
}

// Proves: a malformed emit line, one naming a stage the dispatcher does not
// run, one longer than AnswerMax and more than EMIT_MAX emits each fail
// their message with a reason that says so, insert nothing, and the worker
// lives on (no protocol error).
func TestABadEmitFailsItsMessageAndTheWorkerLives(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 4)
	cases := []struct {
		lines []string
		cut   bool
		why   string
	}{
		{[]string{`+{"stage":"c","payload":"x"`}, false, "emit line 1 is malformed"},
		{[]string{`+{"stage":"c","payload":"x"}`, `+{"stage":"nowhere","payload":"x"}`}, false, "emit line 2 names stage 'nowhere'"},
		{[]string{`+{"stage":"c","payload":"` + strings.Repeat("x", 100)}, true, "emit line 1 is longer than 65536 bytes"},
		{[]string{`+{"stage":"c","payload":"1"}`, `+{"stage":"c","payload":"2"}`, `+{"stage":"c","payload":"3"}`}, false, "more than EMIT_MAX (2)"},
	}
	for i, tc := range cases {
		id := w.head(1)
		for _, l := range tc.lines {
			w.step(core.Answer{Worker: 1, Line: l, Cut: tc.cut})
		}
		cmds := answerMove(w, 1, "0 >b")
		if len(of[core.Kill](cmds)) > 0 {
			t.Fatalf("case %d: the worker was killed:\n%s", i, list(cmds))
		}
		it := itemFor(t, cmds, id)
		if it.Verdict != core.Fail || !strings.Contains(it.Reason, tc.why) || len(it.Emits) != 0 {
			t.Errorf("case %d: item %v, want a failure saying %q", i, it, tc.why)
		}
		if got := w.childrenOf(id); len(got) != 0 {
			t.Errorf("case %d: children %v, want none", i, got)
		}
	}
}

// Proves: an emit line with no message outstanding is a protocol error, as
// any answer would be.
func TestAnEmitWithNoMessageOutstandingIsAProtocolError(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 1)
	answerMove(w, 1, "0 >done")
	if cmds := w.emit(1, `+{"stage":"c","payload":"late"}`); len(of[core.Kill](cmds)) != 1 {
		t.Fatalf("no kill for an emit after the last answer:\n%s", list(cmds))
	}
}

// Proves: ParseEmit reads what Emit.Line writes, and refuses what
// PostgreSQL would refuse or the protocol does not allow, saying why.
func TestParseEmit(t *testing.T) {
	for _, e := range []core.Emit{
		{Stage: "b", Payload: []byte("plain")},
		{Stage: "b", Payload: []byte{0xff, 0, 1}, State: `{"a":[1,{"b":null}]}`, Key: "k-1", OrderKey: "acct 9"},
		{Stage: "b", Payload: []byte{}},
		{Stage: "b", Payload: []byte("quote \" and \n newline")},
	} {
		got, err := core.ParseEmit(e.Line())
		if err != nil || got.String() != e.String() || string(got.Payload) != string(e.Payload) {
			t.Errorf("ParseEmit(%s) = %v, %v; want %v", e.Line(), got, err, e)
		}
	}
	if e, err := core.ParseEmit(`+{"stage":"b","payload":{"x":[1, 2]}}`); err != nil || string(e.Payload) != `{"x":[1,2]}` {
		t.Errorf("a JSON payload = %q, %v; want its compact text", e.Payload, err)
	}
	for line, why := range map[string]string{
		`{"stage":"b","payload":"x"}`: "no '+'",
		`+{"payload":"x"}`:            `no "stage"`,
		`+{"stage":"b"}`:              "no payload",
		`+{"stage":"b","payload":"x","payload_base64":"eA=="}`:            "both payload and payload_base64",
		`+{"stage":"b","payload":"x","extra":1}`:                          `unknown field "extra"`,
		`+{"stage":"b","payload":"x","state":[1]}`:                        "state: not a JSON object",
		`+{"stage":"b","payload":"x","state":{"a":"\u0000"}}`:             `state: \u0000 in a string`,
		"+{\"stage\":\"b\",\"payload\":\"x\",\"state\":{\"a\":\"\xff\"}}": "state: bytes that are not UTF-8",
		`+{"stage":"b","payload":"x","state":{"a":[1e-20000]}}`:           "state: the number 1e-20000, beyond the range of PostgreSQL's numeric",
		`+{"stage":"b","payload":"x","key":""}`:                           "key is empty",
		`+{"stage":"b","payload":"x","order_key":"a\u0000"}`:              `order_key holds \u0000`,
		`+{"stage":"b","payload":"x"} {}`:                                 "more than one JSON value",
		`+{"stage":"b","payload":"x"}}`:                                   "'}' after the JSON object",
		`+{"stage":"b","payload":"x"} ]`:                                  "']' after the JSON object",
		`+[1]`:                                                            "not a JSON object",
		`+ {"stage":"b","payload":"x"}`:                                   "white space after '+'",
		`+{"stage":[1},"foo":1}`:                                          "not a JSON object", // a syntax error, not an unknown field
		// Names are matched exactly, once each; a string payload is UTF-8.
		`+{"STAGE":"b","PAYLOAD":"x"}`:                                                       `unknown field "STAGE"`,
		`+{"stage":"nosuch","Stage":"b","payload":"x"}`:                                      `unknown field "Stage"`,
		`+{"stage":"b","payload":"x","payload":"y"}`:                                         `field "payload" given twice`,
		"+{\"stage\":\"b\",\"payload\":\"\xff\"}":                                            "payload: bytes that are not UTF-8",
		`+{"stage":"b","payload":"\ud800"}`:                                                  "payload: a lone UTF-16 surrogate",
		`+{"stage":"b","payload":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`: "nested more than 64 deep",
	} {
		if _, err := core.ParseEmit(line); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseEmit(%s) = %v, want an error saying %q", line, err, why)
		}
	}
}

// Proves: a pass whose emit carries an order key whose lock a producer's
// open transaction holds does not hold the pipeline: its resolve writes
// nothing of it (Outcome.KeyBusy; its row stays running, no child, no
// history), the worker's next pass is written meanwhile, and the item is
// sent again LookEvery after the first refusal, then after twice the last
// pause each time (up to KeyWaitMax); once the producer committed it is
// written with its child, which waits blocked behind the producer's
// message of its key. The wait is logged once a minute per stage.
func TestAPassWhoseChildsOrderKeyAProducerHoldsWaitsAloneForThatProducer(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 2)
	late, ok := w.q.ReserveKeyed("k") // a producer of key k, in flight
	if !ok {
		t.Fatal("key k is locked")
	}
	w.emit(1, `+{"stage":"b","payload":"child","order_key":"k"}`)
	cmds := answerMove(w, 1, "0 >done")
	if it := itemFor(t, cmds, 1); len(it.Emits) != 1 || it.Emits[0].OrderKey != "k" {
		t.Fatalf("item %v, want the emit of order key k", it)
	}
	w.wantRow(1, "a", core.StatusRunning)
	if got := w.childrenOf(1); len(got) != 0 {
		t.Fatalf("children of 1 = %v while k's lock is held, want none", got)
	}
	if l := logsWith(cmds, "whose lock a producer's open transaction holds"); len(l) != 1 || !strings.Contains(l[0].Msg, "stage a: message 1 emitted a child with order key 'k'") ||
		!strings.Contains(l[0].Msg, "1 passes of the stage wait so") {
		t.Errorf("logs %v, want one line that says message 1's child waits for a producer of key 'k'", l)
	}
	// The worker's next message is written at once; message 1 waits.
	cmds = answerMove(w, 1, "0 >done")
	if r := one[core.Resolve](t, cmds); len(r.Items) != 1 || r.Items[0].ID != 2 {
		t.Fatalf("resolve %v, want message 2's item alone", r)
	}
	w.wantRow(2, "a", core.StatusDone)
	// Its tries: LookEvery after the refusal, then twice the pause each time.
	busyAt := w.now
	for _, pause := range []time.Duration{core.LookEvery, 2 * core.LookEvery, 4 * core.LookEvery, 8 * core.LookEvery} {
		cmds = w.tick(busyAt.Add(pause - time.Millisecond).Sub(epoch))
		none[core.Resolve](t, cmds, fmt.Sprintf("sent message 1 again sooner than %s after it was refused", pause))
		cmds = w.tick(busyAt.Add(pause).Sub(epoch))
		if it := itemFor(t, cmds, 1); len(it.Emits) != 1 {
			t.Fatalf("item %v, want message 1 sent again with its emit %s after it was refused", it, pause)
		}
		w.wantRow(1, "a", core.StatusRunning)
		none[core.Log](t, cmds, "logged the wait again within a minute")
		busyAt = w.now
	}
	// The producer commits; its message is k's head, the child waits behind it.
	w.q.Commit(late, "b")
	cmds = w.tick(busyAt.Add(16 * core.LookEvery).Sub(epoch))
	itemFor(t, cmds, 1)
	w.wantRow(1, "a", core.StatusDone)
	got := w.childrenOf(1)
	if len(got) != 1 || got[0] != "b:blocked:child" {
		t.Errorf("children of 1 = %v, want the child blocked at b behind the producer's message of k", got)
	}
}

// Proves: a pass whose children wait for a producer's order-key lock waits
// no longer than LookEvery after another such pass is written (a lock it
// waited for was let go, and its producer's may have been too), whatever
// its own pause had grown to.
func TestAPassThatWaitsForAKeyIsTriedAgainWhenAnotherIsWritten(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 2)
	lateK, _ := w.q.ReserveKeyed("k")
	lateJ, _ := w.q.ReserveKeyed("j")
	w.emit(1, `+{"stage":"b","payload":"child of 1","order_key":"k"}`)
	answerMove(w, 1, "0 >done")
	for _, d := range []time.Duration{10, 30, 70, 150, 310} { // its pause grows to 160 ms
		w.tick(d * time.Millisecond)
	}
	w.emit(1, `+{"stage":"b","payload":"child of 2","order_key":"j"}`)
	answerMove(w, 1, "0 >done")
	w.wantRow(1, "a", core.StatusRunning)
	w.wantRow(2, "a", core.StatusRunning)
	w.q.Commit(lateJ, "c")
	w.q.Commit(lateK, "c")
	// Message 2's first try again, LookEvery after its refusal, is written;
	// message 1, refused as long before, is tried at once, 310 ms before
	// its own pause would have ended.
	cmds := w.tick(w.now.Sub(epoch) + core.LookEvery)
	if it := itemFor(t, cmds, 2); len(it.Emits) != 1 {
		t.Fatalf("item %v, want message 2 sent again", it)
	}
	itemFor(t, cmds, 1)
	w.wantRow(2, "a", core.StatusDone)
	w.wantRow(1, "a", core.StatusDone)
}

// Proves: a shutdown does not wait for a producer that holds the order key
// of a pass's child: the pass waiting when the signal comes is tried once
// more, and when its key is still locked it is requeued (its row pending at
// its stage, no child, its history "requeued"), and the core exits 0.
func TestAShutdownRequeuesAPassWhoseChildsOrderKeyAProducerHolds(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 1)
	if _, ok := w.q.ReserveKeyed("k"); !ok { // a producer of key k, in flight, for good
		t.Fatal("key k is locked")
	}
	w.emit(1, `+{"stage":"b","payload":"child","order_key":"k"}`)
	answerMove(w, 1, "0 >done")
	w.wantRow(1, "a", core.StatusRunning)
	w.step(core.Shutdown{})
	cmds := w.exit(1, 0, "")
	cmds = append(cmds, w.tick(w.now.Sub(epoch)+core.LookEvery)...)
	if its := items(cmds); len(its) != 2 || its[0].Verdict != core.Move || its[1].Verdict != core.Requeue {
		t.Errorf("items %v, want the move tried once more, then, k still locked, a requeue", its)
	}
	if l := logsWith(cmds, "shutting down, its pass is requeued"); len(l) != 1 {
		t.Errorf("logs %v, want one line that says the pass is requeued", of[core.Log](cmds))
	}
	w.wantRow(1, "a", core.StatusPending)
	if got := w.childrenOf(1); len(got) != 0 {
		t.Errorf("children of 1 = %v, want none", got)
	}
	if e := one[core.Exit](t, w.all); e.Code != 0 {
		t.Errorf("exit code %d, want 0 (every row was resolved or requeued)", e.Code)
	}
}

// Proves: a pass refused keyQueueAfter times in a row for its child's
// order key (its pause grown to about KeyWaitMax) is next sent in a
// transaction of its own that queues for the key's lock (Resolve.QueueKeys),
// since a try never queues and producers that hold the lock one after
// another would hold it for good; at most one such transaction a
// KeyWaitMax; written once the lock is had.
func TestAPassThatWaitedLongForAKeyQueuesForItsLockAlone(t *testing.T) {
	w := newWorld(t, emitStages)
	w.start("a", 1)
	late, ok := w.q.ReserveKeyed("k")
	if !ok {
		t.Fatal("key k is locked")
	}
	w.emit(1, `+{"stage":"b","payload":"child","order_key":"k"}`)
	answerMove(w, 1, "0 >done")
	for _, at := range []time.Duration{10, 30, 70, 150, 310, 630} { // refusals 2 to 7
		if r := one[core.Resolve](t, w.tick(at*time.Millisecond)); r.QueueKeys {
			t.Fatalf("try at %dms queues for its keys, before its pauses grew: %v", at, r)
		}
	}
	queued := func(at time.Duration) []core.Command {
		t.Helper()
		cmds := w.tick(at)
		r := one[core.Resolve](t, cmds)
		if !r.QueueKeys || len(r.Items) != 1 || r.Items[0].ID != 1 || r.Items[0].Claim {
			t.Fatalf("try at %s: %v, want message 1 alone, queueing for its keys, claiming nothing", at, r)
		}
		return cmds
	}
	for _, cmd := range queued(1270 * time.Millisecond) { // refused: nothing follows it
		if _, isResolve := cmd.(core.Resolve); core.IsQueue(cmd) && !isResolve {
			t.Fatalf("%v sent with the try that queues; it goes alone", cmd)
		}
	}
	w.wantRow(1, "a", core.StatusRunning)
	none[core.Resolve](t, w.tick(2269*time.Millisecond), "sent a second try that queues within KeyWaitMax")
	w.q.Commit(late, "c")
	queued(2270 * time.Millisecond)
	w.wantRow(1, "a", core.StatusDone)
}
