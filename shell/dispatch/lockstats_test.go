package dispatch_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestStatisticsCountTheTransactionsInFlightWhenTheLockIsLost: a stage emits
// three children per message at SESSIONS = 2 while the dispatcher's lock
// session is ended every 150 ms, each loss a restart of its session. A queue
// transaction that commits as the loss is noticed reports its outcomes only
// in its result, and the statistics counted from them (children emitted,
// messages that left) must reach the next session's core (Start.Carry), not
// be dropped with the result or lost by ending the transaction in doubt
// after its COMMIT was sent: stage_stats.emitted ends equal to the children
// in the queue and dispatch_stats.messages_left to the rows done.
func TestStatisticsCountTheTransactionsInFlightWhenTheLockIsLost(t *testing.T) {
	t.Parallel()
	const n, each = 400, 3
	e := newEnv(t, "[pepsi-dispatch]\nSESSIONS = 2\n"+strings.TrimPrefix(emitConf, "[pepsi-dispatch]\n"))
	e.insertN("split", fmt.Sprintf("split=sleep:2+emit:collect:%d+answer:0 >done", each), n)
	c := e.conn()
	d := e.start()
	losses := 0
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		if k := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE stage = 'split' AND status = 'done'`); k >= n {
			break
		}
		time.Sleep(150 * time.Millisecond)
		losses += e.terminate(c, lockBackend)
	}
	if losses < 5 {
		t.Fatalf("the lock was lost %d times before the parents were done; want at least 5", losses)
	}
	e.waitCounts(90*time.Second, map[string]int{"done": n * (1 + each)})
	e.waitStatsOf(n * (1 + each))
	d.stopClean()
	children := e.scalar(`SELECT count(*) FROM pepsi.queue WHERE parent_id IS NOT NULL`)
	emitted := e.scalar(`SELECT coalesce(sum(emitted), 0) FROM pepsi.stage_stats WHERE stage = 'split'`)
	if emitted != children || children != n*each {
		t.Errorf("after %d lost locks: stage_stats.emitted of split %d, children in the queue %d; want both %d", losses, emitted, children, n*each)
	}
}
