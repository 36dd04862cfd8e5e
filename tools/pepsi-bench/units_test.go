package main

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// chunkReader hands out its chunks one Read at a time, as a pipe does when the
// dispatcher writes ids in several batches, and records before each Read what
// the worker had written so far.
type chunkReader struct {
	chunks []string
	out    *bytes.Buffer
	seen   []string // out's contents at each Read
}

func (r *chunkReader) Read(p []byte) (int, error) {
	r.seen = append(r.seen, r.out.String())
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks = r.chunks[1:]
	return n, nil
}

func TestAnswerLoopAnswersEachIdAndFlushesBeforeWaitingForMore(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	in := &chunkReader{chunks: []string{"1\n2\n3\n", "4\n", "5\n6"}, out: &out}
	if err := answerLoop(in, &out, "0 >b"); err != nil {
		t.Fatalf("answerLoop: %v", err)
	}
	if want := strings.Repeat("0 >b\n", 6); out.String() != want {
		t.Errorf("answers = %q, want %q (one per id, the last id without a line end included)", out.String(), want)
	}
	// Before each Read that could block, every id read so far was answered.
	want := []string{"", strings.Repeat("0 >b\n", 3), strings.Repeat("0 >b\n", 4)}
	if len(in.seen) < len(want) {
		t.Fatalf("reads = %d, want at least %d", len(in.seen), len(want))
	}
	for i, w := range want {
		if in.seen[i] != w {
			t.Errorf("written before read %d = %q, want %q (answers must be flushed before the worker waits for more ids)", i+1, in.seen[i], w)
		}
	}
}

func TestAnswerLoopAnswersOneBatchInOneWrite(t *testing.T) {
	t.Parallel()
	var w countingWriter
	if err := answerLoop(strings.NewReader(strings.Repeat("42\n", 100)), &w, "0 >done"); err != nil {
		t.Fatalf("answerLoop: %v", err)
	}
	if w.writes != 1 || w.n != 100*len("0 >done\n") {
		t.Errorf("100 ids read at once: %d writes of %d bytes in all, want 1 write of %d", w.writes, w.n, 100*len("0 >done\n"))
	}
}

type countingWriter struct{ writes, n int }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	w.n += len(p)
	return len(p), nil
}

func TestAnswerMainAnswersTheTargetOfItsStageAndRefusesOthers(t *testing.T) {
	t.Parallel()
	for stage, want := range map[string]string{"a": "0 >b\n", "b": "0 >c\n", "c": "0 >done\n"} {
		var out, errOut bytes.Buffer
		if code := answerMain(strings.NewReader("7\n"), &out, &errOut, stage); code != 0 || out.String() != want {
			t.Errorf("stage %s: exit %d, answer %q; want 0 and %q (stderr %q)", stage, code, out.String(), want, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := answerMain(strings.NewReader("7\n"), &out, &errOut, "z"); code != 2 || out.Len() != 0 || !strings.Contains(errOut.String(), "PEPSI_STAGE") {
		t.Errorf("unknown stage: exit %d, stdout %q, stderr %q; want 2, nothing, a message naming PEPSI_STAGE", code, out.String(), errOut.String())
	}
}

func TestAnswerLoopReportsAWriteError(t *testing.T) {
	t.Parallel()
	if err := answerLoop(strings.NewReader("1\n"), failingWriter{}, "0 >b"); err == nil {
		t.Error("answerLoop to a closed stdout returned nil, want the write error")
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestModesAndConfigsAreParsedInOrder(t *testing.T) {
	t.Parallel()
	ms, err := parseModes("answer, write,library")
	if err != nil || len(ms) != 3 || ms[0] != modeAnswer || ms[1] != modeWrite || ms[2] != modeLibrary {
		t.Errorf("parseModes(\"answer, write,library\") = %v, %v; want [answer write library]", ms, err)
	}
	cfg := stageConfig{name: "bench", parallelism: 2, queueLimit: 64, maxMessages: 100000}
	cs, err := parseConfigs("defaults,bench", cfg, 1000, 1000000)
	if err != nil || len(cs) != 2 || cs[0] != defaultsConfig || cs[1] != cfg {
		t.Errorf("parseConfigs(\"defaults,bench\") = %v, %v; want [defaults bench]", cs, err)
	}
	rated := cfg
	rated.name, rated.rate = "rated", ratedRate
	if cs, err := parseConfigs("bench,rated", cfg, 1000, 1000000); err != nil || len(cs) != 2 || cs[1] != rated {
		t.Errorf("parseConfigs(\"bench,rated\") = %v, %v; want bench and bench with RATE %s", cs, err, ratedRate)
	}
	keyed := cfg
	keyed.name, keyed.keyed = "keyed", true
	if cs, err := parseConfigs("keyed", cfg, 1000, 1000000); err != nil || len(cs) != 1 || cs[0] != keyed {
		t.Errorf("parseConfigs(\"keyed\") = %v, %v; want bench with an order key per message", cs, err)
	}
	keys, backlogged := cfg, cfg
	keys.name, keys.keys = "keys", 1000
	backlogged.name, backlogged.keyBacklog = "backlogged", 1000000
	if cs, err := parseConfigs("keys,backlogged", cfg, 1000, 1000000); err != nil || len(cs) != 2 || cs[0] != keys || cs[1] != backlogged {
		t.Errorf("parseConfigs(\"keys,backlogged\") = %v, %v; want bench with 1000 keys and bench beside a backlog of 1000000", cs, err)
	}
	traced, dead, before := cfg, cfg, cfg
	traced.name, traced.traces = "traced", "live"
	dead.name, dead.traces = "traced-dead", "dead"
	before.name, before.before = "before", true
	if cs, err := parseConfigs("traced,traced-dead,before", cfg, 1000, 1000000); err != nil || len(cs) != 3 || cs[0] != traced || cs[1] != dead || cs[2] != before {
		t.Errorf("parseConfigs(\"traced,traced-dead,before\") = %v, %v; want bench exporting to a receiver, to a dead collector, and bench with the build before", cs, err)
	}
	b := &bench{url: "postgres://x"}
	if text := b.confText(variant{mode: modeWrite, cfg: rated}, "60"); strings.Count(text, "RATE = "+ratedRate+"\n") != 3 {
		t.Errorf("the rated configuration's pepsi.conf does not set RATE on its three stages:\n%s", text)
	}
	pressured := cfg
	pressured.name, pressured.maxPending = "pressured", pressuredMaxPending
	if cs, err := parseConfigs("pressured", cfg, 1000, 1000000); err != nil || len(cs) != 1 || cs[0] != pressured {
		t.Errorf("parseConfigs(\"pressured\") = %v, %v; want bench with MAX_PENDING %d", cs, err, pressuredMaxPending)
	}
	if text := b.confText(variant{mode: modeWrite, cfg: pressured}, "60"); strings.Count(text, "MAX_PENDING = 100\n") != 2 ||
		strings.Index(text, "MAX_PENDING") < strings.Index(text, "[stage-"+stageB+"]") {
		t.Errorf("the pressured configuration's pepsi.conf does not set MAX_PENDING on stages b and c only:\n%s", text)
	}
	for _, bad := range []string{"", "write,", "Write"} {
		if _, err := parseModes(bad); err == nil {
			t.Errorf("parseModes(%q) = nil error, want one", bad)
		}
	}
}

func TestRiverResultIsReadFromItsLine(t *testing.T) {
	t.Parallel()
	out := "some log\nriver v0.51.2: 60000 jobs in 2.951 s = 20332 jobs/s; CPU per job 48 µs: client 30, backends 18\n"
	r, err := parseRiver(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.version != "v0.51.2" || r.jobsPerS != 20332 || r.cpuPerJob != 48 || !strings.HasSuffix(r.text, "backends 18") {
		t.Errorf("parseRiver = %+v, want v0.51.2, 20332 jobs/s, 48 µs, the whole line", r)
	}
	r, err = parseRiver("river v0.51.2: 10 jobs in 1.000 s = 10 jobs/s\n")
	if err != nil || r.jobsPerS != 10 || r.cpuPerJob != 0 {
		t.Errorf("a line without CPU: %+v, %v; want 10 jobs/s, CPU unknown", r, err)
	}
	if _, err := parseRiver("river-bench: connect: refused\n"); err == nil {
		t.Error("parseRiver of an output without a result line: nil error, want one")
	}
}

func TestTenthRatesInterpolateBetweenFlushes(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// 100 s drain of 3000 passes: 40/s for the first 50 s, 20/s after.
	samples := []progressSample{{at(5), 200}, {at(15), 600}, {at(50), 2000}, {at(85), 2700}, {at(95), 2900}}
	first, last, err := tenthRates(samples, t0, at(100), 3000)
	if err != nil {
		t.Fatal(err)
	}
	if first != 40 || last != 20 {
		t.Errorf("tenthRates = %v, %v hops/s; want 40 and 20", first, last)
	}
	if _, _, err := tenthRates(nil, t0, t0, 1); err == nil {
		t.Error("tenthRates of an empty drain: nil error, want one")
	}
}

// The CPU per hop of a tenth is the CPU taken across it over the passes made
// in it, each interpolated between its own samples.
func TestTenthCPUInterpolatesBetweenSamples(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// 100 s drain of 3000 passes, 30/s throughout; 10 µs per hop for the
	// first 50 s, 20 µs after (read at other times than the flushes).
	samples := []progressSample{{at(5), 150}, {at(20), 600}, {at(80), 2400}, {at(95), 2850}}
	cpu := []progressSample{{at(0), 0}, {at(7), 2100}, {at(50), 15000}, {at(88), 37800}, {at(101), 45600}}
	first, last := tenthCPU(cpu, samples, t0, at(100), 3000)
	if first != 10 || last != 20 {
		t.Errorf("tenthCPU = %v, %v µs per hop; want 10 and 20", first, last)
	}
	// No CPU read after the last tenth (the server is elsewhere): unknown.
	if _, last := tenthCPU(cpu[:4], samples, t0, at(100), 3000); last != 0 {
		t.Errorf("tenthCPU without a read after the drain: last %v, want 0", last)
	}
}

func TestRatiosAreMediansWithTheirRange(t *testing.T) {
	t.Parallel()
	if got := ratioText([]float64{1.5, 0.9, 1.2}); got != "**1.20×** (0.90–1.50)" {
		t.Errorf("ratioText = %q, want **1.20×** (0.90–1.50)", got)
	}
	if got := ratioText([]float64{2}); got != "**2.00×**" {
		t.Errorf("ratioText of one round = %q, want **2.00×**", got)
	}
	if got := ratioText(nil); got != "" {
		t.Errorf("ratioText of none = %q, want empty", got)
	}
}

func TestTableHasEveryRowAndTheRatiosOfTheSameRounds(t *testing.T) {
	t.Parallel()
	cfg := stageConfig{name: "bench", parallelism: 2, queueLimit: 64, maxMessages: 100000}
	w, a := variant{modeWrite, cfg}, variant{modeAnswer, cfg}
	b := &bench{clients: 16, configs: []stageConfig{cfg}, variants: []variant{a, w}, refused: map[mode]string{}}
	var rounds []round
	for _, f := range []float64{1, 2, 3} {
		rounds = append(rounds, round{
			tps:   10000 * f,
			pipes: map[variant]pipeResult{w: {hops: 6000 * f}, a: {hops: 30000 * f}},
			river: riverResult{version: "v0.51.2", jobsPerS: 20000 * f},
		})
	}
	got := b.table(rounds)
	for _, want := range []string{
		"| pgbench, 16 clients, single-row INSERT | 20000 tps | 1 | **0.50×** (0.50–0.50) |",
		"| pipeline write, bench (P=2 Q=64 MAX_MESSAGES=100000) | 12000 hops/s | **0.60×** (0.60–0.60) | **0.30×** (0.30–0.30) |",
		"| pipeline answer, bench (P=2 Q=64 MAX_MESSAGES=100000) | 60000 hops/s | **3.00×** (3.00–3.00) | **1.50×** (1.50–1.50) |",
		"| River v0.51.2, its benchmark's settings, no-op jobs | 40000 jobs/s | **2.00×** (2.00–2.00) | 1 |",
		"answer ÷ write mode at bench (P=2 Q=64 MAX_MESSAGES=100000): **5.00×** (5.00–5.00)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table has no %q:\n%s", want, got)
		}
	}
	b.refused[modeAnswer] = refusedShort
	for i := range rounds {
		delete(rounds[i].pipes, a)
	}
	if got := b.table(rounds); !strings.Contains(got, "| pipeline answer, bench (P=2 Q=64 MAX_MESSAGES=100000) | not measured: "+refusedShort) {
		t.Errorf("a refused mode's row does not say it was not measured:\n%s", got)
	}
}

func TestOtherConfigurationsAreSetBesideBenchRoundByRound(t *testing.T) {
	t.Parallel()
	cfg := stageConfig{name: "bench", parallelism: 2, queueLimit: 64, maxMessages: 100000}
	keys, backlogged := cfg, cfg
	keys.name, keys.keys = "keys", 1000
	backlogged.name, backlogged.keyBacklog = "backlogged", 1000000
	plain, k, bl := variant{modeAnswer, cfg}, variant{modeAnswer, keys}, variant{modeAnswer, backlogged}
	b := &bench{configs: []stageConfig{cfg, keys, backlogged}, modes: []mode{modeAnswer}}
	var rounds []round
	for _, f := range []float64{1, 2, 4} {
		// The rounds' ratios are 0.5, 0.5, 0.5 for keys and 0.9, 0.9, 0.9 for
		// backlogged, whatever each round's speed: ratios of the same round.
		rounds = append(rounds, round{pipes: map[variant]pipeResult{plain: {hops: 1000 * f}, k: {hops: 500 * f}, bl: {hops: 900 * f}}})
	}
	got := b.besideBench(rounds)
	for _, want := range []string{
		"answer mode at keys ÷ at bench: **0.50×** (0.50–0.50)",
		"answer mode at backlogged ÷ at bench: **0.90×** (0.90–0.90)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("besideBench has no %q:\n%s", want, got)
		}
	}
	b.configs = []stageConfig{keys, backlogged}
	if got := b.besideBench(rounds); got != "" {
		t.Errorf("besideBench without the bench configuration = %q; want nothing", got)
	}
}

func TestABacklogWithoutAutovacuumSaysSo(t *testing.T) {
	t.Parallel()
	if note := autovacuumNote("on"); note != "" {
		t.Errorf("autovacuumNote(on) = %q, want nothing", note)
	}
	if note := autovacuumNote("off"); !strings.Contains(note, "autovacuum = off") {
		t.Errorf("autovacuumNote(off) = %q, want it to name the setting", note)
	}
}

// batches cuts NDJSON into bodies of n whole lines, the last one shorter,
// losing and adding nothing.
func TestBatchesCutWholeLines(t *testing.T) {
	lines := []byte("a\nb\nc\nd\ne\n")
	got := batches(lines, 2)
	want := []string{"a\nb\n", "c\nd\n", "e\n"}
	if len(got) != len(want) {
		t.Fatalf("batches(%q, 2) = %q, want %q", lines, got, want)
	}
	for i := range want {
		if string(got[i]) != want[i] {
			t.Errorf("batch %d = %q, want %q", i, got[i], want[i])
		}
	}
	if got := batches([]byte("a\nb"), 5); len(got) != 1 || string(got[0]) != "a\nb" {
		t.Errorf("batches without a final newline = %q, want one body \"a\\nb\"", got)
	}
}

// Proves: the split figure's stage program answers each message at a with
// its emit lines, read back by the dispatcher's parser as messages to b,
// before "0 >done", and each message at b with "0 >done"; another stage is
// refused.
func TestSplitProgramEmitsTenChildrenBeforeItsAnswer(t *testing.T) {
	t.Parallel()
	var out, errs bytes.Buffer
	if code := splitMain(strings.NewReader("1\n2\n"), &out, &errs, stageA); code != 0 {
		t.Fatalf("split at a: exit %d: %s", code, errs.String())
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2*(splitChildren+1) || lines[splitChildren] != "0 >done" || lines[2*splitChildren+1] != "0 >done" {
		t.Fatalf("split at a wrote %q; want %d emit lines then 0 >done, twice", lines, splitChildren)
	}
	for _, l := range lines[:splitChildren] {
		if e, err := core.ParseEmit(l); err != nil || e.Stage != stageB {
			t.Errorf("emit line %q: %v, stage %q; want a message to b", l, err, e.Stage)
		}
	}
	out.Reset()
	if code := splitMain(strings.NewReader("7\n"), &out, &errs, stageB); code != 0 || out.String() != "0 >done\n" {
		t.Errorf("split at b: exit %d, %q; want 0 >done", code, out.String())
	}
	if code := splitMain(strings.NewReader("7\n"), &out, &errs, stageC); code != 2 {
		t.Errorf("split at c: exit %d, want 2", code)
	}
}
