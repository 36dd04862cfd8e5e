// Package ingress is pepsi-ingress's HTTP side: it takes messages at
// POST /v1/messages (JSON or NDJSON), commits the messages of concurrent
// requests together (group commit), answers 202 with their ids only once they
// are committed, and refuses what it cannot take (bad input, missing tokens, a
// database that is down or a stage too far behind) with a status code that
// says so. Its SQL is in sql.go.
//
// It must never answer 202 for a message that is not committed, never commit
// part of a request, never insert around pepsi.queue's triggers, and never
// write a payload to its log.
package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/pepsi-pipeline/pepsi/internal/bearer"
	"github.com/pepsi-pipeline/pepsi/internal/msgjson"
	"github.com/pepsi-pipeline/pepsi/internal/tracing"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Defaults of the limits that pepsi.conf does not set.
const (
	// LineMaxDefault bounds one message (one NDJSON line, or a JSON body).
	LineMaxDefault = 1 << 20
	// MessagesMaxDefault bounds the messages of one request.
	MessagesMaxDefault = 10000
	// InFlightMaxDefault bounds the requests being read or committed at once;
	// more get 503 at once, so memory stays below InFlightMax × MAX_BODY.
	InFlightMaxDefault = 256
	// PendingIntervalDefault is how often the pending counts behind
	// MAX_PENDING are read.
	PendingIntervalDefault = time.Second
)

// Options configure a Server.
type Options struct {
	// Pool is the database; its size should be at least Committers + 2.
	Pool *pgxpool.Pool
	// Stages are the configured stages: a message for any other is refused.
	Stages []string
	// Limits bound one request.
	Limits Limits
	// MaxPending, when positive, refuses (503) requests for a stage with more
	// pending messages, as last counted (every PendingInterval).
	// StageMaxPending holds the stages' own MAX_PENDING, which wins over
	// MaxPending for their stage (conf.Config.PendingLimitOf).
	MaxPending      int64
	StageMaxPending map[string]int64
	PendingInterval time.Duration
	// BatchMax, BatchWait, BatchIdle and Committers shape the group commit;
	// a BatchIdle of 0 has a batch commit as soon as no other is in flight,
	// one of BatchWait or more has every batch gather for the whole BatchWait.
	BatchMax   int
	BatchWait  time.Duration
	BatchIdle  time.Duration
	Committers int
	// InFlightMax bounds the requests handled at once.
	InFlightMax int
	// Tokens, when not nil, are the bearer tokens every request must present.
	Tokens *bearer.Tokens
	// RefusedLogEvery is how often, at most, a request refused for its token
	// is logged at warn level (the others in between are counted in the next
	// such line); default RefusedLogEveryDefault.
	RefusedLogEvery time.Duration
	// Log gets one line per refused request (never a payload) and per fault.
	Log *slog.Logger
	// Traces, when not nil, exports a span per request to /v1/messages,
	// whose traceparent the request's messages without one of their own
	// take (docs/pepsi-ingress.8.md, TRACES). Nil: off.
	Traces *tracing.Exporter
}

// Server handles pepsi-ingress's requests: POST /v1/messages, GET /healthz and
// GET /metrics.
type Server struct {
	o     Options
	known map[string]bool
	c     *committer
	m     *metrics
	// metricsHandler is client_golang's, through net/http's interface: it is
	// not on the path of a message.
	metricsHandler fasthttp.RequestHandler
	slots          chan struct{}
	pending        atomic.Pointer[map[string]int64]
	stop           context.CancelFunc
	wg             sync.WaitGroup
	closed         sync.Once
	refused        refusals
}

// RefusedLogEveryDefault is Options.RefusedLogEvery's default: a client with
// a bad token is seen within seconds, and one retrying in a loop writes a line
// every 10 s, not one per request.
const RefusedLogEveryDefault = 10 * time.Second

// refusals rate-limits the warnings about requests refused for their token.
type refusals struct {
	mu     sync.Mutex
	last   time.Time // when the last warning was logged
	unsaid int       // refusals since, not logged
}

// warnRefused logs, at most every RefusedLogEvery, that a request from remote
// was refused for its token (why says how it was wrong), with the number of
// refusals not logged since the last line. Never the token itself.
func (s *Server) warnRefused(remote, why string) {
	r := &s.refused
	r.mu.Lock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < s.o.RefusedLogEvery {
		r.unsaid++
		r.mu.Unlock()
		return
	}
	unsaid := r.unsaid
	r.last, r.unsaid = now, 0
	r.mu.Unlock()
	s.o.Log.Warn("request refused: no valid bearer token", "remote", remote, "why", why,
		"refused_unlogged", unsaid, "log_every", s.o.RefusedLogEvery)
}

// tokenProblem says how an Authorization header that Tokens refused is wrong,
// without quoting it.
func tokenProblem(header []byte) string {
	switch {
	case len(header) == 0:
		return "no Authorization header"
	case !bytes.HasPrefix(bytes.ToLower(header), []byte("bearer ")):
		return "not a Bearer token"
	}
	return "a token not in TOKENS_FILE"
}

// New starts a Server's committers (and, with a MAX_PENDING, its pending
// counts).
// Close stops them.
func New(o Options) *Server {
	if o.BatchMax <= 0 {
		o.BatchMax = BatchMaxDefault
	}
	if o.Committers <= 0 {
		o.Committers = CommittersDefault
	}
	if o.InFlightMax <= 0 {
		o.InFlightMax = InFlightMaxDefault
	}
	if o.RefusedLogEvery <= 0 {
		o.RefusedLogEvery = RefusedLogEveryDefault
	}
	if o.PendingInterval <= 0 {
		o.PendingInterval = PendingIntervalDefault
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{o: o, known: map[string]bool{}, m: newMetrics(o.Traces),
		slots: make(chan struct{}, o.InFlightMax)}
	for _, st := range o.Stages {
		s.known[st] = true
	}
	s.c = newCommitter(o.Pool, o.Committers, o.BatchMax, o.BatchWait, o.BatchIdle, s.m, o.Log)
	s.metricsHandler = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	if s.countUpTo() > 0 {
		s.wg.Add(1)
		go s.countPending(ctx)
	}
	return s
}

// limitOf is the MAX_PENDING of stage: its own, or else [pepsi-ingress]'s; 0
// for none.
func (s *Server) limitOf(stage string) int64 {
	if n := s.o.StageMaxPending[stage]; n > 0 {
		return n
	}
	return s.o.MaxPending
}

// countUpTo is how far the pending counts must go: one past the largest
// limit of any stage (0 when no stage has one).
func (s *Server) countUpTo() int64 {
	var most int64
	for _, st := range s.o.Stages {
		most = max(most, s.limitOf(st))
	}
	if most == 0 {
		return 0
	}
	return most + 1
}

// Handle serves the Server's routes; HTTPServer's server calls it.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/v1/messages":
		s.messages(ctx)
	case "/healthz":
		if getOrHead(ctx) {
			s.healthz(ctx)
		}
	case "/metrics":
		if getOrHead(ctx) {
			s.metricsHandler(ctx)
		}
	default:
		plainError(ctx, "404 page not found", fasthttp.StatusNotFound)
	}
}

// getOrHead answers 405 to a method other than GET and HEAD, as net/http's
// ServeMux did for the GET routes.
func getOrHead(ctx *fasthttp.RequestCtx) bool {
	if ctx.IsGet() || ctx.IsHead() {
		return true
	}
	ctx.Response.Header.Set("Allow", "GET, HEAD")
	plainError(ctx, "Method Not Allowed", fasthttp.StatusMethodNotAllowed)
	return false
}

// plainError answers code with msg and a newline as plain text, as
// net/http's Error does.
func plainError(ctx *fasthttp.RequestCtx, msg string, code int) {
	ctx.Response.Header.Set("X-Content-Type-Options", "nosniff")
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetStatusCode(code)
	ctx.SetBodyString(msg + "\n")
}

// Close stops the committers once every request handed to them is answered.
// Call it after the HTTP server has shut down; a request that reaches the
// commit after it gets 503. Calling it again does nothing.
func (s *Server) Close() {
	s.closed.Do(func() {
		s.stop()
		s.wg.Wait()
		s.c.close()
	})
}

// messages is POST /v1/messages.
func (s *Server) messages(ctx *fasthttp.RequestCtx) {
	span := s.o.Traces.StartRequest(string(ctx.Request.Header.Peek("traceparent")), "POST", "/v1/messages")
	body := bodies.Get().(*[]byte)
	ids, st := s.take(ctx, body, span)
	s.answer(ctx, ids, st)
	span.End(ctx.Response.StatusCode(), len(ids))
	// The messages may point into the body; nothing reads them once their
	// commit is answered.
	if cap(*body) <= bodyPooledMax {
		*body = (*body)[:0]
		bodies.Put(body)
	}
}

// bodies are buffers for request bodies, reused: a body is read whole before
// it is parsed.
var bodies = sync.Pool{New: func() any { return new([]byte) }}

// bodyPooledMax is the largest body buffer kept for reuse.
const bodyPooledMax = 1 << 20

// answer writes the answer to a request of /v1/messages: 202 and the ids, or
// st.
func (s *Server) answer(ctx *fasthttp.RequestCtx, ids []int64, st *Status) {
	ctx.SetContentType(ContentJSON)
	if st == nil {
		s.m.accepted.Add(float64(len(ids)))
		s.m.requests202.Inc()
		ctx.SetStatusCode(http.StatusAccepted)
		var b [256]byte
		ctx.Write(appendIDs(b[:0], ids)) //nolint:errcheck // it appends to the answer's buffer
		return
	}
	code := st.Code
	if code == http.StatusMethodNotAllowed {
		ctx.Response.Header.Set("Allow", http.MethodPost)
	}
	if code == http.StatusUnsupportedMediaType {
		// RFC 9110: a 415 says which content codings the server takes.
		ctx.Response.Header.Set("Accept-Encoding", "identity")
	}
	if code == http.StatusUnauthorized {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="pepsi-ingress"`)
	}
	if st.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(st.RetryAfter))
	}
	level := slog.LevelDebug
	if code >= 500 {
		level = slog.LevelWarn
	}
	// The reason may quote the client's input (never a payload); a debug
	// log is the operator's choice.
	s.o.Log.Log(context.Background(), level, "request refused", "code", code, "remote", ctx.RemoteAddr().String())
	s.m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
	ctx.SetStatusCode(code)
	json.NewEncoder(ctx).Encode(map[string]string{"error": st.Msg}) //nolint:errcheck // it appends to the answer's buffer
}

// idsAnswer is the body of a 202, {"ids":[...]} and a newline, as
// encoding/json's Encoder writes it, without its reflection: it is written
// once per request.
func idsAnswer(ids []int64) []byte { return appendIDs(make([]byte, 0, 10+len(ids)*8), ids) }

// appendIDs appends idsAnswer(ids) to b.
func appendIDs(b []byte, ids []int64) []byte {
	b = append(b, `{"ids":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return append(b, "]}\n"...)
}

// take checks, reads and commits one request; it reads the body into *body.
func (s *Server) take(ctx *fasthttp.RequestCtx, body *[]byte, span *tracing.Request) ([]int64, *Status) {
	if !ctx.IsPost() {
		return nil, statusf(http.StatusMethodNotAllowed, "want POST")
	}
	if auth := ctx.Request.Header.Peek("Authorization"); s.o.Tokens != nil && !s.o.Tokens.Allow(string(auth)) {
		s.warnRefused(ctx.RemoteAddr().String(), tokenProblem(auth))
		return nil, statusf(http.StatusUnauthorized, "want Authorization: Bearer TOKEN with a valid token")
	}
	// Before the body is read (past what fasthttp reads with the headers),
	// and before a slot or the database: a request to a stage that does not
	// exist can never succeed, so it is told so at once rather than about
	// its body, or to retry (503) what will fail again.
	known := func(st string) bool { return s.known[st] }
	if n := len(ctx.QueryArgs().PeekMulti("stage")); n > 1 {
		// The first would be taken and the others never checked: a URL
		// built by appending a stage to one that had one goes elsewhere.
		return nil, statusf(http.StatusBadRequest, "?stage= given %d times: give it once", n)
	}
	stage := string(ctx.QueryArgs().Peek("stage"))
	if st := stageParamStatus(stage, known); st != nil {
		return nil, st
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		return nil, &Status{Code: http.StatusServiceUnavailable, Msg: "too many requests at once", RetryAfter: 1}
	}
	if s.c.down() {
		return nil, unreachable()
	}
	length := int64(ctx.Request.Header.ContentLength()) // -1: chunked; -2: none, so no body
	if length > s.o.Limits.Body {
		return nil, readStatus(&http.MaxBytesError{Limit: s.o.Limits.Body}, s.o.Limits)
	}
	mt, st := mediaType(ctx.Request.Header.ContentType())
	if st != nil {
		return nil, st
	}
	if st := encodingStatus(ctx.Request.Header.ContentEncoding()); st != nil {
		return nil, st
	}
	var err error
	if r := ctx.RequestBodyStream(); r != nil {
		*body, err = readBody(*body, r, length, s.o.Limits.Body)
	} else {
		*body = append(*body, ctx.Request.Body()...)
	}
	if err != nil {
		return nil, readStatus(err, s.o.Limits)
	}
	msgs, st := parseBody(*body, mt, stage, s.o.Limits, known)
	if st != nil {
		return nil, st
	}
	if st := headerTrace(ctx, msgs, span.TraceParent()); st != nil {
		return nil, st
	}
	if counts := s.pending.Load(); counts != nil {
		for _, m := range msgs {
			if limit := s.limitOf(m.Stage); limit > 0 && (*counts)[m.Stage] > limit {
				return nil, &Status{Code: http.StatusServiceUnavailable, RetryAfter: 1,
					Msg: "stage " + strconv.Quote(m.Stage) + " has more than " + strconv.FormatInt(limit, 10) + " pending messages (MAX_PENDING); nothing of this request was committed"}
			}
		}
	}
	return s.c.commit(msgs)
}

// headerTrace gives the request's W3C traceparent header, if it has one, to
// each of msgs that has no traceparent field (docs/pepsi-ingress.8.md); or,
// when the request has a span (spanTP, "" for none), the span's traceparent,
// a child of the header. A header that is not a version 00 traceparent is a
// 400, as a bad field is: the producer asked for a trace it would not get.
// tracestate is not kept (the queue has no column for it).
func headerTrace(ctx *fasthttp.RequestCtx, msgs []msgjson.Message, spanTP string) *Status {
	h := ctx.Request.Header.Peek("traceparent")
	tp := string(h)
	if h != nil {
		if err := msgjson.CheckTraceParent(tp); err != nil {
			return statusf(http.StatusBadRequest, "header %v; nothing of this request was committed", err)
		}
	}
	if spanTP != "" {
		tp = spanTP
	}
	if tp == "" {
		return nil
	}
	for i := range msgs {
		if msgs[i].TraceParent == "" {
			msgs[i].TraceParent = tp
		}
	}
	return nil
}

// readBody appends the body r to b: at most limit bytes (more is an
// http.MaxBytesError) and, when length is not negative, length bytes (fewer is
// io.ErrUnexpectedEOF: the client closed the connection mid-body).
func readBody(b []byte, r io.Reader, length, limit int64) ([]byte, error) {
	switch {
	case length >= 0 && int64(cap(b)-len(b)) < length:
		b = slices.Grow(b, int(length))
	case length < 0 && cap(b)-len(b) < 512:
		b = slices.Grow(b, 512)
	}
	start := len(b)
	for {
		if length >= 0 && int64(len(b)-start) == length {
			return b, nil
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)-start) > limit {
			return b, &http.MaxBytesError{Limit: limit}
		}
		if err == io.EOF {
			if length >= 0 && int64(len(b)-start) < length {
				return b, io.ErrUnexpectedEOF
			}
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// countPending reads the pending counts of every stage, at most one past the
// largest MAX_PENDING each (countUpTo), every PendingInterval. Failing, it forgets them: the
// commits then tell whether the database is there.
func (s *Server) countPending(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.o.PendingInterval)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, s.o.PendingInterval+time.Second)
		counts, err := store.On(s.o.Pool).CountPending(qctx, s.o.Stages, s.countUpTo())
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.o.Log.Warn("cannot count pending messages for MAX_PENDING", "err", err)
			counts = nil
		}
		if counts == nil {
			s.pending.Store(nil)
		} else {
			s.pending.Store(&counts)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// healthz is GET /healthz: 200 when the database answers and takes writes,
// 503 when not. A read-only server (a standby the address still leads to
// during a failover) answers pings but refuses every insert, so a load
// balancer must be told to send the requests elsewhere.
func (s *Server) healthz(ctx *fasthttp.RequestCtx) {
	pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var readOnly string
	if err := s.o.Pool.QueryRow(pctx, `SELECT current_setting('transaction_read_only')`).Scan(&readOnly); err != nil {
		ctx.Response.Header.Set("Retry-After", "1")
		plainError(ctx, "the database does not answer", http.StatusServiceUnavailable)
		return
	}
	if readOnly == "on" {
		ctx.Response.Header.Set("Retry-After", "1")
		plainError(ctx, "the database is read-only (a standby, or a failover under way)", http.StatusServiceUnavailable)
		return
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("ok\n")
}

// Timeouts bound how long a client may take, so that slow or stalled clients
// (slowloris) cannot hold connections and memory.
type Timeouts struct {
	// ReadHeader bounds the request line and headers (from the connection's
	// start for its first request, from the first byte for the next ones).
	ReadHeader time.Duration
	// Read bounds the body, from the end of the headers: a body not received
	// in time is answered 408 and nothing of it is inserted.
	Read time.Duration
	// Write bounds the time from the end of the headers to the end of the
	// answer, commit included.
	Write time.Duration
	// Idle bounds a keep-alive connection between requests.
	Idle time.Duration
}

// TimeoutsDefault are pepsi-ingress's defaults.
var TimeoutsDefault = Timeouts{ReadHeader: 5 * time.Second, Read: 30 * time.Second, Write: 60 * time.Second, Idle: 120 * time.Second}

// HTTPServer is fasthttp's Server for s, with timeouts t and headers of at
// most 64 KiB; its own complaints (bad TLS handshakes, ...) go to errorLog at
// debug level.
//
// fasthttp rather than net/http: net/http's serving loop was most of
// pepsi-ingress's CPU per request (a background read and several goroutine
// hand-offs per request, a new request and response each time);
// fasthttp's reuses both and serves a connection on one goroutine. It keeps
// what net/http did here: the body of /v1/messages is streamed to the handler
// (StreamRequestBody), so MAX_BODY, a body cut off or too slow are answered
// by the handler's own statuses; what fasthttp reads of a body before the
// handler runs (up to 8 KiB) fails to the same statuses through its
// ErrorHandler.
func HTTPServer(s *Server, t Timeouts, errorLog *slog.Logger) *fasthttp.Server {
	if errorLog == nil {
		errorLog = slog.New(slog.DiscardHandler)
	}
	h := &httpHandler{s: s, write: t.Write}
	return &fasthttp.Server{
		Handler:        h.handle,
		HeaderReceived: h.headerReceived(t.Read),
		ErrorHandler:   h.error,
		// A connection's first request must arrive, and every request's headers
		// be read, within ReadTimeout; HeaderReceived then gives the body Read.
		ReadTimeout: t.ReadHeader,
		IdleTimeout: t.Idle,
		// handle sets the write deadline once the headers are read, so that
		// it bounds the commit too, as net/http's WriteTimeout did; this one
		// bounds the error answers written without it.
		WriteTimeout:       t.Write,
		ReadBufferSize:     headerMax,
		MaxRequestBodySize: int(min(s.o.Limits.Body, math.MaxInt32)),
		StreamRequestBody:  true,
		// An idle keep-alive connection gives its buffers back to a pool:
		// about 18 kB each instead of 22 (docs/performance.md), at no
		// measurable CPU cost. Webhook senders keep many connections idle.
		ReduceMemoryUsage: true,
		// Left on, fasthttp reads a multipart form whole before the handler,
		// past MaxRequestBodySize and before the token is checked, and
		// spools it to files; pepsi-ingress takes no multipart body at all.
		DisablePreParseMultipartForm: true,
		// net/http sent no Server header; a request in flight at shutdown is
		// answered with Connection: close.
		NoDefaultServerHeader: true,
		CloseOnShutdown:       true,
		// fasthttp's errors about a request quote none of it (no token).
		SecureErrorLogMessage: true,
		Logger:                slog.NewLogLogger(errorLog.Handler(), slog.LevelDebug),
	}
}

// headerMax bounds a request's line and headers (net/http's MaxHeaderBytes
// was 64 KiB, plus 4 KiB it allowed over that).
const headerMax = 64<<10 + 4096

// httpHandler is what HTTPServer serves: s's routes, the write deadline, and
// the failures of reading a request before the handler runs.
type httpHandler struct {
	s     *Server
	write time.Duration
	// posting holds the headers of the requests to /v1/messages whose body
	// fasthttp is reading before handle runs: a failure then is the body's,
	// answered as the handler answers it. Its keys are the request headers of
	// fasthttp's RequestCtx, reused request after request.
	posting sync.Map
}

func (h *httpHandler) handle(ctx *fasthttp.RequestCtx) {
	ctx.SetWriteDeadline(time.Now().Add(h.write)) //nolint:errcheck // a connection that failed fails the write too
	if ctx.IsPost() {
		h.posting.Delete(&ctx.Request.Header)
	}
	h.s.Handle(ctx)
}

// headerReceived gives a request's body the read timeout read, from the end
// of its headers, and notes a POST to /v1/messages.
func (h *httpHandler) headerReceived(read time.Duration) func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
	return func(hdr *fasthttp.RequestHeader) fasthttp.RequestConfig {
		if hdr.IsPost() && messagesTarget(hdr.RequestURI()) {
			h.posting.Store(hdr, nil)
		}
		return fasthttp.RequestConfig{ReadTimeout: read}
	}
}

// messagesTarget says whether a request-target is /v1/messages as Handle
// routes it: by ctx.Path(), fasthttp's path of the URI, normalized ("//",
// "./" and %-escapes) and taken out of an absolute-form target
// ("http://host/v1/messages", which RFC 9112 has servers accept). A target
// that Handle serves as /v1/messages but that this missed had a body that
// stalled or was cut off answered by no status at all: the connection was
// closed, not answered 408 or 400, and nothing was counted.
func messagesTarget(target []byte) bool {
	path, _, _ := bytes.Cut(target, []byte("?"))
	if string(path) == "/v1/messages" {
		return true // the usual spelling: no parse on the path of every message
	}
	u := fasthttp.AcquireURI()
	defer fasthttp.ReleaseURI(u)
	if err := u.Parse(nil, target); err != nil {
		return false
	}
	return string(u.Path()) == "/v1/messages"
}

// error answers a request that fasthttp could not read: the body of a POST to
// /v1/messages as the handler answers a body it cannot read (408 too slow,
// 400 cut off, counted); anything else as net/http did: a connection that
// timed out or closed is closed, headers too large are 431, else 400.
func (h *httpHandler) error(ctx *fasthttp.RequestCtx, err error) {
	if _, body := h.posting.LoadAndDelete(&ctx.Request.Header); body {
		h.s.answer(ctx, nil, readStatus(err, h.s.o.Limits))
		return
	}
	var small *fasthttp.ErrSmallBuffer
	var nothing fasthttp.ErrNothingRead
	var netErr net.Error
	switch {
	case errors.As(err, &small):
		jsonError(ctx, fmt.Sprintf("the request's line and headers are longer than %d KiB", headerMax>>10), fasthttp.StatusRequestHeaderFieldsTooLarge)
	case errors.As(err, &nothing), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &netErr):
		ctx.Conn().Close() //nolint:errcheck // closing is all there is to do
	default:
		jsonError(ctx, "the request's line or headers cannot be read as HTTP/1.1", fasthttp.StatusBadRequest)
	}
}

// jsonError answers code with {"error": msg}, as every answer but a 202 to a
// producer is: a request whose headers cannot be read may be a producer's,
// and its client reads the error as JSON.
func jsonError(ctx *fasthttp.RequestCtx, msg string, code int) {
	ctx.Response.Header.Set("X-Content-Type-Options", "nosniff")
	ctx.SetContentType(ContentJSON)
	ctx.SetStatusCode(code)
	json.NewEncoder(ctx).Encode(map[string]string{"error": msg}) //nolint:errcheck // it appends to the answer's buffer
}

// WithPool is o with its Pool set.
func (o Options) WithPool(p *pgxpool.Pool) Options {
	o.Pool = p
	return o
}
