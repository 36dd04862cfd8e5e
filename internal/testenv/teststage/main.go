// Command teststage is the scriptable stage program of the pepsi-dispatch
// integration tests (shell/dispatch). Each message's payload is a script that
// says, per stage, what the worker does with it, so a test can provoke any
// behaviour of a real stage program: advance, finish, pause, answer non-zero,
// crash before or after committing, hang, break the protocol, answer 0 without
// moving the row, report fused stages, write to standard error.
//
// It never decides anything on its own: with no script for its stage a message
// is finished as done. It is test code, built by the tests' TestMain; nothing
// else may depend on it.
//
// # Personalities
//
// The program's behaviour as a whole is chosen by the name it is started as
// (argv[0], a symbolic link to the one binary):
//
//   - teststage: speaks the worker protocol itself (raw), so it can misbehave in
//     every way the protocol allows, and records what it sees;
//   - libstage: serves the stage through the stage library (stage.Main), with
//     "tag" fused into every other stage's pass; the library reconnects and
//     reruns a message whose connection was cut, which the burst tests need;
//   - exitstage: exits 1 at start without reading anything (a broken deployment);
//   - eagerstage: teststage that first answers "0" before it has read any id;
//   - relaystage: a worker that carries its standard input and output over TCP
//     to the address in PEPSI_RELAY_ADDR (stage/relay), as "ssh host
//     stage" would;
//   - filterstage: an INPUT = message stage that finishes every message
//     ("0 >done") and records, per message, how many lines it held at once
//     (beside its -c configuration file as every personality does, or, started
//     without -c as the relay tests' far host starts it, in the file named by
//     TESTSTAGE_RECORD).
//
// # Scripts
//
// A payload is "STAGE=ALTS;STAGE=ALTS…". ALTS is "ACTION|ACTION…": the k-th pass
// of the message through the stage runs the k-th action (the last one repeats);
// the pass count is kept in the row's state as n_STAGE. An ACTION is
// "OP+OP…", run in order; an OP is NAME or NAME:ARG:
//
//	advance:NEXT  commit stage = NEXT (the row stays running)
//	done, failed  commit status = done / failed
//	pause:MS      commit status = paused, timeout = now() + MS milliseconds
//	count         commit the pass count only (before an answer that writes nothing, like 75)
//	sleep:MS      sleep MS milliseconds
//	hang          sleep forever
//	answer:LINE   answer LINE instead of "0" (e.g. "answer:7 bad input")
//	print:LINE    write LINE as the answer (a protocol error when it is no status)
//	partial:TEXT  write TEXT with no newline (a line cut off, as by a kill)
//	fused:S:US    append " S:US" to the "0" answer (a stage fused into this pass)
//	stderr:TEXT   write TEXT to standard error
//	exit:N        exit with status N at once (before or after a commit above)
//	segv          die by SIGSEGV at once
//	emit:S:N      write N emit lines before the answer, each a message at stage
//	              S with payload "ID/I" (docs/protocol.md, "Emitting messages");
//	emit:S:N:K    the same, each with order key K
//	noop          do nothing (with no transition: answer 0, leave the row running)
//	flood:BYTES   write BYTES bytes of "x" to standard output, no newline
//	closeout      close standard output (the process lives on)
//
// The libstage personality understands advance, done, failed, pause, sleep,
// exit, emit (through Message.Emit) and answer (as stage.Error with the
// LINE's text after its code). It serves INPUT = message stages too.
//
// # Record
//
// Each process appends JSON lines to the file "record" beside its -c
// configuration file: one "start" (its argv and PEPSI_STAGE), one "read" per
// read(2) of standard input (the ids it got and how many it then held
// unanswered), one "handle" per message it runs (id, pass), one "answer" just
// before it writes a message's answer line (id), and "exit" when its
// input ended. Lines are short single O_APPEND writes, so the processes of one
// test never interleave inside a line.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/stagelog"
	"github.com/pepsi-pipeline/pepsi/stage"
	"github.com/pepsi-pipeline/pepsi/stage/relay"
)

// Record is one line of the record file, as the tests read it.
type Record = stagelog.Record

var (
	recordFile *os.File
	stageName  = os.Getenv("PEPSI_STAGE")
)

func record(r Record) {
	if recordFile == nil {
		return
	}
	r.At, r.PID, r.Stage = time.Now(), os.Getpid(), stageName
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	if _, err := recordFile.Write(append(b, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "teststage: record: %v\n", err)
		os.Exit(70)
	}
}

func main() {
	confFile := ""
	if len(os.Args) == 4 && os.Args[1] == "worker" && os.Args[2] == "-c" {
		confFile = os.Args[3]
	}
	if confFile != "" {
		f, err := os.OpenFile(filepath.Join(filepath.Dir(confFile), "record"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintf(os.Stderr, "teststage: %v\n", err)
			os.Exit(70)
		}
		recordFile = f
	}
	if name := os.Getenv("TESTSTAGE_RECORD"); confFile == "" && name != "" {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintf(os.Stderr, "teststage: %v\n", err)
			os.Exit(70)
		}
		recordFile = f
	}
	record(Record{Ev: "start", Args: os.Args[1:], Env: stageName})
	switch filepath.Base(os.Args[0]) {
	case "relaystage":
		relay.Main("PEPSI_RELAY_ADDR")
	case "filterstage":
		if err := filter(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "teststage: %v\n", err)
			os.Exit(1)
		}
		record(Record{Ev: "exit"})
		os.Exit(0)
	case "exitstage":
		fmt.Fprintln(os.Stderr, "teststage: scripted failure at start")
		os.Exit(1)
	case "eagerstage":
		if _, err := os.Stdout.WriteString("0\n"); err != nil {
			os.Exit(70)
		}
	case "libstage":
		handlers := map[string]stage.Handler{stageName: libHandler, "tag": libHandler}
		var opts []stage.Option
		if stageName != "tag" {
			opts = append(opts, stage.Fuse("tag"))
		}
		stage.Main(handlers, opts...)
	}
	if confFile == "" {
		fmt.Fprintln(os.Stderr, "usage: teststage worker -c FILE")
		os.Exit(2)
	}
	if err := raw(confFile); err != nil {
		fmt.Fprintf(os.Stderr, "teststage: %v\n", err)
		os.Exit(1)
	}
	record(Record{Ev: "exit"})
}

// filter is the filterstage personality: each line is a message; it is
// answered "0 >done", and recorded with how many lines had arrived and were not
// yet answered when it was read (Outstanding): more than one means the
// messages came pipelined. Answers are flushed whenever no more input is
// buffered.
func filter(in io.Reader, out io.Writer) error {
	r := bufio.NewReaderSize(in, 1<<20)
	w := bufio.NewWriter(out)
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF && len(line) == 0 {
			return w.Flush()
		} else if err != nil && err != io.EOF {
			return err
		}
		var m struct {
			ID int64 `json:"id"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			return fmt.Errorf("not a message: %q", line)
		}
		peek, _ := r.Peek(r.Buffered())
		record(Record{Ev: "handle", ID: m.ID, Outstanding: 1 + bytes.Count(peek, []byte("\n"))})
		if _, err := w.WriteString("0 >done\n"); err != nil {
			return err
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
	}
}

// action returns the ops for the given pass of a message through stage.
func action(script, stage string, pass int) []string {
	for _, part := range strings.Split(script, ";") {
		name, alts, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name != stage {
			continue
		}
		as := strings.Split(alts, "|")
		return strings.Split(as[min(pass, len(as)-1)], "+")
	}
	return []string{"done"}
}

func passOf(state map[string]any) int {
	switch v := state["n_"+stageName].(type) {
	case json.Number:
		n, _ := v.Int64()
		return int(n)
	case float64:
		return int(v)
	}
	return 0
}

func millis(arg string) time.Duration {
	n, err := strconv.Atoi(arg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "teststage: bad milliseconds %q\n", arg)
		os.Exit(70)
	}
	return time.Duration(n) * time.Millisecond
}

// raw serves the stage speaking the protocol itself.
func raw(confFile string) error {
	text, err := os.ReadFile(confFile)
	if err != nil {
		return err
	}
	cfg, err := conf.Parse(confFile, string(text))
	if err != nil {
		return err
	}
	if db, set := os.LookupEnv("PEPSI_DATABASE"); set {
		cfg.Database = db // as the stage library: the dispatcher's database wins over the file's
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, cfg.Database)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)

	chunks := make(chan []int64, 1024)
	go readIDs(chunks)
	var queue []int64
	take := func(c []int64, ok bool) bool {
		if !ok {
			return false
		}
		queue = append(queue, c...)
		record(Record{Ev: "read", IDs: c, Outstanding: len(queue)})
		return true
	}
	open := true
	for {
		// Take whatever has arrived, so "outstanding" is current.
		for more := open; more; {
			select {
			case c, ok := <-chunks:
				open = take(c, ok)
				more = open
			default:
				more = false
			}
		}
		if len(queue) == 0 {
			if !open {
				return nil
			}
			c, ok := <-chunks
			open = take(c, ok)
			continue
		}
		line, err := handle(ctx, conn, queue[0])
		if err != nil {
			return err
		}
		if line != "" {
			record(Record{Ev: "answer", ID: queue[0]})
			if _, err := os.Stdout.WriteString(line + "\n"); err != nil {
				return err
			}
		}
		queue = queue[1:]
	}
}

// readIDs sends the ids of each read(2) of standard input, then closes chunks.
func readIDs(chunks chan<- []int64) {
	defer close(chunks)
	buf := make([]byte, 64*1024)
	partial := ""
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			text := partial + string(buf[:n])
			lines := strings.Split(text, "\n")
			partial = lines[len(lines)-1]
			var ids []int64
			for _, l := range lines[:len(lines)-1] {
				id, perr := strconv.ParseInt(strings.TrimSpace(l), 10, 64)
				if perr != nil {
					fmt.Fprintf(os.Stderr, "teststage: bad id line %q\n", l)
					os.Exit(70)
				}
				ids = append(ids, id)
			}
			if len(ids) > 0 {
				chunks <- ids
			}
		}
		if err != nil {
			return
		}
	}
}

// countPass makes an answered transition ("0 >TARGET …") carry the pass count
// in its state patch, as a write would: a stage that writes nothing keeps its
// n_STAGE through the dispatcher. A patch that is not a JSON object (a test of
// malformed patches) is left as it is.
func countPass(answer string, pass int) string {
	if !strings.HasPrefix(answer, "0 >") {
		return answer
	}
	head, patch, hasPatch := strings.Cut(answer, " {")
	m := map[string]any{}
	if hasPatch {
		// Numbers as written: a patch's number that float64 rounds (or
		// jsonb refuses) reaches the dispatcher as the test wrote it.
		dec := json.NewDecoder(strings.NewReader("{" + patch))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil || dec.More() {
			return answer
		}
	}
	m["n_"+stageName] = pass + 1
	b, err := json.Marshal(m)
	if err != nil {
		return answer
	}
	return head + " " + string(b)
}

// handle runs one message and returns its answer line ("" for none).
func handle(ctx context.Context, conn *pgx.Conn, id int64) (answer string, err error) {
	var rowStage, status, payload string
	var state map[string]any
	err = conn.QueryRow(ctx, `SELECT stage, status, coalesce(convert_from(payload, 'UTF8'), ''), state FROM pepsi.queue WHERE ingress_id = $1`, id).
		Scan(&rowStage, &status, &payload, &state)
	if err != nil {
		return "", fmt.Errorf("read message %d: %w", id, err)
	}
	if status != "running" || rowStage != stageName {
		return "0", nil // someone else moved it; like the stage library
	}
	pass := passOf(state)
	record(Record{Ev: "handle", ID: id, Pass: pass})
	answer = "0"
	defer func() { answer = countPass(answer, pass) }()
	for _, op := range action(payload, stageName, pass) {
		if set, args, ok := transitionOf(op); ok {
			err = transition(ctx, conn, id, pass, set, args...)
		} else {
			answer, err = act(id, op, answer)
		}
		if err != nil {
			return "", err
		}
	}
	return answer, nil
}

// transitionOf is the SET clause (with its arguments from $4 on) of an op
// that writes the row: advance, done, failed, pause, and count, which writes
// only the pass count. ok is false for any other op.
func transitionOf(op string) (set string, args []any, ok bool) {
	name, arg, _ := strings.Cut(op, ":")
	switch name {
	case "advance":
		return "stage = $4", []any{arg}, true
	case "done", "failed":
		return "status = $4", []any{name}, true
	case "count":
		return "status = status", nil, true // the pass count only: no transition
	case "pause":
		return "status = 'paused', timeout = now() + $4 * interval '1 millisecond'", []any{int(millis(arg) / time.Millisecond)}, true
	}
	return "", nil, false
}

// transition writes message id's row as set says, guarded like a stage's own
// transition, counting this pass in state.n_STAGE.
func transition(ctx context.Context, conn *pgx.Conn, id int64, pass int, set string, args ...any) error {
	args = append([]any{id, stageName, pass + 1}, args...)
	_, err := conn.Exec(ctx, `UPDATE pepsi.queue SET `+set+`,
		state = jsonb_set(state, ARRAY['n_' || $2::text], to_jsonb($3::int)), updated_at = now()
		WHERE ingress_id = $1 AND status = 'running' AND stage = $2`, args...)
	if err != nil {
		return fmt.Errorf("transition of message %d: %w", id, err)
	}
	return nil
}

// act runs an op that touches no row (timing, answers, output, dying) and
// returns the answer line as it now stands.
func act(id int64, op, answer string) (string, error) {
	name, arg, _ := strings.Cut(op, ":")
	switch name {
	case "sleep":
		time.Sleep(millis(arg))
	case "hang":
		select {}
	case "answer":
		return arg, nil
	case "print":
		if _, err := os.Stdout.WriteString(arg + "\n"); err != nil {
			return "", err
		}
		return "", nil
	case "partial":
		// The start of a line, without its newline: what a worker killed
		// while writing its answer leaves.
		if _, err := os.Stdout.WriteString(arg); err != nil {
			return "", err
		}
		return "", nil
	case "fused":
		return answer + " " + arg, nil
	case "stderr":
		fmt.Fprintln(os.Stderr, arg)
	case "exit":
		n, _ := strconv.Atoi(arg)
		os.Exit(n)
	case "segv":
		segv()
	case "emit":
		// emit:STAGE:N[:KEY] writes N emit lines before the answer, each a
		// message at STAGE whose payload names its parent and its place,
		// with order key KEY if given.
		to, rest, _ := strings.Cut(arg, ":")
		count, key, _ := strings.Cut(rest, ":")
		n, _ := strconv.Atoi(count)
		for i := range n {
			e := core.Emit{Stage: to, Payload: []byte(fmt.Sprintf("%d/%d", id, i)), OrderKey: key}
			if _, err := os.Stdout.WriteString(e.Line() + "\n"); err != nil {
				return "", err
			}
		}
	case "noop":
	case "flood":
		n, _ := strconv.Atoi(arg)
		return answer, flood(n)
	case "closeout":
		if err := os.Stdout.Close(); err != nil {
			return "", err
		}
		return "", nil
	default:
		return "", fmt.Errorf("message %d: unknown op %q", id, op)
	}
	return answer, nil
}

// flood writes n bytes of "x" to standard output, no newline.
func flood(n int) error {
	chunk := []byte(strings.Repeat("x", 64<<10))
	for n > 0 {
		k := min(n, len(chunk))
		if _, err := os.Stdout.Write(chunk[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// segv dies by SIGSEGV. The Go runtime handles SIGSEGV itself (a kill(2) of it
// is not a fault, so it would not die), so the default disposition is restored
// first with a raw rt_sigaction: an all-zero struct sigaction is SIG_DFL.
func segv() {
	var act [4]uint64
	if _, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(syscall.SIGSEGV),
		uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
		fmt.Fprintf(os.Stderr, "teststage: rt_sigaction: %v\n", e)
		os.Exit(70)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGSEGV)
	time.Sleep(time.Minute)
	os.Exit(70)
}

// libHandler runs the script through the stage library.
func libHandler(_ context.Context, m *stage.Message) stage.Result {
	script := string(m.Payload)
	key := "n_" + m.Stage
	pass := 0
	if v, ok := m.State[key].(json.Number); ok {
		n, _ := v.Int64()
		pass = int(n)
	}
	m.State[key] = pass + 1
	for _, op := range action(script, m.Stage, pass) {
		name, arg, _ := strings.Cut(op, ":")
		switch name {
		case "advance":
			return stage.Advance(arg)
		case "done":
			return stage.Done()
		case "failed":
			return stage.Failed("scripted")
		case "pause":
			return stage.PauseFor(millis(arg))
		case "answer":
			_, reason, _ := strings.Cut(arg, " ")
			return stage.Error(reason)
		case "sleep":
			time.Sleep(millis(arg))
		case "exit":
			n, _ := strconv.Atoi(arg)
			os.Exit(n)
		case "emit":
			to, count, _ := strings.Cut(arg, ":")
			n, _ := strconv.Atoi(count)
			for i := range n {
				if err := m.Emit(stage.Emit{Stage: to, Payload: []byte(fmt.Sprintf("%d/%d", m.ID, i))}); err != nil {
					return stage.Error(err.Error())
				}
			}
		default:
			return stage.Error("teststage: op " + op + " is not for libstage")
		}
	}
	return stage.Done()
}
