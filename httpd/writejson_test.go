package httpd

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// An answer JSON cannot hold (a time past the year 9999) is a 500 that says
// why, never a 200 with an empty body.
func TestAnAnswerJSONCannotHoldIsA500ThatSaysWhy(t *testing.T) {
	rec := httptest.NewRecorder()
	writeJSONCode(rec, http.StatusOK, map[string]time.Time{"due": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	var body map[string]string
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusInternalServerError || body["error"] == "" {
		t.Errorf("answer %d %q (%v); want a 500 whose JSON names the error", rec.Code, rec.Body.String(), err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q; want application/json", ct)
	}
}
