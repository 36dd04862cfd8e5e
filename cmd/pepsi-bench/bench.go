package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bounds of the bench's waits.
const (
	// pipelineTimeoutBase and pipelineTimeoutPerMessage make the default -timeout
	// of one pipeline run: far above any plausible run, so only a stuck
	// pipeline reaches it.
	pipelineTimeoutBase       = 2 * time.Minute
	pipelineTimeoutPerMessage = time.Millisecond
	// pollEvery is how often the pipeline's progress is read (see wait).
	pollEvery = 50 * time.Millisecond
	// stopWait is how long pepsi-dispatch may take to exit after SIGTERM.
	stopWait = 30 * time.Second
)

func timeDuration(n int) time.Duration { return time.Duration(n) }

// bench holds one invocation's settings.
type bench struct {
	out         io.Writer
	n           int
	seconds     int
	clients     int
	rounds      int
	parallelism int
	queueLimit  int
	maxMessages int
	server      string
	dbName      string
	dispatch    string
	cpuProfile  string
	skipPgbench bool
	keep        bool
	timeout     time.Duration

	url     string // the bench database
	dir     string // configuration, scripts, logs
	pgbench string // the pgbench binary
	self    string // this binary: the stage program
}

// round is what one side-by-side measurement found.
type round struct {
	tps     float64       // pgbench transactions per second
	commit  time.Duration // CPU time of one pgbench commit; 0 if unknown
	hops    float64       // pipeline hops per second
	elapsed time.Duration // dispatcher start to last done
	cpu     pipelineCPU   // CPU time the pipeline took; zero if unknown
}

// pipelineCPU is the CPU time of a pipeline run: pepsi-dispatch with the workers
// it reaped, and the database backends that served them.
type pipelineCPU struct {
	programs, backends time.Duration
}

func (b *bench) run(ctx context.Context) error {
	if err := b.prepare(); err != nil {
		return err
	}
	keep := b.keep
	defer func() {
		if keep {
			fmt.Fprintf(b.out, "configuration and pepsi-dispatch logs kept in %s\n", b.dir)
			return
		}
		os.RemoveAll(b.dir)
	}()
	fmt.Fprintf(b.out, "pepsi-bench: %d rounds; pgbench -c %d -j 2 -T %d (one single-row INSERT per transaction); "+
		"pipeline a -> b -> c -> done, %d messages, PARALLELISM=%d QUEUE_LIMIT=%d MAX_MESSAGES=%d\n",
		b.rounds, b.clients, b.seconds, b.n, b.parallelism, b.queueLimit, b.maxMessages)
	var rounds []round
	for i := 1; i <= b.rounds; i++ {
		r, err := b.round(ctx, i)
		if err != nil {
			keep = true
			return fmt.Errorf("round %d: %w", i, err)
		}
		rounds = append(rounds, r)
		fmt.Fprintf(b.out, "round %d: %s\n", i, r.line(b.clients))
	}
	b.summary(rounds)
	return nil
}

// line is one round's result in the form the brief asks for.
func (r round) line(clients int) string {
	if r.tps == 0 {
		return fmt.Sprintf("pepsi: %.0f hops/s (%.2f s%s)", r.hops, r.elapsed.Seconds(), r.cpuNote())
	}
	commit := ""
	if r.commit > 0 {
		commit = fmt.Sprintf(" (CPU per commit %.0f µs)", float64(r.commit.Nanoseconds())/1000)
	}
	return fmt.Sprintf("pgbench %d clients: %.0f tps%s; pepsi: %.0f hops/s = %.2f× pgbench (%.2f s%s)",
		clients, r.tps, commit, r.hops, r.hops/r.tps, r.elapsed.Seconds(), r.cpuNote())
}

// cpuNote is the pipeline's CPU time per hop, which other load on the machine
// disturbs far less than its hops/s.
func (r round) cpuNote() string {
	if r.cpu.backends == 0 || r.hops == 0 {
		return ""
	}
	hops := r.hops * r.elapsed.Seconds()
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / hops }
	return fmt.Sprintf("; CPU per hop %.0f µs: dispatcher and workers %.0f, their backends %.0f",
		per(r.cpu.programs+r.cpu.backends), per(r.cpu.programs), per(r.cpu.backends))
}

// summary prints the medians and the spread, so a noisy machine shows as such.
func (b *bench) summary(rounds []round) {
	var tps, hops, ratio []float64
	for _, r := range rounds {
		tps = append(tps, r.tps)
		hops = append(hops, r.hops)
		if r.tps > 0 {
			ratio = append(ratio, r.hops/r.tps)
		}
	}
	spread := func(xs []float64) string {
		lo, hi := slices.Min(xs), slices.Max(xs)
		return fmt.Sprintf("min %.0f, max %.0f, spread %.0f%%", lo, hi, 100*(hi-lo)/median(xs))
	}
	if len(ratio) == 0 {
		fmt.Fprintf(b.out, "median: pepsi: %.0f hops/s (%s)\n", median(hops), spread(hops))
		return
	}
	lo, hi := slices.Min(ratio), slices.Max(ratio)
	fmt.Fprintf(b.out, "median: pgbench %d clients: %.0f tps; pepsi: %.0f hops/s = %.2f× pgbench (ratio min %.2f×, max %.2f×)\n",
		b.clients, median(tps), median(hops), median(ratio), lo, hi)
	fmt.Fprintf(b.out, "  pgbench tps: %s; pepsi hops/s: %s\n", spread(tps), spread(hops))
}

// prepare finds the programs and makes the working directory.
func (b *bench) prepare() error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find my own binary (the stage program): %w", err)
	}
	if b.self, err = filepath.EvalSymlinks(self); err != nil {
		return fmt.Errorf("find my own binary (the stage program): %w", err)
	}
	if b.dispatch == "" {
		b.dispatch, err = findDispatch(b.self)
		if err != nil {
			return err
		}
	}
	if !b.skipPgbench {
		if b.pgbench, err = findPgbench(); err != nil {
			return err
		}
	}
	u, _ := url.Parse(b.server) // checked by run
	u.Path = "/" + b.dbName
	b.url = u.String()
	if b.dir, err = os.MkdirTemp("", "pepsi-bench-"); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	return nil
}

// round measures pgbench, then the pipeline, each on a fresh database.
func (b *bench) round(ctx context.Context, i int) (round, error) {
	var r round
	if !b.skipPgbench {
		if err := b.freshDatabase(ctx); err != nil {
			return r, err
		}
		tps, commit, err := b.runPgbench(ctx)
		if err != nil {
			return r, err
		}
		r.tps, r.commit = tps, commit
	}
	if err := b.freshDatabase(ctx); err != nil {
		return r, err
	}
	elapsed, cpu, err := b.runPipeline(ctx, i)
	if err != nil {
		return r, err
	}
	r.elapsed, r.cpu = elapsed, cpu
	r.hops = float64(hopsPerMessage*b.n) / elapsed.Seconds()
	return r, nil
}

// freshDatabase drops and creates the bench database, then checkpoints, so that
// neither measurement pays for the other's dirty buffers.
func (b *bench) freshDatabase(ctx context.Context) error {
	admin, err := pgx.Connect(ctx, b.server)
	if err != nil {
		return fmt.Errorf("connect to the server: %w", err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	for _, sql := range []string{
		"DROP DATABASE IF EXISTS " + b.dbName + " WITH (FORCE)",
		"CREATE DATABASE " + b.dbName,
		"CHECKPOINT",
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}
