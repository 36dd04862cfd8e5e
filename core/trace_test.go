package core_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Proves: a core told to trace passes claims every row's trace context and
// reports the end of each pass (Pass) with the worker's pid, its claim,
// handing and answer times, how it ended and the trace context its claim
// read; an INPUT = id stage's pass too, whose line carries no trace.
func TestATracingCoreReportsEveryPassWithItsTrace(t *testing.T) {
	w := newWorld(t, messageStages)
	w.c.TracePasses()
	w.q.InsertMessage("parse", `{}`, []byte("p"))
	cmds := w.step(core.Start{})
	if cl := one[core.Claim](t, cmds); !cl.Traces {
		t.Fatalf("claim %v does not ask for traces", cl)
	}
	first := one[core.Write](t, cmds)
	cmds = w.at(3*time.Millisecond).answer(first.Worker, "", "", "0 >store")
	p := one[core.Pass](t, cmds)
	msg := w.row(1).TraceParent
	if p.ID != 1 || p.Stage != "parse" || p.PID == 0 || p.Outcome != core.PassAdvance || p.To != "store" || p.Attempts != 0 {
		t.Errorf("pass %+v; want message 1 at parse, a pid, advance to store", p)
	}
	if p.Trace.Message != msg || p.Trace.Pass == "" || p.Trace.Pass != msg {
		t.Errorf("first pass trace %+v; want the message's fresh traceparent %s as both (the trace's root)", p.Trace, msg)
	}
	if !p.Handed.Equal(epoch) || !p.Claimed.Equal(epoch) || !p.Ended.Equal(epoch.Add(3*time.Millisecond)) {
		t.Errorf("pass claimed %v, handed %v, ended %v; want %v, %v and 3ms later", p.Claimed, p.Handed, p.Ended, epoch, epoch)
	}
	second := p
	// The id stage: claimed by the move, handed, failed.
	wr := one[core.Write](t, cmds)
	p = one[core.Pass](t, w.at(5*time.Millisecond).answer(wr.Worker, "", "", "3 no such mailbox"))
	if p.Stage != "store" || p.Outcome != core.PassFail || p.Reason != "no such mailbox" {
		t.Errorf("pass %+v; want store's failure with its reason", p)
	}
	if !p.Handed.Equal(second.Ended) {
		t.Errorf("second pass handed %v, want when the first ended (%v): its move claimed it", p.Handed, second.Ended)
	}
	if p.Trace.Message != msg || p.Trace.Pass == msg || p.Trace.Pass[:36] != msg[:36] {
		t.Errorf("second pass trace %+v; want the message's %s and a span of its own", p.Trace, msg)
	}
}

// Proves: a core not told to trace reports no pass and asks no claim for
// traces (off costs nothing).
func TestACoreThatDoesNotTraceReportsNoPass(t *testing.T) {
	w := newWorld(t, messageStages)
	w.q.InsertMessage("parse", `{}`, []byte("p"))
	cmds := w.step(core.Start{})
	if cl := one[core.Claim](t, cmds); cl.Traces {
		t.Fatalf("claim %v asks for traces", cl)
	}
	none[core.Pass](t, w.answer(one[core.Write](t, cmds).Worker, "", "", "0 >done"), "the core does not trace")
}

// Proves: a pass the watchdog ends reports the timeout's reason, as a failure
// or a crash does: its span's Error status says why.
func TestATimedOutPassReportsItsReason(t *testing.T) {
	w := newWorld(t, threeStages)
	w.c.TracePasses()
	wid := one[core.Spawn](t, w.start("a", 1)).Worker
	one[core.Kill](t, w.tick(301*time.Second))
	p := one[core.Pass](t, w.exit(wid, -1, "killed"))
	if p.Outcome != core.PassTimeout || !strings.Contains(p.Reason, "no answer within MAX_RUNTIME") {
		t.Errorf("pass %+v; want a timeout with its reason", p)
	}
}

// Proves: the messages a crashed worker had been handed behind its head,
// requeued, each report their pass (outcome requeue, the worker's pid,
// their handing), so the first pass of a trace the claim began, the root
// every later pass names as parent, is exported even when it was requeued.
func TestARequeuedPassIsReported(t *testing.T) {
	w := newWorld(t, historyStages)
	w.c.TracePasses()
	w.start("a", 2)
	w.at(core.StartWindow) // a crash, not a program that cannot start
	ps := of[core.Pass](w.exit(1, 0, "SIGSEGV"))
	if len(ps) != 2 {
		t.Fatalf("passes %+v; want the crashed head's and the requeued one's", ps)
	}
	p := ps[1]
	if p.ID != 2 || p.Outcome != core.PassRequeue || p.PID != 1001 || p.Handed.IsZero() || p.Trace.Pass == "" {
		t.Errorf("requeued pass %+v; want message 2, requeue, pid 1001, its handing and trace", p)
	}
	if ps[0].ID != 1 || ps[0].Outcome != core.PassCrash {
		t.Errorf("head pass %+v; want message 1's crash", ps[0])
	}
}
