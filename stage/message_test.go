package stage_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/stage"
)

// runMessages runs handlers for stage in message mode over input and returns
// the answers, one per line.
func runMessages(t *testing.T, stageName, input string, handlers map[string]stage.Handler, fused ...string) []string {
	t.Helper()
	var out bytes.Buffer
	err := stage.Run(context.Background(), stage.Options{
		Stage: stageName, Input: conf.InputMessage, Handlers: handlers, Fused: fused,
		In: strings.NewReader(input), Out: &out,
		DB: "host=/nonexistent port=1", // never used: message mode has no database
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
}

// Proves: in message mode a handler gets the message from its line (id,
// attempts, state with exact numbers, payload as text or base64 or absent),
// with no database, and its transition and state changes are answered.
func TestMessageModeHandsTheLineToTheHandlerWithoutADatabase(t *testing.T) {
	var seen []string
	handlers := map[string]stage.Handler{
		"parse": func(_ context.Context, m *stage.Message) stage.Result {
			seen = append(seen, m.Stage+" "+string(m.Payload)+" "+stringOf(m.State["n"]))
			if m.Attempts > 0 {
				return stage.Done()
			}
			m.State["len"] = len(m.Payload)
			return stage.Advance("enrich")
		},
	}
	input := `{"id":1,"stage":"parse","attempts":0,"state":{"n":12345678901234567890},"payload":"héllo"}
{"id":2,"stage":"parse","attempts":0,"state":{},"payload_base64":"/wA="}

{"id":3,"stage":"parse","attempts":2,"state":{}}
`
	got := runMessages(t, "parse", input, handlers)
	want := []string{`0 >enrich {"len":6}`, `0 >enrich {"len":2}`, `0 >done`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("answers\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(seen) != 3 || seen[0] != "parse héllo 12345678901234567890" || seen[1] != "parse \xff\x00 <nil>" || seen[2] != "parse  <nil>" {
		t.Errorf("handlers saw %q", seen)
	}
}

// Proves what docs/protocol.md ("Standard input") asks of a stage: keys of
// the line it does not know, which a later dispatcher may add, are ignored,
// and the message is handled as if they were not there.
func TestMessageModeIgnoresKeysItDoesNotKnow(t *testing.T) {
	var seen []string
	handlers := map[string]stage.Handler{
		"parse": func(_ context.Context, m *stage.Message) stage.Result {
			seen = append(seen, fmt.Sprintf("%d %s %d", m.ID, m.Payload, m.Attempts))
			return stage.Done()
		},
	}
	input := `{"priority":5,"id":1,"stage":"parse","attempts":1,"state":{},"payload":"x","added":{"later":[1,2]},"key":5,"not_before":1700000000}
`
	got := runMessages(t, "parse", input, handlers)
	if strings.Join(got, "\n") != "0 >done" || strings.Join(seen, ";") != "1 x 1" {
		t.Errorf("answers %q, handlers saw %q; want the message handled, its unknown keys ignored", got, seen)
	}
}

func stringOf(v any) string {
	if n, ok := v.(json.Number); ok {
		return n.String()
	}
	return "<nil>"
}

// Proves: what only a database could do fails that message alone, with a reason
// that says why, and the stage goes on: Failed, a deleted key, Message.Tx, a
// line that is no message; fused stages still run and report their time.
func TestMessageModeFailsWhatNeedsADatabaseAndGoesOn(t *testing.T) {
	handlers := map[string]stage.Handler{
		"s": func(ctx context.Context, m *stage.Message) stage.Result {
			switch string(m.Payload) {
			case "failed":
				return stage.Failed("bad address")
			case "delete":
				delete(m.State, "k")
				return stage.Done()
			case "tx":
				if _, err := m.Tx.Exec(ctx, "SELECT 1"); err != nil {
					return stage.Error(err.Error())
				}
				return stage.Done()
			case "fuse":
				return stage.Advance("tag")
			}
			return stage.Done()
		},
		"tag": func(_ context.Context, m *stage.Message) stage.Result {
			m.State["tagged"] = true
			return stage.Advance("next")
		},
	}
	input := `{"id":1,"stage":"s","attempts":0,"state":{},"payload":"failed"}
{"id":2,"stage":"s","attempts":0,"state":{"k":1},"payload":"delete"}
{"id":3,"stage":"s","attempts":0,"state":{},"payload":"tx"}
not json
{"id":4,"stage":"s","attempts":0,"state":{},"payload":"fuse"}
{"id":5,"stage":"s","attempts":0,"state":{},"payload":"ok"}
`
	got := runMessages(t, "s", input, handlers, "tag")
	if len(got) != 6 {
		t.Fatalf("answers %q, want 6 (one per input line)", got)
	}
	for i, want := range []string{"1 bad address", "1 the handler deleted a state key", "1 stage: INPUT = message: this stage has no database", "1 not a message", "0 >next tag:", "0 >done"} {
		if !strings.HasPrefix(got[i], want) {
			t.Errorf("answer %d = %q, want it to start with %q", i+1, got[i], want)
		}
	}
	if !strings.HasSuffix(got[4], ` {"tagged":true}`) {
		t.Errorf("fused answer %q lacks the fused stage's patch", got[4])
	}
}

// Proves: a message line is read by the parser every program shares
// (internal/msgjson): a payload given twice, bad base64 or a state that is
// no object fail that message with the parser's reason, as
// pepsi-stage-check refuses the same lines. (A key the stage does not know
// is ignored: TestMessageModeIgnoresKeysItDoesNotKnow.)
func TestMessageLineIsReadByTheSharedParser(t *testing.T) {
	handlers := map[string]stage.Handler{"s": func(context.Context, *stage.Message) stage.Result { return stage.Done() }}
	input := `{"id":2,"stage":"s","payload":"a","payload_base64":"YQ=="}
{"id":3,"stage":"s","payload_base64":"not base64!"}
{"id":4,"stage":"s","state":[1]}
{"id":5,"stage":"s","state":{},"payload":"ok"}
`
	got := runMessages(t, "s", input, handlers)
	want := []string{"1 not a message (both payload and payload_base64", "1 not a message (payload_base64", "1 not a message (state", "0 >done"}
	if len(got) != len(want) {
		t.Fatalf("answers %q, want %d (one per input line)", got, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("answer %d = %q, want it to start with %q", i+1, got[i], want[i])
		}
	}
}

// Proves: Main reads PEPSI_INPUT=message and then needs no database at all
// (here none is configured and PEPSI_DATABASE points nowhere).
func TestMainInMessageModeNeedsNoDatabase(t *testing.T) {
	code, out, errText := runMain(t, `{"id":7,"stage":"parse","attempts":0,"state":{}}`+"\n",
		[]string{"PEPSI_STAGE=parse", "PEPSI_INPUT=message", "PEPSI_DATABASE=host=/nonexistent port=1"}, "worker")
	if code != 0 || out != "0 >enrich\n" {
		t.Errorf("exit %d, output %q, stderr %q; want 0 and \"0 >enrich\"", code, out, errText)
	}
	code, _, errText = runMain(t, "", []string{"PEPSI_STAGE=parse", "PEPSI_INPUT=json"}, "worker")
	if code != 2 || !strings.Contains(errText, "PEPSI_INPUT must be id or message") {
		t.Errorf("PEPSI_INPUT=json: exit %d, stderr %q; want 2 naming PEPSI_INPUT", code, errText)
	}
}

// Proves: Main in message mode accepts "worker -c FILE", as pepsi-dispatch
// starts every stage program when it has a configuration file, and still never
// connects, though the file names a DATABASE (one that answers nothing here).
func TestMainInMessageModeTakesTheConfigurationAndNeedsNoDatabase(t *testing.T) {
	file := writeConf(t, "[pepsi]\nDATABASE = host=/nonexistent port=1\n[stage-parse]\nPROGRAM = x\nINPUT = message\n")
	// A file it cannot read is no matter either: a filter reads none of it
	// (a wrapper on another host is handed the dispatcher's path).
	missing := filepath.Join(t.TempDir(), "not-on-this-host.conf")
	for _, args := range [][]string{{"worker", "-c", file}, {"worker", "-c=" + file}, {"worker", "-c", missing}} {
		code, out, errText := runMain(t, `{"id":7,"stage":"parse","attempts":0,"state":{}}`+"\n",
			[]string{"PEPSI_STAGE=parse", "PEPSI_INPUT=message"}, args...)
		if code != 0 || out != "0 >enrich\n" {
			t.Errorf("args %q: exit %d, output %q, stderr %q; want 0 and \"0 >enrich\"", args, code, out, errText)
		}
	}
}

// Proves: in message mode, where no database writes a larger state, a patch
// whose answer line fits the 64 KiB the dispatcher reads is answered (not
// only up to id mode's 32 KiB), and a longer one fails its message with a
// reason naming that limit.
func TestMessageModeAnswersPatchesUpToTheDispatchersLine(t *testing.T) {
	for _, tc := range []struct {
		size int
		ok   bool
	}{{40 << 10, true}, {70 << 10, false}} {
		handlers := map[string]stage.Handler{"parse": func(_ context.Context, m *stage.Message) stage.Result {
			m.State["big"] = strings.Repeat("x", tc.size)
			return stage.Done()
		}}
		got := runMessages(t, "parse", `{"id":1,"stage":"parse","attempts":0,"state":{},"payload":"p"}`+"\n", handlers)
		switch {
		case tc.ok && (!strings.HasPrefix(got[0], `0 >done {"big":"xxx`) || len(got[0]) > core.AnswerMax):
			t.Errorf("a patch of %d bytes: answer %.60q (%d bytes); want it answered", tc.size, got[0], len(got[0]))
		case !tc.ok && (!strings.HasPrefix(got[0], "1 ") || !strings.Contains(got[0], "over the 65536 the dispatcher reads of one line")):
			t.Errorf("a patch of %d bytes: answer %.200q; want a failure naming the 65536 bytes", tc.size, got[0])
		}
	}
}
