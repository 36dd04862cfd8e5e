package ingress

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pepsi-pipeline/pepsi/internal/tracing"
)

// metrics are pepsi-ingress's Prometheus metrics, in a registry of their own
// (one per Server, so that tests do not share them).
type metrics struct {
	reg           *prometheus.Registry
	requests      *prometheus.CounterVec
	requests202   prometheus.Counter // requests' child for 202, looked up once rather than per request
	accepted      prometheus.Counter
	batchMessages prometheus.Histogram
	batchRequests prometheus.Histogram
	commitSeconds prometheus.Histogram
}

func newMetrics(traces *tracing.Exporter) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pepsi_ingress_requests_total",
			Help: "Requests to /v1/messages, by the status code answered.",
		}, []string{"code"}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pepsi_ingress_messages_accepted_total",
			Help: "Messages answered 202 (committed, or already in the queue under their key).",
		}),
		batchMessages: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pepsi_ingress_batch_messages",
			Help:    "Rows per committed transaction (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		batchRequests: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pepsi_ingress_batch_requests",
			Help:    "Requests per committed transaction (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pepsi_ingress_commit_seconds",
			Help:    "Time of one try of a transaction, from BEGIN to COMMIT's answer.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	m.requests202 = m.requests.WithLabelValues("202")
	m.reg.MustRegister(m.requests, m.accepted, m.batchMessages, m.batchRequests, m.commitSeconds)
	if traces != nil {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pepsi_ingress_spans_dropped_total",
			Help: "Spans of requests dropped because the trace exporter's queue was full (a collector slow or gone); only while tracing is on.",
		}, func() float64 { return float64(traces.Dropped()) }), prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pepsi_ingress_span_export_errors_total",
			Help: "Errors the trace exporter reported (failed exports); only while tracing is on.",
		}, func() float64 { return float64(traces.Failed()) }))
	}
	return m
}
