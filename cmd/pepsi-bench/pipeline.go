package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/shell/schema"
)

// findDispatch looks for pepsi-dispatch next to pepsi-bench (both are built into
// bin/), then on PATH.
func findDispatch(self string) (string, error) {
	p := filepath.Join(filepath.Dir(self), "pepsi-dispatch")
	if isExecutable(p) {
		return p, nil
	}
	if p, err := exec.LookPath("pepsi-dispatch"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("pepsi-dispatch is neither next to pepsi-bench (%s) nor on PATH: run \"make build\" (or -dispatch FILE)", p)
}

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
STATS_INTERVAL = 60
`

const stageTemplate = `
[stage-%s]
PROGRAM = %s
PARALLELISM = %d
QUEUE_LIMIT = %d
MAX_MESSAGES = %d
`

// runPipeline applies the schema, enqueues the messages at stage a, starts
// pepsi-dispatch and returns the time from its start to the last message done.
// It then stops the dispatcher and checks that every message is done and that
// the dispatcher counted every hop.
//
// cpu is the CPU time the pipeline took: pepsi-dispatch's and its workers' (which
// it reaped), and that of the database backends serving them, read from /proc
// when the server runs on this machine and no worker recycled (else zero).
func (b *bench) runPipeline(ctx context.Context, i int) (elapsed time.Duration, cpu pipelineCPU, err error) {
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		return 0, cpu, fmt.Errorf("connect to the bench database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := schema.Migrate(ctx, conn); err != nil {
		return 0, cpu, fmt.Errorf("apply the schema: %w", err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload)
		SELECT $1, convert_to('message ' || g, 'UTF8') FROM generate_series(1, $2::int) g`, stageA, b.n); err != nil {
		return 0, cpu, fmt.Errorf("enqueue %d messages: %w", b.n, err)
	}
	// A real queue has statistics; the claim's plan is tested either way.
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE pepsi.queue"); err != nil {
		return 0, cpu, fmt.Errorf("vacuum the queue: %w", err)
	}

	text := fmt.Sprintf(confTemplate, b.url)
	for _, st := range []string{stageA, stageB, stageC} {
		text += fmt.Sprintf(stageTemplate, st, b.self, b.parallelism, b.queueLimit, b.maxMessages)
	}
	confFile := filepath.Join(b.dir, "bench.conf")
	if _, err := conf.Parse(confFile, text); err != nil {
		return 0, cpu, fmt.Errorf("the bench configuration: %w", err)
	}
	if err := os.WriteFile(confFile, []byte(text), 0o600); err != nil {
		return 0, cpu, err
	}

	var start time.Time
	if err := conn.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&start); err != nil {
		return 0, cpu, fmt.Errorf("read the server clock: %w", err)
	}
	d, err := b.startDispatcher(confFile, i)
	if err != nil {
		return 0, cpu, err
	}
	stopped := false
	defer func() {
		if !stopped { // an early return: do not leave the dispatcher running
			d.kill()
		}
	}()
	if err := b.wait(ctx, conn, d); err != nil {
		return 0, cpu, fmt.Errorf("%w\n%s", err, d.logTail())
	}
	var end time.Time
	if err := conn.QueryRow(ctx, "SELECT max(updated_at) FROM pepsi.queue WHERE status = 'done'").Scan(&end); err != nil {
		return 0, cpu, fmt.Errorf("read the last done time: %w", err)
	}
	backendCPU, backendsKnown := backendsCPU(ctx, conn)
	stopped = true
	if code, err := d.stop(); err != nil || code != 0 {
		return 0, cpu, fmt.Errorf("pepsi-dispatch exited with status %d after SIGTERM (want 0): %v\n%s", code, err, d.logTail())
	}
	if err := b.verify(ctx, conn); err != nil {
		return 0, cpu, fmt.Errorf("%w\n%s", err, d.logTail())
	}
	// A worker that recycled took its backend's CPU time with it: the sum is
	// only complete when no worker can have reached MAX_MESSAGES.
	if backendsKnown && b.maxMessages >= b.n {
		cpu = pipelineCPU{programs: d.cpu(), backends: backendCPU}
	}
	return end.Sub(start), cpu, nil
}

// wait polls until the dispatcher has counted every message out of the
// pipeline. It reads the one row of dispatch_stats, which the dispatcher flushes
// when the pipeline goes idle: a poll that costs the machine nothing, where
// counting the queue's rows would compete with the pipeline it measures. (The
// end time is the last done row's, so how soon the poll notices does not
// matter; verify then counts the rows.)
func (b *bench) wait(ctx context.Context, conn *pgx.Conn, d *dispatcher) error {
	deadline := time.After(b.timeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		var left int64
		if err := conn.QueryRow(ctx, "SELECT messages_left FROM pepsi.dispatch_stats").Scan(&left); err != nil {
			return fmt.Errorf("read progress: %w", err)
		}
		if left >= int64(b.n) {
			return nil
		}
		select {
		case <-tick.C:
		case code := <-d.exited:
			d.exited <- code
			return fmt.Errorf("pepsi-dispatch exited (status %d) with %d of %d messages out of the pipeline", code, left, b.n)
		case <-deadline:
			return fmt.Errorf("the pipeline did not finish within %v (-timeout): %d of %d messages out", b.timeout, left, b.n)
		case <-ctx.Done():
			return fmt.Errorf("interrupted: %w", ctx.Err())
		}
	}
}

// verify checks that every message is done and that the dispatcher's statistics
// (flushed at shutdown) count every hop, so a fast but wrong run cannot pass.
func (b *bench) verify(ctx context.Context, conn *pgx.Conn) error {
	var done, passes, left int64
	err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pepsi.queue WHERE status = 'done'),
		stage_passes, messages_left FROM pepsi.dispatch_stats`).Scan(&done, &passes, &left)
	if err != nil {
		return fmt.Errorf("read the outcome: %w", err)
	}
	if done != int64(b.n) {
		return fmt.Errorf("%d messages done, want %d", done, b.n)
	}
	if want := int64(hopsPerMessage * b.n); passes != want || left != int64(b.n) {
		return fmt.Errorf("dispatch_stats: stage_passes = %d, messages_left = %d; want %d and %d", passes, left, want, b.n)
	}
	return nil
}

// dispatcher is one running pepsi-dispatch.
type dispatcher struct {
	cmd    *exec.Cmd
	log    string
	exited chan int // its exit status, once
}

func (b *bench) startDispatcher(confFile string, i int) (*dispatcher, error) {
	logFile := filepath.Join(b.dir, fmt.Sprintf("pepsi-dispatch.%d.log", i))
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	args := []string{"-c", confFile, "-log-level", "warn"}
	if b.cpuProfile != "" {
		args = append(args, "-cpuprofile", fmt.Sprintf("%s.%d", b.cpuProfile, i))
	}
	cmd := exec.Command(b.dispatch, args...)
	// The programs read their database from the configuration: a PEPSI_*
	// variable of ours must not override it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PEPSI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", b.dispatch, err)
	}
	d := &dispatcher{cmd: cmd, log: logFile, exited: make(chan int, 1)}
	go func() {
		_ = cmd.Wait() // the exit status is read from ProcessState
		f.Close()
		d.exited <- cmd.ProcessState.ExitCode()
	}()
	return d, nil
}

// stop sends SIGTERM and waits for the exit status.
func (d *dispatcher) stop() (int, error) {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return -1, fmt.Errorf("signal pepsi-dispatch: %w", err)
	}
	select {
	case code := <-d.exited:
		return code, nil
	case <-time.After(stopWait):
		d.kill()
		return -1, fmt.Errorf("pepsi-dispatch did not exit within %v of SIGTERM; killed it", stopWait)
	}
}

func (d *dispatcher) kill() {
	_ = d.cmd.Process.Kill() // it may have exited already
	code := <-d.exited
	d.exited <- code
}

// cpu is the user and system time of the exited dispatcher and of the workers it
// reaped (wait4 reports both).
func (d *dispatcher) cpu() time.Duration {
	st := d.cmd.ProcessState
	if st == nil {
		return 0
	}
	return st.UserTime() + st.SystemTime()
}

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

// logTail is the end of the dispatcher's log, for error messages.
func (d *dispatcher) logTail() string {
	text, err := os.ReadFile(d.log)
	if err != nil || len(text) == 0 {
		return "(pepsi-dispatch logged nothing)"
	}
	lines := strings.Split(strings.TrimRight(string(text), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return "--- the end of pepsi-dispatch's log (" + d.log + ") ---\n" + strings.Join(lines, "\n")
}
