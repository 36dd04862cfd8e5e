package httpd_test

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// chromium finds Debian's headless chromium (or a full one);
// .ci/chromium-up installs chromium-headless-shell for make test.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Fatal("no chromium on PATH for the browser test: run .ci/chromium-up (apt-get install --no-install-recommends chromium-headless-shell)")
	return ""
}

// browser starts a headless chromium and returns a chromedp context for it.
// Its profile and every temporary file it makes (TMPDIR) live in the test's
// own folder, removed after the browser is gone, so a run leaves nothing in /tmp.
func browser(t *testing.T) context.Context {
	t.Helper()
	dir := t.TempDir() // removed after the cleanups below, which stop the browser
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.UserDataDir(filepath.Join(dir, "profile")),
		chromedp.Env("TMPDIR="+dir),
		chromedp.NoSandbox, // tests may run as root
		chromedp.WindowSize(1500, 1100),
		chromedp.Flag("lang", "en-GB"),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	tctx, cancelTimeout := context.WithTimeout(bctx, 90*time.Second)
	t.Cleanup(cancelTimeout)
	return tctx
}

func TestThePageShowsAKnownRunAndDrawsItsCharts(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	src := open(t, httpd.Options{Database: url, SampleInterval: 150 * time.Millisecond, CacheMaxAge: 50 * time.Millisecond,
		Stages: []string{"parse", "deliver"}})
	sctx, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	go src.Sample(sctx)
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()

	// The run goes on while the history fills: deliver's backlog drains and
	// the dispatcher flushes passes, 10 a step at parse and 5 at deliver.
	conn := pgtest.Connect(t, url)
	for range 8 {
		_, err := conn.Exec(ctx, `UPDATE pepsi.stage_stats SET processed = processed + CASE stage WHEN 'parse' THEN 10 ELSE 5 END;
			UPDATE pepsi.queue SET status = 'done' WHERE ingress_id = (SELECT min(ingress_id) FROM pepsi.queue WHERE stage = 'deliver' AND status = 'pending')`)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The end state of the run: parse 40+80 passes, deliver 30+40; deliver's 4 pending all done.
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatalf("load the page: %v", err)
	}
	cell := func(stage, key string) string {
		return `document.querySelector('#stages tr[data-stage="` + stage + `"] td[data-key="` + key + `"]')?.textContent`
	}
	want := map[string]string{
		cell("parse", "pending"):                "7",
		cell("parse", "failed"):                 "1",
		cell("parse", "passes_ok"):              "120",
		cell("parse", "failed_by_dispatcher"):   "0",
		cell("parse", "paused"):                 "3",
		cell("parse", "retry_waiting"):          "2",
		cell("parse", "retries"):                "6",
		cell("deliver", "retries"):              "0",
		cell("deliver", "pending"):              "0",
		cell("deliver", "failed"):               "2",
		cell("deliver", "timeout"):              "1",
		cell("deliver", "passes_ok"):            "70",
		cell("deliver", "failed_by_dispatcher"): "2",
		cell("deliver", "watchdog_timeouts"):    "1",
		cell("deliver", "worker_crashes"):       "1",
	}
	var cond []string
	for expr, v := range want {
		cond = append(cond, "("+expr+` === "`+v+`")`)
	}
	if _, err := chromedp.Run(b, chromedp.Poll[bool](strings.Join(cond, " && "), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		for expr, v := range want {
			got, _ := chromedp.Run(b, chromedp.Evaluate[string](expr+` ?? "(none)"`))
			if got != v {
				t.Errorf("%s = %q, want %q", expr, got, v)
			}
		}
		t.Fatalf("the page did not show the known run: %v", err)
	}
	// The latest failure with its reason, and the database and lock badges.
	for sel, want := range map[string]string{
		"#failures tbody tr:first-child td.reason": "MAX_RUNTIME 5m0s exceeded",
		"#failures tbody tr:last-child td.reason":  "no sender in the header",
		"#db":   "database ok",
		"#lock": "no dispatcher holds the lock",
	} {
		got, err := chromedp.Run(b, chromedp.Text(sel))
		if err != nil || got != want {
			t.Errorf("%s: %q (%v), want %q", sel, got, err, want)
		}
	}
	// Every chart drew lines: points plotted, and pixels of a stage's colour.
	for _, id := range []string{"chart-pending", "chart-rate", "chart-failed"} {
		drawn, err := chromedp.Run(b, chromedp.Evaluate[int](`(() => {
			const c = document.getElementById("`+id+`");
			if (Number(c.dataset.points || 0) < 2) return 0;
			const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
			let n = 0;
			for (let i = 0; i < d.length; i += 4) if (d[i] === 0x25 && d[i+1] === 0x63 && d[i+2] === 0xeb || d[i] === 0xdb && d[i+1] === 0x27 && d[i+2] === 0x77) n++;
			return n;
		})()`))
		if err != nil || drawn < 50 {
			t.Errorf("chart %s: %d pixels in a stage's colour (%v), want a drawn line", id, drawn, err)
		}
	}
	if strings.Contains(mustText(t, b, "body"), secretPayload) {
		t.Error("the page shows a payload")
	}
	shot, err := chromedp.Run(b, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(t.ArtifactDir(), "status-page.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)

	// The database goes away: the page says so and keeps the last numbers.
	dropDatabase(t, url)
	gone := `document.getElementById("db").textContent === "database unreachable" && ` +
		`document.getElementById("lock").textContent === "dispatcher: unknown" && ` +
		`document.getElementById("error").textContent.includes("showing the last good read") && ` + cell("parse", "pending") + ` === "7"`
	if _, err := chromedp.Run(b, chromedp.Poll[bool](gone, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Errorf("the page did not show the database gone (with the last numbers kept): %v", err)
	}
	if shot, err = chromedp.Run(b, chromedp.FullScreenshot(100)); err == nil {
		err = os.WriteFile(filepath.Join(t.ArtifactDir(), "status-page-database-gone.png"), shot, 0o644)
	}
	if err != nil {
		t.Errorf("second screenshot: %v", err)
	}
}

func mustText(t *testing.T, b context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(b, chromedp.Text(sel))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// TestStagesNamedLikeAnObjectsPropertiesAreDrawn: "constructor" and
// "toString" are valid stage names; the page's maps of stages have no
// prototype, so such a stage gets its row, its colour and its line, and the
// page goes on polling (a plain object's inherited constructor once made
// every poll throw, and the page said pepsi-httpd was unreachable).
func TestStagesNamedLikeAnObjectsPropertiesAreDrawn(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(ctx, `INSERT INTO pepsi.queue (stage, payload) SELECT s, 'x' FROM unnest(ARRAY['constructor', 'toString']) s, generate_series(1, 3)`); err != nil {
		t.Fatal(err)
	}
	src := open(t, httpd.Options{Database: url, SampleInterval: 150 * time.Millisecond, CacheMaxAge: 50 * time.Millisecond,
		Stages: []string{"constructor", "toString"}})
	sctx, stopSampling := context.WithCancel(context.Background())
	defer stopSampling()
	go src.Sample(sctx)
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	for range 4 { // the history fills, each sample a point of the charts
		if _, err := conn.Exec(ctx, `UPDATE pepsi.queue SET status = 'done' WHERE ingress_id IN (SELECT min(ingress_id) FROM pepsi.queue WHERE status = 'pending' GROUP BY stage)`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatalf("load the page: %v", err)
	}
	drawn := `document.getElementById("db").textContent === "database ok" && ` +
		`document.querySelector('#stages tr[data-stage="constructor"]') !== null && ` +
		`document.querySelector('#stages tr[data-stage="toString"]') !== null && ` +
		`Number(document.getElementById("chart-pending").dataset.points || 0) >= 4`
	if _, err := chromedp.Run(b, chromedp.Poll[bool](drawn, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		got, _ := chromedp.Run(b, chromedp.Evaluate[string](`document.getElementById("db").textContent + " / " + document.getElementById("error").textContent`))
		t.Fatalf("the page did not draw stages constructor and toString (%q): %v", got, err)
	}
}
