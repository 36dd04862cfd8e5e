package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core/conf"
)

// script writes an executable stage program and returns its path.
func script(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantCheckFails runs the check of the stage program at path and wants it to
// fail (exit 1) with a report that contains each of wants.
func wantCheckFails(t *testing.T, path string, wants ...string) {
	t.Helper()
	code, report := runCheck(t, path)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	wantReport(t, report, wants...)
}

// runCheck runs pepsi-stage-check with args and returns its exit code and report.
func runCheck(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out, errs bytes.Buffer
	code := run(context.Background(), append([]string{"-answer-wait", "500ms", "-exit-wait", "2s"}, args...), &out, &errs)
	t.Logf("pepsi-stage-check %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errs.String())
	return code, out.String()
}

func wantReport(t *testing.T, report string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(report, p) {
			t.Errorf("the report does not say %q", p)
		}
	}
}

// Proves: the example stages pass, in message mode, with generated messages,
// those that emit included, whose emits are reported with their answers.
func TestTheExampleStagesPass(t *testing.T) {
	for _, p := range []string{"../../examples/stages/words.py", "../../examples/stages/finish.sh",
		"../../examples/stages/split_csv.py", "../../examples/stages/fanout.sh"} {
		code, report := runCheck(t, p)
		if code != 0 {
			t.Errorf("%s: exit %d, want 0", p, code)
		}
		wantReport(t, report, "message 5 (id 5): answer", "exit status 0", "OK: every answer is valid")
		switch filepath.Base(p) {
		case "split_csv.py":
			wantReport(t, report, "message 1 (id 1): answer \"0 >done {\\\"rows\\\":1}\"", "emits 1 message(s): 1 to row")
		case "fanout.sh":
			wantReport(t, report, "valid: finish (done), emits 2 message(s): 2 to deliver")
		}
	}
}

// Proves: emit lines are checked with the answer they come before: valid ones
// are counted per stage; a malformed one, or more than -emit-max, makes the
// answer INVALID (the dispatcher fails that message) and fails the check;
// emits before a failure or a bare 0 are valid but named as inserting
// nothing; an emit line after the last answer is a stray line.
func TestEmitLinesAreCheckedWithTheirAnswer(t *testing.T) {
	p := script(t, "emits.sh", `#!/bin/sh
n=0
while read -r l; do
	n=$((n+1))
	case $n in
	1) echo '+{"stage":"row","payload":"a"}'; echo '+{"stage":"log","payload_base64":"/w=="}'; echo '+{"stage":"row","payload":"b"}'; echo '0 >done' ;;
	2) echo '+{"stage":"row","payload":"a","nope":1}'; echo '0 >done' ;;
	3) echo '+{"stage":"row","payload":"a"}'; echo '7 cannot split' ;;
	4) for i in 1 2 3 4; do echo '+{"stage":"row"}'; done; echo '0 >next' ;;
	*) echo '0 >done'; echo '+{"stage":"row","payload":"late"}' ;;
	esac
done
`)
	code, report := runCheck(t, "-emit-max", "3", p)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	wantReport(t, report,
		`message 1 (id 1): answer "0 >done"`, "valid: finish (done), emits 3 message(s): 2 to row, 1 to log",
		"message 2 (id 2): answer \"0 >done\"", "INVALID emit line 1:", "unknown field",
		`valid: the message fails (code 7, reason "cannot split"); but its 1 emit line(s) insert nothing`,
		"INVALID: 4 emit lines, more than -emit-max (EMIT_MAX) 3",
		`STRAY LINE: "+{\"stage\":\"row\",\"payload\":\"late\"}": an emit line after the last answer`,
		"NOTE: 1 emit line(s) came before an answer that is no transition", "FAILED")
}

// Proves: a stage that does not flush its answers shows as answers that came
// only at the end of input, with the likely cause named, and fails the check.
func TestAnUnflushedStageIsNamedAsSuch(t *testing.T) {
	// Its own buffered stdout, as Python's is on a pipe unless
	// PYTHONUNBUFFERED is set (which would hide the bug here).
	p := script(t, "unflushed.py", "#!/usr/bin/env python3\nimport sys\nout = open(1, 'w', buffering=8192)\nfor line in sys.stdin:\n    print('0 >done', file=out)\n")
	wantCheckFails(t, p, "LATE: it came only after the end of input", "standard output is not flushed", "FAILED")
}

// Proves: a Python stage that prints without flushing fails the check even
// when the caller's environment has PYTHONUNBUFFERED (and stdbuf's
// variables), which would flush it here but not under a dispatcher.
func TestAnUnflushedPythonStageFailsWhateverTheCallersPythonUnbuffered(t *testing.T) {
	t.Setenv("PYTHONUNBUFFERED", "1")
	t.Setenv("_STDBUF_O", "0")
	p := script(t, "prints.py", "#!/usr/bin/env python3\nimport sys\nfor line in sys.stdin:\n    print('0 >done')\n")
	wantCheckFails(t, p, "LATE: it came only after the end of input", "standard output is not flushed", "FAILED")
}

// Proves: a line on stdout before any input (a banner, a log) is reported.
func TestALogLineOnStdoutIsReported(t *testing.T) {
	p := script(t, "banner.sh", "#!/bin/sh\necho 'starting up'\nwhile read -r l; do echo '0 >done'; done\n")
	wantCheckFails(t, p, `BEFORE ANY INPUT: "starting up"`, "stdout carries answers only", "FAILED")
}

// Proves: answers ended by "\r\n" are read as pepsi-dispatch reads them,
// and a line of exactly the dispatcher's 65,536 bytes is valid (one byte
// more is not).
func TestCRLFAndALineOfTheLimitPass(t *testing.T) {
	pad := strings.Repeat("a", answerLineMax-len(`0 >done {"x":""}`))
	p := script(t, "crlf.sh", "#!/bin/sh\nwhile read -r l; do printf '0 >done b:5\\r\\n'; done\n")
	if code, report := runCheck(t, p); code != 0 {
		t.Errorf("a stage answering lines ended by CRLF: exit %d, want 0:\n%s", code, report)
	}
	p = script(t, "longest.sh", "#!/bin/sh\nwhile read -r l; do printf '0 >done {\"x\":\"%s\"}\\n' '"+pad+"'; done\n")
	if code, report := runCheck(t, p); code != 0 {
		t.Errorf("a stage answering lines of exactly %d bytes: exit %d, want 0:\n%.400s", answerLineMax, code, report)
	}
	p = script(t, "over.sh", "#!/bin/sh\nwhile read -r l; do printf '0 >done {\"x\":\"%s\"}\\n' '"+pad+"a'; done\n")
	wantCheckFails(t, p, "longer than 65536 bytes")
}

// Proves: two answers for one message leave stray lines, and fail the check.
func TestTwoAnswersForOneMessageAreStrayLines(t *testing.T) {
	p := script(t, "twice.sh", "#!/bin/sh\nwhile read -r l; do echo '0 >done'; echo '0 >done'; done\n")
	wantCheckFails(t, p, "STRAY LINE", "FAILED")
}

// Proves: bad answers are named per message: a line that is no status line, a
// bare 0 in message mode, a transition the dispatcher cannot write; a
// non-zero answer is a valid failure.
func TestBadAnswersAreNamedPerMessage(t *testing.T) {
	p := script(t, "bad.sh", `#!/bin/sh
n=0
while read -r l; do
	n=$((n+1))
	case $n in
	1) echo 'processing message' ;;
	2) echo '0' ;;
	3) echo '0 >next {"a":' ;;
	4) echo '7 no such address' ;;
	*) echo '0 >paused:1.5' ;;
	esac
done
`)
	wantCheckFails(t, p,
		`message 1 (id 1): answer "processing message"`, "does not start with an integer code",
		"INVALID for INPUT = message: a bare 0",
		"INVALID transition:",
		`valid: the message fails (code 7, reason "no such address")`,
		"valid: pause for 1.5s")
}

// Proves: a stage that exits in the middle of its input, or non-zero, is
// reported: the messages it never answered and its exit status.
func TestAStageThatExitsMidInputIsReported(t *testing.T) {
	p := script(t, "quits.sh", "#!/bin/sh\nread -r l; echo '0 >done'\nread -r l; echo '0 >done'\nexit 3\n")
	code, report := runCheck(t, p)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	// Message 3 may reach the pipe before the program exits (NO ANSWER) or
	// not (NOT READ); 4 and 5 never do.
	wantReport(t, report, "message 2 (id 2): answer", "message 4 (id 4): NOT READ", "message 5 (id 5): NOT READ", "exit status 3")
	if strings.Contains(report, "message 3 (id 3): answer") {
		t.Errorf("message 3 shows an answer")
	}
}

// Proves: a program that never reads its input, handed a message larger
// than a pipe holds, costs the check its answer wait, not the program's
// whole life: the message is NOT READ, and the report says why.
func TestAProgramThatNeverReadsItsInputDoesNotBlockTheCheck(t *testing.T) {
	p := script(t, "deaf.sh", "#!/bin/sh\nexec sleep 30\n")
	file := filepath.Join(t.TempDir(), "big.ndjson")
	big := `{"id":1,"payload":"` + strings.Repeat("x", 256<<10) + `"}` + "\n"
	if err := os.WriteFile(file, []byte(big+strings.Replace(big, `"id":1`, `"id":2`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	code, report := runCheck(t, "-messages", file, p)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	wantReport(t, report, "message 1 (id 1): NOT READ: the program did not read it within 500ms",
		"message 2 (id 2): NOT READ", "did not exit within 2s", "FAILED")
}

// Proves: a program that leaves a process in the background, holding its
// standard output and error open, is judged by its own exit, as
// pepsi-dispatch judges it (which kills what a worker left in its process
// group when it exits): it exited 0, and the check passes.
func TestAProcessLeftBehindHoldingTheOutputDoesNotHideTheExit(t *testing.T) {
	p := script(t, "helper.sh", "#!/bin/sh\nsleep 30 &\nwhile read -r l; do echo '0 >done'; done\n")
	code, report := runCheck(t, p)
	if code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	wantReport(t, report, "end of input: exit status 0", "OK: every answer is valid")
}

// Proves: a last line without a newline is judged as pepsi-dispatch judges
// it (docs/protocol.md): taken as the answer when the program exited by
// itself with status 0, dropped when it exited with another status or was
// killed by a signal (it may have been cut off); the report says which.
func TestALastLineWithoutNewlineIsTakenOnlyAtACleanExit(t *testing.T) {
	for _, c := range []struct{ end, how, verdict string }{
		{"exit 0", "it exited by itself with status 0", "pepsi-dispatch takes it"},
		{"exit 1", "it ended with exit status 1", "pepsi-dispatch drops it"},
		{"kill -KILL $$", "it ended with signal: killed", "pepsi-dispatch drops it"},
	} {
		// Message 5's answer is written whole, only without its newline.
		p := script(t, "tail.sh", "#!/bin/sh\nn=0\nwhile read -r l; do\n\tn=$((n+1))\n\tif [ $n -eq 5 ]; then printf '0 >done'; "+c.end+"; fi\n\techo '0 >done'\ndone\n")
		code, report := runCheck(t, p)
		wantReport(t, report, `LAST LINE WITHOUT NEWLINE: "0 >done"`, c.how, c.verdict)
		taken := c.end == "exit 0"
		if answered := strings.Contains(report, `message 5 (id 5): answer "0 >done"`); answered != taken {
			t.Errorf("%s: message 5 answered %v, want %v", c.end, answered, taken)
		}
		if want := map[bool]int{true: 0, false: 1}[taken]; code != want {
			t.Errorf("%s: exit %d, want %d", c.end, code, want)
		}
		if !taken {
			wantReport(t, report, `message 5 (id 5): NO ANSWER: its answer "0 >done" had no newline`)
		}
	}
}

// Proves: in id mode the stage gets decimal ids, and messages come from an
// NDJSON file when one is given, each handed on as the dispatcher would hand
// it, its order key, parent and trace context included.
func TestIDModeAndMessagesFromAFile(t *testing.T) {
	p := script(t, "echo.sh", "#!/bin/sh\nwhile read -r l; do echo \"0 >done {\\\"saw\\\":\\\"$l\\\"}\"; done\n")
	file := filepath.Join(t.TempDir(), "m.ndjson")
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if err := os.WriteFile(file, []byte(`{"id":42,"state":{"x":1},"payload":"a"}`+"\n"+`{"id":43,"payload_base64":"/w=="}`+"\n"+
		`{"id":44,"order_key":"acct-9","parent_id":3,"traceparent":"`+tp+`","payload":"c"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, report := runCheck(t, "-input", "id", "-messages", file, p)
	if code != 0 {
		t.Errorf("id mode: exit %d, want 0", code)
	}
	wantReport(t, report, `message 1 (id 42): answer "0 >done {\"saw\":\"42\"}"`, "message 2 (id 43)")
	dir := t.TempDir()
	keep := script(t, "keep.sh", "#!/bin/sh\nwhile read -r l; do printf '%s\\n' \"$l\" >> "+dir+"/lines; echo '0 >done'; done\n")
	code, _ = runCheck(t, "-messages", file, keep)
	if code != 0 {
		t.Errorf("message mode: exit %d, want 0", code)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "lines"))
	want := `{"id":42,"stage":"check","attempts":0,"state":{"x":1},"payload":"a"}` + "\n" + `{"id":43,"stage":"check","attempts":0,"state":{},"payload_base64":"/w=="}` + "\n" +
		`{"id":44,"stage":"check","attempts":0,"order_key":"acct-9","parent_id":3,"traceparent":"` + tp + `","state":{},"payload":"c"}` + "\n"
	if string(got) != want {
		t.Errorf("the stage read\n%s\nwant\n%s", got, want)
	}
}

// Proves: with -queue-limit N, up to N messages are handed to the program
// before its answers are read, as pepsi-dispatch does with QUEUE_LIMIT: a
// stage that answers only once it has read three messages answers each batch
// at once with -queue-limit 3, and only after the answer wait of the
// messages before, one at a time.
func TestQueueLimitHandsSeveralMessagesBeforeTheAnswers(t *testing.T) {
	p := script(t, "threes.sh", "#!/bin/sh\nwhile read -r a && read -r b && read -r c; do printf '0 >done\\n0 >done\\n0 >done\\n'; done\n")
	const wait = 300 * time.Millisecond
	for _, limit := range []int{3, 1} {
		o := options{input: conf.InputMessage, count: 6, stage: "check", queueLimit: limit, answerWait: wait, exitWait: 2 * time.Second, argv: []string{p, "worker"}}
		inputs, err := o.inputs()
		if err != nil {
			t.Fatal(err)
		}
		var errs bytes.Buffer
		rep, err := check(context.Background(), o, inputs, &errs)
		if err != nil {
			t.Fatalf("-queue-limit %d: %v (%s)", limit, err, errs.String())
		}
		var out bytes.Buffer
		rep.print(&out)
		t.Logf("-queue-limit %d:\n%s", limit, out.String())
		if !rep.ok() {
			t.Errorf("-queue-limit %d: the check failed; want every answer valid", limit)
		}
		first := rep.results[0].wait
		switch {
		case limit == 3 && first >= wait:
			t.Errorf("-queue-limit 3: the first answer took %s; want it within %s, the batch handed at once", first, wait)
		case limit == 1 && first < 2*wait:
			t.Errorf("-queue-limit 1: the first answer took %s; want at least %s (messages 2 and 3 go only after the wait of the one before)", first, 2*wait)
		}
	}
	if code, report := runCheck(t, "-queue-limit", "3", "-n", "6", p); code != 0 || !strings.Contains(report, "6 messages fed up to 3 unanswered at a time") {
		t.Errorf("-queue-limit 3 from the command line: exit %d; want 0 and the report to say how messages were fed", code)
	}
}

// Proves: a -messages file is read by the parser pepsi-queue enqueue -ndjson
// and pepsi-ingress share: a line without an id is refused with the line's
// number, and a payload that is not a string is its JSON text.
func TestMessagesFileUsesTheSharedParser(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.ndjson")
	if err := os.WriteFile(bad, []byte(`{"id":1,"payload":"a"}`+"\n"+`{"payload":"b"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"-messages", bad, "/bin/cat"}, &out, &errs); code != exitUsage || !strings.Contains(errs.String(), `bad.ndjson:2: no positive "id"`) {
		t.Errorf("a line without an id: exit %d, %q; want %d and the line named", code, errs.String(), exitUsage)
	}
	good := filepath.Join(dir, "good.ndjson")
	if err := os.WriteFile(good, []byte(`{"id":5,"payload":{"a": [1, 2]}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{input: conf.InputMessage, file: good, stage: "check"}
	inputs, err := o.inputs()
	if want := `{"id":5,"stage":"check","attempts":0,"state":{},"payload":"{\"a\":[1,2]}"}`; err != nil || len(inputs) != 1 || inputs[0].line != want {
		t.Errorf("a JSON payload: %+v, %v; want the line %s", inputs, err, want)
	}
}

// Proves: -h and -version, asked for, print to standard output and exit 0;
// the help after a mistake (no PROGRAM) goes to standard error.
func TestHelpAndVersionGoToStandardOutput(t *testing.T) {
	for args, want := range map[string]string{"-h": "-queue-limit", "-version": "pepsi-stage-check "} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{args}, &stdout, &stderr)
		if code != 0 || !strings.Contains(stdout.String(), want) || stderr.Len() != 0 {
			t.Errorf("pepsi-stage-check %s: exit %d, stdout %q, stderr %q; want 0 and %q on stdout only", args, code, stdout.String(), stderr.String(), want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), nil, &stdout, &stderr); code != exitUsage || stdout.Len() != 0 || !strings.Contains(stderr.String(), "-queue-limit") {
		t.Errorf("no PROGRAM: exit %d, stdout %q, stderr %q; want %d and the help on stderr", code, stdout.String(), stderr.String(), exitUsage)
	}
}

// Proves: a count or a wait out of range is a bad command line (exit 2) whose
// error names the flag and its value.
func TestAFlagOutOfRangeIsNamed(t *testing.T) {
	for _, args := range [][]string{{"-n", "0"}, {"-queue-limit", "-1"}, {"-answer-wait", "0s"}} {
		var out, errs bytes.Buffer
		code := run(context.Background(), append(args, "/bin/cat"), &out, &errs)
		if want := args[0] + " " + args[1] + ": must be positive"; code != 2 || !strings.Contains(errs.String(), want) {
			t.Errorf("%v: exit %d, %q; want exit 2 and %q", args, code, errs.String(), want)
		}
	}
}
