package httpd_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pepsi-pipeline/pepsi/core"
	"github.com/pepsi-pipeline/pepsi/httpd"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// keyedRun holds messages waiting behind their order key: key a behind a
// head its stage paused, b behind one waiting for its retry, c behind a
// running one, and d behind none (its head finished, no release yet). The
// insert trigger blocks every row of a key behind the key's first.
const keyedRun = `
INSERT INTO pepsi.queue (stage, status, timeout, attempts, order_key) VALUES
	('deliver', 'paused', now() + interval '1 hour', 0, 'a'),
	('deliver', 'paused', now() + interval '1 hour', 1, 'b'),
	('parse', 'running', NULL, 0, 'c'),
	('parse', 'done', NULL, 0, 'd');
INSERT INTO pepsi.queue (stage, status, order_key) VALUES
	('deliver', 'pending', 'a'), ('deliver', 'pending', 'a'), ('deliver', 'pending', 'b'),
	('parse', 'pending', 'c'), ('parse', 'blocked', 'd'), ('parse', 'pending', NULL);
`

// serveKeyedRun serves a database holding keyedRun, and returns its URL.
func serveKeyedRun(t *testing.T) (url string, srv *httptest.Server) {
	t.Helper()
	url = pgtest.NewMigrated(t)
	if _, err := pgtest.Connect(t, url).Exec(ctx, keyedRun); err != nil {
		t.Fatalf("insert the keyed run: %v", err)
	}
	srv = httptest.NewServer(httpd.Handler(open(t, httpd.Options{Database: url}), nil))
	t.Cleanup(srv.Close)
	return url, srv
}

// TestMessagesWaitingBehindTheirKeyAreExported: the blocked messages count
// per stage, and the keys they wait on by what each key's head is doing.
func TestMessagesWaitingBehindTheirKeyAreExported(t *testing.T) {
	t.Parallel()
	_, srv := serveKeyedRun(t)
	got := values(scrape(t, srv.URL))
	for key, want := range map[string]float64{
		`pepsi_queue_messages{stage=deliver,status=blocked}`: 3,
		`pepsi_queue_messages{stage=parse,status=blocked}`:   2,
		`pepsi_queue_messages{stage=parse,status=pending}`:   1,
		`pepsi_queue_order_keys_waiting{head=paused}`:        1,
		`pepsi_queue_order_keys_waiting{head=retrying}`:      1,
		`pepsi_queue_order_keys_waiting{head=running}`:       1,
		`pepsi_queue_order_keys_waiting{head=none}`:          1,
		`pepsi_queue_order_keys_waiting{head=pending}`:       0,
	} {
		if g, ok := got[key]; !ok || g != want {
			t.Errorf("%s = %v (present %v), want %v", key, g, ok, want)
		}
	}
}

// TestTheMessagePageSaysWhatABlockedMessageWaitsBehind: the message page's
// data carries a message's order key and, for a blocked one, its key's head
// (paused, with its due time) or nothing when the head finished; the page
// shows them, the head linked to its own page.
func TestTheMessagePageSaysWhatABlockedMessageWaitsBehind(t *testing.T) {
	t.Parallel()
	url, srv := serveKeyedRun(t)
	var head, waiting, orphan int64
	if err := pgtest.Connect(t, url).QueryRow(ctx, `SELECT min(ingress_id) FILTER (WHERE order_key = 'a' AND status = 'paused'),
		min(ingress_id) FILTER (WHERE order_key = 'a' AND status = 'blocked'), min(ingress_id) FILTER (WHERE order_key = 'd' AND status = 'blocked')
		FROM pepsi.queue`).Scan(&head, &waiting, &orphan); err != nil {
		t.Fatal(err)
	}
	var m httpd.Message
	code, body := do(t, &http.Client{}, srv.URL, request{"GET", fmt.Sprintf("/api/messages/%d", waiting), "", nil})
	if err := jsonUnmarshal(body, &m); code != http.StatusOK || err != nil || m.OrderKey != "a" || m.WaitsBehind == nil ||
		m.WaitsBehind.ID != head || m.WaitsBehind.Status != core.StatusPaused || m.WaitsBehind.Stage != "deliver" || m.WaitsBehind.Timeout == nil {
		t.Fatalf("GET /api/messages/%d: %d %s (%v); want order key a, waiting behind %d paused at deliver with its due time", waiting, code, body, err, head)
	}
	code, body = do(t, &http.Client{}, srv.URL, request{"GET", fmt.Sprintf("/api/messages/%d", orphan), "", nil})
	if m = (httpd.Message{}); jsonUnmarshal(body, &m) != nil || code != http.StatusOK || m.OrderKey != "d" || m.WaitsBehind != nil {
		t.Fatalf("GET /api/messages/%d: %d %s; want order key d, waiting behind nothing", orphan, code, body)
	}
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(fmt.Sprintf("%s/message.html?id=%d", srv.URL, waiting))); err != nil {
		t.Fatal(err)
	}
	poll(t, b, "the order key and the head on the message page",
		fmt.Sprintf(`document.querySelector('#message tr[data-key="order key"] td')?.textContent === "a" && `+
			`document.querySelector('#message tr[data-key="waits behind"] a')?.getAttribute("href") === "message.html?id=%d" && `+
			`document.querySelector('#message tr[data-key="waits behind"] td').textContent.startsWith("message %d (paused at deliver until ")`, head, head))
}
