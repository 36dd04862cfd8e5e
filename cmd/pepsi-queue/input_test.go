package main

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

func TestNDJSONLinesBecomePayloadsAndStates(t *testing.T) {
	t.Parallel()
	cases := []struct {
		line, payload, state, err string
	}{
		{line: `{"payload": "héllo\n"}`, payload: "héllo\n"},
		{line: `{"payload": {"b": [1, 2], "a": "x"}}`, payload: `{"b":[1,2],"a":"x"}`},
		{line: `{"payload_base64": "AAH/"}`, payload: "\x00\x01\xff"},
		{line: `{"payload": "x", "state": {"source": "import"}}`, payload: "x", state: `{"source": "import"}`},
		{line: `{"payload": "x", "state": null}`, payload: "x"},
		{line: `{"payload": "x", "stage": "parse"}`, err: `unknown field "stage" (want payload or payload_base64, and optionally state, order_key, traceparent and not_before)`},
		{line: `{"state": {}}`, err: "no payload"},
		{line: `{"payload": "x", "payload_base64": "AA=="}`, err: "both payload and payload_base64"},
		{line: `{"payload": "x", "state": [1]}`, err: "not a JSON object"},
		{line: `{"payload_base64": "%%"}`, err: "payload_base64"},
		{line: `"just a string"`, err: "not a JSON object"},
		{line: `{"payload": "a"} {"payload": "b"}`, err: "more than one JSON value"},
	}
	for _, c := range cases {
		m, err := ndjsonMessage([]byte(c.line))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err = %v, want one containing %q", c.line, err, c.err)
			}
			continue
		}
		if err != nil || string(m.Payload) != c.payload || string(m.State) != c.state {
			t.Errorf("%s: got payload %q state %q err %v; want payload %q state %q", c.line, m.Payload, m.State, err, c.payload, c.state)
		}
	}
}

// Blank lines are skipped. The line end is one "\n" or "\r\n": a carriage
// return before it belongs to the payload (bufio.ScanLines already drops the
// one of "\r\n").
func TestLinesSkipBlankLinesAndStripOnlyTheLineEnd(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		input string
		want  []string
	}{
		{"a\r\n\n  \nb b\nlast", []string{"a", "b b", "last"}},
		{"a\r\r\nb\r\n", []string{"a\r", "b"}},
	} {
		if got := payloads(t, newLines(strings.NewReader(c.input), false)); !slices.Equal(got, c.want) {
			t.Errorf("payloads of %q = %q, want %q", c.input, got, c.want)
		}
	}
}

func TestNDJSONErrorNamesTheInputLine(t *testing.T) {
	t.Parallel()
	src := newLines(strings.NewReader("{\"payload\":\"a\"}\n\n{oops}\n"), true)
	if _, err := src.next(); err != nil {
		t.Fatal(err)
	}
	if _, err := src.next(); err == nil || !strings.HasPrefix(err.Error(), "input line 3:") {
		t.Errorf("error = %v, want it to name input line 3", err)
	}
}

func TestParseAgeAcceptsDurationsAndDays(t *testing.T) {
	t.Parallel()
	good := map[string]time.Duration{"24h": 24 * time.Hour, "90m": 90 * time.Minute, "7d": 7 * 24 * time.Hour, "1h30m": 90 * time.Minute}
	for s, want := range good {
		if got, err := parseAge(s); err != nil || got != want {
			t.Errorf("parseAge(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "7", "-1h", "0d", "xd", "1w"} {
		if got, err := parseAge(s); err == nil {
			t.Errorf("parseAge(%q) = %v, want an error", s, got)
		}
	}
}

// payloads reads every message of src and returns their payloads as text.
func payloads(t *testing.T, src *lines) []string {
	t.Helper()
	var got []string
	for {
		m, err := src.next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(m.Payload))
	}
}

// TestBatchesEndAtTheirCountOrTheirBytes: enqueue's batches end at -batch
// messages or once they hold the byte bound, whichever comes first, so a
// batch of large messages never grows past what one statement may carry.
func TestBatchesEndAtTheirCountOrTheirBytes(t *testing.T) {
	t.Parallel()
	in := strings.Repeat("a\n", 2) + strings.Repeat(strings.Repeat("x", 400)+"\n", 5) + "b\n"
	var sizes []int
	var payloads []string
	err := inBatches(newLines(strings.NewReader(in), false), 4, 1000, func(msgs []queueadmin.NewMessage) error {
		sizes = append(sizes, len(msgs))
		for _, m := range msgs {
			payloads = append(payloads, string(m.Payload[:1]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// 2 of "a" and 2 of 400 bytes (the count); 3 of 400 (1,200 bytes, past
	// the bound before the count); "b" at the end.
	if want := []int{4, 3, 1}; !slices.Equal(sizes, want) {
		t.Errorf("batch sizes %v, want %v", sizes, want)
	}
	if got, want := strings.Join(payloads, ""), "aaxxxxxb"; got != want {
		t.Errorf("messages in order %q, want %q", got, want)
	}
}

// TestALineOfExactlyTheLimitIsAPayload: a line of lineMax bytes is a
// payload, with "\n", "\r\n" or at the end of the input; one byte more is
// an error naming the line.
func TestALineOfExactlyTheLimitIsAPayload(t *testing.T) {
	t.Parallel()
	full := strings.Repeat("y", lineMax)
	for _, in := range []string{full + "\n", full + "\r\n", full, "a\n" + full} {
		l := newLines(strings.NewReader(in), false)
		var got []int
		for {
			m, err := l.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("input of %d bytes: %v", len(in), err)
			}
			got = append(got, len(m.Payload))
		}
		if got[len(got)-1] != lineMax {
			t.Errorf("input of %d bytes: payload sizes %v, want the last %d", len(in), got, lineMax)
		}
	}
	for _, in := range []string{full + "y\n", full + "y"} {
		_, err := newLines(strings.NewReader(in), false).next()
		if err == nil || !strings.Contains(err.Error(), "input line 1 is longer than 16777216 bytes") {
			t.Errorf("input of %d bytes: err %v, want line 1 too long", len(in), err)
		}
	}
}
