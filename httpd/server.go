package httpd

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/store"
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
// /api/status and the page at /, with timeouts set; and, when acts is not
// nil, the page's actions.
func NewServer(addr string, src *Source, acts *Actions) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           Handler(src, acts),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    headerBytesMax,
	}
}

// Handler serves src's routes. /metrics also has the Go runtime's and the
// process's own metrics (go_*, process_*) of pepsi-httpd. With acts, the
// page offers retry and discard (docs/pepsi-httpd.8.md, "ACTIONS"); without,
// it is read-only and no route acts.
func Handler(src *Source, acts *Actions) http.Handler {
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
	mux.HandleFunc("GET /api/messages/{id}", func(w http.ResponseWriter, r *http.Request) {
		message(w, r, src, acts != nil)
	})
	if acts != nil {
		acts.register(mux)
	} else {
		mux.HandleFunc("GET /api/session", readOnlySession)
	}
	mux.Handle("GET /", http.FileServerFS(static))
	return secure(hostGuard(src.opts.Hosts, src.log, mux))
}

// hostGuard answers 421 to a request for the page or its API whose Host is
// a name pepsi-httpd was not told it is reached by: a website's script can
// make a browser send requests to pepsi-httpd under the site's own name, by
// pointing that name at pepsi-httpd's address once the page is loaded (DNS
// rebinding), and then read the answers, the failures' reasons and the
// messages' histories, as the same origin. An IP address, localhost and
// names under .localhost are never such a name, nor hosts; "*" among hosts
// lets any through. /metrics and /healthz answer whatever the Host: a
// Prometheus scrapes by the name in its configuration.
// The first refusal is logged: an operator whose page went blank after an
// upgrade learns the name to give -hosts.
func hostGuard(hosts []string, log *slog.Logger, h http.Handler) http.Handler {
	allowed := map[string]bool{}
	for _, n := range hosts {
		allowed[canonicalHost(n)] = true
	}
	var logged atomic.Bool
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" || r.URL.Path == "/healthz" || allowed["*"] {
			h.ServeHTTP(w, r)
			return
		}
		host := canonicalHost(r.Host)
		if name, _, err := net.SplitHostPort(r.Host); err == nil {
			host = canonicalHost(name)
		}
		if host == "localhost" || strings.HasSuffix(host, ".localhost") || allowed[host] || net.ParseIP(strings.Trim(host, "[]")) != nil {
			h.ServeHTTP(w, r)
			return
		}
		if !logged.Swap(true) {
			log.Warn("page: a request for a host pepsi-httpd does not answer to refused (421); if operators reach it by this name, give it to -hosts (further ones are not logged)",
				"host", clipHost(r.Host), "remote", r.RemoteAddr)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusMisdirectedRequest)
		fmt.Fprintf(w, "pepsi-httpd does not answer to the host %q: reach it by its IP address, localhost, or a name given to -hosts (pepsi-httpd(8))\n", clipHost(r.Host))
	})
}

// canonicalHost is a host name as hostGuard compares it: lower case,
// without a trailing dot.
func canonicalHost(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// clipHost bounds a Host quoted back (headers may hold 16 KiB).
func clipHost(h string) string {
	if len(h) > 200 {
		return h[:200] + "…"
	}
	return h
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

// Message is one message as the message page shows it (GET
// /api/messages/ID): never its payload nor its state, only who failed it and
// why, its payload's size, its history, its parent and children, and the
// actions the page offers for it.
type Message struct {
	ID     int64          `json:"id"`
	Stage  string         `json:"stage"`
	Status core.RowStatus `json:"status"`
	// Timeout is when a paused message is due; absent for none.
	Timeout   *time.Time `json:"timeout,omitempty"`
	Attempts  int        `json:"attempts"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	By        string     `json:"by"`
	Reason    string     `json:"reason"`
	// OrderKey is the message's order key; absent for none.
	OrderKey string `json:"order_key,omitempty"`
	// WaitsBehind, for a blocked message, is the message of its order key
	// it waits behind (the key's head) and what that one is doing; absent
	// when none is (every older message of the key finished: the dispatcher
	// hands the key on next).
	WaitsBehind *KeyHead `json:"waits_behind,omitempty"`
	// Actions are those that apply to the message now, with ACTIONS = on:
	// retry a failed or timed-out one, discard one that waits (pending,
	// paused, blocked behind its key). Empty on a read-only page.
	Actions []string `json:"actions"`
	// History is what happened to it (pepsi.history), oldest first: its
	// latest store.HistoryLatestMax events; empty when nothing is kept.
	// HistoryOlder says it has older events than those (pepsi-queue history
	// lists them all). HistoryError says why it could not be read (a
	// monitoring role without SELECT on pepsi.history), the rest still shown.
	History      []store.HistoryRow `json:"history"`
	HistoryOlder bool               `json:"history_older,omitempty"`
	HistoryError string             `json:"history_error,omitempty"`
	// PayloadSize is its payload's size in bytes, null for a message without
	// a payload (the bytes are never read: pepsi.payload_size).
	// PayloadSizeError says why it could not be read (a monitoring role not
	// granted EXECUTE on pepsi.payload_size), the rest still shown.
	PayloadSize      *int64 `json:"payload_size"`
	PayloadSizeError string `json:"payload_size_error,omitempty"`
	// ParentID is the message whose pass emitted this one; absent for none.
	ParentID int64 `json:"parent_id,omitempty"`
	// Children counts the messages its passes emitted; FirstChildren are
	// the ids of the first store.ChildrenMax of them, oldest first.
	Children      int64   `json:"children"`
	FirstChildren []int64 `json:"first_children"`
}

// KeyHead is the message an order key's blocked messages wait behind.
type KeyHead struct {
	ID     int64          `json:"id"`
	Stage  string         `json:"stage"`
	Status core.RowStatus `json:"status"`
	// Timeout is when a paused head is due; absent for none.
	Timeout *time.Time `json:"timeout,omitempty"`
	// Attempts above 0 on a paused head: it waits for a retry (answer 75).
	Attempts int `json:"attempts"`
}

// message answers GET /api/messages/{id}.
func message(w http.ResponseWriter, r *http.Request, src *Source, actions bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		writeJSONCode(w, http.StatusBadRequest, map[string]string{"error": "a message id is a positive whole number"})
		return
	}
	m, err := src.Message(r.Context(), id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeJSONCode(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no message %d", id)})
		return
	case err != nil:
		// 503 when the database did not answer (the same request may do
		// once it does), as an action's answer says it, or not within
		// -statement-timeout (a lock held on the queue); a read it refused
		// (a role without SELECT on a column the page reads) stays refused.
		code := http.StatusInternalServerError
		if store.Unavailable(err) || store.Canceled(err) {
			code = http.StatusServiceUnavailable
		}
		writeJSONCode(w, code, map[string]string{"error": err.Error()})
		return
	}
	out := Message{ID: m.ID, Stage: m.Stage, Status: m.Status, Timeout: m.Timeout, Attempts: m.Attempts,
		CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt, By: m.By, Reason: m.Reason, OrderKey: m.OrderKey, Actions: []string{},
		ParentID: m.ParentID, Children: m.Children, FirstChildren: m.FirstChildren}
	if out.FirstChildren == nil {
		out.FirstChildren = []int64{}
	}
	if h := m.Head; h != nil {
		out.WaitsBehind = &KeyHead{ID: h.ID, Stage: h.Stage, Status: h.Status, Timeout: h.Timeout, Attempts: h.Attempts}
		if h.Status != core.StatusPaused {
			out.WaitsBehind.Timeout = nil // a value left from its last pause: no due time
		}
	}
	out.History, out.HistoryOlder, err = src.MessageHistory(r.Context(), id)
	if err != nil {
		out.HistoryError = err.Error()
	}
	if out.History == nil {
		out.History = []store.HistoryRow{}
	}
	out.PayloadSize, err = src.PayloadSize(r.Context(), id)
	if err != nil {
		out.PayloadSizeError = err.Error()
	}
	if actions {
		switch m.Status {
		case core.StatusFailed, core.StatusTimeout:
			out.Actions = append(out.Actions, "retry")
		case core.StatusPending, core.StatusPaused, core.StatusBlocked:
			out.Actions = append(out.Actions, "discard")
		}
	}
	writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) { writeJSONCode(w, http.StatusOK, v) }

// writeJSONCode answers v as JSON with status code.
func writeJSONCode(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// A value JSON cannot hold: say so, rather than an empty 200.
		code = http.StatusInternalServerError
		body, _ = json.Marshal(map[string]string{"error": "cannot encode the answer: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	// An error writing means the client went away; nothing to tell it.
	_, _ = w.Write(append(body, '\n'))
}

// secure adds headers that keep the page to its own assets, and out of
// other sites' frames (no clickjacking of the actions).
func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}
