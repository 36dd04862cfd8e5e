// Command pepsi-chaos runs a real pipeline (pepsi-dispatch, an active and a
// standby, with two stages served by this program itself) on a private
// PostgreSQL behind a netfault proxy, injects a seeded sequence of faults while
// messages flow, and prints how long recovery took:
//
//	worker SIGKILL        -> its head-of-line message failed
//	dispatcher SIGKILL    -> the standby's first claim
//	PostgreSQL restart    -> throughput back to half its earlier rate
//	                         (from when the server accepts connections again)
//	healed black hole     -> the first stage pass finished afterwards
//
// Times come from a write log (internal/testenv/writelog: a trigger stamping every queue
// write with clock_timestamp()), so they are the server's own. At the end
// every message must be done or failed (failed only by a worker kill), and no
// worker may have written a message its dispatcher did not hold; otherwise it
// exits 1. The recovery targets are reported, never asserted: timings on a
// shared machine are data, not verdicts.
//
//	pepsi-chaos [-seed N] [-samples 5] [-blackhole 30s] [-sessions N] [-dispatch PATH]
//
// -sessions sets the dispatchers' [pepsi-dispatch] SESSIONS (their
// transactions in flight at once, each on a session of its own); 0, the
// fault table's default, draws it from the seed, 1 to 3, so that most
// seeds' faults also fall on transactions in flight beside one another.
//
// With -storm D it runs the kill storm instead (storm.go): D at -rate
// messages a second, then D more while every session of the active
// dispatcher but its lock's (-kill-lock: that one too) is ended
// (pg_terminate_backend) every -kill-every, and prints both phases' claim
// latencies (insert to first claim); every message must end done, none may be
// run twice by a stage (with -kill-lock every kill is a takeover, whose next
// holder runs again what the last one's workers held: those are counted, not
// failed), and the ownership check holds as above.
//
//	pepsi-chaos -storm 60s [-rate 600] [-kill-every 500ms] [-kill-lock] [-sessions N]
//
// Started as "pepsi-chaos worker -c FILE" it is the stage program: stage a
// sleeps, then advances to b; b sleeps, then is done.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/netfault"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/privatepg"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/writelog"
	"github.com/pepsi-pipeline/pepsi/stage"
	"github.com/pepsi-pipeline/pepsi/tools/internal/dispatchproc"
)

// Exit codes.
const (
	exitOK     = 0
	exitBroken = 1 // a message was lost, stuck or written by two dispatchers' workers
	exitUsage  = 2
	exitSetup  = 4 // the run could not be set up (no PostgreSQL programs, no pepsi-dispatch)
)

// The load: feedBatch messages every feedEvery, each sleeping passSleep per stage.
const (
	feedBatch = 5
	feedEvery = 100 * time.Millisecond
	passSleep = 5 * time.Millisecond
	burstSize = 400 // inserted before a worker kill, so every worker has a head
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		stageMain()
		return
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// runsEnv names the file each stage run is appended to ("ID STAGE WORKER"
// lines, WORKER a token of the worker process), so that the kill storm can
// count messages a stage ran twice, and those one worker ran twice.
const runsEnv = "PEPSI_CHAOS_RUNS"

// stageMain serves stages a and b.
func stageMain() {
	var runs *os.File
	if path := os.Getenv(runsEnv); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pepsi-chaos worker: %v\n", err)
			os.Exit(1)
		}
		runs = f
	}
	// Unlike its pid, which the kernel hands out again, this names one
	// worker process of the run.
	worker := fmt.Sprintf("%d.%d", os.Getpid(), time.Now().UnixNano())
	work := func(next string) stage.Handler {
		return func(ctx context.Context, m *stage.Message) stage.Result {
			if runs != nil {
				// One write per line, O_APPEND: lines of several workers never
				// mix. worker tells the runs of one worker process apart: a
				// takeover kills every worker, so one that runs a message
				// twice ran it twice with no takeover between.
				if _, err := fmt.Fprintf(runs, "%d %s %s\n", m.ID, m.Stage, worker); err != nil {
					return stage.Failed(fmt.Sprintf("record the run: %v", err))
				}
			}
			time.Sleep(passSleep)
			if next == "" {
				return stage.Done()
			}
			return stage.Advance(next)
		}
	}
	stage.Main(map[string]stage.Handler{"a": work("b"), "b": work("")})
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pepsi-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		seed      = fs.Uint64("seed", uint64(time.Now().UnixNano()), "the seed that chooses the fault sequence")
		samples   = fs.Int("samples", 5, "samples of each fault (black holes: samples/2, at least 1)")
		blackhole = fs.Duration("blackhole", 30*time.Second, "how long each black hole lasts")
		dispatchB = fs.String("dispatch", "", "the pepsi-dispatch binary (default: beside this one, else on PATH)")
		verbose   = fs.Bool("v", false, "log each step")
		keep      = fs.Bool("keep", false, "keep the run's directory (configurations, dispatcher logs) and print its name")
		storm     = fs.Duration("storm", 0, "instead of the fault table: two phases this long at -rate, without and then with backend kills of the active dispatcher's sessions every -kill-every, and their claim latencies")
		rate      = fs.Int("rate", 600, "-storm: messages inserted per second")
		killEvery = fs.Duration("kill-every", 500*time.Millisecond, "-storm: the pause between two kills")
		killLock  = fs.Bool("kill-lock", false, "-storm: kill the dispatcher lock's session too (every kill is then a takeover by the standby)")
		sessions  = fs.Int("sessions", 0, "SESSIONS of the dispatchers; 0: drawn from the seed, 1 to 3 (-storm: 1)")
	)
	if _, err := cliflags.Parse(fs, args, ""); err != nil {
		return cliflags.Fail(stderr, "pepsi-chaos", err)
	}
	if *storm < 0 || *rate < 1 || *killEvery <= 0 {
		fmt.Fprintln(stderr, "pepsi-chaos: -storm, -rate and -kill-every must be positive")
		return exitUsage
	}
	if *sessions < 0 || *sessions > conf.SessionsMax {
		fmt.Fprintf(stderr, "pepsi-chaos: -sessions must be 0 (drawn from the seed) or 1 to %d\n", conf.SessionsMax)
		return exitUsage
	}
	if *samples < 1 {
		fmt.Fprintln(stderr, "pepsi-chaos: -samples must be at least 1")
		return exitUsage
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "pepsi-chaos: %v\n", err)
		return exitSetup
	}
	bin, err := dispatchproc.Find(*dispatchB)
	if err != nil {
		fmt.Fprintf(stderr, "pepsi-chaos: %v\n", err)
		return exitSetup
	}
	c := &chaos{log: log, out: stdout, self: self, dispatchBin: bin, rng: rand.New(rand.NewPCG(*seed, 0)), blackhole: *blackhole, keep: *keep, parallelism: 2}
	var code int
	if *storm > 0 {
		c.sessions = max(*sessions, 1)
		fmt.Fprintf(stdout, "pepsi-chaos kill storm: two phases of %v at %d messages/s, the second with the active dispatcher's sessions (lock's too: %v) ended every %v; SESSIONS = %d\n",
			*storm, *rate, *killLock, *killEvery, c.sessions)
		c.parallelism = stormParallelism
		code, err = c.runStorm(stormPlan{phase: *storm, rate: *rate, every: *killEvery, lock: *killLock})
	} else {
		// From a stream of its own: a seed plays the faults it played
		// before SESSIONS was drawn, with -sessions or without.
		c.sessions = 1 + rand.New(rand.NewPCG(*seed, 1)).IntN(3)
		if *sessions > 0 {
			c.sessions = *sessions
		}
		fmt.Fprintf(stdout, "pepsi-chaos seed %d, SESSIONS = %d (replay: pepsi-chaos -seed %d -samples %d -blackhole %v -sessions %d)\n",
			*seed, c.sessions, *seed, *samples, *blackhole, c.sessions)
		code, err = c.run(*samples)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pepsi-chaos: %v\n", err)
	}
	return code
}

// chaos is one run.
type chaos struct {
	log         *slog.Logger
	out         io.Writer
	self        string
	dispatchBin string
	rng         *rand.Rand
	blackhole   time.Duration
	keep        bool
	parallelism int    // PARALLELISM of both stages
	sessions    int    // SESSIONS of every dispatcher
	runs        string // the stage runs' record (runsEnv), if kept

	pg    *privatepg.Server
	proxy *netfault.Proxy
	db    *pgxpool.Pool // direct, for the feeder and the measurements
	dir   string

	mu          sync.Mutex
	dispatchers []*dispatcher
	generation  int
	inserted    int
	firstSeen   map[int]time.Time // worker pid -> when first seen
}

// dispatcher is one pepsi-dispatch process, always started with -standby: the
// first takes the lock at once, the others wait for it, and one that lost it
// waits again instead of exiting.
type dispatcher struct {
	*dispatchproc.Process
	name    string // its workers' application_name
	app     string // its own sessions' application_name
	started time.Time
}

// fault kinds, in table order.
const (
	faultWorkerKill = iota
	faultStandbyTakeover
	faultPGRestart
	faultBlackHole
)

var faultNames = []string{
	"head-of-line fail after worker SIGKILL",
	"standby takeover: dispatcher SIGKILL -> first claim",
	"throughput back to half after PostgreSQL accepts",
	"resumption after a healed black hole",
}

var faultTargets = []time.Duration{20 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, 5 * time.Second}

// setup starts the private PostgreSQL (with the write log) and the proxy, and
// makes the run's directory; the function it returns undoes it all.
func (c *chaos) setup(ctx context.Context) (func(), error) {
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	var err error
	if c.pg, err = privatepg.Start(); err != nil {
		return cleanup, err
	}
	undo = append(undo, func() { _ = c.pg.Stop() })
	if err := c.pg.Migrate(ctx); err != nil {
		return cleanup, err
	}
	if c.db, err = pgxpool.New(ctx, c.pg.URL()); err != nil {
		return cleanup, err
	}
	undo = append(undo, c.db.Close)
	if err := writelog.Install(ctx, c.db); err != nil {
		return cleanup, err
	}
	if c.proxy, err = netfault.Start(fmt.Sprintf("127.0.0.1:%d", c.pg.Port())); err != nil {
		return cleanup, err
	}
	undo = append(undo, func() { _ = c.proxy.Close() })
	if c.dir, err = os.MkdirTemp("", "pepsi-chaos-"); err != nil {
		return cleanup, err
	}
	if c.keep {
		fmt.Fprintf(c.out, "run directory: %s\n", c.dir)
	} else {
		undo = append(undo, func() { os.RemoveAll(c.dir) })
	}
	c.firstSeen = map[int]time.Time{}
	undo = append(undo, c.stopAll)
	return cleanup, nil
}

func (c *chaos) run(samples int) (int, error) {
	ctx := context.Background()
	cleanup, err := c.setup(ctx)
	defer cleanup()
	if err != nil {
		return exitSetup, err
	}
	for range 2 {
		if _, err := c.startDispatcher(); err != nil {
			return exitSetup, err
		}
	}
	if err := c.awaitStandby(30 * time.Second); err != nil {
		return exitSetup, err
	}
	feedCtx, stopFeed := context.WithCancel(ctx)
	fed := make(chan struct{})
	go func() { defer close(fed); c.feed(feedCtx) }()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go c.watchWorkers(watchCtx)

	plan := c.plan(samples)
	fmt.Fprintf(c.out, "faults in order: %s\n", planString(plan))

	results := make([][]time.Duration, len(faultNames))
	skipped := make([]int, len(faultNames))
	if err := c.awaitProgress(30*time.Second, 100); err != nil {
		stopFeed()
		return exitBroken, err
	}
	for i, f := range plan {
		time.Sleep(time.Duration(500+c.rng.IntN(1500)) * time.Millisecond) // settle
		d, err := c.inject(ctx, f)
		if err != nil {
			skipped[f]++
			fmt.Fprintf(c.out, "fault %d/%d %s: no measurement: %v\n", i+1, len(plan), faultNames[f], err)
		} else {
			results[f] = append(results[f], d)
			c.log.Info("fault measured", "fault", faultNames[f], "took", d)
		}
		if err := c.awaitStandby(60 * time.Second); err != nil {
			stopFeed()
			return exitBroken, fmt.Errorf("after fault %d (%s): %w", i+1, faultNames[f], err)
		}
	}
	stopFeed()
	<-fed
	printTable(c.out, results, skipped, c.blackhole)
	return c.finish(ctx)
}

// plan is the faults of the run in a random order: samples of each of the
// first three, and half as many black holes (at least one).
func (c *chaos) plan(samples int) []int {
	var plan []int
	for f := faultWorkerKill; f <= faultPGRestart; f++ {
		for range samples {
			plan = append(plan, f)
		}
	}
	for range max(1, samples/2) {
		plan = append(plan, faultBlackHole)
	}
	c.rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	return plan
}

// inject causes fault f and measures the pipeline's recovery from it.
func (c *chaos) inject(ctx context.Context, f int) (time.Duration, error) {
	switch f {
	case faultWorkerKill:
		return c.workerKill(ctx)
	case faultStandbyTakeover:
		return c.standbyTakeover(ctx)
	case faultPGRestart:
		return c.pgRestart(ctx)
	case faultBlackHole:
		return c.blackHole(ctx)
	}
	return 0, nil
}

func planString(plan []int) string {
	short := []string{"worker-kill", "standby-takeover", "pg-restart", "black-hole"}
	parts := make([]string, len(plan))
	for i, f := range plan {
		parts[i] = short[f]
	}
	return strings.Join(parts, " ")
}

// startDispatcher starts a pepsi-dispatch -standby with a configuration of
// its own, whose workers carry the application_name worker-N.
func (c *chaos) startDispatcher() (*dispatcher, error) {
	c.mu.Lock()
	c.generation++
	n := c.generation
	c.mu.Unlock()
	name := fmt.Sprintf("worker-%d", n)
	viaProxy := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", c.proxy.Addr())
	conf := filepath.Join(c.dir, fmt.Sprintf("pepsi-%d.conf", n))
	text := fmt.Sprintf(`[pepsi]
DATABASE = %s&application_name=%s
[pepsi-dispatch]
POLL_INTERVAL = 2
STATS_INTERVAL = 5
WORKER_IDLE_TIMEOUT = 300
SESSIONS = %d
[stage-a]
PROGRAM = %s
PARALLELISM = %d
QUEUE_LIMIT = 4
[stage-b]
PROGRAM = %s
PARALLELISM = %d
QUEUE_LIMIT = 4
`, viaProxy, name, c.sessions, c.self, c.parallelism, c.self, c.parallelism)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return nil, err
	}
	var env []string
	if c.runs != "" {
		env = append(env, runsEnv+"="+c.runs)
	}
	// PG* variables of ours must not reach the dispatcher: every one of its
	// connections goes through the proxy.
	p, err := dispatchproc.Start(dispatchproc.Config{Binary: c.dispatchBin, Conf: conf,
		Args: []string{"-database", viaProxy, "-standby", "-log-format", "json"},
		Log:  filepath.Join(c.dir, fmt.Sprintf("dispatch-%d.log", n)), Env: env, Drop: []string{"PG"}})
	if err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	d := &dispatcher{Process: p, name: name, app: fmt.Sprintf("pepsi-dispatch %s %d", host, p.Pid()), started: time.Now()}
	c.mu.Lock()
	c.dispatchers = append(c.dispatchers, d)
	c.mu.Unlock()
	c.log.Info("started pepsi-dispatch", "pid", p.Pid(), "workers", name)
	return d, nil
}

// alive returns the dispatchers still running.
func (c *chaos) alive() []*dispatcher {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*dispatcher
	for _, d := range c.dispatchers {
		select {
		case <-d.Done():
		default:
			out = append(out, d)
		}
	}
	return out
}

// lockState says which session holds the dispatcher lock (its
// application_name) and how many wait for it.
func (c *chaos) lockState(ctx context.Context) (holder string, waiters int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = c.db.QueryRow(ctx, `SELECT coalesce(max(a.application_name) FILTER (WHERE l.granted), ''),
			count(*) FILTER (WHERE NOT l.granted)
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.classid = 1885696115 AND l.objid = 1684632432 AND l.objsubid = 1`).Scan(&holder, &waiters)
	return holder, waiters, err
}

// active returns the dispatcher holding the lock.
func (c *chaos) active(ctx context.Context) (*dispatcher, error) {
	holder, _, err := c.lockState(ctx)
	if err != nil {
		return nil, err
	}
	for _, d := range c.alive() {
		if d.app == holder {
			return d, nil
		}
	}
	return nil, fmt.Errorf("the lock is held by %q, none of the running dispatchers", holder)
}

// awaitStandby waits until one running dispatcher holds the lock and another
// waits for it in the server, starting a new standby if only one runs.
func (c *chaos) awaitStandby(timeout time.Duration) error {
	ctx := context.Background()
	if len(c.alive()) < 2 {
		if _, err := c.startDispatcher(); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		holder, waiters, err := c.lockState(ctx)
		if err == nil && waiters >= 1 {
			if _, aerr := c.active(ctx); aerr == nil {
				return nil
			}
		}
		last = fmt.Sprintf("holder %q, %d waiting, err %v", holder, waiters, err)
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no active dispatcher with a standby waiting within %v (%s)", timeout, last)
}

// feed inserts feedBatch messages every feedEvery until ctx ends, directly
// (not through the proxy). Failed inserts (PostgreSQL restarting) are dropped:
// they never became messages.
func (c *chaos) feed(ctx context.Context) {
	t := time.NewTicker(feedEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.insert(ctx, feedBatch); err != nil {
			c.log.Info("feed: insert failed", "err", err)
		}
	}
}

func (c *chaos) insert(ctx context.Context, n int) error {
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tag, err := c.db.Exec(ictx, `INSERT INTO pepsi.queue (stage, payload) SELECT 'a', 'chaos' FROM generate_series(1, $1)`, n)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.inserted += int(tag.RowsAffected())
	c.mu.Unlock()
	return nil
}

// watchWorkers notes when each child process of each dispatcher is first seen,
// so a worker kill can pick one that has answered (a worker that dies before
// its first answer is a failed start: its ids are requeued, not failed).
func (c *chaos) watchWorkers(ctx context.Context) {
	for ctx.Err() == nil {
		now := time.Now()
		for _, d := range c.alive() {
			for _, pid := range children(d.Pid()) {
				c.mu.Lock()
				if _, ok := c.firstSeen[pid]; !ok {
					c.firstSeen[pid] = now
				}
				c.mu.Unlock()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')') // the command may hold spaces
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	sort.Ints(out)
	return out
}

// lastSeq is the write log's newest entry.
func (c *chaos) lastSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := c.db.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM public.queue_writes`).Scan(&seq)
	return seq, err
}

// settleWrites is how long a measurement waits, once it has found a match,
// for writes of transactions that committed later but ran earlier (the log's
// seq is taken when a write runs, not when it commits).
const settleWrites = 200 * time.Millisecond

// awaitWrite polls the write log after seq until a write matches, then returns
// the earliest matching write (by its time) once late commits have settled.
func (c *chaos) awaitWrite(ctx context.Context, seq int64, timeout time.Duration, what string, match func(writelog.Write) bool) (writelog.Write, error) {
	deadline := time.Now().Add(timeout)
	var found bool
	for time.Now().Before(deadline) {
		ws, err := writelog.Read(ctx, c.db, seq)
		if err == nil {
			var best writelog.Write
			ok := false
			for _, w := range ws {
				if match(w) && (!ok || w.At.Before(best.At)) {
					best, ok = w, true
				}
			}
			if ok && found {
				return best, nil
			}
			if ok {
				found = true
				time.Sleep(settleWrites)
				continue
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return writelog.Write{}, fmt.Errorf("no %s within %v", what, timeout)
}

// awaitProgress waits until n more messages have finished.
func (c *chaos) awaitProgress(timeout time.Duration, n int) error {
	ctx := context.Background()
	seq, err := c.lastSeq(ctx)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var done int
		err := c.db.QueryRow(ctx, `SELECT count(*) FROM public.queue_writes WHERE seq > $1 AND new_status = 'done'`, seq).Scan(&done)
		if err == nil && done >= n {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("fewer than %d messages finished within %v", n, timeout)
}

// workerKill SIGKILLs a worker of the active dispatcher that has been running a
// while, during a burst (so it likely holds a head), and measures until its
// dispatcher fails a message. A worker that held nothing fails nothing: then
// another is tried, up to killAttempts.
func (c *chaos) workerKill(ctx context.Context) (time.Duration, error) {
	const killAttempts = 3
	d, err := c.active(ctx)
	if err != nil {
		return 0, err
	}
	for attempt := 1; ; attempt++ {
		// A worker younger than the dispatcher's 5 s start-up window that dies
		// counts as a failed start (ids requeued, nothing failed): pick an older one.
		var victims []int
		for wait := time.Now().Add(10 * time.Second); len(victims) == 0; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(wait) {
				return 0, errors.New("no worker has run long enough to count as started")
			}
			c.mu.Lock()
			for _, pid := range children(d.Pid()) {
				if seen, ok := c.firstSeen[pid]; ok && time.Since(seen) > 6*time.Second {
					victims = append(victims, pid)
				}
			}
			c.mu.Unlock()
		}
		if err := c.insert(ctx, burstSize); err != nil {
			return 0, err
		}
		time.Sleep(500 * time.Millisecond)
		victim := victims[c.rng.IntN(len(victims))]
		seq, err := c.lastSeq(ctx)
		if err != nil {
			return 0, err
		}
		killed := time.Now()
		c.log.Info("killing worker", "pid", victim, "dispatcher", d.Pid())
		if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
			return 0, fmt.Errorf("kill worker %d: %w", victim, err)
		}
		w, err := c.awaitWrite(ctx, seq, 2*time.Second, "message failed by the dispatcher", func(w writelog.Write) bool {
			return w.App == d.app && w.NewStatus == "failed" && w.At.After(killed)
		})
		if err == nil {
			return w.At.Sub(killed), nil
		}
		if attempt == killAttempts {
			return 0, fmt.Errorf("%d workers killed, none held a message: %w", attempt, err)
		}
	}
}

// standbyTakeover SIGKILLs the active dispatcher while a standby waits, and
// measures until the standby's first claim.
func (c *chaos) standbyTakeover(ctx context.Context) (time.Duration, error) {
	old, err := c.active(ctx)
	if err != nil {
		return 0, err
	}
	seq, err := c.lastSeq(ctx)
	if err != nil {
		return 0, err
	}
	killed := time.Now()
	if err := old.Cmd.Process.Kill(); err != nil {
		return 0, err
	}
	w, err := c.awaitWrite(ctx, seq, 10*time.Second, "claim by the standby", func(w writelog.Write) bool {
		return w.App != old.app && strings.HasPrefix(w.App, "pepsi-dispatch ") &&
			w.OldStatus == "pending" && w.NewStatus == "running" && w.At.After(killed)
	})
	<-old.Done()
	if err != nil {
		return 0, err
	}
	return w.At.Sub(killed), nil
}

// pgRestart crash-restarts PostgreSQL and measures from when it accepts
// connections until a quarter-second window holds half the finishes of an
// average quarter second before the restart.
func (c *chaos) pgRestart(ctx context.Context) (time.Duration, error) {
	const window = 250 * time.Millisecond
	// Let a burst of an earlier fault drain, so the earlier rate is the
	// feed's: a black hole's backlog can take longer than 3 s to drain, and
	// its drain, counted as the earlier rate, asked the feed alone for more
	// than the feed brings.
	if err := c.awaitDrained(ctx, 60*time.Second); err != nil {
		return 0, err
	}
	time.Sleep(3 * time.Second)
	var before int
	err := c.db.QueryRow(ctx, `SELECT count(*) FROM public.queue_writes
		WHERE new_status = 'done' AND at > clock_timestamp() - interval '2 seconds'`).Scan(&before)
	if err != nil {
		return 0, err
	}
	seq, err := c.lastSeq(ctx)
	if err != nil {
		return 0, err
	}
	if err := c.pg.Restart("immediate"); err != nil {
		return 0, err
	}
	up := time.Now()
	want := max(1, before*int(window/time.Millisecond)/2000/2)
	// The earliest moment a window of that length after up holds want finishes.
	earliest := func() (time.Time, bool) {
		ws, err := writelog.Read(ctx, c.db, seq)
		if err != nil {
			return time.Time{}, false
		}
		var at []time.Time
		for _, w := range ws {
			if w.NewStatus == "done" && w.At.After(up) {
				at = append(at, w.At)
			}
		}
		sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
		for i := want - 1; i < len(at); i++ {
			if at[i].Sub(at[i-want+1]) <= window {
				return at[i], true
			}
		}
		return time.Time{}, false
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := earliest(); ok {
			time.Sleep(settleWrites)
			t, _ := earliest()
			return t.Sub(up), nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, fmt.Errorf("no %d finishes within %v of each other in 30s", want, window)
}

// awaitDrained waits, up to limit, until no message inserted over a second
// ago is still pending: what an earlier fault held back has been claimed.
func (c *chaos) awaitDrained(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var late int
		err := c.db.QueryRow(ctx, `SELECT count(*) FROM pepsi.queue
			WHERE status = 'pending' AND created_at < now() - interval '1 second'`).Scan(&late)
		if err != nil {
			return fmt.Errorf("await the backlog's drain: %w", err)
		}
		if late == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d messages inserted over a second ago still pending after %v", late, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// blackHole silences the network between the pipeline and PostgreSQL for
// c.blackhole, heals it, and measures until a stage pass is finished.
func (c *chaos) blackHole(ctx context.Context) (time.Duration, error) {
	c.proxy.BlackHole()
	time.Sleep(c.blackhole)
	seq, err := c.lastSeq(ctx)
	if err != nil {
		c.proxy.Heal()
		return 0, err
	}
	c.proxy.Heal()
	healed := time.Now()
	// A stage pass finished: written by the worker, or by its dispatcher for an
	// answered transition; claims and resets change neither stage nor end a row.
	w, err := c.awaitWrite(ctx, seq, 60*time.Second, "stage pass finished after healing", func(w writelog.Write) bool {
		return w.At.After(healed) && w.OldStatus == "running" && (w.NewStatus == "done" || w.NewStage != w.OldStage)
	})
	if err != nil {
		return 0, err
	}
	return w.At.Sub(healed), nil
}

// stopAll SIGTERMs every running dispatcher and waits for them (SIGKILL after
// 30 s).
func (c *chaos) stopAll() {
	for _, d := range c.alive() {
		_ = d.Cmd.Process.Signal(syscall.SIGTERM) // one that exited meanwhile needs none
	}
	for _, d := range c.alive() {
		select {
		case <-d.Done():
		case <-time.After(30 * time.Second):
			d.Kill()
		}
	}
}

// finish waits for the queue to drain, stops the dispatchers, and checks
// that every message ended done or failed and that no worker wrote a message
// its dispatcher did not hold.
func (c *chaos) finish(ctx context.Context) (int, error) {
	deadline := time.Now().Add(120 * time.Second)
	var counts map[string]int
	for {
		counts = map[string]int{}
		rows, err := c.db.Query(ctx, `SELECT status, count(*) FROM pepsi.queue GROUP BY status`)
		if err == nil {
			for rows.Next() {
				var s string
				var n int
				if rows.Scan(&s, &n) == nil {
					counts[s] = n
				}
			}
			rows.Close()
		}
		if err == nil && counts["pending"] == 0 && counts["running"] == 0 && counts["paused"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.stopAll()
	writes, err := writelog.Read(ctx, c.db, 0)
	if err != nil {
		return exitBroken, err
	}
	workerOf := map[string]string{}
	c.mu.Lock()
	for _, d := range c.dispatchers {
		workerOf[d.name] = d.app
	}
	inserted, generations := c.inserted, c.generation
	c.mu.Unlock()
	bad := writelog.CheckOwnership(writes, workerOf)
	total := 0
	keys := make([]string, 0, len(counts))
	for k, n := range counts {
		total += n
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, counts[k])
	}
	fmt.Fprintf(c.out, "final: %d messages inserted, queue {%s}; %d dispatchers started; %d writes logged; %d ownership violations\n",
		inserted, strings.Join(parts, " "), generations, len(writes), len(bad))
	code := exitOK
	// An insert whose reply a PostgreSQL restart lost may have committed: the
	// queue may hold more than was counted, never fewer.
	if total < inserted || counts["pending"]+counts["running"]+counts["paused"] != 0 || counts["timeout"] != 0 {
		fmt.Fprintln(c.out, "BROKEN: messages lost, stuck or timed out")
		code = exitBroken
	}
	for _, b := range bad {
		fmt.Fprintln(c.out, "BROKEN:", b)
		code = exitBroken
	}
	return code, nil
}

// printTable prints each fault's samples: count, min, median, max and the target.
func printTable(w io.Writer, results [][]time.Duration, skipped []int, blackhole time.Duration) {
	fmt.Fprintf(w, "\n%-52s %8s %3s %9s %9s %9s %9s  %s\n", "recovery", "target", "n", "min", "median", "max", "spread", "samples")
	for f, name := range faultNames {
		if f == faultBlackHole {
			name = fmt.Sprintf("resumption after a healed %v black hole", blackhole)
		}
		rs := append([]time.Duration(nil), results[f]...)
		sort.Slice(rs, func(i, j int) bool { return rs[i] < rs[j] })
		if len(rs) == 0 {
			fmt.Fprintf(w, "%-52s %8v %3d %9s %9s %9s %9s  (%d skipped)\n", name, faultTargets[f], 0, "-", "-", "-", "-", skipped[f])
			continue
		}
		all := make([]string, len(rs))
		for i, r := range rs {
			all[i] = ms(r)
		}
		note := strings.Join(all, " ")
		if skipped[f] > 0 {
			note += fmt.Sprintf(" (%d skipped)", skipped[f])
		}
		fmt.Fprintf(w, "%-52s %8v %3d %9s %9s %9s %9s  %s\n", name, faultTargets[f], len(rs),
			ms(rs[0]), ms(rs[len(rs)/2]), ms(rs[len(rs)-1]), ms(rs[len(rs)-1]-rs[0]), note)
	}
	fmt.Fprintln(w)
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + "ms"
}
