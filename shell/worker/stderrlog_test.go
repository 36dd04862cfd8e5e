package worker

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
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
