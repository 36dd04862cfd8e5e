package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/tools/internal/dispatchproc"
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

// mode is how the stage programs of a pipeline run hand over their transitions.
type mode string

const (
	// modeWrite: the Go stage library, with stage.WriteTransitions, commits
	// each transition itself and answers "0"; the dispatcher then requeues the
	// row (two row versions per hop besides the claim).
	modeWrite mode = "write"
	// modeLibrary: the Go stage library as it runs by default: it reads the rows
	// of the ids it holds in one statement and answers "0 >b", "0 >c", "0 >done";
	// the dispatcher writes the transition. Needs the "0 >TARGET" protocol.
	modeLibrary mode = "library"
	// modeAnswer: the stage (pepsi-bench-answer, no database connection) writes
	// nothing and answers "0 >b", "0 >c", "0 >done"; the dispatcher writes the
	// transition in its batched transaction. Needs a pepsi-dispatch that speaks
	// the "0 >TARGET" protocol.
	modeAnswer mode = "answer"
	// modeMessage: the stages are INPUT = message (pepsi-bench-message, no
	// database): each parses the message line it is handed and answers its
	// transition with a patch computed from it ({"hops":N+1,"len":L}).
	modeMessage mode = "message"
	// modePython: INPUT = message stages in Python with the standard library
	// (examples/stages/words.py with the bench's targets): what a user's first
	// stage gets.
	modePython mode = "python"
	// modeRelay1 and modeRelay10: message mode with each stage on a "far
	// host": the worker (pepsi-bench-relay) carries its standard input and
	// output over TCP through the fault proxy, which adds 1 ms or 10 ms to
	// every round trip (as "ssh host stage" would). Hops/s only: the far
	// stages' CPU is not the dispatcher's children's.
	modeRelay1  mode = "relay1ms"
	modeRelay10 mode = "relay10ms"
)

// message reports whether the mode's stages are INPUT = message.
func (m mode) message() bool {
	return m == modeMessage || m == modePython || m == modeRelay1 || m == modeRelay10
}

// relay reports whether the mode's stages run behind the TCP relay.
func (m mode) relay() bool { return m == modeRelay1 || m == modeRelay10 }

// answers reports whether the mode's stages answer their transitions (and so
// need a dispatcher that speaks the "0 >TARGET" protocol).
func (m mode) answers() bool { return m != modeWrite }

// stageConfig is the three per-stage keys of pepsi.conf every stage gets.
type stageConfig struct {
	name                                 string
	parallelism, queueLimit, maxMessages int
	// rate is every stage's RATE ("" for none).
	rate string
	// maxPending is the MAX_PENDING of every stage but the first (0 for
	// none): the pressured configuration.
	maxPending int
	// keyed: every message has an order key of its own (the keyed
	// configuration), so each hop pays for ordering per key, and none waits.
	keyed bool
	// keys, when above 0, is how many order keys the messages share, in turn
	// (the keys configuration): each key's messages pass one at a time.
	keys int
	// keyBacklog, when above 0, is how many messages of one other key wait
	// behind their head, which is paused for ever, enqueued before the
	// measured messages (the backlogged configuration): what a key's backlog
	// costs everyone else.
	keyBacklog int
	// traces, when not "", runs pepsi-dispatch exporting a span per pass,
	// every pass sampled: "live" to an OTLP/HTTP receiver that answers (the
	// traced configuration), "dead" to a collector that takes the
	// connection and never answers (traced-dead).
	traces string
	// before runs the -dispatch-before binary, the build before a change,
	// with the bench configuration (the before configuration).
	before bool
	// historyOff: every stage has HISTORY = off (the unrecorded
	// configuration), so the run shows what pepsi.history costs.
	historyOff bool
	// sessions, when above 0, is the dispatcher's SESSIONS (-sessions; the
	// single configuration: 1); 0 leaves pepsi.conf's default.
	sessions int
}

// ratedRate is the RATE of the rated configuration: far above what any
// pipeline here passes, so it never holds a stage back and the run measures
// what the rate's bookkeeping costs.
const ratedRate = "1000000"

// pressuredMaxPending is the MAX_PENDING of the pressured configuration's
// stages b and c: each claim checks both limits (walking up to 101 entries
// of the pending index, twice), and a stage that falls behind by more holds
// the one before it.
const pressuredMaxPending = 100

// defaultsConfig is pepsi.conf's defaults (docs/pepsi.conf.5.md).
var defaultsConfig = stageConfig{name: "defaults", parallelism: 4, queueLimit: 4, maxMessages: 1000}

func (c stageConfig) String() string {
	s := fmt.Sprintf("%s (P=%d Q=%d MAX_MESSAGES=%d", c.name, c.parallelism, c.queueLimit, c.maxMessages)
	if c.rate != "" {
		s += " RATE=" + c.rate
	}
	if c.keyed {
		s += ", an order key per message"
	}
	if c.keys > 0 {
		s += fmt.Sprintf(", the messages share %d order keys", c.keys)
	}
	if c.keyBacklog > 0 {
		s += fmt.Sprintf(", beside one key's backlog of %d blocked messages", c.keyBacklog)
	}
	if c.historyOff {
		s += ", HISTORY = off"
	}
	if c.sessions > 0 {
		s += fmt.Sprintf(", SESSIONS = %d", c.sessions)
	}
	return s + ")"
}

// variant is one pipeline row of the table: a mode at a configuration.
type variant struct {
	mode mode
	cfg  stageConfig
}

func (v variant) String() string { return fmt.Sprintf("pipeline %s, %s", v.mode, v.cfg) }

// bench holds one invocation's settings.
type bench struct {
	out            io.Writer
	n              int
	seconds        int
	clients        int
	rounds         int
	benchConfig    stageConfig
	keys           int // the keys configuration's order keys (-keys)
	keyBacklog     int // the backlogged configuration's backlog (-key-backlog)
	modes          []mode
	configs        []stageConfig
	variants       []variant
	river          string // the river-bench binary; "" for no River row
	latencyRate    int
	latencySeconds int
	backlog        bool
	raceRuns       bool // -race: the racing producers' latency instead of the rounds
	backlogN       int
	// backlogConfigs are the configurations a -backlog drain runs at, one
	// drain each, side by side (-backlog-configs: bench alone by default).
	backlogConfigs []stageConfig
	// historyRows: the history figure's size (-history; 0: none).
	historyRows int
	// splitN: the split figure's messages (-split; 0: none).
	splitN int
	// splitParent: the split figure's stage a, where it is not the bench
	// configuration's (-split-parallelism, -split-queue-limit; 0: the
	// bench configuration's).
	splitParent    stageConfig
	server         string
	dbName         string
	dispatch       string
	dispatchBefore string
	cpuProfile     string
	skipPgbench    bool
	keep           bool
	timeout        time.Duration

	url         string // the bench database
	dir         string // configuration, scripts, logs
	pgbench     string // the pgbench binary
	self        string // this binary: the write-mode stage program
	answerLink  string // the answer-mode stage program: a link to self
	messageLink string // the message-mode stage program: a link to self
	relayLink   string // the relay modes' worker: a link to self
	pythonStage string // python mode's stage program, a script in dir
	// payloadBytes, when above 0, is the size of each message's payload.
	payloadBytes int
	// dispatchEnv is added to the next pepsi-dispatch's environment (the relay
	// modes' addresses).
	dispatchEnv []string
	// splitSingle: each round of -split also runs the split at SESSIONS = 1.
	splitSingle bool
	libraryLink string // the library-mode stage program: a link to self

	// refused holds, per mode, why the dispatcher refused that mode's stages
	// (answer mode against a dispatcher without the "0 >TARGET" protocol); a
	// refused mode is not run again.
	refused map[mode]string

	// ingestSeconds: how long each pgbench run of the ingest figure lasts (0: none).
	ingestSeconds int
	// enqueueAfterStart: each run's messages are enqueued once pepsi-dispatch
	// runs on the empty queue (-enqueue-after-start).
	enqueueAfterStart bool
}

// round is what one side-by-side measurement found.
type round struct {
	tps    float64       // pgbench transactions per second
	commit time.Duration // CPU time of one pgbench commit; 0 if unknown
	pipes  map[variant]pipeResult
	river  riverResult
}

// pipeResult is what one pipeline run found.
type pipeResult struct {
	hops    float64       // hops per second
	elapsed time.Duration // dispatcher start to last done
	cpu     pipelineCPU   // CPU time the pipeline took; zero if unknown
	// versionsPerHop is pepsi.queue's row updates (pg_stat_user_tables.n_tup_upd)
	// per hop: 8/3 when stages write their transitions (per message: three
	// claims, three stage writes, two requeues), 2 when they answer them (three
	// claims, three dispatcher writes). 0 if unknown.
	versionsPerHop float64
	// rssPeakKiB is pepsi-dispatch's peak resident set (VmHWM) over the run,
	// in KiB; 0 if unknown.
	rssPeakKiB int64
	// txns describes the dispatcher's queue transactions (transactions); "" if
	// unknown.
	txns string
}

// pipelineCPU is the CPU time of a pipeline run: pepsi-dispatch with the workers
// it reaped, and the database backends that served them.
type pipelineCPU struct {
	programs, backends time.Duration
}

// errRefused marks a run whose stages the dispatcher took for protocol errors.
var errRefused = errors.New("the dispatcher refused the stages' answers")

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
	if b.raceRuns {
		err := b.runRaces(ctx)
		if err != nil && !errors.Is(err, errRefused) {
			keep = true
		}
		return err
	}
	if b.historyRows > 0 {
		return b.runHistory(ctx)
	}
	if b.splitN > 0 {
		if err := b.runSplits(ctx); err != nil {
			keep = true
			return err
		}
		return nil
	}
	if b.backlog {
		err := b.runBacklogs(ctx)
		if err != nil && !errors.Is(err, errRefused) {
			keep = true
		}
		return err
	}
	fmt.Fprintf(b.out, "pepsi-bench: %d rounds; pgbench -c %d -j 2 -T %d (one single-row INSERT per transaction); "+
		"pipeline a -> b -> c -> done, %d messages (%d hops)%s, modes %s, configurations %s%s\n",
		b.rounds, b.clients, b.seconds, b.n, hopsPerMessage*b.n, b.enqueueNote(), joinModes(b.modes), joinConfigs(b.configs), b.riverNote())
	var rounds []round
	for i := 1; i <= b.rounds; i++ {
		r, err := b.round(ctx, i)
		if err != nil {
			keep = true
			return fmt.Errorf("round %d: %w", i, err)
		}
		rounds = append(rounds, r)
	}
	fmt.Fprintln(b.out)
	fmt.Fprint(b.out, b.table(rounds))
	if b.latencySeconds > 0 {
		fmt.Fprintln(b.out)
		for _, m := range b.modes {
			if why, ok := b.refused[m]; ok {
				fmt.Fprintf(b.out, "latency, %s mode: not measured: %s\n", m, why)
				continue
			}
			l, err := b.runLatency(ctx, variant{mode: m, cfg: b.benchConfig})
			if errors.Is(err, errRefused) {
				b.refuse(m, err)
				fmt.Fprintf(b.out, "latency, %s mode: not measured: %s\n", m, b.refused[m])
				continue
			}
			if err != nil {
				keep = true
				return fmt.Errorf("latency, %s mode: %w", m, err)
			}
			fmt.Fprintf(b.out, "latency, %s mode: %s\n", m, l)
		}
	}
	if err := b.ingest(ctx); err != nil {
		keep = true
		return fmt.Errorf("ingest: %w", err)
	}
	return b.refusedError()
}

// refusedError is the run's verdict when a requested mode could not be measured.
func (b *bench) refusedError() error {
	if len(b.refused) == 0 {
		return nil
	}
	var ms []string
	for _, m := range b.modes {
		if _, ok := b.refused[m]; ok {
			ms = append(ms, string(m))
		}
	}
	return fmt.Errorf("%w: mode %s not measured (see above); -modes write measures the rest alone", errRefused, strings.Join(ms, ", "))
}

// refusedShort is what the table and the latency lines say of a refused mode;
// the whole error, with the dispatcher's log line, is printed once.
const refusedShort = "this pepsi-dispatch refuses the \"0 >TARGET\" answers (protocol error: see above)"

// refuse records that the dispatcher refused mode m and says so at once.
func (b *bench) refuse(m mode, err error) {
	if _, done := b.refused[m]; done {
		return
	}
	b.refused[m] = refusedShort
	fmt.Fprintf(b.out, "%s mode NOT MEASURED: %v\n", m, err)
}

// enqueueNote says when a pipeline run's messages are enqueued, if not before
// pepsi-dispatch starts (-enqueue-after-start).
func (b *bench) enqueueNote() string {
	if !b.enqueueAfterStart {
		return ""
	}
	return " enqueued a second after pepsi-dispatch connected to the empty queue (100,000 an INSERT), timed from the first insert"
}

func (b *bench) riverNote() string {
	if b.river == "" {
		return "; no River (-river)"
	}
	return fmt.Sprintf("; River drains %d no-op jobs", hopsPerMessage*b.n)
}

func joinModes(ms []mode) string {
	s := make([]string, len(ms))
	for i, m := range ms {
		s[i] = string(m)
	}
	return strings.Join(s, ",")
}

func joinConfigs(cs []stageConfig) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.String()
	}
	return strings.Join(s, ", ")
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
	if b.dispatch, err = dispatchproc.Find(b.dispatch); err != nil {
		return err
	}
	if !b.skipPgbench && !b.backlog && !b.raceRuns && b.historyRows == 0 {
		if b.pgbench, err = findPgbench(); err != nil {
			return err
		}
	}
	if b.river != "" && !isExecutable(b.river) {
		return fmt.Errorf("-river %s: not an executable file (make bench-peers builds bin/river-bench)", b.river)
	}
	u, _ := url.Parse(b.server) // checked by run
	u.Path = "/" + b.dbName
	b.url = u.String()
	if b.dir, err = os.MkdirTemp("", "pepsi-bench-"); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	b.answerLink = filepath.Join(b.dir, answerProgram)
	if err := os.Symlink(b.self, b.answerLink); err != nil {
		return fmt.Errorf("the answer-mode stage program: %w", err)
	}
	b.libraryLink = filepath.Join(b.dir, libraryProgram)
	if err := os.Symlink(b.self, b.libraryLink); err != nil {
		return fmt.Errorf("the library-mode stage program: %w", err)
	}
	if err := b.linkPrograms(); err != nil {
		return err
	}
	b.refused = map[mode]string{}
	return nil
}

// round measures pgbench, then each pipeline variant, then River, each on a
// fresh database, and prints what it found.
func (b *bench) round(ctx context.Context, i int) (round, error) {
	r := round{pipes: map[variant]pipeResult{}}
	if !b.skipPgbench {
		if err := b.freshDatabase(ctx); err != nil {
			return r, err
		}
		tps, commit, err := b.runPgbench(ctx)
		if err != nil {
			return r, err
		}
		r.tps, r.commit = tps, commit
		fmt.Fprintf(b.out, "round %d: pgbench %d clients: %.0f tps%s\n", i, b.clients, tps, commitNote(commit))
	}
	for _, v := range b.variants {
		if _, ok := b.refused[v.mode]; ok {
			continue
		}
		p, err := b.runPipeline(ctx, v, fmt.Sprintf("%d.%s-%s", i, v.mode, v.cfg.name))
		if errors.Is(err, errRefused) {
			b.refuse(v.mode, err)
			continue
		}
		if err != nil {
			return r, fmt.Errorf("%s: %w", v, err)
		}
		r.pipes[v] = p
		fmt.Fprintf(b.out, "round %d: %s: %s\n", i, v, p.line(r.tps))
	}
	if b.river != "" {
		rr, err := b.runRiver(ctx)
		if err != nil {
			return r, err
		}
		r.river = rr
		fmt.Fprintf(b.out, "round %d: %s\n", i, rr.text)
	}
	return r, nil
}

func commitNote(commit time.Duration) string {
	if commit <= 0 {
		return ""
	}
	return fmt.Sprintf(" (CPU per commit %.0f µs)", float64(commit.Nanoseconds())/1000)
}

// line is one pipeline run's result.
func (p pipeResult) line(tps float64) string {
	s := fmt.Sprintf("%.0f hops/s (%.2f s", p.hops, p.elapsed.Seconds())
	if tps > 0 {
		s = fmt.Sprintf("%.0f hops/s = %.2f× pgbench (%.2f s", p.hops, p.hops/tps, p.elapsed.Seconds())
	}
	if us, ok := p.cpuPerHop(); ok {
		s += fmt.Sprintf("; CPU per hop %.0f µs: dispatcher and workers %.0f, their backends %.0f",
			us, us*float64(p.cpu.programs)/float64(p.cpu.programs+p.cpu.backends),
			us*float64(p.cpu.backends)/float64(p.cpu.programs+p.cpu.backends))
	}
	if p.versionsPerHop > 0 {
		s += fmt.Sprintf("; %.2f row versions per hop", p.versionsPerHop)
	}
	if p.rssPeakKiB > 0 {
		s += fmt.Sprintf("; pepsi-dispatch peak RSS %.1f MiB", float64(p.rssPeakKiB)/1024)
	}
	if p.txns != "" {
		s += "; " + p.txns
	}
	return s + ")"
}

// cpuPerHop is the pipeline's CPU time per hop in microseconds, which other load
// on the machine disturbs far less than its hops/s.
func (p pipeResult) cpuPerHop() (float64, bool) {
	if p.cpu.backends == 0 || p.hops == 0 {
		return 0, false
	}
	hops := p.hops * p.elapsed.Seconds()
	return float64((p.cpu.programs + p.cpu.backends).Microseconds()) / hops, true
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
