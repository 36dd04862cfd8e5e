package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/writelog"
)

// stormParallelism is both stages' PARALLELISM in a kill storm: room for
// several times the rate (each worker passes about 1/passSleep messages a
// second), so that claim latency measures the dispatcher, not a backlog.
const stormParallelism = 6

// stormFeedEvery is how often the storm's feeder inserts rate*stormFeedEvery
// messages in one statement.
const stormFeedEvery = 10 * time.Millisecond

// stormPlan is a kill storm: a quiet phase, then one with kills.
type stormPlan struct {
	phase time.Duration
	rate  int
	every time.Duration
	lock  bool // kill the lock's session too
}

// phaseResult is one phase's claim latencies: from a message's insert (its
// created_at) to its first claim (the write log's pending -> running at stage
// a), both the server's clock.
type phaseResult struct {
	name          string
	begin, end    time.Time
	n             int
	p50, p99, max time.Duration
	kills         int
}

// runStorm runs the kill storm: the same pipeline fed at plan.rate for
// plan.phase without kills, then as long with every session of the active
// dispatcher (but its lock's, unless plan.lock) ended every plan.every. At the
// end, nothing may be lost or stuck, no worker may have written a row its
// dispatcher did not hold, and no stage may have run a message twice (but
// after a takeover, which only plan.lock causes).
func (c *chaos) runStorm(plan stormPlan) (int, error) {
	ctx := context.Background()
	cleanup, err := c.setup(ctx)
	defer cleanup()
	if err != nil {
		return exitSetup, err
	}
	c.runs = filepath.Join(c.dir, "runs")
	for range 2 {
		if _, err := c.startDispatcher(); err != nil {
			return exitSetup, err
		}
	}
	if err := c.awaitStandby(30 * time.Second); err != nil {
		return exitSetup, err
	}
	var results []phaseResult
	for _, killing := range []bool{false, true} {
		r, err := c.stormPhase(ctx, plan, killing)
		if err != nil {
			return exitBroken, err
		}
		results = append(results, r)
	}
	code, err := c.finish(ctx)
	if err != nil {
		return code, err
	}
	// finish accepts failed messages (a worker kill fails its head); the storm
	// kills no worker, so a failed message was lost to the storm.
	var failed int
	if err := c.db.QueryRow(ctx, `SELECT count(*) FROM pepsi.queue WHERE status <> 'done'`).Scan(&failed); err != nil {
		return exitBroken, err
	}
	if failed > 0 {
		fmt.Fprintf(c.out, "BROKEN: %d messages did not end done\n", failed)
		code = exitBroken
	}
	for i := range results {
		if err := c.latencies(ctx, &results[i]); err != nil {
			return exitBroken, err
		}
	}
	fmt.Fprintf(c.out, "\n%-40s %6s %7s %9s %9s %9s\n", "claim latency (insert -> first claim)", "kills", "n", "p50", "p99", "max")
	for _, r := range results {
		fmt.Fprintf(c.out, "%-40s %6d %7d %9s %9s %9s\n", r.name, r.kills, r.n, ms(r.p50), ms(r.p99), ms(r.max))
	}
	return c.reportRuns(plan, code)
}

// reportRuns prints what the dispatchers sent beside other transactions and
// the messages a stage ran more than once, and returns code, or exitBroken
// for a message run twice where nothing allows it (a run again after a
// takeover is allowed with plan.lock).
func (c *chaos) reportRuns(plan stormPlan, code int) (int, error) {
	ctx := context.Background()
	twice, oneWorker, err := runTwice(c.runs)
	if err != nil {
		return exitBroken, err
	}
	beside, err := besideSent(c.dir)
	if err != nil {
		return exitBroken, err
	}
	// The dispatchers' own count, so a run at SESSIONS above 1 shows that
	// the kills fell on transactions in flight beside one another.
	fmt.Fprintf(c.out, "transactions sent beside others: %d\n", beside)
	if plan.lock {
		// A lost lock is a takeover: the next holder resets what the old
		// one's workers held and runs it again (at-least-once,
		// docs/durability.md, "The lock's session"), so a second run is no
		// fault here; the ownership check above still fails a worker that
		// wrote a row its dispatcher no longer held.
		fmt.Fprintf(c.out, "messages a stage ran again after a takeover (allowed with -kill-lock): %d\n", len(twice))
		fmt.Fprintf(c.out, "messages one worker ran more than once: %d\n", len(oneWorker))
		if len(oneWorker) == 0 {
			return code, nil
		}
		twice = oneWorker // no takeover between: broken
	}
	if !plan.lock {
		fmt.Fprintf(c.out, "messages a stage ran more than once: %d\n", len(twice))
	}
	if len(twice) > 0 {
		code = exitBroken
		writes, err := writelog.Read(ctx, c.db, 0)
		if err != nil {
			return code, err
		}
		for _, id := range twice[:min(len(twice), 5)] {
			fmt.Fprintf(c.out, "BROKEN: message %d was handled twice:\n", id)
			for _, w := range writes {
				if w.ID == id {
					fmt.Fprintf(c.out, "  %s\n", w)
				}
			}
		}
	}
	return code, nil
}

// stormPhase feeds plan.rate messages a second for plan.phase, killing if
// killing, and names the phase by the server's clock at its start and end.
func (c *chaos) stormPhase(ctx context.Context, plan stormPlan, killing bool) (phaseResult, error) {
	r := phaseResult{name: "without kills"}
	if killing {
		r.name = fmt.Sprintf("sessions ended every %v", plan.every)
	}
	var begin time.Time
	if err := c.db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&begin); err != nil {
		return r, err
	}
	pctx, stop := context.WithTimeout(ctx, plan.phase)
	defer stop()
	kills := make(chan int, 1)
	if killing {
		go func() { kills <- c.killLoop(pctx, plan) }()
	} else {
		kills <- 0
	}
	per := max(1, plan.rate*int(stormFeedEvery)/int(time.Second))
	t := time.NewTicker(stormFeedEvery)
	for pctx.Err() == nil {
		select {
		case <-pctx.Done():
		case <-t.C:
			if err := c.insert(pctx, per); err != nil && pctx.Err() == nil {
				c.log.Warn("storm: insert failed", "err", err)
			}
		}
	}
	t.Stop()
	r.kills = <-kills
	if err := c.db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&r.end); err != nil {
		return r, err
	}
	r.begin = begin
	return r, nil
}

// killLoop ends the active dispatcher's sessions every plan.every until ctx
// ends, and returns how many sessions it ended.
func (c *chaos) killLoop(ctx context.Context, plan stormPlan) int {
	t := time.NewTicker(plan.every)
	defer t.Stop()
	total := 0
	for {
		select {
		case <-ctx.Done():
			return total
		case <-t.C:
		}
		holder, _, err := c.lockState(ctx)
		if err != nil || holder == "" {
			continue
		}
		var n int
		err = c.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid))
			FROM pg_stat_activity a
			WHERE (a.application_name = $1 OR a.application_name LIKE $1 || ' %')
			  AND ($2 OR a.pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
			      AND classid = 1885696115 AND objid = 1684632432 AND objsubid = 1))`, holder, plan.lock).Scan(&n)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("storm: kill failed", "err", err)
			}
			continue
		}
		c.log.Info("storm: ended sessions", "dispatcher", holder, "sessions", n)
		total += n
	}
}

// latencies fills in r's claim latencies, once the queue has drained.
func (c *chaos) latencies(ctx context.Context, r *phaseResult) error {
	var p50, p99, mx float64
	err := c.db.QueryRow(ctx, `
		SELECT count(*), coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY l), 0),
		       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY l), 0), coalesce(max(l), 0)
		FROM (SELECT extract(epoch FROM min(w.at) - q.created_at)::float8 AS l
		      FROM pepsi.queue q JOIN public.queue_writes w ON w.ingress_id = q.ingress_id
		      WHERE q.created_at >= $1 AND q.created_at < $2
		        AND w.old_status = 'pending' AND w.new_status = 'running' AND w.old_stage = 'a'
		      GROUP BY q.ingress_id, q.created_at) x`, r.begin, r.end).Scan(&r.n, &p50, &p99, &mx)
	if err != nil {
		return fmt.Errorf("claim latencies: %w", err)
	}
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	r.p50, r.p99, r.max = sec(p50), sec(p99), sec(mx)
	return nil
}

// runTwice lists the messages that the record at path says a stage ran more
// than once, in id order, and those of them one worker process ran more than
// once (oneWorker), which no takeover explains.
func runTwice(path string) (twice, oneWorker []int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("stage runs: %w", err)
	}
	defer f.Close()
	type run struct {
		id    int64
		stage string
	}
	seen := map[run]int{}
	byWorker := map[run]map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r run
		var worker string
		if _, err := fmt.Sscan(sc.Text(), &r.id, &r.stage, &worker); err != nil {
			return nil, nil, fmt.Errorf("stage runs: %q: %w", sc.Text(), err)
		}
		seen[r]++
		if byWorker[r] == nil {
			byWorker[r] = map[string]int{}
		}
		byWorker[r][worker]++
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("stage runs: %w", err)
	}
	for r, n := range seen {
		if n > 1 && !slices.Contains(twice, r.id) {
			twice = append(twice, r.id)
		}
		for _, k := range byWorker[r] {
			if k > 1 && !slices.Contains(oneWorker, r.id) {
				oneWorker = append(oneWorker, r.id)
			}
		}
	}
	slices.Sort(twice)
	slices.Sort(oneWorker)
	return twice, oneWorker, nil
}

// besideSent sums what the dispatchers' logs in dir say they sent beside
// other transactions: the "beside" of each "queue transactions" summary,
// logged as a dispatcher session ends.
func besideSent(dir string) (int, error) {
	logs, err := filepath.Glob(filepath.Join(dir, "dispatch-*.log"))
	if err != nil {
		return 0, err
	}
	total := 0
	for _, name := range logs {
		f, err := os.Open(name)
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
		for sc.Scan() {
			var line struct {
				Msg    string `json:"msg"`
				Beside int    `json:"beside"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "queue transactions" {
				total += line.Beside
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", name, err)
		}
	}
	return total, nil
}
