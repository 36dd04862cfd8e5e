package store_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// this machine, the backend's CPU time (backend-ns/hop); and the hops one
// step resolves (hops/step: three times -pipe.cap once the pipeline is
// full). With the backend busy all the time, hops/s cannot exceed 1e9 ÷
// backend-ns/hop however fast the stages are (docs/performance.md).
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
	benchPipelineWith(b, message, moveClaims, history, noKeys)
}

// Order keys of the pipeline benchmarks' messages: keys above zero is the
// number of keys all the messages share (fillKeyed).
const (
	noKeys  = 0  // messages without keys
	ownKeys = -1 // each message an order key of its own
)

// benchPipelineWith is benchPipeline, its messages with order keys as keys
// says.
func benchPipelineWith(b *testing.B, message, moveClaims, history bool, keys int) {
	const refill = 20000
	ctx := context.Background()
	url := pgtest.NewMigrated(b)
	p := newPipe(b, url, "", message, moveClaims, history)
	p.keyed = keys != noKeys
	fill := func() {
		if p.keyed {
			fillKeyed(b, p.pool, p.stages[0], refill, keys)
		} else {
			fillStage(b, p.pool, p.stages[0], refill)
		}
		if _, err := p.pool.Exec(ctx, "VACUUM ANALYZE pepsi.queue"); err != nil {
			b.Fatal(err)
		}
	}
	fill()
	p.pendingA = refill
	keepHistory(b, p.pool)
	for range 4 { // the pipeline fills: every stage has rows in flight
		p.mustStep(b)
	}
	pid, cpuReadable := backendCPU(b, p.pool)
	buffers0, buffersKnown := blocks(b, p.pool)
	p.hops = 0
	var cpu time.Duration
	if cpuReadable {
		cpu = -procCPU(b, pid)
	}
	refilled := false
	b.ResetTimer()
	for b.Loop() {
		if p.pendingA < 3*pipeCap() {
			b.StopTimer()
			// The refill runs on the measured backend: its CPU is not the
			// steps'.
			var before time.Duration
			if cpuReadable {
				before = procCPU(b, pid)
			}
			fill()
			if cpuReadable {
				cpu -= procCPU(b, pid) - before
			}
			p.pendingA += refill
			refilled = true
			b.StartTimer()
		}
		p.mustStep(b)
	}
	b.StopTimer()
	if p.hops == 0 {
		b.Fatal("no hops resolved")
	}
	b.ReportMetric(float64(p.hops)/float64(b.N), "hops/step")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(p.hops), "ns/hop")
	if cpuReadable {
		cpu += procCPU(b, pid)
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(p.hops), "backend-ns/hop")
	}
	if buffersKnown && !refilled {
		// (A refill's insert and vacuum touch buffers too: not counted then.)
		buffers1, _ := blocks(b, p.pool)
		b.ReportMetric(float64(buffers1-buffers0)/float64(p.hops), "buffers/hop")
	}
}

// BenchmarkPipelineKeyed measures what ordering per key costs a hop on the
// backend (docs/protocol.md, "Ordering per key"): BenchmarkPipelineStep's
// answer+claim steps, the bench configuration's, over messages without keys,
// over the same messages each with an order key of its own, and over them
// sharing 1,000 keys (issue 31's third figure: each message that finishes
// hands its key to the next, pepsi.order_release), one after the other on
// one server. With keys, each step's claim excludes the keys the
// steps hold, each move that claims goes only where no older message of its
// key is unfinished, and the step releases the keys of the messages it
// finishes and asks, for those it moves on without claiming, whether an
// older message of their key is unfinished (core.Release), as the
// dispatcher's step does.
// backend-ns/hop with keys ÷ without is what the keys cost where the backend
// bounds hops/s (issue 31's 100,000 keys: hops/s at ≥ 0.9× of the keyless).
func BenchmarkPipelineKeyed(b *testing.B) {
	for _, c := range []struct {
		name string
		keys int
	}{{"keyless", noKeys}, {"keyed", ownKeys}, {"keys1000", 1000}} {
		b.Run(c.name, func(b *testing.B) { benchPipelineWith(b, false, true, false, c.keys) })
	}
}

// BenchmarkPipelineSessions measures what a second session in flight
// overlaps on the server: S step loops of BenchmarkPipelineStep's kind, each
// on a backend of its own and over three stages of its own (so no two
// sessions' transactions touch one row, as the dispatcher's would not), run
// at once against one database. They share what any sessions of one queue
// share: the table's heap, its indexes' tails (every session's new row
// versions go to the end of the primary key and of queue_running), the WAL
// and the commit. hops/s is all the sessions' hops over the wall time; with
// the server's cores free, S sessions make up to S times one's, and
// backend-ns/hop says what the sharing costs each hop. -benchtime Nx sets
// the steps each session runs (docs/scaling.md, "Two sessions, measured on
// the server").
func BenchmarkPipelineSessions(b *testing.B) {
	for _, message := range []bool{false, true} {
		for _, sessions := range []int{1, 2, 3} {
			name := "answer"
			if message {
				name = "message"
			}
			b.Run(fmt.Sprintf("%s+claim+history/sessions=%d", name, sessions), func(b *testing.B) {
				benchSessions(b, sessions, message)
			})
		}
	}
}

// BenchmarkPipelineParts measures the other way two sessions could share a
// step's work: the step stays one at a time, but runs in parts, each a
// transaction on a session of its own (pipe.exec): first the resolve's
// items cut in as many runs, all at once, then, once they have committed,
// the claim's stages dealt out. Beside BenchmarkPipelineSessions it says
// what keeping one step outstanding costs (docs/scaling.md).
func BenchmarkPipelineParts(b *testing.B) {
	for _, parts := range []int{1, 2} {
		b.Run(fmt.Sprintf("answer+claim+history/parts=%d", parts), func(b *testing.B) {
			url := pgtest.NewMigrated(b)
			p := newPipe(b, url, "", false, true, true)
			p.parts = []*store.Queue{p.q}
			pools := []*pgxpool.Pool{p.pool}
			for range parts - 1 {
				other := newPipe(b, url, "", false, true, true)
				p.parts = append(p.parts, other.q)
				pools = append(pools, other.pool)
			}
			measurePipes(b, []*pipe{p}, pools)
		})
	}
}

func benchSessions(b *testing.B, sessions int, message bool) {
	url := pgtest.NewMigrated(b)
	pipes := make([]*pipe, sessions)
	pools := make([]*pgxpool.Pool, sessions)
	for s := range pipes {
		pipes[s] = newPipe(b, url, strconv.Itoa(s+1), message, true, true)
		pools[s] = pipes[s].pool
	}
	measurePipes(b, pipes, pools)
}

// measurePipes fills each pipe's first stage with enough messages for b.N
// steps (so no refill, and its vacuum, stops another session), runs b.N
// steps of every pipe at once, each on its own goroutine, and reports all
// the pipes' hops per second of wall time and per the CPU time of the
// backends of pools.
func measurePipes(b *testing.B, pipes []*pipe, pools []*pgxpool.Pool) {
	ctx := context.Background()
	for _, p := range pipes {
		p.pendingA = (b.N + 8) * pipeCap() // each step takes up to pipeCap at the first stage
		fillStage(b, p.pool, p.stages[0], p.pendingA)
	}
	if _, err := pools[0].Exec(ctx, "VACUUM ANALYZE pepsi.queue"); err != nil {
		b.Fatal(err)
	}
	keepHistory(b, pools[0])
	for _, p := range pipes {
		for range 4 { // the pipeline fills: every stage has rows in flight
			p.mustStep(b)
		}
		p.hops = 0
	}
	cpu := backendsCPU(b, pools)
	cpu0 := cpu()
	errs := make(chan error, len(pipes))
	b.ResetTimer()
	start := time.Now()
	for _, p := range pipes {
		go func() {
			for range b.N {
				if err := p.step(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range pipes {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	wall := time.Since(start)
	b.StopTimer()
	hops := 0
	for _, p := range pipes {
		hops += p.hops
	}
	if hops == 0 {
		b.Fatal("no hops resolved")
	}
	b.ReportMetric(float64(hops)/wall.Seconds(), "hops/s")
	b.ReportMetric(float64(wall.Nanoseconds())/float64(hops), "ns/hop")
	if cpu0 >= 0 {
		b.ReportMetric(float64((cpu()-cpu0).Nanoseconds())/float64(hops), "backend-ns/hop")
	}
}

// backendsCPU returns a reading of the CPU time the backends of pools (one
// connection each) have used so far, negative when the server does not run
// on this machine.
func backendsCPU(b *testing.B, pools []*pgxpool.Pool) func() time.Duration {
	var pids []int
	for _, pool := range pools {
		pid, ok := backendCPU(b, pool)
		if !ok {
			return func() time.Duration { return -1 }
		}
		pids = append(pids, pid)
	}
	return func() time.Duration {
		var cpu time.Duration
		for _, pid := range pids {
			cpu += procCPU(b, pid)
		}
		return cpu
	}
}

// pipeCapFlag is what one step claims at each stage at most. Its default is
// pepsi-bench's bench configuration: PARALLELISM 2 × QUEUE_LIMIT 64 per
// stage, about half of it answered while each step runs. -pipe.cap 8 is
// about the defaults' (4 × 4, half of it), and smaller caps show what a
// transaction costs whatever it carries (docs/performance.md, "A
// transaction's fixed cost"):
//
//	go test -run '^$' -bench 'BenchmarkPipelineStep/answer\+claim\+history' ./store/ -args -pipe.cap 2
var pipeCapFlag = flag.Int("pipe.cap", 64, "rows a step of the pipeline benchmarks claims per stage at most")

func pipeCap() int { return *pipeCapFlag }

// pipe is one step loop of the benchmarks: three stages a → b → c → done
// (named with a suffix, so several pipes share a database without sharing a
// row) on a backend of its own.
type pipe struct {
	pool                         *pgxpool.Pool
	q                            *store.Queue
	stages                       [3]string
	next                         map[string]string
	message, moveClaims, history bool
	keyed                        bool             // messages with order keys: the step claims, moves and releases as for keys
	settled                      int64            // the highest Claimed.Settled: what the next claim knows (core.Claim.Settled)
	keyOf                        map[int64]string // the key of each row the steps hold, when keyed
	lineMax                      int
	parts                        []*store.Queue // for a step in parts: a session each
	claimed, answered            []core.Row     // claimed by the last step, by the one before
	op                           int64
	hops, pendingA               int
}

func newPipe(b *testing.B, url, suffix string, message, moveClaims, history bool) *pipe {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1 // one backend, as the dispatcher's steps run one at a time
	// The parameters of pepsi-dispatch's sessions: generic plans (a custom
	// plan would add the claim's planning to every step).
	maps.Copy(cfg.ConnConfig.RuntimeParams, store.SessionParams())
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	p := &pipe{pool: pool, q: store.New(pool, nil), message: message, moveClaims: moveClaims, history: history, keyOf: map[int64]string{}}
	p.stages = [3]string{"a" + suffix, "b" + suffix, "c" + suffix}
	p.next = map[string]string{p.stages[0]: p.stages[1], p.stages[1]: p.stages[2], p.stages[2]: core.TargetDone}
	if message {
		p.lineMax = 4 << 20
	}
	return p
}

// fillStage inserts n messages at stage.
func fillStage(b *testing.B, pool *pgxpool.Pool, stage string, n int) {
	if _, err := pool.Exec(context.Background(),
		"INSERT INTO pepsi.queue (stage, payload) SELECT $1, convert_to('message ' || g, 'UTF8') FROM generate_series(1, $2::int) g", stage, n); err != nil {
		b.Fatal(err)
	}
}

// fillKeyed inserts n messages at stage, each with an order key of its own
// (keys ownKeys: the insert trigger takes each key's lock and finds it has no
// unfinished message, as a producer's insert would) or with one of keys keys
// in turn (each key's messages after its first wait blocked).
func fillKeyed(b *testing.B, pool *pgxpool.Pool, stage string, n, keys int) {
	key := "'key-' || clock_timestamp() || '-' || g"
	if keys > 0 {
		key = "'key-' || (g % " + strconv.Itoa(keys) + ")"
	}
	if _, err := pool.Exec(context.Background(),
		"INSERT INTO pepsi.queue (stage, payload, order_key) SELECT $1, convert_to('message ' || g, 'UTF8'), "+key+" FROM generate_series(1, $2::int) g", stage, n); err != nil {
		b.Fatal(err)
	}
}

// keepHistory makes the history's partitions for today, as the dispatcher's
// upkeep does before its first transaction.
func keepHistory(b *testing.B, pool *pgxpool.Pool) {
	if _, err := pool.Exec(context.Background(), "SELECT pepsi.history_keep(now(), now(), now() + interval '1 day', now() - interval '7 days')"); err != nil {
		b.Fatal(err)
	}
}

func (p *pipe) mustStep(b *testing.B) {
	if err := p.step(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// step runs one step transaction: the resolve of what the step before the
// last one claimed, and a claim at every stage.
func (p *pipe) step(ctx context.Context) error {
	var cmds []core.Command
	if len(p.answered) > 0 {
		items := make([]core.Item, len(p.answered))
		for i, r := range p.answered {
			items[i] = core.Item{ID: r.ID, Stage: r.Stage, Verdict: core.Move, To: p.next[r.Stage]}
			if p.message {
				items[i].Patch = `{"hops":` + strconv.Itoa(hopsIn(r.Message.State)+1) + `,"len":` + strconv.Itoa(len(r.Message.Payload)) + `}`
			}
			if p.moveClaims && items[i].To != core.TargetDone {
				items[i].Claim, items[i].LineMax = true, p.lineMax
			}
			if p.keyed {
				items[i].Key = p.keyOf[r.ID]
			}
			if p.history {
				now := time.Now()
				items[i].History, items[i].Event, items[i].HandedAt, items[i].At, items[i].PID = true, core.HistoryMoved, now, now, 4242
			}
		}
		p.op++
		cmds = append(cmds, core.Resolve{Op: p.op, Items: items})
		if p.keyed {
			p.op++
			cmds = append(cmds, p.release(items))
		}
	}
	caps := make([]core.Cap, len(p.stages))
	exclude := make([]int64, 0, len(p.claimed)+len(p.answered))
	for i, s := range p.stages {
		caps[i] = core.Cap{Stage: s, N: pipeCap(), LineMax: p.lineMax}
	}
	for _, r := range append(p.claimed, p.answered...) {
		exclude = append(exclude, r.ID)
	}
	p.op++
	claim := core.Claim{Op: p.op, Caps: caps, Exclude: exclude, Settled: p.settled}
	if p.keyed {
		// The keys of the rows held once this step's resolve has run, as
		// the core's heldKeys: the rows it resolves are not among them.
		for _, r := range p.claimed {
			claim.ExcludeKeys = append(claim.ExcludeKeys, p.keyOf[r.ID])
		}
		slices.Sort(claim.ExcludeKeys)
	}
	cmds = append(cmds, claim)
	var got []core.Row
	for _, ev := range p.exec(ctx, cmds) {
		if msg := errText(ev); msg != "" {
			return fmt.Errorf("step: %s", msg)
		}
		if c, ok := ev.(core.Claimed); ok {
			got = append(got, c.Rows...)
			p.settled = max(p.settled, c.Settled) // as the core keeps it
		}
		if r, ok := ev.(core.Resolved); ok {
			for _, o := range r.Outcomes {
				if o.Status == core.StatusRunning {
					got = append(got, core.Row{ID: o.ID, Stage: o.Stage, Attempts: o.Attempts, Message: o.Message, Key: p.keyOf[o.ID]})
				}
			}
		}
	}
	for _, r := range got {
		if r.Stage == p.stages[0] {
			p.pendingA--
		}
		if p.message {
			if _, why := core.MessageLine(r, p.lineMax); why != "" {
				return fmt.Errorf("message line: %s", why)
			}
		}
	}
	p.hops += len(p.answered)
	if p.keyed {
		for _, r := range p.answered {
			delete(p.keyOf, r.ID)
		}
		for _, r := range got {
			if r.Key == "" {
				return fmt.Errorf("row %d of a keyed pipeline claimed without its key", r.ID)
			}
			p.keyOf[r.ID] = r.Key
		}
	}
	p.answered, p.claimed = p.claimed, got
	return nil
}

// release is the Release a keyed step carries, as the core's releaseFor
// builds it: the keys of the messages the step finishes, and, for those it
// moves on without claiming, whether an older message of their key is
// unfinished (a move that claims asks in its resolve).
func (p *pipe) release(items []core.Item) core.Release {
	r := core.Release{Op: p.op}
	for _, it := range items {
		switch {
		case it.To == core.TargetDone:
			r.Keys = append(r.Keys, it.Key)
		case !it.Claim:
			r.Behind = append(r.Behind, core.KeyAt{Key: it.Key, ID: it.ID})
		}
	}
	slices.Sort(r.Keys)
	return r
}

// exec runs a step's commands: in one transaction, or, with parts, as the
// step in parts would (BenchmarkPipelineParts): the resolve's items cut
// into as many runs as there are parts, each its own transaction on a
// session of its own, all at once; once they have committed, the claim's
// stages dealt out to the parts the same way.
func (p *pipe) exec(ctx context.Context, cmds []core.Command) []core.Event {
	if len(p.parts) < 2 {
		return p.q.Exec(ctx, cmds)
	}
	var evs []core.Event
	for _, cmd := range cmds {
		var split []core.Command
		switch c := cmd.(type) {
		case core.Resolve:
			n := (len(c.Items) + len(p.parts) - 1) / len(p.parts)
			for items := range slices.Chunk(c.Items, max(n, 1)) {
				split = append(split, core.Resolve{Op: c.Op, Items: items})
			}
		case core.Claim:
			for i := range p.parts {
				part := c
				part.Caps = nil
				for j, cp := range c.Caps {
					if j%len(p.parts) == i {
						part.Caps = append(part.Caps, cp)
					}
				}
				if len(part.Caps) > 0 {
					split = append(split, part)
				}
			}
		}
		results := make([][]core.Event, len(split))
		var wg sync.WaitGroup
		for i, part := range split {
			wg.Go(func() { results[i] = p.parts[i].Exec(ctx, []core.Command{part}) })
		}
		wg.Wait()
		for _, r := range results {
			evs = append(evs, r...)
		}
	}
	return evs
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
