package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// TestShowAndHistoryEscapeControlCharacters: an order key, an idempotency
// key and a reason may hold line breaks, tabs and escape sequences (a
// producer's keys, an operator's discard -note). show and history print
// them escaped, one field per line and one event per line, and send the
// terminal no control character: printed as they were, an order key's line
// break made a line of its own (named by the rest of the key), and a key
// holding "\x1b[2J" cleared the operator's screen.
func TestShowAndHistoryEscapeControlCharacters(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	m := &queueadmin.Message{ID: 42, Stage: "deliver", Status: "failed", State: json.RawMessage(`{}`),
		OrderKey: "acct\nstage  forged\x1b[2J", DedupKey: "d\t1\u0085", CreatedAt: now, UpdatedAt: now}
	hist := []queueadmin.HistoryRow{
		{ID: 42, Stage: "deliver", Event: "failed", Detail: "discarded by an operator (pepsi-queue discard): bad\nimport\x1b[1m", At: now},
		{ID: 42, Stage: "deliver", Event: "retried", Detail: "failed at deliver", At: now.Add(time.Second)},
	}
	var b bytes.Buffer
	printMessage(&b, m, now)
	printHistory(&b, hist, now)
	out := b.String()
	for i, r := range out {
		if r != '\n' && unprintable(r) {
			t.Errorf("show and history wrote control character %q at byte %d:\n%s", r, i, out)
			break
		}
	}
	for _, want := range []string{
		"order key  \"acct\\nstage  forged\\x1b[2J\"\n",
		"key        \"d\\t1\\u0085\"\n",
		"failed: discarded by an operator (pepsi-queue discard): bad\\nimport\\x1b[1m\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if lines := strings.Count(out, "\n"); lines != 14 {
		t.Errorf("show and history wrote %d lines; want 14 (9 fields, state, {}, the heading and 2 events):\n%s", lines, out)
	}
}

// TestListKeepsAReasonOnItsRow: list's dispatch_error column folds line
// breaks into spaces and escapes the other control characters.
func TestListKeepsAReasonOnItsRow(t *testing.T) {
	if got, want := oneLine("bad\r\nimport\x1b[1m\x7f"), `bad import\x1b[1m\x7f`; got != want {
		t.Errorf("oneLine = %q; want %q", got, want)
	}
}

// TestPrintableKeyTellsKeysApart: a key printed as it is, and one that needs
// escaping (or looks like a quoted one) quoted, so that no two keys print
// alike.
func TestPrintableKeyTellsKeysApart(t *testing.T) {
	for key, want := range map[string]string{
		"acct-9":        "acct-9",
		"a b é 日本":      "a b é 日本",
		"a\nb":          `"a\nb"`,
		`a\nb`:          `a\nb`,
		`"a\nb"`:        `"\"a\\nb\""`,
		"\x1b[31mred":   `"\x1b[31mred"`,
		"zero\u200bwid": `"zero\u200bwid"`,
	} {
		if got := printableKey(key); got != want {
			t.Errorf("printableKey(%q) = %s; want %s", key, got, want)
		}
	}
}
