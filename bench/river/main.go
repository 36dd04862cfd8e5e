// Command river-bench drains N no-op jobs through River (github.com/riverqueue/river,
// its riverpgxv5 driver) with the settings of River's own benchmark
// (cmd/river/riverbench: "river bench -n N"), and prints River's jobs/s, so that
// pepsi-bench can put a peer's figure beside PEPSI's hops/s measured on the
// same server in the same run (docs/performance.md).
//
// It lives in a module of its own (bench/river/go.mod) so that PEPSI's module
// does not depend on River; "make bench" and "make bench-peers" build it into
// bin/river-bench.
//
// What it does, like River's benchmark in its burn-down mode (-n): a fresh
// database (-db-name, dropped and created afresh), River's migrations
// (rivermigrate), N jobs inserted with InsertMany in batches of 5,000 before the
// client starts, then a client with one queue of 2,000 workers, FetchCooldown
// 2 ms and FetchPollInterval 20 ms, on a pgxpool with its default size; jobs/s =
// N / (time from client.Start to the last job's completion event). It then stops
// the client and checks that every job is completed. Only the code is ours: the
// settings are River's.
//
// Its last line is
//
//	river v0.51.2: 60000 jobs in 2.951 s = 20332 jobs/s; CPU per job 48 µs: client 30, backends 18
//
// (CPU only when the server runs on this machine).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

// River's benchmark settings (cmd/river/riverbench/river_bench.go).
const (
	workersMax        = 2_000
	fetchCooldown     = 2 * time.Millisecond
	fetchPollInterval = 20 * time.Millisecond
	insertBatch       = 5_000
	// River's CLI opens its pool with these (cmd/river/rivercli/command.go).
	statementTimeout         = 10 * time.Second
	idleInTransactionTimeout = 11 * time.Second
)

// defaultServer is the PostgreSQL used when PEPSI_TEST_DATABASE_URL is not set.
const defaultServer = "postgres://postgres@127.0.0.1:5432/postgres"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("river-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := os.Getenv("PEPSI_TEST_DATABASE_URL")
	if server == "" {
		server = defaultServer
	}
	n := fs.Int("n", 60000, "jobs to insert, then drain")
	fs.StringVar(&server, "database", server, "admin `URL` of the PostgreSQL server; the bench creates its own database there")
	dbName := fs.String("db-name", "river_bench", "`NAME` of the bench's database, dropped and created afresh")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long the drain may take")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "river-bench: unexpected arguments %q\n", fs.Args())
		return 2
	case *n <= 0:
		fmt.Fprintf(stderr, "river-bench: -n must be positive\n")
		return 2
	case !regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`).MatchString(*dbName):
		fmt.Fprintf(stderr, "river-bench: -db-name %q: want lower-case letters, digits and '_'\n", *dbName)
		return 2
	}
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		fmt.Fprintf(stderr, "river-bench: -database %q: want a postgres:// URL of the server\n", server)
		return 2
	}
	if err := freshDatabase(ctx, server, *dbName); err != nil {
		fmt.Fprintf(stderr, "river-bench: %v\n", err)
		return 1
	}
	u.Path = "/" + *dbName
	r, err := drain(ctx, u.String(), *n, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "river-bench: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, r.line())
	return 0
}

// result is what one drain measured.
type result struct {
	jobs             int
	elapsed          time.Duration
	client, backends time.Duration // CPU time over the drain
	backendsKnown    bool
}

func (r result) line() string {
	s := fmt.Sprintf("river %s: %d jobs in %.3f s = %.0f jobs/s", riverVersion(), r.jobs, r.elapsed.Seconds(), float64(r.jobs)/r.elapsed.Seconds())
	if r.backendsKnown {
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(r.jobs) }
		s += fmt.Sprintf("; CPU per job %.0f µs: client %.0f, backends %.0f", per(r.client+r.backends), per(r.client), per(r.backends))
	}
	return s
}

func freshDatabase(ctx context.Context, server, name string) error {
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return fmt.Errorf("connect to the server: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	for _, sql := range []string{
		"DROP DATABASE IF EXISTS " + name + " WITH (FORCE)",
		"CREATE DATABASE " + name,
		"CHECKPOINT",
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// noopArgs is the benchmark's job: River's BenchmarkArgs carries a number only.
type noopArgs struct {
	Num int `json:"num"`
}

func (noopArgs) Kind() string { return "benchmark" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (*noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

func openPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	p := cfg.ConnConfig.RuntimeParams
	p["application_name"] = "river-bench"
	p["statement_timeout"] = strconv.FormatInt(statementTimeout.Milliseconds(), 10)
	p["idle_in_transaction_session_timeout"] = strconv.FormatInt(idleInTransactionTimeout.Milliseconds(), 10)
	return pgxpool.NewWithConfig(ctx, cfg)
}

func drain(ctx context.Context, dbURL string, n int, timeout time.Duration) (result, error) {
	var r result
	pool, err := openPool(ctx, dbURL)
	if err != nil {
		return r, fmt.Errorf("connect to the bench database: %w", err)
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return r, fmt.Errorf("River's migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return r, fmt.Errorf("River's migrations: %w", err)
	}

	client, err := newClient(driver)
	if err != nil {
		return r, fmt.Errorf("River's client: %w", err)
	}
	// Completion events count the jobs through River's completer, as River's
	// benchmark does; the channel holds every job so that none is dropped.
	events, cancelEvents := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: n,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancelEvents()
	if err := insertJobs(ctx, client, n); err != nil {
		return r, err
	}

	pids0, cpu0, known0 := backendsCPU(ctx, pool)
	self0 := selfCPU()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return r, fmt.Errorf("start River's client: %w", err)
	}
	last, err := awaitCompleted(ctx, events, n, timeout)
	if err != nil {
		return r, err
	}
	r.jobs, r.elapsed = n, last.Sub(start)
	r.client = selfCPU() - self0
	if _, cpu1, known1 := backendsCPU(ctx, pool); known0 && known1 {
		// Backends present at the start count from then; any the pool opened
		// later count whole.
		r.backends, r.backendsKnown = cpu1-cpu0, len(pids0) > 0
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return r, fmt.Errorf("stop River's client: %w", err)
	}
	var completed int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = $1", string(rivertype.JobStateCompleted)).Scan(&completed); err != nil {
		return r, fmt.Errorf("count completed jobs: %w", err)
	}
	if completed != n {
		return r, fmt.Errorf("%d jobs completed in river_job, want %d", completed, n)
	}
	return r, nil
}

// newClient is River's client as the bench runs it: the no-op worker, up to
// workersMax at once, River's fetch timings, warnings logged.
func newClient(driver *riverpgxv5.Driver) (*river.Client[pgx.Tx], error) {
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{})
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return river.NewClient(driver, &river.Config{
		FetchCooldown:     fetchCooldown,
		FetchPollInterval: fetchPollInterval,
		Logger:            logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workersMax}},
		Workers:           workers,
	})
}

// insertJobs inserts n no-op jobs, insertBatch at a time.
func insertJobs(ctx context.Context, client *river.Client[pgx.Tx], n int) error {
	batch := make([]river.InsertManyParams, 0, insertBatch)
	for i := 0; i < n; i += insertBatch {
		batch = batch[:0]
		for j := i; j < min(n, i+insertBatch); j++ {
			batch = append(batch, river.InsertManyParams{Args: noopArgs{Num: j + 1}})
		}
		if _, err := client.InsertMany(ctx, batch); err != nil {
			return fmt.Errorf("insert jobs: %w", err)
		}
	}
	return nil
}

// awaitCompleted waits up to timeout for n completed jobs and returns when
// the last completed; any other end of a job is an error.
func awaitCompleted(ctx context.Context, events <-chan *river.Event, n int, timeout time.Duration) (last time.Time, err error) {
	deadline := time.After(timeout)
	for worked := 0; worked < n; {
		select {
		case ev := <-events:
			if ev == nil {
				return last, errors.New("River closed the subscription")
			}
			if ev.Kind != river.EventKindJobCompleted {
				return last, fmt.Errorf("job %d: event %s, state %s (want every no-op job completed)", ev.Job.ID, ev.Kind, ev.Job.State)
			}
			worked++
			last = time.Now()
		case <-deadline:
			return last, fmt.Errorf("%d of %d jobs completed within %v", worked, n, timeout)
		case <-ctx.Done():
			return last, ctx.Err()
		}
	}
	return last, nil
}

// riverVersion is the version of River this binary was built with.
func riverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == "github.com/riverqueue/river" {
				return m.Version
			}
		}
	}
	return "(unknown version)"
}

// selfCPU is this process's user and system time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times.
const clockTicks = 100

// backendsCPU sums the CPU time of the backends connected to the bench database
// (River's pool), read from /proc/PID/stat; known is false when the server is not
// on this machine.
func backendsCPU(ctx context.Context, pool *pgxpool.Pool) (pids []int32, cpu time.Duration, known bool) {
	rows, err := pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
	if err != nil {
		return nil, 0, false
	}
	pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, 0, false
	}
	var ticks int64
	for _, pid := range pids {
		text, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil, 0, false
		}
		rest := string(text)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 13 {
			return nil, 0, false
		}
		for _, s := range f[11:13] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, 0, false
			}
			ticks += v
		}
	}
	return pids, time.Duration(ticks) * time.Second / clockTicks, true
}
