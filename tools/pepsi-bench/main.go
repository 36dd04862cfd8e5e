// Command pepsi-bench measures PEPSI's pipeline throughput against this
// machine's PostgreSQL commit rate and against a peer, River, side by side in
// one run, so that the ratios hold on any machine: pgbench with 16 clients
// committing one single-row INSERT per transaction (synchronous_commit as the
// server has it), then a 3-stage pipeline of trivial stages (a -> b -> c ->
// done) driven by the real pepsi-dispatch binary, in each mode (-modes) at each
// configuration (-configs), then River draining as many no-op jobs as the
// pipeline makes hops (-river, bin/river-bench from the nested module
// bench/river). Each round prints its figures; the end prints one table of
// medians and ratios, then the latency of each mode at a low offered rate.
// -backlog instead drains a backlog of a million messages and reports whether
// the rate holds up and how the queue grows. "make bench" runs it;
// docs/performance.md explains every figure.
//
// A hop is one stage pass, the unit of work a River job is; hops/s = 3 × N /
// (time from the dispatcher's start to the last message done).
//
// The stage programs are pepsi-bench itself. Write mode: started as
// "pepsi-bench worker" with PEPSI_STAGE set, it serves the three stages with the
// stage library and stage.WriteTransitions, which commits each transition and
// answers "0". Library mode: started through a link named pepsi-bench-library,
// the stage library as it runs by default, which answers "0 >b", "0 >c",
// "0 >done". Answer mode: started through a link named pepsi-bench-answer, it
// opens no database connection, writes nothing and answers the same lines
// (docs/protocol.md). Only a dispatcher that speaks the "0 >TARGET" protocol
// accepts those; one that does not kills the worker for a protocol error, and
// pepsi-bench says so, measures the rest and exits 1.
//
// It never touches a database other than its own (-db-name, dropped and created
// afresh for each measurement), and never runs with a database it did not create.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/stage"
)

func main() {
	switch {
	case filepath.Base(os.Args[0]) == answerProgram:
		runAnswerWorker()
	case filepath.Base(os.Args[0]) == messageProgram:
		runMessageWorker()
	case filepath.Base(os.Args[0]) == relayProgram:
		runRelayWorker()
	case filepath.Base(os.Args[0]) == splitProgram:
		runSplitWorker()
	case filepath.Base(os.Args[0]) == libraryProgram:
		stage.Main(handlers()) // answers its transitions
	case len(os.Args) > 1 && os.Args[1] == "worker":
		stage.Main(handlers(), stage.WriteTransitions())
	}
	cliflags.Main(run)
}

// The pipeline's stages, in the order a message passes them.
const (
	stageA = "a"
	stageB = "b"
	stageC = "c"
	// hopsPerMessage is how many stage passes one message takes.
	hopsPerMessage = 3
)

// handlers are the trivial write-mode stages: no work, no sleeps, only the
// transitions, which the stage library writes.
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
	var modes, configs, backlogConfigs string
	fs.IntVar(&b.n, "n", 20000, "messages enqueued per pipeline run (each makes 3 hops; River drains 3 × n jobs)")
	fs.IntVar(&b.seconds, "seconds", 10, "how long pgbench runs per round")
	fs.IntVar(&b.clients, "clients", 16, "pgbench clients (-c)")
	fs.IntVar(&b.rounds, "rounds", 3, "how many times to measure both, side by side")
	b.benchConfig.name = "bench"
	fs.IntVar(&b.benchConfig.parallelism, "parallelism", 2, "PARALLELISM of each stage in the bench configuration")
	fs.IntVar(&b.benchConfig.queueLimit, "queue-limit", 64, "QUEUE_LIMIT of each stage in the bench configuration")
	fs.IntVar(&b.benchConfig.maxMessages, "max-messages", 100000, "MAX_MESSAGES of each stage in the bench configuration (a worker recycles after that many)")
	fs.BoolVar(&b.splitSingle, "split-single", false, "with -split: each round also runs the split with SESSIONS = 1, beside the one at -sessions")
	fs.IntVar(&b.benchConfig.sessions, "sessions", 0, "SESSIONS of the dispatcher in every configuration but single, and in the split figure (0: pepsi.conf's default)")
	fs.StringVar(&modes, "modes", "write,library,answer", "the stage `modes` to measure: write (the stage library commits the transition, answers 0), library (the stage library answers 0 >NEXT), answer (a stage with no database connection answers 0 >NEXT), message (INPUT = message: the stage parses each message and answers a patch from it), python (the same with a Python stage), relay1ms and relay10ms (message mode behind a TCP relay adding 1 or 10 ms per round trip); all but write need the 0 >TARGET protocol")
	fs.IntVar(&b.payloadBytes, "payload-bytes", 0, "the size of each message's payload in bytes (0: \"message N\"); with -modes message it shows what INPUT = message costs the dispatcher (pepsi-dispatch's peak RSS is then reported)")
	fs.StringVar(&configs, "configs", "bench,defaults", "the `configurations` to measure: bench (-parallelism, -queue-limit, -max-messages), defaults (pepsi.conf's: 4, 4, 1000), rated (bench with RATE = "+ratedRate+" on every stage: far above its throughput, so it measures what RATE costs), pressured (bench with MAX_PENDING = 100 on stages b and c: what back-pressure's checks cost, and its holds when a stage falls behind), keyed (bench with every message under an order key of its own: what ordering per key costs), keys (bench with the messages sharing -keys order keys in turn), backlogged (bench beside one key's backlog of -key-backlog messages waiting behind a paused head), backlogged-keyed (keyed beside that backlog: set beside keyed as well as bench), traced (bench exporting a span per pass, every pass sampled, to an OTLP/HTTP receiver in pepsi-bench), traced-dead (the same to a collector that takes the connection and never answers), before (bench with the -dispatch-before binary, unrecorded (bench with HISTORY = off on every stage: beside bench, what pepsi.history costs), single (bench with SESSIONS = 1: beside bench at -sessions, what the sessions beside the first gain)")
	fs.IntVar(&b.keys, "keys", 1000, "how many order keys the messages share in the keys configuration (-n 100000 -keys 1000: 100 messages per key)")
	fs.IntVar(&b.keyBacklog, "key-backlog", 1000000, "how many messages of one key wait behind its paused head in the backlogged configuration")
	fs.StringVar(&b.river, "river", "", "the river-bench `binary` (make bench builds bin/river-bench): River drains 3 × n no-op jobs each round; empty: no River row")
	fs.IntVar(&b.latencyRate, "latency-rate", 100, "messages per second offered in the latency run")
	fs.IntVar(&b.latencySeconds, "latency-seconds", 10, "how long the latency run offers messages, per mode; 0: no latency run")
	fs.BoolVar(&b.backlog, "backlog", false, "instead of the rounds: drain -backlog-n messages per mode at the bench configuration; report hops/s over the first and last tenth and the queue's sizes")
	fs.BoolVar(&b.raceRuns, "race", false, "instead of the rounds: -rounds runs per mode of three producers that each hold their one-message transaction open 0–20 ms and pause 0–600 ms, for -latency-seconds each; report commit → done per run")
	fs.IntVar(&b.backlogN, "backlog-n", 1000000, "messages in the -backlog drain")
	fs.StringVar(&backlogConfigs, "backlog-configs", "bench", "the `configurations` of -backlog, a drain at each, one after the other (as -configs; bench,unrecorded: history on beside HISTORY = off)")
	fs.IntVar(&b.historyRows, "history", 0, "instead of the rounds: fill pepsi.history with this many `rows` over 7 daily partitions; report what pepsi-queue history's read of one message takes and what dropping a day's partition takes; 0: no history figure")
	fs.IntVar(&b.splitN, "split", 0, "instead of the rounds: the split figure, -rounds times: this many `messages` at stage a, each split into 10 messages emitted to stage b (which answers 0 >done), beside pgbench's single-row INSERTs into pepsi.queue; report emitted messages/s and the ratio; 0: no split figure")
	fs.IntVar(&b.splitParent.parallelism, "split-parallelism", 0, "PARALLELISM of the split figure's stage a, the parents' (0: -parallelism); with -split-queue-limit, a parents' stage slower than the children's, whose children are then claimed by their insert")
	fs.IntVar(&b.splitParent.queueLimit, "split-queue-limit", 0, "QUEUE_LIMIT of the split figure's stage a (0: -queue-limit)")
	fs.StringVar(&b.server, "database", server, "admin `URL` of the PostgreSQL server (default: PEPSI_TEST_DATABASE_URL); the bench creates its own database there")
	fs.StringVar(&b.dbName, "db-name", "pepsi_bench", "`NAME` of the bench's database, dropped and created afresh each round")
	fs.StringVar(&b.dispatch, "dispatch", "", "the pepsi-dispatch `binary` (default: next to pepsi-bench, else on PATH)")
	fs.StringVar(&b.dispatchBefore, "dispatch-before", "", "the pepsi-dispatch `binary` of the before configuration: the build before a change, measured beside it")
	fs.StringVar(&b.cpuProfile, "cpuprofile", "", "write pepsi-dispatch's CPU profile of round R to `FILE`.R")
	fs.BoolVar(&b.keep, "keep", false, "keep the working directory (configuration, pepsi-dispatch logs) after a successful run")
	fs.BoolVar(&b.skipPgbench, "skip-pgbench", false, "measure the pipeline only (no ratio)")
	fs.BoolVar(&b.enqueueAfterStart, "enqueue-after-start", false, "start pepsi-dispatch on the empty queue (vacuumed and analyzed), and enqueue each round's -n messages a second after it connected: a backlog that comes after its plans were made")
	fs.IntVar(&b.ingestSeconds, "ingest-seconds", 5, "how long each pgbench run of the ingest figure lasts (single-row INSERTs into pepsi.queue with and without its trigger, the dispatcher idle and busy); 0: skip it")
	fs.DurationVar(&b.timeout, "timeout", 0, "how long one pipeline run may take (default: 2 min + 1 ms per message)")
	ing := ingressFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: pepsi-bench [flags]\n\nMeasures pgbench's commit rate and PEPSI's pipeline hops/s side by side.\nEvery flag can also be set as PEPSI_BENCH_<FLAG> (-queue-limit as PEPSI_BENCH_QUEUE_LIMIT).\n\n")
		fs.PrintDefaults()
	}
	if _, err := cliflags.Parse(fs, args, "PEPSI_BENCH"); err != nil {
		return cliflags.Fail(stderr, "pepsi-bench", err)
	}
	if err := b.settle(fs.Args(), modes, configs, backlogConfigs); err != nil {
		fmt.Fprintf(stderr, "pepsi-bench: %v\n", err)
		return 2
	}
	run := b.run
	if ing.on {
		run = func(ctx context.Context) error { return b.runIngress(ctx, ing) }
	}
	if err := run(ctx); err != nil {
		fmt.Fprintf(stderr, "pepsi-bench: %v\n", err)
		return 1
	}
	return 0
}

// settle checks the flags (args is what follows them on the command line,
// modes, configs and backlogConfigs the values of -modes, -configs and
// -backlog-configs) and works out what they leave open: the variants to
// measure and the pipeline's timeout.
func (b *bench) settle(args []string, modes, configs, backlogConfigs string) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("unexpected arguments %q (see -h)", args)
	case b.n <= 0 || b.seconds <= 0 || b.clients <= 0 || b.rounds <= 0 || b.benchConfig.parallelism <= 0 ||
		b.benchConfig.queueLimit <= 0 || b.benchConfig.maxMessages <= 0 || b.latencyRate <= 0 || b.backlogN <= 0 ||
		b.keys <= 0 || b.keyBacklog <= 0:
		return errors.New("-n, -seconds, -clients, -rounds, -parallelism, -queue-limit, -max-messages, -latency-rate, -backlog-n, -keys and -key-backlog must be positive")
	case b.latencySeconds < 0:
		return errors.New("-latency-seconds must not be negative")
	case b.benchConfig.sessions < 0 || b.benchConfig.sessions > conf.SessionsMax:
		return fmt.Errorf("-sessions must be 0 (pepsi.conf's default) or 1 to %d", conf.SessionsMax)
	case b.splitN < 0 || b.splitN > 0 && b.skipPgbench:
		return errors.New("-split must not be negative, and measures beside pgbench (no -skip-pgbench)")
	case b.enqueueAfterStart && (b.backlog || b.raceRuns || b.splitN > 0 || b.historyRows > 0):
		return errors.New("-enqueue-after-start applies to the rounds' pipeline runs only, not to -backlog, -race, -split or -history")
	case b.splitParent.parallelism < 0 || b.splitParent.queueLimit < 0:
		return errors.New("-split-parallelism and -split-queue-limit must not be negative")
	case !regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`).MatchString(b.dbName):
		return fmt.Errorf("-db-name %q: want lower-case letters, digits and '_'", b.dbName)
	}
	if u, err := url.Parse(b.server); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return fmt.Errorf("-database %q: want a postgres:// URL of the server", b.server)
	}
	if b.backlog && (strings.Contains(modes, string(modeRelay1)) || strings.Contains(modes, string(modeRelay10))) {
		return errors.New("-backlog does not measure the relay modes: leave relay1ms and relay10ms out of -modes")
	}
	var err error
	if b.modes, err = parseModes(modes); err != nil {
		return fmt.Errorf("-modes: %w", err)
	}
	if b.configs, err = parseConfigs(configs, b.benchConfig, b.keys, b.keyBacklog); err != nil {
		return fmt.Errorf("-configs: %w", err)
	}
	if b.backlogConfigs, err = parseConfigs(backlogConfigs, b.benchConfig, b.keys, b.keyBacklog); err != nil {
		return fmt.Errorf("-backlog-configs: %w", err)
	}
	for _, c := range b.backlogConfigs {
		// A drain enqueues keyless messages and starts no collector: only the
		// configurations that are the dispatcher's and its stages' settings.
		if c.keyed || c.keys > 0 || c.keyBacklog > 0 || c.traces != "" {
			return fmt.Errorf("-backlog-configs: %s is not measured by a drain: want bench, defaults, rated, pressured, before or unrecorded", c.name)
		}
	}
	for _, m := range b.modes {
		for _, c := range b.configs {
			b.variants = append(b.variants, variant{mode: m, cfg: c})
		}
	}
	if b.timeout == 0 {
		n := b.n
		if b.backlog {
			n = b.backlogN
		}
		if b.splitN > 0 {
			n = (1 + splitChildren) * b.splitN
		}
		b.timeout = pipelineTimeoutBase + pipelineTimeoutPerMessage*timeDuration(n)
	}
	return nil
}

// parseModes reads -modes: a comma-separated list of write, library and
// answer, each at most once, in the order given.
func parseModes(s string) ([]mode, error) {
	var ms []mode
	for _, f := range strings.Split(s, ",") {
		m := mode(strings.TrimSpace(f))
		if !slices.Contains([]mode{modeWrite, modeLibrary, modeAnswer, modeMessage, modePython, modeRelay1, modeRelay10}, m) {
			return nil, fmt.Errorf("%q is not a mode: want write, library, answer, message, python, relay1ms or relay10ms, or several (write,library,answer)", f)
		}
		if slices.Contains(ms, m) {
			return nil, fmt.Errorf("mode %s twice", m)
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// parseConfigs reads -configs: a comma-separated list of bench (the flags'
// configuration), defaults (pepsi.conf's), rated (bench with a RATE far
// above its throughput), pressured (bench with MAX_PENDING on stages b and
// c), keyed (bench, every message with its own order
// key), keys (bench, the messages sharing keys order keys), backlogged
// (bench beside one key's backlog of keyBacklog messages) and unrecorded
// (bench with HISTORY = off), single (bench with SESSIONS = 1), each at
// most once; every configuration but single has bench's SESSIONS.
func parseConfigs(s string, bench stageConfig, keys, keyBacklog int) ([]stageConfig, error) {
	var cs []stageConfig
	for _, f := range strings.Split(s, ",") {
		c, name := bench, strings.TrimSpace(f)
		switch name {
		case "bench":
		case "defaults":
			c = defaultsConfig
			c.sessions = bench.sessions
		case "rated":
			c.rate = ratedRate
		case "pressured":
			c.maxPending = pressuredMaxPending
		case "keyed":
			c.keyed = true
		case "keys":
			c.keys = keys
		case "backlogged":
			c.keyBacklog = keyBacklog
		case "backlogged-keyed":
			c.keyed, c.keyBacklog = true, keyBacklog
		case "traced":
			c.traces = "live"
		case "traced-dead":
			c.traces = "dead"
		case "before":
			c.before = true
		case "unrecorded":
			c.historyOff = true
		case "single":
			c.sessions = 1
		default:
			return nil, fmt.Errorf("%q is not a configuration: want bench, defaults, rated, pressured, keyed, keys, backlogged, backlogged-keyed, traced, traced-dead, before, unrecorded, single or several (bench,defaults)", f)
		}
		c.name = name
		if slices.ContainsFunc(cs, func(x stageConfig) bool { return x.name == c.name }) {
			return nil, fmt.Errorf("configuration %s twice", c.name)
		}
		cs = append(cs, c)
	}
	return cs, nil
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
