package ingress_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pepsi-pipeline/pepsi/ingress"
)

// These tests pin down what net/http's server did for pepsi-ingress and
// fasthttp's must do alike (ingress.HTTPServer): bodies longer than what
// fasthttp reads before the handler runs (8 KiB), chunked bodies, and the
// answers outside /v1/messages.

// ndjson is n messages of 37 bytes each.
func ndjson(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"payload\": \"message number %06d\"}\n", i)
	}
	return b.String()
}

// rawAnswer reads one answer from c.
func rawAnswer(t *testing.T, c net.Conn) (*http.Response, string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func TestAChunkedBodyIsReadWholeAndBoundedByMaxBody(t *testing.T) {
	t.Parallel()
	f := start(t, "", func(o *ingress.Options) { o.Limits.Messages = 10000 })
	body := ndjson(50)
	req, _ := http.NewRequest(http.MethodPost, f.http.URL+"/v1/messages?stage=a", io.MultiReader(strings.NewReader(body[:1000]), strings.NewReader(body[1000:])))
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.ContentLength = -1 // chunked
	res, err := f.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if a := decode(t, res); a.code != 202 || len(a.ids) != 50 {
		t.Fatalf("chunked body: %+v; want 202 with 50 ids", a)
	}
	// Over MAX_BODY (64 KiB here) without a Content-Length to refuse it by.
	req, _ = http.NewRequest(http.MethodPost, f.http.URL+"/v1/messages?stage=a", strings.NewReader(ndjson(2000))) // 74,000 bytes
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.ContentLength = -1
	res, err = f.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if a := decode(t, res); a.code != 413 || !strings.Contains(a.err, "larger than 65536 bytes") {
		t.Errorf("chunked body over MAX_BODY: %+v; want 413", a)
	}
	if n := f.count(); n != 50 {
		t.Errorf("%d rows; want 50", n)
	}
}

// TestALongBodyCutOffOrTooSlowInsertsNothing sends bodies longer than what
// fasthttp reads before the handler: the rest is read by the handler from
// the connection, and a body that ends early must not pass for a whole one.
func TestALongBodyCutOffOrTooSlowInsertsNothing(t *testing.T) {
	t.Parallel()
	timeouts := ingress.TimeoutsDefault
	timeouts.Read = 500 * time.Millisecond
	f := startWith(t, "", func(o *ingress.Options) { o.Limits.Messages = 10000 }, timeouts)
	body := ndjson(1000) // 37,000 bytes
	cut := 37 * 540      // at the end of a line: what came is valid NDJSON
	c := rawRequest(t, f, len(body), body[:cut])
	time.Sleep(100 * time.Millisecond)
	c.(*net.TCPConn).CloseWrite()
	if res, answer := rawAnswer(t, c); res.StatusCode != 400 || !strings.Contains(answer, "body cut off") {
		t.Errorf("a body cut off after %d of %d bytes: %d %q; want 400 body cut off", cut, len(body), res.StatusCode, answer)
	}
	slow := rawRequest(t, f, len(body), body[:cut])
	if res, answer := rawAnswer(t, slow); res.StatusCode != 408 || !strings.Contains(answer, "not received in time") {
		t.Errorf("a body stalled after %d of %d bytes: %d %q; want 408", cut, len(body), res.StatusCode, answer)
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d rows; want none", n)
	}
	whole := rawRequest(t, f, len(body), body)
	if res, answer := rawAnswer(t, whole); res.StatusCode != 202 || strings.Count(answer, ",") != 999 {
		t.Errorf("the whole body: %d %q; want 202 with 1,000 ids", res.StatusCode, answer)
	}
	if got := f.metric(`pepsi_ingress_requests_total{code="400"}`) + f.metric(`pepsi_ingress_requests_total{code="408"}`); got != 2 {
		t.Errorf("%v refusals counted; want 2", got)
	}
}

// TestTheOtherRoutesAnswerAsNetHTTPDid checks the answers outside
// /v1/messages, and that a malformed request or headers too large are
// refused without reaching the handler or its metrics, in JSON (the request
// may be a producer's, whose client reads every error as JSON).
func TestTheOtherRoutesAnswerAsNetHTTPDid(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	for _, tc := range []struct {
		method, path string
		code         int
		body, allow  string
	}{
		{"GET", "/healthz", 200, "ok\n", ""},
		{"HEAD", "/healthz", 200, "", ""},
		{"POST", "/healthz", 405, "Method Not Allowed\n", "GET, HEAD"},
		{"DELETE", "/metrics", 405, "Method Not Allowed\n", "GET, HEAD"},
		{"GET", "/nothing", 404, "404 page not found\n", ""},
		{"GET", "/v1/messages/", 404, "404 page not found\n", ""},
	} {
		req, _ := http.NewRequest(tc.method, f.http.URL+tc.path, nil)
		res, err := f.http.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.code || string(b) != tc.body || res.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d %q Allow %q; want %d %q Allow %q", tc.method, tc.path, res.StatusCode, b, res.Header.Get("Allow"), tc.code, tc.body, tc.allow)
		}
		if tc.code != 200 && !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") {
			t.Errorf("%s %s: Content-Type %q; want text/plain", tc.method, tc.path, res.Header.Get("Content-Type"))
		}
	}
	if v := f.metric("pepsi_ingress_messages_accepted_total"); v != 0 {
		t.Fatalf("/metrics: accepted %v", v)
	}
	c := f.dial(t)
	fmt.Fprintf(c, "POST /v1/messages?stage=a HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", 70<<10))
	if res, body := rawAnswer(t, c); res.StatusCode != 431 || !strings.HasPrefix(body, `{"error":"the request's line and headers are longer than`) {
		t.Errorf("headers of 70 KiB: %d %q; want 431 and a JSON error", res.StatusCode, body)
	}
	g := f.dial(t)
	fmt.Fprintf(g, "POST /v1/messages?stage=a HTTP/1.1\r\nHost x\r\n\r\n")
	if res, body := rawAnswer(t, g); res.StatusCode != 400 || !strings.HasPrefix(body, `{"error":`) {
		t.Errorf("a malformed header: %d %q; want 400 and a JSON error", res.StatusCode, body)
	}
	if v := f.metric(`pepsi_ingress_requests_total{code="400"}`); v != 0 {
		t.Errorf("%v requests counted 400; want none: those never reached /v1/messages", v)
	}
}

// TestAnUnknownStageParameterIsRefusedBeforeTheBody: a ?stage= that names
// no configured stage is answered as such (400, the JSON error naming
// ?stage=), not as whatever is wrong with the body, and before the body is
// read: a request that sends 9 KiB of a declared 37,000 bytes (more than the
// 8 KiB fasthttp reads before the handler) is answered at once, where a
// known stage's waits for the rest until the read timeout (408).
func TestAnUnknownStageParameterIsRefusedBeforeTheBody(t *testing.T) {
	t.Parallel()
	timeouts := ingress.TimeoutsDefault
	timeouts.Read = 2 * time.Second
	f := startWith(t, "", func(o *ingress.Options) { o.Limits.Messages = 10000 }, timeouts)
	const want = `?stage=: stage "nope" is not configured`
	if a := f.post("application/json", "?stage=nope", `{"payload": "x"`); a.code != 400 || a.err != want {
		t.Errorf("a malformed body to ?stage=nope: %d %q; want 400 %q", a.code, a.err, want)
	}
	body := ndjson(1000) // 37,000 bytes
	for stage, code := range map[string]int{"nope": 400, "a": 408} {
		c := f.dial(t)
		fmt.Fprintf(c, "POST /v1/messages?stage=%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%s", stage, len(body), body[:9<<10])
		start := time.Now()
		res, answer := rawAnswer(t, c)
		var e struct{ Error string }
		if err := json.Unmarshal([]byte(answer), &e); err != nil || res.StatusCode != code || (code == 400 && e.Error != want) {
			t.Errorf("?stage=%s, the body cut short: %d %q; want %d", stage, res.StatusCode, answer, code)
		}
		if took := time.Since(start); code == 400 && took >= timeouts.Read {
			t.Errorf("?stage=nope: answered after %s, the read timeout: the body was waited for", took)
		}
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d rows; want none", n)
	}
}

// A ?stage= given twice is refused: the first was taken and the others
// never checked, so ?stage=a&stage=nope went to a.
func TestAStageParameterGivenTwiceIsRefused(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	for _, q := range []string{"?stage=a&stage=nope", "?stage=a&stage=a"} {
		if a := f.post("application/json", q, `{"payload": "x"}`); a.code != 400 || !strings.Contains(a.err, "given 2 times") {
			t.Errorf("%s: %d %q; want 400 saying ?stage= was given twice", q, a.code, a.err)
		}
	}
	if a := f.post("application/json", "?stage=a", `{"payload": "x"}`); a.code != 202 {
		t.Errorf("?stage=a: %+v; want 202", a)
	}
	if n := f.count(); n != 1 {
		t.Errorf("%d rows; want 1", n)
	}
}

// unreadable is a body that fails its test when read.
type unreadable struct{ t *testing.T }

func (u unreadable) Read([]byte) (int, error) {
	u.t.Error("the body was read")
	return 0, io.ErrUnexpectedEOF
}

// TestParseBodyRefusesAnUnknownStageParameterUnread: ParseBody, as the
// handler, refuses a ?stage= that names no configured stage before it reads
// anything of the body, and so whatever the body holds.
func TestParseBodyRefusesAnUnknownStageParameterUnread(t *testing.T) {
	known := func(st string) bool { return st == "a" }
	_, st := ingress.ParseBody(unreadable{t}, ingress.ContentNDJSON, "nope", ingress.Limits{Body: 1 << 16, Line: 4096, Messages: 100}, known)
	if want := `?stage=: stage "nope" is not configured`; st == nil || st.Code != 400 || st.Msg != want {
		t.Errorf("ParseBody: %v; want 400 %q", st, want)
	}
}

// TestExpectContinueIsAnswered sends a body only once the server asks for
// it, as curl does for large bodies.
func TestExpectContinueIsAnswered(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	c := f.dial(t)
	body := ndjson(3)
	fmt.Fprintf(c, "POST /v1/messages?stage=a HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("first answer %q %v; want 100 Continue", line, err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "\r\n" {
		t.Fatalf("after 100 Continue: %q %v", line, err)
	}
	io.WriteString(c, body)
	res, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := decode(t, res); a.code != 202 || len(a.ids) != 3 {
		t.Errorf("answer %+v; want 202 with 3 ids", a)
	}
}

// TestAMultipartBodyIsNotReadBeforeTheLimits: fasthttp reads a multipart
// form whole before the handler runs unless told not to, past MAX_BODY and
// before any token is checked, spooling it to files. A multipart request
// that declares 40 MB and sends 9 KiB (more than the 8 KiB fasthttp reads of
// any body before the handler) must be answered at once, as any body over
// MAX_BODY is, not after its body has been waited for.
func TestAMultipartBodyIsNotReadBeforeTheLimits(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	c := f.dial(t)
	fmt.Fprintf(c, "POST /v1/messages?stage=a HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=xyz\r\nContent-Length: 40000000\r\n\r\n%s",
		"--xyz\r\nContent-Disposition: form-data; name=\"f\"; filename=\"f\"\r\n\r\n"+strings.Repeat("z", 9<<10))
	if res, answer := rawAnswer(t, c); res.StatusCode != 413 {
		t.Errorf("a multipart body declaring 40 MB: %d %q; want 413 at once", res.StatusCode, answer)
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d rows; want none", n)
	}
}

// TestABodyFailureIsAnsweredWhateverTheSpellingOfThePath: a request that
// Handle serves as POST /v1/messages, though its target is spelled another
// way (an absolute-form target, a path with "//" or a %-escape), has a body
// that stalls or is cut off before the handler runs (under the 8 KiB
// fasthttp reads first) answered 408 or 400 like the usual spelling, not
// its connection closed without an answer.
func TestABodyFailureIsAnsweredWhateverTheSpellingOfThePath(t *testing.T) {
	t.Parallel()
	timeouts := ingress.TimeoutsDefault
	timeouts.Read = 300 * time.Millisecond
	f := startWith(t, "", nil, timeouts)
	for _, target := range []string{"/v1/messages", "http://x/v1/messages", "/v1//messages", "/v1/%6dessages"} {
		for _, cut := range []bool{false, true} {
			c := f.dial(t)
			fmt.Fprintf(c, "POST %s?stage=a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"payload\"", target)
			want := 408
			if cut {
				want = 400
				c.(*net.TCPConn).CloseWrite()
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Errorf("POST %s, body cut off %v: no answer (%v); want %d", target, cut, err, want)
				continue
			}
			res.Body.Close()
			if res.StatusCode != want {
				t.Errorf("POST %s, body cut off %v: %d; want %d", target, cut, res.StatusCode, want)
			}
		}
	}
	if n := f.count(); n != 0 {
		t.Errorf("%d rows; want none", n)
	}
}

// TestACompressedBodyIsRefusedAs415: the body is never decompressed, so a
// Content-Encoding other than identity is a 415 that says so (with
// Accept-Encoding: identity, as RFC 9110 asks), not a 400 about the JSON of
// compressed bytes, nor a 202 for a body whose header says what it is not.
func TestACompressedBodyIsRefusedAs415(t *testing.T) {
	t.Parallel()
	f := start(t, "", nil)
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	io.WriteString(w, `{"payload": "x"}`)
	w.Close()
	for _, c := range []struct{ encoding, body string }{{"gzip", gz.String()}, {"gzip", `{"payload": "x"}`}, {"br", `{"payload": "x"}`}} {
		req, _ := http.NewRequest(http.MethodPost, f.http.URL+"/v1/messages?stage=a", strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", c.encoding)
		res, err := f.http.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		accept := res.Header.Get("Accept-Encoding")
		if a := decode(t, res); a.code != 415 || !strings.Contains(a.err, "Content-Encoding") || accept != "identity" {
			t.Errorf("Content-Encoding %s: %d %q (Accept-Encoding %q); want 415 naming Content-Encoding, Accept-Encoding identity", c.encoding, a.code, a.err, accept)
		}
	}
	if a := f.post("application/json", "?stage=a", `{"payload": "x"}`, "Content-Encoding", "Identity"); a.code != 202 {
		t.Errorf("Content-Encoding Identity: %+v; want 202", a)
	}
	if n := f.count(); n != 1 {
		t.Errorf("%d rows; want 1", n)
	}
}
