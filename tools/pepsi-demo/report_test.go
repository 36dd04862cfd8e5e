package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

func stats(done, failed, timeout, pending int64) *queueadmin.Stats {
	return &queueadmin.Stats{Depth: []queueadmin.Depth{
		{Stage: "deliver", Status: "done", Count: done},
		{Stage: "parse", Status: "failed", Count: failed},
		{Stage: "deliver", Status: "timeout", Count: timeout},
		{Stage: "enrich", Status: "pending", Count: pending},
	}}
}

// frames returns the bar's renders in out, each of which a terminal shows in
// turn: the texts between carriage returns that draw a bar.
func frames(out string) []string {
	var fs []string
	for _, f := range strings.FieldsFunc(out, func(r rune) bool { return r == '\r' || r == '\n' }) {
		if strings.Contains(f, "%") {
			fs = append(fs, strings.TrimSpace(f))
		}
	}
	return fs
}

func TestTheProgressBarsCountAgreesWithItsText(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	p := newProgress(&out, 500, true)
	// Polls come faster than any throttle: each must show its own count.
	for _, s := range []struct{ done, failed, timeout, pending int64 }{
		{100, 10, 0, 390},
		{200, 10, 5, 285},
		{480, 15, 5, 0},
	} {
		finished := s.done + s.failed + s.timeout
		out.Reset()
		p.show(stats(s.done, s.failed, s.timeout, s.pending), finished, time.Second)
		count := fmt.Sprintf("(%d/500", finished)
		text := fmt.Sprintf("done %d, failed %d", s.done, s.failed)
		if s.timeout > 0 {
			text += fmt.Sprintf(", timeout %d", s.timeout)
		}
		// Every frame, not just the last: the terminal shows each in turn.
		shown := frames(out.String())
		if len(shown) == 0 {
			t.Errorf("a poll with %d finished drew nothing", finished)
		}
		for _, f := range shown {
			if !strings.Contains(f, count) || !strings.Contains(f, text) {
				t.Errorf("a poll with %d finished drew %q; want %s and %q", finished, f, count, text)
			}
		}
	}
	p.finish()
}
