package httpd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
	"github.com/pepsi-pipeline/pepsi/queueadmin"
	"github.com/pepsi-pipeline/pepsi/store"
)

// poll waits up to 20 s for the JavaScript expression cond to hold in the
// page, and fails the test with what with says when it does not.
func poll(t *testing.T, b context.Context, what, cond string) {
	t.Helper()
	if _, err := chromedp.Run(b, chromedp.Poll[bool](cond, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("%s: %v\npage: %s", what, err, mustText(t, b, "body"))
	}
}

// statusOf reads message id's status and dispatch_error.
func statusOf(t *testing.T, url string, id int64) (status, reason string) {
	t.Helper()
	err := pgtest.Connect(t, url).QueryRow(ctx, `SELECT status, coalesce(state->>'dispatch_error', '') FROM pepsi.queue WHERE ingress_id = $1`, id).
		Scan(&status, &reason)
	if err != nil {
		t.Fatal(err)
	}
	return status, reason
}

// idOf is the smallest id of a message at stage with status.
func idOf(t *testing.T, url, stage, status string) int64 {
	t.Helper()
	var id int64
	if err := pgtest.Connect(t, url).QueryRow(ctx, `SELECT min(ingress_id) FROM pepsi.queue WHERE stage = $1 AND status = $2`, stage, status).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// A read-only page (no ACTIONS) has no sign-in and no buttons, on the
// failures list and on a message's page.
func TestAReadOnlyPageHasNoButtons(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	src := open(t, httpd.Options{Database: url, CacheMaxAge: 50 * time.Millisecond})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	failed := idOf(t, url, "deliver", "failed")
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the failures list", `document.querySelectorAll("#failures tbody tr[data-id]").length === 4 && document.body.dataset.reads >= 1`)
	poll(t, b, "no buttons on the read-only page", noButtons+` && !document.getElementById("signin-form") && document.getElementById("failures-action").hidden`)
	if err := chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/message.html?id=%d", srv.URL, failed))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the read-only message page", `document.querySelector('#message tr[data-key="status"] td')?.textContent === "failed" && `+noButtons)
}

// noButtons holds when the page has no button but those of its closed
// confirmation dialog (which only an action opens).
const noButtons = `!document.getElementById("confirm").open && [...document.querySelectorAll("button")].every(b => b.closest("dialog"))`

// With ACTIONS: the page offers nothing until an operator signs in (a wrong
// token is refused); then each failure has a retry button, whose
// confirmation says what it would do and whose cancel changes nothing, and
// whose confirm retries the message; a pending message's page discards it
// after its confirmation. A request the page's script forges without the
// CSRF token, or with a wrong one, is refused, and so is a cross-origin page
// that posts to the actions with the operator's cookie: nothing changes.
func TestThePageRetriesAndDiscardsAfterAConfirmationAndRefusesForgeries(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	src := open(t, httpd.Options{Database: url, CacheMaxAge: 50 * time.Millisecond})
	var logs lockedbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	srv := httptest.NewServer(httpd.Handler(src, httpd.NewActions(tokensFile(t), queueadmin.PageActions{Database: url}, log)))
	defer srv.Close()
	failed, forged := idOf(t, url, "deliver", "failed"), idOf(t, url, "parse", "failed")
	pending := idOf(t, url, "parse", "pending")
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the sign-in form and no buttons", `!!document.getElementById("signin-form") && document.querySelectorAll("#failures tbody tr[data-id]").length === 4 && document.querySelectorAll("button.action").length === 0`)
	signIn := func(token string) {
		t.Helper()
		if err := chromedp.Do(b, chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#signin-form button"))); err != nil {
			t.Fatal(err)
		}
	}
	signIn("not-the-operator-token")
	poll(t, b, "a wrong token refused", `document.getElementById("notice").textContent.startsWith("sign-in refused") && document.querySelectorAll("button.action").length === 0`)
	signIn(operatorToken)
	retryButton := fmt.Sprintf(`#failures button[data-action="retry"][data-id="%d"]`, failed)
	poll(t, b, "retry buttons after signing in", `document.querySelectorAll("#failures button.action").length === 4 && !!document.querySelector('`+retryButton+`')`)

	// Retry, cancelled at the confirmation: nothing changes.
	click := func(sel string) {
		t.Helper()
		if _, err := chromedp.Run(b, chromedp.Click(chromedp.CSS(sel))); err != nil {
			t.Fatalf("click %s: %v", sel, err)
		}
	}
	click(retryButton)
	poll(t, b, "the confirmation", fmt.Sprintf(`document.getElementById("confirm").open && document.getElementById("confirm-text").textContent.startsWith("Retry message %d (failed at deliver)? It will be made pending again")`, failed))
	click("#confirm-no")
	poll(t, b, "the cancel", fmt.Sprintf(`!document.getElementById("confirm").open && document.getElementById("notice").textContent === "retry of message %d cancelled"`, failed))
	if status, _ := statusOf(t, url, failed); status != "failed" {
		t.Fatalf("after a cancelled retry, message %d is %s, want still failed", failed, status)
	}
	click(retryButton)
	poll(t, b, "the confirmation again", `document.getElementById("confirm").open`)
	click("#confirm-yes")
	poll(t, b, "the retry done", fmt.Sprintf(`document.getElementById("notice").textContent === "message %d: retry done"`, failed))
	if status, _ := statusOf(t, url, failed); status != "pending" {
		t.Errorf("after a confirmed retry, message %d is %s, want pending", failed, status)
	}
	shot(t, b, "status-page-actions.png")

	// Forged by a script of the page itself, with the session's cookie: no
	// CSRF token, a wrong one, a bearer token not of TOKENS_FILE (which
	// does not stand in for the CSRF token: it is taken for a proxy's).
	for name, want := range map[string]struct {
		headers string
		code    int
	}{
		"no CSRF token":      {`{"Content-Type": "application/json"}`, http.StatusForbidden},
		"a wrong CSRF token": {`{"Content-Type": "application/json", "X-CSRF-Token": "forged"}`, http.StatusForbidden},
		"a bearer token not of the file, no CSRF token":       {`{"Content-Type": "application/json", "Authorization": "Bearer not-the-operator-token"}`, http.StatusForbidden},
		"its CSRF token, dry":                                 {`{"Content-Type": "application/json", "X-CSRF-Token": session.csrf}`, http.StatusOK},
		"a bearer token not of the file, its CSRF token, dry": {`{"Content-Type": "application/json", "X-CSRF-Token": session.csrf, "Authorization": "Bearer not-the-operator-token"}`, http.StatusOK},
	} {
		body := `{"dry_run": false}`
		if want.code == http.StatusOK {
			body = `{"dry_run": true}` // the controls: the same fetch with the token gets through
		}
		code, err := chromedp.Run(b, chromedp.Evaluate[int](fmt.Sprintf(`fetch("api/messages/%d/retry", {method: "POST", headers: %s, body: '%s'}).then(r => r.status)`, forged, want.headers, body),
			chromedp.EvalAwaitPromise))
		if err != nil || code != want.code {
			t.Errorf("a fetch with %s: %d (%v), want %d", name, code, err, want.code)
		}
	}
	// Forged by another origin's page (another port of the same host: the
	// same site, so the browser sends the session cookie), by a form and by
	// a fetch.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target := fmt.Sprintf("%s/api/messages/%d/retry", srv.URL, forged)
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="POST" action="%s" enctype="text/plain"><input name='{"dry_run": false, "x": "' value='"}'></form>
<script>fetch(%q, {method: "POST", credentials: "include", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: '{"dry_run": false}'}).finally(() => { document.title = "sent"; document.getElementById("f").submit(); });</script>`, target, target)
	}))
	defer evil.Close()
	refused := strings.Count(logs.String(), "page: refused")
	// In a tab of its own (the same browser, so the same cookies): the
	// form's navigation to the refused answer may land late, and in the
	// operator's tab it would destroy the page the next steps read
	// ("Cannot find context").
	evilTab, closeEvil := chromedp.NewContext(b)
	if err := chromedp.Do(evilTab, chromedp.Navigate(evil.URL+"/")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the other origin's two requests refused", func() bool { return strings.Count(logs.String(), "page: refused") >= refused+2 })
	closeEvil()
	if status, _ := statusOf(t, url, forged); status != "failed" {
		t.Errorf("after forged requests, message %d is %s, want still failed", forged, status)
	}

	// Discard from a pending message's page.
	if err := chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/message.html?id=%d", srv.URL, pending))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the message page's discard button", `document.querySelector('#message tr[data-key="status"] td')?.textContent === "pending" && !!document.querySelector('#actions button[data-action="discard"]') && !document.querySelector('#actions button[data-action="retry"]')`)
	click(`#actions button[data-action="discard"]`)
	poll(t, b, "the discard's confirmation", fmt.Sprintf(`document.getElementById("confirm").open && document.getElementById("confirm-text").textContent.startsWith("Discard message %d (pending at parse)?")`, pending))
	click("#confirm-yes")
	poll(t, b, "the discarded message, now one to retry", `document.querySelector('#message tr[data-key="status"] td')?.textContent === "failed" && `+
		`!!document.querySelector('#actions button[data-action="retry"]') && !document.querySelector('#actions button[data-action="discard"]')`)
	if status, reason := statusOf(t, url, pending); status != "failed" || reason != queueadmin.PageDiscardedError {
		t.Errorf("after a confirmed discard, message %d is %s (%q), want failed with %q", pending, status, reason, queueadmin.PageDiscardedError)
	}
	shot(t, b, "message-page-discarded.png")

	// A session cookie that no sign-in made, under the signed-in page: its
	// button's request is refused, and nothing changes.
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	forgedButton := fmt.Sprintf(`#failures button[data-action="retry"][data-id="%d"]`, forged)
	poll(t, b, "the forged message's retry button", `!!document.querySelector('`+forgedButton+`')`)
	if _, err := chromedp.Call(b, network.SetCookie, network.SetCookieParams{Name: "pepsi_session", Value: "forged-session-id", URL: srv.URL + "/"}); err != nil {
		t.Fatal(err)
	}
	click(forgedButton)
	poll(t, b, "the forged session refused", fmt.Sprintf(`document.getElementById("notice").textContent === "retry of message %d failed: no signed-in session and no bearer token"`, forged))
	if status, _ := statusOf(t, url, forged); status != "failed" {
		t.Errorf("after a forged session, message %d is %s, want still failed", forged, status)
	}
}

// waitUntil waits up to 10 s for cond.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// shot keeps a screenshot of the page as a test artifact.
func shot(t *testing.T, b context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(b, chromedp.FullScreenshot(100))
	if err == nil {
		err = os.WriteFile(filepath.Join(t.ArtifactDir(), name), png, 0o644)
	}
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
	}
}

// A message's page shows its history: each pass with its stage, wait,
// duration, worker and outcome, and the transitions between; its payload's
// size; the message whose pass emitted it, linked, and the messages its
// passes emitted, counted, the first store.ChildrenMax of them linked. The
// page is opened from the failures list, the parent's from the link.
// /api/messages/ID carries the same.
func TestTheMessagePageShowsItsHistory(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	failed := idOf(t, url, "deliver", "failed")
	owner := pgtest.Connect(t, url)
	if _, err := owner.Exec(ctx, `INSERT INTO pepsi.history (ingress_id, stage, event, detail, handed_at, at, worker_pid, attempts) VALUES
		($1, 'parse', 'moved', 'deliver', now() - interval '10 s', now() - interval '9 s', 4241, 0),
		($1, 'deliver', 'retry', 'smtp: busy', now() - interval '8 s', now() - interval '7 s', 4242, 0),
		($1, 'deliver', 'woken', '', NULL, now() - interval '5 s', NULL, 1),
		($1, 'deliver', 'failed', 'smtp: refused', now() - interval '3 s', now() - interval '500 ms', 4242, 1)`, failed); err != nil {
		t.Fatal(err)
	}
	// Its parent, done, and children: two more than the page lists.
	var parent int64
	if err := owner.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, status, payload) VALUES ('parse', 'done', 'x') RETURNING ingress_id`).Scan(&parent); err != nil {
		t.Fatal(err)
	}
	children := store.ChildrenMax + 2
	rows, err := owner.Query(ctx, `INSERT INTO pepsi.queue (stage, status, payload, parent_id)
		SELECT 'notify', 'pending', 'x', $1 FROM generate_series(1, $2) RETURNING ingress_id`, failed, children)
	if err != nil {
		t.Fatal(err)
	}
	kids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(kids)
	if _, err := owner.Exec(ctx, `UPDATE pepsi.queue SET parent_id = $2, payload = convert_to(repeat('p', 1536), 'UTF8') WHERE ingress_id = $1`, failed, parent); err != nil {
		t.Fatal(err)
	}
	src := open(t, httpd.Options{Database: url, CacheMaxAge: 50 * time.Millisecond})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	code, body := get(t, fmt.Sprintf("%s/api/messages/%d", srv.URL, failed))
	if code != http.StatusOK || !strings.Contains(body, `"event":"failed","detail":"smtp: refused"`) || !strings.Contains(body, `"worker_pid":4242`) {
		t.Errorf("GET /api/messages/%d: %d %s; want its history", failed, code, body)
	}
	var m httpd.Message
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("GET /api/messages/%d: %v: %s", failed, err, body)
	}
	if m.PayloadSize == nil || *m.PayloadSize != 1536 || m.PayloadSizeError != "" || m.ParentID != parent || m.Children != int64(children) ||
		!slices.Equal(m.FirstChildren, kids[:store.ChildrenMax]) {
		t.Errorf("GET /api/messages/%d: payload size %v (%q), parent %d, %d children, first %v; want 1536, %d, %d, %v",
			failed, m.PayloadSize, m.PayloadSizeError, m.ParentID, m.Children, m.FirstChildren, parent, children, kids[:store.ChildrenMax])
	}
	if strings.Contains(body, "ppppp") {
		t.Errorf("GET /api/messages/%d shows the payload: %s", failed, body)
	}
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the failures list", `document.querySelectorAll("#failures tbody tr[data-id]").length === 4`)
	link := fmt.Sprintf(`#failures tbody tr[data-id="%d"] a`, failed)
	href, err := chromedp.Run(b, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).href`, link)))
	if err != nil {
		t.Fatalf("the failure's link: %v\npage: %s", err, mustText(t, b, "body"))
	}
	if err := chromedp.Do(b, chromedp.Navigate(href)); err != nil { // the link, followed
		t.Fatal(err)
	}
	poll(t, b, "the message's history", `document.querySelectorAll("#history tbody tr").length === 4 && document.getElementById("history-none").hidden`)
	last := mustText(t, b, `#history tbody tr[data-event="failed"]`)
	for _, want := range []string{"deliver", "2.50 s", "pid 4242", "failed: smtp: refused"} {
		if !strings.Contains(last, want) {
			t.Errorf("the failed pass's row %q lacks %q", last, want)
		}
	}
	if woken := mustText(t, b, `#history tbody tr[data-event="woken"]`); !strings.Contains(woken, "woken") {
		t.Errorf("the wake's row %q", woken)
	}
	if size := mustText(t, b, `#message tr[data-key="payload size"] td`); size != "1,536 bytes (1.5 KiB)" {
		t.Errorf("the payload size row %q, want 1,536 bytes (1.5 KiB)", size)
	}
	if got := mustText(t, b, `#message tr[data-key="children"] td`); !strings.HasPrefix(got, fmt.Sprintf("%d: message %d, ", children, kids[0])) ||
		!strings.HasSuffix(got, fmt.Sprintf("message %d, and 2 more", kids[store.ChildrenMax-1])) {
		t.Errorf("the children row %q, want %d, the first %d linked, and 2 more", got, children, store.ChildrenMax)
	}
	hrefs, err := chromedp.Run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#message tr[data-key="children"] a')].map(a => a.getAttribute("href"))`))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, k := range kids[:store.ChildrenMax] {
		want = append(want, fmt.Sprintf("message.html?id=%d", k))
	}
	if !slices.Equal(hrefs, want) {
		t.Errorf("the children's links %v, want %v", hrefs, want)
	}
	shot, err := chromedp.Run(b, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(t.ArtifactDir(), "message-history.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	// The parent's link, followed, opens the parent's page, which lists this
	// message as its one child.
	href, err = chromedp.Run(b, chromedp.Evaluate[string](`document.querySelector('#message tr[data-key="parent"] a').href`))
	if err != nil {
		t.Fatalf("the parent's link: %v\npage: %s", err, mustText(t, b, "body"))
	}
	if err := chromedp.Do(b, chromedp.Navigate(href)); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the parent's page", fmt.Sprintf(`location.search === "?id=%d" && document.querySelector('#message tr[data-key="status"] td')?.textContent === "done"`, parent))
	if got := mustText(t, b, `#message tr[data-key="children"] td`); got != fmt.Sprintf("1: message %d", failed) {
		t.Errorf("the parent's children row %q, want 1: message %d", got, failed)
	}
	if got := mustText(t, b, `#message tr[data-key="parent"] td`); got != "-" {
		t.Errorf("the parent's own parent row %q, want -", got)
	}
	shot2, err := chromedp.Run(b, chromedp.FullScreenshot(100))
	if err == nil {
		err = os.WriteFile(filepath.Join(t.ArtifactDir(), "message-parent.png"), shot2, 0o644)
	}
	if err != nil {
		t.Errorf("screenshot of the parent's page: %v", err)
	}
}

// A message that changed after its page was drawn is not acted on: the
// page's pending message at parse moves on to deliver while the discard's
// confirmation, which names parse, is open; the confirmed discard leaves it
// pending at deliver and says so. Through the API, a retry or a discard
// that names a stage or a status the message is no longer at or in counts 0
// and changes nothing; naming what it is, it acts.
func TestAnActionLeavesAMessageThatChangedSinceThePageShowedIt(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	src := open(t, httpd.Options{Database: url, CacheMaxAge: 50 * time.Millisecond})
	srv := httptest.NewServer(httpd.Handler(src, httpd.NewActions(tokensFile(t), queueadmin.PageActions{Database: url}, nil)))
	defer srv.Close()
	pending := idOf(t, url, "parse", "pending")
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/message.html?id=%d", srv.URL, pending)),
		chromedp.SetValue(chromedp.CSS("#token"), operatorToken), chromedp.Click(chromedp.CSS("#signin-form button"))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the discard button", `!!document.querySelector('#actions button[data-action="discard"]')`)
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`#actions button[data-action="discard"]`))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the discard's confirmation", fmt.Sprintf(`document.getElementById("confirm").open && document.getElementById("confirm-text").textContent.startsWith("Discard message %d (pending at parse)?")`, pending))
	if _, err := pgtest.Connect(t, url).Exec(ctx, `UPDATE pepsi.queue SET stage = 'deliver' WHERE ingress_id = $1`, pending); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS("#confirm-yes"))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the discard refused", fmt.Sprintf(`document.getElementById("notice").textContent === "message %d: nothing to discard: it is no longer pending at parse"`, pending))
	if status, _ := statusOf(t, url, pending); status != "pending" {
		t.Errorf("message %d, confirmed pending at parse and moved on to deliver, is %s after the discard; want still pending", pending, status)
	}

	h := map[string]string{"Authorization": "Bearer " + operatorToken, "Content-Type": "application/json"}
	failed := idOf(t, url, "deliver", "failed")
	for _, c := range []struct {
		id           int64
		action, body string
		count        int
	}{
		{pending, "discard", `{"stage": "parse", "status": "pending"}`, 0},
		{pending, "discard", `{"stage": "deliver", "status": "paused"}`, 0},
		{pending, "retry", `{"stage": "deliver", "status": "pending"}`, 0},
		{failed, "retry", `{"stage": "parse", "status": "failed"}`, 0},
		{failed, "retry", `{"stage": "deliver", "status": "failed"}`, 1},
		{pending, "discard", `{"stage": "deliver", "status": "pending"}`, 1},
	} {
		code, body := do(t, &http.Client{}, srv.URL, request{"POST", fmt.Sprintf("/api/messages/%d/%s", c.id, c.action), c.body, h})
		want := fmt.Sprintf(`{"action":%q,"id":%d,"dry_run":false,"count":%d}`, c.action, c.id, c.count)
		if code != http.StatusOK || strings.TrimSpace(body) != want {
			t.Errorf("%s of message %d with %s: %d %s; want 200 %s", c.action, c.id, c.body, code, body, want)
		}
	}
}

// An answer that is not pepsi-httpd's JSON (a reverse proxy's error page
// while pepsi-httpd is down) is told by its status, on the message page and
// at sign-in, not as a JSON syntax error or, at sign-in, not at all; and a
// message page without an id says so.
func TestThePageSaysAnAnswerThatIsNotJSONByItsStatus(t *testing.T) {
	t.Parallel()
	src := open(t, httpd.Options{Database: newKnownRun(t)})
	h := httpd.Handler(src, httpd.NewActions(tokensFile(t), &fakeActor{}, nil))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" || strings.HasPrefix(r.URL.Path, "/api/messages/") {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, "<html><body>502 Bad Gateway</body></html>") // as nginx answers for an upstream that is down
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/message.html")); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "a page without an id", `document.getElementById("error").textContent === "no message id in the page's address (message.html?id=ID)"`)
	if err := chromedp.Do(b, chromedp.Navigate(srv.URL+"/message.html?id=1")); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the proxy's error page", `document.getElementById("error").textContent === "pepsi-httpd answered 502"`)
	if err := chromedp.Do(b, chromedp.SetValue(chromedp.CSS("#token"), operatorToken), chromedp.Click(chromedp.CSS("#signin-form button"))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the sign-in's answer", `document.getElementById("notice").textContent === "sign-in refused: pepsi-httpd answered 502"`)
}

// A message's page shows its latest store.HistoryLatestMax events, and says
// that older ones exist, rather than reading every event a message that
// went round its stages for days has (one page of 300,000 events was 32 MB
// and 190 MB of pepsi-httpd's memory, each at once). A message with fewer
// events shows them all, without that line.
func TestTheMessagePageShowsTheLatestEventsOfALongHistory(t *testing.T) {
	t.Parallel()
	url := newKnownRun(t)
	long, short := idOf(t, url, "deliver", "failed"), idOf(t, url, "parse", "failed")
	if _, err := pgtest.Connect(t, url).Exec(ctx, `INSERT INTO pepsi.history (ingress_id, stage, event, detail, at, attempts)
		SELECT $1::bigint, 'deliver', 'retry', 'event ' || g, (date_trunc('day', now() AT TIME ZONE 'UTC') + interval '12 hours') AT TIME ZONE 'UTC' + g * interval '1 ms', 0 FROM generate_series(1, $2::int) g
		UNION ALL SELECT $3::bigint, 'parse', 'failed', '', now(), 0`, long, store.HistoryLatestMax+5, short); err != nil {
		t.Fatal(err)
	}
	src := open(t, httpd.Options{Database: url})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	for _, c := range []struct {
		id          int64
		events      int
		first, last string
		older       bool
	}{
		{long, store.HistoryLatestMax, "event 6", fmt.Sprintf("event %d", store.HistoryLatestMax+5), true},
		{short, 1, "", "", false},
	} {
		code, body := get(t, fmt.Sprintf("%s/api/messages/%d", srv.URL, c.id))
		var m httpd.Message
		if err := json.Unmarshal([]byte(body), &m); err != nil || code != http.StatusOK {
			t.Fatalf("GET /api/messages/%d: %d %v", c.id, code, err)
		}
		if len(m.History) != c.events || m.HistoryOlder != c.older || m.History[0].Detail != c.first || m.History[len(m.History)-1].Detail != c.last {
			t.Errorf("message %d: %d events, older %v, from %q to %q; want %d, %v, from %q to %q", c.id, len(m.History), m.HistoryOlder,
				m.History[0].Detail, m.History[len(m.History)-1].Detail, c.events, c.older, c.first, c.last)
		}
	}
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/message.html?id=%d", srv.URL, long))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the latest events and the line that says there are older ones", fmt.Sprintf(`document.querySelectorAll("#history tbody tr").length === %d && !document.getElementById("history-older").hidden`, store.HistoryLatestMax))
	if err := chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/message.html?id=%d", srv.URL, short))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "a short history, whole", `document.querySelectorAll("#history tbody tr").length === 1 && document.getElementById("history-older").hidden`)
}
