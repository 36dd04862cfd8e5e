package store_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

// BenchmarkPipelineStep measures what bounds the dispatcher's hops/s: its
// step transaction, which runs one at a time on one backend. It drives a
// three-stage pipeline (a → b → c → done) through Exec alone, in the steady
// state of pepsi-bench's bench configuration: each step claims up to 64 rows
// per stage and resolves, as answered moves, the rows the step before the
// last one claimed (what one transaction claims is answered while the next
// one runs and resolved by the one after, so each step carries about half of
// the 3 × 2 × 64 messages in flight). In message mode the claim reads each
// row's state and payload, the step builds each row's input line
// (core.MessageLine), and each move carries a patch computed from the message,
// as pepsi-bench's message stage answers. The "+claim" variants write each
// move to stage b or c straight to running there (core.Item.Claim, a move
// that claims, as the dispatcher does when the stage has room): the rows the
// resolve claims join those the claim took, and the hop costs one row version
// instead of two. The "+history" variants record each pass in pepsi.history
// (core.Item.History), as every stage with HISTORY = on does: beside the
// others, what the history costs a hop.
//
// It reports per hop (one resolved item): the wall time of the serial steps
// (ns/hop), the buffers the backend touched (buffers/hop, from
// pg_stat_database on PostgreSQL 15 and later) and, when the server runs on
// this machine, the backend's CPU time (backend-ns/hop). With the backend
// busy all the time, hops/s cannot exceed 1e9 ÷ backend-ns/hop however fast
// the stages are (docs/performance.md).
func BenchmarkPipelineStep(b *testing.B) {
	for _, moveClaims := range []bool{false, true} {
		for _, message := range []bool{false, true} {
			for _, history := range []bool{false, true} {
				name := "answer"
				if message {
					name = "message"
				}
				if moveClaims {
					name += "+claim"
				}
				if history {
					name += "+history"
				}
				b.Run(name, func(b *testing.B) { benchPipeline(b, message, moveClaims, history) })
			}
		}
	}
}

func benchPipeline(b *testing.B, message, moveClaims, history bool) {
	const capEach, refill = 64, 20000
	ctx := context.Background()
	url := pgtest.NewMigrated(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1 // one backend, as the dispatcher's steps run one at a time
	// Generic plans, as pepsi-dispatch's sessions use (shell/dispatch): a
	// custom plan would add the claim's planning to every step.
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	q := store.New(pool, nil)
	fill := func() {
		if _, err := pool.Exec(ctx, fmt.Sprintf(
			"INSERT INTO pepsi.queue (stage, payload) SELECT 'a', convert_to('message ' || g, 'UTF8') FROM generate_series(1, %d) g", refill)); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE pepsi.queue"); err != nil {
			b.Fatal(err)
		}
	}
	fill()
	if _, err := pool.Exec(ctx, "SELECT pepsi.history_keep(now(), now(), now() + interval '1 day', now() - interval '7 days')"); err != nil {
		b.Fatal(err)
	}
	lineMax := 0
	if message {
		lineMax = 4 << 20
	}
	next := map[string]string{"a": "b", "b": "c", "c": core.TargetDone}
	var claimed, answered []core.Row // claimed by the last step, by the one before
	op, hops, pendingA := int64(0), 0, refill
	step := func() {
		var cmds []core.Command
		if len(answered) > 0 {
			items := make([]core.Item, len(answered))
			for i, r := range answered {
				items[i] = core.Item{ID: r.ID, Stage: r.Stage, Verdict: core.Move, To: next[r.Stage]}
				if message {
					items[i].Patch = `{"hops":` + strconv.Itoa(hopsIn(r.Message.State)+1) + `,"len":` + strconv.Itoa(len(r.Message.Payload)) + `}`
				}
				if moveClaims && items[i].To != core.TargetDone {
					items[i].Claim, items[i].LineMax = true, lineMax
				}
				if history {
					now := time.Now()
					items[i].History, items[i].Event, items[i].HandedAt, items[i].At, items[i].PID = true, core.HistoryMoved, now, now, 4242
				}
			}
			op++
			cmds = append(cmds, core.Resolve{Op: op, Items: items})
		}
		caps := make([]core.Cap, 3)
		exclude := make([]int64, 0, len(claimed)+len(answered))
		for i, s := range []string{"a", "b", "c"} {
			caps[i] = core.Cap{Stage: s, N: capEach, LineMax: lineMax}
		}
		for _, r := range append(claimed, answered...) {
			exclude = append(exclude, r.ID)
		}
		op++
		cmds = append(cmds, core.Claim{Op: op, Caps: caps, Exclude: exclude})
		var got []core.Row
		for _, ev := range q.Exec(ctx, cmds) {
			if msg := errText(ev); msg != "" {
				b.Fatalf("step: %s", msg)
			}
			if c, ok := ev.(core.Claimed); ok {
				got = append(got, c.Rows...)
			}
			if r, ok := ev.(core.Resolved); ok {
				for _, o := range r.Outcomes {
					if o.Status == core.StatusRunning {
						got = append(got, core.Row{ID: o.ID, Stage: o.Stage, Attempts: o.Attempts, Message: o.Message})
					}
				}
			}
		}
		for _, r := range got {
			if r.Stage == "a" {
				pendingA--
			}
			if message {
				if _, why := core.MessageLine(r, lineMax); why != "" {
					b.Fatal(why)
				}
			}
		}
		hops += len(answered)
		answered, claimed = claimed, got
	}
	for range 4 { // the pipeline fills: every stage has rows in flight
		step()
	}
	pid, cpuReadable := backendCPU(b, pool)
	buffers0, buffersKnown := blocks(b, pool)
	hops = 0
	var cpu time.Duration
	if cpuReadable {
		cpu = -procCPU(b, pid)
	}
	refilled := false
	b.ResetTimer()
	for b.Loop() {
		if pendingA < 3*capEach {
			b.StopTimer()
			fill()
			pendingA += refill
			refilled = true
			b.StartTimer()
		}
		step()
	}
	b.StopTimer()
	if hops == 0 {
		b.Fatal("no hops resolved")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(hops), "ns/hop")
	if cpuReadable {
		cpu += procCPU(b, pid)
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(hops), "backend-ns/hop")
	}
	if buffersKnown && !refilled {
		// (A refill's insert and vacuum touch buffers too: not counted then.)
		buffers1, _ := blocks(b, pool)
		b.ReportMetric(float64(buffers1-buffers0)/float64(hops), "buffers/hop")
	}
}

// hopsIn reads the "hops" count of a state as PostgreSQL prints it, as the
// bench's message stage would after parsing the message (0 when absent).
func hopsIn(state string) int {
	_, after, ok := strings.Cut(state, `"hops": `)
	if !ok {
		return 0
	}
	end := strings.IndexAny(after, ",}")
	n, _ := strconv.Atoi(after[:max(end, 0)])
	return n
}

// backendCPU returns the pid of pool's one backend and whether its CPU time
// can be read here (the server runs on this machine).
func backendCPU(b *testing.B, pool *pgxpool.Pool) (int, bool) {
	var pid int
	if err := pool.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		b.Fatal(err)
	}
	_, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid))
	return pid, err == nil
}

// procCPU is the user and system time of process pid, from /proc.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// blocks is the database's buffer accesses so far, once the statistics of
// every transaction before are in (PostgreSQL 15 and later), and whether they
// are known.
func blocks(b *testing.B, pool *pgxpool.Pool) (int64, bool) {
	ctx := context.Background()
	var version int
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		b.Fatal(err)
	}
	if version < 150000 {
		return 0, false
	}
	// The backend flushes its statistics when it next waits for a statement,
	// at once when forced (otherwise at most once a second).
	if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		b.Fatal(err)
	}
	var n int64
	if err := pool.QueryRow(ctx, "SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n, true
}
