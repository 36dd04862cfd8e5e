package ingress_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/valyala/fasthttp"

	"github.com/pepsi-pipeline/pepsi/ingress"
	"github.com/pepsi-pipeline/pepsi/internal/bearer"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/lockedbuf"
	"github.com/pepsi-pipeline/pepsi/internal/testenv/pgtest"
)

// fixture is an ingress in front of a test database of its own.
type fixture struct {
	t    *testing.T
	url  string // the database
	srv  *ingress.Server
	http *served
	conn *pgx.Conn
}

// served is the server pepsi-ingress runs (ingress.HTTPServer) on a loopback
// port, with what the tests use of an httptest.Server.
type served struct {
	URL      string
	Listener net.Listener
	hs       *fasthttp.Server
	client   *http.Client
}

func serve(t testing.TB, srv *ingress.Server, timeouts ingress.Timeouts, log *slog.Logger) *served {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &served{URL: "http://" + ln.Addr().String(), Listener: ln, hs: ingress.HTTPServer(srv, timeouts, log), client: &http.Client{Transport: &http.Transport{}}}
	go s.hs.Serve(ln) //nolint:errcheck // it ends at Close
	return s
}

// Client is an HTTP client of its own.
func (s *served) Client() *http.Client { return s.client }

// Close stops the server once the requests in flight are answered.
func (s *served) Close() {
	s.client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.hs.ShutdownWithContext(ctx) //nolint:errcheck // a test that left a request hanging has failed already
}

var limitsTest = ingress.Limits{Body: 1 << 16, Line: 1 << 12, Messages: 100}

// start starts an ingress for stages "a" and "b" on db (a new database when
// empty); change adjusts its options.
func start(t *testing.T, db string, change func(*ingress.Options)) *fixture {
	t.Helper()
	return startWith(t, db, change, ingress.TimeoutsDefault)
}

// startWith is start with the HTTP server's timeouts.
func startWith(t *testing.T, db string, change func(*ingress.Options), timeouts ingress.Timeouts) *fixture {
	t.Helper()
	if db == "" {
		db = pgtest.NewMigrated(t)
	}
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	o := ingress.Options{Pool: pool, Stages: []string{"a", "b"}, Limits: limitsTest, BatchWait: 2 * time.Millisecond}
	if change != nil {
		change(&o)
	}
	f := &fixture{t: t, url: db, srv: ingress.New(o)}
	f.http = serve(t, f.srv, timeouts, o.Log)
	t.Cleanup(func() {
		f.http.Close()
		f.srv.Close()
		pool.Close()
	})
	f.conn = pgtest.Connect(t, db)
	return f
}

// answer is a decoded answer of /v1/messages.
type answer struct {
	code  int
	ids   []int64
	err   string
	retry string
}

func (f *fixture) post(contentType, query, body string, header ...string) answer {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.http.URL+"/v1/messages"+query, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := f.http.Client().Do(req)
	if err != nil {
		f.t.Fatalf("POST: %v", err)
	}
	defer res.Body.Close()
	return decode(f.t, res)
}

func decode(t *testing.T, res *http.Response) answer {
	t.Helper()
	var body struct {
		IDs   []int64 `json:"ids"`
		Error string  `json:"error"`
	}
	data, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatalf("answer %d %q is not JSON: %v", res.StatusCode, data, err)
	}
	return answer{code: res.StatusCode, ids: body.IDs, err: body.Error, retry: res.Header.Get("Retry-After")}
}

// stored is a row of pepsi.queue as a test compares it.
type stored struct {
	ID                   int64
	Stage, Status, State string
	Payload              string
	Key                  *string
}

func (f *fixture) rows() []stored {
	f.t.Helper()
	res, err := f.conn.Query(context.Background(), `SELECT ingress_id, stage, status, state::text, payload, dedup_key FROM pepsi.queue ORDER BY ingress_id`)
	if err != nil {
		f.t.Fatal(err)
	}
	out, err := pgx.CollectRows(res, func(r pgx.CollectableRow) (stored, error) {
		var s stored
		var p []byte
		err := r.Scan(&s.ID, &s.Stage, &s.Status, &s.State, &p, &s.Key)
		s.Payload = string(p)
		return s, err
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *fixture) count() int { return len(f.rows()) }

// metric returns the value of one sample of /metrics, 0 when absent.
func (f *fixture) metric(name string) float64 {
	f.t.Helper()
	res, err := http.Get(f.http.URL + "/metrics")
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return 0
}

func ptr(s string) *string { return &s }

func TestAcceptedMessagesAreCommittedWithTheirIDsInOrder(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	a := f.post("application/x-ndjson", "?stage=b", `{"stage": "a", "payload": "héllo\n", "key": "k1"}

{"payload": {"z": [1, 2]}, "state": {"source": "web"}}
{"payload_base64": "AAH/", "key": "k2"}
`)
	if a.code != http.StatusAccepted || len(a.ids) != 3 {
		t.Fatalf("answer %+v; want 202 with 3 ids", a)
	}
	want := []stored{
		{a.ids[0], "a", "pending", "{}", "héllo\n", ptr("k1")},
		{a.ids[1], "b", "pending", `{"source": "web"}`, `{"z":[1,2]}`, nil},
		{a.ids[2], "b", "pending", "{}", "\x00\x01\xff", ptr("k2")},
	}
	got := f.rows()
	if fmt.Sprintf("%+v", deref(got)) != fmt.Sprintf("%+v", deref(want)) {
		t.Errorf("rows\n%+v\nwant\n%+v", deref(got), deref(want))
	}
	j := f.post("application/json; charset=utf-8", "?stage=a", `{
  "payload": "one object, over several lines"
}`)
	if j.code != http.StatusAccepted || len(j.ids) != 1 || j.ids[0] <= a.ids[2] {
		t.Fatalf("JSON body: %+v; want 202 and one id above %d", j, a.ids[2])
	}
	if f.metric("pepsi_ingress_messages_accepted_total") != 4 || f.metric(`pepsi_ingress_requests_total{code="202"}`) != 2 {
		t.Errorf("metrics: accepted %v, 202s %v; want 4 and 2", f.metric("pepsi_ingress_messages_accepted_total"), f.metric(`pepsi_ingress_requests_total{code="202"}`))
	}
}

// TestAnOrderKeyIsStoredAndItsYoungerMessagesWaitBlocked: a message's
// order_key is its row's; of one key's messages, in one request or in
// several, the oldest is pending and the younger ones wait blocked behind
// it, and the ids are answered in the order given.
func TestAnOrderKeyIsStoredAndItsYoungerMessagesWaitBlocked(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	a := f.post("application/x-ndjson", "?stage=a", `{"payload": "1", "order_key": "acct-9"}
{"payload": "2", "order_key": "acct-7", "key": "d2"}
{"payload": "3"}
{"payload": "4", "order_key": "acct-9"}`)
	b := f.post("application/json", "?stage=a", `{"payload": "5", "order_key": "acct-7"}`)
	if a.code != http.StatusAccepted || len(a.ids) != 4 || b.code != http.StatusAccepted || len(b.ids) != 1 {
		t.Fatalf("answers %+v, %+v; want 202s with 4 and 1 ids", a, b)
	}
	if !slices.IsSorted(append(a.ids, b.ids...)) {
		t.Errorf("ids %v then %v; want them in the order given", a.ids, b.ids)
	}
	res, err := f.conn.Query(context.Background(), `SELECT convert_from(payload, 'UTF8'), status, coalesce(order_key, '') FROM pepsi.queue ORDER BY ingress_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(res, func(r pgx.CollectableRow) (string, error) {
		var p, status, key string
		err := r.Scan(&p, &status, &key)
		return p + " " + status + " " + key, err
	})
	want := []string{"1 pending acct-9", "2 pending acct-7", "3 pending ", "4 blocked acct-9", "5 blocked acct-7"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("rows %q, %v; want %q", got, err, want)
	}
}

// TestANotBeforeSchedulesTheMessage: a message's not_before (RFC 3339)
// inserts it paused until then; one whose time has passed is pending at
// once; a message without one is pending.
func TestANotBeforeSchedulesTheMessage(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	a := f.post("application/x-ndjson", "?stage=a", `{"payload": "1", "not_before": "2100-01-02T03:04:05.25Z"}
{"payload": "2", "not_before": "2001-01-01T00:00:00+01:00"}
{"payload": "3"}`)
	if a.code != http.StatusAccepted || len(a.ids) != 3 {
		t.Fatalf("answer %+v; want 202 with 3 ids", a)
	}
	res, err := f.conn.Query(context.Background(), `SELECT convert_from(payload, 'UTF8'), status,
		coalesce(to_char(timeout AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS'), '-') FROM pepsi.queue ORDER BY ingress_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(res, func(r pgx.CollectableRow) (string, error) {
		var p, status, timeout string
		err := r.Scan(&p, &status, &timeout)
		return p + " " + status + " " + timeout, err
	})
	want := []string{"1 paused 2100-01-02T03:04:05.250", "2 pending -", "3 pending -"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("rows %q, %v; want %q", got, err, want)
	}
}

// TestATraceparentIsTheFieldsElseTheRequestsHeader: a message's
// traceparent field is its row's; the request's traceparent header is the
// row's of every message without one; a message with neither has none (its
// first claim gives it one).
func TestATraceparentIsTheFieldsElseTheRequestsHeader(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	const field = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	const header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	a := f.post("application/x-ndjson", "?stage=a", `{"payload": "1", "traceparent": "`+field+`"}
{"payload": "2"}`, "traceparent", header, "tracestate", "congo=t61rcWkgMzE")
	b := f.post("application/json", "?stage=a", `{"payload": "3"}`)
	if a.code != http.StatusAccepted || len(a.ids) != 2 || b.code != http.StatusAccepted {
		t.Fatalf("answers %+v, %+v; want 202s", a, b)
	}
	res, err := f.conn.Query(context.Background(), `SELECT coalesce(traceparent, '') FROM pepsi.queue ORDER BY ingress_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(res, pgx.RowTo[string])
	if want := []string{field, header, ""}; err != nil || !slices.Equal(got, want) {
		t.Errorf("traceparents %q, %v; want %q", got, err, want)
	}
}

func deref(rows []stored) []string {
	var out []string
	for _, r := range rows {
		k := "<nil>"
		if r.Key != nil {
			k = *r.Key
		}
		out = append(out, fmt.Sprintf("%d %s %s %s %q key=%s", r.ID, r.Stage, r.Status, r.State, r.Payload, k))
	}
	return out
}

func TestAKeySeenBeforeAnswersTheFirstRowsIDAndInsertsNothing(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	first := f.post("application/json", "", `{"stage": "a", "payload": "first", "key": "order-17"}`)
	again := f.post("application/x-ndjson", "", `{"stage": "b", "payload": "new", "key": "fresh"}
{"stage": "b", "payload": "second", "key": "order-17"}`)
	if first.code != 202 || again.code != 202 || again.ids[1] != first.ids[0] || again.ids[0] == first.ids[0] {
		t.Fatalf("first %+v, again %+v; want 202s, the repeated key answered with id %v", first, again, first.ids)
	}
	rows := f.rows()
	if len(rows) != 2 || rows[0].Payload != "first" || rows[1].Payload != "new" {
		t.Errorf("rows %v; want the first order-17 and fresh only", deref(rows))
	}
}

// TestTheSameKeyRacingGetsOneRow sends one key from many requests at once, to
// one ingress (they share batches: the committer answers the key once) and to
// two ingresses on one database (their transactions race in PostgreSQL: the
// unique index decides and the loser looks the row up).
func TestTheSameKeyRacingGetsOneRow(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	g := start(t, f.url, func(o *ingress.Options) { o.BatchWait = 0 })
	for round := range 5 {
		key := fmt.Sprintf("race-%d", round)
		var wg sync.WaitGroup
		answers := make([]answer, 20)
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := f
				if i%2 == 1 {
					h = g
				}
				answers[i] = h.post("application/x-ndjson", "?stage=a", fmt.Sprintf(`{"payload": "from %d", "key": %q}
{"payload": "unkeyed %d"}`, i, key, i))
			}()
		}
		wg.Wait()
		for i, a := range answers {
			if a.code != 202 || a.ids[0] != answers[0].ids[0] {
				t.Fatalf("round %d request %d: %+v; want 202 and key id %d like request 0", round, i, a, answers[0].ids[0])
			}
		}
	}
	var keys, all int
	if err := f.conn.QueryRow(context.Background(), `SELECT count(dedup_key), count(*) FROM pepsi.queue`).Scan(&keys, &all); err != nil {
		t.Fatal(err)
	}
	if keys != 5 || all != 5+5*20 {
		t.Errorf("%d keyed rows of %d; want 5 of %d", keys, all, 5+5*20)
	}
}

// TestConcurrentRequestsShareTransactions shows the group commit: many
// requests at once are committed in fewer transactions, each request's ids
// are its own and committed when answered.
func TestConcurrentRequestsShareTransactions(t *testing.T) {
	t.Parallel()
	f := start(t, "", func(o *ingress.Options) { o.BatchWait = 20 * time.Millisecond; o.Committers = 2 })
	const n = 64
	var wg sync.WaitGroup
	answers := make([]answer, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = f.post("application/json", "?stage=a", fmt.Sprintf(`{"payload": "m%d"}`, i))
		}()
	}
	wg.Wait()
	byID := map[int64]string{}
	for _, r := range f.rows() {
		byID[r.ID] = r.Payload
	}
	for i, a := range answers {
		if a.code != 202 || len(a.ids) != 1 || byID[a.ids[0]] != fmt.Sprintf("m%d", i) {
			t.Fatalf("request %d: %+v, row %q; want 202 and the id of m%d", i, a, byID[a.ids[0]], i)
		}
	}
	txns := f.metric("pepsi_ingress_batch_requests_count")
	if txns >= n || f.metric("pepsi_ingress_batch_requests_sum") != n {
		t.Errorf("%v transactions for %v of %d requests; want fewer transactions than requests", txns, f.metric("pepsi_ingress_batch_requests_sum"), n)
	}
	t.Logf("%d requests in %v transactions", n, txns)
}

// TestARequestTheDatabaseRefusesFailsAloneInItsBatch plants a CHECK that
// refuses one payload: the batch holding it fails, and its requests are
// tried alone, so only the poisoned one gets an error.
func TestARequestTheDatabaseRefusesFailsAloneInItsBatch(t *testing.T) {
	t.Parallel()
	f := start(t, "", func(o *ingress.Options) { o.BatchWait = 50 * time.Millisecond })
	if _, err := f.conn.Exec(context.Background(), `ALTER TABLE pepsi.queue ADD CONSTRAINT test_poison CHECK (payload <> 'poison')`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	answers := make([]answer, 8)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := fmt.Sprintf("fine %d", i)
			if i == 3 {
				p = "poison"
			}
			answers[i] = f.post("application/x-ndjson", "?stage=a", fmt.Sprintf("{\"payload\": \"before %d\"}\n{\"payload\": %q}", i, p))
		}()
	}
	wg.Wait()
	for i, a := range answers {
		if i == 3 && (a.code != 400 || !strings.Contains(a.err, "test_poison")) {
			t.Errorf("poisoned request: %+v; want 400 naming the check", a)
		}
		if i != 3 && a.code != 202 {
			t.Errorf("request %d: %+v; want 202", i, a)
		}
	}
	if n := f.count(); n != 2*7 {
		t.Errorf("%d rows; want 14 (7 requests of 2, nothing of the poisoned one)", n)
	}
	if f.metric("pepsi_ingress_batch_requests_count") >= 8 {
		t.Logf("the requests did not share a batch this time (%v transactions); the test proves less", f.metric("pepsi_ingress_batch_requests_count"))
	}
}

func TestBadInputGetsItsStatusAndInsertsNothing(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("# producers\nsecret-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := bearer.LoadTokens(tokens)
	if err != nil {
		t.Fatal(err)
	}
	f := start(t, "", func(o *ingress.Options) { o.Tokens = tok })
	auth := []string{"Authorization", "Bearer secret-token-0123456789"}
	deep := `{"payload": "x", "state": {"a": ` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}}`
	for _, tc := range []struct {
		name, contentType, query, body string
		header                         []string
		code                           int
		want                           string
	}{
		{"malformed JSON", "application/json", "?stage=a", `{"payload": "x"`, auth, 400, "body: not a JSON object"},
		{"malformed NDJSON line", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\"}\n{oops}\n", auth, 400, "line 2: not a JSON object"},
		{"not an object", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\"}\n[1]\n", auth, 400, "line 2: not a JSON object"},
		{"a JSON array", "application/json", "?stage=a", `[{"payload": "x"}, {"payload": "y"}]`, auth, 400,
			"body: not a JSON object: got a JSON array: send one message as a JSON object, or several as NDJSON (Content-Type: application/x-ndjson, one object per line)"},
		{"a JSON string", "application/json", "?stage=a", `"x"`, auth, 400, "body: not a JSON object: got a JSON string"},
		{"two values on a line", "application/x-ndjson", "?stage=a", `{"payload": "x"} {"payload": "y"}`, auth, 400, "line 1: more than one JSON value"},
		{"wrong content type", "text/plain", "?stage=a", `{"payload": "x"}`, auth, 415, `Content-Type "text/plain"`},
		{"no content type", "", "?stage=a", `{"payload": "x"}`, auth, 415, "Content-Type"},
		{"oversized line", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\"}\n{\"payload\": \"" + strings.Repeat("y", 5000) + "\"}\n", auth, 413, "line 2 is longer than 4096 bytes"},
		{"oversized body", "application/x-ndjson", "?stage=a", strings.Repeat("{\"payload\": \"x\"}\n", 5000), auth, 413, "larger than 65536 bytes"},
		{"too many messages", "application/x-ndjson", "?stage=a", strings.Repeat("{\"payload\": \"x\"}\n", 101), auth, 413, "line 101: more than 100 messages"},
		{"bad base64", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\"}\n{\"payload_base64\": \"not base64!\"}", auth, 400, "line 2: payload_base64: illegal base64"},
		{"unknown field", "application/x-ndjson", "?stage=a", `{"payload": "x", "priority": 1}`, auth, 400, `line 1: unknown field "priority" (want payload or payload_base64, and optionally stage, state, key, order_key, traceparent and not_before)`},
		{"bad not_before", "application/json", "?stage=a", `{"payload": "x", "not_before": "next tuesday"}`, auth, 400, `not_before "next tuesday" is not an RFC 3339 time`},
		{"not_before without an offset", "application/json", "?stage=a", `{"payload": "x", "not_before": "2100-01-02T03:04:05"}`, auth, 400, `not_before "2100-01-02T03:04:05" is not an RFC 3339 time`},
		{"not_before not a string", "application/json", "?stage=a", `{"payload": "x", "not_before": 1767225600}`, auth, 400, "not_before: want a string, got a JSON number"},
		{"both payloads", "application/json", "?stage=a", `{"payload": "x", "payload_base64": "AA=="}`, auth, 400, "both payload and payload_base64"},
		{"no payload", "application/json", "?stage=a", `{"state": {}}`, auth, 400, "no payload"},
		{"state not an object", "application/json", "?stage=a", `{"payload": "x", "state": [1]}`, auth, 400, "is not a JSON object"},
		{"NUL in state", "application/json", "?stage=a", `{"payload": "x", "state": {"k": "\u0000"}}`, auth, 400, `state holds \u0000`},
		{"a number numeric cannot hold in state", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\"}\n{\"payload\": \"x\", \"state\": {\"k\": 1e-20000}}", auth, 400,
			"line 2: state holds the number 1e-20000, beyond the range of PostgreSQL's numeric, which PostgreSQL's jsonb refuses"},
		{"a lone surrogate in state", "application/json", "?stage=a", `{"payload": "x", "state": {"k": "\ud83d"}}`, auth, 400, "state holds a lone UTF-16 surrogate in a string"},
		{"too deep", "application/json", "?stage=a", deep, auth, 400, "nested more than 64 deep"},
		{"duplicate key in one body", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\", \"key\": \"k\"}\n{\"payload\": \"y\"}\n{\"payload\": \"z\", \"key\": \"k\"}", auth, 400, `line 3: key "k" already given on line 1`},
		{"empty key", "application/json", "?stage=a", `{"payload": "x", "key": ""}`, auth, 400, "key is empty"},
		{"long key", "application/json", "?stage=a", `{"payload": "x", "key": "` + strings.Repeat("k", 257) + `"}`, auth, 400, "key is 257 bytes long, at most 256"},
		{"empty order key", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\"}\n{\"payload\": \"x\", \"order_key\": \"\"}", auth, 400, "line 2: order_key is empty"},
		{"long order key", "application/json", "?stage=a", `{"payload": "x", "order_key": "` + strings.Repeat("k", 201) + `"}`, auth, 400, "order_key is 201 bytes long, at most 200"},
		{"order key not a string", "application/json", "?stage=a", `{"payload": "x", "order_key": ["a"]}`, auth, 400, "order_key: want a string, got a JSON array"},
		{"key not a string", "application/json", "?stage=a", `{"payload": "x", "key": 17}`, auth, 400, "key: want a string, got a JSON number"},
		{"upper-case traceparent", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\"}\n{\"payload\": \"x\", \"traceparent\": \"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01\"}", auth, 400,
			`line 2: traceparent "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01" holds 'B', not lower-case hex`},
		{"zero trace id", "application/json", "?stage=a", `{"payload": "x", "traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}`, auth, 400, "all-zero trace id"},
		{"bad traceparent header", "application/json", "?stage=a", `{"payload": "x"}`, append([]string{"traceparent", "01-abc"}, auth...), 400,
			`header traceparent "01-abc" is not a W3C traceparent: want 00-<32 hex>-<16 hex>-<2 hex>`},
		{"unknown stage", "application/x-ndjson", "?stage=a", "{\"payload\": \"x\"}\n{\"payload\": \"x\", \"stage\": \"nope\"}", auth, 400, `line 2: stage "nope" is not configured`},
		{"unknown stage parameter", "application/json", "?stage=nope", `{"payload": "x"}`, auth, 400, `?stage=: stage "nope" is not configured`},
		{"unknown stage parameter no message uses", "application/json", "?stage=nope", `{"payload": "x", "stage": "a"}`, auth, 400, `?stage=: stage "nope" is not configured`},
		{"no stage", "application/json", "", `{"payload": "x"}`, auth, 400, "no stage"},
		{"empty body", "application/x-ndjson", "?stage=a", "\n\n", auth, 400, "no messages"},
		{"missing token", "application/json", "?stage=a", `{"payload": "x"}`, nil, 401, "want Authorization: Bearer"},
		{"wrong token", "application/json", "?stage=a", `{"payload": "x"}`, []string{"Authorization", "Bearer secret-token-0123456788"}, 401, "valid token"},
		{"wrong scheme", "application/json", "?stage=a", `{"payload": "x"}`, []string{"Authorization", "Basic secret-token-0123456789"}, 401, "valid token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := f.post(tc.contentType, tc.query, tc.body, tc.header...)
			if a.code != tc.code || !strings.Contains(a.err, tc.want) {
				t.Errorf("answer %d %q; want %d containing %q", a.code, a.err, tc.code, tc.want)
			}
			// An answer speaks of JSON, never of the Go types the body was
			// read into.
			if strings.Contains(a.err, "struct") || strings.Contains(a.err, "Go value") {
				t.Errorf("answer %q names Go types", a.err)
			}
		})
	}
	if n := f.count(); n != 0 {
		t.Errorf("bad requests inserted %d rows; want none", n)
	}
	if a := f.post("application/json", "?stage=a", `{"payload": "x"}`, auth...); a.code != 202 {
		t.Errorf("a good request after them: %+v; want 202", a)
	}
	res, err := http.Get(f.http.URL + "/v1/messages")
	if err != nil || res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "POST" {
		t.Errorf("GET /v1/messages: %v %v; want 405 with Allow: POST", res.StatusCode, err)
	}
}

// TestAKeyCommittedWhileTheInsertWaitsIsLookedUp holds another producer's
// uncommitted row with a key: the ingress's insert of the same key waits for
// it, and once it commits, answers its id in the same try (the statement's
// own snapshot cannot see that row; a look-up of its own must).
func TestAKeyCommittedWhileTheInsertWaitsIsLookedUp(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	ctx := context.Background()
	other := pgtest.Connect(t, f.url)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO pepsi.queue (stage, payload, dedup_key) VALUES ('a', 'other producer', 'shared') RETURNING ingress_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	got := make(chan answer, 1)
	go func() { got <- f.post("application/json", "?stage=a", `{"payload": "ingress", "key": "shared"}`) }()
	waitFor(t, "the ingress's insert to wait for the other producer", func() bool {
		var waiting int
		f.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting)
		return waiting > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.code != 202 || len(a.ids) != 1 || a.ids[0] != id {
		t.Errorf("answer %+v; want 202 with the other producer's id %d", a, id)
	}
	if tries := f.metric("pepsi_ingress_commit_seconds_count"); tries != 1 {
		t.Errorf("%v tries; want 1 (the look-up finds the row without trying again)", tries)
	}
	if n := f.count(); n != 1 {
		t.Errorf("%d rows; want 1", n)
	}
}

// TestARefusedTokenIsWarnedOfAtMostEveryRefusedLogEvery: a client with a
// wrong or missing token is seen in the log at warn level (the level a
// production log keeps), never with the token, and a client retrying in a loop
// makes one line per RefusedLogEvery, which counts the refusals it left out.
func TestARefusedTokenIsWarnedOfAtMostEveryRefusedLogEvery(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("secret-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := bearer.LoadTokens(tokens)
	if err != nil {
		t.Fatal(err)
	}
	var log lockedbuf.Buffer
	every := 2 * time.Second
	f := start(t, "", func(o *ingress.Options) {
		o.Tokens, o.RefusedLogEvery = tok, every
		o.Log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	warnings := func() []string {
		var out []string
		for _, l := range strings.Split(log.String(), "\n") {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "no valid bearer token") {
				out = append(out, l)
			}
		}
		return out
	}
	begin := time.Now()
	for _, header := range [][]string{{"Authorization", "Bearer WRONG-secret-token"}, nil, {"Authorization", "Basic WRONG-basic"}} {
		if a := f.post("application/json", "?stage=a", `{"payload": "x"}`, header...); a.code != 401 {
			t.Fatalf("%v: %+v; want 401", header, a)
		}
	}
	if w := warnings(); time.Since(begin) < every && (len(w) != 1 || !strings.Contains(w[0], `why="a token not in TOKENS_FILE"`) || !strings.Contains(w[0], "remote=")) {
		t.Errorf("three refusals within %s: warnings %q; want one, saying why and from where", every, w)
	}
	time.Sleep(every)
	if a := f.post("application/json", "?stage=a", `{"payload": "x"}`, "Authorization", "Bearer WRONG-again"); a.code != 401 {
		t.Fatalf("%+v; want 401", a)
	}
	if a := f.post("application/json", "?stage=a", `{"payload": "x"}`, "Authorization", "Bearer secret-token-0123456789"); a.code != 202 {
		t.Fatalf("a good token: %+v; want 202", a)
	}
	w := warnings()
	if len(w) != 2 || !strings.Contains(w[1], "refused_unlogged=2") {
		t.Errorf("after %s: warnings %q; want a second one counting the 2 left out", every, w)
	}
	if strings.Contains(log.String(), "WRONG") || strings.Contains(log.String(), "secret-token") {
		t.Errorf("the log shows a token:\n%s", log.String())
	}
}

// TestTheLogNeverShowsAPayload logs at debug level while requests are
// accepted, refused for bad input, and refused by the database (whose errors
// can quote a row): no payload or state reaches the log.
func TestTheLogNeverShowsAPayload(t *testing.T) {
	t.Parallel()
	var log lockedbuf.Buffer
	f := start(t, "", func(o *ingress.Options) {
		o.Log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if _, err := f.conn.Exec(context.Background(), `ALTER TABLE pepsi.queue ADD CONSTRAINT test_poison CHECK (payload <> 'SECRET-poison')`); err != nil {
		t.Fatal(err)
	}
	for body, want := range map[string]int{
		`{"payload": "SECRET-accepted", "state": {"s": "SECRET-state"}}`: 202,
		`{"payload": "SECRET-bad", "state": ["SECRET-not-an-object"]}`:   400,
		`{"payload": "SECRET-poison"}`:                                   400,
		`{"payload": "SECRET-unknown", "SECRET-field": 1}`:               400,
	} {
		if a := f.post("application/json", "?stage=a", body); a.code != want {
			t.Errorf("%s: %+v; want %d", body, a, want)
		}
	}
	if !strings.Contains(log.String(), "request refused") || !strings.Contains(log.String(), "refused a batch") {
		t.Fatalf("the log has no line for the refusals, so this test proves nothing:\n%s", log.String())
	}
	if strings.Contains(log.String(), "SECRET") {
		t.Errorf("the log shows a message's content:\n%s", log.String())
	}
}

// TestARequestAfterCloseGets503 is a request still being read when the
// shutdown grace ran out: its commit comes after Close, and is refused, not
// a crash.
func TestARequestAfterCloseGets503(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	f.srv.Close()
	a := f.post("application/json", "?stage=a", `{"payload": "late"}`)
	if a.code != 503 || !strings.Contains(a.err, "shutting down") || a.retry != "1" {
		t.Errorf("answer %+v; want 503 shutting down, Retry-After: 1", a)
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d rows; want none", n)
	}
}
