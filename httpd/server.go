package httpd

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

//go:embed assets
var assets embed.FS

// healthTimeout bounds /healthz's question to the database.
const healthTimeout = 3 * time.Second

// Server timeouts: a slow or stuck client cannot hold a connection for long.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 60 * time.Second
	headerBytesMax    = 16 << 10
)

// NewServer returns an http.Server for addr that serves src: /metrics, /healthz,
// /api/status and the page at /, with timeouts set.
func NewServer(addr string, src *Source) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           Handler(src),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    headerBytesMax,
	}
}

// Handler serves src's routes. /metrics also has the Go runtime's and the
// process's own metrics (go_*, process_*) of pepsi-httpd.
func Handler(src *Source) http.Handler {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(src), collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(fmt.Sprintf("httpd: embedded assets: %v", err)) // a build without them is a bug
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, MaxRequestsInFlight: 10, Timeout: collectTimeout + time.Second,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := src.Ping(r.Context(), healthTimeout); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "database unreachable: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ok: the database answers")
	})
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, status(r.Context(), src))
	})
	mux.Handle("GET /", http.FileServerFS(static))
	return secure(mux)
}

// Status is the answer of /api/status, which feeds the page.
type Status struct {
	// OK says the latest read succeeded; Error is why not.
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Snapshot is the latest good read (nil before the first one).
	Snapshot *Snapshot `json:"snapshot"`
	// History holds the samples for the charts, oldest first.
	History []Sample `json:"history"`
	// SampleSeconds is the interval between samples.
	SampleSeconds float64 `json:"sample_seconds"`
}

func status(ctx context.Context, src *Source) Status {
	st := Status{SampleSeconds: src.opts.SampleInterval.Seconds()}
	snap, err := src.Snapshot(ctx)
	if err != nil {
		st.Error = err.Error()
		snap, _ = src.Last()
	} else {
		st.OK = true
	}
	st.Snapshot = snap
	st.History = src.History()
	return st
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		// The client went away; nothing to tell it.
		return
	}
}

// secure adds headers that keep the page to its own assets.
func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}
