package httpd_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/httpd"
)

// Proves: the page and its API answer only to a Host that is an IP address,
// localhost, a name under .localhost or one of Options.Hosts (any case, a
// trailing dot, a port), and 421 to any other, saying how to allow it: a
// website that points its own name at pepsi-httpd's address (DNS rebinding)
// cannot have a browser read the page's data as that site's own. /metrics
// and /healthz answer whatever the Host; "*" lets every Host through.
// Found from outside: with Host: attacker.example:9651, /api/status
// answered 200.
func TestThePageAnswersOnlyToItsOwnHosts(t *testing.T) {
	t.Parallel()
	db := newKnownRun(t)
	srv := httptest.NewServer(httpd.Handler(open(t, httpd.Options{Database: db, Hosts: []string{"Pepsi.Example.org"}}), nil))
	defer srv.Close()
	anyHost := httptest.NewServer(httpd.Handler(open(t, httpd.Options{Database: db, Hosts: []string{"*"}}), nil))
	defer anyHost.Close()
	code := func(base, host, path string) (int, string) {
		req, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, host := range []string{"127.0.0.1:9650", "127.0.0.1", "[::1]:9650", "localhost:9650", "LOCALHOST", "pepsi.localhost:80", "10.1.2.3", "pepsi.example.org.", "PEPSI.example.org:443"} {
		for _, path := range []string{"/", "/api/status", "/message.html?id=1"} {
			if c, body := code(srv.URL, host, path); c != http.StatusOK {
				t.Errorf("Host %s, GET %s: %d %s; want 200", host, path, c, body)
			}
		}
	}
	for _, host := range []string{"attacker.example:9650", "attacker.example", "127.0.0.1.attacker.example", "localhost.attacker.example", "example.org"} {
		for _, path := range []string{"/", "/api/status", "/api/messages/1", "/api/session"} {
			if c, body := code(srv.URL, host, path); c != http.StatusMisdirectedRequest || !strings.Contains(body, "-hosts") {
				t.Errorf("Host %s, GET %s: %d %q; want 421 naming -hosts", host, path, c, body)
			}
		}
		for _, path := range []string{"/metrics", "/healthz"} {
			if c, _ := code(srv.URL, host, path); c != http.StatusOK {
				t.Errorf("Host %s, GET %s: %d; want 200 (scrapes and health checks answer whatever the Host)", host, path, c)
			}
		}
		if c, _ := code(anyHost.URL, host, "/api/status"); c != http.StatusOK {
			t.Errorf("Host %s with Hosts *: %d; want 200", host, c)
		}
	}
}
