// Command pepsi-bench measures PEPSI's pipeline throughput against this
// machine's PostgreSQL commit rate, side by side in one run, so the ratio holds
// on any machine: pgbench with 16 clients committing one single-row INSERT per
// transaction (synchronous_commit as the server has it), then a 3-stage pipeline
// of trivial stages (a -> b -> c -> done) driven by the real pepsi-dispatch
// binary. It prints, per round,
//
//	pgbench 16 clients: 12345 tps; pepsi: 23456 hops/s = 1.90× pgbench
//
// where hops/s = 3 × N / (time from the dispatcher's start to the last message
// done), and the median of the rounds at the end. "make bench" builds bin/ and
// runs it; docs/performance.md explains the figures.
//
// The stage program is pepsi-bench itself: started as "pepsi-bench worker" with
// PEPSI_STAGE set, it serves the three stages with the stage library.
//
// It never touches a database other than its own (-db-name, dropped and created
// afresh each round), and never runs with a database it did not create.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"syscall"

	"github.com/peterbourgon/ff/v3"

	"github.com/pepsi-pipeline/pepsi/stage"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		stage.Main(handlers())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// The pipeline's stages, in the order a message passes them.
const (
	stageA = "a"
	stageB = "b"
	stageC = "c"
	// hopsPerMessage is how many stage passes one message takes.
	hopsPerMessage = 3
)

// handlers are the trivial stages: no work, no sleeps, only the transitions.
func handlers() map[string]stage.Handler {
	return map[string]stage.Handler{
		stageA: func(context.Context, *stage.Message) stage.Result { return stage.Advance(stageB) },
		stageB: func(context.Context, *stage.Message) stage.Result { return stage.Advance(stageC) },
		stageC: func(context.Context, *stage.Message) stage.Result { return stage.Done() },
	}
}

// defaultServer is the PostgreSQL used when PEPSI_TEST_DATABASE_URL is not set.
const defaultServer = "postgres://postgres@127.0.0.1:5432/postgres"

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pepsi-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := os.Getenv("PEPSI_TEST_DATABASE_URL")
	if server == "" {
		server = defaultServer
	}
	b := &bench{out: stdout}
	fs.IntVar(&b.n, "n", 20000, "messages enqueued per round (each makes 3 hops)")
	fs.IntVar(&b.seconds, "seconds", 10, "how long pgbench runs per round")
	fs.IntVar(&b.clients, "clients", 16, "pgbench clients (-c)")
	fs.IntVar(&b.rounds, "rounds", 3, "how many times to measure both, side by side")
	fs.IntVar(&b.parallelism, "parallelism", 2, "PARALLELISM of each stage")
	fs.IntVar(&b.queueLimit, "queue-limit", 64, "QUEUE_LIMIT of each stage")
	fs.IntVar(&b.maxMessages, "max-messages", 100000, "MAX_MESSAGES of each stage (a worker recycles after that many; pepsi.conf default 1000)")
	fs.StringVar(&b.server, "database", server, "admin `URL` of the PostgreSQL server (default: PEPSI_TEST_DATABASE_URL); the bench creates its own database there")
	fs.StringVar(&b.dbName, "db-name", "pepsi_bench", "`NAME` of the bench's database, dropped and created afresh each round")
	fs.StringVar(&b.dispatch, "dispatch", "", "the pepsi-dispatch `binary` (default: next to pepsi-bench, else on PATH)")
	fs.StringVar(&b.cpuProfile, "cpuprofile", "", "write pepsi-dispatch's CPU profile of round R to `FILE`.R")
	fs.BoolVar(&b.keep, "keep", false, "keep the working directory (configuration, pepsi-dispatch logs) after a successful run")
	fs.BoolVar(&b.skipPgbench, "skip-pgbench", false, "measure the pipeline only (no ratio)")
	fs.DurationVar(&b.timeout, "timeout", 0, "how long one pipeline run may take (default: 2 min + 1 ms per message)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: pepsi-bench [flags]\n\nMeasures pgbench's commit rate and PEPSI's pipeline hops/s side by side.\nEvery flag can also be set as PEPSI_BENCH_<FLAG> (-queue-limit as PEPSI_BENCH_QUEUE_LIMIT).\n\n")
		fs.PrintDefaults()
	}
	if err := ff.Parse(fs, args, ff.WithEnvVarPrefix("PEPSI_BENCH")); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "pepsi-bench: unexpected arguments %q (see -h)\n", fs.Args())
		return 2
	case b.n <= 0 || b.seconds <= 0 || b.clients <= 0 || b.rounds <= 0 || b.parallelism <= 0 || b.queueLimit <= 0 || b.maxMessages <= 0:
		fmt.Fprintf(stderr, "pepsi-bench: -n, -seconds, -clients, -rounds, -parallelism, -queue-limit and -max-messages must be positive\n")
		return 2
	case !regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`).MatchString(b.dbName):
		fmt.Fprintf(stderr, "pepsi-bench: -db-name %q: want lower-case letters, digits and '_'\n", b.dbName)
		return 2
	}
	if u, err := url.Parse(b.server); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		fmt.Fprintf(stderr, "pepsi-bench: -database %q: want a postgres:// URL of the server\n", b.server)
		return 2
	}
	if b.timeout == 0 {
		b.timeout = pipelineTimeoutBase + pipelineTimeoutPerMessage*timeDuration(b.n)
	}
	if err := b.run(ctx); err != nil {
		fmt.Fprintf(stderr, "pepsi-bench: %v\n", err)
		return 1
	}
	return 0
}

// median returns the middle value of xs (the mean of the two middle ones for an
// even count); xs must not be empty.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
