package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/pepsi-pipeline/pepsi/core"
)

// writeQueueMax bounds the bytes queued for one worker's standard input that the
// pipe has not yet taken. The core never hands a worker more than QUEUE_LIMIT ids
// at a time (pepsi.conf allows at most 1,000,000, at most 20 bytes each), so a
// correct core stays below 24 MiB; reaching it is a bug upstream, and the worker is
// killed (its exit reported as usual) rather than the dispatcher growing.
const writeQueueMax = 24 << 20

// drainMax is how long a worker's standard output and error may stay open after
// the worker process has exited (held by a process that left its process group)
// before they are closed and the exit is reported anyway.
const drainMax = 2 * time.Second

// Options configures a Pool.
type Options struct {
	// ConfigFile, if set, is passed to every worker as "-c ConfigFile", a
	// filter's too (docs/protocol.md, "Starting"): every stage program loads
	// the configuration the dispatcher runs, whatever its INPUT.
	ConfigFile string
	// Env is the workers' base environment (default os.Environ()). Spawn adds
	// PEPSI_STAGE, replacing any PEPSI_STAGE already in Env; a PEPSI_INPUT in
	// Env is dropped (SpawnFilter sets it). Its PATH is the one
	// programs are looked up in.
	Env []string
	// Log receives standard error lines of workers (level warn) and this package's
	// own troubles. Default slog.Default().
	Log *slog.Logger
	// Events receives every Answer and WorkerExited, from the pool's goroutines,
	// possibly from several at once. Events of one worker arrive one at a time and
	// in order. It must not block long: a worker whose events are not taken stops
	// being read. Required.
	Events func(core.Event)
}

// Pool runs the worker processes of one dispatcher. Its methods may be called from
// any goroutine; worker ids are the caller's (the core's) and must not be reused.
//
// Every worker gets SIGKILL as its parent-death signal, so it dies with the
// dispatcher and no orphan from a previous dispatcher can write after a restart.
// On Linux that signal fires when the *thread* that forked the worker exits, not
// when the process does, and the Go runtime ends threads on its own terms: a
// worker forked from an ordinary goroutine's thread could be killed at a random
// moment while the dispatcher lives on. So every fork happens on one goroutine
// that locked itself to its OS thread and never unlocks (the spawner), and that
// thread lives exactly as long as the Pool: until Close, or the process's end.
//
// Every worker leads a process group of its own, so Kill reaches what the
// worker started (a shell-script stage running psql), and a SIGINT typed at the
// dispatcher's terminal reaches the dispatcher alone, which stops its workers in
// order. Processes the worker left in its group when it exits are killed too, so
// nothing a worker started outlives it or holds its output open. The parent-death
// signal, though, reaches only the worker itself: if the dispatcher dies, a child
// of a script stage survives it unless the script execs its last command.
type Pool struct {
	log      *slog.Logger
	events   func(core.Event)
	env      []string // base environment, without PEPSI_STAGE
	path     string   // PATH of env, where programs are looked up
	argsTail []string // "worker" [-c FILE], for every worker
	// filterEnv is env without a database (see SpawnFilter).
	filterEnv []string

	// spawnMu is held for reading around a request to the spawner and for writing
	// to close it, so no request is sent on a closed channel.
	spawnMu sync.RWMutex
	closing bool // no more spawns: Close has begun
	spawned bool // the spawner goroutine has been told to end
	spawnc  chan spawnRequest

	mu      sync.Mutex
	workers map[core.WorkerID]*proc
	idle    chan struct{} // closed while no worker is live; a new one once one starts

	// Limits, fields so tests can shrink them.
	writeQueueMax int
	drainMax      time.Duration

	// goroutines counts the per-worker goroutines still running, for tests.
	goroutines atomic.Int64
}

// proc is one worker process.
type proc struct {
	id      core.WorkerID
	pid     int
	process *os.Process
	log     *slog.Logger // tagged with attrs
	attrs   []any        // stage, pid and worker, as key-value pairs
	in      *stdinWriter
	stdout  *os.File
	stderr  *os.File
	// exited is set (under Pool.mu) once the process has exited, before it is
	// reaped. From then on it is never signalled: once reaped its pid, and so its
	// process group id, may name an unrelated process.
	exited bool
	// lingering is set (under Pool.mu) once killLingering has armed its
	// kill: a worker that closed both pipes is killed, and logged, once.
	lingering bool
	// killedFor says (under Pool.mu) why the pool killed the worker on its
	// own, for its exit (core.WorkerExited.Killed); "" when it did not.
	killedFor string
}

type spawnRequest struct {
	path  string
	argv  []string
	attr  *os.ProcAttr
	reply chan spawnResult
}

type spawnResult struct {
	process *os.Process
	err     error
}

// NewPool returns a Pool and starts its spawner goroutine.
func NewPool(o Options) *Pool {
	if o.Events == nil {
		panic("worker.NewPool: Options.Events is nil")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	p := &Pool{
		log:           o.Log,
		events:        o.Events,
		argsTail:      []string{"worker"},
		spawnc:        make(chan spawnRequest),
		workers:       make(map[core.WorkerID]*proc),
		idle:          make(chan struct{}),
		writeQueueMax: writeQueueMax,
		drainMax:      drainMax,
	}
	close(p.idle)
	for _, kv := range o.Env {
		if strings.HasPrefix(kv, "PEPSI_STAGE=") || strings.HasPrefix(kv, "PEPSI_INPUT=") {
			continue
		}
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			p.path = v // the last one wins, as in getenv(3) over exec's env
		}
		p.env = append(p.env, kv)
	}
	for _, kv := range p.env {
		if !NamesDatabase(kv) {
			p.filterEnv = append(p.filterEnv, kv)
		}
	}
	p.filterEnv = append(p.filterEnv, "PEPSI_INPUT=message")
	if o.ConfigFile != "" {
		p.argsTail = append(p.argsTail, "-c", o.ConfigFile)
	}
	go p.spawner()
	return p
}

// spawner performs every fork of the pool, on one OS thread it never releases (see
// Pool for why). When it returns, at Close, the runtime ends the locked thread.
func (p *Pool) spawner() {
	runtime.LockOSThread()
	for req := range p.spawnc {
		proc, err := os.StartProcess(req.path, req.argv, req.attr)
		req.reply <- spawnResult{proc, err}
	}
}

// errClosed is the SpawnFailed reason after Close.
var errClosed = errors.New("worker pool is closed")

// Spawn starts "program worker [-c FILE]" for stage, with PEPSI_STAGE=stage in its
// environment, in a process group of its own, with SIGKILL as its parent-death
// signal. program is looked up in the PATH of the workers' environment unless it
// contains a slash. Spawn returns core.WorkerStarted or core.SpawnFailed (with a
// reason naming the program and the stage); the caller feeds it to the core before
// any event Events delivers for id. After WorkerStarted, Events gets one Answer per
// line of the worker's standard output, in order, then exactly one WorkerExited,
// once standard output is drained and the process reaped.
func (p *Pool) Spawn(id core.WorkerID, stage, program string) core.Event {
	return p.spawn(id, stage, program, false, p.writeQueueMax)
}

// SpawnFilter starts the worker of an INPUT = message stage, a filter that is
// handed each message on standard input: as Spawn does, with the same
// "worker [-c FILE]" (the protocol passes the configuration to every stage
// program), but with no database in its environment (docs/protocol.md, "A
// filter has no database"): without any variable NamesDatabase reports, so
// the dispatcher hands it no address and no credentials, and with
// PEPSI_INPUT=message (which tells the stage library not to connect, whatever
// DATABASE the file names). stdinMax bounds the bytes queued for its standard input, as
// writeQueueMax does for an id stage; the caller sizes it for the stage's
// QUEUE_LIMIT lines of LINE_MAX bytes.
func (p *Pool) SpawnFilter(id core.WorkerID, stage, program string, stdinMax int) core.Event {
	return p.spawn(id, stage, program, true, max(stdinMax, p.writeQueueMax))
}

// Check reports why program cannot be run by a Spawn (not found on the
// workers' PATH, not a regular file, not executable), or nil: the look-up a
// Spawn makes first, without running anything (core.CheckProgram).
func (p *Pool) Check(program string) error {
	_, err := lookPath(program, p.path)
	return err
}

// NamesDatabase reports whether the environment entry kv ("NAME=value") tells a
// program where a database is or how to log in to it: libpq's PG* variables
// (PGHOST, PGPASSWORD, PGSERVICEFILE, ...), PEPSI_DATABASE and DATABASE_URL.
// A filter stage's worker gets none of them.
func NamesDatabase(kv string) bool {
	name, _, _ := strings.Cut(kv, "=")
	return strings.HasPrefix(name, "PG") || name == "PEPSI_DATABASE" || name == "DATABASE_URL"
}

func (p *Pool) spawn(id core.WorkerID, stage, program string, filter bool, stdinMax int) core.Event {
	fail := func(err error) core.Event {
		p.log.Debug("worker spawn failed", "stage", stage, "worker", id.String(), "err", err)
		return core.SpawnFailed{Worker: id, Err: fmt.Sprintf("spawn stage %s: %v", stage, err)}
	}
	path, err := lookPath(program, p.path)
	if err != nil {
		return fail(err)
	}
	p.mu.Lock()
	_, dup := p.workers[id]
	p.mu.Unlock()
	if dup {
		return fail(fmt.Errorf("worker %s already exists", id))
	}

	child, ours, err := stdio()
	if err != nil {
		return fail(err)
	}
	closeAll := func() {
		closeFiles(child[:]...)
		closeFiles(ours[:]...)
	}
	p.spawnMu.RLock()
	if p.closing {
		p.spawnMu.RUnlock()
		closeAll()
		return fail(errClosed)
	}
	// Held until the worker is in p.workers, so a concurrent Close kills it too.
	defer p.spawnMu.RUnlock()
	process, err := p.start(path, program, stage, filter, child)
	if err != nil {
		closeAll()
		return fail(fmt.Errorf("start %s: %w", path, err))
	}
	// The child has its own copies now; ours would keep its stdin open and its
	// stdout from ever reaching end of file.
	for _, f := range child {
		if err := f.Close(); err != nil {
			p.log.Warn("worker: closing the child's pipe ends", "err", err)
		}
	}

	pid := process.Pid
	w := &proc{
		id:      id,
		pid:     pid,
		process: process,
		attrs:   []any{"stage", stage, "pid", pid, "worker", id.String()},
		in:      newStdinWriter(ours[0], stdinMax),
		stdout:  ours[1],
		stderr:  ours[2],
	}
	w.log = p.log.With(w.attrs...)
	p.mu.Lock()
	if len(p.workers) == 0 {
		p.idle = make(chan struct{})
	}
	p.workers[id] = w
	p.mu.Unlock()
	w.log.Debug("worker started", "program", path)
	p.serve(w)
	return core.WorkerStarted{Worker: id, PID: pid}
}

// stdio makes the pipes of a worker's standard input, output and error. child
// holds the ends the process gets, in that order; ours the pool's (standard
// input's write end, the others' read ends). On failure none is left open.
func stdio() (child, ours [3]*os.File, err error) {
	for i, name := range []string{"stdin", "stdout", "stderr"} {
		r, w, err := os.Pipe()
		if err != nil {
			closeFiles(child[:i]...)
			closeFiles(ours[:i]...)
			return child, ours, fmt.Errorf("%s pipe: %w", name, err)
		}
		if i == 0 {
			child[i], ours[i] = r, w // the worker reads its standard input
		} else {
			child[i], ours[i] = w, r
		}
	}
	return child, ours, nil
}

// closeFiles closes pipe ends nothing was written through: nothing to lose.
func closeFiles(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// start has the spawner start "program worker [-c FILE]" from path, for stage,
// with child as its standard input, output and error. A filter gets the same
// arguments (the protocol passes -c to every stage program) but not the
// database variables: its environment, not its command line, is what keeps it
// off the database.
func (p *Pool) start(path, program, stage string, filter bool, child [3]*os.File) (*os.Process, error) {
	base, argv := p.env, append([]string{program}, p.argsTail...)
	if filter {
		base = p.filterEnv
	}
	env := make([]string, 0, len(base)+1)
	env = append(append(env, base...), "PEPSI_STAGE="+stage)
	req := spawnRequest{
		path: path,
		argv: argv,
		attr: &os.ProcAttr{
			Env:   env,
			Files: child[:],
			Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
		},
		reply: make(chan spawnResult, 1),
	}
	p.spawnc <- req
	res := <-req.reply
	return res.process, res.err
}

// serve starts the goroutines that feed a started worker's standard input,
// read its output and its errors, and reap it.
func (p *Pool) serve(w *proc) {
	stdinDone := make(chan struct{})
	stdoutDone := make(chan struct{})
	stderrDone := make(chan struct{})
	p.goroutines.Add(4)
	go p.writeStdin(w, stdinDone)
	go p.readStdout(w, stdoutDone)
	go p.readStderr(w, stderrDone)
	go p.reap(w, stdinDone, stdoutDone, stderrDone)
}

// Write queues ids for the worker's standard input, one decimal id per line, as
// one buffer (one write(2) when the pipe has room). It never blocks: a goroutine
// per worker does the writing. A write to a worker that has exited, or whose
// standard input broke, is dropped quietly: its exit is reported anyway. A write
// that would overflow the worker's bounded queue kills the worker.
func (p *Pool) Write(id core.WorkerID, ids []int64) {
	if len(ids) == 0 {
		return
	}
	buf := make([]byte, 0, len(ids)*8)
	for _, n := range ids {
		buf = strconv.AppendInt(buf, n, 10)
		buf = append(buf, '\n')
	}
	p.enqueue(id, buf, len(ids))
}

// enqueue queues buf, n lines, for worker id's standard input.
func (p *Pool) enqueue(id core.WorkerID, buf []byte, n int) {
	w := p.lookup(id)
	if w == nil {
		p.log.Debug("worker: write to a worker that is gone, dropped", "worker", id.String(), "ids", n)
		return
	}
	p.enqueued(id, w, w.in.enqueue(buf), n)
}

// enqueued acts on the outcome err of queueing n lines for worker w.
func (p *Pool) enqueued(id core.WorkerID, w *proc, err error, n int) {
	switch {
	case err == nil:
	case errors.Is(err, errOverflow):
		w.log.Error("worker: write queue overflow, killing the worker", "queued_max", w.in.max, "lines", n)
		p.mu.Lock()
		if !w.exited {
			w.killedFor = "its standard input's queue overflowed"
			p.killLocked(w)
		}
		p.mu.Unlock()
	case errors.Is(err, errStopped):
		// The core never writes after Stop; if it did, the ids would never be
		// answered, so say so loudly.
		w.log.Warn("worker: write after stop, dropped", "ids", n)
	default:
		w.log.Debug("worker: write to an exited worker, dropped", "ids", n, "err", err)
	}
}

// WriteLines queues lines for a filter's standard input, each followed by a
// newline, as one buffer; otherwise as Write. The pool keeps them only until
// the pipe has taken them.
func (p *Pool) WriteLines(id core.WorkerID, lines []string) {
	if len(lines) == 0 {
		return
	}
	w := p.lookup(id)
	if w == nil {
		p.log.Debug("worker: write to a worker that is gone, dropped", "worker", id.String(), "ids", len(lines))
		return
	}
	p.enqueued(id, w, w.in.enqueueLines(lines), len(lines))
}

// Stop closes the worker's standard input once everything already queued by Write
// has been written: the worker finishes, answers and exits. The core kills it if
// it does not exit within its grace period. Stopping a worker that is gone does
// nothing.
func (p *Pool) Stop(id core.WorkerID) {
	if w := p.lookup(id); w != nil {
		w.in.stop()
	}
}

// Kill sends SIGKILL to the worker and to its process group (what it started).
// Killing a worker that has already exited does nothing; its exit is reported
// either way.
func (p *Pool) Kill(id core.WorkerID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workers[id]
	if w == nil || w.exited {
		return
	}
	p.killLocked(w)
}

// KillAll kills every live worker and its process group, for the dispatcher's
// emergency exit.
func (p *Pool) KillAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.workers {
		if !w.exited {
			p.killLocked(w)
		}
	}
}

// killLocked kills w's process group, and w itself in case it left the group.
// Precondition: p.mu is held and w has not exited, so w.pid is not reaped and
// still names w and its group and nothing else.
func (p *Pool) killLocked(w *proc) {
	if err := syscall.Kill(-w.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		w.log.Error("worker: kill process group", "err", err)
	}
	if err := w.process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		w.log.Error("worker: kill", "err", err)
	}
}

// Wait returns once every worker started so far has been reaped and its
// WorkerExited delivered, or with ctx's error.
func (p *Pool) Wait(ctx context.Context) error {
	p.mu.Lock()
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for workers to exit: %w", ctx.Err())
	}
}

// Close refuses further spawns, kills every worker, waits (bounded by ctx) until
// all are reaped, and ends the spawner thread. If ctx ends first, workers still
// running are killed by their parent-death signal as that thread ends.
func (p *Pool) Close(ctx context.Context) error {
	p.spawnMu.Lock()
	p.closing = true
	p.spawnMu.Unlock()
	p.KillAll()
	err := p.Wait(ctx)
	p.spawnMu.Lock()
	if !p.spawned {
		p.spawned = true
		close(p.spawnc)
	}
	p.spawnMu.Unlock()
	return err
}

func (p *Pool) lookup(id core.WorkerID) *proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.workers[id]
}

func (p *Pool) writeStdin(w *proc, done chan<- struct{}) {
	defer close(done)
	defer p.goroutines.Add(-1) // before done: reap counts on it
	if err := w.in.run(); err != nil {
		// The worker exited or closed its standard input; its exit tells the core.
		w.log.Debug("worker: stdin write ended", "err", err)
		// One that closed it and lives on can be handed nothing more: the
		// ids of this write, and of every later one, are dropped and would
		// wait for MAX_RUNTIME. It is killed as one that closed its standard
		// output is, and its exit reports it like any crash.
		p.killLingering(w, "worker closed its standard input but did not exit; killing it", "it closed its standard input and did not exit")
	}
}

func (p *Pool) readStdout(w *proc, done chan<- struct{}) {
	defer close(done)
	defer p.goroutines.Add(-1) // before done: reap counts on it
	err := readLines(w.stdout, func(line string, cut, unterminated bool) {
		p.events(core.Answer{Worker: w.id, Line: line, Cut: cut, Unterminated: unterminated})
	})
	if err != nil && !errors.Is(err, os.ErrClosed) {
		w.log.Warn("worker: reading stdout", "err", err)
	}
	_ = w.stdout.Close() // a read end: nothing to flush; a second close is harmless
	// A worker that closed its standard output can never answer again, but may
	// live on and hold its messages until MAX_RUNTIME.
	p.killLingering(w, "worker closed its standard output but did not exit; killing it", "it closed its standard output and did not exit")
}

// killLingering kills w, which closed one of its pipes (msg says which, why
// for its exit's core.WorkerExited.Killed), if it still lives
// stdoutClosedGrace later: one that is exiting closes its pipes too, so it
// gets that long to exit; then it is killed, and its exit reports it like
// any crash, saying why. A worker that was asked to stop is left to the
// core's stop grace.
func (p *Pool) killLingering(w *proc, msg, why string) {
	p.mu.Lock()
	armed := w.lingering
	w.lingering = true
	p.mu.Unlock()
	if armed {
		return
	}
	time.AfterFunc(stdoutClosedGrace, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !w.exited && !w.in.stopRequested() {
			w.log.Error(msg, "waited", stdoutClosedGrace)
			w.killedFor = why
			p.killLocked(w)
		}
	})
}

// stdoutClosedGrace is how long a worker may live on after its standard output
// reached end of file, or after a write to its standard input failed, before
// it is killed.
const stdoutClosedGrace = time.Second

func (p *Pool) readStderr(w *proc, done chan<- struct{}) {
	defer close(done)
	defer p.goroutines.Add(-1) // before done: reap counts on it
	gate := newStderrGate(w.log)
	defer gate.close()
	err := readLines(w.stderr, func(line string, cut, _ bool) {
		if !gate.pass(time.Now(), len(line)) {
			return
		}
		if cut {
			w.log.Warn(line, "stream", "stderr", "cut_at_bytes", lineMax)
			return
		}
		logStderr(w.log, w.attrs, line, "stream", "stderr")
	})
	if err != nil && !errors.Is(err, os.ErrClosed) {
		w.log.Warn("worker: reading stderr", "err", err)
	}
	_ = w.stderr.Close() // a read end: nothing to flush; a second close is harmless
}

// reap waits for w to exit, cleans up after it, and reports its exit after its
// last Answer, once w's other goroutines have ended.
func (p *Pool) reap(w *proc, stdinDone, stdoutDone, stderrDone <-chan struct{}) {
	if err := WaitExited(w.pid); err != nil {
		w.log.Error("worker: waiting for exit", "err", err)
	}
	p.mu.Lock()
	w.exited = true
	// Exited but not reaped, so its pid still names its process group and nothing
	// else: kill whatever it left there, which could hold its stdout open forever.
	if err := syscall.Kill(-w.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		w.log.Error("worker: kill leftovers in process group", "err", err)
	}
	p.mu.Unlock()
	w.in.abort()
	<-stdinDone // prompt: abort closed the pipe, which ends a blocked write

	timer := time.NewTimer(p.drainMax)
	defer timer.Stop()
	for stdoutDone != nil || stderrDone != nil {
		select {
		case <-stdoutDone:
			stdoutDone = nil
		case <-stderrDone:
			stderrDone = nil
		case <-timer.C:
			w.log.Warn("worker: output still open after exit (held by a process outside its group); closing it",
				"waited", p.drainMax)
			_ = w.stdout.Close() // unblocks the reader; read ends, nothing to lose
			_ = w.stderr.Close()
		}
	}

	p.mu.Lock()
	ev := core.WorkerExited{Worker: w.id, Code: -1, Killed: w.killedFor}
	p.mu.Unlock()
	state, err := w.process.Wait()
	switch {
	case err != nil:
		w.log.Error("worker: reaping", "err", err)
		ev.Signal = "unknown"
	default:
		ws, _ := state.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			ev.Signal = ws.Signal().String()
		} else {
			ev.Code = ws.ExitStatus()
		}
	}
	w.log.Debug("worker exited", "code", ev.Code, "signal", ev.Signal)
	p.events(ev)

	p.mu.Lock()
	delete(p.workers, w.id)
	p.goroutines.Add(-1) // this one, done but for returning
	if len(p.workers) == 0 {
		close(p.idle)
	}
	p.mu.Unlock()
}

// pPID is waitid(2)'s idtype for "the process whose pid is id".
const pPID = 1

// WaitExited blocks until process pid, a child of the caller, has exited,
// and leaves it unreaped (WNOWAIT), so its pid cannot be reused while the
// caller still signals it and its process group: the pool kills what a
// worker left in its group this way, and pepsi-stage-check what the program
// it checks left in its own.
func WaitExited(pid int) error {
	var info [128]byte // siginfo_t; the result is not needed, only the wait
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info)), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return fmt.Errorf("waitid %d: %w", pid, errno)
		}
	}
}
