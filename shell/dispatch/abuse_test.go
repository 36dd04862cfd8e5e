package dispatch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Stage programs that abuse the protocol, and a queue that does not look like
// the one the dispatcher expects. Each must cost at most the message at hand:
// the worker is stopped, its head failed with a reason, the rest requeued, and
// the pipeline goes on.

// A worker that writes megabytes without a newline cannot make the dispatcher
// buffer them: the line is cut at 64 KiB and is a protocol error.
func TestMegabytesWithoutANewlineAreAProtocolErrorNotABuffer(t *testing.T) {
	t.Parallel()
	failsThenDone(t, "a=flood:8000000+hang", "protocol error")
}

// A valid answer longer than 64 KiB (a transition with a large patch) is a
// protocol error, as pepsi-dispatch(1) says: not cut and written as a patch
// that is not JSON while the worker lives on.
func TestAnAnswerLongerThan64KiBIsAProtocolError(t *testing.T) {
	t.Parallel()
	e, id := failsThenDone(t, `a=answer:0 >done {"x":"`+strings.Repeat("x", 70_000)+`"}`, "protocol error: worker pid")
	e.expectRow(id, "failed", "a", "answered a line longer than 65536 bytes")
	if r := e.row(id); strings.Contains(r.Error, "not valid JSON") {
		t.Errorf("message %d failed with %q; want a protocol error, not a patch", id, r.Error)
	}
}

// An answer before any id was handed over answers nothing: a protocol error,
// and the worker's ids are requeued (or its head failed), never lost.
func TestAnAnswerBeforeAnyIDIsAProtocolError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[stage-a]\nPROGRAM = @BIN@/eagerstage\nPARALLELISM = 1\nQUEUE_LIMIT = 1\n")
	e.insert("a", "a=done")
	d := e.start()
	waitFor(t, 30*time.Second, "the dispatcher to say the worker broke the protocol", func() (bool, string) {
		return strings.Contains(d.logs.String(), "broke the protocol"), "not yet"
	})
	waitFor(t, 30*time.Second, "no message left pending or running", func() (bool, string) {
		c, err := e.counts()
		if err != nil {
			return false, err.Error()
		}
		return c["pending"] == 0 && c["running"] == 0, fmtCounts(c)
	})
	d.stopClean()
}

// A second answer for one id answers an id the worker was never sent.
func TestAnAnswerForAnIDNeverSentIsAProtocolError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 1, "a"))
	ids := e.insert("a", "a=done+print:0+print:0+hang")
	more := e.insert("a", "a=done")
	d := e.start()
	waitFor(t, 30*time.Second, "the dispatcher to say the worker broke the protocol", func() (bool, string) {
		return strings.Contains(d.logs.String(), "broke the protocol"), "not yet"
	})
	e.waitCounts(30*time.Second, map[string]int{"done": 2})
	d.stopClean()
	e.expectRow(ids[0], "done", "a", "")
	e.expectRow(more[0], "done", "a", "")
}

// A worker that closes its standard output can answer nothing more: it is
// stopped like a crashed one, not waited for until MAX_RUNTIME, and its head's
// reason says why it was killed.
func TestAWorkerThatClosesItsStandardOutputIsStoppedNotWaitedFor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nMAX_RUNTIME = 600\n"+stages(1, 4, "a"))
	// The first message makes it a worker that has answered (one that dies
	// before its first answer is a failed start, requeued).
	ids := e.insert("a", "a=done", "a=closeout+hang", "a=done")
	d := e.start()
	e.waitCounts(30*time.Second, map[string]int{"done": 2, "failed": 1})
	d.stopClean()
	e.expectRow(ids[1], "failed", "a", "crashed (killed by the dispatcher: it closed its standard output and did not exit)")
	e.expectRow(ids[2], "done", "a", "")
	if !strings.Contains(d.logs.String(), "closed its standard output") {
		t.Errorf("the log does not say the worker closed its standard output")
	}
}

// A worker that closes its standard input can be handed nothing more: the
// write of its next id fails, and it is stopped like one that closed its
// standard output, not waited for until MAX_RUNTIME (its head's reason says
// why it was killed); the stage goes on with a new worker.
func TestAWorkerThatClosesItsStandardInputIsStoppedNotWaitedFor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nMAX_RUNTIME = 600\nSTOP_GRACE = 1\n"+
		"[stage-a]\nPROGRAM = @DIR@/closein\nPARALLELISM = 1\nQUEUE_LIMIT = 1\n")
	// It closes its standard input before it answers its first message, so
	// the next id is written to a pipe nobody reads; it answers, so it is a
	// worker that has answered (one that dies before its first answer is a
	// failed start, requeued), and lives on.
	e.writeScript("closein", "read id\nexec <&-\necho '0 >done'\nexec sleep 600\n")
	ids := e.insert("a", "first", "second", "third")
	d := e.start()
	e.waitCounts(30*time.Second, map[string]int{"done": 2, "failed": 1})
	d.stopClean()
	e.expectRow(ids[0], "done", "a", "")
	e.expectRow(ids[1], "failed", "a", "crashed (killed by the dispatcher: it closed its standard input and did not exit)")
	e.expectRow(ids[2], "done", "a", "")
	if !strings.Contains(d.logs.String(), "closed its standard input") {
		t.Errorf("the log does not say the worker closed its standard input")
	}
}

// A message deleted while its worker runs it leaves nothing to write: the
// dispatcher's guarded writes find no row, and the pipeline goes on.
func TestAMessageDeletedWhileRunningIsForgottenAndThePipelineGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stages(1, 4, "a"))
	ids := e.insert("a", "a=sleep:1500+answer:0 >done", "a=sleep:1500+done")
	d := e.start()
	waitFor(t, 15*time.Second, "both messages running", func() (bool, string) {
		c, _ := e.counts()
		return c["running"] == 2, fmtCounts(c)
	})
	if _, err := e.db.Exec(context.Background(), "DELETE FROM pepsi.queue WHERE ingress_id = ANY($1)", ids); err != nil {
		t.Fatal(err)
	}
	after := e.insert("a", "a=done")
	e.waitCounts(30*time.Second, map[string]int{"done": 1})
	d.stopClean()
	e.expectRow(after[0], "done", "a", "")
}

// A database whose PEPSI schema is older than the binary is refused at start,
// naming the version it needs and saying to migrate: here the newest
// migration is struck from the version table.
func TestAnOlderSchemaIsRefusedWithExitFourSayingToMigrate(t *testing.T) {
	t.Parallel()
	e := newEnvAt(t, pgtest.NewMigrated(t), stages(1, 4, "a"))
	var want int
	if err := e.db.QueryRow(context.Background(), "SELECT max(version) FROM pepsi.schema_migrations").Scan(&want); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(context.Background(), "DELETE FROM pepsi.schema_migrations WHERE version = $1", want); err != nil {
		t.Fatal(err)
	}
	d := e.start()
	code, err := d.wait(20 * time.Second)
	if code != dispatch.ExitFatal || err == nil || !strings.Contains(err.Error(), "run pepsi-queue migrate") ||
		!strings.Contains(err.Error(), fmt.Sprintf("needs %d", want)) && !strings.Contains(err.Error(), fmt.Sprintf("want version %d", want)) {
		t.Errorf("exit %d, err %v; want exit %d and an error naming the versions and saying to run pepsi-queue migrate",
			code, err, dispatch.ExitFatal)
	}
}

// A database migrated only to version 6 (before the attempts column, the
// retries and the rate statistics) is refused: the dispatcher names both
// versions and says what to run, and touches nothing.
func TestASchemaBeforeRetriesIsRefusedSayingWhatToRun(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDatabase(t)
	if _, err := store.MigrateTo(context.Background(), pgtest.Connect(t, url), 6); err != nil {
		t.Fatal(err)
	}
	e := newEnvAt(t, url, stages(1, 4, "a"))
	e.insert("a", "a=done")
	d := e.start()
	code, err := d.wait(20 * time.Second)
	want := fmt.Sprintf("the database has PEPSI schema version 6, this pepsi-dispatch needs %d: run pepsi-queue migrate", store.Latest())
	if code != dispatch.ExitFatal || err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("exit %d, err %v; want exit %d and %q", code, err, dispatch.ExitFatal, want)
	}
	if n := e.scalar("SELECT count(*) FROM pepsi.queue WHERE status = 'pending'"); n != 1 {
		t.Errorf("%d rows pending after the refusal, want the 1 inserted, untouched", n)
	}
}

// A worker that floods its standard error is logged up to its limit; the rest
// is counted, not logged, and the count is said. Every line is one or the
// other, and the message is answered as usual.
func TestAWorkerFloodingItsStandardErrorIsLoggedUpToItsLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[stage-a]\nPROGRAM = @DIR@/flood\nPARALLELISM = 1\nQUEUE_LIMIT = 1\n")
	const lines = 30000
	e.writeScript("flood", fmt.Sprintf("read id\nseq 1 %d | sed 's/^/flood line /' >&2\necho '0 >done'\nexec cat >/dev/null\n", lines))
	id := e.insert("a", "x")[0]
	d := e.start()
	e.waitCounts(30*time.Second, map[string]int{"done": 1})
	d.stopClean()
	e.expectRow(id, "done", "a", "")
	logged := len(d.logs.lines("flood line "))
	var dropped int
	for _, l := range d.logs.lines("lines dropped, over the limit") {
		n, _ := l["dropped"].(float64)
		dropped += int(n)
	}
	if logged+dropped != lines || dropped == 0 {
		t.Errorf("%d stderr lines: %d logged, %d said dropped; want each logged or counted, and some dropped", lines, logged, dropped)
	}
}
