// Command pepsi-stage-check checks a stage program against the worker protocol
// (docs/protocol.md) with no database and no dispatcher: it starts the program
// as pepsi-dispatch would, feeds it messages (one at a time, or up to
// -queue-limit unanswered as pepsi-dispatch does), and reports for each
// the answer, whether it parses as a status line, and how long it took; then
// lines nobody asked for, and how the program ended at the end of its input.
// Emit lines ("+{…}") before an answer belong to its message: each is read
// by the dispatcher's own reader, and emits before an answer that inserts
// none of them are named.
// It exits 0 only when every answer is valid. See docs/pepsi-stage-check.1.md.
//
// It never connects to a database and never writes anything but its report.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/cliflags"
	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
	"github.com/pepsi-pipeline/pepsi/shell/worker"
)

// Exit codes.
const (
	exitOK      = 0
	exitInvalid = 1 // the program broke the protocol somewhere
	exitUsage   = 2
)

// answerLineMax is the longest answer line pepsi-dispatch reads (a longer one
// is a protocol error there).
const answerLineMax = core.AnswerMax

const usage = `usage: pepsi-stage-check [flags] PROGRAM [ARGS...]

Checks the stage program PROGRAM against the PEPSI worker protocol with no
database and no dispatcher. It is started as "PROGRAM worker" (or "PROGRAM
ARGS..." when ARGS are given), fed one message at a time (up to -queue-limit
unanswered), and each answer is checked. Exit status 0 only when every answer
is valid.

flags:
`

func main() {
	cliflags.Main(run)
}

// options are the command line.
type options struct {
	input      conf.Input
	file       string
	count      int
	stage      string
	queueLimit int
	emitMax    int
	answerWait time.Duration
	exitWait   time.Duration
	argv       []string
}

// parse reads the command line. The help and the version, asked for, go to
// stdout; the help after a mistake (no PROGRAM) to stderr.
func parse(args []string, stdout, stderr io.Writer) (options, error) {
	fs := cliflags.NewFlagSet("pepsi-stage-check", usage, stdout)
	var o options
	input := fs.String("input", "message", "what the stage reads: message (INPUT = message: one JSON message per line) or id (one message id per line)")
	fs.StringVar(&o.file, "messages", "", "NDJSON file of messages to feed, one JSON object per line as in the message line format (default: generated)")
	fs.IntVar(&o.count, "n", 5, "how many messages to generate when -messages is not given")
	fs.StringVar(&o.stage, "stage", "check", "the stage name: PEPSI_STAGE, and the stage of generated messages")
	fs.IntVar(&o.queueLimit, "queue-limit", 1, "how many messages the program may hold unanswered, as QUEUE_LIMIT in pepsi.conf: more are written only as answers come (1: one at a time, each answer timed alone)")
	fs.IntVar(&o.emitMax, "emit-max", conf.DefaultEmitMax, "the stage's EMIT_MAX in pepsi.conf: the most emit lines one message may have")
	fs.DurationVar(&o.answerWait, "answer-wait", 2*time.Second, "how long to wait for each answer before calling it missing")
	fs.DurationVar(&o.exitWait, "exit-wait", 5*time.Second, "how long the program may take to exit after the end of its input")
	if _, err := cliflags.Parse(fs, args, ""); err != nil {
		return o, err
	}
	o.input = conf.Input(*input)
	if o.input != conf.InputMessage && o.input != conf.InputID {
		return o, fmt.Errorf("-input %q: want message or id", *input)
	}
	if fs.NArg() == 0 {
		fs.SetOutput(stderr)
		fs.Usage()
		return o, errors.New("no PROGRAM given")
	}
	for _, c := range []struct {
		name string
		bad  bool
	}{{"n", o.count < 1}, {"queue-limit", o.queueLimit < 1}, {"answer-wait", o.answerWait <= 0}, {"exit-wait", o.exitWait <= 0}} {
		if c.bad {
			return o, fmt.Errorf("-%s %s: must be positive", c.name, fs.Lookup(c.name).Value)
		}
	}
	if o.emitMax < 0 || o.emitMax > conf.EmitMaxMax {
		return o, fmt.Errorf("-emit-max %d: want 0 to %d, as EMIT_MAX", o.emitMax, conf.EmitMaxMax)
	}
	if !conf.ValidStageName(o.stage) {
		return o, fmt.Errorf("-stage %q is not a stage name", o.stage)
	}
	o.argv = fs.Args()
	if len(o.argv) == 1 {
		o.argv = append(o.argv, "worker")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stdout, stderr)
	if err != nil {
		return cliflags.Fail(stderr, "pepsi-stage-check", err) // 0 after -h and -version
	}
	inputs, err := o.inputs()
	if err != nil {
		fmt.Fprintln(stderr, "pepsi-stage-check:", err)
		return exitUsage
	}
	rep, err := check(ctx, o, inputs, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "pepsi-stage-check:", err)
		return exitUsage
	}
	rep.print(stdout)
	if rep.ok() {
		return exitOK
	}
	return exitInvalid
}

// input is one message to feed: its id and the line the program gets.
type input struct {
	id   int64
	line string
}

// inputs are the messages to feed, from -messages or generated.
func (o options) inputs() ([]input, error) {
	if o.file == "" {
		var in []input
		for i := 1; i <= o.count; i++ {
			in = append(in, o.generated(int64(i)))
		}
		return in, nil
	}
	f, err := os.Open(o.file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), conf.LineMaxMax)
	var in []input
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		x, err := o.fromFile(sc.Bytes())
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", o.file, n, err)
		}
		in = append(in, x)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", o.file, err)
	}
	if len(in) == 0 {
		return nil, fmt.Errorf("%s: no messages", o.file)
	}
	return in, nil
}

// generated is message id as the dispatcher would hand it: a few kinds of
// payload in turn (text, NULL, bytes that are not UTF-8, text with escapes).
func (o options) generated(id int64) input {
	msg := &core.Message{State: fmt.Sprintf(`{"n": %d}`, id), PayloadSize: -1}
	switch id % 4 {
	case 1:
		msg.Payload = []byte(fmt.Sprintf("Subject: message %d\r\n\r\nhello world", id))
	case 2:
	case 3:
		msg.Payload = []byte{0xff, 0xfe, byte(id)}
	case 0:
		msg.Payload = []byte("quotes \" and \\ and tabs\t and é ☃")
	}
	if msg.Payload != nil {
		msg.PayloadSize = len(msg.Payload)
	}
	return o.line(core.Row{ID: id, Stage: o.stage, Message: msg})
}

// fromFile reads one NDJSON message in the line format (docs/protocol.md):
// at least an id; stage, attempts, order_key, parent_id, traceparent, state,
// payload or payload_base64, read by the parser pepsi-queue and
// pepsi-ingress read messages with, and each handed on as the dispatcher
// would hand it.
func (o options) fromFile(b []byte) (input, error) {
	m, err := msgjson.Parse(b, msgjson.Fields{Line: true, Stage: true})
	if err != nil {
		return input{}, err
	}
	if m.Stage == "" {
		m.Stage = o.stage
	}
	msg := &core.Message{State: string(m.State), Payload: m.Payload, PayloadSize: -1, ParentID: m.ParentID}
	if m.State == nil {
		msg.State = "{}"
	}
	if m.Payload != nil {
		msg.PayloadSize = len(m.Payload)
	}
	x := o.line(core.Row{ID: m.ID, Stage: m.Stage, Attempts: m.Attempts, Message: msg, Key: m.OrderKey, Trace: core.Trace{Pass: m.TraceParent}})
	if x.line == "" {
		return input{}, errors.New("it cannot be handed to an INPUT = message stage (too large?)")
	}
	return x, nil
}

// line is the input line of r in o's input mode.
func (o options) line(r core.Row) input {
	if o.input == conf.InputID {
		return input{id: r.ID, line: strconv.FormatInt(r.ID, 10)}
	}
	line, _ := core.MessageLine(r, conf.LineMaxMax)
	return input{id: r.ID, line: line}
}

// output is one line the program wrote, and when.
type output struct {
	line string
	at   time.Time
	long bool // longer than pepsi-dispatch reads
	// unterminated: the program's output ended in this line, with no
	// newline. pepsi-dispatch takes such a line only once the program's exit
	// says it was not cut off (judgeTail).
	unterminated bool
}

// result is what became of one input.
type result struct {
	in      input
	answer  *output
	emits   []output      // its emit lines, the first emitMax+1 of them
	nEmits  int           // how many emit lines came before its answer
	dropped int           // emit lines valid but before an answer that inserts none
	sent    time.Time     // when it was written
	wait    time.Duration // from writing the input to its answer
	late    bool          // the answer came only after the end of input
	verdict string        // how the answer reads, or what is wrong
	valid   bool
}

// report is the whole check.
type report struct {
	o       options
	early   []output // lines before the first input
	results []result
	stray   []output // lines beyond the inputs
	exit    string
	exitOK  bool
	tail    *tail // the last line, when it had no newline
}

// tail is a last line written without a newline, and how pepsi-dispatch
// would judge it by the way the program ended.
type tail struct {
	line  output
	taken bool   // the program exited by itself with status 0
	how   string // how it ended, for the report
}

// dropped counts the valid emit lines that insert nothing.
func (r *report) dropped() int {
	n := 0
	for _, x := range r.results {
		n += x.dropped
	}
	return n
}

func (r *report) ok() bool {
	if len(r.early) > 0 || len(r.stray) > 0 || !r.exitOK || (r.tail != nil && !r.tail.taken) {
		return false
	}
	for _, x := range r.results {
		if !x.valid {
			return false
		}
	}
	return true
}

// check runs the program over inputs.
func check(ctx context.Context, o options, inputs []input, stderr io.Writer) (*report, error) {
	p, err := start(o, stderr)
	if err != nil {
		return nil, err
	}
	defer p.kill()
	rep := &report{o: o}
	// A program that writes before it has read anything (a banner, a log line
	// on stdout, an answer for nothing) shows here.
	rep.early = collect(p.lines, time.After(min(o.answerWait, 300*time.Millisecond)))
	f := &feeder{program: p, o: o, rep: rep}
	if err := f.feed(ctx, inputs); err != nil {
		return nil, err
	}
	f.finish()
	for i := range rep.results {
		rep.results[i].judge(o)
	}
	return rep, nil
}

// program is the stage program, running: its standard input, the lines of
// its standard output, and its exit.
type program struct {
	cmd    *exec.Cmd
	stdin  *os.File
	lines  chan output
	exited chan error
	// errDone is closed once the program's standard error is copied out.
	errDone chan struct{}
	// reaped is set, under mu, just before the program is reaped: from then
	// on its pid may name another process, and it is never signalled.
	mu     sync.Mutex
	reaped bool
}

// kill kills the program and its process group, unless it has exited.
func (p *program) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// wait reports the program's exit once it has exited, as pepsi-dispatch
// sees it: what the program left in its process group (a helper in the
// background, holding its output open) is killed when it exits, before it
// is reaped, so its output ends with it.
func (p *program) wait() {
	err := worker.WaitExited(p.cmd.Process.Pid)
	p.mu.Lock()
	if err == nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // exited, not reaped: its pid still names its group
	}
	p.reaped = true
	p.mu.Unlock()
	p.exited <- p.cmd.Wait()
}

// start starts the program as pepsi-dispatch would, in a process group of
// its own.
func start(o options, stderr io.Writer) (*program, error) {
	cmd := exec.Command(o.argv[0], o.argv[1:]...)
	cmd.Env = environment(o)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Pipes of our own, not StdinPipe and the like: writes to standard
	// input take a deadline (see feeder.write), so a program that never
	// reads cannot block the check; Wait, which runs beside the reads,
	// must not close a read end before all of it is read (readLines closes
	// it at its end), nor wait for a copy of standard error that a process
	// the program left behind holds open.
	var ends [6]*os.File // stdin's read and write ends, then stdout's, then stderr's
	for i := 0; i < len(ends); i += 2 {
		var err error
		if ends[i], ends[i+1], err = os.Pipe(); err != nil {
			closeFiles(ends[:i]...)
			return nil, err
		}
	}
	in, stdin, out, outW, errR, errW := ends[0], ends[1], ends[2], ends[3], ends[4], ends[5]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, outW, errW
	err := cmd.Start()
	closeFiles(in, outW, errW) // the program's ends: it has its own copies
	if err != nil {
		closeFiles(stdin, out, errR)
		return nil, fmt.Errorf("start %s: %w", o.argv[0], err)
	}
	p := &program{cmd: cmd, stdin: stdin, lines: make(chan output, 1024), exited: make(chan error, 1), errDone: make(chan struct{})}
	go func() {
		defer out.Close()
		readLines(out, p.lines)
	}()
	go func() {
		defer close(p.errDone)
		defer errR.Close()
		_, _ = io.Copy(prefixed{w: stderr, prefix: "stage stderr: "}, errR)
	}()
	go p.wait()
	return p, nil
}

// feeder hands the inputs to the program, up to o.queueLimit of them
// unanswered at a time, as pepsi-dispatch hands a worker up to QUEUE_LIMIT
// messages, and takes the answers in order.
type feeder struct {
	*program
	o   options
	rep *report
	// held is a last line without a newline, kept until the program's exit
	// says whether pepsi-dispatch would take it; heldLate: it came after
	// the end of input.
	held     *output
	heldLate bool
	// pending are the inputs written and not yet answered, in order; open
	// counts those of them still within their answer wait (the window: one
	// past its wait no longer holds back the next input, but an answer still
	// counts for it first, answers being in order).
	pending []int
	open    int
}

// feed writes every input and waits for the answers within their wait.
func (f *feeder) feed(ctx context.Context, inputs []input) error {
	next := 0
	for next < len(inputs) || f.open > 0 {
		for next < len(inputs) && f.open < f.o.queueLimit {
			if !f.write(inputs, next) {
				return nil
			}
			next++
		}
		oldest := f.rep.results[f.pending[len(f.pending)-f.open]]
		select {
		case l, ok := <-f.lines:
			if !ok {
				f.notRead(inputs[next:], "NOT READ: the program had closed its output (exited?)")
				return nil
			}
			f.take(l, false)
		case <-time.After(time.Until(oldest.sent.Add(f.o.answerWait))):
			f.open-- // the oldest open input's wait is over
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// write writes input i; false if it could not (then it and the rest are not
// read). A write the program does not take within -answer-wait (it does not
// read its input, and the pipe is full) is given up: pepsi-dispatch's
// writes never wait on a worker, but this one would wait for ever.
func (f *feeder) write(inputs []input, i int) bool {
	f.rep.results = append(f.rep.results, result{in: inputs[i], sent: time.Now()})
	_ = f.stdin.SetWriteDeadline(time.Now().Add(f.o.answerWait)) // a pipe: it takes deadlines
	_, err := io.WriteString(f.stdin, inputs[i].line+"\n")
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		f.rep.results[i].verdict = fmt.Sprintf("NOT READ: the program did not read it within %s (its standard input stayed full): a stage must read each message as it comes", f.o.answerWait)
		f.notRead(inputs[i+1:], "NOT READ: the program had stopped reading its input")
		return false
	case err != nil:
		f.rep.results[i].verdict = fmt.Sprintf("NOT READ: could not be written (%v): the program stopped reading its input", err)
		f.notRead(inputs[i+1:], "NOT READ: the program had stopped reading its input")
		return false
	}
	f.pending = append(f.pending, i)
	f.open++
	return true
}

// notRead reports inputs as never read, saying why.
func (f *feeder) notRead(inputs []input, why string) {
	for _, in := range inputs {
		f.rep.results = append(f.rep.results, result{in: in, verdict: why})
	}
}

// take answers with l, or holds it for judgeTail when the output ended in it
// with no newline, as pepsi-dispatch holds it until the worker's exit.
func (f *feeder) take(l output, late bool) {
	if l.unterminated {
		f.held, f.heldLate = &l, late
		return
	}
	f.answered(l, late)
}

// answered gives line l to the oldest unanswered input, or calls it stray.
// An emit line belongs to that input too, and leaves it unanswered.
func (f *feeder) answered(l output, late bool) {
	if len(f.pending) == 0 {
		f.rep.stray = append(f.rep.stray, l)
		return
	}
	x := &f.rep.results[f.pending[0]]
	if core.IsEmitLine(l.line) {
		if x.nEmits++; len(x.emits) <= f.o.emitMax { // bounded: one past the limit tells enough
			x.emits = append(x.emits, l)
		}
		return
	}
	if len(f.pending) <= f.open {
		f.open-- // it was still within its wait
	}
	f.pending = f.pending[1:]
	x.answer, x.late = &l, late
	x.wait = l.at.Sub(x.sent)
}

// finish closes the program's input and takes what it writes until it exits
// (or exitWait passes): answers that come now are late, the rest stray.
func (f *feeder) finish() {
	_ = f.stdin.Close()
	end := time.Now()
	deadline := time.After(f.o.exitWait)
	var exitErr error
	exitedOK := false
	lines, exited, errDone := f.lines, f.exited, f.errDone
collect:
	for lines != nil || exited != nil || errDone != nil {
		select {
		case <-errDone:
			errDone = nil
		case l, ok := <-lines:
			if !ok {
				lines = nil
				continue
			}
			f.take(l, true)
		case exitErr = <-exited:
			exitedOK, exited = true, nil
		case <-deadline:
			break collect
		}
	}
	switch {
	case !exitedOK:
		f.rep.exit = fmt.Sprintf("did not exit within %s of the end of its input (killed): a stage must finish, answer and exit 0", f.o.exitWait)
	case exitErr == nil:
		f.rep.exit, f.rep.exitOK = fmt.Sprintf("exit status 0, %s after the end of its input", time.Since(end).Round(time.Millisecond)), true
	default:
		f.rep.exit = fmt.Sprintf("%v at the end of its input: a stage must exit 0 once it has answered everything", exitErr)
	}
	f.judgeTail(exitedOK, exitErr)
}

// judgeTail judges a held last line (no newline) as pepsi-dispatch does
// (core's judgeTail, docs/protocol.md): it is taken as a line like any
// other only if the program exited by itself with status 0; else it is
// dropped, for a program killed or failing mid-write may have been cut off
// ("0 >b" of "0 >bx" would send the message elsewhere).
func (f *feeder) judgeTail(exited bool, exitErr error) {
	if f.held == nil {
		return
	}
	t := &tail{line: *f.held}
	switch {
	case !exited:
		t.how = fmt.Sprintf("it did not exit within %s and was killed", f.o.exitWait)
	case exitErr == nil:
		t.taken, t.how = true, "it exited by itself with status 0"
	default:
		t.how = fmt.Sprintf("it ended with %v", exitErr)
	}
	f.rep.tail = t
	if t.taken {
		f.answered(t.line, f.heldLate)
		return
	}
	if len(f.pending) > 0 && !core.IsEmitLine(t.line.line) {
		// Name the dropped line where the author looks: its message's line.
		f.rep.results[f.pending[0]].verdict = fmt.Sprintf("NO ANSWER: its answer %q had no newline and %s, so pepsi-dispatch drops it", clip(t.line.line), t.how)
	}
}

// judge decides whether a result's answer is valid.
func (x *result) judge(o options) {
	if x.verdict != "" {
		return
	}
	if x.answer == nil {
		x.verdict = fmt.Sprintf("NO ANSWER (none within %s, none before exit)", o.answerWait)
		return
	}
	if x.answer.long {
		x.verdict = fmt.Sprintf("INVALID: the line is longer than %d bytes, which pepsi-dispatch treats as a protocol error", answerLineMax)
		return
	}
	st, err := core.ParseStatus(x.answer.line)
	switch {
	case err != nil:
		x.verdict = "INVALID: " + err.Error() + " (a log line on stdout? logs go to stderr)"
		return
	case x.late:
		x.verdict = fmt.Sprintf("LATE: it came only after the end of input, not within %s: likely cause: standard output is not flushed after each answer", o.answerWait)
		return
	}
	if bad := x.badEmit(o); bad != "" {
		x.verdict = bad
		return
	}
	x.valid = true
	switch t := st.Transition; {
	case st.Code != 0:
		x.verdict = fmt.Sprintf("valid: the message fails (code %d, reason %q)", st.Code, st.Reason)
	case t == nil && o.input == conf.InputMessage:
		x.valid = false
		x.verdict = "INVALID for INPUT = message: a bare 0 says the stage wrote its transition itself, which a stage with no database cannot do; answer 0 >TARGET"
	case t == nil:
		x.verdict = "valid: success, the stage wrote its transition itself"
	case t.Invalid != "":
		x.valid = false
		x.verdict = "INVALID transition: " + t.Invalid
	default:
		what := "advance to stage " + t.To
		switch t.To {
		case core.TargetDone:
			what = "finish (done)"
		case core.TargetPaused:
			what = fmt.Sprintf("pause for %s", t.PauseFor)
		}
		x.verdict = "valid: " + what
		if t.Patch != "" {
			x.verdict += ", state patch " + t.Patch
		}
	}
	if len(st.Fused) > 0 {
		x.verdict += fmt.Sprintf(", %d fused stage(s)", len(st.Fused))
	}
	x.judgeEmits(st)
}

// badEmit is the verdict on the first emit line the dispatcher would fail
// the message for (read by its own reader), or "". Whether the stage an emit
// names is configured is the dispatcher's to check.
func (x *result) badEmit(o options) string {
	const fails = ": pepsi-dispatch fails the message, and inserts none of its emits"
	if x.nEmits > o.emitMax {
		return fmt.Sprintf("INVALID: %d emit lines, more than -emit-max (EMIT_MAX) %d%s", x.nEmits, o.emitMax, fails)
	}
	for i, e := range x.emits {
		if e.long {
			return fmt.Sprintf("INVALID emit line %d: longer than %d bytes%s", i+1, answerLineMax, fails)
		}
		if _, err := core.ParseEmit(e.line); err != nil {
			return fmt.Sprintf("INVALID emit line %d: %q: %v%s", i+1, clip(e.line), err, fails)
		}
	}
	return ""
}

// judgeEmits adds a valid answer's emits to its verdict: the messages they
// make, or, before an answer the dispatcher does not write (a bare 0, a
// failure, a retry), that they insert nothing.
func (x *result) judgeEmits(st core.Status) {
	if x.nEmits == 0 {
		return
	}
	if st.Code != 0 || st.Transition == nil {
		x.dropped = x.nEmits
		x.verdict += fmt.Sprintf("; but its %d emit line(s) insert nothing: emits count only before an answered transition (0 >TARGET); pepsi-dispatch counts them in emits_dropped", x.nEmits)
		return
	}
	per := map[string]int{}
	var order []string
	for _, e := range x.emits {
		em, _ := core.ParseEmit(e.line) // badEmit read them all
		if per[em.Stage]++; per[em.Stage] == 1 {
			order = append(order, em.Stage)
		}
	}
	var to []string
	for _, stage := range order {
		to = append(to, fmt.Sprintf("%d to %s", per[stage], stage))
	}
	x.verdict += fmt.Sprintf(", emits %d message(s): %s", x.nEmits, strings.Join(to, ", "))
}

func (r *report) print(w io.Writer) {
	fed := "one at a time"
	if r.o.queueLimit > 1 {
		fed = fmt.Sprintf("up to %d unanswered at a time", r.o.queueLimit)
	}
	fmt.Fprintf(w, "pepsi-stage-check: %s, INPUT = %s, stage %s, %d messages fed %s\n",
		strings.Join(r.o.argv, " "), r.o.input, r.o.stage, len(r.results), fed)
	for _, l := range r.early {
		fmt.Fprintf(w, "BEFORE ANY INPUT: %q: a line on stdout before the program read anything (a banner or a log line? stdout carries answers only)\n", clip(l.line))
	}
	for i, x := range r.results {
		fmt.Fprintf(w, "message %d (id %d): ", i+1, x.in.id)
		if x.answer != nil {
			fmt.Fprintf(w, "answer %q", clip(x.answer.line))
			if !x.late {
				fmt.Fprintf(w, " after %s", x.wait.Round(10*time.Microsecond))
			}
			fmt.Fprint(w, ": ")
		}
		fmt.Fprintln(w, x.verdict)
	}
	for _, l := range r.stray {
		if core.IsEmitLine(l.line) {
			fmt.Fprintf(w, "STRAY LINE: %q: an emit line after the last answer (emit lines go before the answer of the message that emits them)\n", clip(l.line))
			continue
		}
		fmt.Fprintf(w, "STRAY LINE: %q: more lines than messages (a log line on stdout, or two answers for one message?)\n", clip(l.line))
	}
	if n := r.dropped(); n > 0 {
		fmt.Fprintf(w, "NOTE: %d emit line(s) came before an answer that is no transition (a bare 0, a failure, a retry): valid, but pepsi-dispatch inserts none of them\n", n)
	}
	if t := r.tail; t != nil {
		fmt.Fprintf(w, "LAST LINE WITHOUT NEWLINE: %q: the program's output ended in this line with no newline; %s, so ", clip(t.line.line), t.how)
		if t.taken {
			fmt.Fprintln(w, "pepsi-dispatch takes it as a line like any other (still, end every line with a newline)")
		} else {
			fmt.Fprintln(w, "pepsi-dispatch drops it with a warning, not taken as an answer (it may have been cut off): end every line with a newline")
		}
	}
	fmt.Fprintln(w, "end of input:", r.exit)
	if r.ok() {
		fmt.Fprintln(w, "OK: every answer is valid")
	} else {
		fmt.Fprintln(w, "FAILED: the stage does not follow the protocol (docs/protocol.md)")
	}
}

// environment is the program's environment as pepsi-dispatch would give it:
// PEPSI_STAGE set, and for INPUT = message no database variables and
// PEPSI_INPUT=message; less the variables that flush standard output for the
// program (unbuffered), which the caller's shell may have but a dispatcher
// under a service manager has not.
func environment(o options) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PEPSI_STAGE=") || strings.HasPrefix(kv, "PEPSI_INPUT=") {
			continue
		}
		if name, _, _ := strings.Cut(kv, "="); unbuffers(name) {
			continue
		}
		if o.input == conf.InputMessage && worker.NamesDatabase(kv) {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PEPSI_STAGE="+o.stage)
	if o.input == conf.InputMessage {
		env = append(env, "PEPSI_INPUT=message")
	}
	return env
}

// unbuffers reports whether the variable called name makes a program flush
// its standard output by itself: PYTHONUNBUFFERED (Python), and stdbuf(1)'s
// _STDBUF_I, _STDBUF_O and _STDBUF_E. With one of them inherited from the
// caller an unflushed stage would pass the check and then hang under
// pepsi-dispatch, where nothing sets them.
func unbuffers(name string) bool {
	return name == "PYTHONUNBUFFERED" || strings.HasPrefix(name, "_STDBUF_")
}

// readLines sends each line of r, then closes lines. A last line with no
// newline is sent marked unterminated, and keeps a "\r" at its end, as
// pepsi-dispatch reads it (shell/worker's readLines); a line that overflows
// the reader's buffer is a protocol error there at once, ended or not.
func readLines(r io.Reader, lines chan<- output) {
	defer close(lines)
	br := bufio.NewReaderSize(r, answerLineMax+2) // a line of answerLineMax bytes and its "\r\n"
	for {
		b, err := br.ReadSlice('\n')
		long := false
		var buf []byte
		buf = append(buf, b...)
		for errors.Is(err, bufio.ErrBufferFull) {
			long = true
			b, err = br.ReadSlice('\n')
			if len(buf) < 2*answerLineMax {
				buf = append(buf, b...)
			}
		}
		if len(buf) > 0 {
			line, ended := strings.CutSuffix(string(buf), "\n")
			if ended {
				line = strings.TrimSuffix(line, "\r")
			}
			lines <- output{line: line, at: time.Now(), long: long || len(line) > answerLineMax, unterminated: !ended && !long}
		}
		if err != nil {
			return
		}
	}
}

// closeFiles closes pipe ends: the program's after it started, or all of
// them when it could not.
func closeFiles(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// collect takes the lines that arrive until done.
func collect(lines <-chan output, done <-chan time.Time) []output {
	var got []output
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return got
			}
			got = append(got, l)
		case <-done:
			return got
		}
	}
}

// prefixed writes the program's standard error with a prefix on each line.
type prefixed struct {
	w      io.Writer
	prefix string
}

func (p prefixed) Write(b []byte) (int, error) {
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if l != "" {
			fmt.Fprint(p.w, p.prefix+l)
		}
	}
	return len(b), nil
}

// clip shortens a line for the report.
func clip(s string) string {
	if len(s) <= 200 {
		return s
	}
	return strings.ToValidUTF8(s[:200], "") + "…"
}
