package httpd

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pepsi-pipeline/pepsi/core"
)

// Metric descriptions. Each HELP says what the number counts and where it comes
// from; docs/pepsi-httpd.8.md lists them with more words.
var (
	descUp = prometheus.NewDesc("pepsi_database_up",
		"1 if pepsi-httpd could read the queue and statistics from PostgreSQL at this scrape, 0 if not (then no other pepsi_ metric is exported).",
		nil, nil)
	descReadSeconds = prometheus.NewDesc("pepsi_database_read_duration_seconds",
		"How long the database read behind this scrape took (reads are shared by scrapes within the cache age).",
		nil, nil)
	descMessages = prometheus.NewDesc("pepsi_queue_messages",
		"Messages in pepsi.queue now, per stage and status (pending, running, paused, blocked, failed, timeout; done is not counted; blocked: waiting behind an older message of its order key). failed counts every failed message, whether the stage or the dispatcher failed it.",
		[]string{"stage", "status"}, nil)
	descOldest = prometheus.NewDesc("pepsi_queue_oldest_pending_age_seconds",
		"How long the stage's longest-waiting pending message has been ready (since it was made, moved to the stage, woken or retried); 0 with none pending.",
		[]string{"stage"}, nil)
	descPausedDue = prometheus.NewDesc("pepsi_queue_paused_due_messages",
		"Paused messages whose retry time has passed and that the dispatcher has not made pending yet.",
		[]string{"stage"}, nil)
	descRetryWaiting = prometheus.NewDesc("pepsi_queue_retry_waiting_messages",
		"Messages waiting out a retry at this stage: paused after an answer 75 (attempts > 0), due again after their backoff.",
		[]string{"stage"}, nil)
	descRetries = prometheus.NewDesc("pepsi_stage_retries_total",
		"Messages the dispatcher paused for a retry at this stage, answer 75 with RETRY_LIMIT > 0 (pepsi.stage_stats.retries).",
		[]string{"stage"}, nil)
	descRateHeld = prometheus.NewDesc("pepsi_stage_rate_held_seconds_total",
		"Time this stage had messages to claim and room for them but its RATE had no token (pepsi.stage_stats.rate_held_us): how much its rate holds it back.",
		[]string{"stage"}, nil)
	descEmitted = prometheus.NewDesc("pepsi_stage_emitted_total",
		"Messages this stage's passes emitted (emit lines) whose transition was written, so they were inserted (pepsi.stage_stats.emitted; a child whose key was seen before counts too).",
		[]string{"stage"}, nil)
	descEmitsDropped = prometheus.NewDesc("pepsi_stage_emits_dropped_total",
		"Messages this stage's passes emitted that inserted nothing: the pass wrote no transition (a bare 0, a failure, a 75, a guard miss) (pepsi.stage_stats.emits_dropped).",
		[]string{"stage"}, nil)
	descGuardMisses = prometheus.NewDesc("pepsi_stage_guard_misses_total",
		"Outcomes of this stage's passes the dispatcher could not write because the row was no longer running at the stage (its stage wrote it meanwhile) (pepsi.stage_stats.guard_misses).",
		[]string{"stage"}, nil)
	descLock = prometheus.NewDesc("pepsi_dispatcher_lock_held",
		"1 if a pepsi-dispatch holds the dispatcher's advisory lock on this database, 0 if none runs.",
		nil, nil)
	descPassesOK = prometheus.NewDesc("pepsi_stage_passes_ok_total",
		"Stage passes whose worker answered 0 (pepsi.stage_stats.processed), fused passes included. A message the stage itself finished as failed (state.error) was answered 0 and counts here.",
		[]string{"stage"}, nil)
	descFailedByDispatcher = prometheus.NewDesc("pepsi_stage_failed_by_dispatcher_total",
		"Messages pepsi-dispatch failed at this stage: a non-zero answer, a worker crash or a protocol error (pepsi.stage_stats.failed, state.dispatch_error). Failures a stage writes itself are not counted here.",
		[]string{"stage"}, nil)
	descWatchdog = prometheus.NewDesc("pepsi_stage_watchdog_timeouts_total",
		"Messages timed out at this stage by the MAX_RUNTIME watchdog, their worker killed (pepsi.stage_stats.timeouts).",
		[]string{"stage"}, nil)
	descCrashes = prometheus.NewDesc("pepsi_stage_worker_crashes_total",
		"Worker processes of this stage that died unexpectedly (pepsi.stage_stats.crashes).",
		[]string{"stage"}, nil)
	descProcessing = prometheus.NewDesc("pepsi_stage_processing_seconds_total",
		"Processing time of the passes counted in pepsi_stage_passes_ok_total (pepsi.stage_stats.processing_us).",
		[]string{"stage"}, nil)
	descStageFlushed = prometheus.NewDesc("pepsi_stage_stats_flushed_timestamp_seconds",
		"When a flush of pepsi-dispatch last changed this stage's statistics (Unix time).",
		[]string{"stage"}, nil)
	descStagePasses = prometheus.NewDesc("pepsi_dispatch_stage_passes_total",
		"All stage passes the dispatcher counted, fused passes included (pepsi.dispatch_stats.stage_passes).",
		nil, nil)
	descMessagesLeft = prometheus.NewDesc("pepsi_dispatch_messages_left_total",
		"Messages the dispatcher saw leave the pipeline: done, failed or timed out (pepsi.dispatch_stats.messages_left).",
		nil, nil)
	descDead = prometheus.NewDesc("pepsi_queue_table_dead_tuples",
		"Dead row versions in pepsi.queue, as the statistics collector estimates them: what vacuum has to remove.", nil, nil)
	descLastVacuum = prometheus.NewDesc("pepsi_queue_table_last_vacuum_timestamp_seconds",
		"When the last vacuum of pepsi.queue (pepsi-dispatch's, autovacuum's or a DBA's) ended; absent when none since the statistics were reset.", nil, nil)
	descHorizon = prometheus.NewDesc("pepsi_xmin_horizon_age_seconds",
		"How long the oldest transaction holding back the xmin horizon has been open: no vacuum removes dead rows younger than it.", nil, nil)
	descHealth = prometheus.NewDesc("pepsi_stage_health",
		"1 for the state pepsi-dispatch recorded of the stage's workers (pepsi.stage_health: ok, cannot_start, crashing, pressure_held, rate_held), 0 for the others; exported only while a dispatcher holds the lock.",
		[]string{"stage", "state"}, nil)
	descKeysWaiting = prometheus.NewDesc("pepsi_queue_order_keys_waiting",
		"Order keys with messages waiting (blocked) behind an older message of the key, their head, by what the head is doing: pending, running, paused (by its stage), retrying (paused after an answer 75), none (it finished; the dispatcher hands the key on next).",
		[]string{"head"}, nil)
	descFlushed = prometheus.NewDesc("pepsi_dispatch_stats_flushed_timestamp_seconds",
		"When pepsi-dispatch last flushed its statistics (Unix time).",
		nil, nil)
)

// collectTimeout bounds how long a scrape waits for its read.
const collectTimeout = 15 * time.Second

// Collector exports a Source's Snapshot as Prometheus metrics, reading the
// database at scrape time (through the Source's cache).
type Collector struct {
	src *Source
}

// NewCollector returns a Collector for src.
func NewCollector(src *Source) *Collector { return &Collector{src: src} }

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descReadSeconds, descMessages, descOldest, descPausedDue, descRetryWaiting, descLock, descDead, descLastVacuum, descHorizon,
		descPassesOK, descFailedByDispatcher, descWatchdog, descCrashes, descProcessing, descRetries, descRateHeld, descStageFlushed,
		descEmitted, descEmitsDropped, descGuardMisses,
		descStagePasses, descMessagesLeft, descFlushed, descHealth, descKeysWaiting} {
		ch <- d
	}
}

// Collect reads a Snapshot and sends its metrics. When the read fails it sends
// only pepsi_database_up 0: stale numbers are worse than none.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	s, err := c.src.Snapshot(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 0)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, validLabels(labels)...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, validLabels(labels)...)
	}
	gauge(descUp, 1)
	gauge(descReadSeconds, s.ReadSeconds)
	gauge(descLock, b2f(s.DispatcherLocked))
	stats := map[string]StageStats{}
	for _, st := range s.Stages {
		stats[st.Stage] = st
	}
	// Every stage gets every series, at 0 before the dispatcher counted anything,
	// so that rate() and alerts see a series from the start.
	for _, l := range s.Live {
		for _, st := range Statuses {
			gauge(descMessages, float64(l.Messages[st]), l.Stage, string(st))
		}
		gauge(descOldest, l.OldestPendingSeconds, l.Stage)
		gauge(descPausedDue, float64(l.PausedDue), l.Stage)
		gauge(descRetryWaiting, float64(l.RetryWaiting), l.Stage)
		st, flushed := stats[l.Stage]
		counter(descPassesOK, float64(st.PassesOK), l.Stage)
		counter(descFailedByDispatcher, float64(st.FailedByDispatcher), l.Stage)
		counter(descWatchdog, float64(st.WatchdogTimeouts), l.Stage)
		counter(descCrashes, float64(st.WorkerCrashes), l.Stage)
		counter(descProcessing, st.ProcessingSeconds, l.Stage)
		counter(descRetries, float64(st.Retries), l.Stage)
		counter(descRateHeld, st.RateHeldSeconds, l.Stage)
		counter(descEmitted, float64(st.Emitted), l.Stage)
		counter(descEmitsDropped, float64(st.EmitsDropped), l.Stage)
		counter(descGuardMisses, float64(st.GuardMisses), l.Stage)
		if flushed {
			gauge(descStageFlushed, unix(st.FlushedAt), l.Stage)
		}
	}
	counter(descStagePasses, float64(s.StagePasses))
	counter(descMessagesLeft, float64(s.MessagesLeft))
	gauge(descFlushed, unix(s.FlushedAt))
	gauge(descDead, float64(s.Table.DeadTuples))
	if !s.Table.LastVacuum.IsZero() {
		gauge(descLastVacuum, unix(s.Table.LastVacuum))
	}
	gauge(descHorizon, s.Table.HorizonSeconds)
	k := s.OrderKeys
	for head, n := range map[string]int64{"pending": k.HeadPending, "running": k.HeadRunning, "paused": k.HeadPaused,
		"retrying": k.HeadRetrying, "none": k.HeadNone} {
		gauge(descKeysWaiting, float64(n), head)
	}
	// A stopped dispatcher's record is stale: pepsi_dispatcher_lock_held 0
	// says what is wrong then.
	if s.DispatcherLocked {
		for _, h := range s.Health {
			for _, state := range healthStates {
				gauge(descHealth, b2f(h.State == state), h.Stage, string(state))
			}
		}
	}
}

// healthStates are the states pepsi_stage_health has a series for, each
// stage every one of them, so that an alert sees a series from the start.
var healthStates = []core.HealthState{core.HealthOK, core.HealthCannotStart, core.HealthCrashing, core.HealthPressureHeld, core.HealthRateHeld}

// validLabels returns labels with each byte sequence that is not UTF-8
// replaced by U+FFFD, as /api/status's JSON shows it. A database of encoding
// SQL_ASCII (what initdb makes under LANG=C) stores any bytes as a stage
// name, and a label value that is not UTF-8 made MustNewConstMetric panic in
// the registry's goroutine: every scrape ended pepsi-httpd.
func validLabels(labels []string) []string {
	for i, l := range labels {
		if !utf8.ValidString(l) {
			labels[i] = strings.ToValidUTF8(l, "\uFFFD")
		}
	}
	return labels
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func unix(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }
