package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// A stage that cannot start says when it tries next, by the server's clock:
// in whole seconds, "under a second" (not "0s") when it is that close, and
// "when a message waits" once the cooldown is over (nothing to start for).
func TestHealthSaysWhenAStageTriesNext(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for until, want := range map[time.Duration]string{
		12*time.Second + 300*time.Millisecond: "; next try in 12s",
		400 * time.Millisecond:                "; next try in under a second",
		-time.Second:                          "; next try when a message waits",
	} {
		var out bytes.Buffer
		printHealth(&out, queueadmin.Health{Current: true, Now: now, Stages: []queueadmin.StageHealth{
			{Stage: "parse", State: core.HealthCannotStart, Reason: "cannot start: boom", Since: now.Add(-time.Minute), Until: now.Add(until)},
		}})
		if !strings.Contains(out.String(), "cannot start: boom"+want+"\n") || !strings.Contains(out.String(), "1m0s ago") {
			t.Errorf("until now%+v: %q, want the reason then %q, since 1m0s ago", until, out.String(), want)
		}
	}
}
