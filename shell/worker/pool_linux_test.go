package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
)

// The tests run real processes: the test binary itself, re-executed with
// modeEnv selecting a behaviour (see runMode), and small sh scripts.
const modeEnv = "PEPSI_WORKER_TEST_MODE"

// within bounds every wait for an event: generous, as the race detector and a
// shared machine slow processes down, but finite.
const within = 20 * time.Second

func TestMain(m *testing.M) {
	if mode := os.Getenv(modeEnv); mode != "" {
		os.Exit(runMode(mode))
	}
	os.Exit(m.Run())
}

// runMode is the test binary acting as a stage program (or, for
// "fake-dispatcher", as a dispatcher).
func runMode(mode string) int {
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	answerZero := func() {
		for in.Scan() {
			say("0")
		}
	}
	switch mode {
	case "zero": // answers "0" per id; exits 0 at end of input
		answerZero()
	case "id": // answers "0 ID" per id
		for in.Scan() {
			say("0 %s", in.Text())
		}
	case "chunks": // answers "ID K" per id, K counting the read(2) calls
		buf := make([]byte, 1<<20)
		for k := 1; ; k++ {
			n, err := os.Stdin.Read(buf)
			for _, id := range strings.Fields(string(buf[:n])) {
				say("%s %d", id, k)
			}
			if err != nil {
				return 0
			}
		}
	case "args": // first line: its arguments and stage, then like "zero"
		count := 0
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "PEPSI_STAGE=") {
				count++
			}
		}
		say("args=%s stage=%s stage_vars=%d", strings.Join(os.Args[1:], ","), os.Getenv("PEPSI_STAGE"), count)
		answerZero()
	case "filterargs": // first line: its arguments, PEPSI_INPUT and the database variables it got, then like "zero"
		var db []string
		for _, kv := range os.Environ() {
			if NamesDatabase(kv) {
				name, _, _ := strings.Cut(kv, "=")
				db = append(db, name)
			}
		}
		say("args=%s input=%s db=%s", strings.Join(os.Args[1:], ","), os.Getenv("PEPSI_INPUT"), strings.Join(db, ","))
		answerZero()
	case "stderr": // complains on stderr, one line too long, then like "zero"
		fmt.Fprint(os.Stderr, "first complaint\nsecond complaint\r\n")
		fmt.Fprint(os.Stderr, strings.Repeat("e", lineMax+100)+"\n")
		answerZero()
	case "exit7": // like "zero", then exits 7
		answerZero()
		return 7
	case "longline": // a line over the limit, a CRLF line, a last line without newline
		say("%s", strings.Repeat("x", lineMax+5000))
		fmt.Fprint(out, "0\r\ntail")
		out.Flush()
	case "hang": // never reads, never answers
		time.Sleep(time.Hour)
	case "fake-dispatcher": // spawns a hung worker, prints its pid, waits to be killed
		p := NewPool(Options{Env: withMode(os.Environ(), "hang"), Events: func(core.Event) {}})
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ev := p.Spawn(1, "s", self)
		started, ok := ev.(core.WorkerStarted)
		if !ok {
			fmt.Fprintln(os.Stderr, ev)
			return 1
		}
		say("%d", started.PID)
		time.Sleep(time.Hour)
	default:
		fmt.Fprintf(os.Stderr, "unknown %s %q\n", modeEnv, mode)
		return 2
	}
	return 0
}

// withMode returns env with modeEnv set to mode (and no other value of it).
func withMode(env []string, mode string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, modeEnv+"=") {
			out = append(out, kv)
		}
	}
	return append(out, modeEnv+"="+mode)
}

func selfPath(t testing.TB) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("os.Executable: %v", err)
	}
	return self
}

// recorder collects the events a Pool reports.
type recorder struct{ ch chan core.Event }

func (r *recorder) events(e core.Event) { r.ch <- e }

// next returns the next event, failing the test if none comes in time.
func (r *recorder) next(t testing.TB) core.Event {
	t.Helper()
	select {
	case e := <-r.ch:
		return e
	case <-time.After(within):
		t.Fatalf("expected an event within %v, got none", within)
		return nil
	}
}

// answers expects the next n events to be Answers of worker id and returns them.
func (r *recorder) answers(t testing.TB, id core.WorkerID, n int) []string {
	t.Helper()
	lines := make([]string, 0, n)
	for len(lines) < n {
		e := r.next(t)
		a, ok := e.(core.Answer)
		if !ok || a.Worker != id {
			t.Fatalf("expected answer %d of %d from %s, got %v", len(lines)+1, n, id, e)
		}
		lines = append(lines, a.Line)
	}
	return lines
}

// exit expects the next event to be the exit of worker id.
func (r *recorder) exit(t testing.TB, id core.WorkerID) core.WorkerExited {
	t.Helper()
	e := r.next(t)
	x, ok := e.(core.WorkerExited)
	if !ok || x.Worker != id {
		t.Fatalf("expected %s to exit, got %v", id, e)
	}
	return x
}

// syncBuffer is a buffer safe for the pool's concurrent logging.
type syncBuffer struct{ lockedbuf.Buffer }

// records returns the JSON log records written so far.
func (b *syncBuffer) records(t testing.TB) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %v: %q", err, line)
		}
		recs = append(recs, rec)
	}
	return recs
}

type harness struct {
	pool *Pool
	rec  *recorder
	logs *syncBuffer
	self string
}

// newHarness returns a pool whose workers (the test binary) run mode, whose
// events go to a recorder and whose logs go to a buffer. At test end it closes the
// pool and checks that no per-worker goroutine is left.
func newHarness(t *testing.T, mode string, tweak ...func(*Options)) *harness {
	t.Helper()
	h := &harness{rec: &recorder{ch: make(chan core.Event, 1<<16)}, logs: &syncBuffer{}, self: selfPath(t)}
	o := Options{
		Env:    withMode(os.Environ(), mode),
		Log:    slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Events: h.rec.events,
	}
	for _, f := range tweak {
		f(&o)
	}
	h.pool = NewPool(o)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		if err := h.pool.Close(ctx); err != nil {
			t.Errorf("expected every worker reaped at close, got %v", err)
		}
		if n := h.pool.goroutines.Load(); n != 0 {
			t.Errorf("expected no per-worker goroutine left after every worker was reaped, got %d", n)
		}
	})
	return h
}

// spawn starts a worker of stage running program and fails the test unless it started.
func (h *harness) spawn(t *testing.T, id core.WorkerID, stage, program string) core.WorkerStarted {
	t.Helper()
	ev := h.pool.Spawn(id, stage, program)
	started, ok := ev.(core.WorkerStarted)
	if !ok || started.Worker != id || started.PID <= 0 {
		t.Fatalf("expected %s started with a pid, got %v", id, ev)
	}
	return started
}

// script writes an executable sh script into a temporary directory.
func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stage.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatalf("write script: %v", err)
	}
	return path
}

func TestEchoWorkerAnswersZeroPerIDThenExitsZeroOnStop(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "zero")
	h.spawn(t, 1, "enrich", h.self)
	h.pool.Write(1, []int64{10, 11, 12})
	h.pool.Stop(1)
	got := h.rec.answers(t, 1, 3)
	if strings.Join(got, "|") != "0|0|0" {
		t.Fatalf("expected answers 0|0|0, got %q", got)
	}
	if x := h.rec.exit(t, 1); x.Code != 0 || x.Signal != "" {
		t.Fatalf("expected exit code 0 without signal, got %v", x)
	}
}

func TestIDsOfOneWriteArriveInOneBufferAndAreAnsweredInOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "chunks")
	h.spawn(t, 1, "s", h.self)
	h.pool.Write(1, []int64{11, 12, 13})
	if got := strings.Join(h.rec.answers(t, 1, 3), "|"); got != "11 1|12 1|13 1" {
		t.Fatalf("expected ids 11..13 in order from the worker's first read, got %q", got)
	}
	h.pool.Write(1, []int64{14, 15})
	if got := strings.Join(h.rec.answers(t, 1, 2), "|"); got != "14 2|15 2" {
		t.Fatalf("expected ids 14,15 in order from the worker's second read, got %q", got)
	}
}

func TestManyIDsInOneWriteAreAllAnsweredInOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "id")
	h.spawn(t, 1, "s", h.self)
	// Far more than a pipe holds (64 KiB), so writing and answering overlap.
	const n = 50_000
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(1_000_000 + i)
	}
	h.pool.Write(1, ids)
	h.pool.Stop(1)
	got := h.rec.answers(t, 1, n)
	for i, line := range got {
		if want := fmt.Sprintf("0 %d", ids[i]); line != want {
			t.Fatalf("answer %d: expected %q, got %q", i, want, line)
		}
	}
	if x := h.rec.exit(t, 1); x.Code != 0 {
		t.Fatalf("expected exit code 0, got %v", x)
	}
}

func TestStderrLinesAreLoggedWithStageAndPid(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "stderr")
	started := h.spawn(t, 7, "enrich", h.self)
	h.pool.Stop(7)
	h.rec.exit(t, 7) // stderr is drained before the exit is reported

	var lines []map[string]any
	for _, rec := range h.logs.records(t) {
		if rec["level"] == "WARN" && rec["stage"] == "enrich" && rec["stream"] == "stderr" {
			lines = append(lines, rec)
		}
	}
	if len(lines) != 3 {
		t.Fatalf("expected 3 warn records tagged stage=enrich, got %d: %v", len(lines), lines)
	}
	for i, want := range []string{"first complaint", "second complaint", strings.Repeat("e", lineMax)} {
		rec := lines[i]
		if rec["msg"] != want {
			t.Errorf("stderr line %d: expected msg %.40q (%d bytes), got %.40q", i, want, len(want), rec["msg"])
		}
		if rec["pid"] != float64(started.PID) || rec["worker"] != "w7" {
			t.Errorf("stderr line %d: expected pid=%d worker=w7, got pid=%v worker=%v", i, started.PID, rec["pid"], rec["worker"])
		}
	}
	if lines[2]["cut_at_bytes"] != float64(lineMax) {
		t.Errorf("expected the long stderr line marked cut_at_bytes=%d, got %v", lineMax, lines[2])
	}
}

func TestStdoutLinesAreCutTrimmedAndAFinalLineWithoutNewlineCounts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "longline")
	h.spawn(t, 1, "s", h.self)
	got := h.rec.answers(t, 1, 3)
	if got[0] != strings.Repeat("x", lineMax) {
		t.Errorf("expected the long line cut to %d bytes of x, got %d bytes", lineMax, len(got[0]))
	}
	if got[1] != "0" || got[2] != "tail" {
		t.Errorf("expected %q then %q, got %q then %q", "0", "tail", got[1], got[2])
	}
	if x := h.rec.exit(t, 1); x.Code != 0 {
		t.Fatalf("expected exit code 0 after the last line, got %v", x)
	}
}

func TestExitCodeIsReportedAfterAllAnswers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "exit7")
	h.spawn(t, 1, "s", h.self)
	h.pool.Write(1, []int64{1, 2, 3})
	h.pool.Stop(1)
	h.rec.answers(t, 1, 3)
	if x := h.rec.exit(t, 1); x.Code != 7 || x.Signal != "" {
		t.Fatalf("expected exit code 7 without signal, got %v", x)
	}
}

func TestSignalIsReportedByNameAfterAllAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ sig, name string }{
		{"TERM", "terminated"},
		{"SEGV", "segmentation fault"},
	} {
		t.Run(tc.sig, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "")
			h.spawn(t, 1, "s", script(t, "echo 0\necho 0\nkill -"+tc.sig+" $$\n"))
			h.rec.answers(t, 1, 2)
			if x := h.rec.exit(t, 1); x.Code != -1 || x.Signal != tc.name {
				t.Fatalf("expected code -1 signal %q, got %v", tc.name, x)
			}
		})
	}
}

func TestKillOfAHungWorkerReportsSignalKilled(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "hang")
	h.spawn(t, 1, "s", h.self)
	h.pool.Write(1, []int64{1})
	h.pool.Kill(1)
	if x := h.rec.exit(t, 1); x.Code != -1 || x.Signal != "killed" {
		t.Fatalf("expected code -1 signal killed, got %v", x)
	}
	// The worker is gone: these must be quiet no-ops, not panics or events.
	h.pool.Write(1, []int64{2})
	h.pool.Stop(1)
	h.pool.Kill(1)
}

func TestWriteNeverBlocksOnAWorkerThatDoesNotRead(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "hang")
	h.spawn(t, 1, "s", h.self)
	ids := make([]int64, 200_000) // about 1.4 MB: twenty pipes' worth
	for i := range ids {
		ids[i] = int64(1_000_000 + i)
	}
	done := make(chan struct{})
	go func() {
		h.pool.Write(1, ids)
		h.pool.Write(1, ids[:10])
		h.pool.Stop(1)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("expected Write and Stop to return at once on a worker that never reads, still blocked after %v", within)
	}
	h.pool.Kill(1)
	if x := h.rec.exit(t, 1); x.Signal != "killed" {
		t.Fatalf("expected signal killed, got %v", x)
	}
}

func TestWriteQueueOverflowKillsTheWorker(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "hang")
	h.pool.writeQueueMax = 100
	h.spawn(t, 1, "s", h.self)
	ids := make([]int64, 50) // 50 × 8 bytes > 100
	for i := range ids {
		ids[i] = int64(1_000_000 + i)
	}
	h.pool.Write(1, ids)
	if x := h.rec.exit(t, 1); x.Signal != "killed" || !strings.Contains(x.Killed, "overflowed") {
		t.Fatalf("expected the overflowing worker killed, its exit saying why, got %v", x)
	}
	found := false
	for _, rec := range h.logs.records(t) {
		if rec["level"] == "ERROR" && strings.Contains(fmt.Sprint(rec["msg"]), "overflow") {
			found = true
		}
	}
	if !found {
		t.Fatalf("expected an error record about the overflow, got %v", h.logs.records(t))
	}
}

// A worker that closes its standard output and lives on is killed, and its
// exit says why (core.WorkerExited.Killed): the core's reasons name it
// rather than a "signal killed" that reads as the stage's own crash.
func TestAWorkerThatClosesItsStandardOutputIsKilledAndItsExitSaysWhy(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "zero")
	h.spawn(t, 1, "s", script(t, "exec >&-\nexec sleep 60\n"))
	if x := h.rec.exit(t, 1); x.Signal != "killed" || x.Killed != "it closed its standard output and did not exit" {
		t.Fatalf("expected the worker killed, its exit saying it closed its standard output, got %v", x)
	}
}

// procStat reads /proc/PID/stat: the state letter, the process group and the
// start time (clock ticks after boot). ok is false if there is no such process.
func procStat(pid int) (state byte, pgid int, start uint64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	// f[0] is field 3 (state), f[2] field 5 (pgrp), f[19] field 22 (starttime).
	if len(f) < 20 {
		return 0, 0, 0, false
	}
	pgid, _ = strconv.Atoi(f[2])
	start, _ = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], pgid, start, true
}

// awaitGone waits until the process pid that started at start is gone: no such
// pid, a zombie (dead, waiting for a reaper), or a new process reusing the pid.
func awaitGone(t *testing.T, pid int, start uint64, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		state, _, s, ok := procStat(pid)
		if !ok || state == 'Z' || state == 'X' || s != start {
			return
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL) // do not leave it behind
			t.Fatalf("expected %s (pid %d) gone within %v, still there in state %c", what, pid, within, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKillKillsTheWorkersChildrenToo(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	started := h.spawn(t, 1, "s", script(t, "sleep 300 &\necho $!\nwait\n"))
	child, err := strconv.Atoi(h.rec.answers(t, 1, 1)[0])
	if err != nil {
		t.Fatalf("expected the script's child pid as its first line: %v", err)
	}
	state, pgid, start, ok := procStat(child)
	if !ok || state == 'Z' || pgid != started.PID {
		t.Fatalf("expected child %d alive in the worker's group %d, got ok=%v state=%c pgid=%d", child, started.PID, ok, state, pgid)
	}
	h.pool.Kill(1)
	if x := h.rec.exit(t, 1); x.Signal != "killed" {
		t.Fatalf("expected signal killed, got %v", x)
	}
	awaitGone(t, child, start, "the worker's child")
}

func TestWorkerExitKillsWhatItLeftInItsGroupAndIsReportedAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	// Were the leftover child not killed, it would hold stdout open and only the
	// (here one hour) drain limit would end the wait.
	h.pool.drainMax = time.Hour
	h.spawn(t, 1, "s", script(t, "sleep 300 &\necho $!\nexit 3\n"))
	child, err := strconv.Atoi(h.rec.answers(t, 1, 1)[0])
	if err != nil {
		t.Fatalf("expected the script's child pid as its first line: %v", err)
	}
	_, _, start, _ := procStat(child)
	if x := h.rec.exit(t, 1); x.Code != 3 {
		t.Fatalf("expected exit code 3, got %v", x)
	}
	awaitGone(t, child, start, "the exited worker's leftover child")
}

func TestOutputHeldOpenOutsideTheGroupIsClosedAfterTheDrainLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	h.pool.drainMax = 300 * time.Millisecond
	// The child leaves the group (setsid) before the script exits, so the
	// script's exit cannot kill it; it holds stdout open.
	h.spawn(t, 1, "s", script(t, `f=$(dirname "$0")/ready
mkfifo "$f"
setsid sh -c 'echo $$ > "$1"; exec sleep 300' sh "$f" &
read child < "$f"
echo "$child"
exit 0
`))
	escaped, err := strconv.Atoi(h.rec.answers(t, 1, 1)[0])
	if err != nil {
		t.Fatalf("expected the escaped child's pid as the first line: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(escaped, syscall.SIGKILL) })
	if x := h.rec.exit(t, 1); x.Code != 0 {
		t.Fatalf("expected exit code 0 once the drain limit passed, got %v", x)
	}
	found := false
	for _, rec := range h.logs.records(t) {
		if rec["level"] == "WARN" && strings.Contains(fmt.Sprint(rec["msg"]), "output still open") {
			found = true
		}
	}
	if !found {
		t.Fatalf("expected a warning that output was held open, got %v", h.logs.records(t))
	}
}

func TestProgramNotFoundIsSpawnFailedWithAClearMessage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-exec")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("not a program\x00\x01"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, "zero", func(o *Options) { o.Env = append(o.Env, "PATH="+dir) })
	for _, tc := range []struct{ program, want string }{
		{"no-such-stage", `spawn stage enrich: program 'no-such-stage' not found in PATH '` + dir + `'`},
		{"not-exec", `spawn stage enrich: program 'not-exec' found as ` + notExec + ` but is not executable`},
		{dir + "/missing", `spawn stage enrich: program '` + dir + `/missing': stat ` + dir + `/missing: no such file or directory`},
		{dir, `spawn stage enrich: program '` + dir + `': is a directory`},
		{"", `spawn stage enrich: program name is empty`},
		{"garbage", `spawn stage enrich: start ` + garbage + `: fork/exec ` + garbage + `: exec format error`},
	} {
		ev := h.pool.Spawn(1, "enrich", tc.program)
		failed, ok := ev.(core.SpawnFailed)
		if !ok || failed.Worker != 1 || !strings.HasPrefix(failed.Err, tc.want) {
			t.Errorf("program %q: expected SpawnFailed starting %q, got %v", tc.program, tc.want, ev)
		}
	}
}

func TestRelativeProgramIsFoundOnThePATHOfTheWorkersEnvironment(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.Symlink(selfPath(t), filepath.Join(dir, "pepsi-test-stage")); err != nil {
		t.Fatal(err)
	}
	// A relative PATH entry holding the same name must be skipped.
	h := newHarness(t, "zero", func(o *Options) { o.Env = append(o.Env, "PATH=.:"+dir+":/usr/bin:/bin") })
	h.spawn(t, 1, "s", "pepsi-test-stage")
	h.pool.Write(1, []int64{5})
	if got := h.rec.answers(t, 1, 1)[0]; got != "0" {
		t.Fatalf("expected answer 0, got %q", got)
	}
}

func TestConfigFileAndStageArePassedToTheWorker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ configFile, want string }{
		{"/etc/pepsi/pepsi.conf", "args=worker,-c,/etc/pepsi/pepsi.conf stage=enrich stage_vars=1"},
		{"", "args=worker stage=enrich stage_vars=1"},
	} {
		h := newHarness(t, "args", func(o *Options) {
			o.ConfigFile = tc.configFile
			o.Env = append(o.Env, "PEPSI_STAGE=stale")
		})
		h.spawn(t, 1, "enrich", h.self)
		if got := h.rec.answers(t, 1, 1)[0]; got != tc.want {
			t.Errorf("config file %q: expected first line %q, got %q", tc.configFile, tc.want, got)
		}
	}
}

// Proves: a filter (SpawnFilter, INPUT = message) is started with the same
// "worker -c FILE" as any stage when a configuration file is set
// (docs/protocol.md, "Starting"), and still with no database variable in its
// environment, though the pool's environment has them all.
func TestAFilterGetsTheConfigFileButNoDatabaseVariables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ configFile, want string }{
		{"/etc/pepsi/pepsi.conf", "args=worker,-c,/etc/pepsi/pepsi.conf input=message db="},
		{"", "args=worker input=message db="},
	} {
		h := newHarness(t, "filterargs", func(o *Options) {
			o.ConfigFile = tc.configFile
			o.Env = append(o.Env, "PGHOST=127.0.0.1", "PGPASSWORD=secret", "PEPSI_DATABASE=postgres://x@127.0.0.1/y", "DATABASE_URL=postgres://x@127.0.0.1/y")
		})
		ev := h.pool.SpawnFilter(1, "parse", h.self, 1<<20)
		if started, ok := ev.(core.WorkerStarted); !ok || started.Worker != 1 {
			t.Fatalf("config file %q: expected the filter started, got %v", tc.configFile, ev)
		}
		if got := h.rec.answers(t, 1, 1)[0]; got != tc.want {
			t.Errorf("config file %q: expected first line %q, got %q", tc.configFile, tc.want, got)
		}
	}
}

func TestSpawnAfterCloseFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "zero")
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := h.pool.Close(ctx); err != nil {
		t.Fatalf("expected close to succeed, got %v", err)
	}
	ev := h.pool.Spawn(1, "s", h.self)
	if f, ok := ev.(core.SpawnFailed); !ok || !strings.Contains(f.Err, "closed") {
		t.Fatalf("expected SpawnFailed saying the pool is closed, got %v", ev)
	}
}

// A worker must not die when the goroutine (and OS thread) that called Spawn
// ends: the parent-death signal follows the forking thread, not the process.
func TestWorkerSurvivesTheEndOfTheThreadThatSpawnedIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "zero")
	// The runtime ends the thread of a goroutine that exits locked to it, except
	// the process's main thread, which it parks instead. A goroutine that lands on
	// the main thread keeps it (locked, until the test ends) so the next lands on
	// another.
	release := make(chan struct{})
	defer close(release)
	var tid int
	for attempt := 1; tid == 0; attempt++ {
		if attempt > 3 {
			t.Fatal("expected a goroutine on a thread other than the main one within 3 tries")
		}
		tids := make(chan int, 1)
		evs := make(chan core.Event, 1)
		go func() {
			runtime.LockOSThread()
			if syscall.Gettid() == os.Getpid() {
				tids <- 0
				<-release
				runtime.UnlockOSThread()
				return
			}
			// Never unlocked: the thread ends with this goroutine.
			tids <- syscall.Gettid()
			evs <- h.pool.Spawn(1, "s", h.self)
		}()
		if tid = <-tids; tid != 0 {
			if _, ok := (<-evs).(core.WorkerStarted); !ok {
				t.Fatal("expected the worker to start")
			}
		}
	}
	task := fmt.Sprintf("/proc/self/task/%d", tid)
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected thread %d to end with its locked goroutine within %v", tid, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.pool.Write(1, []int64{1})
	if e := h.rec.next(t); e != (core.Answer{Worker: 1, Line: "0"}) {
		t.Fatalf("expected the worker alive and answering 0 after the spawning thread ended, got %v", e)
	}
}

func TestWorkerDiesWithTheDispatcher(t *testing.T) {
	t.Parallel()
	fake := exec.Command(selfPath(t))
	fake.Env = withMode(os.Environ(), "fake-dispatcher")
	fake.Stderr = os.Stderr
	out, err := fake.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.Start(); err != nil {
		t.Fatalf("start fake dispatcher: %v", err)
	}
	t.Cleanup(func() { _ = fake.Process.Kill(); _ = fake.Wait() })

	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, out)
	}()
	var pid int
	select {
	case line := <-lines:
		if pid, err = strconv.Atoi(strings.TrimSpace(line)); err != nil {
			t.Fatalf("expected the worker's pid from the fake dispatcher, got %q", line)
		}
	case <-time.After(within):
		t.Fatalf("expected the fake dispatcher to print its worker's pid within %v", within)
	}
	state, _, start, ok := procStat(pid)
	if !ok || state == 'Z' {
		t.Fatalf("expected worker %d alive before the dispatcher dies, got ok=%v state=%c", pid, ok, state)
	}

	if err := fake.Process.Kill(); err != nil {
		t.Fatalf("kill fake dispatcher: %v", err)
	}
	_ = fake.Wait() // "signal: killed", as intended
	awaitGone(t, pid, start, "the dead dispatcher's worker")
}

// BenchmarkRoundTrip measures one batch of 4 ids written to a worker and its 4
// answers received: the per-batch cost of the shell's side of the protocol.
func BenchmarkRoundTrip(b *testing.B) {
	rec := &recorder{ch: make(chan core.Event, 64)}
	p := NewPool(Options{Env: withMode(os.Environ(), "zero"), Events: rec.events,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer p.Close(context.Background())
	if _, ok := p.Spawn(1, "s", selfPath(b)).(core.WorkerStarted); !ok {
		b.Fatal("spawn failed")
	}
	ids := []int64{1, 2, 3, 4}
	b.ResetTimer()
	for b.Loop() {
		p.Write(1, ids)
		rec.answers(b, 1, 4)
	}
}

// BenchmarkSpawnStopExit measures a worker's whole life: spawn, stop, exit reported.
func BenchmarkSpawnStopExit(b *testing.B) {
	rec := &recorder{ch: make(chan core.Event, 64)}
	p := NewPool(Options{Env: withMode(os.Environ(), "zero"), Events: rec.events,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer p.Close(context.Background())
	self := selfPath(b)
	id := core.WorkerID(0)
	for b.Loop() {
		id++
		if _, ok := p.Spawn(id, "s", self).(core.WorkerStarted); !ok {
			b.Fatal("spawn failed")
		}
		p.Stop(id)
		rec.exit(b, id)
	}
}
