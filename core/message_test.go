package core_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Feature: INPUT = message (docs/protocol.md, "Standard input").

const messageStages = `
[pepsi-dispatch]
LINE_MAX = 1024

[stage-parse]
PROGRAM = parse
INPUT = message
PARALLELISM = 1
QUEUE_LIMIT = 4

[stage-enrich]
PROGRAM = enrich
INPUT = message
PARALLELISM = 1

[stage-store]
PROGRAM = store
PARALLELISM = 1
`

// Proves: a message stage is handed each row itself, one compact JSON line per
// id in id order (payload a string when UTF-8, payload_base64 when not, absent
// when NULL; traceparent the pass's, which the claim read), while an id stage
// is handed ids only.
func TestAMessageStageIsHandedTheRowAndAnIDStageItsID(t *testing.T) {
	w := newWorld(t, messageStages)
	w.q.InsertMessage("parse", `{"from":"a@example.org","n":1}`, []byte("héllo \"world\"\n"))
	w.q.InsertMessage("parse", "", []byte{0xff, 0xfe, 'x'})
	w.q.InsertMessage("parse", "", nil)
	w.q.InsertMessage("store", `{"k":true}`, []byte("ids only"))
	cmds := w.step(core.Start{})
	var parse, store core.Write
	for _, wr := range of[core.Write](cmds) {
		switch w.stageOf[wr.Worker] {
		case "parse":
			parse = wr
		case "store":
			store = wr
		}
	}
	want := []string{
		`{"id":1,"stage":"parse","attempts":0,"traceparent":"00-00000000000000000000000000000001-bc67466508c49862-01","state":{"from":"a@example.org","n":1},"payload":"héllo \"world\"\n"}`,
		`{"id":2,"stage":"parse","attempts":0,"traceparent":"00-00000000000000000000000000000002-47e19a669d5a4e86-01","state":{},"payload_base64":"//54"}`,
		`{"id":3,"stage":"parse","attempts":0,"traceparent":"00-00000000000000000000000000000003-915b8be05c3404fa-01","state":{}}`,
	}
	if !slices.Equal(parse.IDs, []int64{1, 2, 3}) || !slices.Equal(parse.Lines, want) {
		t.Errorf("parse was handed %v\n%s\nwant %v\n%s", parse.IDs, strings.Join(parse.Lines, "\n"), []int64{1, 2, 3}, strings.Join(want, "\n"))
	}
	if !slices.Equal(store.IDs, []int64{4}) || store.Lines != nil {
		t.Errorf("store (INPUT = id) was handed %v with lines %q; want id 4 and no lines", store.IDs, store.Lines)
	}
}

// Proves: the line handed to the next message stage carries the state as the
// previous stage's answered patch left it, not as it was claimed before, and
// the message's trace id with a span id of its own pass.
func TestTheNextMessageStageSeesTheStateThePatchWrote(t *testing.T) {
	w := newWorld(t, messageStages)
	w.q.InsertMessage("parse", `{"n":1}`, []byte("p"))
	first := one[core.Write](t, w.step(core.Start{}))
	if !strings.Contains(first.Lines[0], `"traceparent":"00-00000000000000000000000000000001-bc67466508c49862-01"`) {
		t.Fatalf("parse was handed %q, want the trace its claim gave it", first.Lines[0])
	}
	cmds := w.answer(1, "", "", `0 >enrich {"n":2,"subject":"hi"}`)
	wr := one[core.Write](t, cmds)
	want := `{"id":1,"stage":"enrich","attempts":0,"traceparent":"00-00000000000000000000000000000001-714c990bbd3b3a99-01","state":{"n":2,"subject":"hi"},"payload":"p"}`
	if w.stageOf[wr.Worker] != "enrich" || len(wr.Lines) != 1 || wr.Lines[0] != want {
		t.Errorf("enrich was handed %q, want %q", wr.Lines, want)
	}
}

// Proves: a message whose line would exceed LINE_MAX fails with a reason that
// names the limit, whether its payload alone is over it (the claim did not read
// it) or the whole line is; the messages beside it are handed out as usual and
// the worker is not touched.
func TestAMessageOverLineMaxFailsAndTheOthersRun(t *testing.T) {
	w := newWorld(t, messageStages)
	w.q.InsertMessage("parse", "", []byte("small"))
	w.q.InsertMessage("parse", "", []byte(strings.Repeat("x", 2000)))
	w.q.InsertMessage("parse", "", []byte(strings.Repeat("\x01", 500))) // 500 bytes, 3000 as JSON escapes
	w.q.InsertMessage("parse", "", []byte("also small"))
	cmds := w.step(core.Start{})
	for _, id := range []int64{2, 3} {
		w.wantRow(id, "parse", core.StatusFailed)
		if r := w.row(id); !strings.Contains(r.DispatchError, "over LINE_MAX (1024 bytes)") {
			t.Errorf("message %d: dispatch_error %q does not name LINE_MAX", id, r.DispatchError)
		}
	}
	var handed []int64
	for _, wr := range of[core.Write](cmds) {
		handed = append(handed, wr.IDs...)
	}
	if !slices.Equal(handed, []int64{1, 4}) {
		t.Errorf("handed out %v, want [1 4] (the two that fit)", handed)
	}
	none[core.Kill](t, cmds, "an outsized message is the message's fault, not the worker's")
}

// Proves: a line is JSON that decodes to the row it was built from: every
// ASCII byte (controls, quotes, backslashes), multi-byte text, bytes that are
// not UTF-8 (payload_base64), and a NULL payload.
func TestMessageLineDecodesToTheRow(t *testing.T) {
	var ascii []byte
	for c := range 0x80 {
		ascii = append(ascii, byte(c))
	}
	payloads := [][]byte{ascii, []byte("é ☃ 😀 \u2028 <&>"), {0xff, 0x00, 0x80}, {}, nil}
	for _, p := range payloads {
		m := &core.Message{State: `{"b": [1, {"c": null}], "a": "x\ny"}`, Payload: p, PayloadSize: len(p)}
		if p == nil {
			m.PayloadSize = -1
		}
		line, why := core.MessageLine(core.Row{ID: 9, Stage: "s", Attempts: 2, Message: m}, 1<<20)
		if why != "" {
			t.Fatalf("payload %q: %s", p, why)
		}
		var got struct {
			ID            int64
			Stage         string
			Attempts      int
			State         map[string]any
			Payload       *string
			PayloadBase64 *string `json:"payload_base64"`
		}
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		var back []byte
		switch {
		case got.Payload != nil:
			back = []byte(*got.Payload)
		case got.PayloadBase64 != nil:
			back, _ = base64.StdEncoding.DecodeString(*got.PayloadBase64)
		}
		if got.ID != 9 || got.Stage != "s" || got.Attempts != 2 || got.State["a"] != "x\ny" || !bytes.Equal(back, p) || (p == nil) != (got.Payload == nil && got.PayloadBase64 == nil) {
			t.Errorf("line %q decodes to %+v, payload %q; want the row back", line, got, back)
		}
	}
}

// Proves: the line of a message a stage's pass emitted carries its parent_id
// (and the line of any other message none), so a stage sees where its message
// came from without a database.
func TestMessageLineCarriesTheParentOfAnEmittedMessage(t *testing.T) {
	m := &core.Message{State: `{}`, Payload: []byte("row 2"), PayloadSize: 5, ParentID: 812345}
	line, why := core.MessageLine(core.Row{ID: 9, Stage: "s", Message: m}, 1<<20)
	if why != "" || !strings.Contains(line, `"parent_id":812345,`) {
		t.Errorf("line %q (%s) lacks \"parent_id\":812345", line, why)
	}
	m.ParentID = 0
	if line, _ := core.MessageLine(core.Row{ID: 9, Stage: "s", Message: m}, 1<<20); strings.Contains(line, "parent_id") {
		t.Errorf("line %q of a message no pass emitted names a parent", line)
	}
}

// Proves: a message stage's bare "0" (which says the stage wrote its own
// transition, which it cannot) fails the message with a reason that says so,
// and the worker lives on.
func TestABareZeroFromAMessageStageFailsWithAReasonThatSaysWhy(t *testing.T) {
	w := newWorld(t, messageStages)
	w.q.InsertMessage("parse", "", []byte("p"))
	w.step(core.Start{})
	cmds := w.answer(1, "", "", "0")
	w.wantRow(1, "parse", core.StatusFailed)
	if r := w.row(1); !strings.Contains(r.DispatchError, "must answer its transition (0 >TARGET)") {
		t.Errorf("dispatch_error %q does not say a message stage must answer its transition", r.DispatchError)
	}
	none[core.Kill](t, cmds, "a bare 0 is the message's fault, not the worker's")
}
