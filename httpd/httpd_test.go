package httpd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/store"
)

var ctx = context.Background()

// secretPayload is in every row the tests insert: no answer may contain it.
const secretPayload = "SECRET-PAYLOAD-must-never-be-shown"

// knownRun is the state a pipeline of two stages, parse and deliver, leaves
// after a run: its rows per status and the statistics its dispatcher flushed.
// The numbers are all different, so a value in the wrong place shows.
const knownRun = `
INSERT INTO pepsi.queue (stage, status, payload, state, timeout, updated_at, ready_at)
SELECT 'parse', 'pending', convert_to('` + secretPayload + `', 'UTF8'), '{}', NULL, t, t
FROM generate_series(1, 7) g, LATERAL (SELECT CASE WHEN g = 1 THEN now() - interval '90 seconds' ELSE now() END AS t) a;
INSERT INTO pepsi.queue (stage, status, payload) SELECT 'parse', 'running', convert_to('` + secretPayload + `', 'UTF8') FROM generate_series(1, 2);
INSERT INTO pepsi.queue (stage, status, payload, timeout, attempts)
	SELECT 'parse', 'paused', convert_to('` + secretPayload + `', 'UTF8'), now() + make_interval(secs => 3600 * (g - 1)), g - 1
	FROM generate_series(1, 3) g;
INSERT INTO pepsi.queue (stage, status, payload, state, updated_at) VALUES
	('parse', 'failed', 'x', '{"error": "no sender in the header"}', now() - interval '3 minutes'),
	('deliver', 'failed', 'x', '{"dispatch_error": "exit status 3: mailbox full"}', now() - interval '2 minutes'),
	('deliver', 'failed', 'x', '{"dispatch_error": "worker crashed (signal: killed)"}', now() - interval '1 minute'),
	('deliver', 'timeout', 'x', '{"dispatch_error": "MAX_RUNTIME 5m0s exceeded"}', now());
INSERT INTO pepsi.queue (stage, status, payload) SELECT 'deliver', 'pending', 'x' FROM generate_series(1, 4);
INSERT INTO pepsi.queue (stage, status, payload) SELECT 'deliver', 'done', 'x' FROM generate_series(1, 11);
INSERT INTO pepsi.stage_stats (stage, processed, failed, timeouts, crashes, processing_us, retries, rate_held_us, emitted, emits_dropped, guard_misses, updated_at) VALUES
	('parse', 40, 0, 0, 0, 2500000, 6, 1500000, 12, 3, 2, '2026-11-30 10:00:00+00'),
	('deliver', 30, 2, 1, 1, 9000000, 0, 0, 0, 0, 0, '2026-11-30 10:00:05+00');
UPDATE pepsi.dispatch_stats SET stage_passes = 70, messages_left = 15, updated_at = '2026-11-30 10:00:05+00';
`

// newKnownRun makes a database holding knownRun and returns its URL.
func newKnownRun(t *testing.T) string {
	t.Helper()
	url := pgtest.NewMigrated(t)
	if _, err := pgtest.Connect(t, url).Exec(ctx, knownRun); err != nil {
		t.Fatalf("insert the known run: %v", err)
	}
	return url
}

func open(t *testing.T, opts httpd.Options) *httpd.Source {
	t.Helper()
	src, err := httpd.Open(ctx, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(src.Close)
	return src
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// scrape GETs /metrics and parses it with Prometheus's own text parser.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: status %d: %s", code, body)
	}
	if strings.Contains(body, secretPayload) {
		t.Fatalf("/metrics shows a payload")
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// values flattens the pepsi_ families into "name{label=value,...}" -> value.
func values(fams map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for name, f := range fams {
		if !strings.HasPrefix(name, "pepsi_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := name
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func TestMetricsExportExactlyTheKnownRunAndPassTheLinter(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	// A session holding the dispatcher's lock, as a running pepsi-dispatch does.
	lock := pgtest.Connect(t, url)
	if _, err := lock.Exec(ctx, "SELECT pg_advisory_lock($1)", store.LockKey); err != nil {
		t.Fatal(err)
	}
	src := open(t, httpd.Options{Database: url, Stages: []string{"archive", "deliver", "parse"}})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	got := values(scrape(t, srv.URL))

	want := map[string]float64{
		"pepsi_database_up":          1,
		"pepsi_dispatcher_lock_held": 1,
		// parse: 7 pending (the head 90 s old), 2 running, 3 paused (1 due), 1 failed by itself.
		`pepsi_queue_messages{stage=parse,status=pending}`:         7,
		`pepsi_queue_messages{stage=parse,status=running}`:         2,
		`pepsi_queue_messages{stage=parse,status=paused}`:          3,
		`pepsi_queue_messages{stage=parse,status=blocked}`:         0,
		`pepsi_queue_messages{stage=parse,status=failed}`:          1,
		`pepsi_queue_messages{stage=parse,status=timeout}`:         0,
		`pepsi_queue_paused_due_messages{stage=parse}`:             1,
		`pepsi_queue_retry_waiting_messages{stage=parse}`:          2,
		`pepsi_stage_retries_total{stage=parse}`:                   6,
		`pepsi_stage_rate_held_seconds_total{stage=parse}`:         1.5,
		`pepsi_stage_emitted_total{stage=parse}`:                   12,
		`pepsi_stage_emits_dropped_total{stage=parse}`:             3,
		`pepsi_stage_guard_misses_total{stage=parse}`:              2,
		`pepsi_stage_passes_ok_total{stage=parse}`:                 40,
		`pepsi_stage_failed_by_dispatcher_total{stage=parse}`:      0,
		`pepsi_stage_watchdog_timeouts_total{stage=parse}`:         0,
		`pepsi_stage_worker_crashes_total{stage=parse}`:            0,
		`pepsi_stage_processing_seconds_total{stage=parse}`:        2.5,
		`pepsi_stage_stats_flushed_timestamp_seconds{stage=parse}`: float64(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC).Unix()),
		// deliver: 4 pending, 2 failed and 1 timed out by the dispatcher; done rows are not counted.
		`pepsi_queue_messages{stage=deliver,status=pending}`:         4,
		`pepsi_queue_messages{stage=deliver,status=running}`:         0,
		`pepsi_queue_messages{stage=deliver,status=paused}`:          0,
		`pepsi_queue_messages{stage=deliver,status=blocked}`:         0,
		`pepsi_queue_messages{stage=deliver,status=failed}`:          2,
		`pepsi_queue_messages{stage=deliver,status=timeout}`:         1,
		`pepsi_queue_paused_due_messages{stage=deliver}`:             0,
		`pepsi_queue_retry_waiting_messages{stage=deliver}`:          0,
		`pepsi_stage_retries_total{stage=deliver}`:                   0,
		`pepsi_stage_rate_held_seconds_total{stage=deliver}`:         0,
		`pepsi_stage_emitted_total{stage=deliver}`:                   0,
		`pepsi_stage_emits_dropped_total{stage=deliver}`:             0,
		`pepsi_stage_guard_misses_total{stage=deliver}`:              0,
		`pepsi_stage_passes_ok_total{stage=deliver}`:                 30,
		`pepsi_stage_failed_by_dispatcher_total{stage=deliver}`:      2,
		`pepsi_stage_watchdog_timeouts_total{stage=deliver}`:         1,
		`pepsi_stage_worker_crashes_total{stage=deliver}`:            1,
		`pepsi_stage_processing_seconds_total{stage=deliver}`:        9,
		`pepsi_stage_stats_flushed_timestamp_seconds{stage=deliver}`: float64(time.Date(2026, 11, 30, 10, 0, 5, 0, time.UTC).Unix()),
		// archive: configured, nothing yet: every series at 0.
		`pepsi_queue_messages{stage=archive,status=pending}`:    0,
		`pepsi_queue_messages{stage=archive,status=running}`:    0,
		`pepsi_queue_messages{stage=archive,status=paused}`:     0,
		`pepsi_queue_messages{stage=archive,status=blocked}`:    0,
		`pepsi_queue_messages{stage=archive,status=failed}`:     0,
		`pepsi_queue_messages{stage=archive,status=timeout}`:    0,
		`pepsi_queue_oldest_pending_age_seconds{stage=archive}`: 0,
		`pepsi_queue_paused_due_messages{stage=archive}`:        0,
		`pepsi_queue_retry_waiting_messages{stage=archive}`:     0,
		`pepsi_stage_retries_total{stage=archive}`:              0,
		`pepsi_stage_rate_held_seconds_total{stage=archive}`:    0,
		`pepsi_stage_emitted_total{stage=archive}`:              0,
		`pepsi_stage_emits_dropped_total{stage=archive}`:        0,
		`pepsi_stage_guard_misses_total{stage=archive}`:         0,
		`pepsi_stage_passes_ok_total{stage=archive}`:            0,
		`pepsi_stage_failed_by_dispatcher_total{stage=archive}`: 0,
		`pepsi_stage_watchdog_timeouts_total{stage=archive}`:    0,
		`pepsi_stage_worker_crashes_total{stage=archive}`:       0,
		`pepsi_stage_processing_seconds_total{stage=archive}`:   0,
		"pepsi_dispatch_stage_passes_total":                     70,
		"pepsi_dispatch_messages_left_total":                    15,
		"pepsi_dispatch_stats_flushed_timestamp_seconds":        float64(time.Date(2026, 11, 30, 10, 0, 5, 0, time.UTC).Unix()),
		// No message has an order key.
		`pepsi_queue_order_keys_waiting{head=pending}`:  0,
		`pepsi_queue_order_keys_waiting{head=running}`:  0,
		`pepsi_queue_order_keys_waiting{head=paused}`:   0,
		`pepsi_queue_order_keys_waiting{head=retrying}`: 0,
		`pepsi_queue_order_keys_waiting{head=none}`:     0,
	}
	// Ages and durations move with the clock: check them by range, then drop them.
	for key, lo := range map[string]float64{
		`pepsi_queue_oldest_pending_age_seconds{stage=parse}`:   90,
		`pepsi_queue_oldest_pending_age_seconds{stage=deliver}`: 0,
		"pepsi_database_read_duration_seconds":                  0,
	} {
		v, ok := got[key]
		if !ok || v < lo || v > lo+60 {
			t.Errorf("%s = %v (present %v), want %v to %v", key, v, ok, lo, lo+60)
		}
		delete(got, key)
	}
	// The table's health depends on the whole server (other tests' transactions
	// hold the horizon back): present and not negative.
	for _, key := range []string{"pepsi_queue_table_dead_tuples", "pepsi_xmin_horizon_age_seconds"} {
		if v, ok := got[key]; !ok || v < 0 {
			t.Errorf("%s = %v (present %v), want a value of 0 or more", key, v, ok)
		}
		delete(got, key)
	}
	for key, w := range want {
		if g, ok := got[key]; !ok || g != w {
			t.Errorf("%s = %v (present %v), want %v", key, g, ok, w)
		}
	}
	for key, g := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("unexpected series %s = %v", key, g)
		}
	}

	problems, err := testutil.CollectAndLint(httpd.NewCollector(src))
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestStatusJSONListsTheLatestFailuresWithReasonsAndNoPayload(t *testing.T) {
	t.Parallel()
	src := open(t, httpd.Options{Database: newKnownRun(t)})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	code, body := get(t, srv.URL+"/api/status")
	if code != http.StatusOK {
		t.Fatalf("GET /api/status: %d %s", code, body)
	}
	if strings.Contains(body, secretPayload) {
		t.Fatalf("/api/status shows a payload")
	}
	var st httpd.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("decode /api/status: %v\n%s", err, body)
	}
	if !st.OK || st.Snapshot == nil {
		t.Fatalf("status ok %v, snapshot %v, error %q; want a good read", st.OK, st.Snapshot != nil, st.Error)
	}
	var got []string
	for _, f := range st.Snapshot.Failures {
		got = append(got, fmt.Sprintf("%s/%s by %s: %s", f.Stage, f.Status, f.By, f.Reason))
	}
	want := []string{ // newest first
		"deliver/timeout by dispatcher: MAX_RUNTIME 5m0s exceeded",
		"deliver/failed by dispatcher: worker crashed (signal: killed)",
		"deliver/failed by dispatcher: exit status 3: mailbox full",
		"parse/failed by stage: no sender in the header",
	}
	if !slices.Equal(got, want) {
		t.Errorf("failures:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, path := range []string{"/", "/app.js", "/style.css"} {
		code, body := get(t, srv.URL+path)
		if code != http.StatusOK || len(body) < 100 {
			t.Errorf("GET %s: status %d, %d bytes; want the embedded asset", path, code, len(body))
		}
		if strings.Contains(body, "http://") || strings.Contains(body, "https://") {
			t.Errorf("%s refers to another site; assets must be self-contained", path)
		}
	}
}

func TestConcurrentScrapesShareOneRead(t *testing.T) {
	t.Parallel()
	const cacheAge = 2 * time.Second
	src := open(t, httpd.Options{Database: newKnownRun(t), CacheMaxAge: cacheAge})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	time.Sleep(cacheAge + 100*time.Millisecond) // Open's read is too old now
	before := src.Reads()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			resp, err := http.Get(srv.URL + "/metrics")
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the read count matters
			resp.Body.Close()
		})
	}
	wg.Wait()
	if n := src.Reads() - before; n != 1 {
		t.Errorf("20 concurrent scrapes made %d database reads, want 1", n)
	}
}

func TestADatabaseThatGoesAwayShowsOnHealthzAndMetricsAndTheServerKeepsServing(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	src := open(t, httpd.Options{Database: url, CacheMaxAge: time.Millisecond})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	if code, body := get(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz before: %d %s, want 200", code, body)
	}
	dropDatabase(t, url)             // under the server's feet
	time.Sleep(5 * time.Millisecond) // past the cache age
	if code, body := get(t, srv.URL+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "database unreachable") {
		t.Errorf("healthz after: %d %q, want 503 database unreachable", code, body)
	}
	got := values(scrape(t, srv.URL))
	if len(got) != 1 || got["pepsi_database_up"] != 0 {
		t.Errorf("metrics after: %v, want only pepsi_database_up 0", got)
	}
	code, body := get(t, srv.URL+"/api/status")
	var st httpd.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != http.StatusOK {
		t.Fatalf("api/status after: %d %v %s", code, err, body)
	}
	if st.OK || st.Error == "" || st.Snapshot == nil {
		t.Errorf("api/status after: ok %v, error %q, snapshot kept %v; want not ok, the error, the last good read", st.OK, st.Error, st.Snapshot != nil)
	}
}

// dropDatabase drops the test database at url, closing its connections.
func dropDatabase(t *testing.T, url string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	admin := pgtest.Connect(t, pgtest.AdminURL(t))
	if _, err := admin.Exec(ctx, "DROP DATABASE "+pgx.Identifier{cfg.Database}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Fatalf("drop the database: %v", err)
	}
}

func TestAReadOnlyRoleWithoutThePayloadColumnIsEnough(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	owner := pgtest.Connect(t, url)
	// The GRANTs docs/pepsi-httpd.8.md tells operators to give.
	role, roleURL := pgtest.LoginRole(t, owner, url, "pepsi_monitor", strings.ReplaceAll(store.MonitorGrantsSQL, "pepsi_monitor", "ROLE"))
	src := open(t, httpd.Options{Database: roleURL})
	snap, err := src.Snapshot(ctx)
	if err != nil {
		t.Fatalf("read as %s: %v", role, err)
	}
	if len(snap.Live) != 2 || snap.StagePasses != 70 {
		t.Errorf("read as %s: %d stages, %d passes; want 2, 70", role, len(snap.Live), snap.StagePasses)
	}
	// A message's page as that role: its payload's size (through
	// pepsi.payload_size), its history, its parent and children, every part
	// readable.
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	failed := idOf(t, url, "deliver", "failed")
	code, body := get(t, fmt.Sprintf("%s/api/messages/%d", srv.URL, failed))
	var m httpd.Message
	if err := json.Unmarshal([]byte(body), &m); err != nil || code != http.StatusOK {
		t.Fatalf("GET /api/messages/%d as %s: %d %v %s", failed, role, code, err, body)
	}
	if m.PayloadSize == nil || *m.PayloadSize != 1 || m.PayloadSizeError != "" || m.HistoryError != "" || m.FirstChildren == nil {
		t.Errorf("GET /api/messages/%d as %s: %s; want payload_size 1, its history and children readable", failed, role, body)
	}
	// And the role could not have read a payload, nor written anything.
	c := pgtest.Connect(t, roleURL)
	if _, err := c.Exec(ctx, "SELECT payload FROM pepsi.queue LIMIT 1"); err == nil {
		t.Errorf("%s can read payloads; the documented GRANTs must leave them out", role)
	}
}

// TestAMessagePageTheRoleMayNotReadIsNot503: a role without SELECT on a
// column the message page reads (parent_id, schema version 19's, missing
// from a role of another name) is refused every message; that is a 500
// saying so, not a 503, which tells a client the database did not answer
// and the same request may do later. A database that does not answer, or
// not within the statement timeout, is still a 503.
func TestAMessagePageTheRoleMayNotReadIsNot503(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	owner := pgtest.Connect(t, url)
	_, roleURL := pgtest.LoginRole(t, owner, url, "pepsi_old_monitor", strings.ReplaceAll(store.MonitorGrantsSQL, "pepsi_monitor", "ROLE")+
		"; REVOKE SELECT (parent_id) ON pepsi.queue FROM ROLE")
	src := open(t, httpd.Options{Database: roleURL})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	failed := idOf(t, url, "deliver", "failed")
	if code, body := get(t, fmt.Sprintf("%s/api/messages/%d", srv.URL, failed)); code != http.StatusInternalServerError || !strings.Contains(body, "permission denied") {
		t.Errorf("GET /api/messages/%d as a role without parent_id: %d %s; want 500 saying permission denied", failed, code, body)
	}
	// A lock held on the queue: no answer within the statement timeout.
	slow := open(t, httpd.Options{Database: url, StatementTimeout: 200 * time.Millisecond})
	srvSlow := httptest.NewServer(httpd.Handler(slow, nil))
	defer srvSlow.Close()
	tx, err := owner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // ends the lock; nothing to tell
	if _, err := tx.Exec(ctx, "LOCK TABLE pepsi.queue IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, fmt.Sprintf("%s/api/messages/%d", srvSlow.URL, failed)); code != http.StatusServiceUnavailable || !strings.Contains(body, "statement timeout") {
		t.Errorf("GET /api/messages/%d while a lock holds the queue: %d %s; want 503 saying statement timeout", failed, code, body)
	}
	down := open(t, httpd.Options{Database: "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5"})
	srvDown := httptest.NewServer(httpd.Handler(down, nil))
	defer srvDown.Close()
	if code, body := get(t, srvDown.URL+"/api/messages/1"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /api/messages/1 of a database nothing listens for: %d %s; want 503", code, body)
	}
}

// A fresh pipeline's /api/status: no failures is an empty list, not null, and
// a vacuum that never happened is left out, not dated year 1.
func TestStatusJSONOfAFreshPipelineHasAnEmptyListAndNoVacuum(t *testing.T) {
	t.Parallel()
	url := pgtest.NewMigrated(t)
	// A table whose statistics were never reset has no vacuum on record only if
	// none ran: this database is new, and nothing vacuums it here.
	src := open(t, httpd.Options{Database: url})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	code, body := get(t, srv.URL+"/api/status")
	if code != http.StatusOK {
		t.Fatalf("GET /api/status: %d %s", code, body)
	}
	if !strings.Contains(body, `"failures":[]`) {
		t.Errorf("/api/status of a pipeline without failures lacks \"failures\":[]: %s", body)
	}
	if strings.Contains(body, "last_vacuum") {
		t.Errorf("/api/status of a never-vacuumed queue has a last_vacuum: %s", body)
	}
}
