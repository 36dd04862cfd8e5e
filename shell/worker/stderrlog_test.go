package worker

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A stage's log record, as slog's text handler writes it, is logged by the
// dispatcher as that record: its level, message and pairs, with the
// dispatcher's own attributes after them, and no quoting of quotes.
func TestAStageLogRecordOnStderrIsLoggedAsThatRecord(t *testing.T) {
	t.Parallel()
	var stage bytes.Buffer
	slog.New(slog.NewTextHandler(&stage, nil)).Error(`cannot reach "geo" service`,
		"stage", "enrich", "id", 42, "err", "dial: refused\nretrying", "note", `it's "odd"`)
	line := strings.TrimSuffix(stage.String(), "\n")

	var text bytes.Buffer
	logStderr(slog.New(slog.NewTextHandler(&text, nil)), nil, "level=WARN msg=\"message does not exist; answering 0 without running it\" stage=a id=5", "stream", "stderr")
	if got := text.String(); strings.Contains(got, `\"`) || !strings.Contains(got, `level=WARN msg="message does not exist; answering 0 without running it" stage=a id=5 stream=stderr`) {
		t.Errorf("text log %q: want the stage's record as it was, quoted once", got)
	}

	var out bytes.Buffer
	logStderr(slog.New(slog.NewJSONHandler(&out, nil)), nil, line, "stream", "stderr")
	var rec map[string]any
	if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
		t.Fatalf("%q: %v", out.String(), err)
	}
	want := map[string]any{"level": "ERROR", "msg": `cannot reach "geo" service`, "stage": "enrich", "id": "42",
		"err": "dial: refused\nretrying", "note": `it's "odd"`, "stream": "stderr"}
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("%s = %#v, want %#v (record %v from the line %q)", k, rec[k], v, rec, line)
		}
	}
}

// Any other line is logged whole, at warn, as it was before stages logged
// records.
func TestAnyOtherStderrLineIsLoggedWhole(t *testing.T) {
	t.Parallel()
	for _, line := range []string{
		"hello from stage a",
		"level=WARN",                         // no msg
		"msg=hi",                             // no level
		"level=LOUD msg=hi",                  // a level slog does not know
		`level=INFO msg="unterminated`,       // a broken quote
		`level=INFO msg="a"b`,                // text after a quoted value
		"level=INFO msg=hi  x=1",             // two spaces: not slog's
		"level=INFO msg=hi x",                // a word without a value
		`level=INFO msg=hi say"="so`,         // a quote in a key
		"traceback: key=value in the middle", // prose with an equals sign
	} {
		var out bytes.Buffer
		logStderr(slog.New(slog.NewJSONHandler(&out, nil)), nil, line, "stream", "stderr")
		var rec map[string]any
		if err := json.Unmarshal(out.Bytes(), &rec); err != nil {
			t.Fatalf("%q: %v", out.String(), err)
		}
		if rec["msg"] != line || rec["level"] != "WARN" || rec["stream"] != "stderr" {
			t.Errorf("line %q logged as %v; want it whole as the message, at warn", line, rec)
		}
	}
}

// A worker's standard error is logged up to its burst, then at its rate; what
// is dropped is counted and said in one line at most every stderrDropReport,
// and at the end.
func TestAWorkersStandardErrorIsLoggedAtMostAtItsRate(t *testing.T) {
	var out bytes.Buffer
	g := newStderrGate(slog.New(slog.NewJSONHandler(&out, nil)))
	t0 := time.Unix(1_000_000, 0)
	passed := 0
	for range stderrBurst + 5 {
		if g.pass(t0, 10) {
			passed++
		}
	}
	if passed != stderrBurst {
		t.Fatalf("%d lines at once passed; want the burst, %d", passed, stderrBurst)
	}
	// A rate's interval later a line passes; the 5 dropped are said with the
	// first line stderrDropReport after the first of them.
	if !g.pass(t0.Add(time.Second/stderrRate), 10) {
		t.Fatal("a line a rate's interval after the burst was dropped")
	}
	if got := dropReports(t, &out); len(got) != 0 {
		t.Fatalf("drop reports %v before stderrDropReport passed; want none yet", got)
	}
	g.pass(t0.Add(stderrDropReport), 10)
	if got := dropReports(t, &out); len(got) != 1 || got[0] != 5 {
		t.Fatalf("drop reports %v; want one of 5", got)
	}
	// A flood at twice the rate for 25 s: about half of it passes, and the
	// rest is said every stderrDropReport while it goes on, and at the end.
	out.Reset()
	start, lines, logged := t0.Add(2*stderrDropReport), 0, 0
	for at := time.Duration(0); at < 25*time.Second; at += time.Second / (2 * stderrRate) {
		lines++
		if g.pass(start.Add(at), 10) {
			logged++
		}
	}
	g.close()
	reports := dropReports(t, &out)
	var dropped int64
	for _, n := range reports {
		dropped += n
	}
	if logged+int(dropped) != lines || len(reports) < 2 || len(reports) > 4 {
		t.Errorf("%d lines: %d logged, drop reports %v (%d); want every line logged or counted, in 2 to 4 reports", lines, logged, reports, dropped)
	}
	if want := 25 * stderrRate; logged < want || logged > want+stderrBurst {
		t.Errorf("%d lines logged in 25 s; want the rate's %d, and at most a burst more", logged, want)
	}
}

// A worker that floods its standard error and then falls silent has its
// drops said when stderrDropReport has passed since the first of them, by a
// timer, not only with its next line or at its end; a timer whose drops a
// line reported already says nothing more.
func TestAWorkerSilentAfterAFloodHasItsDropsSaid(t *testing.T) {
	var out bytes.Buffer
	g := newStderrGate(slog.New(slog.NewJSONHandler(&out, nil)))
	var timers []*fakeTimer
	g.afterFunc = func(d time.Duration, f func()) interface{ Stop() bool } {
		if d != stderrDropReport {
			t.Errorf("timer armed for %v; want stderrDropReport, %v", d, stderrDropReport)
		}
		timers = append(timers, &fakeTimer{fire: f})
		return timers[len(timers)-1]
	}
	t0 := time.Unix(1_000_000, 0)
	for range stderrBurst + 7 {
		g.pass(t0, 10)
	}
	if len(timers) != 1 || len(dropReports(t, &out)) != 0 {
		t.Fatalf("%d timers armed, reports %v after the flood; want one timer, no report yet", len(timers), dropReports(t, &out))
	}
	timers[0].fire() // the worker is silent: no line comes to say it
	if got := dropReports(t, &out); len(got) != 1 || got[0] != 7 {
		t.Fatalf("drop reports %v once the timer went off; want one of 7", got)
	}
	// Dropped again: a new timer; a line stderrDropReport later says the
	// drops and stops it, and if it fires all the same it says nothing.
	out.Reset()
	for range 3 {
		g.pass(t0, 10)
	}
	if len(timers) != 2 {
		t.Fatalf("%d timers armed; want a second one for the new drops", len(timers))
	}
	g.pass(t0.Add(stderrDropReport), 10)
	if !timers[1].stopped {
		t.Error("the timer of drops a line reported was not stopped")
	}
	timers[1].fire()
	g.close()
	if got := dropReports(t, &out); len(got) != 1 || got[0] != 3 {
		t.Errorf("drop reports %v; want one of 3, said once", got)
	}
}

// fakeTimer is a timer a test fires by hand.
type fakeTimer struct {
	fire    func()
	stopped bool
}

func (f *fakeTimer) Stop() bool { f.stopped = true; return true }

// Long lines count for their size: of 64 KiB lines at once, a burst's worth
// of KiB passes, not a burst of lines.
func TestAWorkersLongStandardErrorLinesCountForTheirSize(t *testing.T) {
	var out bytes.Buffer
	g := newStderrGate(slog.New(slog.NewJSONHandler(&out, nil)))
	t0 := time.Unix(1_000_000, 0)
	passed := 0
	for range 1000 {
		if g.pass(t0, 64<<10) {
			passed++
		}
	}
	if want := stderrBurst / 65; passed != want {
		t.Errorf("%d lines of 64 KiB at once passed; want %d (a burst of %d, 65 each)", passed, want, stderrBurst)
	}
	g.close()
	if got := dropReports(t, &out); len(got) != 1 || got[0] != int64(1000-passed) {
		t.Errorf("drop reports %v; want one of %d", got, 1000-passed)
	}
}

// dropReports returns the counts of the drop reports logged to out.
func dropReports(t *testing.T, out *bytes.Buffer) []int64 {
	t.Helper()
	var got []int64
	for line := range strings.Lines(out.String()) {
		var rec struct {
			Msg     string `json:"msg"`
			Dropped int64  `json:"dropped"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if rec.Msg == "worker's standard error: lines dropped, over the limit" {
			got = append(got, rec.Dropped)
		}
	}
	return got
}
