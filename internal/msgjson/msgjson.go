// Package msgjson reads one message written as a JSON object, the form that
// `pepsi-queue enqueue -ndjson` and pepsi-ingress take:
//
//	{"payload": "text"}                       the payload is the string's UTF-8 bytes
//	{"payload": {"any": "json"}}              a non-string payload is its JSON text
//	{"payload_base64": "AAEC"}                binary payloads
//	{"payload": "x", "state": {"k": "v"}}     an initial state object
//	{"stage": "parse", "key": "order-17"}     where Fields allow: the first stage, an idempotency key
//	{"payload": "x", "order_key": "acct-9"}   where Fields allow: the message's order key
//	{"payload": "x", "traceparent": "00-…"}   where Fields allow: its W3C trace context
//	{"payload": "x", "not_before": "2026-12-24T18:00:00Z"}   where Fields allow: when it is first due
//
// and, with Fields.Line, the standard input line pepsi-dispatch hands an INPUT
// = message stage (docs/protocol.md), which pepsi-stage-check reads from its
// -messages file:
//
//	{"id": 42, "stage": "parse", "attempts": 0, "order_key": "acct-9", "traceparent": "00-…", "state": {…}, "payload": "…"}
//
// It is one parser so that every program agrees on every field. It only parses:
// it never checks that a stage is configured, and never does I/O.
package msgjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pepsi-pipeline/pepsi/core"
)

// KeyMax bounds a key, in bytes: it is stored in a unique btree index, whose
// entries must stay far below a page.
const KeyMax = 256

// OrderKeyMax bounds an order key, in bytes, where a producer gives one
// (Fields.OrderKey): the queue indexes it beside the id in two indexes, and
// an entity's name (an account, a mailbox, a device) fits in far less.
const OrderKeyMax = 200

// DepthMax bounds the nesting of arrays and objects in one message (Fields.Limit
// on): deeper JSON costs the decoder and jsonb stack for nothing a pipeline needs.
const DepthMax = 64

// Message is one parsed message.
type Message struct {
	// Stage is the "stage" field; "" when absent.
	Stage string
	// Key is the "key" field (the queue's dedup_key); "" when absent.
	Key string
	// OrderKey is the "order_key" field (the queue's order_key); "" when
	// absent.
	OrderKey string
	// TraceParent is the "traceparent" field (the queue's traceparent, or
	// a line's: its pass's), checked by CheckTraceParent; "" when absent.
	TraceParent string
	// NotBefore is the "not_before" field, an RFC 3339 time: the message is
	// inserted paused until then (a scheduled message); zero when absent.
	NotBefore time.Time
	// Payload is the message content.
	Payload []byte
	// State is the initial state, a JSON object; nil means {}.
	State json.RawMessage
	// ID, Attempts and ParentID are the "id", "attempts" and "parent_id"
	// fields of a line (Fields.Line); ParentID is 0 when absent.
	ID       int64
	Attempts int
	ParentID int64
}

// Fields says which optional fields a caller takes beyond payload,
// payload_base64 and state; any other field is an error.
type Fields struct {
	// Stage allows "stage", a string.
	Stage bool
	// Key allows "key", a string of 1 to KeyMax bytes of UTF-8 without NUL.
	Key bool
	// OrderKey allows "order_key", a string of 1 to OrderKeyMax bytes of
	// UTF-8 without NUL.
	OrderKey bool
	// TraceParent allows "traceparent", a W3C traceparent
	// (CheckTraceParent).
	TraceParent bool
	// NotBefore allows "not_before", an RFC 3339 time (CheckNotBefore).
	NotBefore bool
	// Limit refuses nesting deeper than DepthMax.
	Limit bool
	// Line reads a message-mode input line: "id" (a positive integer) is
	// required, "attempts" (0 or more), "order_key" (the key of
	// the row, of any length: a producer that is not PEPSI's may have
	// written a longer one) and "traceparent" allowed, and the payload may be absent (a NULL payload,
	// Message.Payload nil). Set Stage too to allow "stage".
	Line bool
	// IgnoreUnknown, with Line, ignores members it does not know, as a
	// stage must (docs/protocol.md: later versions of the dispatcher may
	// add keys to the line). The dispatcher writes each name once and
	// exactly, so neither a name given twice nor one in other letter case
	// is looked for then.
	IgnoreUnknown bool
}

func (f Fields) want() string {
	if f.Line {
		return "want id, stage, attempts, order_key, parent_id, traceparent, state, and payload or payload_base64"
	}
	var opt []string
	if f.Stage {
		opt = append(opt, "stage")
	}
	opt = append(opt, "state")
	if f.Key {
		opt = append(opt, "key")
	}
	if f.OrderKey {
		opt = append(opt, "order_key")
	}
	if f.TraceParent {
		opt = append(opt, "traceparent")
	}
	if f.NotBefore {
		opt = append(opt, "not_before")
	}
	if len(opt) == 1 {
		return "want payload or payload_base64, and optionally state"
	}
	return "want payload or payload_base64, and optionally " + strings.Join(opt[:len(opt)-1], ", ") + " and " + opt[len(opt)-1]
}

// Parse reads one JSON object, text, as a message.
func Parse(text []byte, f Fields) (Message, error) {
	if m, ok := parsePlain(text, f); ok && !f.Line {
		return m, nil
	}
	if f.Limit {
		if d := core.JSONDepth(text); d > DepthMax {
			return Message{}, fmt.Errorf("nested more than %d deep", DepthMax)
		}
	}
	obj, err := decodeObject(text, f)
	if err != nil {
		return Message{}, err
	}
	var m Message
	switch {
	case obj.Stage != nil && !f.Stage:
		return m, fmt.Errorf(`unknown field "stage" (%s)`, f.want())
	case obj.Key != nil && !f.Key:
		return m, fmt.Errorf(`unknown field "key" (%s)`, f.want())
	case obj.OrderKey != nil && !f.OrderKey && !f.Line:
		return m, fmt.Errorf(`unknown field "order_key" (%s)`, f.want())
	case obj.TraceParent != nil && !f.TraceParent && !f.Line:
		return m, fmt.Errorf(`unknown field "traceparent" (%s)`, f.want())
	case obj.NotBefore != nil && !f.NotBefore:
		return m, fmt.Errorf(`unknown field "not_before" (%s)`, f.want())
	}
	if err := m.line(f, obj.ID, obj.Attempts, obj.ParentID); err != nil {
		return m, err
	}
	if obj.Stage != nil {
		if *obj.Stage == "" {
			return m, errors.New("stage is empty")
		}
		m.Stage = *obj.Stage
	}
	if err := m.keys(f, obj.Key, obj.OrderKey, obj.TraceParent); err != nil {
		return m, err
	}
	if obj.NotBefore != nil {
		if m.NotBefore, err = CheckNotBefore(*obj.NotBefore); err != nil {
			return m, err
		}
	}
	if m.Payload, err = payload(obj.Payload, obj.PayloadBase64, f); err != nil {
		return m, err
	}
	m.State, err = state(obj.State)
	return m, err
}

// object is a message's fields as the decoder reads them: nil for absent.
type object struct {
	lineFields
	Stage     *string `json:"stage"`
	Key       *string `json:"key"`
	NotBefore *string `json:"not_before"`
}

// lineFields are the members of object that a message-mode line has
// besides "stage": all a stage reads of it (Fields.IgnoreUnknown).
type lineFields struct {
	OrderKey      *string         `json:"order_key"`
	TraceParent   *string         `json:"traceparent"`
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payload_base64"`
	State         json.RawMessage `json:"state"`
	ID            *int64          `json:"id"`
	Attempts      *int            `json:"attempts"`
	ParentID      *int64          `json:"parent_id"`
}

// decodeObject reads text as one JSON object of known member names, each exactly
// and once (unless f ignores unknown ones), into an object; its errors say
// what is wrong with the text.
func decodeObject(text []byte, f Fields) (object, error) {
	var obj object
	if f.Line && f.IgnoreUnknown {
		return decodeLine(text, f)
	}
	if err := core.MembersError(text, f.want(),
		"stage", "key", "order_key", "traceparent", "not_before", "payload", "payload_base64", "state", "id", "attempts", "parent_id"); err != nil {
		return obj, err
	}
	return obj, decodeJSON(text, &obj, f, true)
}

// decodeLine is decodeObject for Fields.IgnoreUnknown: the line's own
// members only (lineFields, and "stage" when f takes it), so that the
// producer's members, which a later dispatcher may add with values of any
// type, are ignored as unknown ones are.
func decodeLine(text []byte, f Fields) (object, error) {
	var l struct {
		lineFields
		Stage json.RawMessage `json:"stage"`
	}
	if err := decodeJSON(text, &l, f, false); err != nil {
		return object{}, err
	}
	obj := object{lineFields: l.lineFields}
	if f.Stage && len(l.Stage) > 0 && string(l.Stage) != "null" {
		var stage string
		if err := json.Unmarshal(l.Stage, &stage); err != nil {
			return obj, errors.New("stage: want a string")
		}
		obj.Stage = &stage
	}
	return obj, nil
}

// decodeJSON reads text, one JSON object, into v (strict: refusing members
// v has not), with errors that say what is wrong with the text.
func decodeJSON(text []byte, v any, f Fields, strict bool) error {
	d := json.NewDecoder(bytes.NewReader(text))
	if strict {
		d.DisallowUnknownFields()
	}
	if err := d.Decode(v); err != nil {
		msg := err.Error()
		if strings.HasPrefix(msg, "json: unknown field") {
			return fmt.Errorf("%s (%s)", strings.TrimPrefix(msg, "json: "), f.want())
		}
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && ute.Field != "" {
			// Field is the member's Go path, through the structs embedded
			// in v ("lineFields.order_key"): its name is the last part.
			name := ute.Field[strings.LastIndex(ute.Field, ".")+1:]
			return fmt.Errorf("%s: want a %s, got a JSON %s", name, ute.Type, ute.Value)
		}
		if errors.As(err, &ute) {
			// The whole value is not an object: say what it is, never the Go
			// type it was read into (a struct and its internal fields).
			return fmt.Errorf("not a JSON object: got a JSON %s", ute.Value)
		}
		return fmt.Errorf("not a JSON object: %w", err)
	}
	return core.TrailerError(d, text, func(rest []byte) string { return fmt.Sprintf("%q", rest[:min(len(rest), 20)]) })
}

// keys checks and sets the key, order key and traceparent fields (nil for
// absent) of a message read with f.
func (m *Message) keys(f Fields, key, orderKey, traceParent *string) error {
	var err error
	if key != nil {
		if m.Key, err = checkKey("key", *key, KeyMax); err != nil {
			return err
		}
	}
	if orderKey != nil {
		most := OrderKeyMax
		if f.Line {
			most = len(*orderKey)
		}
		if m.OrderKey, err = checkKey("order_key", *orderKey, most); err != nil {
			return err
		}
	}
	if traceParent != nil {
		if err := CheckTraceParent(*traceParent); err != nil {
			return err
		}
		m.TraceParent = *traceParent
	}
	return nil
}

// CheckOrderKey checks an order key a producer gives outside a message's
// JSON (pepsi-queue enqueue -order-key) as Parse checks the field.
func CheckOrderKey(k string) error {
	_, err := checkKey("order_key", k, OrderKeyMax)
	return err
}

// CheckNotBefore reads a scheduled message's not_before, an RFC 3339 time
// with its offset ("2026-12-24T18:00:00Z", "2026-12-24T19:00:00.5+01:00"),
// rounded up to a whole microsecond.
// Its errors name the field and say what is wanted.
func CheckNotBefore(text string) (time.Time, error) {
	// RFC 3339 (5.6) lets "T" and "Z" be lower case; Go's parser does not.
	// Nothing else in such a time has a letter, so upper-casing it changes
	// nothing else.
	t, err := time.Parse(time.RFC3339Nano, strings.ToUpper(text))
	if err != nil {
		return time.Time{}, fmt.Errorf("not_before %s is not an RFC 3339 time: want e.g. 2026-12-24T18:00:00Z", quoteClip(text))
	}
	if _, off := t.Zone(); off <= -24*3600 || off >= 24*3600 {
		// Go's parser takes +24:00; RFC 3339's hours end at 23.
		return time.Time{}, fmt.Errorf("not_before %s has an offset of 24 hours or more", quoteClip(text))
	}
	// PostgreSQL keeps microseconds: a finer time is rounded up, never
	// down, so the message is never due before it. The range is checked
	// after, in UTC, as the time is stored: 9999-12-31T23:59:59.9999999Z
	// rounds into the year 10000.
	if t.Nanosecond()%1000 != 0 {
		t = t.Truncate(time.Microsecond).Add(time.Microsecond)
	}
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return time.Time{}, fmt.Errorf("not_before %s is out of range (years 1 to 9999, in UTC)", quoteClip(text))
	}
	return t, nil
}

// CheckTraceParent checks a W3C traceparent (Trace Context, version 00) as
// the queue's traceparent column holds it: "00-<trace id>-<parent span
// id>-<flags>", 32, 16 and 2 lower-case hex digits, the ids not all zero.
// Its errors name the field and say what is wrong.
func CheckTraceParent(tp string) error {
	const want = "want 00-<32 hex>-<16 hex>-<2 hex>, lower case (W3C Trace Context)"
	if len(tp) != 55 || tp[:3] != "00-" || tp[35] != '-' || tp[52] != '-' {
		return fmt.Errorf("traceparent %s is not a W3C traceparent: %s", quoteClip(tp), want)
	}
	for _, part := range []string{tp[3:35], tp[36:52], tp[53:]} {
		for i := 0; i < len(part); i++ {
			if c := part[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return fmt.Errorf("traceparent %s holds %q, not lower-case hex: %s", quoteClip(tp), c, want)
			}
		}
	}
	if strings.Trim(tp[3:35], "0") == "" {
		return fmt.Errorf("traceparent %s has an all-zero trace id, which W3C Trace Context makes invalid", quoteClip(tp))
	}
	if strings.Trim(tp[36:52], "0") == "" {
		return fmt.Errorf("traceparent %s has an all-zero parent id, which W3C Trace Context makes invalid", quoteClip(tp))
	}
	return nil
}

// quoteClip quotes s for an error, clipped to 80 bytes.
func quoteClip(s string) string {
	if len(s) > 80 {
		return fmt.Sprintf("%q…", s[:80])
	}
	return fmt.Sprintf("%q", s)
}

// checkKey checks the value k of a key field called name: 1 to most bytes of
// UTF-8 without NUL (PostgreSQL's text cannot hold one).
func checkKey(name, k string, most int) (string, error) {
	switch {
	case k == "":
		return "", fmt.Errorf("%s is empty; leave it out for a message without one", name)
	case len(k) > most:
		return "", fmt.Errorf("%s is %d bytes long, at most %d", name, len(k), most)
	case strings.IndexByte(k, 0) >= 0 || !utf8.ValidString(k) || strings.ContainsRune(k, utf8.RuneError):
		return "", fmt.Errorf(`%s holds \u0000 or invalid UTF-8`, name)
	}
	return k, nil
}

// state checks the state field: absent or null (nil), or a JSON object
// jsonb takes (core.JSONBRefuses: a refusal names the input line here, where
// the INSERT's would not). The line's decoder has already found it valid
// JSON; its text is kept as written, so jsonb gets numbers a float64 cannot
// hold (1e400).
func state(text json.RawMessage) (json.RawMessage, error) {
	if len(text) == 0 || string(text) == "null" {
		return nil, nil
	}
	if text[0] != '{' {
		return nil, fmt.Errorf("state %.40s is not a JSON object", text)
	}
	if why := core.JSONBRefuses(string(text)); why != "" {
		return nil, fmt.Errorf("state holds %s, which PostgreSQL's jsonb refuses", why)
	}
	return text, nil
}

// line checks and takes the fields only a line has (Fields.Line).
func (m *Message) line(f Fields, id *int64, attempts *int, parentID *int64) error {
	switch {
	case !f.Line && id != nil:
		return fmt.Errorf(`unknown field "id" (%s)`, f.want())
	case !f.Line && attempts != nil:
		return fmt.Errorf(`unknown field "attempts" (%s)`, f.want())
	case !f.Line && parentID != nil:
		return fmt.Errorf(`unknown field "parent_id" (%s)`, f.want())
	case !f.Line:
		return nil
	case id == nil || *id <= 0:
		return errors.New(`no positive "id"`)
	case attempts != nil && *attempts < 0:
		return errors.New("attempts is negative")
	case parentID != nil && *parentID <= 0:
		return errors.New("parent_id is not a message id")
	}
	m.ID = *id
	if attempts != nil {
		m.Attempts = *attempts
	}
	if parentID != nil {
		m.ParentID = *parentID
	}
	return nil
}

// payload decodes the payload from the payload or payload_base64 field (at
// most one of them): a JSON string is its UTF-8 bytes, any other JSON value
// its compact text. Neither is an error, except in a line (Fields.Line),
// where it is a NULL payload: nil.
func payload(text json.RawMessage, base64Text *string, f Fields) ([]byte, error) {
	if text == nil && base64Text == nil && f.Line {
		return nil, nil
	}
	return core.Payload(text, base64Text)
}

// parsePlain reads the common shape of a message without reflection: one
// object whose members are "stage", "key", "order_key", "traceparent" and "payload", each at
// most once, each a string of printable ASCII without escapes, payload
// present and stage and keys valid. It says false for anything else, which the decoder
// then reads (and refuses with its reasons): it takes a subset of what the
// decoder takes and answers the same message for it (FuzzPlainAgrees).
// pepsi-ingress reads one message per request, so the decoder's reflection
// and allocations were a tenth of its CPU per request.
func parsePlain(text []byte, f Fields) (Message, bool) {
	var m Message
	var stage, key, orderKey, traceParent, payload []byte
	i := skipSpace(text, 0)
	if i == len(text) || text[i] != '{' {
		return m, false
	}
	i = skipSpace(text, i+1)
	for {
		name, next, ok := plainString(text, i)
		if !ok {
			return m, false
		}
		i = skipSpace(text, next)
		if i == len(text) || text[i] != ':' {
			return m, false
		}
		value, next, ok := plainString(text, skipSpace(text, i+1))
		if !ok {
			return m, false
		}
		switch {
		case string(name) == "payload" && payload == nil:
			payload = value
		case string(name) == "stage" && f.Stage && stage == nil && len(value) > 0:
			stage = value
		case string(name) == "key" && f.Key && key == nil && len(value) > 0 && len(value) <= KeyMax:
			key = value
		case string(name) == "order_key" && f.OrderKey && orderKey == nil && len(value) > 0 && len(value) <= OrderKeyMax:
			orderKey = value
		case string(name) == "traceparent" && f.TraceParent && traceParent == nil && CheckTraceParent(string(value)) == nil:
			traceParent = value
		default:
			return m, false
		}
		i = skipSpace(text, next)
		if i == len(text) {
			return m, false
		}
		if text[i] == '}' {
			break
		}
		if text[i] != ',' {
			return m, false
		}
		i = skipSpace(text, i+1)
	}
	if skipSpace(text, i+1) != len(text) || payload == nil {
		return m, false
	}
	m.Payload = append(make([]byte, 0, len(payload)), payload...)
	if stage != nil {
		m.Stage = string(stage)
	}
	if key != nil {
		m.Key = string(key)
	}
	if traceParent != nil {
		m.TraceParent = string(traceParent)
	}
	if orderKey != nil {
		m.OrderKey = string(orderKey)
	}
	return m, true
}

// plainString reads a JSON string at text[i:] made only of printable ASCII
// without escapes; it returns its content (non-nil, a slice of text) and the
// index after it, or false.
func plainString(text []byte, i int) ([]byte, int, bool) {
	if i >= len(text) || text[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(text); j++ {
		switch c := text[j]; {
		case c == '"':
			return text[i+1 : j : j], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// skipSpace is the index of the first byte at or after i that is not JSON
// white space.
func skipSpace(text []byte, i int) int {
	for i < len(text) && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r') {
		i++
	}
	return i
}
