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
