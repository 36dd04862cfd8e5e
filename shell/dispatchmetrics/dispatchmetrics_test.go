package dispatchmetrics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
	"github.com/pepsi-pipeline/pepsi/shell/dispatchmetrics"
)

// slowStage holds every message it is given far longer than the test lasts.
const slowStage = "#!/bin/sh\nwhile read id; do sleep 60; done\n"

func TestTheMetricsShowTheWorkersAndMessagesADispatcherHolds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewMigrated(t)
	dir := t.TempDir()
	program := filepath.Join(dir, "slow-stage")
	if err := os.WriteFile(program, []byte(slowStage), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := conf.Parse("pepsi.conf", fmt.Sprintf(`[pepsi-dispatch]
STOP_GRACE = 200ms
[stage-slow]
PROGRAM = %s
PARALLELISM = 2
QUEUE_LIMIT = 3
[stage-idle]
PROGRAM = %s
`, program, program))
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]queueadmin.NewMessage, 20)
	if _, err := queueadmin.Enqueue(ctx, pgtest.Connect(t, url), "slow", msgs); err != nil {
		t.Fatal(err)
	}
	asks := make(chan chan<- core.Snapshot)
	c := dispatchmetrics.NewCollector(asks)
	ln, err := dispatchmetrics.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	go dispatchmetrics.Serve(sctx, ln, c, slog.New(slog.DiscardHandler))
	base := "http://" + ln.Addr().String()

	// No dispatcher loop yet: not active, and nothing else.
	if got := scrape(t, base); !strings.Contains(got, "pepsi_dispatcher_active 0") || strings.Contains(got, "pepsi_dispatcher_workers") {
		t.Errorf("before the dispatcher runs:\n%s\nwant pepsi_dispatcher_active 0 alone", pepsiLines(got))
	}

	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		dispatch.Run(dctx, dispatch.Options{Config: cfg, Database: url, Log: slog.New(slog.DiscardHandler), Snapshots: asks}) //nolint:errcheck // the exit is not what this test checks
	}()
	want := []string{
		"pepsi_dispatcher_active 1",
		`pepsi_dispatcher_workers{stage="slow",state="ready"} 2`,
		`pepsi_dispatcher_workers{stage="slow",state="starting"} 0`,
		`pepsi_dispatcher_messages_in_flight{stage="slow"} 6`,
		`pepsi_dispatcher_stage_capacity_messages{stage="slow"} 6`,
		`pepsi_dispatcher_messages_claimed_waiting{stage="slow"} 0`,
		`pepsi_dispatcher_workers{stage="idle",state="ready"} 0`,
		`pepsi_dispatcher_messages_in_flight{stage="idle"} 0`,
		`pepsi_dispatcher_stage_capacity_messages{stage="idle"} 16`,
		`pepsi_dispatcher_spawn_cooldown_seconds{stage="slow"} 0`,
		"pepsi_dispatcher_database_down 0",
		"pepsi_dispatcher_shutting_down 0",
	}
	var got string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got = scrape(t, base)
		missing := 0
		for _, line := range want {
			if !strings.Contains(got, line+"\n") {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 30 s the metrics did not show:\n%s\ngot:\n%s", strings.Join(want, "\n"), pepsiLines(got))
		}
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	stop()
	<-done
	if got := scrape(t, base); !strings.Contains(got, "pepsi_dispatcher_active 0") {
		t.Errorf("after the dispatcher stopped:\n%s\nwant pepsi_dispatcher_active 0", pepsiLines(got))
	}
}

func scrape(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(body)
}

func pepsiLines(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "pepsi_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
