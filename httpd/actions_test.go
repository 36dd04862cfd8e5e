package httpd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/bearer"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
)

// operatorToken is the one token of the tests' tokens file.
const operatorToken = "operator-token-0123456789"

// tokensFile writes a tokens file with operatorToken and loads it.
func tokensFile(t *testing.T) *bearer.Tokens {
	t.Helper()
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte("# the on-call operators\n"+operatorToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := bearer.LoadTokens(file)
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}

// fakeActor records the actions it is asked for and changes nothing.
type fakeActor struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeActor) Retry(_ context.Context, id int64, _ string, _ core.RowStatus, dryRun bool) (int64, error) {
	return f.record("retry", id, dryRun), nil
}

func (f *fakeActor) Discard(_ context.Context, id int64, _ string, _ core.RowStatus, dryRun bool) (int64, error) {
	return f.record("discard", id, dryRun), nil
}

func (f *fakeActor) record(action string, id int64, dryRun bool) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("%s %d dry=%v", action, id, dryRun))
	return 1
}

func (f *fakeActor) taken() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// actionServer serves a known run's page with acts until the test ends, and
// returns it with a browser that keeps its cookies.
func actionServer(t *testing.T, acts *httpd.Actions) (*httptest.Server, *http.Client) {
	t.Helper()
	src := open(t, httpd.Options{Database: newKnownRun(t)})
	srv := httptest.NewServer(httpd.Handler(src, acts))
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return srv, &http.Client{Jar: jar}
}

// request is one request of a test client; jar, when not nil, keeps its
// cookies.
type request struct {
	method, path, body string
	header             map[string]string
}

// do sends req to base with client and returns the status and the body.
func do(t *testing.T, client *http.Client, base string, req request) (int, string) {
	t.Helper()
	r, err := http.NewRequest(req.method, base+req.path, strings.NewReader(req.body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range req.header {
		r.Header.Set(k, v)
	}
	resp, err := client.Do(r)
	if err != nil {
		t.Fatalf("%s %s: %v", req.method, req.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Every way an action can be forged is refused before the Actor is asked:
// no credentials, a wrong bearer token, a session cookie no sign-in made, a
// session without its CSRF token or with a wrong one, a request from another
// origin or site, a body that is not JSON (what another site's form sends),
// a sign-in with a wrong token or from another origin. A bearer token, or a
// session from the page's origin with its CSRF token, acts; after sign-out
// the session is gone.
func TestForgedActionsAreRefused(t *testing.T) {
	t.Parallel()
	actor := &fakeActor{}
	srv, browser := actionServer(t, httpd.NewActions(tokensFile(t), actor, nil))
	plain := &http.Client{}
	json := map[string]string{"Content-Type": "application/json", "Origin": srv.URL}
	with := func(extra map[string]string) map[string]string {
		h := map[string]string{}
		for k, v := range json {
			h[k] = v
		}
		for k, v := range extra {
			if v == "" {
				delete(h, k)
			} else {
				h[k] = v
			}
		}
		return h
	}
	retry := func(client *http.Client, h map[string]string) int {
		code, _ := do(t, client, srv.URL, request{"POST", "/api/messages/7/retry", `{"dry_run": false}`, h})
		return code
	}

	if code := retry(plain, json); code != http.StatusUnauthorized {
		t.Errorf("no credentials: %d, want 401", code)
	}
	if code := retry(plain, with(map[string]string{"Authorization": "Bearer not-the-operator-token"})); code != http.StatusUnauthorized {
		t.Errorf("a wrong bearer token: %d, want 401", code)
	}
	if code := retry(plain, with(map[string]string{"Cookie": "pepsi_session=made-up-session-id"})); code != http.StatusUnauthorized {
		t.Errorf("a session cookie no sign-in made: %d, want 401", code)
	}
	if code, _ := do(t, browser, srv.URL, request{"POST", "/api/session", `{"token": "not-the-operator-token"}`, json}); code != http.StatusUnauthorized {
		t.Errorf("sign-in with a wrong token: %d, want 401", code)
	}
	if code, _ := do(t, browser, srv.URL, request{"POST", "/api/session", `{"token": "` + operatorToken + `"}`,
		with(map[string]string{"Origin": "http://evil.example"})}); code != http.StatusForbidden {
		t.Errorf("sign-in from another origin: %d, want 403", code)
	}
	if len(actor.taken()) != 0 || len(browser.Jar.Cookies(must(url.Parse(srv.URL)))) != 0 {
		t.Fatalf("refused requests acted (%v) or signed in", actor.taken())
	}

	code, body := do(t, browser, srv.URL, request{"POST", "/api/session", `{"token": "` + operatorToken + `"}`, json})
	var st struct {
		SignedIn bool   `json:"signed_in"`
		CSRF     string `json:"csrf"`
	}
	if err := jsonUnmarshal(body, &st); code != http.StatusOK || err != nil || !st.SignedIn || st.CSRF == "" {
		t.Fatalf("sign-in with the token: %d %s (%v), want signed in with a CSRF token", code, body, err)
	}
	csrf := map[string]string{"X-CSRF-Token": st.CSRF}
	for name, h := range map[string]map[string]string{
		"no CSRF token":              json,
		"a wrong CSRF token":         with(map[string]string{"X-CSRF-Token": "not-" + st.CSRF}),
		"another origin":             with(map[string]string{"X-CSRF-Token": st.CSRF, "Origin": "http://evil.example"}),
		"another site":               with(map[string]string{"X-CSRF-Token": st.CSRF, "Sec-Fetch-Site": "cross-site"}),
		"no Origin":                  with(map[string]string{"X-CSRF-Token": st.CSRF, "Origin": ""}),
		"a form's body, not JSON":    with(map[string]string{"X-CSRF-Token": st.CSRF, "Content-Type": "text/plain"}),
		"another origin, no headers": with(map[string]string{"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"}),
	} {
		if code := retry(browser, h); code != http.StatusForbidden {
			t.Errorf("a session with %s: %d, want 403", name, code)
		}
	}
	if calls := actor.taken(); len(calls) != 0 {
		t.Fatalf("forged requests acted: %v", calls)
	}

	if code := retry(browser, with(csrf)); code != http.StatusOK {
		t.Errorf("the session with its CSRF token from the page's origin: %d, want 200", code)
	}
	if code, _ := do(t, plain, srv.URL, request{"POST", "/api/messages/8/discard", `{"dry_run": true}`,
		map[string]string{"Authorization": "Bearer " + operatorToken, "Content-Type": "application/json"}}); code != http.StatusOK {
		t.Errorf("a valid bearer token: %d, want 200", code)
	}
	if want := []string{"retry 7 dry=false", "discard 8 dry=true"}; strings.Join(actor.taken(), ",") != strings.Join(want, ",") {
		t.Errorf("acted %v, want %v", actor.taken(), want)
	}
	if code, _ := do(t, browser, srv.URL, request{"DELETE", "/api/session", "", with(csrf)}); code != http.StatusOK {
		t.Errorf("sign-out: %d, want 200", code)
	}
	if code := retry(browser, with(csrf)); code != http.StatusUnauthorized {
		t.Errorf("after sign-out: %d, want 401", code)
	}
}

// Without ACTIONS the server has no route that acts and says so, and the
// message page offers no action.
func TestAReadOnlyServerHasNoActions(t *testing.T) {
	t.Parallel()
	src := open(t, httpd.Options{Database: newKnownRun(t)})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	client := &http.Client{}
	h := map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + operatorToken}
	for _, req := range []request{
		{"POST", "/api/messages/1/retry", `{}`, h},
		{"POST", "/api/messages/1/discard", `{}`, h},
		{"POST", "/api/session", `{"token": "` + operatorToken + `"}`, h},
	} {
		if code, _ := do(t, client, srv.URL, req); code != http.StatusMethodNotAllowed && code != http.StatusNotFound {
			t.Errorf("%s %s on a read-only server: %d, want 404 or 405", req.method, req.path, code)
		}
	}
	if code, body := do(t, client, srv.URL, request{"GET", "/api/session", "", nil}); code != http.StatusOK || strings.TrimSpace(body) != `{"actions":false,"signed_in":false}` {
		t.Errorf("GET /api/session: %d %s, want no actions", code, body)
	}
	code, body := do(t, client, srv.URL, request{"GET", "/api/messages/8", "", nil})
	var m httpd.Message
	if err := jsonUnmarshal(body, &m); code != http.StatusOK || err != nil || m.ID != 8 || len(m.Actions) != 0 {
		t.Errorf("GET /api/messages/8: %d %s (%v), want the message and no actions", code, body, err)
	}
	if strings.Contains(body, secretPayload) {
		t.Error("the message page's data shows the payload")
	}
	if code, _ := do(t, client, srv.URL, request{"GET", "/api/messages/999999", "", nil}); code != http.StatusNotFound {
		t.Errorf("GET /api/messages/999999: %d, want 404", code)
	}
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// An action, dry run or not, on an id no message has (mistyped, or purged
// since the page showed it) is a 404 naming the id, as GET /api/messages/ID
// answers it, not a count of 0, which reads as a message no longer in a
// state for the action. On a message that is in no state for it, the
// answer is still that count of 0, and nothing changes.
func TestAnActionOnNoMessageIsNotFound(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	src := open(t, httpd.Options{Database: url})
	srv := httptest.NewServer(httpd.Handler(src, httpd.NewActions(tokensFile(t), queueadmin.PageActions{Database: url}, nil)))
	defer srv.Close()
	client := &http.Client{}
	h := map[string]string{"Authorization": "Bearer " + operatorToken, "Content-Type": "application/json"}
	const missing = 999999
	for _, action := range []string{"retry", "discard"} {
		for _, dry := range []bool{true, false} {
			code, body := do(t, client, srv.URL, request{"POST", fmt.Sprintf("/api/messages/%d/%s", missing, action), fmt.Sprintf(`{"dry_run": %v}`, dry), h})
			var e struct {
				Error string `json:"error"`
			}
			if err := jsonUnmarshal(body, &e); code != http.StatusNotFound || err != nil || e.Error != "no message 999999" {
				t.Errorf("%s of message %d (dry run %v): %d %s; want 404 {\"error\": \"no message %d\"}", action, missing, dry, code, body, missing)
			}
		}
	}
	pending := idOf(t, url, "parse", "pending")
	code, body := do(t, client, srv.URL, request{"POST", fmt.Sprintf("/api/messages/%d/retry", pending), `{"dry_run": false}`, h})
	if want := fmt.Sprintf(`{"action":"retry","id":%d,"dry_run":false,"count":0}`, pending); code != http.StatusOK || strings.TrimSpace(body) != want {
		t.Errorf("retry of pending message %d: %d %s; want 200 %s", pending, code, body, want)
	}
	if status, _ := statusOf(t, url, pending); status != "pending" {
		t.Errorf("message %d is %s after a retry, which does not apply to a pending message; want still pending", pending, status)
	}
}

// TestBehindAProxyTheOriginCheckAndTheCookieFollowWhatItForwards: nginx and
// Apache send their upstream's address as Host, and say what the browser
// asked for in X-Forwarded-Host and X-Forwarded-Proto. A sign-in through
// such a proxy passes the origin check, and its cookie is Secure when the
// browser came over TLS; an Origin that is neither Host nor the forwarded
// host is still refused.
func TestBehindAProxyTheOriginCheckAndTheCookieFollowWhatItForwards(t *testing.T) {
	t.Parallel()
	src := open(t, httpd.Options{Database: newKnownRun(t)})
	srv := httptest.NewServer(httpd.Handler(src, httpd.NewActions(tokensFile(t), &fakeActor{}, nil)))
	defer srv.Close()
	signIn := func(origin string, forwarded map[string]string) *http.Response {
		r, err := http.NewRequest("POST", srv.URL+"/api/session", strings.NewReader(`{"token": "`+operatorToken+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		r.Host = "127.0.0.1:9650" // the proxy's upstream, as it says it
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Origin", origin)
		for k, v := range forwarded {
			r.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := signIn("https://ops.example", map[string]string{"X-Forwarded-Host": "ops.example", "X-Forwarded-Proto": "https"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("sign-in through a proxy that forwards the host: %d, want 200", resp.StatusCode)
	}
	if c := resp.Cookies(); len(c) != 1 || !c[0].Secure || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode {
		t.Errorf("the session cookie through a TLS proxy: %v; want one, Secure, HttpOnly, SameSite=Strict", c)
	}
	if resp := signIn("https://ops.example", nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("an Origin neither Host nor forwarded: %d, want 403", resp.StatusCode)
	}
	if resp := signIn("https://evil.example", map[string]string{"X-Forwarded-Host": "ops.example"}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("another origin through the proxy: %d, want 403", resp.StatusCode)
	}
	if resp := signIn("http://127.0.0.1:9650", nil); resp.StatusCode != http.StatusOK || len(resp.Cookies()) != 1 || resp.Cookies()[0].Secure {
		t.Errorf("a sign-in over plain HTTP from the page's own origin: %d %v; want 200 and a cookie that is not Secure", resp.StatusCode, resp.Cookies())
	}
}

// failingActor fails every action with err.
type failingActor struct{ err error }

func (f failingActor) Retry(context.Context, int64, string, core.RowStatus, bool) (int64, error) {
	return 0, f.err
}

func (f failingActor) Discard(context.Context, int64, string, core.RowStatus, bool) (int64, error) {
	return 0, f.err
}

// TestAnActionTheDatabaseDoesNotAnswerIs503: an action whose database
// cannot be reached is answered 503, as GET /api/messages/ID answers it,
// saying the action may not have been done; one the database refused (a
// SQL error of PEPSI's own) stays a 500.
func TestAnActionTheDatabaseDoesNotAnswerIs503(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	src := open(t, httpd.Options{Database: url})
	h := map[string]string{"Authorization": "Bearer " + operatorToken, "Content-Type": "application/json"}
	for _, c := range []struct {
		name  string
		actor httpd.Actor
		code  int
		says  string
	}{
		{"nothing listens", queueadmin.PageActions{Database: "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5"}, http.StatusServiceUnavailable, "the database did not answer"},
		{"a refused statement", failingActor{&pgconn.PgError{Code: "42P01", Message: `relation "pepsi.queue" does not exist`}}, http.StatusInternalServerError, "does not exist"},
	} {
		srv := httptest.NewServer(httpd.Handler(src, httpd.NewActions(tokensFile(t), c.actor, nil)))
		for _, action := range []string{"retry", "discard"} {
			code, body := do(t, &http.Client{}, srv.URL, request{"POST", "/api/messages/1/" + action, `{"dry_run": false}`, h})
			var e struct {
				Error string `json:"error"`
			}
			if err := jsonUnmarshal(body, &e); code != c.code || err != nil || !strings.Contains(e.Error, c.says) {
				t.Errorf("%s, %s: %d %s; want %d saying %q", c.name, action, code, body, c.code, c.says)
			}
		}
		srv.Close()
	}
}

// Proves: a session lasts only while TOKENS_FILE holds the token it signed in
// with: once the file, re-read (SIGHUP), no longer has it, the session's next
// action is refused and the session is gone, as a bearer token of it is.
// Before, a revoked token's browsers kept acting until their session expired.
func TestASessionEndsWhenItsTokenLeavesTheFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(operatorToken+"\nanother-operator-token-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := bearer.LoadTokens(file)
	if err != nil {
		t.Fatal(err)
	}
	acts := httpd.NewActions(tokens, &fakeActor{}, nil)
	srv, browser := actionServer(t, acts)
	json := map[string]string{"Content-Type": "application/json", "Origin": srv.URL}
	code, body := do(t, browser, srv.URL, request{"POST", "/api/session", `{"token": "` + operatorToken + `"}`, json})
	var st struct {
		CSRF string `json:"csrf"`
	}
	if err := jsonUnmarshal(body, &st); code != http.StatusOK || err != nil || st.CSRF == "" {
		t.Fatalf("sign-in: %d %s (%v)", code, body, err)
	}
	h := map[string]string{"Content-Type": "application/json", "Origin": srv.URL, "X-CSRF-Token": st.CSRF}
	retry := func() int {
		code, _ := do(t, browser, srv.URL, request{"POST", "/api/messages/7/retry", `{"dry_run": true}`, h})
		return code
	}
	if code := retry(); code != http.StatusOK {
		t.Fatalf("the signed-in session: %d, want 200", code)
	}
	if err := os.WriteFile(file, []byte("another-operator-token-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := acts.Reload(); err != nil || n != 1 {
		t.Fatalf("reload: %d tokens, %v; want 1", n, err)
	}
	if code := retry(); code != http.StatusUnauthorized {
		t.Errorf("the session of a token taken out of the file: %d, want 401", code)
	}
	if err := os.WriteFile(file, []byte(operatorToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := acts.Reload(); err != nil {
		t.Fatal(err)
	}
	if code := retry(); code != http.StatusUnauthorized {
		t.Errorf("the ended session once its token is back: %d, want 401 (it must sign in again)", code)
	}
}

// TestASessionBehindAProxysBasicAuthenticationActs: behind a reverse proxy
// that asks for Basic authentication (as -listen advises: "a reverse proxy
// with authentication"), the browser sends the proxy's Authorization: Basic
// header with every request of the page, and nginx passes it on. A signed-in
// session with its CSRF token then acts and signs out as without the proxy;
// the header alone, without a session, is still refused.
func TestASessionBehindAProxysBasicAuthenticationActs(t *testing.T) {
	t.Parallel()
	sessionBehindAProxyActs(t, "Basic b3BzOnB3")
}

// TestASessionBehindAProxysOwnBearerTokenActs: a reverse proxy that signs
// operators in itself (an OAuth proxy) may forward a Bearer token of its own
// with every request of the page, none of TOKENS_FILE. A signed-in session
// with its CSRF token then acts and signs out as without the proxy, and
// still not without its CSRF token; the header alone, without a session, is
// still refused. Before, the header was taken for a wrong token of ours,
// and every action of the session was refused 401.
func TestASessionBehindAProxysOwnBearerTokenActs(t *testing.T) {
	t.Parallel()
	sessionBehindAProxyActs(t, "Bearer eyJhbGciOiJSUzI1NiJ9.the-proxys-own.token")
}

// sessionBehindAProxyActs signs a browser in through a proxy that adds
// authorization, the proxy's Authorization header, to every request: the
// header alone is refused 401, the session without its CSRF token 403, and
// the session with it retries and signs out.
func sessionBehindAProxyActs(t *testing.T, authorization string) {
	t.Helper()
	actor := &fakeActor{}
	srv, browser := actionServer(t, httpd.NewActions(tokensFile(t), actor, nil))
	h := map[string]string{"Content-Type": "application/json", "Origin": srv.URL, "Authorization": authorization}
	if code, _ := do(t, &http.Client{}, srv.URL, request{"POST", "/api/messages/7/retry", `{"dry_run": true}`, h}); code != http.StatusUnauthorized {
		t.Errorf("the proxy's %q without a session: %d, want 401", authorization, code)
	}
	code, body := do(t, browser, srv.URL, request{"POST", "/api/session", `{"token": "` + operatorToken + `"}`, h})
	var st struct {
		CSRF string `json:"csrf"`
	}
	if err := jsonUnmarshal(body, &st); code != http.StatusOK || err != nil || st.CSRF == "" {
		t.Fatalf("sign-in through the proxy: %d %s (%v), want signed in with a CSRF token", code, body, err)
	}
	if code, body := do(t, browser, srv.URL, request{"POST", "/api/messages/7/retry", `{"dry_run": true}`, h}); code != http.StatusForbidden {
		t.Errorf("the session's retry through the proxy without its CSRF token: %d %s, want 403", code, body)
	}
	h["X-CSRF-Token"] = st.CSRF
	if code, body := do(t, browser, srv.URL, request{"POST", "/api/messages/7/retry", `{"dry_run": true}`, h}); code != http.StatusOK {
		t.Errorf("the session's retry through the proxy: %d %s, want 200", code, body)
	}
	if code, body := do(t, browser, srv.URL, request{"DELETE", "/api/session", "", h}); code != http.StatusOK {
		t.Errorf("the session's sign-out through the proxy: %d %s, want 200", code, body)
	}
	if want := []string{"retry 7 dry=true"}; strings.Join(actor.taken(), ",") != strings.Join(want, ",") {
		t.Errorf("acted %v, want %v", actor.taken(), want)
	}
}

// readOnlyActor is an Actor whose database refuses every write as a
// read-only server does (a standby, a failover under way).
type readOnlyActor struct{}

func (readOnlyActor) Retry(context.Context, int64, string, core.RowStatus, bool) (int64, error) {
	return 0, &pgconn.PgError{Severity: "ERROR", Code: "25006", Message: "cannot execute UPDATE in a read-only transaction"}
}

func (a readOnlyActor) Discard(ctx context.Context, id int64, stage string, status core.RowStatus, dryRun bool) (int64, error) {
	return a.Retry(ctx, id, stage, status, dryRun)
}

// Proves: an action a read-only database refused (25006: pepsi-httpd
// pointed at a standby, or a failover under way) is a 503 that says nothing
// was done, not that it may or may not have been.
func TestAnActionAReadOnlyDatabaseRefusedSaysNothingWasDone(t *testing.T) {
	t.Parallel()
	srv, _ := actionServer(t, httpd.NewActions(tokensFile(t), readOnlyActor{}, nil))
	code, body := do(t, &http.Client{}, srv.URL, request{"POST", "/api/messages/7/retry", `{"dry_run": false}`,
		map[string]string{"Authorization": "Bearer " + operatorToken, "Content-Type": "application/json"}})
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "read-only") || !strings.Contains(body, "was not done") || strings.Contains(body, "may or may not") {
		t.Errorf("a retry the read-only database refused: %d %s; want 503 saying it was not done", code, body)
	}
}

// Proves: signing in again ends the browser's session before: a copy of its
// old cookie no longer acts (it lived on for its 8 hours).
func TestSigningInAgainEndsTheSessionBefore(t *testing.T) {
	t.Parallel()
	srv, browser := actionServer(t, httpd.NewActions(tokensFile(t), &fakeActor{}, nil))
	json := map[string]string{"Content-Type": "application/json", "Origin": srv.URL}
	signIn := func() (cookie, csrf string) {
		code, body := do(t, browser, srv.URL, request{"POST", "/api/session", `{"token": "` + operatorToken + `"}`, json})
		var st struct {
			CSRF string `json:"csrf"`
		}
		if err := jsonUnmarshal(body, &st); code != http.StatusOK || err != nil {
			t.Fatalf("sign-in: %d %s (%v)", code, body, err)
		}
		for _, c := range browser.Jar.Cookies(must(url.Parse(srv.URL))) {
			cookie = c.Name + "=" + c.Value
		}
		return cookie, st.CSRF
	}
	oldCookie, oldCSRF := signIn()
	signIn()
	code, _ := do(t, &http.Client{}, srv.URL, request{"POST", "/api/messages/7/retry", `{"dry_run": true}`,
		map[string]string{"Content-Type": "application/json", "Origin": srv.URL, "Cookie": oldCookie, "X-CSRF-Token": oldCSRF}})
	if code != http.StatusUnauthorized {
		t.Errorf("the session before the second sign-in: %d, want 401", code)
	}
}

// Proves: an action whose database work runs past its timeout (15 s in
// pepsi-httpd, 300 ms here: the retry's UPDATE waits for the row's lock,
// which another transaction holds) is cancelled in the server (57014) and
// answered 503, saying it may or may not have been applied and to look at
// the message again, and logged so. Before, it was a 500 with the server's
// "canceling statement due to user request": a failure of pepsi-httpd's, no
// word of what became of the action.
func TestAnActionCancelledAtItsTimeoutIs503ThatMayOrMayNotHaveBeenApplied(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	var logs lockedbuf.Buffer
	acts := httpd.NewActions(tokensFile(t), queueadmin.PageActions{Database: url}, slog.New(slog.NewTextHandler(&logs, nil)))
	acts.SetTimeout(300 * time.Millisecond)
	srv, _ := actionServer(t, acts)
	id := idOf(t, url, "deliver", "failed")
	tx, err := pgtest.Connect(t, url).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // only holds the lock
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pepsi.queue WHERE ingress_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	code, body := do(t, &http.Client{}, srv.URL, request{"POST", fmt.Sprintf("/api/messages/%d/retry", id), `{"dry_run": false}`,
		map[string]string{"Authorization": "Bearer " + operatorToken, "Content-Type": "application/json"}})
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "may or may not have been applied; look at the message again") {
		t.Errorf("a retry cancelled at its timeout: %d %s; want 503 saying it may or may not have been applied", code, body)
	}
	if !strings.Contains(logs.String(), "cancelled at its timeout") || !strings.Contains(logs.String(), "status=503") {
		t.Errorf("log:\n%s\nwant the action cancelled at its timeout, answered 503", logs.String())
	}
}
