package dispatch_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Ordering per key, checked from outside (docs/protocol.md, "Ordering per
// key"): the real pepsi-dispatch binary, three Python stages at PARALLELISM 4
// and QUEUE_LIMIT 8 (testdata/keyedstage.py), a hot key with a backlog, many
// keys of a few messages and keyless messages, inserted by two producers while
// the dispatcher runs; some messages pause, retry (75), fail, or retry until
// RETRY_LIMIT fails them. Each worker logs when it read each line and when it
// answered it; the checks read only those logs and the final rows. Whether
// keyless messages run unslowed beside a key's backlog is a matter of speed:
// pepsi-bench measures it (docs/performance.md, "Ordering per key").

// hotEnv names the variable that sets the hot key's backlog: make
// test-orderkey runs 20,000; make test runs hotDefault, so CI stays quick.
const (
	hotEnv     = "PEPSI_TEST_ORDER_HOT"
	hotDefault = 1500
)

// keyedRetryLimit is RETRY_LIMIT at stages b and c, where messages retry.
const keyedRetryLimit = 2

// keyedMessage is one planned message: its key ("" for none) and what it does
// (the stage's payload, testdata/keyedstage.py: "STAGE:WHAT" or "").
type keyedMessage struct {
	key, act string
}

// outcome is what a message's plan makes of it: its final status, the stage a
// failed one fails at, and the stages it passes, in order.
func (m keyedMessage) outcome() (status, stage string, passes []string) {
	where, what, _ := strings.Cut(m.act, ":")
	for _, s := range []string{"a", "b", "c"} {
		if s != where {
			passes = append(passes, s)
			continue
		}
		switch what {
		case "fail":
			return "failed", s, append(passes, s)
		case "exhaust":
			for range keyedRetryLimit + 1 {
				passes = append(passes, s)
			}
			return "failed", s, passes
		default: // pause and retry pass the stage twice
			passes = append(passes, s, s)
		}
	}
	return "done", "", passes
}

// keyedPlan draws the scenario: hot messages of key "hot", keys k0… of one to
// five messages, keyless ones. Of the hot key one in 50 does something
// (pause, retry, fail, exhaust), of the rest one in five, at a stage that
// allows it (retries only at b and c, where RETRY_LIMIT is set).
func keyedPlan(rng *rand.Rand, hot int) (hotKey, others []keyedMessage) {
	act := func(oneIn int) string {
		if rng.IntN(oneIn) != 0 {
			return ""
		}
		what := []string{"pause", "retry", "fail", "exhaust"}[rng.IntN(4)]
		stages := []string{"a", "b", "c"}
		if what == "retry" || what == "exhaust" {
			stages = stages[1:]
		}
		return stages[rng.IntN(len(stages))] + ":" + what
	}
	for range hot {
		hotKey = append(hotKey, keyedMessage{"hot", act(50)})
	}
	for k := range 300 {
		for range 1 + rng.IntN(5) {
			others = append(others, keyedMessage{fmt.Sprintf("k%d", k), act(5)})
		}
	}
	for range 800 {
		others = append(others, keyedMessage{"", act(5)})
	}
	rng.Shuffle(len(others), func(i, j int) { others[i], others[j] = others[j], others[i] })
	return hotKey, others
}

func TestOrderPerKeyFromOutside(t *testing.T) {
	t.Parallel()
	hot := hotDefault
	if s := os.Getenv(hotEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of messages", hotEnv, s)
		}
		hot = n
	}
	// The plan is the seed's and the backlog's: a replay needs both.
	t.Logf("the hot key's backlog: %d messages (%s=%d)", hot, hotEnv, hot)
	hotKey, others := keyedPlan(rand.New(rand.NewPCG(testSeed(t), 0)), hot)
	program, err := filepath.Abs("testdata/keyedstage.py")
	if err != nil {
		t.Fatal(err)
	}
	section := func(name, extra string) string {
		return "[stage-" + name + "]\nPROGRAM = " + program + "\nINPUT = message\nPARALLELISM = 4\nQUEUE_LIMIT = 8\n" + extra
	}
	retries := fmt.Sprintf("RETRY_LIMIT = %d\nRETRY_DELAY = 50ms\n", keyedRetryLimit)
	e := newEnv(t, section("a", "")+section("b", retries)+section("c", retries))
	logDir := t.TempDir()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd, out := command(ctx, "-c", e.conf, "-log-format", "json")
	cmd.Env = append(cmd.Env, "KEYCHECK_LOG="+logDir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exit error
	go func() { exit = cmd.Wait(); close(exited) }()
	defer func() {
		cancel() // kills it if the test ends early; its output is whole once it exited
		<-exited
		if t.Failed() {
			t.Logf("pepsi-dispatch output:\n%s", out)
		}
	}()

	// Two producers race the dispatcher: the hot key's, and everyone else's
	// (whose transactions hold many keys' locks at once).
	plan := slices.Concat(hotKey, others)
	produced := make(chan error, 2)
	go func() { produced <- e.insertKeyed(0, hotKey) }()
	go func() { produced <- e.insertKeyed(len(hotKey), others) }()
	for range 2 {
		if err := <-produced; err != nil {
			t.Fatal(err)
		}
	}
	// A bound for a hang, not a speed test: far above the serial hot key's need.
	bound := 5*time.Minute + time.Duration(hot)*30*time.Millisecond
	waitFor(t, bound, fmt.Sprintf("all %d messages finished", len(plan)), func() (bool, string) {
		m, err := e.counts()
		if err != nil {
			return false, err.Error()
		}
		return m["done"]+m["failed"]+m["timeout"] == len(plan), fmtCounts(m)
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if code := exitCode(t, exit); code != 0 {
			t.Fatalf("pepsi-dispatch exited %d after SIGTERM; want 0", code)
		}
	case <-time.After(exitWait):
		t.Fatalf("pepsi-dispatch did not exit within %v of SIGTERM", exitWait)
	}

	f := &findings{t: t, n: map[string]int{}}
	byID := e.keyedRows(plan)
	passes := readKeyedLogs(f, logDir, byID)
	checkKeyedOrder(f, byID, passes)
	checkKeyedOutcomes(f, byID, passes)
	f.summary()
}

// findings reports the first findingsShown violations of each check, then
// how many more: a broken ordering reads as examples, not 20,000 lines.
type findings struct {
	t *testing.T
	n map[string]int
}

const findingsShown = 20

func (f *findings) add(check, format string, args ...any) {
	f.t.Helper()
	if f.n[check]++; f.n[check] <= findingsShown {
		f.t.Errorf(check+": "+format, args...)
	}
}

func (f *findings) summary() {
	f.t.Helper()
	for check, n := range f.n {
		if n > findingsShown {
			f.t.Errorf("%s: %d more", check, n-findingsShown)
		}
	}
}

// insertKeyed inserts msgs, plan numbers from first on, in transactions of
// 100 rows, each row's payload {"n": plan number, "act": …}.
func (e *env) insertKeyed(first int, msgs []keyedMessage) error {
	for lo := 0; lo < len(msgs); lo += 100 {
		var payloads, keys []string
		for i, m := range msgs[lo:min(lo+100, len(msgs))] {
			p, err := json.Marshal(map[string]any{"n": first + lo + i, "act": m.act})
			if err != nil {
				return err
			}
			payloads, keys = append(payloads, string(p)), append(keys, m.key)
		}
		_, err := e.db.Exec(context.Background(), `
			INSERT INTO pepsi.queue (stage, payload, order_key)
			SELECT 'a', convert_to(p, 'UTF8'), nullif(k, '')
			FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(p, k, o) ORDER BY o`, payloads, keys)
		if err != nil {
			return fmt.Errorf("insert plan %d…: %w", first+lo, err)
		}
	}
	return nil
}

// keyedRow is one final row of the scenario, beside its plan.
type keyedRow struct {
	keyedMessage
	id            int64
	status, stage string
}

// keyedRows reads the final rows, each with its plan (by the payload's plan
// number), and fails the test unless every planned message is there once.
func (e *env) keyedRows(plan []keyedMessage) map[int64]*keyedRow {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(),
		`SELECT ingress_id, status, stage, (convert_from(payload, 'UTF8')::jsonb ->> 'n')::int FROM pepsi.queue`)
	if err != nil {
		e.t.Fatal(err)
	}
	byID := map[int64]*keyedRow{}
	seen := make([]int, len(plan))
	var r keyedRow
	var n int
	_, err = pgx.ForEachRow(rows, []any{&r.id, &r.status, &r.stage, &n}, func() error {
		if n < 0 || n >= len(plan) {
			return fmt.Errorf("message %d has plan number %d, out of the plan's %d", r.id, n, len(plan))
		}
		seen[n]++
		r.keyedMessage = plan[n]
		byID[r.id] = &keyedRow{r.keyedMessage, r.id, r.status, r.stage}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	for n, c := range seen {
		if c != 1 {
			e.t.Errorf("planned message %d (key %q) is in the queue %d times; want once", n, plan[n].key, c)
		}
	}
	return byID
}

// keyedPass is one pass of a message through a stage, as its worker logged it.
type keyedPass struct {
	id             int64
	stage          string
	pid            int
	recv, answered int64 // CLOCK_MONOTONIC ns
	code           string
}

func (p keyedPass) String() string {
	return fmt.Sprintf("message %d at %s in worker %d [%d, %d]", p.id, p.stage, p.pid, p.recv, p.answered)
}

// readKeyedLogs reads every worker's log into passes, in the order each
// worker read its lines, and fails the test for a line left unanswered, an
// answer to a line not read, and two messages of a key in one worker's
// pipeline at once (received, and the earlier not yet answered). A worker
// answers in the order it reads, so this needs no clock.
func readKeyedLogs(f *findings, dir string, byID map[int64]*keyedRow) []keyedPass {
	t := f.t
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no stage logs in %s (%v)", dir, err)
	}
	var passes []keyedPass
	deepest := 0 // the most lines a worker held at once: pipelining was exercised
	for _, file := range files {
		stage, pidText, _ := strings.Cut(strings.TrimSuffix(filepath.Base(file), ".log"), "-")
		pid, _ := strconv.Atoi(pidText)
		log, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		var window []keyedPass
		sc := bufio.NewScanner(log)
		for sc.Scan() {
			var ev, code string
			var at, id int64
			if _, err := fmt.Sscan(sc.Text(), &ev, &at, &id, &code); err != nil {
				t.Fatalf("%s: %q: %v", file, sc.Text(), err)
			}
			switch ev {
			case "R":
				p := keyedPass{id: id, stage: stage, pid: pid, recv: at}
				if row := byID[id]; row != nil && row.key != "" {
					for _, q := range window {
						if other := byID[q.id]; other != nil && other.key == row.key {
							f.add("pipelined together", "key %q: %v read while %v was in the same pipeline", row.key, p, q)
						}
					}
				}
				window = append(window, p)
				deepest = max(deepest, len(window))
			case "A":
				if len(window) == 0 || window[0].id != id {
					t.Fatalf("%s: answer to message %d, not the oldest line read (%v)", file, id, window)
				}
				window[0].answered, window[0].code = at, code
				passes = append(passes, window[0])
				window = window[1:]
			}
		}
		log.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		for _, p := range window {
			f.add("unanswered", "%v was never answered", p)
		}
	}
	if deepest < 2 {
		t.Errorf("no worker ever held two lines at once: the pipelining check saw no pipelining")
	}
	t.Logf("%d passes in %d worker logs; a worker held up to %d lines at once", len(passes), len(files), deepest)
	return passes
}

// checkKeyedOrder checks, per key, from the passes' times: no two passes held
// at once anywhere; at each stage its messages pass in ingress_id order; and
// each message's first pass starts after the previous message of its key
// gave its last answer.
func checkKeyedOrder(f *findings, byID map[int64]*keyedRow, passes []keyedPass) {
	t := f.t
	t.Helper()
	byKey := map[string][]keyedPass{}
	for _, p := range passes {
		if row := byID[p.id]; row != nil && row.key != "" {
			byKey[row.key] = append(byKey[row.key], p)
		}
	}
	pairs := 0
	for key, ps := range byKey {
		slices.SortFunc(ps, func(x, y keyedPass) int { return cmp.Compare(x.recv, y.recv) })
		for i := 1; i < len(ps); i++ {
			if ps[i].recv <= ps[i-1].answered {
				f.add("held at once", "key %q: %v read while %v was held", key, ps[i], ps[i-1])
			}
		}
		lastAt := map[string]int64{} // per stage, the last message of the key it saw
		var order []int64            // the key's messages by first pass
		firstRecv, lastAnswer := map[int64]int64{}, map[int64]int64{}
		for _, p := range ps {
			if last, ok := lastAt[p.stage]; ok && p.id < last {
				f.add("out of order at a stage", "key %q: message %d passed %s after message %d", key, p.id, p.stage, last)
			}
			lastAt[p.stage] = max(lastAt[p.stage], p.id)
			if _, ok := firstRecv[p.id]; !ok {
				firstRecv[p.id] = p.recv
				order = append(order, p.id)
			}
			lastAnswer[p.id] = max(lastAnswer[p.id], p.answered)
		}
		if !slices.IsSorted(order) {
			f.add("not oldest first", "key %q: messages started in the order %v", key, order)
		}
		ids := slices.Sorted(maps.Keys(firstRecv))
		for i := 1; i < len(ids); i++ {
			pairs++
			if prev, id := ids[i-1], ids[i]; firstRecv[id] <= lastAnswer[prev] {
				f.add("started before the previous left", "key %q: message %d started (%d) before message %d left the pipeline (%d)",
					key, id, firstRecv[id], prev, lastAnswer[prev])
			}
		}
	}
	if pairs == 0 {
		t.Errorf("no key had two messages: the ordering checks saw nothing to order")
	}
	t.Logf("%d keys, %d pairs of consecutive messages of a key checked", len(byKey), pairs)
}

// checkKeyedOutcomes checks every message ended as planned and passed exactly
// the stages its plan makes it pass: nothing lost, nothing passed twice.
func checkKeyedOutcomes(f *findings, byID map[int64]*keyedRow, passes []keyedPass) {
	f.t.Helper()
	stages := map[int64][]string{}
	for _, p := range passes {
		if byID[p.id] == nil {
			f.add("lost", "%v: no such message in the queue", p)
			continue
		}
		stages[p.id] = append(stages[p.id], p.stage)
	}
	for id, row := range byID {
		status, stage, want := row.outcome()
		got := stages[id]
		// A worker's log is in its own order; passes of a message are in
		// several workers' logs, so compare them in pipeline order.
		slices.Sort(got)
		if row.status != status || status == "failed" && row.stage != stage || !slices.Equal(got, want) {
			f.add("not as planned", "message %d (key %q, plan %q) is %s at %s after passes %v; want %s (at %q) after %v",
				id, row.key, row.act, row.status, row.stage, got, status, stage, want)
		}
	}
}
