package store_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// TestAKeyedResolveReadsItsDecisionsOncePerItemNotOncePerPair: a keyed
// resolve of n moves, each emitting a child of an order key of its own,
// reads its items' order-key locks ("key_locks") and, for the items it did
// not write, their decisions ("decided") by a look-up per item, not by a
// scan of every item's for each item: both with the keys' locks free and
// with every bucket's lock held by a producer (every item key_busy, none
// written). Scanned per item, the CTE scans read n² rows (300 items:
// 90,000), and a resolve of 2,000 items whose children wait for a producer
// took 0.4 s instead of 0.07.
func TestAKeyedResolveReadsItsDecisionsOncePerItemNotOncePerPair(t *testing.T) {
	t.Parallel()
	const n = 300
	h := newHarness(t)
	conn := pgtest.Connect(t, h.url)
	execAll(t, conn,
		fmt.Sprintf("INSERT INTO pepsi.queue (stage, status) SELECT 'a', 'running' FROM generate_series(1, %d)", n),
		"PREPARE resolve("+resolveParams+", bigint[], text[], bytea[], text[], text[], text[], bool[]) AS "+
			resolveStatements[0].sql)
	var ords, keys []string
	for i := 1; i <= n; i++ {
		ords, keys = append(ords, fmt.Sprint(i)), append(keys, fmt.Sprintf("k%d", i))
	}
	each := func(v string) string { return "'{" + strings.TrimSuffix(strings.Repeat(v+",", n), ",") + "}'" }
	args := moveClaimArgs(1, n) + ", '{" + strings.Join(ords, ",") + "}', " + each("c") + ", " + each(`"\\x78"`) + ", " +
		each(`""`) + ", " + each(`""`) + ", '{" + strings.Join(keys, ",") + "}', " + each("false")
	producer := pgtest.Connect(t, h.url)
	for _, busy := range []bool{false, true} {
		if busy {
			execAll(t, producer, "BEGIN", "SELECT count(pg_advisory_xact_lock(1885696107, b)) FROM generate_series(0, 1023) b")
		}
		plan := explain(t, conn, "force_custom_plan", "resolve", args)
		read := 0.0
		plan.walk(nil, func(p, _ *planNode) {
			if p.NodeType == "CTE Scan" {
				read += p.ActualLoops * (p.ActualRows + p.RemovedByFilter)
			}
		})
		t.Logf("busy %v: %g rows of CTEs read", busy, read)
		if read > 20*n {
			t.Errorf("keyed resolve of %d items (locks held by a producer: %v) read %g rows of its CTEs; want at most %d:\n%s", n, busy, read, 20*n, plan)
		}
	}
	execAll(t, producer, "ROLLBACK")
}
