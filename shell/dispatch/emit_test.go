package dispatch_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// Emit lines checked from outside (docs/protocol.md, "Emitting messages"):
// the real dispatcher on PostgreSQL, a stage that emits three messages per
// pass, and the dispatcher killed with SIGKILL mid-run.

// emitConf: split (teststage) emits, its children are finished by collect,
// an INPUT = message filter that answers 0 >done.
const emitConf = `[pepsi-dispatch]
POLL_INTERVAL = 30
[stage-split]
PROGRAM = @BIN@/teststage
PARALLELISM = 2
QUEUE_LIMIT = 4
EMIT_MAX = 3
[stage-collect]
PROGRAM = @BIN@/filterstage
PARALLELISM = 2
QUEUE_LIMIT = 8
INPUT = message
`

// TestEmittedChildrenExistOnceForEachCommittedPassThroughASIGKILL: 300
// messages each emit three children before "0 >done". The dispatcher is
// killed with SIGKILL while it works and a new one finishes the run: every
// parent ends done with exactly its three children (none lost with the dead
// dispatcher's last transaction, none twice when a pass it never committed
// ran again), every child names its parent, and no worker crashed. A
// message that emits a fourth child (EMIT_MAX = 3), or one at a stage the
// dispatcher does not run, fails with a reason that says so and leaves no
// child; the worker lives on.
func TestEmittedChildrenExistOnceForEachCommittedPassThroughASIGKILL(t *testing.T) {
	t.Parallel()
	const n, each = 300, 3
	e := newEnv(t, emitConf)
	e.insertN("split", fmt.Sprintf("split=sleep:5+emit:collect:%d+answer:0 >done", each), n)
	over := e.insert("split", "split=emit:collect:4+answer:0 >done", "split=emit:nowhere:1+answer:0 >done")
	b := startBinary(t, "dispatcher", e.conf, e.url)
	waitFor(t, 60*time.Second, "a third of the parents done", func() (bool, string) {
		k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE stage = 'split' AND status = 'done'`)
		return k >= n/3, fmt.Sprintf("%d done", k)
	})
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-b.done
	// Its sessions end once the server notices its sockets closed; until
	// then its backend holds the dispatcher lock, and a new dispatcher
	// refuses to start (one per database), as it must.
	waitFor(t, 30*time.Second, "the killed dispatcher's backends to go", func() (bool, string) {
		k := e.scalar(`SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pepsi-dispatch%' AND datname = current_database()`)
		return k == 0, fmt.Sprintf("%d backends", k)
	})
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE stage = 'split' AND status = 'done'`); k >= n {
		t.Fatalf("all %d parents were done before the kill: the test killed nothing mid-run", k)
	}
	d := e.start()
	e.waitCounts(90*time.Second, map[string]int{"done": n * (1 + each), "failed": 2})
	d.stopClean()

	if k := e.scalar(`SELECT count(*) FROM (SELECT p.ingress_id FROM pepsi.queue p
		LEFT JOIN pepsi.queue c ON c.parent_id = p.ingress_id
		WHERE p.stage = 'split' AND p.status = 'done' GROUP BY p.ingress_id HAVING count(c.ingress_id) <> $1) x`, each); k != 0 {
		t.Errorf("%d done parents have other than %d children\n%s", k, each, b.logs)
	}
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue c WHERE c.stage = 'collect'
		AND (c.parent_id IS NULL OR convert_from(c.payload, 'UTF8') NOT LIKE c.parent_id || '/%')`); k != 0 {
		t.Errorf("%d children do not name the parent whose pass emitted them", k)
	}
	if k := e.scalar(`SELECT count(*) FROM (SELECT parent_id, payload FROM pepsi.queue WHERE parent_id IS NOT NULL
		GROUP BY 1, 2 HAVING count(*) > 1) x`); k != 0 {
		t.Errorf("%d children were inserted more than once", k)
	}
	e.expectRow(over[0], "failed", "split", "EMIT_MAX")
	e.expectRow(over[1], "failed", "split", "which this dispatcher does not run")
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE parent_id = ANY ($1)`, over); k != 0 {
		t.Errorf("the messages whose emits were refused left %d children", k)
	}
	if st := e.stageStats()["split"]; st.Crashes != 0 {
		t.Errorf("split's workers crashed %d times; a bad emit must fail its message, not the worker", st.Crashes)
	}
}

// TestTheStageLibraryEmitsThroughTheDispatcherInBothInputModes: a stage built
// with the Go stage library (teststage's libstage personality, whose emit op
// calls Message.Emit) emits three children per message before Done, as an
// INPUT = id and as an INPUT = message stage. Every parent ends done with
// exactly its three children, each at collect with parent_id naming it and
// finished there. A handler that emits and then fails (Failed, or Error)
// leaves no child, and since the library writes no emit line for it, the
// dispatcher counts no emit as dropped.
func TestTheStageLibraryEmitsThroughTheDispatcherInBothInputModes(t *testing.T) {
	t.Parallel()
	const n, each = 40, 3
	e := newEnv(t, `[pepsi-dispatch]
POLL_INTERVAL = 30
[stage-splitid]
PROGRAM = @BIN@/libstage
PARALLELISM = 2
QUEUE_LIMIT = 4
[stage-splitmsg]
PROGRAM = @BIN@/libstage
INPUT = message
PARALLELISM = 2
QUEUE_LIMIT = 4
[stage-collect]
PROGRAM = @BIN@/filterstage
PARALLELISM = 2
QUEUE_LIMIT = 8
INPUT = message
`)
	var failing []int64
	for _, st := range []string{"splitid", "splitmsg"} {
		e.insertN(st, fmt.Sprintf("%s=emit:collect:%d+done", st, each), n)
		failing = append(failing, e.insert(st, st+"=emit:collect:2+failed", st+"=emit:collect:2+answer:1 broken")...)
	}
	d := e.start()
	e.waitCounts(60*time.Second, map[string]int{"done": 2 * n * (1 + each), "failed": len(failing)})
	d.stopClean()

	if k := e.scalar(`SELECT count(*) FROM (SELECT p.ingress_id FROM pepsi.queue p
		LEFT JOIN pepsi.queue c ON c.parent_id = p.ingress_id
		WHERE p.stage IN ('splitid', 'splitmsg') AND p.status = 'done'
		GROUP BY p.ingress_id HAVING count(c.ingress_id) <> $1) x`, each); k != 0 {
		t.Errorf("%d done parents have other than %d children", k, each)
	}
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue c JOIN pepsi.queue p ON p.ingress_id = c.parent_id
		WHERE c.stage = 'collect' AND c.status = 'done' AND convert_from(c.payload, 'UTF8') LIKE c.parent_id || '/%'
		  AND p.stage = $1`, "splitmsg"); k != n*each {
		t.Errorf("%d children of the INPUT = message stage are done at collect naming their parent, want %d", k, n*each)
	}
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE parent_id = ANY ($1)`, failing); k != 0 {
		t.Errorf("the messages whose handler failed after emitting left %d children", k)
	}
	var emitted, dropped int64
	if err := e.db.QueryRow(context.Background(), `SELECT coalesce(sum(emitted), 0), coalesce(sum(emits_dropped), 0)
		FROM pepsi.stage_stats WHERE stage IN ('splitid', 'splitmsg')`).Scan(&emitted, &dropped); err != nil {
		t.Fatal(err)
	}
	if emitted != 2*n*each || dropped != 0 {
		t.Errorf("stage_stats: emitted %d, emits_dropped %d; want %d and 0 (a failed handler's emits are never written)", emitted, dropped, 2*n*each)
	}
}

// TestAProducersOpenKeyedTransactionHoldsOnlyThePassThatEmitsIntoItsKey: a
// producer's transaction has inserted a message of order key k and stays
// open; a message at split emits a child of key k. Its pass waits for that
// producer, alone: 100 keyless messages pass split and collect meanwhile
// (before, the dispatcher's transaction that inserts the child waited for
// the producer's lock, and every stage with it, up to its lock wait). Once
// the producer commits, the pass is written: the parent done, its child
// done after the producer's message of k, which was k's oldest.
func TestAProducersOpenKeyedTransactionHoldsOnlyThePassThatEmitsIntoItsKey(t *testing.T) {
	t.Parallel()
	const n = 100
	e := newEnv(t, emitConf)
	first, commit := e.producerOfK()
	parent := e.insert("split", "split=emit:collect:1:k+answer:0 >done")[0]
	e.insertN("split", "split=answer:0 >collect", n)
	d := e.start()
	waitFor(t, 30*time.Second, "the keyless messages done while the producer of k holds its transaction", func() (bool, string) {
		k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE stage = 'collect' AND status = 'done' AND order_key IS NULL`)
		return k == n, fmt.Sprintf("%d done", k)
	})
	e.expectRow(parent, "running", "split", "")
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE parent_id = $1`, parent); k != 0 {
		t.Fatalf("%d children inserted while their key's producer is in flight", k)
	}
	if l := d.logs.lines("whose lock a producer's open transaction holds"); len(l) != 1 {
		t.Errorf("%d log lines of the pass that waits for the producer; want 1", len(l))
	}
	commit()
	waitFor(t, 30*time.Second, "the parent, its child and the producer's message done", func() (bool, string) {
		k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status = 'done' AND (ingress_id IN ($1, $2) OR parent_id = $2)`, first, parent)
		return k == 3, fmt.Sprintf("%d done", k)
	})
	e.wantChildDoneAfter(parent, first)
	d.stopClean()
}

// TestAShutdownDoesNotWaitForAProducerThatHoldsAPassesChildsOrderKey: a
// pass whose child's order key a producer's open transaction holds waits
// for that producer (above); a SIGTERM meanwhile must not wait with it, the
// producer may hold its transaction for as long as it likes: the
// dispatcher exits 0 within a second, its pass given up like a pass whose
// worker was stopped unanswered (the parent pending at its stage, no
// child, its history "requeued"). Once the producer committed, the next
// dispatcher runs the pass again: one child, after the producer's message
// of its key. Before, the shutdown waited for the producer's commit.
func TestAShutdownDoesNotWaitForAProducerThatHoldsAPassesChildsOrderKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, emitConf)
	first, commit := e.producerOfK()
	parent := e.insert("split", "split=emit:collect:1:k+answer:0 >done")[0]
	d := e.start()
	waitFor(t, 30*time.Second, "the pass that waits for the producer of k", func() (bool, string) {
		l := d.logs.lines("whose lock a producer's open transaction holds")
		return len(l) == 1, fmt.Sprintf("%d log lines", len(l))
	})
	d.signals <- syscall.SIGTERM
	if code, err := d.wait(5 * time.Second); code != 0 || err != nil {
		t.Errorf("after SIGTERM: exit %d, err %v; want exit 0, no error", code, err)
	}
	e.expectRow(parent, "pending", "split", "")
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE parent_id = $1`, parent); k != 0 {
		t.Fatalf("%d children inserted while their key's producer is in flight", k)
	}
	if k := e.scalar(`SELECT count(*) FROM pepsi.history WHERE ingress_id = $1 AND event = 'requeued'`, parent); k != 1 {
		t.Errorf("%d history rows 'requeued' of the parent; want 1", k)
	}
	commit()
	d = e.start()
	waitFor(t, 30*time.Second, "the parent, its child and the producer's message done", func() (bool, string) {
		k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE status = 'done' AND (ingress_id IN ($1, $2) OR parent_id = $2)`, first, parent)
		return k == 3, fmt.Sprintf("%d done", k)
	})
	if k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE parent_id = $1`, parent); k != 1 {
		t.Errorf("%d children of the parent; want 1", k)
	}
	e.wantChildDoneAfter(parent, first)
	d.stopClean()
}

// producerOfK opens a producer's transaction that inserts a message of
// order key k at collect and holds it (and k's lock) until commit is
// called; the test's end rolls back one never committed. It returns the
// message's id.
func (e *env) producerOfK() (first int64, commit func()) {
	e.t.Helper()
	ctx := context.Background()
	producer, err := e.db.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { producer.Rollback(ctx) }) //nolint:errcheck // a no-op once committed
	if err := producer.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, payload, order_key) VALUES ('collect', 'first of k', 'k') RETURNING ingress_id`).Scan(&first); err != nil {
		e.t.Fatal(err)
	}
	return first, func() {
		if err := producer.Commit(ctx); err != nil {
			e.t.Fatal(err)
		}
	}
}

// wantChildDoneAfter fails the test unless parent's child was done after
// message first, its key's oldest.
func (e *env) wantChildDoneAfter(parent, first int64) {
	e.t.Helper()
	if k := e.scalar(`SELECT count(*) FROM pepsi.history c, pepsi.history f
		WHERE c.ingress_id = (SELECT ingress_id FROM pepsi.queue WHERE parent_id = $1) AND c.event = 'done'
		  AND f.ingress_id = $2 AND f.event = 'done' AND c.at >= f.at`, parent, first); k != 1 {
		e.t.Errorf("the child of key k was not done after the producer's message of k, k's oldest")
	}
}
