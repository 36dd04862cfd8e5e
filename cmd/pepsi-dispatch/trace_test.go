package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/otlpreceiver"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// filter is a stage of INPUT = message in sh: it keeps each line it reads in
// DIR/lines-STAGE and answers the move to its next stage (a to b, b to done).
const filter = `#!/bin/sh
while IFS= read -r line; do
	printf '%s\n' "$line" >> "@DIR@/lines-$PEPSI_STAGE"
	case "$PEPSI_STAGE" in a) echo "0 >b" ;; *) echo "0 >done" ;; esac
done
`

// pipeline writes the configuration of a two-stage pipeline of filters on
// the database url into dir, and returns its file.
func pipeline(t *testing.T, dir, url string) string {
	t.Helper()
	return pipelineOf(t, dir, url, filter)
}

// pipelineOf is pipeline with script (@DIR@ standing for dir) as the
// program of both stages.
func pipelineOf(t *testing.T, dir, url, script string) string {
	t.Helper()
	prog := filepath.Join(dir, "filter")
	if err := os.WriteFile(prog, []byte(strings.ReplaceAll(script, "@DIR@", dir)), 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "pepsi.conf")
	text := fmt.Sprintf("[pepsi]\nDATABASE = %s\n[pepsi-dispatch]\nPOLL_INTERVAL = 1\n"+
		"[stage-a]\nPROGRAM = %s\nINPUT = message\nQUEUE_LIMIT = 8\n[stage-b]\nPROGRAM = %s\nINPUT = message\nQUEUE_LIMIT = 8\n", url, prog, prog)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return conf
}

// daemon is a running program of the test; its standard error is in log.
type daemon struct {
	cmd  *exec.Cmd
	log  *lockedbuf.Buffer
	done chan struct{}
}

// run starts path with args and the extra environment env; it is killed
// when the test ends, if it still runs. The line on its standard error that
// contains ready, if not "", is waited for and returned.
func run(t *testing.T, path string, env []string, ready string, args ...string) (*daemon, string) {
	t.Helper()
	d := &daemon{cmd: exec.Command(path, args...), log: &lockedbuf.Buffer{}, done: make(chan struct{})}
	d.cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	d.cmd.Stderr = io.MultiWriter(pw, d.log)
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		d.cmd.Wait()
		pw.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		<-d.done
		if t.Failed() {
			t.Logf("%s:\n%s", filepath.Base(path), d.log)
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if ready != "" && strings.Contains(sc.Text(), ready) {
				select {
				case found <- sc.Text():
				default:
				}
			}
		}
		io.Copy(io.Discard, pr)
	}()
	if ready == "" {
		return d, ""
	}
	select {
	case line := <-found:
		return d, line
	case <-d.done:
		t.Fatalf("%s exited before %q: %s", path, ready, d.log)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not log %q within 60 s: %s", path, ready, d.log)
	}
	return d, ""
}

// stop sends SIGTERM and waits for the exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit within 60 s of SIGTERM")
	}
}

// waitDone waits until n rows of the queue at url are done.
func waitDone(t *testing.T, url string, n int) {
	t.Helper()
	conn := pgtest.Connect(t, url)
	deadline := time.Now().Add(120 * time.Second)
	for {
		var done int
		if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pepsi.queue WHERE status = 'done'").Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages done after 120 s", done, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lineTraces reads the traceparent of every line a stage's filter read, by
// message id.
func lineTraces(t *testing.T, dir, stage string) map[int64]string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(dir, "lines-"+stage))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(text)), "\n") {
		var m struct {
			ID          int64  `json:"id"`
			TraceParent string `json:"traceparent"`
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out[m.ID] = m.TraceParent
	}
	return out
}

// Proves, from outside, with the real programs, real stage processes, a real
// PostgreSQL and a real OTLP/HTTP receiver: messages sent over pepsi-ingress
// with a traceparent header keep its trace id (their parent is pepsi-ingress's
// span of the request, a child of the header); a message with none (inserted
// by SQL) is given a trace by its first claim; each stage's line carries the
// message's trace id with a span id of its pass's own; and the receiver gets
// a span "process <stage>" per pass, kind consumer, with that span id, the
// message's traceparent as its parent and the messaging attributes.
func TestPassesAreSpansOfTheMessagesTraceAtACollector(t *testing.T) {
	t.Parallel()
	bin := gobuild.Programs(t, "cmd/pepsi-dispatch", "cmd/pepsi-ingress")
	url := pgtest.NewMigrated(t)
	dir := t.TempDir()
	conf := pipeline(t, dir, url)
	recv := otlpreceiver.Start(t)
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL(), "OTEL_BSP_SCHEDULE_DELAY=50"}

	_, line := run(t, filepath.Join(bin, "pepsi-ingress"), otel, "pepsi-ingress serving", "-c", conf, "-listen", "127.0.0.1:0")
	_, rest, _ := strings.Cut(line, "addr=")
	addr := strings.TrimSuffix(strings.Fields(rest)[0], "/v1/messages")
	const header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	req, _ := http.NewRequest(http.MethodPost, addr+"/v1/messages?stage=a", strings.NewReader("{\"payload\": \"1\"}\n{\"payload\": \"2\"}\n"))
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("traceparent", header)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != http.StatusAccepted {
		t.Fatalf("POST: %v %v", res, err)
	}
	res.Body.Close()
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(context.Background(), "INSERT INTO pepsi.queue (stage, payload) VALUES ('a', 'x')"); err != nil {
		t.Fatal(err)
	}
	ingressSpan := recv.WaitFor(t, 60*time.Second, "pepsi-ingress's span", func(s []otlpreceiver.Span) bool { return len(s) >= 1 })[0]
	if ingressSpan.Service != "pepsi-ingress" || ingressSpan.Name != "POST /v1/messages" || ingressSpan.Kind != "SPAN_KIND_SERVER" ||
		ingressSpan.TraceID != header[3:35] || ingressSpan.ParentSpanID != header[36:52] || ingressSpan.Attributes["pepsi.messages"] != "2" {
		t.Errorf("pepsi-ingress's span %v; want POST /v1/messages, a server span of the header's trace, its child, of 2 messages", ingressSpan)
	}
	rows := map[int64]string{}
	for _, id := range []int64{1, 2, 3} {
		var tp *string
		if err := conn.QueryRow(context.Background(), "SELECT traceparent FROM pepsi.queue WHERE ingress_id = $1", id).Scan(&tp); err != nil {
			t.Fatal(err)
		}
		if id < 3 && (tp == nil || *tp != "00-"+ingressSpan.TraceID+"-"+ingressSpan.SpanID+"-01") {
			t.Errorf("message %d's traceparent %v; want pepsi-ingress's span's", id, tp)
		}
		if id == 3 && tp != nil {
			t.Errorf("message 3's traceparent %q before its first pass; want none", *tp)
		}
	}

	d, _ := run(t, filepath.Join(bin, "pepsi-dispatch"), append(otel, "OTEL_SERVICE_NAME=dispatch-under-test"), "exporting traces", "-c", conf, "-log-level", "debug")
	waitDone(t, url, 3)
	d.stop(t)
	for _, id := range []int64{1, 2, 3} {
		var tp string
		if err := conn.QueryRow(context.Background(), "SELECT traceparent FROM pepsi.queue WHERE ingress_id = $1", id).Scan(&tp); err != nil {
			t.Fatal(err)
		}
		rows[id] = tp
	}
	spans := recv.WaitFor(t, 60*time.Second, "a span per pass", func(s []otlpreceiver.Span) bool { return len(s) >= 1+6 })
	byID := map[string]otlpreceiver.Span{}
	for _, s := range spans {
		byID[s.SpanID] = s
	}
	seen := map[string]bool{}
	for _, stage := range []string{"a", "b"} {
		lines := lineTraces(t, dir, stage)
		for id := int64(1); id <= 3; id++ {
			msg, pass := rows[id], lines[id]
			if len(pass) != 55 || pass[:36] != msg[:36] || pass[52:] != msg[52:] {
				t.Errorf("message %d at %s: line's traceparent %q; want the message's trace %s with a span of the pass", id, stage, pass, msg)
				continue
			}
			if seen[pass[36:52]] {
				t.Errorf("message %d at %s: span id %s is another pass's too", id, stage, pass[36:52])
			}
			seen[pass[36:52]] = true
			s, ok := byID[pass[36:52]]
			if !ok {
				t.Errorf("message %d at %s: no span %s at the receiver", id, stage, pass[36:52])
				continue
			}
			parent := msg[36:52]
			if parent == s.SpanID {
				parent = "" // the first pass of a trace its claim began is its root
			}
			want := map[string]string{"messaging.system": "pepsi", "messaging.destination.name": stage, "messaging.message.id": fmt.Sprint(id),
				"pepsi.outcome": map[string]string{"a": "advance", "b": "done"}[stage], "pepsi.attempts": "0"}
			for k, v := range want {
				if s.Attributes[k] != v {
					t.Errorf("span of message %d at %s: %s = %q, want %q", id, stage, k, s.Attributes[k], v)
				}
			}
			if s.Name != "process "+stage || s.Kind != "SPAN_KIND_CONSUMER" || s.TraceID != msg[3:35] || s.ParentSpanID != parent ||
				s.Service != "dispatch-under-test" || s.Attributes["pepsi.worker.pid"] == "" || s.End.Before(s.Start) {
				t.Errorf("span of message %d at %s: %v; want process %s, consumer, trace %s, parent %q, a worker pid", id, stage, s, stage, msg[3:35], parent)
			}
		}
	}
	if rows[3][36:52] != lineTraces(t, dir, "a")[3][36:52] {
		t.Errorf("message 3 (no traceparent given): its first pass %s is not the root of the trace its claim gave it, %s", lineTraces(t, dir, "a")[3], rows[3])
	}
}

// Proves: a collector that takes the connection and never answers slows
// nothing: every message of the pipeline is done, the dispatcher drops the
// spans its bounded queues cannot hold and counts them (its metrics say how
// many, and so does its log at exit), and it exits at SIGTERM within the
// bound of its last export. The exporter's own timeout is an hour: had a
// pass waited for it, the messages would never be done and the test would
// fail on its 120 s bound, not on a measure of time.
func TestADeadCollectorSlowsNothingAndItsSpansAreCounted(t *testing.T) {
	t.Parallel()
	const n = 3000
	bin, url, conf, dead := deadCollectorPipeline(t, n)
	metrics := freeAddr(t)
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + dead, "OTEL_EXPORTER_OTLP_TIMEOUT=3600000",
		"OTEL_BSP_MAX_QUEUE_SIZE=16", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=16"}
	d, _ := run(t, filepath.Join(bin, "pepsi-dispatch"), otel, "exporting traces", "-c", conf, "-metrics-addr", metrics)
	waitDone(t, url, n)
	dropped := scrape(t, "http://"+metrics+"/metrics", "pepsi_dispatch_spans_dropped_total")
	// 2n passes; the queues hold 16 each (passes, ended spans, the batcher's)
	// and one batch of 16 is with the exporter for ever.
	if min := float64(2*n - 4*16); dropped < min {
		t.Errorf("pepsi_dispatch_spans_dropped_total %v; want at least %v of the %d passes' spans dropped", dropped, min, 2*n)
	}
	d.stop(t)
	if !strings.Contains(d.log.String(), "traces: spans dropped") {
		t.Errorf("the dispatcher's log does not count the dropped spans at exit:\n%s", d.log)
	}
}

// freeAddr is a loopback address with a free port.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrape reads one metric without labels from a Prometheus text page.
func scrape(t *testing.T, url, name string) float64 {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	t.Fatalf("%s has no %s", url, name)
	return 0
}

// splitter is a stage of INPUT = message in sh: at stage a it emits two
// messages to stage b, then finishes its message; at b it finishes it.
const splitter = `#!/bin/sh
while IFS= read -r line; do
	case "$PEPSI_STAGE" in
	a) echo '+{"stage":"b","payload":"1"}'; echo '+{"stage":"b","payload":"2"}'; echo "0 >done" ;;
	*) echo "0 >done" ;;
	esac
done
`

// Proves, from outside, with a real receiver: a message a pass emitted is a
// child of that pass in the trace. Its traceparent has the emitting
// message's trace id and, as its parent span id, the span id of the pass
// that emitted it, which is the span pepsi-dispatch exported as "process a"
// for that message; the child's own pass "process b" is that span's child.
func TestAnEmittedMessageIsAChildOfItsEmittingPassAtACollector(t *testing.T) {
	t.Parallel()
	bin := gobuild.Programs(t, "cmd/pepsi-dispatch")
	url := pgtest.NewMigrated(t)
	conf := pipelineOf(t, t.TempDir(), url, splitter)
	recv := otlpreceiver.Start(t)
	conn := pgtest.Connect(t, url)
	const header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	// One parent with a producer's traceparent, one whose first claim gives it one.
	if _, err := conn.Exec(context.Background(), "INSERT INTO pepsi.queue (stage, payload, traceparent) VALUES ('a', 'x', $1), ('a', 'y', NULL)", header); err != nil {
		t.Fatal(err)
	}
	d, _ := run(t, filepath.Join(bin, "pepsi-dispatch"), []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL(), "OTEL_BSP_SCHEDULE_DELAY=50"},
		"exporting traces", "-c", conf)
	waitDone(t, url, 6)
	d.stop(t)
	spans := recv.WaitFor(t, 60*time.Second, "a span per pass", func(s []otlpreceiver.Span) bool { return len(s) >= 6 })
	pass := map[string]otlpreceiver.Span{} // by stage and message id
	for _, s := range spans {
		pass[s.Name+" "+s.Attributes["messaging.message.id"]] = s
	}
	rows, err := conn.Query(context.Background(), "SELECT ingress_id, parent_id, traceparent FROM pepsi.queue WHERE parent_id IS NOT NULL ORDER BY ingress_id")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id, parent int64
		var tp string
		if err := rows.Scan(&id, &parent, &tp); err != nil {
			t.Fatal(err)
		}
		n++
		emitting, ok := pass[fmt.Sprintf("process a %d", parent)]
		if !ok {
			t.Errorf("child %d: no span of its parent %d's pass at a", id, parent)
			continue
		}
		if want := "00-" + emitting.TraceID + "-" + emitting.SpanID + "-01"; tp != want {
			t.Errorf("child %d of %d: traceparent %s, want the emitting pass's %s", id, parent, tp, want)
		}
		own := pass[fmt.Sprintf("process b %d", id)]
		if own.TraceID != emitting.TraceID || own.ParentSpanID != emitting.SpanID {
			t.Errorf("child %d's pass %v; want a child of its emitting pass %v", id, own, emitting)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Errorf("%d children, want 4", n)
	}
	if s := pass["process a 1"]; s.TraceID != header[3:35] {
		t.Errorf("the producer's message's pass %v; want it in the producer's trace", s)
	}
}

// Proves: OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports the passes' spans over
// OTLP/gRPC (a collector's port 4317), to a real gRPC trace service; a
// protocol the OpenTelemetry Go exporters do not speak (http/json) is
// refused at start with exit status 2 and a line that names it.
func TestSpansGoOverGRPCWhenTheProtocolSaysSo(t *testing.T) {
	t.Parallel()
	bin := gobuild.Programs(t, "cmd/pepsi-dispatch")
	url := pgtest.NewMigrated(t)
	dir := t.TempDir()
	conf := pipeline(t, dir, url)
	recv := otlpreceiver.StartGRPC(t)
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(context.Background(), "INSERT INTO pepsi.queue (stage, payload) VALUES ('a', 'x')"); err != nil {
		t.Fatal(err)
	}
	d, _ := run(t, filepath.Join(bin, "pepsi-dispatch"), []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL(),
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_BSP_SCHEDULE_DELAY=50"}, "exporting traces", "-c", conf)
	waitDone(t, url, 1)
	d.stop(t)
	spans := recv.WaitFor(t, 60*time.Second, "a span per pass over gRPC", func(s []otlpreceiver.Span) bool { return len(s) >= 2 })
	names := map[string]bool{}
	for _, s := range spans {
		names[s.Name] = s.Kind == "SPAN_KIND_CONSUMER" && s.Attributes["messaging.message.id"] == "1"
	}
	if len(spans) != 2 || !names["process a"] || !names["process b"] {
		t.Errorf("spans over gRPC %v; want process a and process b, consumer spans of message 1", spans)
	}

	refused := exec.Command(filepath.Join(bin, "pepsi-dispatch"), "-c", conf)
	refused.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json")
	out, err := refused.CombinedOutput()
	if code := refused.ProcessState.ExitCode(); err == nil || code != 2 || !strings.Contains(string(out), "OTEL_EXPORTER_OTLP_PROTOCOL=http/json") {
		t.Errorf("pepsi-dispatch with OTEL_EXPORTER_OTLP_PROTOCOL=http/json: exit %d, %v, %s; want exit status 2 naming the protocol", code, err, out)
	}
	// So is an exporter it does not have, rather than taken for OTLP.
	console := exec.Command(filepath.Join(bin, "pepsi-dispatch"), "-c", conf)
	console.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER=console")
	out, err = console.CombinedOutput()
	if code := console.ProcessState.ExitCode(); err == nil || code != 2 || !strings.Contains(string(out), "OTEL_TRACES_EXPORTER=console") {
		t.Errorf("pepsi-dispatch with OTEL_TRACES_EXPORTER=console: exit %d, %v, %s; want exit status 2 naming it", code, err, out)
	}
	// So is an endpoint that is no URL, rather than running on exporting nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	garbage := exec.CommandContext(ctx, filepath.Join(bin, "pepsi-dispatch"), "-c", conf)
	garbage.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=::bad")
	out, err = garbage.CombinedOutput()
	if code := garbage.ProcessState.ExitCode(); err == nil || code != 2 || !strings.Contains(string(out), "OTEL_EXPORTER_OTLP_ENDPOINT=::bad: not an endpoint URL") {
		t.Errorf("pepsi-dispatch with OTEL_EXPORTER_OTLP_ENDPOINT=::bad: exit %d, %v, %s; want exit status 2 naming it", code, err, out)
	}
}

// deadCollectorPipeline builds pepsi-dispatch, makes a migrated database
// with n messages pending at the pipeline's first stage and its
// configuration, and starts a collector that takes connections and never
// answers, stopped at the test's end.
func deadCollectorPipeline(t *testing.T, n int) (bin, url, conf, dead string) {
	t.Helper()
	bin = gobuild.Programs(t, "cmd/pepsi-dispatch")
	url = pgtest.NewMigrated(t)
	conf = pipeline(t, t.TempDir(), url)
	dead, stop, err := otlpreceiver.Silent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(context.Background(), "INSERT INTO pepsi.queue (stage, payload) SELECT 'a', 'x' FROM generate_series(1, $1)", n); err != nil {
		t.Fatal(err)
	}
	return bin, url, conf, dead
}
