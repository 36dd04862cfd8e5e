package ingress_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/pepsi-pipeline/pepsi/ingress"
)

// FuzzParseBody reads arbitrary bodies as NDJSON and as JSON. Whatever they
// are, ParseBody either refuses the whole body with a 4xx and a reason, or
// accepts every message with a configured stage, a key at most once, and no
// more messages than the limit; it never panics.
func FuzzParseBody(f *testing.F) {
	for _, s := range []string{
		`{"payload": "x"}`, "{\"payload\": \"x\", \"key\": \"k\"}\n{\"payload\": \"y\", \"key\": \"k\"}",
		`{"stage": "b", "payload": {"a": [1, {"b": null}]}, "state": {"s": "t"}}`, `{"payload_base64": "AAH/"}`,
		`{"payload_base64": "***"}`, `{"payload": "x", "stage": "nope"}`, "\n\n", `{"payload": 1} {"payload": 2}`,
		`{"payload": "x", "state": {"k": "\u0000"}}`, `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`,
		`{"payload": "x", "extra": 1}`, `{"key": "` + "\xff" + `", "payload": "x"}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	known := func(s string) bool { return s == "a" || s == "b" }
	lim := ingress.Limits{Body: 1 << 16, Line: 1 << 12, Messages: 20}
	f.Fuzz(func(t *testing.T, body []byte, ndjson bool) {
		ct := ingress.ContentJSON
		if ndjson {
			ct = ingress.ContentNDJSON
		}
		msgs, st := ingress.ParseBody(bytes.NewReader(body), ct, "a", lim, known)
		if st != nil {
			if msgs != nil || st.Code < 400 || st.Code >= 500 || st.Msg == "" {
				t.Fatalf("refusal %+v with %d messages; want a 4xx with a reason and no messages", st, len(msgs))
			}
			if st.Code != http.StatusBadRequest && st.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("refusal %+v; a body is refused with 400 or 413", st)
			}
			return
		}
		if len(msgs) == 0 || len(msgs) > lim.Messages || !ndjson && len(msgs) != 1 {
			t.Fatalf("%d messages accepted (ndjson %v); want 1 to %d, exactly 1 for JSON", len(msgs), ndjson, lim.Messages)
		}
		keys := map[string]bool{}
		for _, m := range msgs {
			if !known(m.Stage) || m.Payload == nil {
				t.Fatalf("message %+v: want a configured stage and a payload", m)
			}
			if m.Key != "" {
				if keys[m.Key] {
					t.Fatalf("key %q accepted twice in one body", m.Key)
				}
				keys[m.Key] = true
			}
		}
	})
}
