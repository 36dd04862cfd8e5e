package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pepsi-pipeline/pepsi/core"
)

// FuzzLines reads arbitrary input as enqueue's line input and checks it against
// the documented rule, written here independently: a line ends at "\n", one
// "\r" just before that "\n" belongs to the line end, every other byte belongs
// to the payload, and lines of only white space are skipped.
func FuzzLines(f *testing.F) {
	for _, s := range []string{"a\r\n\n  \nb b\nlast", "a\r\r\nb\r\n", "x\r", "\r", "\n\n", "é\x00\xff\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		var want []string
		rest := input
		for len(rest) > 0 {
			line, after, found := bytes.Cut(rest, []byte("\n"))
			if found {
				line = bytes.TrimSuffix(line, []byte("\r"))
			}
			if len(bytes.TrimSpace(line)) > 0 {
				want = append(want, string(line))
			}
			rest = after
		}
		got, err := readAll(newLines(bytes.NewReader(input), false))
		if err != nil {
			t.Fatalf("line input %q: %v", input, err)
		}
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
			t.Fatalf("line input %q:\ngot payloads  %q\nwant payloads %q", input, got, want)
		}
	})
}

// FuzzNDJSON reads arbitrary input as enqueue's NDJSON input. Whatever it is:
// an error names the input line it is about (a line that exists and is not
// blank), and an accepted message's state is absent or one JSON object that
// PostgreSQL's jsonb accepts (no \u0000 in any string).
func FuzzNDJSON(f *testing.F) {
	for _, s := range []string{
		`{"payload": "héllo\n"}`, `{"payload": {"b": [1, 2], "a": "x"}}`, `{"payload_base64": "AAH/"}`,
		`{"payload": "x", "state": {"source": "import"}}`, `{"payload": "x", "state": null}`,
		"{\"payload\":\"a\"}\n\n{oops}\n", `{"payload": "a"} {"payload": "b"}`, `{"payload": 1, "state": {"k": "\u0000"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		lines := bytes.Split(input, []byte("\n"))
		src := newLines(bytes.NewReader(input), true)
		for {
			m, err := src.next()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				var n int
				if _, serr := fmt.Sscanf(err.Error(), "input line %d:", &n); serr != nil || n < 1 || n > len(lines) || len(bytes.TrimSpace(lines[n-1])) == 0 {
					t.Fatalf("input %q: error %q does not name a non-blank input line", input, err)
				}
				return // enqueue stops at the first bad line
			}
			if m.Payload == nil {
				t.Fatalf("input %q: accepted a message with no payload", input)
			}
			if m.State != nil {
				var obj map[string]any
				if json.Unmarshal(m.State, &obj) != nil || obj == nil {
					t.Fatalf("input %q: state %q is not a JSON object", input, m.State)
				}
				if why := core.JSONBRefuses(string(m.State)); why != "" {
					t.Fatalf("input %q: state %q holds %s, which jsonb refuses", input, m.State, why)
				}
			}
		}
	})
}

// FuzzNDJSONRoundTrip writes a payload and a state as NDJSON, the ways the
// manual documents, and checks enqueue reads back exactly what was written.
func FuzzNDJSONRoundTrip(f *testing.F) {
	f.Add([]byte("héllo\n"), "source", "import")
	f.Add([]byte("\x00\x01\xff"), "", "")
	f.Add([]byte(`{"a":1}`), "k", "\x00")
	f.Fuzz(func(t *testing.T, payload []byte, key, value string) {
		var state []byte
		if key != "" {
			state, _ = json.Marshal(map[string]string{key: value})
		}
		encodings := []map[string]any{{"payload_base64": base64.StdEncoding.EncodeToString(payload)}}
		if utf8.Valid(payload) {
			encodings = append(encodings, map[string]any{"payload": string(payload)})
		}
		for _, e := range encodings {
			if state != nil {
				e["state"] = json.RawMessage(state)
			}
			line, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			m, err := ndjsonMessage(line)
			if state != nil && (strings.ContainsRune(key+value, 0) || !utf8.ValidString(key+value)) {
				// \u0000 must be refused (jsonb would); invalid UTF-8 was
				// replaced by json.Marshal, so only check it parses.
				if strings.ContainsRune(key+value, 0) && err == nil {
					t.Fatalf("%s: accepted a state holding \\u0000", line)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			if !bytes.Equal(m.Payload, payload) {
				t.Fatalf("%s: payload %q, want %q", line, m.Payload, payload)
			}
			if !bytes.Equal(m.State, state) {
				t.Fatalf("%s: state %q, want %q", line, m.State, state)
			}
		}
	})
}

// readAll reads every payload of src.
func readAll(src *lines) ([]string, error) {
	var got []string
	for {
		m, err := src.next()
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, string(m.Payload))
	}
}
