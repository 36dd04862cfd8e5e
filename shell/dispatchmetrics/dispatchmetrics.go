// Package dispatchmetrics exports a running pepsi-dispatch's own live state as
// Prometheus metrics (pepsi-dispatch -metrics-addr): its workers per stage and
// state, the messages in flight and claimed, spawn cooldowns, back-pressure
// (stages held, stages over their MAX_PENDING), whether it is active, and the Go runtime's and the process's metrics. What is in the
// database (queue depths, the flushed statistics) is pepsi-httpd's to export.
//
// It must never change the dispatcher's state: it only asks the dispatcher's
// loop for a copy (core.Snapshot) and waits a bounded time for it, so a busy or
// stopped loop costs a scrape a timeout, never the dispatcher a stall.
package dispatchmetrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pepsi-pipeline/pepsi/core"
)

// askTimeout bounds how long a scrape waits for the loop's answer. A standby
// that waits for the lock has no loop: it answers nothing, and is not active.
const askTimeout = 2 * time.Second

var (
	descActive = prometheus.NewDesc("pepsi_dispatcher_active",
		"1 if this pepsi-dispatch holds the lock and its loop answered this scrape; 0 if it is a standby waiting for the lock, starting, stopping or too busy to answer within 2 s.",
		nil, nil)
	descWorkers = prometheus.NewDesc("pepsi_dispatcher_workers",
		"Worker processes of this dispatcher per stage and state: starting (spawned, not yet running), ready (running), stopping (told to stop or killed, not yet exited).",
		[]string{"stage", "state"}, nil)
	descInFlight = prometheus.NewDesc("pepsi_dispatcher_messages_in_flight",
		"Message ids handed to the stage's workers and not yet answered.",
		[]string{"stage"}, nil)
	descClaimed = prometheus.NewDesc("pepsi_dispatcher_messages_claimed_waiting",
		"Messages claimed for the stage and not yet handed to a worker.",
		[]string{"stage"}, nil)
	descCapacity = prometheus.NewDesc("pepsi_dispatcher_stage_capacity_messages",
		"PARALLELISM × QUEUE_LIMIT: the most messages the stage may have in flight at once.",
		[]string{"stage"}, nil)
	descCooldown = prometheus.NewDesc("pepsi_dispatcher_spawn_cooldown_seconds",
		"Seconds until the stage may start workers again after a program that could not start; 0 when it may.",
		[]string{"stage"}, nil)
	descHeld = prometheus.NewDesc("pepsi_dispatcher_stage_pressure_held",
		"1 while nothing is claimed for the stage because the stage named by 'by', which it feeds, has more than its MAX_PENDING messages pending (back-pressure); exported only for a held stage.",
		[]string{"stage", "by"}, nil)
	descOver = prometheus.NewDesc("pepsi_dispatcher_stage_over_max_pending",
		"1 if the last claim that checked the stage's MAX_PENDING found more messages pending, else 0; exported only for a stage with a MAX_PENDING.",
		[]string{"stage"}, nil)
	descDBDown = prometheus.NewDesc("pepsi_dispatcher_database_down",
		"1 while queue writes fail and the dispatcher holds their results to try again (the database refuses or times out a queue transaction, or a queue session is lost while the lock's session lives), else 0. A database gone entirely ends the lock's session too: the dispatcher starts over, and pepsi_dispatcher_active reads 0 instead.",
		nil, nil)
	descShuttingDown = prometheus.NewDesc("pepsi_dispatcher_shutting_down",
		"1 once a shutdown has begun, else 0.",
		nil, nil)
	descSpansDropped = prometheus.NewDesc("pepsi_dispatch_spans_dropped_total",
		"Spans of passes dropped because the trace exporter's queue was full (a collector slow or gone); only while tracing is on.",
		nil, nil)
	descSpanErrors = prometheus.NewDesc("pepsi_dispatch_span_export_errors_total",
		"Errors the trace exporter reported (failed exports); only while tracing is on.",
		nil, nil)
)

// Collector asks a dispatcher's loop for its state at each scrape.
type Collector struct {
	asks chan<- chan<- core.Snapshot
	// Spans, if not nil, counts the trace exporter's dropped spans and
	// failed exports (internal/tracing's Exporter), sent whether or not
	// the loop answers.
	Spans SpanCounter
}

// SpanCounter counts what a trace exporter could not export.
type SpanCounter interface {
	Dropped() uint64
	Failed() uint64
}

// NewCollector returns a Collector that sends its requests on asks, the
// channel whose other end is dispatch.Options.Snapshots.
func NewCollector(asks chan<- chan<- core.Snapshot) *Collector { return &Collector{asks: asks} }

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descActive, descWorkers, descInFlight, descClaimed, descCapacity,
		descCooldown, descHeld, descOver, descDBDown, descShuttingDown, descSpansDropped, descSpanErrors} {
		ch <- d
	}
}

// Collect asks for a snapshot and sends its metrics; without an answer within
// askTimeout it sends only pepsi_dispatcher_active 0.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.Spans != nil {
		ch <- prometheus.MustNewConstMetric(descSpansDropped, prometheus.CounterValue, float64(c.Spans.Dropped()))
		ch <- prometheus.MustNewConstMetric(descSpanErrors, prometheus.CounterValue, float64(c.Spans.Failed()))
	}
	s, ok := c.ask()
	if !ok {
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, 0)
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descActive, 1)
	gauge(descDBDown, b2f(s.DatabaseDown))
	gauge(descShuttingDown, b2f(s.ShuttingDown))
	for _, st := range s.Stages {
		gauge(descWorkers, float64(st.Starting), st.Stage, "starting")
		gauge(descWorkers, float64(st.Ready), st.Stage, "ready")
		gauge(descWorkers, float64(st.Stopping), st.Stage, "stopping")
		gauge(descInFlight, float64(st.InFlight), st.Stage)
		gauge(descClaimed, float64(st.Claimed), st.Stage)
		gauge(descCapacity, float64(st.Capacity), st.Stage)
		gauge(descCooldown, max(st.CooldownUntil.Sub(s.At).Seconds(), 0), st.Stage)
		if st.HeldBy != "" {
			gauge(descHeld, 1, st.Stage, st.HeldBy)
		}
		if st.MaxPending > 0 {
			gauge(descOver, b2f(st.OverMaxPending), st.Stage)
		}
	}
}

func (c *Collector) ask() (core.Snapshot, bool) {
	reply := make(chan core.Snapshot, 1) // the loop never blocks on it
	timeout := time.NewTimer(askTimeout)
	defer timeout.Stop()
	select {
	case c.asks <- reply:
	case <-timeout.C:
		return core.Snapshot{}, false
	}
	select {
	case s := <-reply:
		return s, true
	case <-timeout.C:
		return core.Snapshot{}, false
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Handler serves /metrics: the Collector's metrics and the process's go_* and
// process_* ones.
func Handler(c *Collector) http.Handler {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{MaxRequestsInFlight: 4, Timeout: askTimeout + time.Second}))
	return mux
}

// Listen opens addr, so that a bad address is an error at start.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics-addr: %w", err)
	}
	return ln, nil
}

// Serve serves Handler(c) on ln, with timeouts, until ctx ends.
func Serve(ctx context.Context, ln net.Listener, c *Collector, log *slog.Logger) {
	srv := &http.Server{
		Handler:           Handler(c),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx) //nolint:errcheck // stopping anyway
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("the metrics server stopped", "err", err)
	}
}
