// Package tracing exports PEPSI's spans with the OpenTelemetry Go SDK over
// OTLP, HTTP with protobuf or gRPC (docs/operations.md, "Traces"): one span per pass for
// pepsi-dispatch (core.Pass), one per request for pepsi-ingress.
//
// It is configured by the standard OpenTelemetry environment only, and is
// off, building no span at all, unless an endpoint is named. It must never
// block its caller, nor a transaction, nor a worker: passes and ended spans
// wait in bounded queues and are dropped and counted when they are full (a
// collector that is slow or gone); the exporter's own waits and retries
// happen on its goroutines. It never decides what happened to a message:
// the dispatcher's core says so (core.Pass), this package only writes it
// down.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/traceparent"
)

// queueSize is the size of each of the exporter's queues: the passes
// waiting to be made spans, the ended spans waiting for the batcher, and the
// batcher's own: OTEL_BSP_MAX_QUEUE_SIZE, 2048 by default, as the SDK reads
// it. A span past them is dropped and counted (Exporter.Dropped). So at most
// three queues of spans, and one batch (OTEL_BSP_MAX_EXPORT_BATCH_SIZE, at
// most a queue) with the exporter, are held: memory is bounded whatever the
// collector does.
func queueSize(getenv func(string) string) int {
	if n, err := strconv.Atoi(getenv("OTEL_BSP_MAX_QUEUE_SIZE")); err == nil && n > 0 {
		return n
	}
	return 2048
}

// batchSize is the most spans the batcher sends in one export:
// OTEL_BSP_MAX_EXPORT_BATCH_SIZE when it is a whole number from 1 to size
// (the queue's), else 512 or size if smaller, as the SDK reads it. The
// batcher is given it, and size, explicitly: the SDK reads these variables
// again itself, and a negative one makes it panic (a slice of negative
// capacity) instead of falling back as queueSize does.
func batchSize(getenv func(string) string, size int) int {
	if n, err := strconv.Atoi(getenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")); err == nil && n > 0 && n <= size {
		return n
	}
	return min(512, size)
}

// Enabled reports whether getenv's OpenTelemetry environment asks for traces:
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set,
// OTEL_SDK_DISABLED is not "true" and OTEL_TRACES_EXPORTER is not "none".
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Exporter makes and exports spans. A nil *Exporter is off: every method
// does nothing, at the cost of a nil check.
type Exporter struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	passes chan core.Pass
	spans  *queueing
	log    *slog.Logger
	// attrs and names belong to makePasses: a span's attributes, and each
	// stage's span name, made once (at most namesMax stages).
	attrs []attribute.KeyValue
	names map[string]string

	dropped drops
	failed  atomic.Uint64
	done    chan struct{}
	once    sync.Once
}

// New returns an exporter configured by the process's OpenTelemetry
// environment, for the service called service unless OTEL_SERVICE_NAME
// names another, or nil when Enabled says traces are off. It refuses an
// OTEL_EXPORTER_OTLP_PROTOCOL other than http/protobuf and grpc
// (newExporter).
func New(ctx context.Context, service string, log *slog.Logger) (*Exporter, error) {
	if err := checkExporter(os.Getenv); err != nil {
		return nil, err // with or without an endpoint: a setting it cannot honour
	}
	if !Enabled(os.Getenv) {
		return nil, nil
	}
	exp, err := newExporter(ctx, os.Getenv)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OpenTelemetry resource: %w", err)
	}
	size := queueSize(os.Getenv)
	e := &Exporter{passes: make(chan core.Pass, size), log: log, done: make(chan struct{}), names: map[string]string{}}
	e.dropped.log = log
	// The batcher may wait for the exporter (WithBlocking): only its feeder
	// does, never a caller, which the queue in front of it keeps from it.
	bsp := sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithBlocking(),
		sdktrace.WithMaxQueueSize(size), sdktrace.WithMaxExportBatchSize(batchSize(os.Getenv, size)))
	e.spans = newQueueing(bsp, size, &e.dropped)
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(e.spans), sdktrace.WithIDGenerator(ids{}))
	e.tracer = e.tp.Tracer("github.com/pepsi-pipeline/pepsi")
	otel.SetErrorHandler(otel.ErrorHandlerFunc(e.exportFailed))
	go e.makePasses()
	return e, nil
}

// checkExporter refuses an OTEL_TRACES_EXPORTER PEPSI does not have:
// "otlp" (the default) is the one it has, "none" turns traces off (Enabled);
// another ("console", "zipkin", a list) is refused, not quietly taken for
// OTLP or for off.
func checkExporter(getenv func(string) string) error {
	if x := getenv("OTEL_TRACES_EXPORTER"); x != "" && !strings.EqualFold(x, "otlp") && !strings.EqualFold(x, "none") {
		return fmt.Errorf("OTEL_TRACES_EXPORTER=%s: PEPSI exports traces over OTLP only (otlp, the default) or none", x)
	}
	return checkEndpoints(getenv)
}

// checkEndpoints refuses an OTLP endpoint over http/protobuf (the default
// protocol) that is no http or https URL with a host: the SDK would log a
// line of its own, in no format of PEPSI's, and run on exporting nothing.
// Only the variable the SDK uses for traces is checked (the _TRACES_ one
// when set), and nothing for grpc, whose exporter takes host:port, unix:
// and dns: targets as well.
func checkEndpoints(getenv func(string) string) error {
	if _, p := tracesProtocol(getenv); p != "http/protobuf" {
		return nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		v := getenv(k)
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%s=%s: not an endpoint URL (want http://HOST:PORT or https://HOST:PORT, as http://127.0.0.1:4318)", k, v)
		}
		return nil
	}
	return nil
}

// tracesProtocol is the OTLP protocol getenv names for traces, and the
// variable that names it: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
// OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf (key ""), the
// specification's default.
func tracesProtocol(getenv func(string) string) (key, protocol string) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := getenv(k); p != "" {
			return k, p
		}
	}
	return "", "http/protobuf"
}

// newExporter returns the OTLP exporter getenv's protocol names:
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// http/protobuf (a collector's port 4318) when neither is set, as the
// specification's default; grpc (port 4317) when named. The SDK's Go
// exporters speak no http/json, so that value is refused, as any other,
// rather than exporting in a protocol the operator did not ask for.
func newExporter(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	key, protocol := tracesProtocol(getenv)
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("%s=%s: PEPSI exports OTLP over http/protobuf (a collector's port 4318, the default) or grpc (port 4317); "+
			"the OpenTelemetry Go exporters speak no other", key, protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP exporter (%s): %w", protocol, err)
	}
	return exp, nil
}

// namesMax bounds the span names an exporter keeps, one per stage.
const namesMax = 1024

// drops counts the spans dropped because a queue was full, and logs the
// first: a collector that accepts connections and never answers, or asks
// to be retried later (429 with a long Retry-After), fails no export for
// half a minute or more, so without it the log would say nothing while
// every span is lost. One line, not one per span: the count is the metric.
type drops struct {
	n      atomic.Uint64
	logged atomic.Bool
	log    *slog.Logger // nil: nothing logged
}

func (d *drops) add() {
	d.n.Add(1)
	if d.log != nil && !d.logged.Load() && d.logged.CompareAndSwap(false, true) {
		d.log.Warn("traces: spans are being dropped: the exporter's queues are full, the collector is slow or not answering (logged once; the count is in the spans_dropped_total metric and the exit's log line)")
	}
}

// lastFailLog rate-limits the log of failed exports.
var lastFailLog atomic.Int64

// exportFailed counts an error of the SDK (an export that failed) and logs
// it at most once a minute.
func (e *Exporter) exportFailed(err error) {
	e.failed.Add(1)
	now := time.Now().Unix()
	if last := lastFailLog.Load(); now-last >= 60 && lastFailLog.CompareAndSwap(last, now) {
		e.log.Warn("traces: export failed (spans are dropped, not retried for ever; logged once a minute)", "err", err)
	}
}

// Dropped counts the spans dropped because a queue was full. Zero for nil.
func (e *Exporter) Dropped() uint64 {
	if e == nil {
		return 0
	}
	return e.dropped.n.Load()
}

// Failed counts the errors the SDK reported: failed exports. Zero for nil.
func (e *Exporter) Failed() uint64 {
	if e == nil {
		return 0
	}
	return e.failed.Load()
}

// Shutdown makes the spans of what was queued and exports what it can
// before ctx ends, then stops. Later passes and requests are dropped.
func (e *Exporter) Shutdown(ctx context.Context) error {
	if e == nil {
		return nil
	}
	e.once.Do(func() { close(e.passes) })
	select {
	case <-e.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return e.tp.Shutdown(ctx)
}

// Close exports what the exporter still holds, for at most 5 seconds (a
// collector that is gone does not hold up a program's exit) or until ctx
// ends (pepsi-dispatch's second signal), and logs what it could not
// export. Nothing for nil.
func (e *Exporter) Close(ctx context.Context) {
	if e == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		e.log.Warn("traces: not all exported at exit", "err", err)
	}
	if d, f := e.Dropped(), e.Failed(); d > 0 || f > 0 {
		e.log.Warn("traces: spans dropped (the exporter's queue was full) and exports failed", "dropped", d, "export_errors", f)
	}
}

// Pass queues the span of a pass (core.Pass): it never waits; when the
// queue is full the span is dropped and counted.
func (e *Exporter) Pass(p core.Pass) {
	if e == nil {
		return
	}
	defer func() {
		if recover() != nil { // sent after Shutdown: dropped, not for the collector's sake
			e.dropped.n.Add(1)
		}
	}()
	select {
	case e.passes <- p:
	default:
		e.dropped.add()
	}
}

// makePasses makes the span of each queued pass, but drops (and counts) a
// pass whose span would find the spans' queue full: with a collector that
// is slow or gone, making it would cost the CPU a span costs and end in the
// same drop.
func (e *Exporter) makePasses() {
	defer close(e.done)
	for p := range e.passes {
		if e.spans.full() {
			e.dropped.add()
			continue
		}
		e.passSpan(p)
	}
}

// passSpan makes the span of pass p: "process <stage>", kind consumer, from
// its handing to its end, with the pass's own span id (computed by the
// claim: docs/protocol.md, "Traces"), a child of the message's traceparent;
// a root when the message's traceparent is the pass's own (the first pass of
// a trace the claim began).
func (e *Exporter) passSpan(p core.Pass) {
	pass, ok := traceparent.SpanContext(p.Trace.Pass)
	if !ok {
		return
	}
	ctx := context.Background()
	if parent, ok := traceparent.SpanContext(p.Trace.Message); ok && parent.SpanID() != pass.SpanID() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	ctx = context.WithValue(ctx, idsKey{}, fixedIDs{trace: pass.TraceID(), span: pass.SpanID()})
	// The SDK copies the attributes, so one buffer serves every span (only
	// makePasses calls this).
	attrs := append(e.attrs[:0],
		attribute.String("messaging.system", "pepsi"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.destination.name", p.Stage),
		attribute.String("messaging.message.id", strconv.FormatInt(p.ID, 10)),
		attribute.String("pepsi.outcome", string(p.Outcome)),
		attribute.Int("pepsi.attempts", p.Attempts),
		attribute.Int("pepsi.worker.pid", p.PID),
	)
	if p.To != "" {
		attrs = append(attrs, attribute.String("pepsi.target", p.To))
	}
	e.attrs = attrs
	name, ok := e.names[p.Stage]
	if !ok && len(e.names) < namesMax {
		name = "process " + p.Stage
		e.names[p.Stage] = name
	} else if !ok {
		name = "process " + p.Stage
	}
	_, span := e.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(p.Handed), trace.WithAttributes(attrs...))
	if !p.Claimed.IsZero() {
		// The wait in the dispatcher: claimed, held until a worker had room.
		span.AddEvent("pepsi.claimed", trace.WithTimestamp(p.Claimed))
	}
	if p.Attempts > 0 {
		span.AddEvent("pepsi.retried", trace.WithTimestamp(p.Handed), trace.WithAttributes(attribute.Int("pepsi.attempts", p.Attempts)))
	}
	switch p.Outcome {
	case core.PassRetry:
		span.AddEvent("pepsi.retry", trace.WithTimestamp(p.Ended), trace.WithAttributes(attribute.String("pepsi.reason", clip(p.Reason))))
	case core.PassFail, core.PassTimeout, core.PassCrash:
		span.SetStatus(codes.Error, clip(p.Reason))
	}
	span.End(trace.WithTimestamp(p.Ended))
}

// clip bounds a reason in a span to 500 bytes.
func clip(s string) string {
	if len(s) > 500 {
		return s[:500] + "…"
	}
	return s
}

// Request is the span of one request of pepsi-ingress; nil when tracing is
// off.
type Request struct {
	span trace.Span
	tp   string
}

// StartRequest starts the span of a request, "METHOD path", kind server, a
// child of header (the request's traceparent) when it is valid and a new
// trace's root when not. Nil for a nil Exporter.
func (e *Exporter) StartRequest(header, method, path string) *Request {
	if e == nil {
		return nil
	}
	ctx := context.Background()
	if parent, ok := traceparent.SpanContext(header); ok {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	}
	_, span := e.tracer.Start(ctx, method+" "+path, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", method), attribute.String("url.path", path)))
	return &Request{span: span, tp: traceparent.Format(span.SpanContext())}
}

// TraceParent is the request span's traceparent: the messages of the
// request that have none of their own are its children. "" for nil.
func (r *Request) TraceParent() string {
	if r == nil {
		return ""
	}
	return r.tp
}

// End ends the span with the request's answer: its status code and how many
// messages it took. Nothing for nil.
func (r *Request) End(code, messages int) {
	if r == nil {
		return
	}
	r.span.SetAttributes(attribute.Int("http.response.status_code", code), attribute.Int("pepsi.messages", messages))
	if code >= 500 {
		r.span.SetStatus(codes.Error, strconv.Itoa(code))
	}
	r.span.End()
}

// idsKey is the context key of the ids a span is to have (fixedIDs).
type idsKey struct{}

// fixedIDs are a span's ids, computed elsewhere (a pass's by the claim).
type fixedIDs struct {
	trace trace.TraceID
	span  trace.SpanID
}

// ids is the SDK's ID generator: a span's ids are the ones its context
// carries (fixedIDs), else random ones.
type ids struct{}

func (ids) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if f, ok := ctx.Value(idsKey{}).(fixedIDs); ok {
		return f.trace, f.span
	}
	return randomIDs()
}

func (ids) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if f, ok := ctx.Value(idsKey{}).(fixedIDs); ok {
		return f.span
	}
	_, s := randomIDs()
	return s
}

// queueing is a span processor that hands ended spans to next (a batcher
// that may wait) through a bounded queue, from a goroutine of its own: its
// OnEnd never waits; a span that finds the queue full is dropped and
// counted in dropped.
type queueing struct {
	next    sdktrace.SpanProcessor
	ch      chan sdktrace.ReadOnlySpan
	dropped *drops
	done    chan struct{}
	once    sync.Once
}

func newQueueing(next sdktrace.SpanProcessor, size int, dropped *drops) *queueing {
	q := &queueing{next: next, ch: make(chan sdktrace.ReadOnlySpan, size), dropped: dropped, done: make(chan struct{})}
	go func() {
		defer close(q.done)
		for s := range q.ch {
			q.next.OnEnd(s)
		}
	}()
	return q
}

func (q *queueing) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// full reports whether an ended span would be dropped now.
func (q *queueing) full() bool { return len(q.ch) == cap(q.ch) }

func (q *queueing) OnEnd(s sdktrace.ReadOnlySpan) {
	defer func() {
		if recover() != nil { // ended after Shutdown: dropped, not for the collector's sake
			q.dropped.n.Add(1)
		}
	}()
	select {
	case q.ch <- s:
	default:
		q.dropped.add()
	}
}

func (q *queueing) Shutdown(ctx context.Context) error {
	q.once.Do(func() { close(q.ch) })
	select {
	case <-q.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return q.next.Shutdown(ctx)
}

func (q *queueing) ForceFlush(ctx context.Context) error { return q.next.ForceFlush(ctx) }
