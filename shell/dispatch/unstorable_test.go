package dispatch_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// unstorableFilter is an INPUT = message stage in sh that answers, for the
// message whose payload names it, what PostgreSQL cannot store as the stage
// wrote it: a reason with bytes that are not UTF-8 and a NUL, a patch or an
// emitted state with such bytes, a patch nested deeper than jsonb's parser
// goes on a server with a small max_stack_depth. Any other message is
// finished.
const unstorableFilter = `#!/bin/sh
deep=$(printf '%0100d' 0 | sed 's/0/[/g')$(printf '%0100d' 0 | sed 's/0/]/g')
while IFS= read -r line; do
	case $line in
	*'"payload":"reason"'*) printf '3 bad \377\376 and \000 in it\n' ;;
	*'"payload":"retry"'*) printf '75 later \377\n' ;;
	*'"payload":"patch"'*) printf '0 >done {"a":"\377"}\n' ;;
	*'"payload":"key"'*) printf '0 >done {"\377":1}\n' ;;
	*'"payload":"emit"'*) printf '+{"stage":"f","payload":"child","state":{"a":"x\377"}}\n0 >done\n' ;;
	*'"payload":"deep"'*) printf '0 >done {"a":%s}\n' "$deep" ;;
	*) echo '0 >done' ;;
	esac
done
`

// Proves: what a stage answers that PostgreSQL could not store as written
// costs at most its own message, and never the dispatcher's transaction
// (which would fail again at every try, holding every other message): a
// reason's bytes that are not UTF-8, and its NULs, are replaced, and a patch
// or an emit that jsonb would refuse fails its message with a reason that
// says why (docs/protocol.md).
func TestWhatPostgreSQLCannotStoreCostsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, `
[pepsi-dispatch]
MAX_RUNTIME = 10

[stage-f]
PROGRAM = @DIR@/filter
INPUT = message
PARALLELISM = 1
QUEUE_LIMIT = 16
RETRY_LIMIT = 1
RETRY_DELAY = 100ms
`)
	if err := os.WriteFile(filepath.Join(e.dir, "filter"), []byte(unstorableFilter), 0o755); err != nil {
		t.Fatal(err)
	}
	ids := e.insert("f", "ok", "reason", "ok", "retry", "patch", "key", "emit", "deep", "ok")
	d := e.start()
	waitFor(t, 30*time.Second, "every message final", func() (bool, string) {
		c, err := e.counts()
		return err == nil && c["pending"] == 0 && c["running"] == 0 && c["paused"] == 0, fmtCounts(c)
	})
	d.stopClean()
	for _, i := range []int{0, 2, 8} {
		e.expectRow(ids[i], "done", "f", "")
	}
	e.expectRow(ids[1], "failed", "f", "bad \uFFFD and \uFFFD in it")
	e.expectRow(ids[3], "failed", "f", "later \uFFFD")
	e.expectRow(ids[4], "failed", "f", "not UTF-8")
	e.expectRow(ids[5], "failed", "f", "not UTF-8")
	e.expectRow(ids[6], "failed", "f", "not UTF-8")
	e.expectRow(ids[7], "failed", "f", "nested more than 64 deep")
	if n := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE payload = 'child'`); n != 0 {
		t.Errorf("%d children of the refused emit; want none", n)
	}
	if strings.Contains(d.logs.String(), "queue write failed") {
		t.Errorf("a queue transaction failed; want none:\n%s", d.logs.String())
	}
}

// Proves what docs/operations.md ("A write the database refuses") says of a
// constraint of the operator's own that refuses a transition: the
// transaction is narrowed down to the message whose outcome is refused, that
// message fails with a reason that says so (and its history says failed),
// and the other messages of the same transactions are written as answered.
func TestAConstraintThatRefusesATransitionCostsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	refusedCostsOnlyItsMessage(t, `ALTER TABLE pepsi.queue ADD CONSTRAINT test_refuses CHECK (NOT state ? 'forbidden')`)
}

// The same of a deferred constraint, one checked at COMMIT: its refusal is
// narrowed as one checked at once is, rather than failing every try of the
// transaction and holding the pipeline.
func TestADeferredConstraintThatRefusesATransitionCostsOnlyItsMessage(t *testing.T) {
	t.Parallel()
	refusedCostsOnlyItsMessage(t, `
		CREATE FUNCTION public.test_refuses() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.state ? 'forbidden' THEN
				RAISE EXCEPTION 'forbidden state' USING ERRCODE = 'check_violation', CONSTRAINT = 'test_refuses';
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER test_refuses AFTER UPDATE ON pepsi.queue
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.test_refuses();`)
}

// refusedCostsOnlyItsMessage runs four messages, one of them answering a
// patch the constraint test_refuses that ddl makes refuses, and checks that
// only that one fails.
func refusedCostsOnlyItsMessage(t *testing.T, ddl string) {
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 30\n"+stages(1, 4, "a"))
	if _, err := e.db.Exec(context.Background(), ddl); err != nil {
		t.Fatal(err)
	}
	ids := e.insert("a", "a=answer:0 >done", `a=answer:0 >done {"forbidden":1}`, "a=answer:0 >done", "a=answer:0 >done")
	d := e.start()
	e.waitCounts(30*time.Second, map[string]int{"done": 3, "failed": 1})
	d.stopClean()
	for _, i := range []int{0, 2, 3} {
		e.expectRow(ids[i], "done", "a", "")
	}
	e.expectRow(ids[1], "failed", "a", "the database refused the write of this message's outcome")
	if got := e.scalar(`SELECT count(*) FROM pepsi.history WHERE ingress_id = $1 AND event = 'failed' AND detail LIKE '%test_refuses%'`, ids[1]); got != 1 {
		t.Errorf("history of the refused message has %d failed rows naming the constraint; want 1", got)
	}
	if strings.Contains(d.logs.String(), "queue write failed") {
		t.Errorf("a queue transaction failed; want the refusal narrowed to its message:\n%s", d.logs.String())
	}
}

// Proves what docs/operations.md ("A write the database refuses") says of a
// constraint that refuses a message's outcome and its failure too: nothing
// tells that message apart, so the transaction fails at every try, the log
// says the database refused the data itself, nothing is lost meanwhile, and
// once the constraint is dropped the next try writes everything.
func TestAConstraintThatRefusesEveryOutcomeHoldsThePipelineUntilDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "[pepsi-dispatch]\nPOLL_INTERVAL = 30\n"+stages(1, 4, "a"))
	if _, err := e.db.Exec(context.Background(), `ALTER TABLE pepsi.queue ADD CONSTRAINT test_refuses
		CHECK (status IN ('pending', 'running', 'blocked', 'paused') OR NOT state ? 'held')`); err != nil {
		t.Fatal(err)
	}
	ids := e.insert("a", "a=answer:0 >done", "a=answer:0 >done")
	if _, err := e.db.Exec(context.Background(), `UPDATE pepsi.queue SET state = '{"held":1}' WHERE ingress_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	d := e.start()
	waitFor(t, 20*time.Second, "the refusal in the log", func() (bool, string) {
		return strings.Contains(d.logs.String(), "the database refused the data itself"), ""
	})
	if c, _ := e.counts(); c["done"]+c["failed"] != 0 {
		t.Errorf("counts %s while the transaction is refused; want nothing written", fmtCounts(c))
	}
	if _, err := e.db.Exec(context.Background(), `ALTER TABLE pepsi.queue DROP CONSTRAINT test_refuses`); err != nil {
		t.Fatal(err)
	}
	e.waitCounts(30*time.Second, map[string]int{"done": 2})
	d.stopClean()
	for _, id := range ids {
		e.expectRow(id, "done", "a", "")
	}
}
