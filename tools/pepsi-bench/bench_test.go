package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/testenv/gobuild"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// buildBench builds pepsi-bench and pepsi-dispatch into one folder, as make
// bench does, and returns the folder.
func buildBench(t *testing.T) string {
	t.Helper()
	return gobuild.Programs(t, "tools/pepsi-bench", "cmd/pepsi-dispatch")
}

// runBench runs the built pepsi-bench on a database of the test's own (dropped
// when the test ends; the bench drops and creates it afresh by name) and
// returns its output and exit status.
func runBench(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	admin := pgtest.AdminURL(t)
	name := pgtest.NewDatabaseName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args = append(args, "-database", admin, "-db-name", name, "-timeout", "2m")
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pepsi-bench"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	}
	t.Fatalf("pepsi-bench: %v; output:\n%s", err, out.String())
	return "", 0
}

// TestBenchMeasuresBothSidesAndChecksThePipeline runs one small round in write
// mode on the test server: pgbench, then 300 messages through the real
// dispatcher and three workers at each configuration, checked afterwards
// (every row done, every hop counted), then a short latency run.
func TestBenchMeasuresBothSidesAndChecksThePipeline(t *testing.T) {
	t.Parallel()
	out, code := runBench(t, buildBench(t), "-n", "300", "-rounds", "1", "-seconds", "1", "-clients", "2",
		"-modes", "write", "-latency-rate", "50", "-latency-seconds", "1", "-ingest-seconds", "1")
	if code != 0 {
		t.Fatalf("pepsi-bench exited %d, want 0; output:\n%s", code, out)
	}
	for _, state := range []string{"idle", "busy"} {
		ingest := regexp.MustCompile(`(?m)^  dispatcher ` + state + ` .*: no trigger [0-9]+ tps; this schema's triggers \(4 and 6\) [0-9]+ tps = [0-9.]+× the no-trigger rate`)
		if !ingest.MatchString(out) {
			t.Errorf("pepsi-bench output has no ingest line with the dispatcher %s matching %q; output:\n%s", state, ingest, out)
		}
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^round 1: pgbench 2 clients: [0-9]+ tps`),
		// 8 row updates per message: the stages wrote their transitions. Then
		// the dispatcher's queue transactions, from the summary in its log.
		regexp.MustCompile(`(?m)^round 1: pipeline write, bench \(P=2 Q=64 MAX_MESSAGES=100000\): [0-9]+ hops/s = [0-9.]+× pgbench \(.*; 2\.67 row versions per hop; [0-9]+ transactions of [0-9.]+ items, [0-9.]+[µm]?s each, [0-9.]+[µm]?s from one to the next\)`),
		regexp.MustCompile(`(?m)^round 1: pipeline write, defaults \(P=4 Q=4 MAX_MESSAGES=1000\): [0-9]+ hops/s = [0-9.]+× pgbench \(`),
		regexp.MustCompile(`(?m)^\| pipeline write, bench .* \| [0-9]+ hops/s \| \*\*[0-9.]+×\*\* \|`),
		regexp.MustCompile(`(?m)^latency, write mode: 50 messages at [0-9]+/s .* p50 [0-9.]+ ms, p99 [0-9.]+ ms`),
	} {
		if !want.MatchString(out) {
			t.Errorf("pepsi-bench output has no line matching %q; output:\n%s", want, out)
		}
	}
}

// TestKeyedConfigurationsRunBesideBench runs the configurations of ordering
// per key: the messages sharing a few keys, and keyless messages, or messages
// with keys of their own, beside one key's backlog, which must still be
// waiting when the run ends (pepsi-bench checks it and fails otherwise); each
// is set beside bench, and the keyed messages beside the backlog beside keyed.
func TestKeyedConfigurationsRunBesideBench(t *testing.T) {
	t.Parallel()
	out, code := runBench(t, buildBench(t), "-n", "300", "-rounds", "1", "-modes", "answer", "-configs", "bench,keys,backlogged,keyed,backlogged-keyed",
		"-keys", "10", "-key-backlog", "1000", "-skip-pgbench", "-latency-seconds", "0", "-ingest-seconds", "0")
	if code != 0 {
		t.Fatalf("pepsi-bench exited %d, want 0; output:\n%s", code, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^round 1: pipeline answer, keys \(P=2 Q=64 MAX_MESSAGES=100000, the messages share 10 order keys\): [0-9]+ hops/s`),
		regexp.MustCompile(`(?m)^round 1: pipeline answer, backlogged \(P=2 Q=64 MAX_MESSAGES=100000, beside one key's backlog of 1000 blocked messages\): [0-9]+ hops/s`),
		regexp.MustCompile(`(?m)^answer mode at keys ÷ at bench: \*\*[0-9.]+×\*\*$`),
		regexp.MustCompile(`(?m)^answer mode at backlogged ÷ at bench: \*\*[0-9.]+×\*\*$`),
		regexp.MustCompile(`(?m)^round 1: pipeline answer, backlogged-keyed \(P=2 Q=64 MAX_MESSAGES=100000, an order key per message, beside one key's backlog of 1000 blocked messages\): [0-9]+ hops/s`),
		regexp.MustCompile(`(?m)^answer mode at backlogged-keyed ÷ at keyed: \*\*[0-9.]+×\*\*$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("pepsi-bench output has no line matching %q; output:\n%s", want, out)
		}
	}
}

// TestMessagesEnqueuedAfterTheStartAreMeasuredFromTheirInsert runs a round
// whose messages arrive once pepsi-dispatch runs on the empty queue
// (-enqueue-after-start): the header says so, and every message is done and
// every hop counted, as pepsi-bench checks after each run.
func TestMessagesEnqueuedAfterTheStartAreMeasuredFromTheirInsert(t *testing.T) {
	t.Parallel()
	out, code := runBench(t, buildBench(t), "-n", "300", "-rounds", "1", "-modes", "answer", "-configs", "bench", "-enqueue-after-start",
		"-skip-pgbench", "-latency-seconds", "0", "-ingest-seconds", "0")
	if code != 0 {
		t.Fatalf("pepsi-bench exited %d, want 0; output:\n%s", code, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^pepsi-bench: .*300 messages \(900 hops\) enqueued a second after pepsi-dispatch connected to the empty queue \(100,000 an INSERT\), timed from the first insert`),
		regexp.MustCompile(`(?m)^round 1: pipeline answer, bench \(P=2 Q=64 MAX_MESSAGES=100000\): [0-9]+ hops/s`),
	} {
		if !want.MatchString(out) {
			t.Errorf("pepsi-bench output has no line matching %q; output:\n%s", want, out)
		}
	}
}

// TestABacklogDrainsAtEachOfItsConfigurations drains a small backlog with
// history on (bench) and then with HISTORY = off (unrecorded): each reports
// the first and the last tenth's rates and their ratio, and what it left in
// pepsi.history (a row per pass, or none).
func TestABacklogDrainsAtEachOfItsConfigurations(t *testing.T) {
	t.Parallel()
	out, code := runBench(t, buildBench(t), "-backlog", "-backlog-n", "2000", "-backlog-configs", "bench,unrecorded", "-modes", "answer")
	if code != 0 {
		t.Fatalf("pepsi-bench exited %d, want 0; output:\n%s", code, out)
	}
	rates := `2000 messages \(6000 hops\) in [0-9.]+ s = [0-9]+ hops/s; first tenth [0-9]+ hops/s, last tenth [0-9]+ hops/s \(last/first [0-9.]+\); ` +
		`.*; CPU per hop \(dispatcher, workers, backends\) first tenth [0-9]+ µs, last tenth [0-9]+ µs \(last/first [0-9.]+\)`
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^backlog, pipeline answer, bench \(P=2 Q=64 MAX_MESSAGES=100000\): ` + rates + `.*; pepsi.history after: 6000 rows, table [0-9.]+ MB`),
		regexp.MustCompile(`(?m)^backlog, pipeline answer, unrecorded \(P=2 Q=64 MAX_MESSAGES=100000, HISTORY = off\): ` + rates + `.*; pepsi.history after: 0 rows, `),
	} {
		if !want.MatchString(out) {
			t.Errorf("pepsi-bench output has no line matching %q; output:\n%s", want, out)
		}
	}
	if out, code := runBench(t, buildBench(t), "-backlog", "-backlog-configs", "keyed"); code != 2 || !strings.Contains(out, "keyed is not measured by a drain") {
		t.Errorf("-backlog-configs keyed: exit %d, %s; want 2 and why", code, out)
	}
}

// TestAnswerModeIsMeasuredOrRefusedClearly runs library and answer mode
// against the dispatcher of this tree: one that speaks the "0 >TARGET" protocol
// drains the pipeline, with fewer than two row versions per hop (the
// dispatcher wrote each transition straight to what the row becomes next, two
// versions with the claim, and a move to a stage with room claimed the row
// there in the same write, one: docs/performance.md, "What bounds it");
// one that does not makes
// pepsi-bench say so and exit 1, never hang or fail messages one by one.
func TestAnswerModeIsMeasuredOrRefusedClearly(t *testing.T) {
	t.Parallel()
	out, code := runBench(t, buildBench(t), "-n", "300", "-rounds", "1", "-skip-pgbench",
		"-modes", "library,answer", "-configs", "bench", "-latency-seconds", "0", "-ingest-seconds", "0")
	switch code {
	case 0:
		for _, m := range []string{"library", "answer"} {
			want := regexp.MustCompile(`(?m)^round 1: pipeline ` + m + `, bench .*: [0-9]+ hops/s .*; 1\.[0-9][0-9] row versions per hop; [0-9]+ transactions of [0-9.]+ items, .* from one to the next\)`)
			if !want.MatchString(out) {
				t.Errorf("pepsi-bench exited 0 without a %s-mode figure matching %q; output:\n%s", m, want, out)
			}
		}
	case 1:
		for _, want := range []string{"answer mode NOT MEASURED", `"0 >TARGET"`, "-modes write"} {
			if !strings.Contains(out, want) {
				t.Errorf("pepsi-bench refused answer mode without saying %q; output:\n%s", want, out)
			}
		}
	default:
		t.Errorf("pepsi-bench -modes answer exited %d, want 0 (measured) or 1 (refused); output:\n%s", code, out)
	}
}

// TestRaceMeasuresEveryMessageFromItsCommit runs one short -race run in answer
// mode: the racing producers' messages go through the real dispatcher, and
// the report counts each of them from its commit to done.
func TestRaceMeasuresEveryMessageFromItsCommit(t *testing.T) {
	t.Parallel()
	out, code := runBench(t, buildBench(t), "-race", "-modes", "answer", "-rounds", "1", "-latency-seconds", "2")
	if code != 0 {
		t.Fatalf("pepsi-bench -race exited %d, want 0; output:\n%s", code, out)
	}
	want := regexp.MustCompile(`(?m)^race, answer mode, run 1: [1-9][0-9]* messages: commit → done p50 [0-9.]+ ms, p99 [0-9.]+ ms, max [0-9.]+ ms; [0-9]+ done later than 50ms after their commit$`)
	if !want.MatchString(out) {
		t.Errorf("pepsi-bench -race output has no line matching %q; output:\n%s", want, out)
	}
}

func TestBadFlagsExitTwo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-n", "0"},
		{"-queue-limit", "-1"},
		{"-db-name", "Bad-Name"},
		{"-database", "mysql://x"},
		{"-modes", "write,fast"},
		{"-modes", "write,write"},
		{"-configs", "bench,huge"},
		{"-latency-seconds", "-1"},
		{"-split-parallelism", "-1"},
		{"-split-queue-limit", "-2"},
		{"-enqueue-after-start", "-backlog"},
		{"extra"},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, &bytes.Buffer{}, &stderr); code != 2 {
			t.Errorf("run(%q) = %d, want 2 (stderr: %s)", args, code, stderr.String())
		}
	}
}

func TestTPSIsReadFromPgbenchOutput(t *testing.T) {
	t.Parallel()
	out := "latency average = 1.284 ms\ninitial connection time = 50.053 ms\ntps = 12465.815447 (without initial connection time)\n"
	m := tpsRE.FindStringSubmatch(out)
	if m == nil || m[1] != "12465.815447" {
		t.Errorf("tps parsed from pgbench output = %q, want 12465.815447", m)
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestPgbenchIsFoundOrNamedWithItsPackage(t *testing.T) {
	t.Parallel()
	p, err := findPgbench()
	if err != nil {
		if !strings.Contains(err.Error(), "postgresql-") {
			t.Errorf("error for a missing pgbench = %q, want it to name the Debian package", err)
		}
		return
	}
	if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("findPgbench() = %q, which is not an executable file (%v)", p, err)
	}
}

// TestTheSplitsParentStageTakesItsOwnPoolWhenAsked: -split-parallelism and
// -split-queue-limit size stage a alone; stage b keeps the bench
// configuration, and so does a without them.
func TestTheSplitsParentStageTakesItsOwnPoolWhenAsked(t *testing.T) {
	t.Parallel()
	b := &bench{url: "postgres://127.0.0.1/x", benchConfig: stageConfig{parallelism: 4, queueLimit: 128, maxMessages: 1000}}
	section := func(conf, stage string) string {
		i := strings.Index(conf, "[stage-"+stage+"]")
		if i < 0 {
			t.Fatalf("no [stage-%s] in:\n%s", stage, conf)
		}
		rest := conf[i:]
		if j := strings.Index(rest[1:], "["); j >= 0 {
			rest = rest[:j+1]
		}
		return rest
	}
	for _, c := range []struct {
		parent     stageConfig
		wantA      string
		wantHeader string
	}{
		{stageConfig{}, "PARALLELISM = 4\nQUEUE_LIMIT = 128\n", ""},
		{stageConfig{parallelism: 1, queueLimit: 4}, "PARALLELISM = 1\nQUEUE_LIMIT = 4\n", " (stage a: PARALLELISM 1, QUEUE_LIMIT 4)"},
		{stageConfig{queueLimit: 8}, "PARALLELISM = 4\nQUEUE_LIMIT = 8\n", " (stage a: PARALLELISM 4, QUEUE_LIMIT 8)"},
	} {
		b.splitParent = c.parent
		conf := b.splitConf("/bin/split", 0)
		if strings.Contains(conf, "SESSIONS") {
			t.Errorf("split parent %+v: the configuration sets SESSIONS though -sessions does not:\n%s", c.parent, conf)
		}
		if two := b.splitConf("/bin/split", 2); !strings.Contains(two, "[pepsi-dispatch]\n") || !strings.Contains(two, "SESSIONS = 2\n") {
			t.Errorf("split parent %+v at SESSIONS 2: the configuration is\n%s\nwant SESSIONS = 2", c.parent, two)
		}
		if a := section(conf, stageA); !strings.Contains(a, c.wantA) {
			t.Errorf("split parent %+v: stage a is\n%s\nwant %q", c.parent, a, c.wantA)
		}
		if bb := section(conf, stageB); !strings.Contains(bb, "PARALLELISM = 4\nQUEUE_LIMIT = 128\n") {
			t.Errorf("split parent %+v: stage b is\n%s\nwant the bench configuration's 4 and 128", c.parent, bb)
		}
		if got := b.splitParentText(); got != c.wantHeader {
			t.Errorf("split parent %+v: header %q, want %q", c.parent, got, c.wantHeader)
		}
	}
}
