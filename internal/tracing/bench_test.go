package tracing

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
)

// BenchmarkPassSpans measures what a pass's span costs pepsi-dispatch: made,
// batched, encoded and sent, to a collector that reads each request and
// answers at once (its decoding is the collector's, not measured). Run with
// -cpu 1, as pepsi-dispatch runs: ns/op is then CPU per span.
func BenchmarkPassSpans(b *testing.B) {
	var bytes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		bytes.Add(n)
	}))
	defer srv.Close()
	b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	b.Setenv("OTEL_TRACES_SAMPLER", "always_on")
	b.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "200000") // no span dropped: every one is made and sent
	e, err := New(context.Background(), "bench", slog.New(slog.DiscardHandler))
	if err != nil || e == nil {
		b.Fatalf("New = %v, %v", e, err)
	}
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	p := core.Pass{ID: 812345, Stage: "deliver", PID: 4242, Outcome: core.PassAdvance, To: "archive",
		Claimed: t0, Handed: t0.Add(time.Millisecond), Ended: t0.Add(3 * time.Millisecond),
		Trace: core.Trace{Message: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Pass: "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"}}
	b.ResetTimer()
	for i := range b.N {
		p.ID = int64(i)
		for sent := false; !sent; {
			select {
			case e.passes <- p:
				sent = true
			default:
				runtime.Gosched()
			}
		}
	}
	if err := e.Shutdown(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if d := e.Dropped(); d > 0 {
		b.Fatalf("%d spans dropped", d)
	}
	b.ReportMetric(float64(bytes.Load())/float64(b.N), "B/span-sent")
}
