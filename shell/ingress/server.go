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
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	MaxPending      int64
	PendingInterval time.Duration
	// BatchMax, BatchWait, BatchIdle and Committers shape the group commit;
	// a BatchIdle of 0 has every batch gather for the whole BatchWait.
	BatchMax   int
	BatchWait  time.Duration
	BatchIdle  time.Duration
	Committers int
	// InFlightMax bounds the requests handled at once.
	InFlightMax int
	// Tokens, when not nil, are the bearer tokens every request must present.
	Tokens *Tokens
	// Log gets one line per refused request (never a payload) and per fault.
	Log *slog.Logger
}

// Server handles pepsi-ingress's requests: POST /v1/messages, GET /healthz and
// GET /metrics.
type Server struct {
	o       Options
	known   map[string]bool
	c       *committer
	m       *metrics
	mux     *http.ServeMux
	slots   chan struct{}
	pending atomic.Pointer[map[string]int64]
	stop    context.CancelFunc
	wg      sync.WaitGroup
	closed  sync.Once
}

// New starts a Server's committers (and, with MaxPending, its pending counts).
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
	if o.PendingInterval <= 0 {
		o.PendingInterval = PendingIntervalDefault
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{o: o, known: map[string]bool{}, m: newMetrics(), mux: http.NewServeMux(),
		slots: make(chan struct{}, o.InFlightMax)}
	for _, st := range o.Stages {
		s.known[st] = true
	}
	s.c = newCommitter(o.Pool, o.Committers, o.BatchMax, o.BatchWait, o.BatchIdle, s.m, o.Log)
	s.mux.HandleFunc("/v1/messages", s.messages)
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	if o.MaxPending > 0 {
		s.wg.Add(1)
		go s.countPending(ctx)
	}
	return s
}

// ServeHTTP serves the Server's routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

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
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	ids, st := s.take(w, r)
	code := http.StatusAccepted
	if st != nil {
		code = st.Code
		if st.Code == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", http.MethodPost)
		}
		if st.Code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pepsi-ingress"`)
		}
		if st.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(st.RetryAfter))
		}
		level := slog.LevelDebug
		if code >= 500 {
			level = slog.LevelWarn
		}
		// The reason may quote the client's input (never a payload); a debug
		// log is the operator's choice.
		s.o.Log.Log(r.Context(), level, "request refused", "code", code, "remote", r.RemoteAddr)
	}
	w.Header()["Content-Type"] = jsonType
	if st != nil {
		s.m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(map[string]string{"error": st.Msg}) //nolint:errcheck // the client may be gone
		return
	}
	s.m.accepted.Add(float64(len(ids)))
	s.m.requests202.Inc()
	w.WriteHeader(code)
	w.Write(idsAnswer(ids)) //nolint:errcheck // the client may be gone
}

// jsonType is the Content-Type of every answer to /v1/messages, one slice
// for all of them (net/http only reads it).
var jsonType = []string{"application/json"}

// idsAnswer is the body of a 202, {"ids":[...]} and a newline, as
// encoding/json's Encoder writes it, without its reflection: it is written
// once per request.
func idsAnswer(ids []int64) []byte {
	b := make([]byte, 0, 10+len(ids)*8)
	b = append(b, `{"ids":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return append(b, "]}\n"...)
}

// take checks, reads and commits one request.
func (s *Server) take(w http.ResponseWriter, r *http.Request) ([]int64, *Status) {
	if r.Method != http.MethodPost {
		return nil, statusf(http.StatusMethodNotAllowed, "want POST")
	}
	if s.o.Tokens != nil && !s.o.Tokens.Allow(r.Header.Get("Authorization")) {
		return nil, statusf(http.StatusUnauthorized, "want Authorization: Bearer TOKEN with a valid token")
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
	if r.ContentLength > s.o.Limits.Body {
		return nil, readStatus(&http.MaxBytesError{Limit: s.o.Limits.Body}, s.o.Limits)
	}
	body := http.MaxBytesReader(w, r.Body, s.o.Limits.Body)
	msgs, st := ParseBody(body, r.Header.Get("Content-Type"), r.URL.Query().Get("stage"), s.o.Limits, func(st string) bool { return s.known[st] })
	if st != nil {
		return nil, st
	}
	if s.o.MaxPending > 0 {
		if counts := s.pending.Load(); counts != nil {
			for _, m := range msgs {
				if n := (*counts)[m.Stage]; n > s.o.MaxPending {
					return nil, &Status{Code: http.StatusServiceUnavailable, RetryAfter: 1,
						Msg: "stage " + strconv.Quote(m.Stage) + " has more than " + strconv.FormatInt(s.o.MaxPending, 10) + " pending messages (MAX_PENDING); nothing of this request was committed"}
				}
			}
		}
	}
	return s.c.commit(msgs)
}

// countPending reads the pending counts of every stage, at most
// MaxPending + 1 each, every PendingInterval. Failing, it forgets them: the
// commits then tell whether the database is there.
func (s *Server) countPending(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.o.PendingInterval)
	defer t.Stop()
	for {
		qctx, cancel := context.WithTimeout(ctx, s.o.PendingInterval+time.Second)
		counts, err := countPending(qctx, s.o.Pool, s.o.Stages, s.o.MaxPending+1)
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

// healthz is GET /healthz: 200 when the database answers, 503 when not.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.o.Pool.Ping(ctx); err != nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "the database does not answer", http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ok\n")) //nolint:errcheck // the client may be gone
}

// Timeouts bound how long a client may take, so that slow or stalled clients
// (slowloris) cannot hold connections and memory.
type Timeouts struct {
	// ReadHeader bounds the request line and headers.
	ReadHeader time.Duration
	// Read bounds the whole request, body included: a body not received in
	// time is answered 408 and nothing of it is inserted.
	Read time.Duration
	// Write bounds the time from the end of the headers to the end of the
	// answer, commit included.
	Write time.Duration
	// Idle bounds a keep-alive connection between requests.
	Idle time.Duration
}

// TimeoutsDefault are pepsi-ingress's defaults.
var TimeoutsDefault = Timeouts{ReadHeader: 5 * time.Second, Read: 30 * time.Second, Write: 60 * time.Second, Idle: 120 * time.Second}

// HTTPServer is the http.Server for h with timeouts t and small headers; its
// own complaints (bad TLS handshakes, ...) go to errorLog at debug level.
func HTTPServer(h http.Handler, t Timeouts, errorLog *slog.Logger) *http.Server {
	if errorLog == nil {
		errorLog = slog.New(slog.DiscardHandler)
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Write,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(errorLog.Handler(), slog.LevelDebug),
	}
}

// WithPool is o with its Pool set.
func (o Options) WithPool(p *pgxpool.Pool) Options {
	o.Pool = p
	return o
}
