package httpd_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/core/conf"
	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
	"github.com/pepsi-pipeline/pepsi/shell/dispatch"
)

// A real dispatcher runs a stage whose PROGRAM is missing beside one that
// works. Within a cooldown pepsi-httpd exports pepsi_stage_health 1 for
// cannot_start at that stage (ok at the other); the stage's oldest pending
// age grows with the clock through the failed starts; the page shows the
// stage red with the reason and the lock badge says so; and the example
// rules, fed the scraped series, fire PepsiStageUnhealthy in promtool.
func TestAStageWhoseProgramIsMissingShowsRedAndFiresTheAlert(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-such-program")
	cfgFile := filepath.Join(dir, "pepsi.conf")
	text := fmt.Sprintf("[pepsi]\nDATABASE = %s\n[stage-parse]\nPROGRAM = %s\n[stage-deliver]\nPROGRAM = /bin/cat\n", url, missing)
	cfg, err := conf.Parse(cfgFile, text)
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, url)
	// The rows' age counts from their insert, somewhere between these two.
	enqueuing := time.Now()
	if _, err := queueadmin.Enqueue(ctx, conn, "parse", make([]queueadmin.NewMessage, 3)); err != nil {
		t.Fatal(err)
	}
	enqueued := time.Now()
	src := open(t, httpd.Options{Database: url, CacheMaxAge: time.Millisecond, SampleInterval: 200 * time.Millisecond,
		Stages: []string{"parse", "deliver"}})
	sctx, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	go src.Sample(sctx)
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()

	dctx, stop := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _ := dispatch.Run(dctx, dispatch.Options{Config: cfg, Database: url, Log: slog.New(slog.DiscardHandler)})
		done <- code
	}()
	defer func() {
		stop()
		<-done
	}()

	health := func(m map[string]float64, stage string, state core.HealthState) float64 {
		return m[fmt.Sprintf("pepsi_stage_health{stage=%s,state=%s}", stage, state)]
	}
	var got map[string]float64
	deadline := time.Now().Add(2 * core.CooldownMin)
	for {
		got = values(scrape(t, srv.URL))
		if health(got, "parse", core.HealthCannotStart) == 1 && health(got, "deliver", core.HealthOK) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within a cooldown (%s), no pepsi_stage_health 1 for parse cannot_start and deliver ok: %v", 2*core.CooldownMin, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if health(got, "parse", core.HealthOK) != 0 || health(got, "parse", core.HealthCrashing) != 0 {
		t.Errorf("parse's other states: ok %v crashing %v, want 0", health(got, "parse", core.HealthOK), health(got, "parse", core.HealthCrashing))
	}
	// Past the second failed start (the cooldown doubles: 1 s, then 2 s),
	// which claimed the messages and gave them back, the age still counts
	// from the enqueue. (A scrape may fall in the moment a failed start holds
	// them running, with none pending: it is taken again.)
	time.Sleep(3500 * time.Millisecond)
	deadline = time.Now().Add(5 * time.Second)
	for {
		got = values(scrape(t, srv.URL))
		age := got["pepsi_queue_oldest_pending_age_seconds{stage=parse}"]
		since, sinceStart := time.Since(enqueued).Seconds(), time.Since(enqueuing).Seconds()
		if age > since-1 && age <= sinceStart {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("parse's oldest pending age is %.2fs, %.2f–%.2fs after the enqueue and 3 failed starts: want it to count from the enqueue", age, since, sinceStart)
		}
		time.Sleep(50 * time.Millisecond)
	}

	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatalf("load the page: %v", err)
	}
	red := `document.querySelector('#stages tr.unhealthy[data-stage="parse"] td[data-key="health"]')?.textContent === "cannot start" && ` +
		`document.querySelector('#stages tr.health-reason[data-stage="parse"]')?.textContent.includes(` + jsString(missing) + `) && ` +
		`document.querySelector('#stages tr[data-stage="deliver"] td[data-key="health"]')?.textContent === "ok" && ` +
		`!document.querySelector('#stages tr.unhealthy[data-stage="deliver"]') && ` +
		`document.getElementById("lock").textContent === "dispatcher running; stage parse cannot start" && ` +
		`document.getElementById("lock").classList.contains("bad")`
	if _, err := chromedp.Run(b, chromedp.Poll[bool](red, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Errorf("the page does not show stage parse red with its reason (%v): lock %q, reason %q", err,
			mustText(t, b, "#lock"), mustText(t, b, "#stages tbody"))
	}
	if color, err := chromedp.Run(b, chromedp.Evaluate[string](
		`getComputedStyle(document.querySelector('#stages tr.unhealthy[data-stage="parse"] td')).backgroundColor`)); err != nil || color != "rgb(254, 226, 226)" {
		t.Errorf("stage parse's row: background %q (%v), want red", color, err)
	}
	if shot, err := chromedp.Run(b, chromedp.FullScreenshot(100)); err != nil {
		t.Errorf("screenshot: %v", err)
	} else if err := os.WriteFile(filepath.Join(t.ArtifactDir(), "status-page-cannot-start.png"), shot, 0o644); err != nil {
		t.Error(err)
	}

	// The rules as an operator deploys them, on the series as scraped.
	var series strings.Builder
	for _, state := range []core.HealthState{core.HealthOK, core.HealthCannotStart, core.HealthCrashing, core.HealthPressureHeld, core.HealthRateHeld} {
		for _, stage := range []string{"parse", "deliver"} {
			fmt.Fprintf(&series, "      - series: 'pepsi_stage_health{stage=%q,state=%q}'\n        values: '%gx10'\n", stage, state, health(got, stage, state))
		}
	}
	test := fmt.Sprintf(`rule_files:
  - %s
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
%s    alert_rule_test:
      - eval_time: 75s
        alertname: PepsiStageUnhealthy
        exp_alerts:
          - exp_labels: {stage: parse, state: cannot_start}
            exp_annotations:
              summary: "Stage parse is cannot_start: its workers do not run its messages (the status page and pepsi-queue stats say why)."
`, filepath.Join(must(filepath.Abs(rulesDir)), "pepsi.rules.yml"), series.String())
	testFile := filepath.Join(dir, "scraped.test.yml")
	if err := os.WriteFile(testFile, []byte(test), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, dir, "test", "rules", testFile)
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string { return fmt.Sprintf("%q", s) }

// must returns v, panicking on err (for values a test cannot go on without).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
