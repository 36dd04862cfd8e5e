package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/tools/internal/dispatchproc"
)

// confTemplate is the pipeline's pepsi.conf. The dispatcher's intervals are long
// enough that no poll, flush or reap happens during a run unless the pipeline
// asks for it.
const confTemplate = `# pepsi-bench: a -> b -> c -> done, trivial stages.
[pepsi]
DATABASE = %s

[pepsi-dispatch]
MAX_RUNTIME = 60
WORKER_IDLE_TIMEOUT = 5
POLL_INTERVAL = 30
STATS_INTERVAL = %s
`

const stageTemplate = `
[stage-%s]
PROGRAM = %s
PARALLELISM = %d
QUEUE_LIMIT = %d
MAX_MESSAGES = %d
`

// sessionsLine is the [pepsi-dispatch] line that sets SESSIONS to n, none for 0.
func sessionsLine(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf("SESSIONS = %d\n", n)
}

// confText is the pipeline's pepsi.conf for variant v: the three stages, each
// served by the program of v's mode. statsInterval is the dispatcher's
// STATS_INTERVAL ("60" but for the backlog drain, which samples the statistics).
func (b *bench) confText(v variant, statsInterval string) string {
	program := b.self
	switch v.mode {
	case modeAnswer:
		program = b.answerLink
	case modeLibrary:
		program = b.libraryLink
	case modeMessage:
		program = b.messageLink
	case modePython:
		program = b.pythonStage
	case modeRelay1, modeRelay10:
		program = b.relayLink
	}
	text := fmt.Sprintf(confTemplate, b.url, statsInterval) + sessionsLine(v.cfg.sessions)
	for _, st := range []string{stageA, stageB, stageC} {
		text += fmt.Sprintf(stageTemplate, st, program, v.cfg.parallelism, v.cfg.queueLimit, v.cfg.maxMessages)
		if v.mode.message() {
			text += "INPUT = message\n"
		}
		if v.cfg.rate != "" {
			text += "RATE = " + v.cfg.rate + "\n"
		}
		if v.cfg.maxPending > 0 && st != stageA {
			text += "MAX_PENDING = " + strconv.Itoa(v.cfg.maxPending) + "\n"
		}
		if v.cfg.historyOff {
			text += "HISTORY = off\n"
		}
	}
	return text
}

// writeConf checks and writes the configuration of one run.
func (b *bench) writeConf(v variant, statsInterval, tag string) (string, error) {
	text := b.confText(v, statsInterval)
	confFile := filepath.Join(b.dir, "bench."+tag+".conf")
	if _, err := conf.Parse(confFile, text); err != nil {
		return "", fmt.Errorf("the bench configuration: %w", err)
	}
	return confFile, os.WriteFile(confFile, []byte(text), 0o600)
}

// freshQueue makes a fresh bench database with the schema and n messages
// enqueued at stage a, with the order keys cfg gives them (and, first, the
// key backlog it asks for), vacuumed and analysed, and returns a connection
// to it.
func (b *bench) freshQueue(ctx context.Context, n int, cfg stageConfig) (*pgx.Conn, error) {
	conn, err := b.migrated(ctx)
	if err != nil {
		return nil, err
	}
	if err := enqueueKeyBacklog(ctx, conn, cfg.keyBacklog); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	if err := b.enqueue(ctx, conn, n, cfg); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	// A real queue has statistics; the claim's plan is tested either way. The
	// checkpoint writes the inserts' pages out before the run, so that a run
	// beside a key's backlog of a million rows does not pay for writing them.
	for _, sql := range []string{"VACUUM ANALYZE pepsi.queue", "CHECKPOINT"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("%s: %w", sql, err)
		}
	}
	return conn, nil
}

// enqueue enqueues n messages at stage a, with the order keys cfg gives them,
// in slices, so that a backlog of a million rows is not one huge statement.
func (b *bench) enqueue(ctx context.Context, conn *pgx.Conn, n int, cfg stageConfig) error {
	for done := 0; done < n; done += enqueueSlice {
		if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload, order_key)
			SELECT $1, CASE WHEN $4::int > 0 THEN convert_to(repeat('x', $4::int), 'UTF8') ELSE convert_to('message ' || g, 'UTF8') END,
				CASE WHEN $5 THEN 'k' || g WHEN $6::int > 0 THEN 'k' || (g % $6::int) END
			FROM generate_series($2::int, $3::int) g`,
			stageA, done+1, min(n, done+enqueueSlice), b.payloadBytes, cfg.keyed, cfg.keys); err != nil {
			return fmt.Errorf("enqueue %d messages: %w", n, err)
		}
	}
	return nil
}

// enqueueSlice is how many messages one INSERT of enqueue enqueues.
const enqueueSlice = 100000

// backlogKey is the order key of the backlogged configuration's backlog.
const backlogKey = "backlog"

// enqueueKeyBacklog enqueues n messages of backlogKey (none for n = 0): a
// head paused for ever (a timeout of 'infinity' is never due), so the key is
// held all run long, and n − 1 messages the insert trigger makes blocked
// behind it, as a producer's would be.
func enqueueKeyBacklog(ctx context.Context, conn *pgx.Conn, n int) error {
	if n == 0 {
		return nil
	}
	if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload, order_key, status, timeout)
		VALUES ($1, convert_to('backlog head', 'UTF8'), $2, 'paused', 'infinity')`, stageA, backlogKey); err != nil {
		return fmt.Errorf("enqueue the key backlog's head: %w", err)
	}
	for done := 1; done < n; done += enqueueSlice {
		if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload, order_key)
			SELECT $1, convert_to('backlog ' || g, 'UTF8'), $2 FROM generate_series($3::int, $4::int) g`,
			stageA, backlogKey, done+1, min(n, done+enqueueSlice)); err != nil {
			return fmt.Errorf("enqueue the key backlog of %d messages: %w", n, err)
		}
	}
	return nil
}

// checkKeyBacklog checks that the key backlog of n messages (none for n = 0)
// waited all run: its head paused, the rest blocked, so the run measured the
// others beside a held key, not a key draining.
func checkKeyBacklog(ctx context.Context, conn *pgx.Conn, n int) error {
	if n == 0 {
		return nil
	}
	var paused, blocked int
	if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'paused'), count(*) FILTER (WHERE status = 'blocked')
		FROM pepsi.queue WHERE order_key = $1`, backlogKey).Scan(&paused, &blocked); err != nil {
		return fmt.Errorf("read the key backlog: %w", err)
	}
	if paused != 1 || blocked != n-1 {
		return fmt.Errorf("the key backlog: %d paused and %d blocked messages after the run; want 1 and %d", paused, blocked, n-1)
	}
	return nil
}

// runPipeline enqueues b.n messages at stage a, starts pepsi-dispatch on variant
// v and measures the time from its start to the last message done. It then
// stops the dispatcher and checks that every message is done and that the
// dispatcher counted every hop.
//
// The CPU time is pepsi-dispatch's and its workers' (which it reaped), and that
// of the database backends serving them, read from /proc when the server runs
// on this machine and no worker's backend can have gone away with its CPU time
// (answer-mode workers have none; write-mode workers recycle after
// MAX_MESSAGES); else zero.
func (b *bench) runPipeline(ctx context.Context, v variant, tag string) (p pipeResult, err error) {
	before := b.n
	if b.enqueueAfterStart {
		before = 0
	}
	conn, err := b.freshQueue(ctx, before, v.cfg)
	if err != nil {
		return p, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	confFile, err := b.writeConf(v, "60", tag)
	if err != nil {
		return p, err
	}
	var start time.Time
	if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&start); err != nil {
		return p, fmt.Errorf("read the server clock: %w", err)
	}
	b.dispatchEnv = nil
	if v.mode.relay() {
		env, stop, err := b.startRelays(v.mode)
		if err != nil {
			return p, fmt.Errorf("the relays: %w", err)
		}
		defer stop()
		b.dispatchEnv = env
	}
	var spans func() string
	if v.cfg.traces != "" {
		env, count, stop, err := startCollector(v.cfg.traces)
		if err != nil {
			return p, fmt.Errorf("the trace collector: %w", err)
		}
		defer stop()
		b.dispatchEnv, spans = append(b.dispatchEnv, env...), count
	}
	d, err := b.startDispatcherOf(v.cfg, confFile, tag)
	if err != nil {
		return p, err
	}
	// Killed on an early return; once it has stopped, Kill does nothing.
	defer d.Kill()
	if b.enqueueAfterStart {
		if start, err = b.enqueueBehind(ctx, conn, d, v.cfg); err != nil {
			return p, err
		}
	}
	if err := b.wait(ctx, conn, d, v, b.n, nil); err != nil {
		return p, err
	}
	var end time.Time
	if err := conn.QueryRow(ctx, "SELECT max(updated_at) FROM pepsi.queue WHERE status = 'done'").Scan(&end); err != nil {
		return p, fmt.Errorf("read the last done time: %w", err)
	}
	backendCPU, backendsKnown := backendsCPU(ctx, conn)
	if b.payloadBytes > 0 || v.cfg.traces != "" {
		p.rssPeakKiB = peakRSS(d.Pid())
	}
	if err := b.stopAndVerify(ctx, conn, d, b.n); err != nil {
		return p, err
	}
	if spans != nil {
		fmt.Fprintf(b.out, "  %s %s: %s; %s\n", v.cfg.name, tag, spans(), droppedSpans(filepath.Join(b.dir, "pepsi-dispatch."+tag+".log")))
	}
	if err := checkKeyBacklog(ctx, conn, v.cfg.keyBacklog); err != nil {
		return p, err
	}
	// The relay modes' stages are not the dispatcher's children: no CPU figure.
	noBackends := v.mode == modeAnswer || v.mode == modeMessage || v.mode == modePython
	if backendsKnown && !v.mode.relay() && (noBackends || v.cfg.maxMessages >= b.n) {
		p.cpu = pipelineCPU{programs: d.CPU(), backends: backendCPU}
	}
	p.txns = transactions(d)
	p.elapsed = end.Sub(start)
	p.hops = float64(hopsPerMessage*b.n) / p.elapsed.Seconds()
	if upd, ok := queueUpdates(ctx, conn); ok {
		p.versionsPerHop = float64(upd) / float64(hopsPerMessage*b.n)
	}
	return p, nil
}

// enqueueBehind waits until the dispatcher d runs on the empty queue (its
// sessions connected, and a second for its first claims, whose plans are
// then made), then enqueues b.n messages (enqueueSlice an INSERT) and
// returns when that began (the server's clock): -enqueue-after-start, a
// backlog that arrives at a running dispatcher. Its sessions are its lock's
// and its pool's, which runs its steps: two once it runs.
func (b *bench) enqueueBehind(ctx context.Context, conn *pgx.Conn, d *dispatchproc.Process, cfg stageConfig) (time.Time, error) {
	var start time.Time
	for tries := 0; ; tries++ {
		var sessions int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'pepsi-dispatch%'`).Scan(&sessions); err != nil {
			return start, fmt.Errorf("wait for the dispatcher's sessions: %w", err)
		}
		if sessions >= 2 {
			break
		}
		if tries > 300 {
			return start, fmt.Errorf("pepsi-dispatch opened %d sessions in %s; want 2\n%s", sessions, 300*pollEvery, d.LogTail(logTailLines))
		}
		time.Sleep(pollEvery)
	}
	time.Sleep(time.Second)
	if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&start); err != nil {
		return start, fmt.Errorf("read the server clock: %w", err)
	}
	return start, b.enqueue(ctx, conn, b.n, cfg)
}

// stopAndVerify stops the dispatcher with SIGTERM, which must make it exit 0,
// and checks the outcome of n messages (see verify).
func (b *bench) stopAndVerify(ctx context.Context, conn *pgx.Conn, d *dispatchproc.Process, n int) error {
	if code, err := d.Stop(stopWait); err != nil || code != 0 {
		return fmt.Errorf("pepsi-dispatch exited with status %d after SIGTERM (want 0): %v\n%s", code, err, d.LogTail(logTailLines))
	}
	if err := verify(ctx, conn, n); err != nil {
		return fmt.Errorf("%w\n%s", err, d.LogTail(logTailLines))
	}
	return nil
}

// queueUpdates is how many row updates pepsi.queue has had, once every other
// backend of the bench database has gone (a backend reports its counts when it
// exits at the latest); ok is false if they do not go within a few seconds.
func queueUpdates(ctx context.Context, conn *pgx.Conn) (n int64, ok bool) {
	for range 100 {
		var others int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&others); err != nil {
			return 0, false
		}
		if others == 0 {
			// A new transaction reads the statistics afresh.
			err := conn.QueryRow(ctx, "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'pepsi.queue'::regclass").Scan(&n)
			return n, err == nil
		}
		time.Sleep(pollEvery)
	}
	return 0, false
}

// wait polls until the dispatcher has counted n messages out of the pipeline. It
// reads the one row of dispatch_stats, which the dispatcher flushes when the
// pipeline goes idle: a poll that costs the machine nothing, where counting the
// queue's rows would compete with the pipeline it measures. (The end time is the
// last done row's, so how soon the poll notices does not matter; verify then
// counts the rows.) sample, when not nil, gets every poll's stage_passes and the
// time of the flush that wrote them (the server's clock).
func (b *bench) wait(ctx context.Context, conn *pgx.Conn, d *dispatchproc.Process, v variant, n int, sample func(at time.Time, passes int64)) error {
	return b.poll(ctx, d, v, n, "messages out of the pipeline", func() (int64, error) {
		var (
			left, passes int64
			at           time.Time
		)
		if err := conn.QueryRow(ctx, "SELECT messages_left, stage_passes, updated_at FROM pepsi.dispatch_stats").Scan(&left, &passes, &at); err != nil {
			return 0, err
		}
		if sample != nil {
			sample(at, passes)
		}
		return left, nil
	})
}

// poll reads progress every pollEvery until it reaches n, the dispatcher exits,
// -timeout passes or ctx ends. A worker killed for a protocol error ends the
// wait at once: in answer mode that is the dispatcher refusing "0 >TARGET"
// (errRefused). what names the progress in errors.
func (b *bench) poll(ctx context.Context, d *dispatchproc.Process, v variant, n int, what string, progress func() (int64, error)) error {
	deadline := time.After(b.timeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		got, err := progress()
		if err != nil {
			return fmt.Errorf("read progress: %w", err)
		}
		if got >= int64(n) {
			return nil
		}
		if line := protocolError(d); line != "" {
			return refusal(v.mode, line, d)
		}
		select {
		case <-tick.C:
		case <-d.Done():
			return fmt.Errorf("pepsi-dispatch exited (status %d) with %d of %d %s\n%s", d.ExitCode(), got, n, what, d.LogTail(logTailLines))
		case <-deadline:
			return fmt.Errorf("%d of %d %s within %v (-timeout)\n%s", got, n, what, b.timeout, d.LogTail(logTailLines))
		case <-ctx.Done():
			return fmt.Errorf("interrupted: %w", ctx.Err())
		}
	}
}

// refusal is the error for a run whose worker the dispatcher killed for a
// protocol error, logged in line.
func refusal(m mode, line string, d *dispatchproc.Process) error {
	if m.answers() {
		return fmt.Errorf("%w: this pepsi-dispatch does not accept status lines that carry the transition "+
			"(\"0 >b\", \"0 >done\"): it killed the %s-mode worker for a protocol error. The \"0 >TARGET\" "+
			"protocol (docs/protocol.md, issue 9) is not in this build; -modes write measures the rest. Its log: %s", errRefused, m, line)
	}
	return fmt.Errorf("a %s-mode worker broke the protocol: %s\n%s", m, line, d.LogTail(logTailLines))
}

// verify checks that every message is done and that the dispatcher's statistics
// (flushed at shutdown) count every hop, so a fast but wrong run cannot pass.
func verify(ctx context.Context, conn *pgx.Conn, n int) error {
	var done, passes, left int64
	err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pepsi.queue WHERE status = 'done'),
		stage_passes, messages_left FROM pepsi.dispatch_stats`).Scan(&done, &passes, &left)
	if err != nil {
		return fmt.Errorf("read the outcome: %w", err)
	}
	if done != int64(n) {
		return fmt.Errorf("%d messages done, want %d", done, n)
	}
	if want := int64(hopsPerMessage * n); passes != want || left != int64(n) {
		return fmt.Errorf("dispatch_stats: stage_passes = %d, messages_left = %d; want %d and %d", passes, left, want, n)
	}
	return nil
}

// peakRSS is the peak resident set of process pid in KiB (VmHWM of
// /proc/PID/status), 0 where that cannot be read.
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib); err == nil {
				return kib
			}
		}
	}
	return 0
}

// startDispatcher starts pepsi-dispatch on confFile, logging information,
// warnings and errors to a file named for tag in the working directory, with
// its CPU profile if -cpuprofile asks and b.dispatchEnv added to its
// environment. Information, not only warnings: the summary of its queue
// transactions at the end is logged at info (transactions).
func (b *bench) startDispatcher(confFile, tag string) (*dispatchproc.Process, error) {
	args := []string{"-log-level", "info"}
	if b.cpuProfile != "" {
		args = append(args, "-cpuprofile", b.cpuProfile+"."+tag)
	}
	return dispatchproc.Start(dispatchproc.Config{Binary: b.dispatch, Conf: confFile, Args: args,
		Log: filepath.Join(b.dir, "pepsi-dispatch."+tag+".log"), Env: b.dispatchEnv})
}

// startDispatcherOf is startDispatcher with the binary of configuration c:
// the -dispatch-before one for the before configuration.
func (b *bench) startDispatcherOf(c stageConfig, confFile, tag string) (*dispatchproc.Process, error) {
	if !c.before {
		return b.startDispatcher(confFile, tag)
	}
	if b.dispatchBefore == "" {
		return nil, errors.New("the before configuration needs -dispatch-before BINARY")
	}
	now := b.dispatch
	defer func() { b.dispatch = now }()
	b.dispatch = b.dispatchBefore
	return b.startDispatcher(confFile, tag)
}

// logTailLines is how much of the dispatcher's log an error shows.
const logTailLines = 30

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux
// architecture Go runs on.
const clockTicks = 100

// backendsCPU sums the CPU time of the other backends connected to the bench
// database (the dispatcher's and its workers'), read from /proc/PID/stat. known
// is false if any cannot be read (the server is not on this machine).
func backendsCPU(ctx context.Context, conn *pgx.Conn) (cpu time.Duration, known bool) {
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
	if err != nil {
		return 0, false
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) == 0 {
		return 0, false
	}
	var ticks int64
	for _, pid := range pids {
		text, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, false
		}
		// Fields after the command, which is in parentheses and may hold spaces:
		// state is the 3rd field, utime the 14th and stime the 15th.
		rest := string(text)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 13 {
			return 0, false
		}
		for _, s := range f[11:13] {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, false
			}
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks, true
}

// transactions describes the dispatcher's queue transactions from the summary
// it logs at its end: how many, the items (rows resolved and claimed) each
// carried, how long each took, and the loop's turnaround from one to the next.
// They run one at a time, so this is where a run's time went
// (docs/performance.md). "" if the log has no summary.
func transactions(d *dispatchproc.Process) string {
	text, err := os.ReadFile(d.Log)
	if err != nil {
		return ""
	}
	var summary string
	for _, line := range strings.Split(string(text), "\n") {
		if strings.Contains(line, `msg="queue transactions"`) {
			summary = line
		}
	}
	if summary == "" {
		return ""
	}
	f := map[string]string{}
	for _, kv := range strings.Fields(summary) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			f[k] = v
		}
	}
	return fmt.Sprintf("%s transactions of %s items, %s each, %s from one to the next", f["count"], f["items_mean"], f["mean"], f["turnaround_mean"])
}

// protocolMarks are what the dispatcher logs when it kills a worker for a
// protocol error (core.protocolError, and the reason it writes for the message).
var protocolMarks = []string{"broke the protocol", "protocol error"}

// protocolError is the first line of the dispatcher's log that reports a protocol
// error, or "". The log holds a few lines while all goes well (information at
// start and end, warnings), so reading it whole each poll costs nothing.
func protocolError(d *dispatchproc.Process) string {
	text, err := os.ReadFile(d.Log)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(text), "\n") {
		for _, m := range protocolMarks {
			if strings.Contains(line, m) {
				return line
			}
		}
	}
	return ""
}
