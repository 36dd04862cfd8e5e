package core_test

import (
	"reflect"
	"strings"
	"testing"

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
	for _, line := range []string{"", "OK", "ok 0", " 0", "+0", "0 tag", "0 tag:x", "0 tag:-1", "0 :5", "0 t@g:5", "0.5", "0x1 bad"} {
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
