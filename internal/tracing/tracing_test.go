package tracing

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
)

// Proves: traces are on only when an OTLP endpoint is named, and not when
// the SDK or the traces exporter is switched off.
func TestTracesAreOnOnlyWithAnEndpoint(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		if got := Enabled(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("Enabled(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
	if n := queueSize(func(string) string { return "" }); n != 2048 {
		t.Errorf("queue size without OTEL_BSP_MAX_QUEUE_SIZE = %d, want the SDK's 2048", n)
	}
	if n := queueSize(func(string) string { return "16" }); n != 16 {
		t.Errorf("queue size with OTEL_BSP_MAX_QUEUE_SIZE=16 = %d", n)
	}
}

// Proves: a nil exporter (traces off) takes passes and requests and does
// nothing, so callers need no check of their own.
func TestANilExporterIsOff(t *testing.T) {
	var e *Exporter
	e.Pass(core.Pass{ID: 1, Stage: "a"})
	r := e.StartRequest("", "POST", "/v1/messages")
	if r.TraceParent() != "" || e.Dropped() != 0 || e.Failed() != 0 {
		t.Errorf("nil exporter: request %v, dropped %d, failed %d", r, e.Dropped(), e.Failed())
	}
	r.End(202, 1)
	e.Close(context.Background())
}

// stuck is a span processor whose OnEnd never returns until release is
// closed: a batcher waiting for a collector that is gone.
type stuck struct{ release chan struct{} }

func (s stuck) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (s stuck) OnEnd(sdktrace.ReadOnlySpan)                     { <-s.release }
func (s stuck) Shutdown(context.Context) error                  { return nil }
func (s stuck) ForceFlush(context.Context) error                { return nil }

// ended counts the spans that were made (ended), whatever became of them.
type ended struct{ n atomic.Int64 }

func (c *ended) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *ended) OnEnd(sdktrace.ReadOnlySpan)                     { c.n.Add(1) }
func (c *ended) Shutdown(context.Context) error                  { return nil }
func (c *ended) ForceFlush(context.Context) error                { return nil }

// Proves: while the spans' queue is full (a collector that is gone), passes
// are dropped and counted before their spans are made, so a dead collector
// does not cost a span's CPU per pass.
func TestPassesAreDroppedBeforeTheirSpansAreMadeWhileTheQueueIsFull(t *testing.T) {
	const passes, queue = 100, 4
	blocked := stuck{release: make(chan struct{})}
	made := &ended{}
	e := &Exporter{passes: make(chan core.Pass, passes), names: map[string]string{}, done: make(chan struct{}),
		log: slog.New(slog.DiscardHandler)}
	e.spans = newQueueing(blocked, queue, &e.dropped)
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans), sdktrace.WithSpanProcessor(made), sdktrace.WithIDGenerator(ids{}))
	e.tracer = e.tp.Tracer("test")
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for i := range passes {
		e.Pass(core.Pass{ID: int64(i + 1), Stage: "a", Outcome: core.PassDone, Handed: t0, Ended: t0.Add(time.Millisecond),
			Trace: core.Trace{Pass: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}})
	}
	go e.makePasses()
	close(e.passes)
	<-e.done
	// At most: one span with the stuck batcher, the queue's, and one more
	// that raced the queue filling.
	if n := made.n.Load(); n > queue+2 {
		t.Errorf("%d spans made for %d passes with a queue of %d in front of a stuck batcher; want at most %d", n, passes, queue, queue+2)
	}
	if d, n := e.Dropped(), made.n.Load(); int64(d) < passes-n {
		t.Errorf("%d passes dropped and %d spans made; want every pass not queued counted as dropped", d, n)
	}
	close(blocked.release)
}

// Proves: an OTEL_TRACES_EXPORTER PEPSI does not have is refused at New, with
// or without an endpoint, rather than taken for OTLP or for off; "none" and
// "otlp" are taken.
func TestAnExporterPEPSIDoesNotHaveIsRefused(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	for _, x := range []string{"console", "otlp,console", "zipkin"} {
		t.Setenv("OTEL_TRACES_EXPORTER", x)
		if _, err := New(context.Background(), "test", slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER="+x) {
			t.Errorf("OTEL_TRACES_EXPORTER=%s without an endpoint: %v; want it refused, named", x, err)
		}
	}
	for _, x := range []string{"none", "otlp", "OTLP"} {
		t.Setenv("OTEL_TRACES_EXPORTER", x)
		if e, err := New(context.Background(), "test", slog.New(slog.DiscardHandler)); err != nil || e != nil {
			t.Errorf("OTEL_TRACES_EXPORTER=%s without an endpoint: %v, %v; want no exporter and no error", x, e, err)
		}
	}
}

// Proves: an endpoint the exporter would not take over http/protobuf is
// refused, naming the variable the SDK uses for traces (the _TRACES_ one
// overrides the other, which is then not looked at); grpc's targets
// (host:port, unix:, dns:) are left to its exporter.
func TestAnEndpointIsCheckedAsTheExporterWouldTakeIt(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string // "" for taken
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "::bad"}, "OTEL_EXPORTER_OTLP_ENDPOINT=::bad: not an endpoint URL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "not an endpoint URL"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:4318/otlp"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "::bad", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c.example:4318/v1/traces"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "::bad"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=::bad"},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, ""},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "unix:///run/otel.sock", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, ""},
	} {
		getenv := func(k string) string { return c.env[k] }
		err := checkEndpoints(getenv)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v; want it taken", c.env, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v; want %q", c.env, err, c.want)
		}
	}
}

// Proves: a batcher size that is not a positive whole number falls back to
// the default, as the queue's does, rather than making the SDK panic at
// start (it read OTEL_BSP_MAX_QUEUE_SIZE=-5 itself and made a slice of
// negative capacity).
func TestBadBatcherSizesFallBackInsteadOfPanicking(t *testing.T) {
	for _, kv := range [][2]string{
		{"OTEL_BSP_MAX_QUEUE_SIZE", "-5"},
		{"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "-1"},
		{"OTEL_BSP_MAX_QUEUE_SIZE", "0"},
	} {
		t.Run(kv[0]+"="+kv[1], func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			t.Setenv(kv[0], kv[1])
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("New panicked: %v", r)
				}
			}()
			e, err := New(context.Background(), "test", slog.New(slog.DiscardHandler))
			if err != nil || e == nil {
				t.Fatalf("New = %v, %v; want an exporter", e, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = e.Shutdown(ctx)
		})
	}
	for _, tc := range []struct {
		env        string
		size, want int
	}{{"", 2048, 512}, {"-1", 2048, 512}, {"0", 2048, 512}, {"100", 2048, 100}, {"4096", 2048, 512}, {"", 16, 16}, {"32", 16, 16}} {
		if got := batchSize(func(string) string { return tc.env }, tc.size); got != tc.want {
			t.Errorf("batchSize(%q, %d) = %d, want %d", tc.env, tc.size, got, tc.want)
		}
	}
}

// Proves: the first span dropped for a full queue is logged, once however
// many follow: a collector that never answers fails no export for half a
// minute or more, and the log must not stay silent while spans are lost.
func TestTheFirstDroppedSpanIsLoggedOnce(t *testing.T) {
	const passes, queue = 100, 4
	blocked := stuck{release: make(chan struct{})}
	defer close(blocked.release)
	var buf lockedbuf.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	e := &Exporter{passes: make(chan core.Pass, queue), names: map[string]string{}, done: make(chan struct{}), log: log}
	e.dropped.log = log
	e.spans = newQueueing(blocked, queue, &e.dropped)
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans), sdktrace.WithIDGenerator(ids{}))
	e.tracer = e.tp.Tracer("test")
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for i := range passes {
		e.Pass(core.Pass{ID: int64(i + 1), Stage: "a", Outcome: core.PassDone, Handed: t0, Ended: t0.Add(time.Millisecond),
			Trace: core.Trace{Pass: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}})
	}
	if e.Dropped() == 0 {
		t.Fatalf("no pass dropped with %d passes into a queue of %d", passes, queue)
	}
	if n := strings.Count(buf.String(), "spans are being dropped"); n != 1 {
		t.Errorf("%d lines about dropped spans for %d drops; want 1:\n%s", n, e.Dropped(), buf.String())
	}
}
