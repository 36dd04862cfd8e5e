package httpd_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pepsi-pipeline/pepsi/httpd"
)

// TestThePageLoadsNothingFromElsewhereAndIsNeverFramed: every answer carries
// the headers that keep the page to its own assets and out of another site's
// frame, where a signed-in operator could be led to click an action.
func TestThePageLoadsNothingFromElsewhereAndIsNeverFramed(t *testing.T) {
	t.Parallel()
	src := open(t, httpd.Options{Database: newKnownRun(t)})
	srv := httptest.NewServer(httpd.Handler(src, nil))
	defer srv.Close()
	for _, path := range []string{"/", "/message.html?id=1", "/api/status", "/api/messages/1", "/metrics"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") ||
			resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s: CSP %q, X-Content-Type-Options %q, Referrer-Policy %q; want default-src 'self', frame-ancestors 'none', nosniff, no-referrer",
				path, csp, resp.Header.Get("X-Content-Type-Options"), resp.Header.Get("Referrer-Policy"))
		}
	}
}
