package core_test

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

func TestParseStatusAcceptsTheProtocol(t *testing.T) {
	cases := map[string]core.Status{
		"0":                       {},
		"0 tag:153":               {Fused: []core.Fused{{Stage: "tag", Micros: 153}}},
		"0 tag:1 geo-ip:0":        {Fused: []core.Fused{{Stage: "tag", Micros: 1}, {Stage: "geo-ip", Micros: 0}}},
		"1 invalid address":       {Code: 1, Reason: "invalid address"},
		"-2 negative codes count": {Code: -2, Reason: "negative codes count"},
		"75":                      {Code: 75},
	}
	for line, want := range cases {
		got, err := core.ParseStatus(line)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseStatus(%q) = %+v, %v; want %+v", line, got, err, want)
		}
	}
}

func TestParseStatusRejectsAnythingElseQuotingTheLine(t *testing.T) {
	for _, line := range []string{"", "OK", "ok 0", " 0", "+0", "0 tag", "0 tag:x", "0 tag:-1", "0 :5", "0 t@g:5", "0.5", "0x1 bad",
		// Success is "0" alone: a zero written otherwise is no answer.
		"-0", "00", "+00", "-00", "000 >done", "-0 >done", "00 tag:1"} {
		_, err := core.ParseStatus(line)
		if err == nil {
			t.Errorf("ParseStatus(%q) accepted a malformed line", line)
			continue
		}
		if line != "" && !strings.Contains(err.Error(), line) {
			t.Errorf("error %q does not quote the line %q", err, line)
		}
	}
}

func TestParseStatusBoundsTheReason(t *testing.T) {
	s, err := core.ParseStatus("1 " + strings.Repeat("é", 5000))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Reason) > 2100 {
		t.Errorf("reason of %d bytes kept, want it cut near 2000", len(s.Reason))
	}
}

func TestParseStatusReadsAnsweredTransitions(t *testing.T) {
	cases := map[string]core.Status{
		"0 >b":                      {Transition: &core.Transition{To: "b"}},
		"0 >done":                   {Transition: &core.Transition{To: core.TargetDone}},
		"0 >paused:30":              {Transition: &core.Transition{To: core.TargetPaused, PauseFor: 30 * time.Second}},
		"0 >paused:0.25":            {Transition: &core.Transition{To: core.TargetPaused, PauseFor: 250 * time.Millisecond}},
		"0 >paused:0":               {Transition: &core.Transition{To: core.TargetPaused}},
		"0 >b tag:153":              {Fused: []core.Fused{{Stage: "tag", Micros: 153}}, Transition: &core.Transition{To: "b"}},
		`0 >b {"k":"v w","n":[1]}`:  {Transition: &core.Transition{To: "b", Patch: `{"k":"v w","n":[1]}`}},
		`0 >done t:1 u:2 {"a":{}} `: {Fused: []core.Fused{{Stage: "t", Micros: 1}, {Stage: "u", Micros: 2}}, Transition: &core.Transition{To: core.TargetDone, Patch: `{"a":{}}`}},
		`0 >b {"s":"\ud83d\ude00"}`: {Transition: &core.Transition{To: "b", Patch: `{"s":"\ud83d\ude00"}`}},
	}
	for line, want := range cases {
		got, err := core.ParseStatus(line)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseStatus(%q) = %+v (%+v), %v; want %+v (%+v)", line, got, got.Transition, err, want, want.Transition)
		}
	}
}

// A transition the dispatcher cannot write fails its message (Invalid says why);
// it is not a protocol error, so the worker lives on.
func TestParseStatusMarksTransitionsItCannotWrite(t *testing.T) {
	for line, why := range map[string]string{
		"0 >":                          "not a stage name",
		"0 >b@d":                       "not a stage name",
		"0 >paused:-1":                 "SECONDS",
		"0 >paused:soon":               "SECONDS",
		"0 >paused:NaN":                "SECONDS",
		"0 >paused:1e99":               "SECONDS",
		"0 >paused:0x10":               "SECONDS",
		"0 >paused:1e3":                "SECONDS",
		"0 >paused:+5":                 "SECONDS",
		"0 >paused:-0":                 "SECONDS",
		`0 >b {"k":`:                   "not valid JSON",
		`0 >b {"k":1}x`:                "not valid JSON",
		`0 >b {"k":"\u0000"}`:          `\u0000`,
		`0 >b {"k":"\udc00"}`:          "surrogate",
		`0 >b {"k":"\ud83d"}`:          "surrogate",
		`0 >b {"k":"\ud83d\u0041"}`:    "surrogate",
		`0 >b {"k":` + bigNumber + `}`: "number",
		"0 >b {\"k\":\"\xff\"}":        "not UTF-8",
		"0 >b {\"\xfe\":1}":            "not UTF-8",
		`0 >b {"k":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`: "nested more than 64 deep",
		`0 >b {"k":1e-20000}`:          "the number 1e-20000, beyond the range of PostgreSQL's numeric",
		`0 >b {"k":[{"n":-1e131072}]}`: "the number -1e131072, beyond",
		`0 >b {"k":0e-16384}`:          "the number 0e-16384, beyond",
		`0 >b {"k":1.55E-16382}`:       "beyond",
		`0 >b {"k":0.1e-16383}`:        "beyond",
		`0 >b {"k":10e131071}`:         "beyond",
		`0 >b {"k":1e99999999999999}`:  "beyond",
		`0 >b {"k":0e1073741823}`:      "beyond",
		"0 >paused":                    "needs a time",
		"0 >b [1,2,3]":                 `patch '[1,2,3]' refused: not a JSON object`,
		"0 >b t:1 [1, 2]":              `patch '[1, 2]' refused: not a JSON object`,
		`0 >b "s"`:                     "not a JSON object",
		"0 >b 42":                      "not a JSON object",
		"0 >b null":                    "not a JSON object",
		"0 >done {":                    `patch '{' refused: not valid JSON`,
		`0 >b [1,`:                     "not valid JSON",
		`0 >b {"a":1} t:1`:             `patch '{"a":1} t:1' refused: not valid JSON`,
		`0 >b {"k":"` + strings.Repeat("x", 1<<20) + `"}`: `patch '{"k":"xxxxx`,
	} {
		got, err := core.ParseStatus(line)
		if err != nil || got.Transition == nil || !strings.Contains(got.Transition.Invalid, why) {
			t.Errorf("ParseStatus(%q) = %+v (%+v), %v; want a transition invalid because of %q", line, got, got.Transition, err, why)
		}
	}
}

// What ParseStatus says about a line is logged and stored as a reason, so it
// quotes in single quotes: a text log would escape double quotes again inside
// its own. A line's own double quotes are kept as they are.
func TestParseStatusQuotesForALogLine(t *testing.T) {
	for line, want := range map[string]string{
		"OK":            "status line 'OK' does not start",
		"0 tag":         "status line '0 tag': 'tag' is not STAGE:MICROS",
		"0 >b@d":        "target 'b@d' is not a stage name",
		"0 >paused":     "target 'paused' needs a time",
		"0 >paused:x":   "target 'paused:x': SECONDS",
		"0 >b [1]":      "state patch '[1]' refused",
		"0 >b {\"x\":":  `state patch '{"x":' refused`,
		"OK\tit's done": `status line 'OK\tit\'s done' does not start`,
	} {
		s, err := core.ParseStatus(line)
		said := ""
		switch {
		case err != nil:
			said = err.Error()
		case s.Transition != nil:
			said = s.Transition.Invalid
		}
		if !strings.Contains(said, want) {
			t.Errorf("ParseStatus(%q) says %q; want it to say %q", line, said, want)
		}
	}
}

var bigNumber = "1" + strings.Repeat("0", 200)

// A fused stage's MICROS is at most a year (core.FusedMicrosMax): the
// statistics add them up, and a stage's absurd number once ran them past
// bigint at every flush. More is a protocol error that says so.
func TestParseStatusBoundsAFusedStagesMicros(t *testing.T) {
	most := strconv.FormatInt(core.FusedMicrosMax, 10)
	if s, err := core.ParseStatus("0 >done b:" + most); err != nil || len(s.Fused) != 1 || s.Fused[0].Micros != core.FusedMicrosMax {
		t.Errorf("ParseStatus with b:%s = %+v, %v; want it taken", most, s, err)
	}
	for _, line := range []string{"0 >done b:" + strconv.FormatInt(core.FusedMicrosMax+1, 10), "0 b:9223372036854775807", "0 b:99999999999999999999999"} {
		if _, err := core.ParseStatus(line); err == nil || !strings.Contains(err.Error(), "reports more than 31536000000000 microseconds (a year)") {
			t.Errorf("ParseStatus(%q) = %v; want a protocol error saying the micros are more than a year", line, err)
		}
	}
	var d core.StageDelta
	d.Add(core.StageDelta{ProcessingUS: math.MaxInt64 - 5})
	if d.Add(core.StageDelta{ProcessingUS: 10}); d.ProcessingUS != math.MaxInt64 {
		t.Errorf("ProcessingUS past an int64 = %d; want it to stop at the largest", d.ProcessingUS)
	}
}

// A reason is the stage's free text: what PostgreSQL's text cannot hold
// (bytes that are not UTF-8, NUL) is replaced, not refused, so that the
// failure is written with it.
func TestParseStatusMakesAReasonStorable(t *testing.T) {
	for line, want := range map[string]string{
		"3 bad \xff\xfe input":              "bad \uFFFD input",
		"75 nul\x00here":                    "nul\uFFFDhere",
		"1 fine: é ☃":                       "fine: é ☃",
		"2 " + strings.Repeat("\xff", 3000): strings.Repeat("\uFFFD", 1),
	} {
		got, err := core.ParseStatus(line)
		if err != nil || got.Reason != want {
			t.Errorf("ParseStatus(%q).Reason = %q, %v; want %q", line, got.Reason, err, want)
		}
	}
	if got, err := core.ParseStatus(`0 >b {"k":` + strings.Repeat("[", 63) + strings.Repeat("]", 63) + `}`); err != nil || got.Transition == nil || got.Transition.Invalid != "" {
		t.Errorf("a patch nested 64 deep: %+v, %v; want it taken", got, err)
	}
}

// The numbers at the edges of PostgreSQL's numeric are taken: a patch is
// refused only for what jsonb would refuse (store's
// TestTheCoreRefusesTheNumbersJSONBRefuses checks both sides on a server).
func TestParseStatusTakesTheNumbersNumericHolds(t *testing.T) {
	for _, n := range []string{"1e131071", "-9.9e131071", "1e-16383", "0e-16383", "123e-16383", "0e131072", "0e999999",
		"1.5e-16382", "0.0001e131075", "10e131070", "1E+5", "-0.000", "0"} {
		line := `0 >b {"k":` + n + `}`
		got, err := core.ParseStatus(line)
		if err != nil || got.Transition == nil || got.Transition.Invalid != "" {
			t.Errorf("ParseStatus(%q) = %+v (%+v), %v; want the patch taken: numeric holds %s", line, got, got.Transition, err, n)
		}
	}
}

func TestParseStatusRejectsMalformedFusedStagesInTheAnswerForm(t *testing.T) {
	for _, line := range []string{"0 >b tag", "0 >b tag:x", "0 >done :5", "0 >b tag:-1", "0 >b t:1 tag", "0 [1]", "0 paused:5"} {
		if _, err := core.ParseStatus(line); err == nil {
			t.Errorf("ParseStatus(%q) accepted a line whose fused stages are malformed: a protocol error", line)
		}
	}
}

// Line writes every form of the grammar, and ParseStatus reads each line back
// as the status it was written from.
func TestStatusLineRoundTrips(t *testing.T) {
	paused := func(d time.Duration) *core.Transition {
		return &core.Transition{To: core.TargetPaused, PauseFor: d}
	}
	for _, c := range []struct {
		s    core.Status
		line string
	}{
		{core.Status{}, "0"},
		{core.Status{Fused: []core.Fused{{Stage: "tag", Micros: 153}, {Stage: "geo-ip", Micros: 0}}}, "0 tag:153 geo-ip:0"},
		{core.Status{Code: 1, Reason: "invalid address"}, "1 invalid address"},
		{core.Status{Code: 75}, "75"},
		{core.Status{Code: -2, Reason: "negative codes count"}, "-2 negative codes count"},
		{core.Status{Transition: &core.Transition{To: "b"}}, "0 >b"},
		{core.Status{Transition: &core.Transition{To: core.TargetDone}}, "0 >done"},
		{core.Status{Fused: []core.Fused{{Stage: "t", Micros: 1}}, Transition: &core.Transition{To: "b", Patch: `{"k":"v w","n":[1]}`}},
			`0 >b t:1 {"k":"v w","n":[1]}`},
		{core.Status{Transition: paused(0)}, "0 >paused:0"},
		{core.Status{Transition: paused(time.Microsecond)}, "0 >paused:0.000001"},
		{core.Status{Transition: paused(1500 * time.Millisecond)}, "0 >paused:1.5"},
		{core.Status{Transition: paused(time.Second)}, "0 >paused:1"},
		{core.Status{Transition: paused(10 * time.Second)}, "0 >paused:10"},
		{core.Status{Transition: paused(time.Hour)}, "0 >paused:3600"},
		{core.Status{Transition: paused(100*24*time.Hour + 250*time.Millisecond)}, "0 >paused:8640000.25"},
		{core.Status{Transition: paused(core.PauseMax)}, "0 >paused:315360000"},
	} {
		if got := c.s.Line(); got != c.line {
			t.Errorf("%+v.Line() = %q, want %q", c.s, got, c.line)
			continue
		}
		back, err := core.ParseStatus(c.line)
		if err != nil || !reflect.DeepEqual(back, c.s) {
			t.Errorf("ParseStatus(%q) = %+v, %v; want %+v back", c.line, back, err, c.s)
		}
	}
}

// A pause is written to the microsecond, without an exponent, and a pause in
// the past is 0; a reason stays on its line.
func TestStatusLineWritesWhatTheParserReads(t *testing.T) {
	for _, c := range []struct {
		s    core.Status
		line string
	}{
		{core.Status{Transition: &core.Transition{To: core.TargetPaused, PauseFor: -time.Hour}}, "0 >paused:0"},
		{core.Status{Transition: &core.Transition{To: core.TargetPaused, PauseFor: 400 * time.Nanosecond}}, "0 >paused:0"},
		{core.Status{Transition: &core.Transition{To: core.TargetPaused, PauseFor: 1234567 * time.Nanosecond}}, "0 >paused:0.001235"},
		{core.Status{Code: 1, Reason: "line one\nline two"}, "1 line one line two"},
	} {
		if got := c.s.Line(); got != c.line {
			t.Errorf("%+v.Line() = %q, want %q", c.s, got, c.line)
		}
	}
}

// FuzzParseStatus: no line makes the parser panic; a line it accepts has a code
// and either a reason (non-zero) or well-formed fused stages; an answered
// transition is either writable (a target and, if any, a patch PostgreSQL's
// jsonb accepts) or says why not; Line writes what it accepted (but a
// transition it cannot write) as a line it reads back the same.
func FuzzParseStatus(f *testing.F) {
	for _, seed := range []string{"0", "0 tag:1", "1 reason", "0 >b", "0 >done t:1 {\"a\":1}", "0 >paused:1.5",
		"0 >b {\"s\":\"\\ud83d\\ude00\"}", "0 >b {\"s\":\"\\u0000\"}", "0 >", "OK", "0 >b {", "-3"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		s, err := core.ParseStatus(line)
		if err != nil {
			if s.Code != 0 || s.Transition != nil || s.Fused != nil {
				t.Fatalf("ParseStatus(%q) failed but returned %+v", line, s)
			}
			return
		}
		if s.Code != 0 && (s.Fused != nil || s.Transition != nil) {
			t.Fatalf("ParseStatus(%q) = %+v: a failure carries no fused stages or transition", line, s)
		}
		for _, f := range s.Fused {
			if f.Micros < 0 || f.Stage == "" {
				t.Fatalf("ParseStatus(%q): fused %+v", line, f)
			}
		}
		if tr := s.Transition; tr != nil && tr.Invalid == "" {
			if tr.To == "" || tr.PauseFor < 0 || tr.PauseFor > core.PauseMax {
				t.Fatalf("ParseStatus(%q): writable transition %+v", line, tr)
			}
			if tr.Patch != "" && (!json.Valid([]byte(tr.Patch)) || tr.Patch[0] != '{') {
				t.Fatalf("ParseStatus(%q): writable transition with patch %q", line, tr.Patch)
			}
		}
		if s.Transition != nil && s.Transition.Invalid != "" || strings.Contains(line, "\n") {
			return
		}
		again, err := core.ParseStatus(s.Line())
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("ParseStatus(%q) = %+v, written %q, read back as %+v, %v", line, s, s.Line(), again, err)
		}
	})
}
