package httpd

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/internal/bearer"
	"github.com/pepsi-pipeline/pepsi/store"
)

// Actor carries out an operator's action on one message for the page
// (ACTIONS = on). pepsi-httpd gives it queueadmin's guarded writes, the ones
// pepsi-queue retry and discard make, so this package never writes to the
// database itself. A stage or a status not empty is what the operator saw
// and confirmed: the message is changed only if it is still at that stage,
// in that status. With dryRun it counts what it would change and changes
// nothing. Each returns how many messages it changed (0 or 1), or an error
// wrapping store.ErrNotFound when no message has the id.
type Actor interface {
	Retry(ctx context.Context, id int64, stage string, status core.RowStatus, dryRun bool) (int64, error)
	Discard(ctx context.Context, id int64, stage string, status core.RowStatus, dryRun bool) (int64, error)
}

// Sessions of the page's actions.
const (
	// sessionCookie holds a signed-in browser's session id: HttpOnly (no
	// script reads it) and SameSite=Strict (no other site's page sends it).
	sessionCookie = "pepsi_session"
	// csrfHeader must carry the session's CSRF token on every action a
	// session asks for: another site's page can neither read it nor set it.
	csrfHeader = "X-CSRF-Token"
	sessionTTL = 8 * time.Hour
	// sessionsMax bounds the sessions kept: signing in again and again only
	// pushes out the oldest.
	sessionsMax = 1000
	// actionTimeout bounds one action's database work (Actions.timeout).
	actionTimeout = 15 * time.Second
	// actionBodyMax bounds a request body of the actions' endpoints.
	actionBodyMax = 4 << 10
)

// Actions are the page's actions: who may act (a bearer token of the tokens
// file, or a browser session signed in with one), and the Actor that acts.
type Actions struct {
	tokens *bearer.Tokens
	actor  Actor
	log    *slog.Logger
	// timeout bounds one action's database work: actionTimeout, shorter in
	// tests.
	timeout time.Duration

	mu       sync.Mutex
	sessions map[string]session // by session id
}

// session is one signed-in browser.
type session struct {
	csrf    string
	expires time.Time
	// token is the one the operator signed in with: a session lasts only
	// while TOKENS_FILE still holds it (re-read on SIGHUP), so that
	// taking a token out of the file signs its browsers out.
	token string
}

// NewActions returns the actions of a page whose operators sign in with
// tokens, carried out by actor; log receives each action and each refusal.
func NewActions(tokens *bearer.Tokens, actor Actor, log *slog.Logger) *Actions {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Actions{tokens: tokens, actor: actor, log: log, timeout: actionTimeout, sessions: map[string]session{}}
}

// sessionState is the answer of /api/session: whether the page offers
// actions, and whether this browser may use them (with the CSRF token its
// actions must carry).
type sessionState struct {
	Actions  bool   `json:"actions"`
	SignedIn bool   `json:"signed_in"`
	CSRF     string `json:"csrf,omitempty"`
}

// register adds the actions' routes to mux.
func (a *Actions) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/session", a.getSession)
	mux.HandleFunc("POST /api/session", a.signIn)
	mux.HandleFunc("DELETE /api/session", a.signOut)
	mux.HandleFunc("POST /api/messages/{id}/{action}", a.act)
}

// readOnlySession answers /api/session when the page has no actions.
func readOnlySession(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, sessionState{})
}

func (a *Actions) getSession(w http.ResponseWriter, r *http.Request) {
	st := sessionState{Actions: true}
	if s, ok := a.session(r); ok {
		st.SignedIn, st.CSRF = true, s.csrf
	}
	writeJSON(w, st)
}

// signIn starts a session for a browser that gives a valid token, from the
// page's own origin (so that no other site signs a browser in).
func (a *Actions) signIn(w http.ResponseWriter, r *http.Request) {
	if why := foreign(r); why != "" {
		a.refuse(w, r, http.StatusForbidden, "sign-in", why)
		return
	}
	var body struct {
		Token string `json:"token"`
	}
	if err := decode(r, &body); err != nil {
		a.refuse(w, r, http.StatusBadRequest, "sign-in", err.Error())
		return
	}
	if !a.tokens.Valid(body.Token) {
		a.refuse(w, r, http.StatusUnauthorized, "sign-in", "a token not in TOKENS_FILE")
		return
	}
	if old, err := r.Cookie(sessionCookie); err == nil {
		// The browser's session before this sign-in ends: its cookie is
		// replaced, and a copy of it must not act for another 8 hours.
		a.endSession(old.Value)
	}
	id, s := a.newSession(body.Token)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", MaxAge: int(sessionTTL.Seconds()),
		HttpOnly: true, Secure: overTLS(r), SameSite: http.SameSiteStrictMode})
	a.log.Info("page: an operator signed in", "remote", r.RemoteAddr)
	writeJSON(w, sessionState{Actions: true, SignedIn: true, CSRF: s.csrf})
}

// signOut ends the browser's session; it is an action like the others, so
// another site cannot sign an operator out either.
func (a *Actions) signOut(w http.ResponseWriter, r *http.Request) {
	_, id, ok := a.authorize(w, r, "sign-out")
	if !ok {
		return
	}
	a.endSession(id)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: overTLS(r), SameSite: http.SameSiteStrictMode})
	writeJSON(w, sessionState{Actions: true})
}

// actionResult is the answer of an action: how many messages it changed,
// or, for a dry run, would change.
type actionResult struct {
	Action string `json:"action"`
	ID     int64  `json:"id"`
	DryRun bool   `json:"dry_run"`
	Count  int64  `json:"count"`
}

// act carries out POST /api/messages/{id}/retry or /discard, with
// {"dry_run": true} to count only (the page's confirmation step asks that
// first and says what the action would do), and with the "stage" and
// "status" the page showed, so that a message that changed since (moved on
// to another stage, claimed, finished) is left alone: a count of 0.
func (a *Actions) act(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if action != "retry" && action != "discard" {
		a.refuse(w, r, http.StatusNotFound, action, "no such action (want retry or discard)")
		return
	}
	who, _, ok := a.authorize(w, r, action)
	if !ok {
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	var body struct {
		DryRun bool           `json:"dry_run"`
		Stage  string         `json:"stage"`
		Status core.RowStatus `json:"status"`
	}
	if err == nil && id <= 0 {
		err = errors.New("a message id is a positive whole number")
	}
	if err == nil {
		err = decode(r, &body)
	}
	if err != nil {
		a.refuse(w, r, http.StatusBadRequest, action, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), a.timeout)
	defer cancel()
	do := a.actor.Retry
	if action == "discard" {
		do = a.actor.Discard
	}
	n, err := do(ctx, id, body.Stage, body.Status, body.DryRun)
	if errors.Is(err, store.ErrNotFound) {
		// As GET /api/messages/{id} answers it: a count of 0 would read as
		// a message that is no longer in a state for the action.
		a.log.Info("page: operator action on no message", "action", action, "id", id, "dry_run", body.DryRun, "by", who, "remote", r.RemoteAddr)
		writeJSONCode(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("no message %d", id)})
		return
	}
	if err != nil {
		code, msg, what := http.StatusInternalServerError, err.Error(), "page: action failed"
		switch {
		case store.ReadOnly(err):
			// A standby, or a primary after a failover: the server refused
			// the write before doing it.
			code, msg = http.StatusServiceUnavailable, fmt.Sprintf("the database is read-only (a standby, or a failover under way: %v): the %s was not done", err, action)
		case store.Canceled(err) && errors.Is(ctx.Err(), context.DeadlineExceeded):
			// The action's own timeout ran out while a statement ran, and
			// the server cancelled it (queueadmin asks it to: 57014). An
			// action may be several statements, each committing on its own
			// (a retry, then the release of its key), so what was done
			// before the cancel stays done: the outcome is unknown, as for
			// a connection that broke. Neither the request nor pepsi-httpd
			// is at fault, and the same request may do once the lock it
			// waited for is free or the database less busy: 503, not 500.
			code, msg = http.StatusServiceUnavailable, fmt.Sprintf("the %s took longer than %s and was cancelled while its statement ran (%v): it may or may not have been applied; look at the message again", action, a.timeout, err)
			what = "page: action cancelled at its timeout; it may or may not have been applied"
		case store.Unavailable(err):
			// As GET /api/messages/{id} answers it: the database, not the
			// request, is at fault, and the same request may do once it
			// answers. What a connection that broke mid-way left is unknown.
			code, msg = http.StatusServiceUnavailable, fmt.Sprintf("the database did not answer (%v): the %s may or may not have been done; look at the message again", err, action)
		}
		a.log.Error(what, "action", action, "id", id, "dry_run", body.DryRun, "status", code, "err", err)
		writeJSONCode(w, code, map[string]string{"error": msg})
		return
	}
	level := slog.LevelInfo
	if body.DryRun {
		level = slog.LevelDebug
	}
	a.log.Log(ctx, level, "page: operator action", "action", action, "id", id, "dry_run", body.DryRun, "count", n, "by", who, "remote", r.RemoteAddr)
	writeJSON(w, actionResult{Action: action, ID: id, DryRun: body.DryRun, Count: n})
}

// authorize lets through a request with a valid bearer token, or one of a
// signed-in session from the page's own origin that carries the session's
// CSRF token, and says who asked ("token" or "session") and the session's
// id; otherwise it answers the refusal and returns false. An Authorization
// header that holds no token of TOKENS_FILE is not pepsi-httpd's: a reverse
// proxy's Basic authentication, which the browser sends with every request
// of the page, or a Bearer token of its own that a proxy forwards (an
// OAuth proxy's, say); the session, its CSRF token and its origin decide
// then as without it, and without a session it is refused.
func (a *Actions) authorize(w http.ResponseWriter, r *http.Request, what string) (who, id string, ok bool) {
	h := r.Header.Get("Authorization")
	if a.tokens.Allow(h) {
		return "token", "", true // no cookie: nothing another site could make a browser send
	}
	id, s, ok := a.lookup(r)
	if !ok {
		why := "no signed-in session and no bearer token"
		if bearerScheme(h) {
			why = "an Authorization header without a token of TOKENS_FILE, and no signed-in session"
		}
		a.refuse(w, r, http.StatusUnauthorized, what, why)
		return "", "", false
	}
	if why := foreign(r); why != "" {
		a.refuse(w, r, http.StatusForbidden, what, why)
		return "", "", false
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get(csrfHeader)), []byte(s.csrf)) != 1 {
		a.refuse(w, r, http.StatusForbidden, what, "no "+csrfHeader+" header with the session's CSRF token")
		return "", "", false
	}
	return "session", id, true
}

// bearerScheme says whether h, an Authorization header's value, claims a
// bearer token ("Bearer …", in any case).
func bearerScheme(h string) bool {
	scheme, _, _ := strings.Cut(strings.TrimSpace(h), " ")
	return strings.EqualFold(scheme, "Bearer")
}

// foreign says why r may come from another site's page, or "" when it comes
// from the page itself: a JSON body (another site's form cannot send one
// without the browser asking this server first, which it never allows), an
// Origin (every browser sends one with a POST or a DELETE) whose host is this
// server's, as the request names it or a proxy in front says it forwarded
// (X-Forwarded-Host: another site's page cannot set that header without the
// browser asking first either), and, where the browser says it,
// Sec-Fetch-Site same-origin.
func foreign(r *http.Request) string {
	if ct, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || ct != "application/json" {
		return "a body that is not application/json"
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return "a request without an Origin header (a browser sends one with every POST and DELETE)"
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || u.Host != r.Host && u.Host != forwardedHost(r) {
		return "a request from another origin (" + o + ")"
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return "a request from another site (Sec-Fetch-Site: " + site + ")"
	}
	return ""
}

// forwardedHost is the host a proxy in front says the browser asked for
// (the first X-Forwarded-Host), "" when none says: nginx and Apache send
// their upstream's address as Host unless told otherwise.
func forwardedHost(r *http.Request) string {
	h, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Host"), ",")
	return strings.TrimSpace(h)
}

// overTLS says whether r reached pepsi-httpd over TLS, its own or a proxy's
// that says so (X-Forwarded-Proto: https): the session cookie is then Secure.
// A client that says so falsely only makes its own cookie stricter.
func overTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
}

// refuse answers a refused request and logs it (the token never).
func (a *Actions) refuse(w http.ResponseWriter, r *http.Request, code int, what, why string) {
	a.log.Warn("page: refused", "what", what, "why", why, "remote", r.RemoteAddr, "status", code)
	writeJSONCode(w, code, map[string]string{"error": why})
}

// decode reads r's JSON body into v (an empty body leaves v as it is).
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, actionBodyMax))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return errors.New("the body is not the JSON object this endpoint takes: " + err.Error())
	}
	return nil
}

// newSession starts a session, forgetting the expired ones and, past
// sessionsMax, the one that expires first.
func (a *Actions) newSession(token string) (string, session) {
	id, s := randomToken(), session{csrf: randomToken(), expires: time.Now().Add(sessionTTL), token: token}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	oldest := ""
	for k, v := range a.sessions {
		if now.After(v.expires) {
			delete(a.sessions, k)
		} else if oldest == "" || v.expires.Before(a.sessions[oldest].expires) {
			oldest = k
		}
	}
	if len(a.sessions) >= sessionsMax {
		delete(a.sessions, oldest)
	}
	a.sessions[id] = s
	return id, s
}

// session is r's signed-in session, if it has one.
func (a *Actions) session(r *http.Request) (session, bool) {
	_, s, ok := a.lookup(r)
	return s, ok
}

// lookup finds r's session by its cookie: one that has not expired and
// whose token TOKENS_FILE still holds (a session of a token taken out of it
// is ended).
func (a *Actions) lookup(r *http.Request) (string, session, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", session{}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sessions[c.Value]
	if ok && !a.tokens.Valid(s.token) {
		delete(a.sessions, c.Value)
		ok = false
	}
	if !ok || time.Now().After(s.expires) {
		return "", session{}, false
	}
	return c.Value, s, true
}

// endSession ends session id (nothing if there is none).
func (a *Actions) endSession(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.sessions, id)
}

// Reload re-reads TOKENS_FILE (on SIGHUP) and returns how many tokens it
// holds; a file that fails to load leaves the tokens in use as they were.
// Sessions of a token no longer in the file end at their next request.
func (a *Actions) Reload() (int, error) {
	return a.tokens.Reload()
}

// randomToken is 32 random bytes, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b)
}
