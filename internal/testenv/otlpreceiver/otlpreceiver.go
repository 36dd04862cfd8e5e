// Package otlpreceiver is an OpenTelemetry collector's trace receiver for
// tests: an HTTP server that takes OTLP/HTTP export requests (protobuf, the
// official go.opentelemetry.io/proto/otlp types) on /v1/traces, as a
// collector's port 4318 does, or a gRPC server of the trace service, as its
// port 4317 does, and keeps the spans it got. It is test
// infrastructure; no program of the product uses it.
package otlpreceiver

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Span is one span the receiver got, its ids in hex, its attributes as text.
type Span struct {
	Service               string
	TraceID, SpanID       string
	ParentSpanID          string // "" for a root
	Name, Kind            string // Kind as OTLP names it: SPAN_KIND_CONSUMER, ...
	Start, End            time.Time
	Attributes            map[string]string
	Events                []string
	StatusCode, StatusMsg string
}

func (s Span) String() string {
	return fmt.Sprintf("%s %s trace=%s span=%s parent=%s %v", s.Service, s.Name, s.TraceID, s.SpanID, s.ParentSpanID, s.Attributes)
}

// Receiver is a running receiver.
type Receiver struct {
	srv   *httptest.Server // nil for a gRPC receiver
	url   string           // a gRPC receiver's
	stop  func()           // closes the server, either kind
	count bool
	n     atomic.Int64
	mu    sync.Mutex
	spans []Span
}

// Start starts a receiver, closed when t ends.
func Start(t testing.TB) *Receiver {
	r := &Receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// Counting starts a receiver that only counts the spans (Count), keeping
// none: for a benchmark, which sends more spans than are worth keeping. It
// walks each request's protobuf wire format down to its spans (countSpans)
// rather than decoding it into the OTLP types, so that on a benchmark's
// machine it takes as little as a receiver can of the CPU the measured
// programs share with it (a collector usually runs elsewhere). Close stops it.
func Counting() *Receiver {
	r := &Receiver{count: true}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	return r
}

// StartGRPC starts a receiver that takes OTLP over gRPC, as a collector's
// port 4317 does, closed when t ends. Its URL has the scheme http: a
// connection without TLS, as the exporter reads it.
func StartGRPC(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("gRPC receiver: %v", err)
	}
	srv := grpc.NewServer()
	r := &Receiver{url: "http://" + ln.Addr().String(), stop: srv.Stop}
	coltracepb.RegisterTraceServiceServer(srv, grpcTraces{r: r})
	go srv.Serve(ln) //nolint:errcheck // ends with Stop
	t.Cleanup(r.Close)
	return r
}

// grpcTraces is the receiver's gRPC trace service.
type grpcTraces struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (g grpcTraces) Export(_ context.Context, ex *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.r.take(ex)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// Close stops the receiver.
func (r *Receiver) Close() {
	if r.stop != nil {
		r.stop()
		return
	}
	r.srv.Close()
}

// Count is how many spans the receiver got.
func (r *Receiver) Count() int64 { return r.n.Load() }

// URL is the receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
func (r *Receiver) URL() string {
	if r.url != "" {
		return r.url
	}
	return r.srv.URL
}

// Spans returns a copy of the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitFor waits until cond holds of the spans received, and fails t if it
// does not within timeout (a bound on a hang, not a measure).
func (r *Receiver) WaitFor(t testing.TB, timeout time.Duration, what string, cond func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := r.Spans()
		if cond(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("the receiver did not get %s within %s; it got %d spans: %v", what, timeout, len(spans), spans)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost {
		http.Error(w, "want POST /v1/traces", http.StatusNotFound)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.count {
		n, err := countSpans(b)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.n.Add(int64(n))
	} else {
		var ex coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &ex); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.take(&ex)
	}
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out) //nolint:errcheck // the exporter retries
}

// take keeps the spans of one export request.
func (r *Receiver) take(ex *coltracepb.ExportTraceServiceRequest) {
	var got []Span
	for _, rs := range ex.GetResourceSpans() {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Service: service, TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind().String(),
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attributes: attrs(s.GetAttributes()), StatusCode: s.GetStatus().GetCode().String(), StatusMsg: s.GetStatus().GetMessage()}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, e.GetName())
				}
				got = append(got, sp)
			}
		}
	}
	r.n.Add(int64(len(got)))
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.mu.Unlock()
}

// countSpans counts the spans of an encoded ExportTraceServiceRequest by
// walking its wire format: resource_spans (field 1), their scope_spans
// (field 2), their spans (field 2). A request that is not well-formed
// protobuf is an error.
func countSpans(b []byte) (int, error) {
	n := 0
	err := eachField(b, 1, func(rs []byte) error {
		return eachField(rs, 2, func(ss []byte) error {
			return eachField(ss, 2, func([]byte) error { n++; return nil })
		})
	})
	return n, err
}

// eachField calls f with the bytes of every length-delimited field number
// num of the message b, and skips every other field.
func eachField(b []byte, num protowire.Number, f func([]byte) error) error {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
		if n == num && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return protowire.ParseError(l)
			}
			if err := f(v); err != nil {
				return err
			}
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
	}
	return nil
}

// attrs renders OTLP attributes as text.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// Silent listens on a loopback port as a collector that has stopped
// answering: it takes each connection and never reads from it nor answers.
// It returns the collector's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT, and
// how to stop it (its connections closed).
func Silent() (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return "http://" + ln.Addr().String(), func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}, nil
}
