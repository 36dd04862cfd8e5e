package msgjson_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
)

func TestFieldsSayWhichOptionalFieldsAreTaken(t *testing.T) {
	line := []byte(`{"stage": "parse", "key": "order-1", "payload": "x"}`)
	if _, err := msgjson.Parse(line, msgjson.Fields{}); err == nil || !strings.Contains(err.Error(), `unknown field "stage" (want payload or payload_base64, and optionally state)`) {
		t.Errorf("without Stage and Key: %v; want stage refused as an unknown field", err)
	}
	if _, err := msgjson.Parse(line, msgjson.Fields{Stage: true}); err == nil || !strings.Contains(err.Error(), `unknown field "key"`) {
		t.Errorf("without Key: %v; want key refused", err)
	}
	m, err := msgjson.Parse(line, msgjson.Fields{Stage: true, Key: true})
	if err != nil || m.Stage != "parse" || m.Key != "order-1" || string(m.Payload) != "x" {
		t.Errorf("with both: %+v, %v", m, err)
	}
}

// Proves: order_key is taken only where Fields allow it (and always in a
// line, which carries the row's key whatever its length), and a producer's
// key is 1 to OrderKeyMax bytes of UTF-8 without NUL.
func TestOrderKeyIsTakenWhereAllowedAndBounded(t *testing.T) {
	text := []byte(`{"payload": "x", "order_key": "acct-9"}`)
	if _, err := msgjson.Parse(text, msgjson.Fields{Key: true}); err == nil || !strings.Contains(err.Error(), `unknown field "order_key"`) {
		t.Errorf("without OrderKey: %v; want order_key refused", err)
	}
	producer := msgjson.Fields{Stage: true, Key: true, OrderKey: true}
	if m, err := msgjson.Parse(text, producer); err != nil || m.OrderKey != "acct-9" || m.Key != "" {
		t.Errorf("with OrderKey: %+v, %v; want order key acct-9 (and no idempotency key)", m, err)
	}
	most := strings.Repeat("k", msgjson.OrderKeyMax)
	if m, err := msgjson.Parse([]byte(`{"payload":"x","order_key":"`+most+`"}`), producer); err != nil || m.OrderKey != most {
		t.Errorf("a key of OrderKeyMax bytes: %v; want it taken", err)
	}
	for text, want := range map[string]string{
		`{"payload":"x","order_key":""}`:              "order_key is empty",
		`{"payload":"x","order_key":"` + most + `k"}`: "order_key is 201 bytes long, at most 200",
		`{"payload":"x","order_key":"a\u0000"}`:       `order_key holds \u0000`,
		`{"payload":"x","order_key":7}`:               "order_key: want a string",
	} {
		if _, err := msgjson.Parse([]byte(text), producer); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.60s: %v; want an error saying %q", text, err, want)
		}
	}
	line := `{"id":42,"stage":"parse","attempts":0,"order_key":"` + most + most + `","state":{},"payload":"x"}`
	if m, err := msgjson.Parse([]byte(line), msgjson.Fields{Line: true, Stage: true}); err != nil || m.OrderKey != most+most {
		t.Errorf("a line with a long order key: %v; want the row's key, whatever its length", err)
	}
}

func TestLimitRefusesDeepNestingOnly(t *testing.T) {
	nest := func(n int) []byte {
		return []byte(`{"payload": ` + strings.Repeat("[", n) + strings.Repeat("]", n) + `, "state": {"s": "[[[[{{{{"}}`)
	}
	// The object itself is one level: 63 arrays inside make 64.
	if _, err := msgjson.Parse(nest(63), msgjson.Fields{Limit: true}); err != nil {
		t.Errorf("64 deep: %v; want it accepted (brackets inside strings do not count)", err)
	}
	if _, err := msgjson.Parse(nest(64), msgjson.Fields{Limit: true}); err == nil || !strings.Contains(err.Error(), "nested more than 64 deep") {
		t.Errorf("65 deep: %v; want it refused", err)
	}
	if _, err := msgjson.Parse(nest(200), msgjson.Fields{}); err != nil {
		t.Errorf("without Limit: %v; want any depth the decoder takes", err)
	}
}

// Proves: Fields.Line reads the line pepsi-dispatch hands a message-mode
// stage: id required and positive, attempts, stage, and a payload that may be
// absent (NULL) but, when an empty string, is empty and not NULL; without
// Line, id and attempts are unknown fields.
func TestLineReadsTheDispatchersInputLine(t *testing.T) {
	line := msgjson.Fields{Line: true, Stage: true}
	m, err := msgjson.Parse([]byte(`{"id":42,"stage":"parse","attempts":2,"state":{"k":1},"payload":"a\nb"}`), line)
	if err != nil || m.ID != 42 || m.Stage != "parse" || m.Attempts != 2 || string(m.State) != `{"k":1}` || string(m.Payload) != "a\nb" {
		t.Errorf("a whole line: %+v, %v", m, err)
	}
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if m, err := msgjson.Parse([]byte(`{"id":9,"order_key":"acct-9","parent_id":3,"traceparent":"`+tp+`"}`), line); err != nil || m.OrderKey != "acct-9" || m.ParentID != 3 || m.TraceParent != tp {
		t.Errorf("a line with its order key, parent and trace: %+v, %v", m, err)
	}
	if m, err := msgjson.Parse([]byte(`{"id":7}`), line); err != nil || m.Payload != nil || m.Attempts != 0 {
		t.Errorf("no payload: %+v, %v; want a NULL payload", m, err)
	}
	if m, err := msgjson.Parse([]byte(`{"id":7,"payload":""}`), line); err != nil || m.Payload == nil || len(m.Payload) != 0 {
		t.Errorf("an empty payload: %+v, %v; want empty, not NULL", m, err)
	}
	if m, err := msgjson.Parse([]byte(`{"id":7,"payload_base64":"/w=="}`), line); err != nil || string(m.Payload) != "\xff" {
		t.Errorf("payload_base64: %+v, %v", m, err)
	}
	for text, want := range map[string]string{
		`{"payload":"x"}`:                 `no positive "id"`,
		`{"id":0,"payload":"x"}`:          `no positive "id"`,
		`{"id":"1"}`:                      "id: want a int64",
		`{"id":1,"attempts":-1}`:          "attempts is negative",
		`{"id":1,"key":"k"}`:              `unknown field "key" (want id, stage, attempts, order_key, parent_id, traceparent, state, and payload or payload_base64)`,
		`{"id":1,"parent_id":0}`:          "parent_id is not a message id",
		`{"id":1,"payload":"x","p":1}`:    `unknown field "p"`,
		`{"id":1,"state":[1]}`:            "is not a JSON object",
		`{"id":1,"payload":"x"} {"id":2}`: "more than one JSON value",
		`{"id":1,"payload":"x"}}`:         `"}" after the JSON object`,
		`{"id":1,"payload":"x"} ]`:        `"]" after the JSON object`,
	} {
		if _, err := msgjson.Parse([]byte(text), line); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error saying %q", text, err, want)
		}
	}
	for _, text := range []string{`{"id":1,"payload":"x"}`, `{"attempts":1,"payload":"x"}`, `{"parent_id":1,"payload":"x"}`} {
		if _, err := msgjson.Parse([]byte(text), msgjson.Fields{}); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%s without Line: %v; want an unknown field", text, err)
		}
	}
}

// Proves: not_before is read with its offset, and a time finer than the
// microsecond PostgreSQL keeps is rounded up, so the message is never due
// before it; a time without an offset is refused.
func TestNotBeforeIsReadWithItsOffsetAndRoundedUpToAMicrosecond(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"2026-12-24T18:00:00Z", "2026-12-24T18:00:00Z"},
		{"2026-12-24T19:00:00.5+01:00", "2026-12-24T18:00:00.5Z"},
		{"2026-12-24T18:00:00.0000001Z", "2026-12-24T18:00:00.000001Z"},
		{"2026-12-24T18:00:00.000001999Z", "2026-12-24T18:00:00.000002Z"},
		{"2026-12-24t18:00:00z", "2026-12-24T18:00:00Z"}, // RFC 3339 5.6: "t" and "z" may be lower case
	} {
		got, err := msgjson.CheckNotBefore(tc.text)
		if err != nil || got.UTC().Format(time.RFC3339Nano) != tc.want {
			t.Errorf("CheckNotBefore(%q) = %v, %v; want %s", tc.text, got.UTC().Format(time.RFC3339Nano), err, tc.want)
		}
	}
	if _, err := msgjson.CheckNotBefore("2026-12-24T18:00:00"); err == nil {
		t.Errorf("CheckNotBefore of a time without an offset: no error")
	}
	for text, why := range map[string]string{
		"9999-12-31T23:59:59.9999999Z": "out of range", // rounds into 10000
		"9999-12-31T23:00:00-01:00":    "out of range", // 10000 in UTC
		"2026-12-24T18:00:00+24:00":    "offset of 24 hours",
	} {
		if _, err := msgjson.CheckNotBefore(text); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("CheckNotBefore(%q) = %v; want an error saying %q", text, err, why)
		}
	}
	if got, err := msgjson.CheckNotBefore("9999-12-31T23:59:59.999999Z"); err != nil || got.Year() != 9999 {
		t.Errorf("the last microsecond of 9999: %v, %v; want it taken", got, err)
	}
}

// Proves: a state is refused here, naming its input line, for what
// PostgreSQL's jsonb would refuse at the INSERT (a number beyond numeric's
// range, a lone surrogate escape), and taken with every number jsonb holds,
// those beyond a float64 included.
func TestStateIsRefusedForWhatJSONBRefusesOnly(t *testing.T) {
	for text, want := range map[string]string{
		`{"payload":"x","state":{"a":1e-20000}}`:         "state holds the number 1e-20000, beyond the range of PostgreSQL's numeric",
		`{"payload":"x","state":{"a":[0e-16384]}}`:       "the number 0e-16384, beyond",
		`{"payload":"x","state":{"a":"\ud83d"}}`:         "state holds a lone UTF-16 surrogate",
		`{"payload":"x","state":{"a":"\u0000"}}`:         `state holds \u0000`,
		`{"payload":"x","state":{"a":1e131072}}`:         "beyond the range",
		`{"payload":"x","state":{"a":1.5e-16383}}`:       "beyond the range",
		"{\"payload\":\"x\",\"state\":{\"a\":\"\xff\"}}": "state holds bytes that are not UTF-8",
	} {
		if _, err := msgjson.Parse([]byte(text), msgjson.Fields{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error saying %q", text, err, want)
		}
	}
	for _, state := range []string{`{"a":1e400}`, `{"a":-1e131071}`, `{"a":1e-16383}`, `{"a":"\ud83d\ude00"}`, `{"a":123456789012345678901234567890}`} {
		m, err := msgjson.Parse([]byte(`{"payload":"x","state":`+state+`}`), msgjson.Fields{})
		if err != nil || string(m.State) != state {
			t.Errorf("state %s: %q, %v; want it taken as written", state, m.State, err)
		}
	}
}

// TestNamesAreExactAndOnceAndAStringPayloadIsUTF8: Go's decoder matches
// member names ignoring case, keeps the last of a name given twice, and
// replaces bytes that are not UTF-8 and lone surrogates with U+FFFD; each
// would change a message silently, so each is refused. A surrogate pair and
// an escaped name are taken.
func TestNamesAreExactAndOnceAndAStringPayloadIsUTF8(t *testing.T) {
	all := msgjson.Fields{Stage: true, Key: true, OrderKey: true}
	for text, why := range map[string]string{
		`{"PAYLOAD":"ab","Stage":"enrich"}`:   `unknown field "PAYLOAD" (want payload or payload_base64, and optionally stage, state, key and order_key; names are matched exactly)`,
		`{"payload":"a","Order_Key":"k"}`:     `unknown field "Order_Key"`,
		`{"payload":"a","payload":"b"}`:       `field "payload" given twice`,
		`{"key":"a","key":"b","payload":"x"}`: `field "key" given twice`,
		"{\"payload\":\"\xff\"}":              "payload: bytes that are not UTF-8",
		`{"payload":"\ud800"}`:                "payload: a lone UTF-16 surrogate",
		`{"payload":"\udc00 x"}`:              "payload: a lone UTF-16 surrogate",
	} {
		if _, err := msgjson.Parse([]byte(text), all); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("Parse(%s) = %v; want an error saying %q", text, err, why)
		}
	}
	m, err := msgjson.Parse([]byte(`{"pay\u006coad":"\ud83d\ude00 \u00e9","stage":"s"}`), all)
	if err != nil || string(m.Payload) != "\U0001F600 \u00e9" || m.Stage != "s" {
		t.Errorf("a surrogate pair under an escaped name = %q, %v; want the emoji and é", m.Payload, err)
	}
}

// Proves: a member of the wrong type is named as the producer wrote it,
// whichever Go struct reads it. Go names it by its path through the
// structs embedded in the one decoded, and the members a line shares with
// a producer's message live in one of those: an order_key that was a
// number was answered "lineFields.order_key: want a string".
func TestAMemberOfTheWrongTypeIsNamedAsWritten(t *testing.T) {
	producer := msgjson.Fields{Stage: true, Key: true, OrderKey: true, TraceParent: true, NotBefore: true}
	for text, want := range map[string]string{
		`{"payload":"x","order_key":7}`:    "order_key: want a string, got a JSON number",
		`{"payload_base64":7}`:             "payload_base64: want a string, got a JSON number",
		`{"payload":"x","traceparent":[]}`: "traceparent: want a string, got a JSON array",
		`{"payload":"x","key":7}`:          "key: want a string, got a JSON number",
	} {
		if _, err := msgjson.Parse([]byte(text), producer); err == nil || err.Error() != want {
			t.Errorf("%s: %v; want %q", text, err, want)
		}
	}
}
