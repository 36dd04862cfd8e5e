package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/pepsi-pipeline/pepsi/shell/queueadmin"
)

// lineMax bounds one input line (one payload); a longer line is an error rather
// than an unbounded buffer.
const lineMax = 16 << 20

// source yields the messages to enqueue, one per call, and io.EOF at the end.
type source interface {
	next() (queueadmin.NewMessage, error)
}

// synthetic yields n messages "synthetic message I" for I = 1..n.
type synthetic struct{ i, n int }

func (s *synthetic) next() (queueadmin.NewMessage, error) {
	if s.i >= s.n {
		return queueadmin.NewMessage{}, io.EOF
	}
	s.i++
	return queueadmin.NewMessage{Payload: []byte(fmt.Sprintf("synthetic message %d", s.i))}, nil
}

// single yields one message once.
type single struct {
	payload []byte
	done    bool
}

func (s *single) next() (queueadmin.NewMessage, error) {
	if s.done {
		return queueadmin.NewMessage{}, io.EOF
	}
	s.done = true
	return queueadmin.NewMessage{Payload: s.payload}, nil
}

// lines yields one message per non-empty input line, the line without its "\n"
// or "\r\n" as the payload.
type lines struct {
	sc   *bufio.Scanner
	line int
	json bool // each line is an NDJSON object (see ndjsonMessage)
}

func newLines(r io.Reader, ndjson bool) *lines {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), lineMax)
	sc.Split(scanLines)
	return &lines{sc: sc, json: ndjson}
}

// scanLines is bufio.ScanLines except at the end of the input: a last line
// without "\n" keeps a trailing "\r", which is the payload's, since only "\n"
// or "\r\n" end a line (bufio.ScanLines drops it).
func scanLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, bytes.TrimSuffix(data[:i], []byte("\r")), nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

func (l *lines) next() (queueadmin.NewMessage, error) {
	for l.sc.Scan() {
		l.line++
		text := l.sc.Bytes() // scanLines has dropped the "\n" or "\r\n"
		if len(bytes.TrimSpace(text)) == 0 {
			continue
		}
		if !l.json {
			return queueadmin.NewMessage{Payload: bytes.Clone(text)}, nil
		}
		m, err := ndjsonMessage(text)
		if err != nil {
			return m, fmt.Errorf("input line %d: %w", l.line, err)
		}
		return m, nil
	}
	if err := l.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return queueadmin.NewMessage{}, fmt.Errorf("input line %d is longer than %d bytes", l.line+1, lineMax)
		}
		return queueadmin.NewMessage{}, fmt.Errorf("read input: %w", err)
	}
	return queueadmin.NewMessage{}, io.EOF
}

// ndjsonMessage reads one NDJSON object:
//
//	{"payload": "text"}                       the payload is the string's UTF-8 bytes
//	{"payload": {"any": "json"}}              a non-string payload is its JSON text
//	{"payload_base64": "AAEC"}                binary payloads
//	{"payload": "x", "state": {"k": "v"}}     an initial state object
func ndjsonMessage(text []byte) (queueadmin.NewMessage, error) {
	var obj struct {
		Payload       json.RawMessage `json:"payload"`
		PayloadBase64 *string         `json:"payload_base64"`
		State         json.RawMessage `json:"state"`
	}
	d := json.NewDecoder(bytes.NewReader(text))
	d.DisallowUnknownFields()
	if err := d.Decode(&obj); err != nil {
		msg := err.Error()
		if strings.HasPrefix(msg, "json: unknown field") {
			return queueadmin.NewMessage{}, fmt.Errorf("%s (want payload or payload_base64, and optionally state)", strings.TrimPrefix(msg, "json: "))
		}
		return queueadmin.NewMessage{}, fmt.Errorf("not a JSON object: %w", err)
	}
	if d.More() {
		return queueadmin.NewMessage{}, errors.New("more than one JSON value on the line")
	}
	var m queueadmin.NewMessage
	switch {
	case obj.Payload != nil && obj.PayloadBase64 != nil:
		return m, errors.New("both payload and payload_base64 given; want one")
	case obj.PayloadBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*obj.PayloadBase64)
		if err != nil {
			return m, fmt.Errorf("payload_base64: %w", err)
		}
		m.Payload = b
	case len(obj.Payload) > 0 && obj.Payload[0] == '"':
		var s string
		if err := json.Unmarshal(obj.Payload, &s); err != nil {
			return m, fmt.Errorf("payload: %w", err)
		}
		m.Payload = []byte(s)
	case obj.Payload != nil:
		var compact bytes.Buffer
		if err := json.Compact(&compact, obj.Payload); err != nil {
			return m, fmt.Errorf("payload: %w", err)
		}
		m.Payload = compact.Bytes()
	default:
		return m, errors.New("no payload (want payload or payload_base64)")
	}
	if len(obj.State) > 0 && string(obj.State) != "null" {
		if obj.State[0] != '{' {
			return m, fmt.Errorf("state %.40s is not a JSON object", obj.State)
		}
		var state any
		if err := json.Unmarshal(obj.State, &state); err != nil {
			return m, fmt.Errorf("state: %w", err)
		}
		if hasNUL(state) {
			return m, errors.New(`state holds \u0000, which PostgreSQL's jsonb refuses`)
		}
		m.State = obj.State
	}
	return m, nil
}

// hasNUL reports whether a decoded JSON value holds a NUL character in a key or
// a string: PostgreSQL's jsonb refuses "\u0000", and the error is better here,
// naming the input line, than from the INSERT.
func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.IndexByte(v, 0) >= 0
	case []any:
		for _, e := range v {
			if hasNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if strings.IndexByte(k, 0) >= 0 || hasNUL(e) {
				return true
			}
		}
	}
	return false
}
